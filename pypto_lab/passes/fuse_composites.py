"""Level-1 fusions of composite operators: one fused LayerNorm kernel (with the residual add in
front of it), one FlashAttention kernel per attention.

`fuse_layernorm` gives each LayerNorm back its fused CANN kernel (all statistics computed in UB,
one GM round trip) and pulls a preceding single-use residual ``add`` into it. `fuse_attention`
turns each scaled-dot-product attention into a FlashAttention-style kernel: tiles of queries
walk the keys with an online softmax, so the s x s scores never reach GM.
"""

from __future__ import annotations

from ..capture.graph import Graph
from .base import Pass, PassContext, PassResult, register
from .fold_batchnorm import describe


def _single_user_producer(graph: Graph, name: str, users) -> str:
    """Follow views back from ``name`` to the node that computed it."""
    producers = graph.producers()
    while name in producers and producers[name].attrs.get("unit") == "free" and producers[name].inputs:
        name = producers[name].inputs[0]
    return name


@register
class FuseLayerNorm(Pass):
    name = "fuse_layernorm"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        producers = graph.producers()
        users = graph.users()
        fused = with_add = 0
        notes = []
        for node in graph.nodes:
            if node.op not in ("layer_norm", "native_layer_norm"):
                continue
            node.attrs.pop("decomposed", None)
            node.attrs["fused_by"] = self.name
            fused += 1
            src = _single_user_producer(graph, node.inputs[0], users)
            prev = producers.get(src)
            if prev is None or prev.op not in ("add", "add_") or prev.attrs.get("group"):
                continue
            if len(users.get(src, [])) > 1:
                notes.append(f"{describe(node)}: the residual {describe(prev)} is also read elsewhere; not pulled "
                             "into the LayerNorm kernel")
                continue
            prev.attrs.update(group=prev.name, fused_by=self.name)
            node.attrs["group"] = prev.name
            with_add += 1
        summary = f"fused {fused} LayerNorms into one kernel each ({with_add} with their residual add)"
        return PassResult(graph, modified=bool(fused), notes=[summary] + notes)


@register
class FuseAttention(Pass):
    name = "fuse_attention"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        count = 0
        for node in graph.nodes:
            if node.attrs.get("unit") == "composite" and "attention" in node.op:
                node.attrs.pop("decomposed", None)
                node.attrs.update(fused_by=self.name, flash=True)
                count += 1
        return PassResult(graph, modified=bool(count),
                          notes=[f"fused {count} attentions into FlashAttention kernels (online softmax, no "
                                 "s x s scores in GM)"])
