"""Decomposition: composite operators become the primitive kernels a framework without fused
operators would launch.

LayerNorm becomes mean, subtract, square, mean, add-eps-and-rsqrt, normalise, scale, shift (eight
Vector kernels, each a GM round trip); GELU (erf form) becomes five. The node keeps its place in
the graph; its spec becomes a `Decomposed` of the primitive Vector kernels. Scaled-dot-product
attention already lowers to the unfused sequence (QK^T, scale + softmax and PV with the s x s
scores in GM). The level-1 fusions (`fuse_layernorm`, `fuse_attention`, the matmul epilogue,
`fuse_elementwise`) give them back one kernel each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.graph import Graph
from ..kernels.ir import AttentionKernel, VectorKernel
from ..lowering.lower import primitive_kernels
from .base import Pass, PassContext, PassResult, register

# primitive Vector kernels (names in pypto_lab.hw.kernels.VECTOR_OPS) of each composite
DECOMPOSITIONS: dict[str, list[str]] = {
    "layer_norm": ["sum", "sub", "mul", "sum", "rsqrt", "mul", "mul", "add"],
    "native_layer_norm": ["sum", "sub", "mul", "sum", "rsqrt", "mul", "mul", "add"],
    "gelu": ["mul", "gelu", "add", "mul", "mul"],
}


@register
@dataclass(frozen=True)
class Decompose(Pass):
    name: ClassVar[str] = "decompose"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        counts: dict[str, int] = {}
        for node in graph.nodes:
            prims = DECOMPOSITIONS.get(node.op)
            if prims is not None and isinstance(node.kernel, VectorKernel) and node.group is None:
                node.kernel = primitive_kernels(node, prims, node.kernel.dtype, node.kernel.compute_dtype)
            elif not (isinstance(node.kernel, AttentionKernel) and not node.kernel.flash):
                continue
            counts[node.op] = counts.get(node.op, 0) + 1
        summary = f"decomposed {', '.join(f'{n} {op}' for op, n in sorted(counts.items()))}" if counts else \
            "nothing to decompose"
        return PassResult(graph, modified=bool(counts), summary=summary)
