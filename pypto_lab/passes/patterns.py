"""Small helpers the pattern-fusion passes share: walking a captured graph through views, and
making a group of nodes one kernel.

A pattern pass (`fuse_rmsnorm`, `fuse_rope`, `fuse_swiglu`, `merge_matmuls`) recognises the ATen
ops a model writes for one of CANN's fused operators (AddRmsNorm, RotaryPositionEmbedding, SwiGlu,
a merged QKV or gate-up projection) and makes them one kernel whose spec is the fused operator's:
the same spec the LLM engine builds for that operator, so both paths cost it alike.
"""

from __future__ import annotations

from ..capture.catalogue import aten_name
from ..capture.graph import Graph, Node
from ..kernels.ir import KernelSpec

VIEWS = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "expand", "alias", "transpose",
                   "permute", "t", "contiguous", "clone", "_assert_tensor_metadata", "detach"})


class Walker:
    """One graph's producers and users, looked through views."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producers = graph.producers()
        self.users: dict[str, list[Node]] = {}
        for k, v in graph.users().items():
            self.users[k] = list({n.name: n for n in v}.values())

    def op(self, node: Node | None) -> str:
        return aten_name(node.target) if node is not None else ""

    def source(self, name: str) -> str:
        """``name`` followed back through views (and element-type casts when ``casts``) to what computed it."""
        seen = 0
        while name in self.producers and seen < 16:
            node = self.producers[name]
            if self.op(node) not in VIEWS or not node.inputs:
                break
            name = node.inputs[0]
            seen += 1
        return name

    def producer(self, name: str, through_casts: bool = False) -> Node | None:
        """The node computing ``name`` (views looked through; casts too when ``through_casts``)."""
        name = self.source(name)
        node = self.producers.get(name)
        while through_casts and node is not None and self.op(node) in ("to", "_to_copy") and node.inputs:
            node = self.producers.get(self.source(node.inputs[0]))
        return node

    def readers(self, node: Node) -> list[Node]:
        """The nodes reading ``node``'s output, views looked through."""
        out, todo = [], [node.name]
        while todo:
            for r in self.users.get(todo.pop(), []):
                if self.op(r) in VIEWS:
                    todo.append(r.name)
                else:
                    out.append(r)
        return out

    def tensor_inputs(self, node: Node) -> list[str]:
        """The inputs of ``node`` that are tensors (a value or a node's output)."""
        return [i for i in node.inputs if self.graph.info(i) is not None]

    def free(self, node: Node | None) -> bool:
        """A node no pass has fused yet."""
        return node is not None and node.group is None and node.kernel is not None


def make_kernel(members: list[Node], spec: KernelSpec, op_name: str, pass_name: str) -> Node:
    """``members`` (in graph order) become one kernel of ``spec``, anchored at the first member,
    named ``op_name`` (the CANN operator); the views between them stay views."""
    anchor = members[0]
    for n in members:
        n.group = anchor.name
        n.fused_by = pass_name
        n.kernel = None
    anchor.kernel = spec
    if anchor.npu is not None and op_name:
        from dataclasses import replace

        anchor.npu = replace(anchor.npu, name=op_name)
    return anchor


def in_order(graph: Graph, nodes: list[Node]) -> list[Node]:
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    return sorted({n.name: n for n in nodes}.values(), key=lambda n: index[n.name])


__all__ = ["VIEWS", "Walker", "in_order", "make_kernel"]
