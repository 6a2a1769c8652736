"""GM memory planning: liveness at kernel granularity, best-fit reuse, precision-scaled sizes."""

import pytest
import torch
import torch.nn as nn
import torchvision

import pypto_lab
from pypto_lab.analysis.memory_plan import ALIGN, MemoryPlan, memory_plan
from pypto_lab.capture import capture
from pypto_lab.lowering.lower import kernels_of
from pypto_lab.passes import PassManager

LEVEL0 = ["map_ops"]
LEVEL1 = ["map_ops", "fold_batchnorm", "fuse_conv_bn_relu", "fuse_elementwise"]


@pytest.fixture(scope="module")
def resnet50_graphs():
    """{(batch, level): mapped graph} for ResNet-50 at batch 1 and 32, level-0 and level-1 pipelines."""
    model = torchvision.models.resnet50()
    out = {}
    for batch in (1, 32):
        g = capture(model, torch.randn(batch, 3, 224, 224))
        out[batch, 0] = PassManager(LEVEL0).run(g)
        out[batch, 1] = PassManager(LEVEL1).run(g)
    return out


def _kernel_io_bytes(graph, plan: MemoryPlan) -> int:
    """The largest kernel's activation inputs + outputs (aligned), views resolved to what they alias."""
    producers = graph.producers()
    sizes = {b.name: b.size for b in plan.buffers}

    def root(name):
        while name in producers and producers[name].is_view:
            name = producers[name].inputs[0]
        return name

    best = 0
    for kernel in kernels_of(graph):
        nodes = [producers[n] for n in kernel.nodes]
        inside = {n.name for n in nodes}
        touched = {root(i) for n in nodes for i in n.inputs if root(i) not in inside and root(i) not in graph.values}
        touched |= {n.name for n in nodes if n.name in sizes and n.name not in graph.values}
        best = max(best, sum(sizes[t] for t in touched))
    return best


def _assert_no_overlap(plan: MemoryPlan):
    bufs = sorted(plan.buffers, key=lambda b: b.offset)
    for i, a in enumerate(bufs):
        assert a.offset % ALIGN == 0 and a.size % ALIGN == 0 and a.size > 0
        for b in bufs[i + 1:]:
            if b.offset >= a.offset + a.size:
                break
            assert a.last < b.first or b.last < a.first, f"{a} and {b} share memory while both live"


@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("level", [0, 1])
def test_resnet50_reuse_is_sound_and_never_worse(resnet50_graphs, batch, level):
    g = resnet50_graphs[batch, level]
    plan = memory_plan(g, "fp16")
    n = len(kernels_of(g))
    assert plan.kernel_count == n and len(plan.live_bytes) == n
    assert plan.peak_bytes == plan.peak_bytes_reuse <= plan.peak_bytes_no_reuse
    assert plan.peak_bytes_reuse >= max(plan.live_bytes)
    assert plan.peak_bytes_reuse >= plan.resident_bytes + _kernel_io_bytes(g, plan)
    assert plan.peak_bytes_reuse == max(b.offset + b.size for b in plan.buffers)
    _assert_no_overlap(plan)
    # weights: ~25.6 M parameters in fp16, resident, within the alignment slack
    assert 51.0e6 < plan.weight_bytes < 51.5e6
    assert plan.resident_bytes == plan.weight_bytes + 3 * 224 * 224 * 2 * batch
    # the logits are a graph output: live to the last kernel
    out = [b for b in plan.buffers if b.name == g.outputs[0]]
    assert len(out) == 1 and out[0].last == n - 1 and out[0].size == -(-batch * 1000 * 2 // ALIGN) * ALIGN
    # without reuse every buffer has its own block
    flat = memory_plan(g, "fp16", reuse=False)
    assert flat.peak_bytes == flat.peak_bytes_no_reuse == plan.peak_bytes_no_reuse
    assert flat.peak_bytes_no_reuse == sum(b.size for b in flat.buffers)
    assert flat.live_bytes == plan.live_bytes


@pytest.mark.parametrize("batch", [1, 32])
def test_fusion_leaves_fewer_intermediates_and_fp32_doubles_the_bytes(resnet50_graphs, batch):
    l0, l1 = (memory_plan(resnet50_graphs[batch, lvl], "fp16") for lvl in (0, 1))
    assert l1.peak_bytes_no_reuse < l0.peak_bytes_no_reuse
    assert l1.activation_bytes < l0.activation_bytes / 2
    assert l1.peak_bytes_reuse <= l0.peak_bytes_reuse
    for g in (resnet50_graphs[batch, 0], resnet50_graphs[batch, 1]):
        half, full = memory_plan(g, "fp16"), memory_plan(g, "fp32")
        assert full.activation_bytes == pytest.approx(2 * half.activation_bytes, rel=1e-4)
        assert full.resident_bytes == pytest.approx(2 * half.resident_bytes, rel=1e-3)
        int8 = memory_plan(g, "int8")
        assert int8.weight_bytes == pytest.approx(half.weight_bytes / 2, rel=5e-3)  # 512-B alignment of small tensors
        assert memory_plan(g, "bf16").peak_bytes == half.peak_bytes


def test_a_relu_chain_has_the_peak_worked_out_by_hand():
    # x (1, 10, 100) -> relu -> flatten (a view) -> relu -> relu; 1000 elements = 2000 B in fp16 -> 2048 aligned
    model = nn.Sequential(nn.ReLU(), nn.Flatten(), nn.ReLU(), nn.ReLU())
    g = PassManager(["map_ops"]).run(capture(model, torch.randn(1, 10, 100)))
    plan = memory_plan(g, "fp16")
    assert plan.kernel_count == 3 and plan.resident_bytes == 2048 and plan.weight_bytes == 0
    # r1 lives in kernels 0-1, r2 in 1-2, r3 (the output) in 2: r3 takes r1's freed block
    assert [(b.first, b.last, b.size) for b in plan.buffers] == [(0, 2, 2048), (0, 1, 2048), (1, 2, 2048),
                                                                 (2, 2, 2048)]
    assert plan.buffers[3].offset == plan.buffers[1].offset
    assert plan.peak_bytes_no_reuse == 4 * 2048
    assert plan.peak_bytes_reuse == plan.peak_bytes == 3 * 2048
    assert plan.live_bytes == [2 * 2048, 3 * 2048, 3 * 2048]
    # fp32: 4000 B -> 4096
    big = memory_plan(g, "fp32")
    assert (big.peak_bytes_no_reuse, big.peak_bytes_reuse) == (4 * 4096, 3 * 4096)


def test_the_plan_summarises_itself_and_honours_reuse_and_the_allocator(resnet50_graphs):
    g = resnet50_graphs[1, 1]
    plan = memory_plan(g, "fp16")
    assert isinstance(plan, MemoryPlan) and plan.reuse
    text = plan.summary()
    assert text.startswith("peak GM ") and "with reuse" in text and "weights 51." in text
    flat = memory_plan(g, "fp32", reuse=False)
    assert not flat.reuse and flat.peak_bytes == flat.peak_bytes_no_reuse and flat.precision == "fp32"
    assert "without reuse" in flat.summary()
    cached = memory_plan(g, "fp16", allocator="caching")          # the allocator changes the plan
    assert cached.allocator == "caching" and cached.peak_bytes == cached.peak_bytes_caching > cached.peak_bytes_reuse


def test_the_plan_needs_map_ops_and_lives_in_the_report_not_the_graph():
    model, x = nn.Sequential(nn.Linear(16, 32), nn.ReLU()), torch.randn(4, 16)
    g = capture(model, x)
    with pytest.raises(ValueError, match="run map_ops"):
        memory_plan(g)
    om = pypto_lab.optimize(model, x, chip="Ascend910B1", level=2)
    plan = om.report().memory
    assert plan == memory_plan(om.graph, "fp16", allocator="unified")   # an analysis of the final graph
    assert not hasattr(om.graph, "memory_plan") and not hasattr(om.graph, "schedule")
    # linear + ReLU fused: one kernel; weights 16*32 + 32 fp16, input 4*16, output 4*32, each 512-aligned
    assert plan.kernel_count == 1
    assert plan.weight_bytes == 1024 + 512 and plan.resident_bytes == 1024 + 512 + 512
    assert plan.peak_bytes == plan.resident_bytes + 512


def test_a_cpu_lane_op_sits_between_the_kernels_around_it():
    class M(nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return torch.relu(torch.erfinv(y * 0.5)) + y   # erfinv: not in the lowering table, runs on the CPU

    g = PassManager(["map_ops"]).run(capture(M(), torch.randn(1, 1024)))
    assert g.node("erfinv").unit == "cpu"
    plan = memory_plan(g)
    life = {b.name: (b.first, b.last) for b in plan.buffers}
    # steps: relu 0, mul 1, erfinv 2 (on the host: its input goes down, its output comes back), relu_1 3, add 4
    assert life == {"x": (0, 4), "relu": (0, 4), "mul": (1, 2), "erfinv": (2, 3), "relu_1": (3, 4), "add": (4, 4)}
    assert plan.peak_bytes_no_reuse == 6 * 2048 and plan.peak_bytes_reuse == 4 * 2048
    _assert_no_overlap(plan)
