"""A layer's key and value cache writes as one kernel (vLLM's reshape_and_cache, CANN's
ScatterUpdate).

A captured prefill that returns its KV cache writes each layer's keys and values into it: with
transformers' dynamic cache, a ``cat`` of the (empty) cached tensor and the new keys, and another
for the values, each a copy kernel. An inference engine writes both with one kernel into its
paged cache. This pass makes the two copies of one attention one ``copy`` kernel over both — the
spec the LLM engine costs its ScatterUpdate_kv_cache with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..kernels.ir import VectorKernel
from .base import Pass, PassContext, PassResult, register
from .patterns import Walker, in_order, make_kernel

ATTENTION = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu")


def _cache_write(w: Walker, name: str) -> Node | None:
    """The ``cat`` of an empty cache and new entries that produced ``name``, if any."""
    node = w.producer(name)
    if node is None or w.op(node) != "cat" or not w.free(node):
        return None
    infos = [w.graph.info(i) for i in node.inputs]
    if len(infos) == 2 and infos[0] is not None and infos[0].numel == 0:
        return node
    return None


@register
@dataclass(frozen=True)
class FuseKvWrite(Pass):
    name: ClassVar[str] = "fuse_kv_write"
    fusion: ClassVar[str] = "kv_cache"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        w = Walker(graph)
        fused = 0
        for node in list(graph.nodes):
            if w.op(node) not in ATTENTION or len(node.inputs) < 3:
                continue
            writes = [_cache_write(w, i) for i in node.inputs[1:3]]
            if any(c is None for c in writes) or writes[0] is writes[1]:
                continue
            numel = sum(c.outputs[0].numel for c in writes)
            dtype = writes[0].kernel.dtypes[0]
            spec = VectorKernel("ScatterUpdate", ("copy",), max(1, numel), dtype, dtype)
            make_kernel(in_order(graph, writes), spec, "ScatterUpdate", self.name)
            fused += 1
        return PassResult(graph, modified=bool(fused),
                          summary=f"wrote {fused} layers' keys and values into their cache with one kernel each")


__all__ = ["FuseKvWrite"]
