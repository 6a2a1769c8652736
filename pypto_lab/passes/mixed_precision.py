"""Mixed precision: the graph runs in fp16/bf16 (`map_ops` lowers every kernel to the run's storage
precision), but softmax, the norms and the sum-like reductions compute in fp32 in the Unified
Buffer (loaded as fp16/bf16, widened with a VCONV, narrowed again before the store), as CANN's
mixed-precision lists and the seed article advise ("Softmax 可能需要保持 fp32"). This pass sets
``compute_dtype = "fp32"`` on the Vector kernel (or each primitive of a decomposed composite) that
computes such an operator; GM keeps the low precision. At fp32 there is nothing to lower.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.graph import Graph
from ..kernels.ir import Decomposed, VectorKernel
from ..lowering.table import TABLE
from .base import Pass, PassContext, PassResult, register

# ATen ops whose arithmetic stays in fp32 under mixed precision (softmax, norms, reductions and
# their gradients): the entries the lowering table marks ``fp32``
FP32_KEPT = frozenset(name for name, entry in TABLE.items() if entry.fp32 and "." not in name)


def keep_fp32(spec):
    """``spec`` computing in fp32 (a Vector kernel, or every primitive of a decomposed composite)."""
    if isinstance(spec, VectorKernel):
        return replace(spec, compute_dtype="fp32")
    if isinstance(spec, Decomposed):
        return replace(spec, parts=tuple(keep_fp32(p) for p in spec.parts))
    return spec


@register
@dataclass(frozen=True)
class MixedPrecision(Pass):
    name: ClassVar[str] = "mixed_precision"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        low = ctx.precision
        if low == "fp32":
            return PassResult(graph, modified=False, summary="precision fp32: nothing to lower")
        vector_low = low if low in ("fp16", "bf16") else "fp16"
        producers = graph.producers()
        kept: dict[str, int] = {}
        for node in graph.nodes:
            if node.npu is None or not node.npu.fp32 or node.unit not in ("vector", "move"):
                continue
            op = node.op
            anchor = producers[node.anchor]
            before = anchor.kernel
            anchor.kernel = keep_fp32(before)
            if anchor.kernel is not before:
                kept[op] = kept.get(op, 0) + 1
        lowered = sum(1 for n in graph.nodes if n.kernel is not None and n.unit != "cpu")
        summary = f"{lowered} kernels in {low}" + (" (Vector in fp16)" if low == "int8" else "")
        if kept:
            summary += ("; kept fp32 compute (fp32 in UB, " + vector_low + " in GM): "
                        + ", ".join(f"{op} x{c}" for op, c in sorted(kept.items())))
        return PassResult(graph, modified=bool(kept), summary=summary)
