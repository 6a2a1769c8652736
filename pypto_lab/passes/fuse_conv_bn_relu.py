"""Fuse a convolution with its residual add and activation, and a matmul with its activation.

On the AI Core the Cube's result drains from L0C through FixPipe, which can add a residual and
apply an activation on the way out; the fused kernel then writes one tensor instead of three.
Starting at each convolution (unit "cube") this pass grows a group along single-use successors:
an optional residual ``add``/``add_`` whose other operand comes from elsewhere
(``attrs["residual"]``), then an optional activation (``attrs["activation"]``). A linear/addmm/mm
followed by ReLU or GELU gets the same matmul epilogue fusion. A BN folded by `fold_batchnorm`
already lives in the conv, so a conv with a folded BN is a group even when nothing follows it.

Group members get ``attrs["group"]`` = the Cube node's name and ``attrs["fused_by"]`` = this
pass's name; views (unit "free") between members join the group transparently. Declined fusions
are noted, e.g. "conv2d layer1.0.conv3 (conv2d_3): output also read by add_1, conv2d_5; ReLU not
fused".
"""

from __future__ import annotations

from ..capture.graph import Graph, Node
from ..capture.catalogue import aten_name
from .base import Pass, PassContext, PassResult, register
from .fold_batchnorm import CONVS, describe

MATMULS = ("linear", "addmm", "mm", "linear_int8")  # linear_int8: pypto_lab.quantization's int8 Linear
RESIDUAL_ADDS = ("add", "add_")
# activations FixPipe applies as the Cube's result drains (aten name -> epilogue name)
CONV_ACTIVATIONS = {"relu": "relu", "relu_": "relu", "hardtanh": "hardtanh", "hardtanh_": "hardtanh",
                    "silu": "silu", "silu_": "silu", "gelu": "gelu"}
MATMUL_ACTIVATIONS = {"relu": "relu", "relu_": "relu", "gelu": "gelu"}
# activations a user may expect to fuse but FixPipe cannot apply: declined with a note
OTHER_ACTIVATIONS = ("relu", "relu_", "gelu", "silu", "silu_", "hardtanh", "hardtanh_", "sigmoid", "sigmoid_",
                     "tanh", "tanh_", "hardswish", "hardswish_", "hardsigmoid", "leaky_relu", "leaky_relu_",
                     "elu", "elu_", "mish", "softplus", "erf", "prelu")


class _Walk:
    """Single-use successors of a node, stepping over views."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.users = {k: _unique(v) for k, v in graph.users().items()}
        self.outputs = set(graph.outputs)

    def readers(self, name: str) -> list[str]:
        out = [u.name for u in self.users.get(name, [])]
        return out + ["the graph output"] if name in self.outputs else out

    def next(self, node: Node) -> tuple[list[Node], Node | None, list[str]]:
        """(views stepped over, the next non-view node, readers blocking the step if any)."""
        views: list[Node] = []
        cur = node
        while True:
            readers = self.readers(cur.name)
            if len(readers) != 1 or readers[0] == "the graph output":
                return views, None, readers
            nxt = self.users[cur.name][0]
            if nxt.attrs.get("unit") == "free" and "group" not in nxt.attrs:
                views.append(nxt)
                cur = nxt
                continue
            return views, nxt, []


def _unique(nodes: list[Node]) -> list[Node]:
    seen: dict[str, Node] = {}
    for n in nodes:
        seen.setdefault(n.name, n)
    return list(seen.values())


def _candidates(walk: _Walk, node: Node, wanted: tuple[str, ...] | dict) -> list[str]:
    """Readers (past views) of ``node`` that are fusion candidates, for the decline note."""
    found = []
    stack = [node]
    while stack:
        cur = stack.pop()
        for u in walk.users.get(cur.name, []):
            if u.attrs.get("unit") == "free":
                stack.append(u)
            elif aten_name(u.target) in wanted:
                found.append(u)
    return [aten_name(u.target) for u in found]


_PRETTY = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "hardtanh": "Hardtanh", "add": "residual add"}


def _pretty(op: str) -> str:
    base = op.rstrip("_")
    return _PRETTY.get(base, base)


@register
class FuseConvBnRelu(Pass):
    """Conv (+ folded BN) + residual add + activation, and matmul + activation, as one kernel each."""

    name = "fuse_conv_bn_relu"
    requires = ("fold_batchnorm",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        notes: list[str] = []
        walk = _Walk(graph)
        order = {n.name: i for i, n in enumerate(graph.nodes)}
        convs = residuals = activations = epilogues = 0
        for anchor in list(graph.nodes):
            op = aten_name(anchor.target)
            if anchor.attrs.get("unit") != "cube" or "group" in anchor.attrs:
                continue
            if op in CONVS:
                members = self._grow(walk, order, anchor, notes, with_residual=True, acts=CONV_ACTIVATIONS)
                if len(members) > 1 or "folded_bn" in anchor.attrs:
                    convs += 1
            elif op in MATMULS:
                members = self._grow(walk, order, anchor, notes, with_residual=False, acts=MATMUL_ACTIVATIONS)
                if len(members) > 1:
                    epilogues += 1
            else:
                continue
            if len(members) > 1 or "folded_bn" in anchor.attrs:
                for m in members:
                    m.attrs["group"] = anchor.name
                    m.attrs["fused_by"] = self.name
                if op in CONVS:
                    residuals += "residual" in anchor.attrs
                    activations += "activation" in anchor.attrs
        notes.insert(0, f"fused {convs} convolution groups ({residuals} with a residual add, {activations} with "
                        f"an activation) and {epilogues} matmul epilogues")
        return PassResult(graph, modified=convs + epilogues > 0, notes=notes)

    def _grow(self, walk: _Walk, order: dict[str, int], anchor: Node, notes: list[str], with_residual: bool,
              acts: dict[str, str]) -> list[Node]:
        members = [anchor]
        tail = anchor
        wanted = tuple(acts) + (RESIDUAL_ADDS if with_residual else ())
        views, nxt, blocked = walk.next(tail)
        if nxt is None:
            if len(blocked) > 1:
                cands = _candidates(walk, tail, wanted)
                if cands:
                    notes.append(f"{describe(anchor)}: output also read by {', '.join(blocked)}; "
                                 f"{' / '.join(sorted({_pretty(c) for c in cands}))} not fused")
            return members
        if with_residual and aten_name(nxt.target) in RESIDUAL_ADDS and "group" not in nxt.attrs:
            fusable, reason, other = self._residual(walk, order, anchor, tail, views, nxt)
            if not fusable:
                if reason:
                    notes.append(f"{describe(anchor)}: {reason}")
                return members
            anchor.attrs["residual"] = other
            members += views + [nxt]
            tail = nxt
            views, nxt, blocked = walk.next(tail)
            if nxt is None:
                cands = _candidates(walk, tail, tuple(acts)) if len(blocked) > 1 else []
                if cands:
                    notes.append(f"{describe(anchor)}: residual {tail.name} output also read by "
                                 f"{', '.join(blocked)}; {' / '.join(sorted({_pretty(c) for c in cands}))} not fused")
                return members
        act = aten_name(nxt.target)
        if act in acts and "group" not in nxt.attrs and nxt.attrs.get("unit") == "vector":
            anchor.attrs["activation"] = acts[act]
            members += views + [nxt]
        elif act in OTHER_ACTIVATIONS:
            kind = "conv" if with_residual else "matmul"
            notes.append(f"{describe(anchor)}: {act} is not applied by FixPipe after a {kind} (supported: "
                         f"{', '.join(sorted(set(acts.values())))}); {_pretty(act)} not fused")
        return members

    @staticmethod
    def _residual(walk: _Walk, order: dict[str, int], anchor: Node, tail: Node, views: list[Node],
                  add: Node) -> tuple[bool, str, str]:
        """(whether ``add`` can be ``anchor``'s residual epilogue, why not, the add's other operand).

        The other operand must have the output's shape (FixPipe adds no broadcast) and be ready when
        the conv starts: of two convs meeting at one add, the later one takes the add."""
        last = views[-1].name if views else tail.name
        others = [i for i in dict.fromkeys(add.inputs) if i != last]
        if len(others) != 1 or len(add.inputs) != 2:
            return False, "", ""  # x + x or x + scalar: not a residual, nothing to note
        other = others[0]
        info, mine = walk.graph.info(other), add.outputs[0] if add.outputs else None
        if info is None or mine is None or info.shape != mine.shape:
            shape = info.shape if info is not None else "?"
            return (False, f"residual {add.name} broadcasts {other} {shape} to {mine.shape if mine else '?'}; "
                    "FixPipe adds a residual of the output's shape only; residual add not fused", "")
        if other in order and order[other] > order[anchor.name]:
            producer = walk.graph.node(other)
            if aten_name(producer.target) in CONVS:
                then = f"the add is left to {other}'s group"
            else:
                then = "residual add not fused"
            return False, f"residual {add.name} also needs {other}, computed after this conv; {then}", ""
        return True, "", other
