"""Decomposition: composite operators become the primitive kernels a framework without fused
operators would launch.

LayerNorm becomes mean, subtract, square, mean, add-eps-and-rsqrt, normalise, scale, shift (eight
Vector kernels, each a GM round trip); GELU (erf form) becomes five; scaled-dot-product
attention becomes QK^T, scale, softmax and PV with the s x s scores in GM. The node keeps its
place in the graph and records the kernels in ``attrs["decomposed"]``; the fusion passes of
level 1 (`fuse_layernorm`, `fuse_attention`, the matmul epilogue) replace them with one kernel.
"""

from __future__ import annotations

from ..capture.graph import Graph
from .base import Pass, PassContext, PassResult, register

# primitive Vector kernels (names in pypto_lab.hw.kernels.VECTOR_OPS) of each composite
DECOMPOSITIONS: dict[str, list[str]] = {
    "layer_norm": ["sum", "sub", "mul", "sum", "rsqrt", "mul", "mul", "add"],
    "native_layer_norm": ["sum", "sub", "mul", "sum", "rsqrt", "mul", "mul", "add"],
    "gelu": ["mul", "gelu", "add", "mul", "mul"],
    "scaled_dot_product_attention": ["attention"],
}


@register
class Decompose(Pass):
    name = "decompose"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        counts: dict[str, int] = {}
        for node in graph.nodes:
            prims = DECOMPOSITIONS.get(node.op)
            if prims is None or node.attrs.get("group"):
                continue
            node.attrs["decomposed"] = list(prims)
            counts[node.op] = counts.get(node.op, 0) + 1
        notes = [f"decomposed {', '.join(f'{n} {op}' for op, n in sorted(counts.items()))}"] if counts else []
        return PassResult(graph, modified=bool(counts), notes=notes)
