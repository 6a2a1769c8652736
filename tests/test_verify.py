"""The graph verifier: the invariants every pass keeps, checked after each pass (on in the tests
through PYPTO_LAB_VERIFY=1) and on demand."""

import pytest
import torch
import torch.nn as nn

from pypto_lab.capture import capture
from pypto_lab.passes import GraphError, PassManager, Verify, get_pass, verify


def _fused():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    g = capture(model, torch.randn(1, 3, 16, 16))
    return PassManager(["map_ops", "fold_batchnorm", "fuse_conv_bn_relu"]).run(g)


def test_a_good_graph_passes_and_the_manager_verifies_after_every_pass(monkeypatch):
    g = _fused()
    verify(g)
    assert any(isinstance(i, Verify) for i in PassManager(["map_ops"]).instruments)  # PYPTO_LAB_VERIFY=1 here
    monkeypatch.setenv("PYPTO_LAB_VERIFY", "0")
    assert not any(isinstance(i, Verify) for i in PassManager(["map_ops"]).instruments)


@pytest.mark.parametrize("breaks, match", [
    (lambda g: g.nodes.reverse(), "reads 'conv2d' before it is defined.*topological order"),
    (lambda g: setattr(g, "outputs", ["nowhere"]), "graph output 'nowhere' is not defined"),
    (lambda g: setattr(g.node("relu"), "kernel", g.node("conv2d").kernel), "member of group 'conv2d' but carries a spec"),
    (lambda g: setattr(g.node("conv2d"), "kernel", None), "group 'conv2d' has no kernel spec"),
    (lambda g: setattr(g.node("relu"), "group", None), "'relu'.*is in no kernel: it has no spec and no group"),
    (lambda g: setattr(g.node("relu"), "outputs", []), "'relu'.*is read but has no output shape"),
    (lambda g: setattr(g.node("relu"), "npu", None), "'relu'.*has no catalogue entry"),
])
def test_each_broken_invariant_is_named(breaks, match):
    g = _fused()
    assert g.outputs == ["relu"]
    breaks(g)
    with pytest.raises(GraphError, match=match):
        verify(g, after="a test")


def test_a_pass_that_breaks_the_graph_is_caught_after_it_runs():
    from dataclasses import dataclass
    from typing import ClassVar

    from pypto_lab.passes import Pass, PassResult

    @dataclass(frozen=True)
    class DropAnchor(Pass):
        name: ClassVar[str] = "test_drop_anchor"

        def apply(self, graph, ctx):
            graph.nodes = [n for n in graph.nodes if n.name != "conv2d"]
            return PassResult(graph, True, "dropped the conv")

    g = capture(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), torch.randn(1, 3, 8, 8))
    with pytest.raises(GraphError, match="after pass 'test_drop_anchor': node 'relu'.*reads 'conv2d'"):
        PassManager([get_pass("map_ops"), DropAnchor()], [Verify()]).run(g)
