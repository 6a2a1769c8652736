"""User operators (`pypto_lab.custom_op`): what was declared, how a captured one is lowered to a
kernel spec, and the coster of `CustomKernel`.

`pypto_lab.custom_ops` registers each user operator here (`USER_OPS`). Lowering (called by
`map_ops` through the catalogue entry) turns a captured node into:

* a `CustomKernel` with its cost function, when one was declared (``cost=`` or a callable
  ``npu_func``): the coster calls it with the op's arguments as meta tensors;
* a `CubeKernel` sized by the declared flops (``unit="cube"``: M x N is the output, K =
  flops / 2MN), tiled and costed like any matmul;
* a `CustomKernel` with the declared flops / bytes evaluated (``unit="vector"`` or ``"move"``),
  simulated as a Vector kernel streaming the bytes and issuing ``ceil(flops / elements)`` vector
  instructions per element tile;
* a `PtoKernel` when its ``npu_func`` is a pto kernel (`pypto_lab.kernels.pto_bridge`): the kernel
  itself is simulated on the chip at the op's shapes, and run for the op's numerics;
* with nothing declared, a `VectorKernel` of its reference's ATen ops (traced on meta tensors),
  when each of them is a Vector operator of the catalogue or a view; otherwise `CustomOpError`
  names what to declare.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ..capture.catalogue import CUSTOM_NAMESPACE, lookup
from ..capture.graph import Graph, Node
from ..hw.chip import Chip
from ..hw.kernels import VECTOR_OPS, KernelReport, VectorOp, simulate_vector
from .cost import KernelCost, coster, split_resources
from .custom_error import CustomOpError
from .ir import CubeKernel, CustomKernel, KernelSpec, TensorMeta, VectorKernel
from .lower import storage_dtypes
from .pto_bridge import lower_pto

UNITS = ("vector", "cube", "move")


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
    npu_kernel: Any = None           # a pto kernel (`pypto_lab.kernels.pto_bridge`), its NPU implementation

    @property
    def qualified_name(self) -> str:
        return f"{CUSTOM_NAMESPACE}::{self.name}"

    @property
    def has_cost(self) -> bool:
        return self.cost is not None or self.flops is not None or self.bytes is not None


USER_OPS: dict[str, CustomOpSpec] = {}

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "bool": torch.bool,
                 "uint8": torch.uint8, "float64": torch.float64, "int16": torch.int16}
_GM_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "int8": "int8"}
_FLOATING = ("float32", "float16", "bfloat16", "float64")


def spec_of(target: str) -> CustomOpSpec | None:
    """The registration of a captured target such as "pypto_lab_user.my_op.default"."""
    if not target.startswith(CUSTOM_NAMESPACE + "."):
        return None
    return USER_OPS.get(target.split(".")[1])


def no_cost_message(name: str) -> str:
    return (f"custom op {name!r} has no cost: the simulator cannot time it. Pass flops= and/or bytes= to "
            f"@custom_op (e.g. flops=lambda x: x.numel(), bytes=lambda x: 2 * x.numel() * x.element_size()), "
            "or cost=<function returning microseconds>")


def _hashable(a: Any) -> Any:
    if isinstance(a, list):
        return tuple(_hashable(x) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in a.items()))
    try:
        hash(a)
    except TypeError:
        return repr(a)
    return a


def meta_of(args: tuple) -> list:
    """The captured arguments with every `TensorMeta` as a meta tensor (shapes and dtypes only)."""
    return [torch.empty(a.shape, dtype=_TORCH_DTYPES.get(a.dtype, torch.float32), device="meta")
            if isinstance(a, TensorMeta) else a for a in args]


def _number(spec_name: str, label: str, value: Any, args: list) -> float:
    if callable(value):
        try:
            value = value(*args)
        except Exception as exc:
            raise CustomOpError(f"custom op {spec_name!r}: its {label}= function failed on meta tensors of shapes "
                                f"{[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}: "
                                f"{type(exc).__name__}: {exc}. It gets the op's arguments as meta tensors (use "
                                ".shape, .numel(), .element_size(), not values)") from exc
    if isinstance(value, torch.Tensor):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CustomOpError(f"custom op {spec_name!r}: {label} = {value!r}; must be a finite number >= 0")
    return float(value)


def _reference_vector_ops(spec: CustomOpSpec, args: list) -> tuple[str, ...]:
    """The Vector kernels of the reference implementation's ATen ops (traced on meta tensors),
    when they are all element-wise or row-wise Vector ops (or views); otherwise a clear error."""
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
    return tuple(ops) or ("copy",)


def lower_custom(graph: Graph, node: Node, chip: Chip, precision: str) -> KernelSpec:
    """The kernel spec of a captured user operator (see the module docstring)."""
    spec = spec_of(node.target)
    if spec is None:
        raise CustomOpError(f"{node.target} was captured but is not registered in this process: run the "
                            "@custom_op definition before optimize")
    cube_dt, vector_dt = storage_dtypes(chip, precision)
    gm = cube_dt if spec.unit == "cube" and spec.npu_kernel is None else vector_dt
    args = []
    for a in node.args:
        info = graph.info(a) if isinstance(a, str) and a in node.inputs else None
        if info is not None:  # floating tensors are held in GM in the run's dtype; integer ones keep theirs
            args.append(TensorMeta(info.shape, _GM_DTYPE[gm] if info.dtype in _FLOATING else info.dtype))
        else:
            args.append(_hashable(a))
    args = tuple(args)
    out = tuple(TensorMeta(o.shape, o.dtype) for o in node.outputs)
    meta = meta_of(args)
    if spec.npu_kernel is not None:
        return lower_pto(spec.name, spec.npu_kernel, args, out, chip, precision, gm)
    if spec.cost is not None:
        return CustomKernel(spec.name, spec.unit, args, out, gm, cost_fn=spec.cost)
    if spec.unit == "cube":
        if spec.flops is None:
            raise CustomOpError(no_cost_message(spec.name))
        shape = node.outputs[0].shape if node.outputs else (1,)
        m = max(1, math.prod(shape[:-1]) if len(shape) > 1 else 1)
        n = max(1, shape[-1] if shape else 1)
        k = max(1, math.ceil(_number(spec.name, "flops", spec.flops, meta) / (2 * m * n)))
        return CubeKernel(spec.name, 1, m, k, n, cube_dt, cube_dt)
    if spec.has_cost:
        flops = _number(spec.name, "flops", spec.flops, meta) if spec.flops is not None and spec.unit == "vector" \
            else None
        nbytes = _number(spec.name, "bytes", spec.bytes, meta) if spec.bytes is not None else None
        return CustomKernel(spec.name, spec.unit, args, out, gm, flops=flops, nbytes=nbytes)
    ops = _reference_vector_ops(spec, meta)
    o = node.outputs[0] if node.outputs else None
    numel = max(1, o.numel if o is not None else 1)
    row_len = o.shape[-1] if any(VECTOR_OPS[p].row_wise for p in ops) and o is not None and o.shape else None
    tensors = sum(1 for a in args if isinstance(a, TensorMeta))
    return VectorKernel(f"{spec.name} (cost from its reference: {'+'.join(ops)})", ops, numel, vector_dt, vector_dt,
                        max(1, tensors), row_len)


def _resources(spec: CustomKernel, chip: Chip) -> tuple[str, ...]:
    return split_resources(chip, "AIC" if spec.declared_unit == "cube" else "AIV")


def _call_cost(spec: CustomKernel, chip: Chip, args: list) -> KernelCost:
    try:
        params = inspect.signature(spec.cost_fn).parameters
        takes_chip = "chip" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        takes_chip = False
    try:
        res = spec.cost_fn(*args, chip=chip) if takes_chip else spec.cost_fn(*args)
    except Exception as exc:
        raise CustomOpError(f"custom op {spec.name!r}: its cost function failed on meta tensors: "
                            f"{type(exc).__name__}: {exc}") from exc
    gm = float(sum(math.prod(o.shape) * torch.empty((), dtype=_TORCH_DTYPES.get(o.dtype, torch.float32)).element_size()
                   for o in spec.out) + sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)))
    if isinstance(res, KernelReport):
        return KernelCost(res.cycles, res.time_us, res.gm_bytes, dict(res.tile), (res,), _resources(spec, chip))
    if isinstance(res, dict) and ("time_us" in res or "cycles" in res):
        if "time_us" in res:
            time_us = _number(spec.name, "cost()['time_us']", res["time_us"], args)
            cycles = time_us * chip.clock_mhz
        else:
            cycles = _number(spec.name, "cost()['cycles']", res["cycles"], args)
            time_us = chip.cycles_to_us(cycles)
        gm = _number(spec.name, "cost()['gm_bytes']", res.get("gm_bytes", gm), args)
    elif isinstance(res, (int, float)) and not isinstance(res, bool):
        time_us = _number(spec.name, "cost()", res, args)
        cycles = time_us * chip.clock_mhz
    else:
        raise CustomOpError(f"custom op {spec.name!r}: its cost function returned {res!r}; return microseconds "
                            "(a number), a dict with 'time_us' or 'cycles', or a KernelReport")
    return KernelCost(cycles, time_us, gm, {}, (), _resources(spec, chip))


@coster(CustomKernel)
def cost_custom(spec: CustomKernel, chip: Chip) -> KernelCost:
    args = meta_of(spec.args)
    if spec.cost_fn is not None:
        return _call_cost(spec, chip, args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    eb = torch.empty((), dtype=_TORCH_DTYPES[_GM_DTYPE[spec.dtype]]).element_size()
    default_bytes = sum(t.numel() * t.element_size() for t in tensors) + sum(math.prod(o.shape) * eb for o in spec.out)
    nbytes = spec.nbytes if spec.nbytes is not None else float(default_bytes)
    elems = max(1, math.ceil(nbytes / (2 * eb)))  # read elems, write elems
    passes = math.ceil(spec.flops / elems) if spec.flops else 0
    vop = VectorOp(1, 2, (("VMUL", passes),) if passes else (), flops_per_elem=float(passes))
    r = simulate_vector(vop, elems, dtype=spec.dtype, chip=chip, name=f"{spec.name} {elems} {spec.dtype}")
    return KernelCost.of([r], _resources(spec, chip))


__all__ = ["CustomOpError", "CustomOpSpec", "USER_OPS", "UNITS", "lower_custom", "no_cost_message", "spec_of"]
