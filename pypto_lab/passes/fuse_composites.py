"""Level-1 fusions of composite operators: one fused LayerNorm kernel (with the residual add in
front of it), one FlashAttention kernel per attention where the core version has one
(`pypto_lab.hw.capabilities`, [fa]: AIC-C-220 only).

`fuse_layernorm` gives each LayerNorm back its fused CANN kernel (all statistics computed in UB,
one GM round trip) and pulls a preceding single-use residual ``add`` into it. `fuse_attention`
turns each scaled-dot-product attention into a FlashAttention-style kernel: tiles of queries
walk the keys with an online softmax, so the s x s scores never reach GM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..hw.capabilities import capabilities
from ..kernels.ir import AttentionKernel, VectorKernel
from ..lowering.lower import vector_kernel
from .base import Pass, PassContext, PassResult, describe, register


def _producer_through_views(graph: Graph, name: str) -> str:
    """Follow views back from ``name`` to the node that computed it."""
    producers = graph.producers()
    while name in producers and producers[name].unit == "free" and producers[name].inputs:
        name = producers[name].inputs[0]
    return name



@register
@dataclass(frozen=True)
class FuseLayerNorm(Pass):
    name: ClassVar[str] = "fuse_layernorm"
    fusion: ClassVar[str] = "layernorm"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        producers = graph.producers()
        users = graph.users()
        fused = with_add = 0
        notes = []
        for node in graph.nodes:
            if node.op not in ("layer_norm", "native_layer_norm") or node.group is not None:
                continue
            dtype, compute = node.kernel.dtypes
            node.kernel = vector_kernel(graph, [node], dtype, compute)
            node.fused_by = self.name
            fused += 1
            src = _producer_through_views(graph, node.inputs[0])
            prev = producers.get(src)
            if not ctx.applies("add_layernorm"):
                continue
            if prev is None or prev.op not in ("add", "add_") or prev.group is not None \
                    or not isinstance(prev.kernel, VectorKernel):
                continue
            if len(users.get(src, [])) > 1:
                notes.append(self.note(node, f"the residual {describe(prev)} is also read elsewhere; not pulled "
                                             "into the LayerNorm kernel"))
                continue
            members: list[Node] = [prev, node]
            prev.kernel = vector_kernel(graph, members, dtype, compute)
            prev.group = node.group = prev.name
            prev.fused_by = self.name
            node.kernel = None
            with_add += 1
        summary = f"fused {fused} LayerNorms into one kernel each ({with_add} with their residual add)"
        return PassResult(graph, modified=bool(fused), summary=summary, notes=tuple(notes))


@register
@dataclass(frozen=True)
class FuseAttention(Pass):
    name: ClassVar[str] = "fuse_attention"
    fusion: ClassVar[str] = "sdpa_flash"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        caps = capabilities(ctx.chip)
        if not caps.flash_attention:
            return PassResult(graph, modified=False, summary=(
                f"not run: {ctx.chip.name} ({caps.core_version}) has no FlashAttention kernel (FlashAttentionScore "
                "supports Atlas A2/A3 only): attention runs as BatchMatMul, SoftmaxV2, BatchMatMul with the scores "
                "in GM"))
        count = 0
        for node in graph.nodes:
            if isinstance(node.kernel, AttentionKernel) and not node.kernel.flash:
                node.kernel = replace(node.kernel, flash=True)
                node.fused_by = self.name
                count += 1
        return PassResult(graph, modified=bool(count),
                          summary=f"fused {count} attentions into FlashAttention kernels (online softmax, no "
                                  "s x s scores in GM)")
