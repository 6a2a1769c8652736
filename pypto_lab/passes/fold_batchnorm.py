"""Fold inference BatchNorm into the convolution before it.

In inference a BatchNorm is a per-channel scale and shift, so ``bn(conv(x, w))`` equals
``conv(x, w')`` with rescaled weights and a bias. This pass removes such a BN node, makes every
reader of the BN read the conv instead, and records on the conv what was folded
(``attrs["folded_bn"]`` = the BN's node name, ``attrs["bn_params"]`` = the names of its weight,
bias, running mean and variance, and its eps) for the numerics to apply. A BN that cannot be
folded (its input is not a convolution, the conv's output is read elsewhere too, it runs in
training mode) stays and a note says why.
"""

from __future__ import annotations

from typing import Any

from ..capture.graph import Graph, Node
from ..capture.catalogue import aten_name
from .base import Pass, PassContext, PassResult, register

BATCH_NORMS = ("batch_norm", "_native_batch_norm_legit_no_training")
CONVS = ("conv2d", "convolution", "_convolution", "conv1d")


def describe(node: Node) -> str:
    """"conv2d layer1.0.conv3 (conv2d_3)": the op, where it comes from and its node name."""
    op = aten_name(node.target)
    return f"{op} {node.module} ({node.name})" if node.module else f"{op} {node.name}"


def _bn_params(bn: Node) -> dict[str, Any]:
    """Names of the BN's weight, bias, running mean, running var (None when absent) and its eps."""
    a = list(bn.args) + [None] * 9
    if aten_name(bn.target) == "batch_norm":
        # batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn)
        eps = bn.kwargs.get("eps", a[7] if a[7] is not None else 1e-5)
    else:
        # _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
        eps = bn.kwargs.get("eps", a[6] if a[6] is not None else 1e-5)
    return {"weight": a[1], "bias": a[2], "running_mean": a[3], "running_var": a[4], "eps": float(eps)}


def _training(bn: Node) -> bool:
    if aten_name(bn.target) != "batch_norm":
        return False
    return bool(bn.kwargs.get("training", bn.args[5] if len(bn.args) > 5 else False))


@register
class FoldBatchNorm(Pass):
    """Remove inference BatchNorms that directly follow a single-use convolution."""

    name = "fold_batchnorm"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        notes: list[str] = []
        folded = 0
        for bn in [n for n in graph.nodes if aten_name(n.target) in BATCH_NORMS]:
            reason = self._why_not(graph, bn)
            if reason:
                notes.append(f"{describe(bn)}: {reason}; BatchNorm not folded")
                continue
            conv = graph.node(bn.inputs[0])
            conv.attrs["folded_bn"] = bn.name
            conv.attrs["bn_params"] = _bn_params(bn)
            removed = [bn]
            if aten_name(bn.target) != "batch_norm":  # tuple output: readers are getitem(bn, 0)
                for g in graph.users().get(bn.name, []):
                    removed.append(g)
                    graph.rename_uses(g.name, conv.name)
            graph.rename_uses(bn.name, conv.name)
            gone = {id(n) for n in removed}
            graph.nodes = [n for n in graph.nodes if id(n) not in gone]
            folded += 1
        notes.insert(0, f"folded {folded} of {folded + len(notes)} BatchNorms into their convolutions")
        return PassResult(graph, modified=folded > 0, notes=notes)

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
        if "folded_bn" in src.attrs:
            return f"{describe(src)} already has {src.attrs['folded_bn']} folded in"
        if aten_name(bn.target) != "batch_norm":
            for g in graph.users().get(bn.name, []):
                if aten_name(g.target) != "getitem" or (len(g.args) > 1 and g.args[1] != 0):
                    return f"its saved statistics are read by {g.name}"
            if bn.name in graph.outputs:
                return "its output tuple is a graph output"
        return ""
