"""The rotary position embedding as one kernel (CANN's RotaryPositionEmbedding), queries and keys
together.

A model writes RoPE as ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``
over the two halves of the head dimension: a negation, a concatenation and three element-wise
ops, each its own kernel. This pass finds every such ``add`` and makes the chain one kernel of the
``rope`` Vector operator; the chains of one layer that share the same ``cos`` and ``sin`` (the
queries' and the keys') become one kernel over both, as vLLM-Ascend's rotary embedding applies to
q and k in one call — the spec the LLM engine costs its RotaryPositionEmbedding with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..kernels.ir import VectorKernel
from .base import Pass, PassContext, PassResult, register
from .patterns import Walker, in_order, make_kernel


def _match(w: Walker, add: Node) -> tuple[list[Node], str, str, str] | None:
    """(members, x, cos, sin) of one rotary embedding ending at ``add``, or None."""
    if len(w.tensor_inputs(add)) != 2:
        return None
    muls = [w.producer(i) for i in add.inputs[:2]]
    if any(m is None or w.op(m) != "mul" or not w.free(m) or len(w.tensor_inputs(m)) != 2 for m in muls):
        return None
    for a, b in (muls, muls[::-1]):
        srcs_a = [w.source(i) for i in a.inputs[:2]]
        for j, cat_name in enumerate(w.source(i) for i in b.inputs[:2]):
            cat = w.producers.get(cat_name)
            if cat is None or w.op(cat) != "cat" or not w.free(cat):
                continue
            sin = w.source(b.inputs[1 - j])
            parts = [w.source(i) for i in cat.inputs]
            neg = next((w.producers[p] for p in parts if p in w.producers and w.op(w.producers[p]) == "neg"), None)
            if neg is None or not w.free(neg) or len(parts) != 2:
                continue
            # x is the tensor the halves are sliced from, and a's other operand is cos
            x_half = w.source(neg.inputs[0])
            sliced = w.producers.get(x_half)
            x = w.source(sliced.inputs[0]) if sliced is not None and w.op(sliced) == "slice" else x_half
            if x not in srcs_a:
                continue
            cos = srcs_a[1 - srcs_a.index(x)]
            return [a, b, cat, neg, add], x, cos, sin
    return None


def _origin(w: Walker, x: str) -> str:
    """What ``x`` (a query or key tensor) was projected from: the input of the matmul that made it
    (one layer's q and k share it), else ``x`` itself."""
    node = w.producer(x)
    if node is not None and w.op(node) in ("linear", "matmul", "mm", "addmm") and node.inputs:
        return w.source(node.inputs[0])
    return x


@register
@dataclass(frozen=True)
class FuseRope(Pass):
    name: ClassVar[str] = "fuse_rope"
    fusion: ClassVar[str] = "rope"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        w = Walker(graph)
        found: dict[tuple[str, str, str], list[tuple[list[Node], str]]] = {}
        for node in list(graph.nodes):
            if w.op(node) != "add" or not w.free(node):
                continue
            m = _match(w, node)
            if m is not None:
                members, x, cos, sin = m
                found.setdefault((cos, sin, _origin(w, x)), []).append((members, x))
        kernels = chains = 0
        for chain_list in found.values():
            members = [n for ms, _ in chain_list for n in ms]
            numel = sum(graph.info(x).numel for _, x in chain_list if graph.info(x) is not None)
            dtype = chain_list[0][0][-1].kernel.dtypes[0]
            spec = VectorKernel("RotaryPositionEmbedding", ("rope",), max(1, numel), dtype, dtype)
            make_kernel(in_order(graph, members), spec, "RotaryPositionEmbedding", self.name)
            kernels += 1
            chains += len(chain_list)
        return PassResult(graph, modified=bool(kernels),
                          summary=f"fused {chains} rotary embeddings into {kernels} kernels (q and k together)")


__all__ = ["FuseRope"]
