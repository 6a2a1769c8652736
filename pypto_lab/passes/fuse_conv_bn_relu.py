"""Fuse a Cube kernel (convolution or matmul) with its residual add and activation.

The Cube's result leaves L0C through an epilogue (`pypto_lab.hw.capabilities`): on 910B FixPipe
applies a bias and ReLU in flight, and anything else (a residual add, GELU, SiLU, Hardtanh) runs
on a paired vector core after a trip through GM; on 910A / 310P the result drains through the
Vector unit anyway, which applies every stage in UB. Either way the fused kernel writes one
tensor instead of three. Starting at each convolution this pass grows a group along single-use
successors: an optional residual ``add``/``add_`` whose other operand comes from elsewhere, then
an optional activation; a matmul (linear, addmm, mm, an int8 linear) gets the activation only.
It asks the chip's capability table where each activation runs and writes the decision into the
anchor's `CubeKernel` spec (``epilogue``: residual, activation, and which stages FixPipe applies);
an activation no unit can apply after a Cube kernel is declined with a note. A BN folded by
`fold_batchnorm` already lives in the conv, so a conv with a folded BN is a group of its own.

Group members get ``node.group`` = the Cube node's name and ``node.fused_by`` = this pass's name;
views between members join the group. Declined fusions are notes on the Cube node, e.g.
"conv2d layer1.0.conv3 (conv2d_3): output also read by add_1, conv2d_5; ReLU not fused".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.catalogue import aten_name
from ..capture.graph import Graph, Node
from ..hw.capabilities import CoreCapabilities, capabilities
from ..kernels.ir import CubeKernel
from ..lowering.lower import with_epilogue
from .base import Note, Pass, PassContext, PassResult, register
from .fold_batchnorm import CONVS

MATMULS = ("linear", "addmm", "mm", "linear_int8")  # linear_int8: pypto_lab.quantization's int8 Linear
RESIDUAL_ADDS = ("add", "add_")
# ATen activations and the epilogue activation each one is (pypto_lab.hw.capabilities.VECTOR_ACTIVATIONS)
ACTIVATIONS = {"relu": "relu", "relu_": "relu", "hardtanh": "hardtanh", "hardtanh_": "hardtanh",
               "relu6": "hardtanh", "silu": "silu", "silu_": "silu", "gelu": "gelu", "sigmoid": "sigmoid",
               "sigmoid_": "sigmoid"}
# activations a user may expect to fuse but no epilogue applies: declined with a note
OTHER_ACTIVATIONS = ("tanh", "tanh_", "hardswish", "hardswish_", "hardsigmoid", "leaky_relu", "leaky_relu_",
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
            if nxt.unit == "free" and nxt.group is None:
                views.append(nxt)
                cur = nxt
                continue
            return views, nxt, []


def _unique(nodes: list[Node]) -> list[Node]:
    seen: dict[str, Node] = {}
    for n in nodes:
        seen.setdefault(n.name, n)
    return list(seen.values())


def _candidates(walk: _Walk, node: Node, wanted) -> list[str]:
    """Readers (past views) of ``node`` that are fusion candidates, for the decline note."""
    found = []
    stack = [node]
    while stack:
        cur = stack.pop()
        for u in walk.users.get(cur.name, []):
            if u.unit == "free":
                stack.append(u)
            elif aten_name(u.target) in wanted:
                found.append(u)
    return [aten_name(u.target) for u in found]


_PRETTY = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "hardtanh": "Hardtanh", "sigmoid": "Sigmoid",
           "relu6": "ReLU6", "add": "residual add"}


def _pretty(op: str) -> str:
    base = op.rstrip("_")
    return _PRETTY.get(base, base)


@register
@dataclass(frozen=True)
class FuseConvBnRelu(Pass):
    """Conv (+ folded BN) + residual add + activation, and matmul + activation, as one kernel each."""

    name: ClassVar[str] = "fuse_conv_bn_relu"
    fusion: ClassVar[str] = "conv_bn_relu"
    requires: ClassVar[tuple[str, ...]] = ("fold_batchnorm",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        notes: list[Note] = []
        caps = capabilities(ctx.chip)
        walk = _Walk(graph)
        order = {n.name: i for i, n in enumerate(graph.nodes)}
        convs = residuals = activations = epilogues = 0
        for anchor in list(graph.nodes):
            op = aten_name(anchor.target)
            if not isinstance(anchor.kernel, CubeKernel) or anchor.group is not None:
                continue
            if op in CONVS:
                members = self._grow(walk, order, anchor, notes, caps, with_residual=True)
                if len(members) > 1 or anchor.folded_bn is not None:
                    convs += 1
            elif op in MATMULS:
                members = self._grow(walk, order, anchor, notes, caps, with_residual=False)
                if len(members) > 1:
                    epilogues += 1
            else:
                continue
            if len(members) > 1 or anchor.folded_bn is not None:
                for m in members:
                    m.group = anchor.name
                    m.fused_by = self.name
                    if m is not anchor:
                        m.kernel = None
                if op in CONVS:
                    residuals += anchor.kernel.epilogue.residual
                    activations += bool(anchor.kernel.epilogue.activation)
        summary = (f"fused {convs} convolution groups ({residuals} with a residual add, {activations} with an "
                   f"activation) and {epilogues} matmul epilogues")
        return PassResult(graph, modified=convs + epilogues > 0, summary=summary, notes=tuple(notes))

    def _grow(self, walk: _Walk, order: dict[str, int], anchor: Node, notes: list[Note], caps: CoreCapabilities,
              with_residual: bool) -> list[Node]:
        members = [anchor]
        tail = anchor
        wanted = tuple(ACTIVATIONS) + (RESIDUAL_ADDS if with_residual else ())
        views, nxt, blocked = walk.next(tail)
        if nxt is None:
            if len(blocked) > 1:
                cands = _candidates(walk, tail, wanted)
                if cands:
                    notes.append(self.note(anchor, f"output also read by {', '.join(blocked)}; "
                                                   f"{' / '.join(sorted({_pretty(c) for c in cands}))} not fused"))
            return members
        if with_residual and aten_name(nxt.target) in RESIDUAL_ADDS and nxt.group is None:
            fusable, reason = self._residual(walk, order, anchor, tail, views, nxt)
            if not fusable:
                if reason:
                    notes.append(self.note(anchor, reason))
                return members
            anchor.kernel = with_epilogue(anchor.kernel, caps, residual=True)
            members += views + [nxt]
            tail = nxt
            views, nxt, blocked = walk.next(tail)
            if nxt is None:
                cands = _candidates(walk, tail, tuple(ACTIVATIONS)) if len(blocked) > 1 else []
                if cands:
                    notes.append(self.note(anchor, f"residual {tail.name} output also read by {', '.join(blocked)}; "
                                                   f"{' / '.join(sorted({_pretty(c) for c in cands}))} not fused"))
                return members
        act = aten_name(nxt.target)
        if act in ACTIVATIONS and nxt.group is None and nxt.unit == "vector":
            where = caps.where(ACTIVATIONS[act])
            if where:
                anchor.kernel = with_epilogue(anchor.kernel, caps, activation=ACTIVATIONS[act])
                members += views + [nxt]
            else:
                notes.append(self.note(anchor, f"{caps.core_version} applies no {_pretty(act)} after a Cube kernel; "
                                                   "not fused"))
        elif act in OTHER_ACTIVATIONS:
            kind = "conv" if with_residual else "matmul"
            supported = sorted(set(ACTIVATIONS.values()))
            notes.append(self.note(anchor, f"{act} is not applied by FixPipe or the Vector epilogue after a {kind} "
                                                   f"(supported: {', '.join(supported)}); {_pretty(act)} not fused"))
        return members

    @staticmethod
    def _residual(walk: _Walk, order: dict[str, int], anchor: Node, tail: Node, views: list[Node],
                  add: Node) -> tuple[bool, str]:
        """(whether ``add`` can be ``anchor``'s residual epilogue, why not).

        The other operand must have the output's shape (the epilogue adds no broadcast) and be
        ready when the conv starts: of two convs meeting at one add, the later one takes the add."""
        last = views[-1].name if views else tail.name
        others = [i for i in dict.fromkeys(add.inputs) if i != last]
        if len(others) != 1 or len(add.inputs) != 2:
            return False, ""  # x + x or x + scalar: not a residual, nothing to note
        other = others[0]
        info, mine = walk.graph.info(other), add.outputs[0] if add.outputs else None
        if info is None or mine is None or info.shape != mine.shape:
            shape = info.shape if info is not None else "?"
            return (False, f"residual {add.name} broadcasts {other} {shape} to {mine.shape if mine else '?'}; "
                    "the epilogue adds a residual of the output's shape only; residual add not fused")
        if other in order and order[other] > order[anchor.name]:
            producer = walk.graph.node(other)
            if aten_name(producer.target) in CONVS:
                then = f"the add is left to {other}'s group"
            else:
                then = "residual add not fused"
            return False, f"residual {add.name} also needs {other}, computed after this conv; {then}"
        return True, ""
