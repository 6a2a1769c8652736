"""Fold inference BatchNorm into the convolution before it.

In inference a BatchNorm is a per-channel scale and shift, so ``bn(conv(x, w))`` equals
``conv(x, w')`` with rescaled weights and a bias. This pass removes such a BN node, makes every
reader of the BN read the conv instead, records on the conv what was folded (``node.folded_bn``:
the BN's node name, the names of its weight, bias, running mean and variance, and its eps) for
the numerics to apply, and gives the conv's kernel a bias in its epilogue (placed where the chip
applies it: FixPipe's BiasTable on 910B, the Vector unit on 910A). A BN that cannot be folded
(its input is not a convolution, the conv's output is read elsewhere too, it runs in training
mode) stays and a note says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.catalogue import aten_name
from ..capture.graph import FoldedBatchNorm, Graph, Node
from ..hw.capabilities import capabilities
from ..lowering.lower import with_epilogue
from .base import Pass, PassContext, PassResult, describe, register

BATCH_NORMS = ("batch_norm", "_native_batch_norm_legit_no_training")
CONVS = ("conv2d", "convolution", "_convolution", "conv1d")


def _bn_params(bn: Node) -> FoldedBatchNorm:
    """The BN's weight, bias, running mean, running var (None when absent) and its eps."""
    a = list(bn.args) + [None] * 9
    if aten_name(bn.target) == "batch_norm":
        # batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn)
        eps = bn.kwargs.get("eps", a[7] if a[7] is not None else 1e-5)
    else:
        # _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
        eps = bn.kwargs.get("eps", a[6] if a[6] is not None else 1e-5)
    return FoldedBatchNorm(bn.name, a[1], a[2], a[3], a[4], float(eps))


def _training(bn: Node) -> bool:
    if aten_name(bn.target) != "batch_norm":
        return False
    return bool(bn.kwargs.get("training", bn.args[5] if len(bn.args) > 5 else False))


@register
@dataclass(frozen=True)
class FoldBatchNorm(Pass):
    """Remove inference BatchNorms that directly follow a single-use convolution."""

    name: ClassVar[str] = "fold_batchnorm"
    fusion: ClassVar[str] = "conv_bn_relu"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        notes = []
        folded = 0
        caps = capabilities(ctx.chip)
        for bn in [n for n in graph.nodes if aten_name(n.target) in BATCH_NORMS]:
            reason = self._why_not(graph, bn)
            if reason:
                notes.append(self.note(bn, f"{reason}; BatchNorm not folded"))
                continue
            conv = graph.node(bn.inputs[0])
            conv.folded_bn = _bn_params(bn)
            conv.kernel = with_epilogue(conv.kernel, caps, bias=True)
            removed = [bn]
            if aten_name(bn.target) != "batch_norm":  # tuple output: readers are getitem(bn, 0)
                for g in graph.users().get(bn.name, []):
                    removed.append(g)
                    graph.rename_uses(g.name, conv.name)
            graph.rename_uses(bn.name, conv.name)
            gone = {id(n) for n in removed}
            graph.nodes = [n for n in graph.nodes if id(n) not in gone]
            folded += 1
        summary = f"folded {folded} of {folded + len(notes)} BatchNorms into their convolutions"
        return PassResult(graph, modified=folded > 0, summary=summary, notes=tuple(notes))

    @staticmethod
    def _why_not(graph: Graph, bn: Node) -> str:
        if _training(bn):
            return "runs in training mode (batch statistics), only inference BN folds"
        if not bn.inputs:
            return "has no tensor input"
        producers = graph.producers()
        src = producers.get(bn.inputs[0])
        if src is None or aten_name(src.target) not in CONVS:
            what = describe(src) if src is not None else f"graph input {bn.inputs[0]}"
            return f"input is {what}, not a convolution"
        readers = {u.name for u in graph.users().get(src.name, [])} - {bn.name}
        if src.name in graph.outputs:
            readers.add("the graph output")
        if readers:
            return f"{describe(src)} output also read by {', '.join(sorted(readers))}"
        if src.folded_bn is not None:
            return f"{describe(src)} already has {src.folded_bn.bn} folded in"
        if aten_name(bn.target) != "batch_norm":
            for g in graph.users().get(bn.name, []):
                if aten_name(g.target) != "getitem" or (len(g.args) > 1 and g.args[1] != 0):
                    return f"its saved statistics are read by {g.name}"
            if bn.name in graph.outputs:
                return "its output tuple is a graph output"
        return ""
