"""Fuse chains of element-wise Vector operators into one kernel.

Each element-wise Vector kernel reads its inputs from GM into the Unified Buffer and writes its
result back; a chain ``add -> mul -> relu -> exp`` fused into one kernel keeps the intermediates
in UB and writes once. A chain grows from a producer to its single consumer while both are
element-wise Vector nodes (by their catalogue kernel, ``node.npu.vector_op``) not yet in a group;
views (unit "free") in between are stepped over and join the group. Reductions, norms, softmax,
pooling and gathers end a chain. Members get ``node.group`` = the first node's name and
``node.fused_by`` = this pass's name; the first node's spec becomes the one Vector kernel.

A composite left decomposed into primitives (a GELU no Cube kernel took into its epilogue) is
one fused CANN kernel again at this level (`Gelu`): one GM round trip instead of five.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.catalogue import aten_name
from ..capture.graph import Graph, Node
from ..kernels.ir import Decomposed
from ..lowering.lower import vector_kernel
from .base import Pass, PassContext, PassResult, register

# Vector kernels (`pypto_lab.hw.kernels.VECTOR_OPS`) that work element by element
ELEMENTWISE_VECTOR_OPS = frozenset({"add", "sub", "mul", "div", "relu", "exp", "sqrt", "rsqrt", "cast", "gelu",
                                    "add_relu"})
# catalogue entries costed with an element-wise kernel that are not element-wise themselves
NOT_ELEMENTWISE = frozenset({"embedding", "index_select", "gather"})


def is_elementwise(node: Node) -> bool:
    return (node.unit == "vector" and node.npu.vector_op in ELEMENTWISE_VECTOR_OPS
            and aten_name(node.target) not in NOT_ELEMENTWISE)



@register
@dataclass(frozen=True)
class FuseElementwise(Pass):
    """Chains of single-use element-wise Vector nodes become one Vector kernel each."""

    name: ClassVar[str] = "fuse_elementwise"
    fusion: ClassVar[str] = "elementwise"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        users: dict[str, list[Node]] = {}
        for k, v in graph.users().items():
            users[k] = list({n.name: n for n in v}.values())
        outputs = set(graph.outputs)
        notes = []
        chains = fused_nodes = restored = 0
        for head in list(graph.nodes):
            if not is_elementwise(head) or head.group is not None:
                continue
            chain, views, cur = [head], [], head
            while True:
                readers = users.get(cur.name, [])
                if len(readers) != 1 or cur.name in outputs:
                    if len(readers) > 1 and any(is_elementwise(r) for r in readers):
                        notes.append(self.note(cur, f"output also read by {', '.join(r.name for r in readers)}; "
                                                    f"the chain from {head.name} ends here"))
                    break
                nxt = readers[0]
                if nxt.group is not None:
                    break
                if nxt.unit == "free":
                    views.append(nxt)
                elif is_elementwise(nxt):
                    chain += views + [nxt]
                    views = []
                else:
                    break
                cur = nxt
            if sum(n.unit != "free" for n in chain) < 2:
                if isinstance(head.kernel, Decomposed):  # a lone composite: its fused CANN kernel
                    head.kernel = vector_kernel(graph, [head], *head.kernel.dtypes)
                    head.fused_by = self.name
                    restored += 1
                continue
            dtype, compute = head.kernel.dtypes
            for n in chain:
                n.group = head.name
                n.fused_by = self.name
                n.kernel = None
            head.kernel = vector_kernel(graph, chain, dtype, compute)
            chains += 1
            fused_nodes += len(chain)
        summary = f"fused {chains} element-wise chains ({fused_nodes} nodes)"
        if restored:
            summary += f"; {restored} lone composites (GELU) run as one kernel again"
        return PassResult(graph, modified=chains + restored > 0, summary=summary, notes=tuple(notes))


__all__ = ["ELEMENTWISE_VECTOR_OPS", "FuseElementwise", "is_elementwise"]
