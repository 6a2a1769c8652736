"""`@custom_op`: a user operator with a reference implementation and a cost the simulator can use.

The seed article (section 4.2) registers an NPU operator with::

    from pypto_lab import custom_op

    @custom_op(npu_func=custom_op_impl)
    def my_custom_op(input):
        return input * 2

Here ``npu_func`` is either a string (the TBE / Ascend C source of the article; kept as
documentation in ``op.pypto_spec.npu_source``, the simulator cannot run it) or a callable cost
function (see ``cost``). The decorated function is the reference implementation: calling the op
runs it. The op is a ``torch.library`` custom op in the namespace ``pypto_lab_user`` (with a fake
implementation that runs the reference on fake tensors, or returns a tensor shaped like the first
input when that fails), so ``torch.export`` captures one node ``pypto_lab_user.<name>.default``;
the operator catalogue (`pypto_lab.ops.lookup`) knows it, on the unit it was registered with,
and `pypto_lab.model_cost` costs it from what was declared:

* ``cost=fn`` (or a callable ``npu_func``): ``fn(*args, chip=chip)`` with the op's tensor
  arguments as meta tensors (shapes and dtypes only; ``chip`` only if ``fn`` takes it). It returns
  microseconds (a number), a dict with ``time_us`` or ``cycles`` (and optionally ``gm_bytes``), or
  a `KernelReport` (e.g. from `simulate_vector`).
* ``unit="vector"`` (the default) with ``flops=`` and/or ``bytes=`` (numbers, or functions of the
  meta tensor arguments): a Vector kernel streaming ``bytes`` through UB (half read, half
  written; default: the op's inputs plus its output) and issuing ``ceil(flops / elements)``
  vector instructions per element tile, simulated with `simulate_vector`.
* ``unit="cube"`` with ``flops=``: a Cube kernel whose output is the op's output
  (``M = prod(out.shape[:-1])``, ``N = out.shape[-1]``) and whose ``K = flops / (2 M N)``,
  simulated with `simulate_matmul` (and tiled by `tune_tiling` / `auto_tune` like any matmul).
* ``unit="move"`` with ``bytes=``: a GM -> UB -> GM copy of that many bytes.

A custom op without any of these (the seed's example) is costed from its reference: the
reference is traced on meta tensors (``make_fx``) and, when every ATen op it calls is a Vector
operator of the catalogue (or a view), they are simulated as one fused Vector kernel over the
output (``x * 2``: one VMUL per tile). When the reference calls anything else (a sort, a
matmul, an op the catalogue lacks), `pypto_lab.optimize` raises `CustomOpError` ("custom op 'x'
has no cost: ...") naming what to pass.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .capture.catalogue import CUSTOM, CUSTOM_NAMESPACE, NpuOp

UNITS = ("vector", "cube", "move")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CustomOpError(ValueError):
    """A custom operator cannot be registered or costed: the message names the rule and the fix."""


@dataclass
class CustomOpSpec:
    """What was registered: the reference, the unit and the declared cost."""

    name: str
    fn: Callable
    unit: str
    flops: Any = None
    bytes: Any = None
    cost: Callable | None = None
    npu_source: str = ""
    schema: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{CUSTOM_NAMESPACE}::{self.name}"

    @property
    def has_cost(self) -> bool:
        return self.cost is not None or self.flops is not None or self.bytes is not None


_SPECS: dict[str, CustomOpSpec] = {}
_OPS: dict[str, Any] = {}  # name -> torch CustomOpDef (registered once per process)

_TYPES = {torch.Tensor: "Tensor", int: "SymInt", float: "float", bool: "bool", str: "str"}


def _schema(fn: Callable, name: str) -> str:
    """The torch schema of ``fn``: unannotated parameters are Tensors, the result one Tensor
    (or a tuple of Tensors when annotated ``tuple[torch.Tensor, ...]``)."""
    sig = inspect.signature(fn)
    params = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise CustomOpError(f"custom op {name!r}: parameter {p.name!r} is *args/**kwargs; a custom op needs a "
                                "fixed list of parameters (tensors, or int/float/bool/str with annotations)")
        ann = p.annotation
        if ann is inspect.Parameter.empty or ann == "torch.Tensor" or ann == "Tensor":
            ann = torch.Tensor
        kind = _TYPES.get(ann)
        if kind is None:
            raise CustomOpError(f"custom op {name!r}: parameter {p.name!r} is annotated {ann!r}; supported: "
                                "torch.Tensor (or no annotation), int, float, bool, str")
        text = f"{kind} {p.name}"
        if p.default is not inspect.Parameter.empty:
            if kind == "Tensor":
                raise CustomOpError(f"custom op {name!r}: tensor parameter {p.name!r} has a default; give tensors "
                                    "no default")
            text += f"={p.default!r}" if kind != "str" else f"=\"{p.default}\""
        params.append(text)
    ret = sig.return_annotation
    n_out = 1
    if getattr(ret, "__origin__", None) is tuple:
        n_out = len([a for a in ret.__args__ if a is not Ellipsis])
    out = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    return f"({', '.join(params)}) -> {out}"


def _no_alias(result: Any, args: tuple) -> Any:
    """torch custom ops may not return (views of) their inputs: copy such results."""
    ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor) and a.device.type != "meta"}

    def fix(r):
        if isinstance(r, torch.Tensor) and r.device.type != "meta" and r.untyped_storage().data_ptr() in ptrs:
            return r.clone()
        return r
    if isinstance(result, (tuple, list)):
        return tuple(fix(r) for r in result)
    return fix(result)


def _register_torch_op(name: str, schema: str) -> Any:
    if name in _OPS:
        registered = _SPECS[name].schema
        if registered != schema:
            raise CustomOpError(f"custom op {name!r} is already registered with schema {registered}, now {schema}; "
                                "torch cannot change an op's schema in a running process: give the new op another "
                                "name (name='...') or restart the kernel")
        return _OPS[name]

    def impl(*args):
        return _no_alias(_SPECS[name].fn(*args), args)

    def fake(*args):
        try:
            return _SPECS[name].fn(*args)
        except Exception:  # a reference that fake tensors cannot run: shape-preserving default
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is None:
                raise CustomOpError(f"custom op {name!r}: its reference cannot run on fake tensors and it has no "
                                    "tensor input to copy the output shape from; make it work on any tensor "
                                    "(no .item(), no data-dependent shapes)") from None
            return torch.empty_like(first)

    op = torch.library.custom_op(f"{CUSTOM_NAMESPACE}::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    _OPS[name] = op
    return op


def custom_op(npu_func: str | Callable | None = None, *, name: str | None = None, unit: str | None = None,
              flops: float | Callable | None = None, bytes: float | Callable | None = None,  # noqa: A002
              cost: Callable | None = None) -> Callable[[Callable], Any]:
    """Register the decorated function as an NPU operator (see the module docstring).

    Returns a decorator; the decorated name becomes the torch custom op (callable like the
    function, ``torch.ops.pypto_lab_user.<name>``), with ``.pypto_spec`` holding what was declared.
    Registering the same name again (a notebook cell run twice) replaces the reference and the
    cost; the parameter list must stay the same.
    """
    if npu_func is not None and not isinstance(npu_func, str) and not callable(npu_func):
        raise CustomOpError(f"custom_op npu_func = {npu_func!r}: pass the NPU source as a string (kept as "
                            "documentation) or a cost function (called with the op's arguments as meta tensors)")
    if unit is not None and unit not in UNITS:
        raise CustomOpError(f"custom_op unit = {unit!r} is not known; choose one of {', '.join(UNITS)}")
    for label, v in (("flops", flops), ("bytes", bytes)):
        if v is not None and not callable(v) and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise CustomOpError(f"custom_op {label} = {v!r}: must be a number >= 0 or a function of the op's "
                                "tensor arguments returning one")
    if cost is not None and not callable(cost):
        raise CustomOpError(f"custom_op cost = {cost!r}: must be a function returning microseconds (or a dict "
                            "with time_us / cycles, or a KernelReport)")
    if cost is not None and callable(npu_func):
        raise CustomOpError("custom_op: both npu_func and cost are functions; pass the cost function once, as cost=")

    def decorate(fn: Callable) -> Any:
        if not callable(fn):
            raise CustomOpError(f"custom_op decorates a function (the reference implementation), got {fn!r}")
        op_name = name or fn.__name__
        if not _NAME.match(op_name):
            raise CustomOpError(f"custom op name {op_name!r}: must be a Python identifier (letters, digits, _), "
                                "e.g. name='my_op'")
        if unit == "cube" and cost is None and not callable(npu_func) and flops is None:
            raise CustomOpError(f"custom op {op_name!r} on the Cube needs flops= (2 * M * K * N) to size its matmul, "
                                "or cost=")
        schema = _schema(fn, op_name)
        spec = CustomOpSpec(op_name, fn, unit or "vector", flops, bytes,
                            cost if cost is not None else (npu_func if callable(npu_func) else None),
                            npu_func if isinstance(npu_func, str) else "", schema)
        op = _register_torch_op(op_name, schema)
        _SPECS[op_name] = spec
        CUSTOM[op_name] = NpuOp(op_name, spec.unit, "")
        op.pypto_spec = spec
        op.__doc__ = fn.__doc__
        return op

    return decorate


def spec_of(target: str) -> CustomOpSpec | None:
    """The registration of a captured target such as "pypto_lab_user.my_op.default"."""
    if not target.startswith(CUSTOM_NAMESPACE + "."):
        return None
    return _SPECS.get(target.split(".")[1])


def registered() -> dict[str, CustomOpSpec]:
    return dict(_SPECS)


# ---- costing (called by pypto_lab.model_cost) ------------------------------------------------

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "bool": torch.bool,
                 "uint8": torch.uint8, "float64": torch.float64, "int16": torch.int16}
_GM_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "int8": torch.int8}


def _meta_args(graph, node) -> list:
    """The node's arguments with tensors as meta tensors (in the dtype GM holds them in)."""
    dtype = _GM_DTYPE.get(node.attrs.get("dtype") or "")

    def conv(a):
        if isinstance(a, str) and a in node.inputs:
            info = graph.info(a)
            if info is not None:
                return torch.empty(info.shape, dtype=dtype or _TORCH_DTYPES.get(info.dtype, torch.float32),
                                   device="meta")
        return a
    return [conv(a) for a in node.args]


def _number(spec: CustomOpSpec, label: str, value: Any, args: list) -> float:
    if callable(value):
        try:
            value = value(*args)
        except Exception as exc:
            raise CustomOpError(f"custom op {spec.name!r}: its {label}= function failed on meta tensors of shapes "
                                f"{[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}: "
                                f"{type(exc).__name__}: {exc}. It gets the op's arguments as meta tensors (use "
                                ".shape, .numel(), .element_size(), not values)") from exc
    if isinstance(value, torch.Tensor):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CustomOpError(f"custom op {spec.name!r}: {label} = {value!r}; must be a finite number >= 0")
    return float(value)


def no_cost_message(name: str) -> str:
    return (f"custom op {name!r} has no cost: the simulator cannot time it. Pass flops= and/or bytes= to "
            f"@custom_op (e.g. flops=lambda x: x.numel(), bytes=lambda x: 2 * x.numel() * x.element_size()), "
            "or cost=<function returning microseconds>")


def _reference_vector_ops(spec: CustomOpSpec, args: list) -> list[str]:
    """The Vector kernels of the reference implementation's ATen ops (traced on meta tensors),
    when they are all element-wise or row-wise Vector ops (or views); otherwise a clear error."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from .capture.catalogue import lookup

    try:
        traced = make_fx(spec.fn)(*args)
    except Exception as exc:
        raise CustomOpError(no_cost_message(spec.name) + f"; no cost could be derived from its reference either "
                            f"(tracing it on meta tensors failed: {type(exc).__name__})") from exc
    ops = []
    for n in traced.graph.nodes:
        if n.op != "call_function":
            continue
        entry = lookup(str(n.target))
        if entry is None or entry.unit not in ("vector", "free"):
            raise CustomOpError(no_cost_message(spec.name) + f"; no cost could be derived from its reference: it "
                                f"calls {n.target}, which is not a Vector operator")
        if entry.unit == "vector" and entry.vector_op:
            ops.append(entry.vector_op)
    return ops or ["copy"]


def _cost_from_reference(spec: CustomOpSpec, graph, nodes, node, chip, args: list):
    """No declared cost: cost the reference's ATen ops as one fused Vector kernel over the output."""
    from .hw.kernels import fuse_vector_ops, simulate_vector
    from .kernels.cost import KernelCost, _memo

    ops = _reference_vector_ops(spec, args)
    inputs = sum(1 for a in args if isinstance(a, torch.Tensor))
    fused = fuse_vector_ops(ops, inputs)
    out = node.outputs[0] if node.outputs else None
    numel = max(1, out.numel if out is not None else 1)
    gm_dtype = node.attrs.get("dtype") if node.attrs.get("dtype") in ("fp16", "bf16", "fp32") else "fp16"
    row_len = out.shape[-1] if fused.row_wise and out is not None and out.shape else None
    r = _memo(simulate_vector, chip, fused, numel, dtype=gm_dtype, row_len=row_len,
              name=f"{spec.name} (cost from its reference: {'+'.join(ops)})")
    return KernelCost(name=f"{spec.name}:{node.module or node.name}", unit="vector", nodes=[n.name for n in nodes],
                      fused_ops=[n.target for n in nodes if n.attrs.get("unit") != "free"], cycles=r.cycles,
                      time_us=r.time_us, gm_bytes=r.gm_bytes, tile=dict(r.tile), reports=[r],
                      resources=("AIV",) if chip.split_cores else ("AI Core",))


def gemm_dims(graph, node) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a Cube custom op: its output is C, K gives the declared flops."""
    spec = spec_of(node.target)
    if spec is None:
        raise CustomOpError(f"{node.target} is not a registered custom op")
    if spec.flops is None:
        raise CustomOpError(no_cost_message(spec.name))
    out = node.outputs[0].shape if node.outputs else (1,)
    m = max(1, math.prod(out[:-1]) if len(out) > 1 else 1)
    n = max(1, out[-1] if out else 1)
    flops = _number(spec, "flops", spec.flops, _meta_args(graph, node))
    return 1, m, max(1, math.ceil(flops / (2 * m * n))), n


def cost_custom(graph, nodes, node, chip, precision):
    """The `KernelCost` of a kernel whose anchor is a custom op (see the module docstring)."""
    from .hw.kernels import KernelReport, VectorOp, simulate_vector
    from .kernels.cost import KernelCost, _cost_cube, _memo

    spec = spec_of(node.target)
    if spec is None:
        raise CustomOpError(f"{node.target} was captured but is not registered in this process: run the "
                            "@custom_op definition before optimize")
    args = _meta_args(graph, node)
    if not spec.has_cost:
        return _cost_from_reference(spec, graph, nodes, node, chip, args)
    label = f"{spec.name}:{node.module or node.name}"
    split = chip.split_cores
    resources = {"cube": ("AIC",), "vector": ("AIV",), "move": ("AIV",)}[spec.unit] if split else ("AI Core",)
    if spec.cost is not None:
        try:
            params = inspect.signature(spec.cost).parameters
            takes_chip = "chip" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):
            takes_chip = False
        try:
            res = spec.cost(*args, chip=chip) if takes_chip else spec.cost(*args)
        except Exception as exc:
            raise CustomOpError(f"custom op {spec.name!r}: its cost function failed on meta tensors: "
                                f"{type(exc).__name__}: {exc}") from exc
        reports: list = []
        gm = float(sum(o.nbytes for o in node.outputs) + sum(
            a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)))
        if isinstance(res, KernelReport):
            reports, time_us, cycles, gm = [res], res.time_us, res.cycles, res.gm_bytes
        elif isinstance(res, dict) and ("time_us" in res or "cycles" in res):
            if "time_us" in res:
                time_us = _number(spec, "cost()['time_us']", res["time_us"], args)
                cycles = time_us * chip.clock_mhz
            else:
                cycles = _number(spec, "cost()['cycles']", res["cycles"], args)
                time_us = chip.cycles_to_us(cycles)
            gm = _number(spec, "cost()['gm_bytes']", res.get("gm_bytes", gm), args)
        elif isinstance(res, (int, float)) and not isinstance(res, bool):
            time_us = _number(spec, "cost()", res, args)
            cycles = time_us * chip.clock_mhz
        else:
            raise CustomOpError(f"custom op {spec.name!r}: its cost function returned {res!r}; return microseconds "
                                "(a number), a dict with 'time_us' or 'cycles', or a KernelReport")
        return KernelCost(name=label, unit=spec.unit, nodes=[n.name for n in nodes],
                          fused_ops=[n.target for n in nodes if n.attrs.get("unit") != "free"], cycles=cycles,
                          time_us=time_us, gm_bytes=gm, tile=dict(reports[0].tile) if reports else {},
                          reports=reports, resources=resources)
    if spec.unit == "cube":
        reports = _cost_cube(graph, nodes, node, chip, precision)
    else:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        eb = _GM_DTYPE.get(node.attrs.get("dtype") or "", None)
        eb = torch.empty((), dtype=eb).element_size() if eb is not None else (
            tensors[0].element_size() if tensors else 4)
        default_bytes = sum(t.numel() * t.element_size() for t in tensors) + sum(
            o.numel * eb for o in node.outputs)
        nbytes = _number(spec, "bytes", spec.bytes, args) if spec.bytes is not None else float(default_bytes)
        elems = max(1, math.ceil(nbytes / (2 * eb)))  # read elems, write elems
        flops = _number(spec, "flops", spec.flops, args) if spec.flops is not None and spec.unit == "vector" else 0.0
        passes = math.ceil(flops / elems) if flops else 0
        vop = VectorOp(1, 2, (("VMUL", passes),) if passes else (), flops_per_elem=float(passes))
        gm_dtype = {1: "int8", 2: "fp16", 4: "fp32"}.get(eb, "fp16")
        if node.attrs.get("dtype") == "bf16":
            gm_dtype = "bf16"
        reports = [_memo(simulate_vector, chip, vop, elems, dtype=gm_dtype, name=f"{spec.name} {elems} {gm_dtype}")]
    unit = "cube" if spec.unit == "cube" else spec.unit
    return KernelCost(name=label, unit=unit, nodes=[n.name for n in nodes],
                      fused_ops=[n.target for n in nodes if n.attrs.get("unit") != "free"],
                      cycles=sum(r.cycles for r in reports), time_us=sum(r.time_us for r in reports),
                      gm_bytes=sum(r.gm_bytes for r in reports), tile=dict(reports[0].tile), reports=reports,
                      resources=resources)


__all__ = ["custom_op", "CustomOpError", "CustomOpSpec", "spec_of", "registered"]
