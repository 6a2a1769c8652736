"""Fuse chains of element-wise Vector operators into one kernel.

Each element-wise Vector kernel reads its inputs from GM into the Unified Buffer and writes its
result back; a chain ``add -> mul -> relu -> exp`` fused into one kernel keeps the intermediates
in UB and writes once. A chain grows from a producer to its single consumer while both are
element-wise Vector nodes (by their catalogue kernel, ``attrs["vector_op"]``) not yet in a group;
views (unit "free") in between are stepped over and join the group. Reductions, norms, softmax,
pooling and gathers end a chain. Members get ``attrs["group"]`` = the first node's name and
``attrs["fused_by"]`` = this pass's name.
"""

from __future__ import annotations

from ..capture.graph import Graph, Node
from ..capture.catalogue import aten_name
from .base import Pass, PassContext, PassResult, register
from .fold_batchnorm import describe

# Vector kernels (`pypto_lab.hw.kernels.VECTOR_OPS`) that work element by element
ELEMENTWISE_VECTOR_OPS = frozenset({"add", "sub", "mul", "div", "relu", "exp", "sqrt", "rsqrt", "cast", "gelu",
                                    "add_relu"})
# catalogue entries costed with an element-wise kernel that are not element-wise themselves
NOT_ELEMENTWISE = frozenset({"embedding", "index_select", "gather"})


def is_elementwise(node: Node) -> bool:
    return (node.attrs.get("unit") == "vector" and node.attrs.get("vector_op") in ELEMENTWISE_VECTOR_OPS
            and aten_name(node.target) not in NOT_ELEMENTWISE)


@register
class FuseElementwise(Pass):
    """Chains of single-use element-wise Vector nodes become one Vector kernel each."""

    name = "fuse_elementwise"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        users: dict[str, list[Node]] = {}
        for k, v in graph.users().items():
            users[k] = list({n.name: n for n in v}.values())
        outputs = set(graph.outputs)
        notes: list[str] = []
        chains = fused_nodes = 0
        for head in list(graph.nodes):
            if not is_elementwise(head) or "group" in head.attrs:
                continue
            chain, views, cur = [head], [], head
            while True:
                readers = users.get(cur.name, [])
                if len(readers) != 1 or cur.name in outputs:
                    if len(readers) > 1 and any(is_elementwise(r) for r in readers):
                        notes.append(f"{describe(cur)}: output also read by "
                                     f"{', '.join(r.name for r in readers)}; the chain from {head.name} ends here")
                    break
                nxt = readers[0]
                if "group" in nxt.attrs:
                    break
                if nxt.attrs.get("unit") == "free":
                    views.append(nxt)
                elif is_elementwise(nxt):
                    chain += views + [nxt]
                    views = []
                else:
                    break
                cur = nxt
            if sum(n.attrs.get("unit") != "free" for n in chain) < 2:
                continue
            for n in chain:
                n.attrs["group"] = head.name
                n.attrs["fused_by"] = self.name
            chains += 1
            fused_nodes += len(chain)
        notes.insert(0, f"fused {chains} element-wise chains ({fused_nodes} nodes)")
        return PassResult(graph, modified=chains > 0, notes=notes)
