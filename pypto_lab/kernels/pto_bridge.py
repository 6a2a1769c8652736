"""A pto kernel as the NPU implementation of a custom operator: ``custom_op(npu_func=<pypto jit kernel>)``.

The decorated function stays the reference (output shapes and dtypes on meta tensors, CPU
numerics when the op is called outside an optimised model). Inside `pypto_lab.optimize` the op is
one kernel, a `PtoKernel` spec:

* **cost**: the pto kernel is simulated on the report's chip at the op's shapes, with its floating
  tensors in the dtype GM holds them in at that precision (fp16 at ``precision="fp16"``, bf16,
  fp32; integer tensors keep theirs). Inputs are seeded random tensors (zeros for integers); the
  outputs are allocated from the reference's meta outputs when the kernel takes them as
  parameters ``(inputs..., outputs...)``, or taken from its return when it has a return
  annotation or as many parameters as the op has arguments. The report entry is named after the
  op and carries the run's cycles, time, GM bytes, busy cycles per pipe (busiest core), buffer
  peaks and instruction timeline (a `KernelReport` built from ``kernel.last_run``); it runs on
  the Vector unit, the Cube, or both, as the kernel's tile groups say. Runs are memoised per
  (kernel, argument shapes and dtypes, chip, tile shapes in force).
* **numerics**: ``optimized(x)`` runs the pto kernel on the node's actual tensors (rounded to the
  GM dtype as every stored tensor is, cast to that dtype for the kernel), so the model's output
  carries the kernel's own arithmetic (`run_numerics`).

The kernel runs on a copy of the user's kernel whose ``runtime_options["chip"]`` is the report's
chip (the user's kernel object, its cache and its ``last_run`` are left alone).

Errors name the op: a kernel whose annotations fix a dtype other than the run's, or a shape other
than the reference's, or whose parameter count fits neither layout, raises `CustomOpError` before
it runs; an exception raised by the kernel itself (costing or computing) propagates as
`CustomOpError` naming the op, the kernel and the shapes, with the kernel's error chained.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..hw.chip import PIPES, Chip
from ..hw.kernels import KernelReport
from ..hw.simulator import MAX_TIMELINE_ROWS, Timeline
from .cost import KernelCost, coster, split_resources
from .custom_error import CustomOpError
from .ir import KernelSpec, TensorMeta

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
          "uint8": torch.uint8, "bool": torch.bool}
_GM = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_PTO_NAME = {"float16": "DT_FP16", "bfloat16": "DT_BF16", "float32": "DT_FP32"}


def is_pto_kernel(obj: Any) -> bool:
    """Whether ``obj`` is a ``@pypto.jit`` / ``@pypto.frontend.jit`` kernel."""
    from ..pto.jit import JitKernel
    return isinstance(obj, JitKernel)


@dataclass(frozen=True)
class PtoKernel(KernelSpec):
    """A user operator whose NPU implementation is a pto kernel. ``args``: the captured arguments
    (tensors as `TensorMeta` in the GM dtype), ``out``: the reference's outputs in the GM dtype,
    ``layout``: "outputs" (the kernel takes them as parameters) or "return"; ``tiles``: the pto
    tile shapes in force when it was lowered; ``pto_unit``: vector, cube or cube+vector."""

    kind: ClassVar[str] = "pto"
    name: str
    kernel: Any
    args: tuple[Any, ...]
    out: tuple[TensorMeta, ...]
    dtype: str
    layout: str
    tiles: tuple = ()
    pto_unit: str = "vector"

    @property
    def unit(self) -> str:
        return self.pto_unit

    @property
    def op(self) -> str:
        return self.name

    @property
    def dtypes(self) -> tuple[str | None, str | None]:
        return self.dtype, self.dtype

    @property
    def kernel_name(self) -> str:
        return getattr(self.kernel, "__name__", type(self.kernel).__name__)


# ---- checks before a run ----------------------------------------------------------------------

def _params(kernel) -> list[inspect.Parameter]:
    return [p for p in kernel.signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def kernel_layout(op: str, kernel, n_args: int, n_out: int) -> str:
    """"outputs" when the kernel takes ``(inputs..., outputs...)``, "return" when it returns them."""
    params = _params(kernel)
    name = getattr(kernel, "__name__", "kernel")
    returns = kernel.signature.return_annotation is not inspect.Signature.empty
    if len(params) == n_args + n_out and not returns:
        return "outputs"
    if len(params) == n_args:
        return "return"
    raise CustomOpError(
        f"custom op {op!r}: its npu_func {name} takes {len(params)} parameters, the op has {n_args} argument(s) "
        f"and {n_out} output(s). Rule: a pto kernel plugged into a custom op takes the op's arguments in order, "
        f"then one tensor per output ({n_args + n_out} parameters), or only the arguments ({n_args}) and returns "
        "the outputs. Fix: change the kernel's parameters")


def check_annotations(op: str, kernel, metas: list[tuple[str, TensorMeta]], precision: str, chip: Chip) -> None:
    """Every ``pypto.Tensor`` annotation of the kernel against the tensor the run passes: same dtype
    and, where the annotation fixes a dimension, the same size."""
    from ..pto.tensor import Tensor
    params = _params(kernel)
    name = getattr(kernel, "__name__", "kernel")
    for p, (role, meta) in zip(params, metas, strict=False):
        ann = p.annotation
        if meta is None or not isinstance(ann, Tensor):
            continue
        want = _TORCH[meta.dtype]
        if ann.spec_dtype is not None and ann.spec_dtype.torch is not want:
            have = str(ann.spec_dtype.torch).removeprefix("torch.")
            gm = f"precision={precision!r} on {chip.name} holds {role} {p.name!r} in GM as {meta.dtype}"
            fix = f"annotate {p.name!r} with pypto.{_PTO_NAME.get(meta.dtype, meta.dtype)} (or leave the dtype out)"
            if have in ("float16", "bfloat16", "float32") and meta.dtype in _PTO_NAME:
                back = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[have]
                fix += f", or optimize with precision={back!r}"
            raise CustomOpError(
                f"custom op {op!r}: its npu_func {name} annotates {role} {p.name!r} as {have} but {gm}. "
                f"Rule: the pto kernel runs on the tensors the report uses. Fix: {fix}")
        if ann.spec_shape is not None:
            ok = len(ann.spec_shape) == len(meta.shape) and all(
                not isinstance(a, int) or a == s
                for a, s in zip(ann.spec_shape, meta.shape, strict=False))
            if not ok:
                src = "the reference's output" if role == "output" else "the op's argument"
                raise CustomOpError(
                    f"custom op {op!r}: its npu_func {name} annotates {role} {p.name!r} with shape "
                    f"{list(ann.spec_shape)} but {src} has shape {list(meta.shape)}. Rule: a pto kernel computes "
                    f"what the reference computes, at the model's shapes. Fix: annotate {list(meta.shape)} (or "
                    "pypto.DYNAMIC dimensions), or fix the reference")


# ---- running the kernel on a chip ---------------------------------------------------------------

_MEMO_LIMIT = 512  # kernels and runs kept (a notebook re-registers ops many times)
_CLONES: dict[tuple[int, int], tuple[Any, Chip, Any]] = {}


def _on_chip(kernel, chip: Chip):
    """A copy of ``kernel`` that runs on ``chip`` (same function and options)."""
    key = (id(kernel), id(chip))
    hit = _CLONES.get(key)
    if hit is not None and hit[0] is kernel and hit[1] is chip:
        return hit[2]
    clone = type(kernel)(kernel.func, {**kernel.runtime_options, "chip": chip}, kernel.pass_options,
                         **kernel.other_options)
    if len(_CLONES) >= _MEMO_LIMIT:
        _CLONES.clear()
    _CLONES[key] = (kernel, chip, clone)
    return clone


def _shapes(args) -> str:
    return ", ".join(f"{list(a.shape)} {str(a.dtype).removeprefix('torch.')}" for a in args
                     if isinstance(a, torch.Tensor))


def _run(spec: PtoKernel, chip: Chip, args: list) -> tuple[tuple[torch.Tensor, ...], Any]:
    """Run the kernel on ``chip`` with ``args`` (tensors already in the GM dtype); returns its
    outputs (checked against the reference's) and the run."""
    k = _on_chip(spec.kernel, chip)
    outs = [torch.zeros(o.shape, dtype=_TORCH[o.dtype]) for o in spec.out] if spec.layout == "outputs" else []
    try:
        ret = k(*args, *outs)
    except Exception as exc:
        raise CustomOpError(
            f"custom op {spec.name!r}: its npu_func {spec.kernel_name} failed on {chip.name} with arguments "
            f"{_shapes(args)}: {type(exc).__name__}: {exc}") from exc
    if spec.layout == "return":
        outs = list(ret) if isinstance(ret, (tuple, list)) else ([] if ret is None else [ret])
        if len(outs) != len(spec.out):
            raise CustomOpError(
                f"custom op {spec.name!r}: its npu_func {spec.kernel_name} returned {len(outs)} tensor(s), the "
                f"reference {len(spec.out)}. Rule: the kernel returns the op's outputs (or takes them as parameters "
                "after the inputs). Fix: return one tensor per output of the reference")
    for i, (t, o) in enumerate(zip(outs, spec.out, strict=True)):
        if tuple(t.shape) != tuple(o.shape):
            raise CustomOpError(
                f"custom op {spec.name!r}: output {i} of its npu_func {spec.kernel_name} has shape "
                f"{list(t.shape)}, the reference's {list(o.shape)}. Rule: a pto kernel computes what the reference "
                "computes. Fix: make the kernel's output match the reference (or the reference the kernel's)")
    return tuple(outs), k.last_run


def _example(spec: PtoKernel) -> list:
    gen = torch.Generator().manual_seed(0)
    out = []
    for a in spec.args:
        if isinstance(a, TensorMeta):
            dt = _TORCH[a.dtype]
            out.append(torch.randn(a.shape, generator=gen, dtype=torch.float32).to(dt) if dt.is_floating_point
                       else torch.zeros(a.shape, dtype=dt))
        else:
            out.append(a)
    return out


_RUNS: dict[tuple, tuple[Any, Chip, Any]] = {}


def simulate(spec: PtoKernel, chip: Chip):
    """The kernel's `RunResult` at the spec's shapes and dtypes on ``chip`` (memoised)."""
    key = (id(spec.kernel), id(chip), spec.args, spec.out, spec.layout, spec.tiles)
    hit = _RUNS.get(key)
    if hit is not None and hit[0] is spec.kernel and hit[1] is chip:
        return hit[2]
    _, run = _run(spec, chip, _example(spec))
    if len(_RUNS) >= _MEMO_LIMIT:
        _RUNS.clear()
    _RUNS[key] = (spec.kernel, chip, run)
    return run


def unit_of(run) -> str:
    kinds = {g["kind"] for g in run.groups}
    if "cube" in kinds:
        return "cube+vector" if kinds - {"cube"} else "cube"
    return "vector"


def tile_state() -> tuple:
    from ..pto import config
    return tuple(repr(v) for v in (config.get_vec_tile_shapes(), config.get_cube_tile_shapes()))


def run_numerics(spec: PtoKernel, chip: Chip, args: tuple) -> Any:
    """The op's outputs computed by the pto kernel on the actual tensors: floating tensors cast to
    the GM dtype the report used (their values were already rounded to it when stored)."""
    gm = _TORCH[_GM[spec.dtype]]
    real = [a.to(gm) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    outs, _ = _run(spec, chip, real)
    return outs[0] if len(outs) == 1 else outs


# ---- the report entry ---------------------------------------------------------------------------

def _vector_numbering(tl: Timeline, chip: Chip) -> Timeline:
    """pto numbers cores chip-wide (on 910B: AIC 0.., then AIV from ``cube_cores``); a Vector
    `KernelReport` numbers its AIV cores from 0 (what the swimlanes and the profiler expect)."""
    cc = chip.cube_cores
    if not chip.split_cores or len(tl) > MAX_TIMELINE_ROWS or (len(tl) and int(tl.core.min()) < cc):
        return tl
    core, pipe, kind, start, end, ready = tl.core, tl.pipe, tl.kind, tl.start, tl.end, tl.ready
    return Timeline((core - cc).astype(core.dtype), pipe, kind, start, end, ready, tl.kinds, tl.total_cycles,
                    tl.busy[cc:])


def _report(spec: PtoKernel, chip: Chip, run) -> KernelReport:
    tl = run.timeline if "cube" in spec.pto_unit else _vector_numbering(run.timeline, chip)
    cycles = run.cycles
    # the roofline: the bytes at HBM bandwidth, and the flops at the Cube's peak when it uses the Cube
    mem = run.gm_bytes / chip.hbm_bytes_per_cycle()
    cube_peak = run.flops / (chip.peak_tflops(spec.dtype) * 1e12) * chip.clock_mhz * 1e6 if "cube" in \
        spec.pto_unit else 0.0
    vec_col = PIPES.index("VECTOR")
    cube_col = PIPES.index("CUBE")
    vec_cores = max(1, chip.vector_cores if chip.split_cores else chip.cube_cores)
    return KernelReport(
        name=f"{spec.name} (pto kernel {spec.kernel_name})", chip=chip, unit="cube" if "cube" in spec.pto_unit
        else "vector", dtype=spec.dtype, shape={f"arg{i}": list(a.shape) for i, a in enumerate(spec.args)
                                                if isinstance(a, TensorMeta)},
        tile={}, double_buffer=True, cycles=cycles, time_us=run.time_us, flops=run.flops, gm_bytes=run.gm_bytes,
        min_gm_bytes=run.gm_bytes, cores_used=run.cores_used, pipe_busy=dict(run.pipe_busy_max_core),
        buffer_peak=dict(run.buffer_peak), roofline_cycles=max(cube_peak, mem),
        bound="compute" if cube_peak >= mem else "memory",
        cube_utilization=float(tl.busy[:, cube_col].sum()) / (cycles * max(1, chip.cube_cores)) if cycles else 0.0,
        vector_utilization=float(tl.busy[:, vec_col].sum()) / (cycles * vec_cores) if cycles else 0.0,
        instructions=tl)


@coster(PtoKernel)
def cost_pto(spec: PtoKernel, chip: Chip) -> KernelCost:
    run = simulate(spec, chip)
    units = {"vector": ("AIV",), "cube": ("AIC",)}.get(spec.pto_unit, ("AIC", "AIV"))
    return KernelCost(run.cycles, run.time_us, run.gm_bytes, {}, (_report(spec, chip, run),),
                      split_resources(chip, *units))


def lower_pto(op: str, kernel, args: tuple, out: tuple[TensorMeta, ...], chip: Chip, precision: str,
              gm: str) -> PtoKernel:
    """The `PtoKernel` of a captured op: its layout and annotations checked, simulated once on
    ``chip`` to learn which units it uses."""
    n_args = len(args)
    out = tuple(TensorMeta(o.shape, _GM[gm]) if _TORCH.get(o.dtype, torch.float32).is_floating_point else o
                for o in out)
    layout = kernel_layout(op, kernel, n_args, len(out))
    metas: list = [("argument", a) if isinstance(a, TensorMeta) else ("argument", None) for a in args]
    if layout == "outputs":
        metas += [("output", o) for o in out]
    check_annotations(op, kernel, metas, precision, chip)
    spec = PtoKernel(op, kernel, args, out, gm, layout, tile_state())
    run = simulate(spec, chip)
    return PtoKernel(op, kernel, args, out, gm, layout, spec.tiles, unit_of(run))


__all__ = ["PtoKernel", "is_pto_kernel", "kernel_layout", "check_annotations", "lower_pto", "run_numerics",
           "simulate", "cost_pto"]
