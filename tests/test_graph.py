"""Capture with torch.export, the lowering table and the pass infrastructure."""

from dataclasses import FrozenInstanceError, dataclass
from typing import ClassVar

import pytest
import torch
import torch.nn as nn
import torchvision

from pypto_lab.capture import CaptureError, capture
from pypto_lab.hw.chip import get_chip
from pypto_lab.passes import (
    Pass,
    PassContext,
    PassManager,
    PassOrderError,
    PassResult,
    RecordSnapshots,
    get_pass,
    register,
)
from pypto_lab.passes.op_mapping import fallbacks


@pytest.fixture(scope="module")
def resnet50_graph():
    return capture(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224))


@pytest.fixture(scope="module")
def encoder():
    layer = nn.TransformerEncoderLayer(64, 4, 128, activation="gelu", batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def test_resnet50_capture_keeps_targets_shapes_and_modules(resnet50_graph):
    g = resnet50_graph
    counts = g.op_counts()
    assert counts["aten.conv2d.default"] == 53 and counts["aten.batch_norm.default"] == 53
    conv1 = next(n for n in g.nodes if n.op == "conv2d")
    assert conv1.module == "conv1" and conv1.module_type.endswith("Conv2d")
    assert conv1.outputs[0].shape == (1, 64, 112, 112) and conv1.outputs[0].dtype == "float32"
    assert g.values[conv1.inputs[1]].kind == "param" and g.values[conv1.inputs[1]].target == "conv1.weight"
    assert g.info(g.outputs[0]).shape == (1, 1000)


def test_capture_is_cached_per_model_and_shapes():
    model = torchvision.models.resnet18()
    a = capture(model, torch.randn(1, 3, 64, 64))
    b = capture(model, torch.randn(1, 3, 64, 64))
    assert a is not b and [n.name for n in a.nodes] == [n.name for n in b.nodes]
    a.nodes[0].fused_by = "touched"
    assert capture(model, torch.randn(1, 3, 64, 64)).nodes[0].fused_by == ""  # a copy each time
    c = capture(model, torch.randn(2, 3, 64, 64))
    assert c.nodes[0].outputs[0].shape[0] == 2


def test_every_resnet50_and_encoder_op_is_in_the_catalogue(resnet50_graph, encoder):
    for g in (resnet50_graph, capture(encoder, torch.randn(2, 16, 64))):
        mapped = PassManager(["map_ops"]).run(g, PassContext(get_chip("Ascend910A")))
        assert fallbacks(mapped) == []
        units = {n.unit for n in mapped.nodes}
        assert "cube" in units and "vector" in units


def test_unknown_op_falls_back_to_the_cpu_lane():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.special.i0(x) + 1

    g = capture(Odd(), torch.randn(4, 4))
    result = get_pass("map_ops")(g)
    assert fallbacks(result.graph) == ["aten.special_i0.default"]
    assert any("falls back to the CPU lane" in note.reason and note.node == "special_i0" for note in result.notes)
    assert result.graph.node("special_i0").kernel.bytes_in == 4 * 4 * 4   # a host kernel: bytes over the link


def test_data_dependent_shapes_get_a_clear_error():
    class DataDependent(nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(CaptureError, match=r"data-dependent shape.*static shapes.*torch.where"):
        capture(DataDependent(), torch.randn(8))

    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(CaptureError, match=r"torch.export could not capture Branchy.*torch.cond"):
        capture(Branchy(), torch.randn(8))
    with pytest.raises(CaptureError, match="needs a torch.nn.Module"):
        capture(lambda x: x, torch.randn(2))


def test_pass_manager_checks_order_and_calls_instruments(resnet50_graph):
    @register
    @dataclass(frozen=True)
    class CountConvs(Pass):
        name: ClassVar[str] = "test_count_convs"
        requires: ClassVar[tuple[str, ...]] = ("map_ops",)
        op: str = "Conv2D"                      # a typed option

        def apply(self, graph, ctx):
            convs = [n for n in graph.nodes if n.npu.name == self.op]
            return PassResult(graph, modified=False, summary=f"{len(convs)} convolutions")

    with pytest.raises(PassOrderError, match="'test_count_convs' requires 'map_ops'"):
        PassManager(["test_count_convs", "map_ops"])
    rec = RecordSnapshots()
    PassManager(["map_ops", "test_count_convs"], [rec]).run(resnet50_graph)
    assert [s.name for s in rec.snapshots] == ["map_ops", "test_count_convs"]
    assert rec.snapshots[1].summary == "53 convolutions" and not rec.snapshots[1].modified
    assert resnet50_graph.nodes[0].npu is None  # passes work on copies
    assert get_pass("test_count_convs", op="MatMulV2") == CountConvs("MatMulV2")  # passes are values
    with pytest.raises(FrozenInstanceError):
        CountConvs().op = "Relu"
    with pytest.raises(KeyError, match="no pass named 'fuse_everything'"):
        get_pass("fuse_everything")


def test_capture_is_part_of_the_public_api():
    import pypto_lab

    g = pypto_lab.capture(torch.nn.Linear(8, 4), torch.randn(2, 8))
    assert isinstance(g, pypto_lab.Graph) and [n.op for n in g.nodes] == ["linear"]
    assert issubclass(pypto_lab.CaptureError, ValueError)
