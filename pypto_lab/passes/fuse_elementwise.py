"""Fuse chains of element-wise Vector operators into one kernel.

Each element-wise Vector kernel reads its inputs from GM into the Unified Buffer and writes its
result back; a chain ``add -> mul -> relu -> exp`` fused into one kernel keeps the intermediates
in UB and writes once. The chains are found by the Vector fusion mechanism every front end uses
(`pypto_lab.lowering.fusion`, with its element-wise rule): nodes in graph order, an element-wise
Vector node joining the open chain when it reads what the chain produces or reads; reductions,
norms, softmax, pooling and gathers are not members (norms have their own fusion passes). A
member whose result is also read outside the chain is written to GM by the fused kernel. Members
get ``node.group`` = the first member's name and ``node.fused_by`` = this pass's name; the first
member's spec becomes the one Vector kernel; the views between members that only the chain reads
join the group. The chain's nodes (and the views and bookkeeping between them that read it) move
to where its last member was, so the fused kernel runs after everything it reads.

A composite left decomposed into primitives (a GELU no Cube kernel took into its epilogue) is
one fused CANN kernel again at this level (`Gelu`): one GM round trip instead of five.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..kernels.ir import Decomposed, VectorKernel
from ..lowering.fusion import ELEMENTWISE, ELEMENTWISE_VECTOR_OPS, fuse_vector_chains, written_members
from ..lowering.lower import vector_kernel
from ..lowering.table import BOOKKEEPING
from .base import Pass, PassContext, PassResult, describe, register

OUTPUT = "<graph output>"   # the reader of a graph's outputs


def _is_view(node: Node) -> bool:
    return node.unit == "free" and node.npu is not BOOKKEEPING


class GraphChains:
    """A captured `Graph` as the fusion mechanism sees it (`pypto_lab.lowering.fusion.ChainGraph`):
    tensors by name, views resolved to the tensor they alias."""

    def __init__(self, graph: Graph):
        self.producers = graph.producers()
        self.users = graph.users()
        self.outputs = set(graph.outputs)
        self.sizes = {k: v.info.numel for k, v in graph.values.items() if v.info is not None}
        self.sizes.update({n.name: n.outputs[0].numel for n in graph.nodes if n.outputs})

    def base(self, name: str) -> str:
        """The tensor ``name`` aliases, through views."""
        node = self.producers.get(name)
        while node is not None and _is_view(node) and node.inputs:
            name = node.inputs[0]
            node = self.producers.get(name)
        return name

    def value(self, node: Node) -> str:
        return node.name

    def reads(self, node: Node) -> set[str]:
        return {self.base(i) for i in node.inputs}

    def readers(self, value: str) -> set[str]:
        out: set[str] = set()
        todo = [value]
        while todo:
            name = todo.pop()
            if name in self.outputs:
                out.add(OUTPUT)
            for u in self.users.get(name, ()):
                if _is_view(u):
                    todo.append(u.name)
                else:
                    out.add(u.name)
        return out

    def numel(self, value: str) -> int:
        return self.sizes.get(value, 0)


def _elementwise_entry(node: Node) -> bool:
    return node.npu is not None and bool(node.npu.vector_ops) and all(
        o in ELEMENTWISE_VECTOR_OPS for o in node.npu.vector_ops)


@register
@dataclass(frozen=True)
class FuseElementwise(Pass):
    """Chains of element-wise Vector nodes become one Vector kernel each."""

    name: ClassVar[str] = "fuse_elementwise"
    fusion: ClassVar[str] = "elementwise"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        view = GraphChains(graph)
        items, lone = [], {}
        for node in graph.nodes:
            if node.unit == "free":
                continue
            spec = node.kernel
            if node.group is None and node.unit == "vector" and isinstance(spec, Decomposed) \
                    and _elementwise_entry(node):   # a decomposed composite: its one fused kernel, to join or restore
                spec = lone[node.name] = vector_kernel(graph, [node], *spec.dtypes)
            if node.group is not None or node.unit != "vector" or not isinstance(spec, VectorKernel):
                items.append((node, [], False))   # not a member; closes a chain it reads
                continue
            items.append((node, [spec], False))
        notes = []
        chains = fused_nodes = restored = 0
        order = {n.name: i for i, n in enumerate(graph.nodes)}
        moves: list[tuple[Node, list[Node]]] = []
        for members, specs in fuse_vector_chains(items, view, ELEMENTWISE):
            if len(members) == 1:
                node = members[0]
                if node.name in lone:
                    node.kernel, node.fused_by = lone[node.name], self.name
                    restored += 1
                continue
            head, last = members[0], members[-1]
            span = graph.nodes[order[head.name]:order[last.name] + 1]
            values = {m.name for m in members}
            block = set(values)   # the members, and the kernel-less nodes between them that read the chain
            for n in span:
                if n.unit == "free" and any(i in block for i in n.inputs):
                    block.add(n.name)
            internal = [v for v in span if v.name in block and _is_view(v) and view.readers(v.name) <= values]
            for m in written_members(members, view):
                if m is not last:
                    outside = sorted(view.readers(m.name) - values)
                    notes.append(self.note(m, f"output also read by {', '.join(outside)}: the fused kernel from "
                                              f"{describe(head)} writes it"))
            for n in members + internal:
                n.group, n.fused_by, n.kernel = head.name, self.name, None
            head.kernel = specs[0]
            moves.append((last, [n for n in span if n.name in block]))
            chains += 1
            fused_nodes += len(members) + len(internal)
        for last, block in moves:   # the fused kernel runs where its last member ran
            moved = {n.name for n in block}
            rest = [n for n in graph.nodes if n.name not in moved or n is last]
            at = next(i for i, n in enumerate(rest) if n is last)
            graph.nodes[:] = rest[:at] + block + rest[at + 1:]
        summary = f"fused {chains} element-wise chains ({fused_nodes} nodes)"
        if restored:
            summary += f"; {restored} lone composites (GELU) run as one kernel again"
        return PassResult(graph, modified=chains + restored > 0, summary=summary, notes=tuple(notes))


__all__ = ["ELEMENTWISE_VECTOR_OPS", "FuseElementwise", "GraphChains"]
