"""User operators (`pypto_lab.custom_op`): what was declared, and how a captured one is lowered to
a kernel spec (the entry a user operator adds to the lowering table).

`pypto_lab.lowering.custom_ops` registers each user operator here (`USER_OPS`). Lowering (called by
`map_ops` through the op's entry in the lowering table) turns a captured node into:

* a `CustomKernel` with its cost function, when one was declared (``cost=`` or a callable
  ``npu_func``): its coster (`pypto_lab.kernels.custom`) calls it with the op's arguments as meta
  tensors;
* a `CubeKernel` sized by the declared flops (``unit="cube"``: M x N is the output, K =
  flops / 2MN), tiled and costed like any matmul;
* a `CustomKernel` with the declared flops / bytes evaluated (``unit="vector"`` or ``"move"``),
  simulated as a Vector kernel streaming the bytes and issuing ``ceil(flops / elements)`` vector
  instructions per element tile;
* a `PtoKernel` when its ``npu_func`` is a pto kernel (`pypto_lab.kernels.pto_bridge`): the kernel
  itself is simulated on the chip at the op's shapes, and run for the op's numerics;
* with nothing declared, a `VectorKernel` of its reference's ATen ops (traced on meta tensors),
  when each of them is a Vector operator of the lowering table or a view; otherwise `CustomOpError`
  names what to declare.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.fx.experimental.proxy_tensor import make_fx

from ..capture.catalogue import CUSTOM_NAMESPACE
from ..capture.graph import Graph, Node
from ..hw.chip import Chip
from ..hw.kernels import VECTOR_OPS
from ..kernels.custom import GM_TORCH_DTYPE, declared_number, meta_of, no_cost_message
from ..kernels.custom_error import CustomOpError
from ..kernels.ir import CubeKernel, CustomKernel, KernelSpec, TensorMeta, VectorKernel
from ..kernels.pto_bridge import lower_pto
from .lower import storage_dtypes
from .precision import Precision, as_precision
from .table import lookup

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

_FLOATING = ("float32", "float16", "bfloat16", "float64")


def spec_of(target: str) -> CustomOpSpec | None:
    """The registration of a captured target such as "pypto_lab_user.my_op.default"."""
    if not target.startswith(CUSTOM_NAMESPACE + "."):
        return None
    return USER_OPS.get(target.split(".")[1])


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
        if entry.unit == "vector":
            ops.extend(entry.vector_ops)
    return tuple(ops) or ("copy",)


def lower_custom(graph: Graph, node: Node, chip: Chip, precision: str | Precision) -> KernelSpec:
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
            args.append(TensorMeta(info.shape, GM_TORCH_DTYPE[gm] if info.dtype in _FLOATING else info.dtype))
        else:
            args.append(_hashable(a))
    args = tuple(args)
    out = tuple(TensorMeta(o.shape, o.dtype) for o in node.outputs)
    meta = meta_of(args)
    if spec.npu_kernel is not None:
        return lower_pto(spec.name, spec.npu_kernel, args, out, chip, as_precision(chip, precision).name, gm)
    if spec.cost is not None:
        return CustomKernel(spec.name, spec.unit, args, out, gm, cost_fn=spec.cost)
    if spec.unit == "cube":
        if spec.flops is None:
            raise CustomOpError(no_cost_message(spec.name))
        shape = node.outputs[0].shape if node.outputs else (1,)
        m = max(1, math.prod(shape[:-1]) if len(shape) > 1 else 1)
        n = max(1, shape[-1] if shape else 1)
        k = max(1, math.ceil(declared_number(spec.name, "flops", spec.flops, meta) / (2 * m * n)))
        return CubeKernel(spec.name, 1, m, k, n, cube_dt, cube_dt)
    if spec.has_cost:
        flops = declared_number(spec.name, "flops", spec.flops, meta) if spec.flops is not None and spec.unit == "vector" \
            else None
        nbytes = declared_number(spec.name, "bytes", spec.bytes, meta) if spec.bytes is not None else None
        return CustomKernel(spec.name, spec.unit, args, out, gm, flops=flops, nbytes=nbytes)
    ops = _reference_vector_ops(spec, meta)
    o = node.outputs[0] if node.outputs else None
    numel = max(1, o.numel if o is not None else 1)
    row_len = o.shape[-1] if any(VECTOR_OPS[p].row_wise for p in ops) and o is not None and o.shape else None
    tensors = sum(1 for a in args if isinstance(a, TensorMeta))
    return VectorKernel(f"{spec.name} (cost from its reference: {'+'.join(ops)})", ops, numel, vector_dt, vector_dt,
                        max(1, tensors), row_len)


__all__ = ["CustomOpError", "CustomOpSpec", "USER_OPS", "UNITS", "lower_custom", "no_cost_message", "spec_of"]
