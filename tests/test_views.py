"""Plot functions return Figures whose artists carry the simulator's numbers."""

import re

from pypto_lab import simulate_matmul
from pypto_lab.viz.views import plot_pipe_busy, plot_swimlane


def test_swimlane_draws_every_instruction_of_the_core():
    r = simulate_matmul(512, 512, 512, chip="Ascend910B1")
    fig = plot_swimlane(r, core=0)
    ax = fig.axes[0]
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == int((r.instructions.core == 0).sum())
    assert f"{r.cycles:,.0f} cycles" in ax.get_title()
    assert {t.get_text() for t in ax.get_yticklabels()} >= {"MTE2", "CUBE", "FIXP"}


def test_pipe_busy_bars_are_fractions_of_the_kernel():
    r = simulate_matmul(1024, 1024, 1024, chip="Ascend910B1")
    ax = plot_pipe_busy(r).axes[0]
    widths = {lab.get_text(): p.get_width() for lab, p in zip(ax.get_yticklabels(), ax.patches)}
    assert abs(widths["CUBE"] - r.pipe_busy["CUBE"] / r.cycles) < 1e-9


# ---- model views ------------------------------------------------------------------------------

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

import pypto_lab  # noqa: E402
from pypto_lab.hw.chip import get_chip  # noqa: E402
from pypto_lab.viz import views  # noqa: E402


class _Block(torch.nn.Module):
    """A small residual block: conv-BN-ReLU, conv-BN + skip, ReLU, then a linear head with GELU."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16 * 8 * 8, 64)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return torch.nn.functional.gelu(self.fc(y.flatten(1)))


@pytest.fixture(scope="module")
def small():
    model, x = _Block().eval(), torch.randn(2, 16, 8, 8)
    return {lvl: pypto_lab.optimize(model, x, chip="Ascend910B1", level=lvl, precision="fp16") for lvl in range(4)}


@pytest.fixture(scope="module")
def resnet():
    import torchvision

    return pypto_lab.optimize(torchvision.models.resnet50().eval(), torch.randn(1, 3, 224, 224),
                              chip="Ascend910A", level=3, precision="fp16")


def test_fusion_graph_before_and_after_colours_fused_groups(small):
    fig = views.plot_fusion_graph(small[1], before=small[0])
    before, after = fig.pypto_data
    assert len(fig.axes) == 2
    assert not before["groups"] and after["groups"]
    assert len(after["nodes"]) < len(before["nodes"])          # BatchNorms folded, ReLUs fused
    # every fused group of the graph is a kernel of the report
    assert len(after["groups"]) <= len(small[1].report().kernels)
    assert "fused groups" in fig.axes[1].get_title()


def test_fusion_graph_zooms_to_a_resnet_bottleneck_and_annotates_declines(resnet):
    fig = views.plot_fusion_graph(resnet, block="layer1.0")
    (panel,) = fig.pypto_data
    nodes = {resnet.graph.node(n).module for n in panel["nodes"]}
    assert all(m == "layer1.0" or m.startswith("layer1.0.") for m in nodes)
    declined = views.declined_fusions(resnet.report())
    assert panel["declined"] and set(panel["declined"]) <= set(declined)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("residual" in t for t in texts)                # the reason from the pass note
    with pytest.raises(ValueError, match="no op of the graph"):
        views.plot_fusion_graph(resnet, block="layer9")


def test_fusion_graph_zooms_to_one_bert_layer():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                     vocab_size=100, max_position_embeddings=32)
    om = pypto_lab.optimize(BertModel(cfg).eval(), (torch.randint(0, 100, (1, 16)),), chip="Ascend910B1", level=1)
    fig = views.plot_fusion_graph(om, block="encoder.layer.0")
    (panel,) = fig.pypto_data
    mods = {om.graph.node(n).module for n in panel["nodes"]}
    assert mods and all(m.startswith("encoder.layer.0") for m in mods)
    assert panel["groups"]


def test_memory_occupancy_marks_the_plan_peak(resnet, small):
    rep = resnet.report()
    fig = views.plot_memory_occupancy(resnet)
    ax = fig.axes[0]
    star = [ln for ln in ax.lines if ln.get_gid() == "peak"]
    assert len(star) == 1 and star[0].get_ydata()[0] * 1e6 == pytest.approx(rep.peak_memory_bytes)
    data = fig.pypto_data
    assert data["no_reuse"][-1] == rep.memory.peak_bytes_no_reuse
    assert data["reuse"].max() == rep.memory.peak_bytes_reuse
    assert np.array_equal(data["live"], np.asarray(rep.memory.live_bytes, dtype=float))
    # level 0 plans without reuse; the reuse curve still comes from the planner
    fig0 = views.plot_memory_occupancy(small[0])
    rep0 = small[0].report()
    assert fig0.pypto_data["peak_bytes"] == rep0.peak_memory_bytes == rep0.memory.peak_bytes_no_reuse
    assert fig0.pypto_data["reuse"] is not None


def test_buffer_occupancy_per_kernel_is_peak_over_capacity(resnet):
    rep = resnet.report()
    chip = get_chip(rep.chip)
    fig = views.plot_buffer_occupancy(rep)
    data = fig.pypto_data
    img = fig.axes[0].images[0].get_array()
    assert img.shape == (len([k for k in rep.kernels if k.reports]), len(data["buffers"]))
    k = next(k for k in rep.kernels if k.unit == "cube")
    row = data["kernels"].index(k.name)
    j = data["buffers"].index("L0A")
    assert img[row, j] == pytest.approx(k.reports[0].buffer_peak["L0A"] / chip.buffer("L0A").size_bytes)
    one = views.plot_buffer_occupancy(k.reports[0])
    assert len(one.axes[0].patches) == len(one.pypto_data)


def test_model_swimlane_offsets_kernels_by_their_schedule_start(resnet):
    rep = resnet.report()
    fig = views.plot_model_swimlane(resnet, start_kernel=1, count=3, cores=(0, 1))
    data = fig.pypto_data
    clock = get_chip(rep.chip).clock_mhz
    sched = rep.schedule.kernels
    assert data["kernels"] == [k.name for k in rep.kernels[1:4]]
    for i, start in zip(range(1, 4), data["starts_cycles"]):
        assert start == pytest.approx((sched[i].start_us - sched[1].start_us) * clock)
    expected = sum(int(np.isin(r.instructions.core, (0, 1)).sum()) for k in rep.kernels[1:4] for r in k.reports)
    assert data["instructions"] == expected
    assert sum(len(c.get_paths()) for c in fig.axes[0].collections) == expected
    assert "AI Core 1 CUBE" in [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_model_swimlane_numbers_910b_cores_chip_wide():
    import torch
    import torch.nn as nn

    from pypto_lab import optimize

    om = optimize(nn.Sequential(nn.Linear(256, 256), nn.Softmax(-1)), torch.randn(64, 256), chip="Ascend910B1",
                  level=1)
    rep = om.report()
    chip = get_chip("Ascend910B1")
    fig = views.plot_model_swimlane(om, count=2, cores=(0, chip.cube_cores))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "AIC 0 CUBE" in labels and "AIV 0 VECTOR" in labels
    # the softmax (a Vector kernel on AIV 0..) is drawn on the AIV lane, not on AIC 0
    vec = next(k for k in rep.kernels if k.unit == "vector")
    assert fig.pypto_data["instructions"] >= int((vec.reports[0].instructions.core == 0).sum())


def test_speedup_waterfall_starts_at_level_0(small, resnet):
    lvl0 = small[0].report()
    for om in (small[1], small[3]):
        rep = om.report()
        fig = views.plot_speedup_waterfall(rep, level0=small[0])
        ax = fig.axes[0]
        assert len(ax.patches) == 1 + len(rep.passes)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["level 0"] + [p.name for p in rep.passes]
        assert ax.patches[0].get_height() == pytest.approx(lvl0.latency_us)
        # the title's ratio is the level table's: level-0 latency / this level's
        ratio = float(re.search(r"\(x([\d.]+)\)", ax.get_title()).group(1))
        assert ratio == pytest.approx(lvl0.latency_us / rep.latency_us, abs=0.005)
        assert f"{lvl0.latency_us:,.1f} -> {rep.latency_us:,.1f} us" in ax.get_title()
        last = ax.patches[-1]
        assert min(last.get_y(), last.get_y() + last.get_height()) <= rep.passes[-1].latency_us + 1e-9
    # given the OptimizedModel alone, level 0 is worked out from the inputs it was captured with
    fig = views.plot_speedup_waterfall(small[3])
    assert fig.pypto_data["latency_us"][0] == pytest.approx(lvl0.latency_us)
    # a level-0 report is its own start: its passes from map_ops on
    fig0 = views.plot_speedup_waterfall(lvl0)
    assert fig0.pypto_data["passes"] == [p.name for p in lvl0.passes]
    rep = resnet.report()
    with pytest.raises(ValueError, match="needs its level-0 start"):
        views.plot_speedup_waterfall(rep)                       # a bare Report cannot be optimised again
    with pytest.raises(ValueError, match="must be a level-0 report"):
        views.plot_speedup_waterfall(small[3], level0=small[1])
    with pytest.raises(ValueError, match="not the same run"):
        views.plot_speedup_waterfall(rep, level0=small[0])


def test_level_comparison_shows_every_level(small):
    reports = [small[lvl].report() for lvl in range(4)]
    fig = views.plot_level_comparison(reports)
    lat_ax = fig.axes[0]
    assert [p.get_height() for p in lat_ax.patches] == pytest.approx([r.latency_us for r in reports])
    assert [p.get_height() for p in fig.axes[1].patches] == [len(r.kernels) for r in reports]
    assert [t.get_text() for t in lat_ax.get_xticklabels()] == ["L0", "L1", "L2", "L3"]


def test_roofline_ceilings_from_chip_and_points_from_reports(resnet):
    rep = resnet.report()
    chip = get_chip(rep.chip)
    fig = views.plot_roofline(rep)
    ax = fig.axes[0]
    data = fig.pypto_data
    assert data["ceilings_tflops"]["Cube fp16"] == chip.peak_tflops("fp16")
    cube_line = next(ln for ln in ax.lines if ln.get_label().startswith("Cube fp16"))
    assert cube_line.get_ydata().max() == pytest.approx(chip.peak_tflops("fp16"))
    reps = [r for k in rep.kernels for r in k.reports if r.flops > 0 and r.gm_bytes > 0]
    pts = sum(len(c.get_offsets()) for c in ax.collections if (c.get_gid() or "").startswith("points-"))
    assert pts == len(reps) == len(data["points"])
    name, x, y = data["points"][0]
    assert x == reps[0].flops / reps[0].gm_bytes and y == reps[0].tflops
    labels = [ln.get_label() for ln in ax.lines]
    assert any(lab.startswith("HBM") for lab in labels) and any(lab.startswith("L2") for lab in labels)
    assert any(lab.startswith("Vector") for lab in labels)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_plot_tiling_red_bar_and_error_text():
    from pypto_lab.hw.tiling import CubeTile, TilingError, cube_tile_bytes

    chip = get_chip("Ascend910B1")
    r = simulate_matmul(256, 512, 256, chip=chip)
    fig = views.plot_tiling(r, chip)
    bars = fig.axes[0].patches
    assert len(bars) == len([b for b in views.TILING_BUFFERS if b in chip.buffers])
    assert f"{r.cycles:,.0f} cycles" in fig.axes[0].get_title()
    tile = CubeTile(256, 256, 512, 512, 64, 64)
    with pytest.raises(TilingError) as err:
        simulate_matmul(256, 512, 256, chip=chip, tile=tile)
    fig = views.plot_tiling(err.value, chip, requested=cube_tile_bytes(tile, "fp16", chip))
    colours = {lab.get_text(): p.get_facecolor() for lab, p in zip(fig.axes[0].get_yticklabels(), fig.axes[0].patches)}
    assert colours["L0A"][:3] != colours["L0C"][:3]
    assert any("does not fit L0A" in t.get_text() for t in fig.axes[1].texts)


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_fusion_graph_opens_on_the_first_repeated_block(resnet, small):
    assert views.repeated_blocks(resnet.graph)[:4] == ["layer1.0", "layer1.1", "layer1.2", "layer2.0"]
    assert views.default_block(resnet.graph) == "layer1.0"
    fig = views.plot_fusion_graph(resnet)
    assert fig.pypto_block == "layer1.0" and "block layer1.0" in fig._suptitle.get_text()
    whole = views.plot_fusion_graph(resnet, block=None)
    assert whole.pypto_block is None and "whole model" in whole._suptitle.get_text()
    assert len(whole.pypto_data[0]["nodes"]) > len(fig.pypto_data[0]["nodes"])
    assert views.default_block(small[1].graph) is None          # a small model is drawn whole


def test_fusion_graph_titles_never_overlap_the_plots(resnet):
    for fig in (views.plot_fusion_graph(resnet, before=resnet), views.plot_fusion_graph(resnet, block=None)):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        sup = fig._suptitle.get_window_extent(renderer)
        for ax in fig.axes:
            assert not _boxes_overlap(sup, ax.get_window_extent(renderer))
            assert not _boxes_overlap(sup, ax.title.get_window_extent(renderer))
            assert not _boxes_overlap(ax.title.get_window_extent(renderer), ax.get_window_extent(renderer))


def test_model_swimlane_kernel_labels_do_not_overlap(resnet):
    rep = resnet.report()
    fig = views.plot_model_swimlane(resnet, start_kernel=0, count=12)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_gid() == "kernel-label"]
    assert len(labels) == len(fig.pypto_data["labels"]) >= 6
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not _boxes_overlap(a, b)
        assert not _boxes_overlap(a, ax.title.get_window_extent(renderer))
    # each label starts with its kernel's index in the report, at the kernel's start
    for t in labels:
        index = int(t.get_text().split()[0])
        assert rep.kernels[index].name in fig.pypto_data["kernels"]
        assert t.get_position()[0] == pytest.approx(fig.pypto_data["starts_cycles"][index])
    hidden = len(fig.pypto_data["kernels"]) - len(labels)
    assert (f"{hidden} labels left out" in ax.get_title()) == bool(hidden)
