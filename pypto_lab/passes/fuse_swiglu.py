"""SwiGLU as one kernel (CANN's SwiGlu): ``silu(gate) * up``.

A gated MLP writes ``act_fn(gate_proj(x)) * up_proj(x)``: a SiLU and a multiply, two kernels with
the activation through GM. This pass makes them one kernel of the ``swiglu`` Vector operator
(``npu_swiglu``) — the spec the LLM engine costs its SwiGlu with. It runs before the matmul
epilogue fusion, so the SiLU stays with its multiply rather than on the gate projection's FixPipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.graph import Graph
from ..kernels.ir import VectorKernel
from .base import Pass, PassContext, PassResult, register
from .patterns import Walker, in_order, make_kernel


@register
@dataclass(frozen=True)
class FuseSwiGlu(Pass):
    name: ClassVar[str] = "fuse_swiglu"
    fusion: ClassVar[str] = "swiglu"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        w = Walker(graph)
        fused = 0
        for node in list(graph.nodes):
            if w.op(node) != "mul" or not w.free(node) or len(w.tensor_inputs(node)) != 2:
                continue
            producers = [w.producer(i) for i in node.inputs[:2]]
            silu = next((p for p in producers if p is not None and w.op(p) in ("silu", "silu_") and w.free(p)), None)
            if silu is None or len(w.readers(silu)) != 1:
                continue
            a, b = (graph.info(i) for i in node.inputs[:2])
            if a is None or b is None or a.shape != b.shape:
                continue
            out = node.outputs[0]
            spec = VectorKernel("SwiGlu", ("swiglu",), max(1, out.numel), node.kernel.dtypes[0], node.kernel.dtypes[0])
            make_kernel(in_order(graph, [silu, node]), spec, "SwiGlu", self.name)
            fused += 1
        return PassResult(graph, modified=bool(fused), summary=f"fused {fused} SiLU x up products into SwiGlu kernels")


__all__ = ["FuseSwiGlu"]
