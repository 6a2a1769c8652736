"""The widgets: set their controls, assert the new state (labels, bars, figure) from the simulator."""

import base64
import io
import re

import ipywidgets as W
import pytest
import torch
from PIL import Image

import pypto_lab
from pypto_lab import simulate_matmul, simulate_vector
from pypto_lab.hw.chip import get_chip
from pypto_lab.hw.tiling import CubeTile, TilingError, VecTile, cube_tile_bytes, plan_cube
from pypto_lab.viz import widgets
from pypto_lab.viz.widgets import dashboard, explorer_for_kernel, tiling_explorer, vector_tiling_explorer

SHAPE = (196, 2304, 256)  # ResNet-50 layer3 conv2 at batch 1 as implicit GEMM
ORDER = ("m", "k", "n")


def cycles_of(w) -> float:
    return float(re.search(r"cycles: (\d+)", w.cycles_text).group(1))


@pytest.fixture
def w():
    return tiling_explorer(*SHAPE, chip="Ascend910A")


def test_handles_are_stable_and_findable(w):
    assert list(w.sliders) == ["m_l0", "m_l1", "k_l0", "k_l1", "n_l0", "n_l1"]
    for name, s in w.sliders.items():
        assert isinstance(s, W.IntSlider) and s.description == name and f"pypto-{name}" in s._dom_classes
    assert isinstance(w.double_buffer, W.Checkbox) and "pypto-double_buffer" in w.double_buffer._dom_classes
    assert "pypto-cycles" in w.cycles_label._dom_classes and "pypto-error" in w.error_label._dom_classes
    assert "pypto-occupancy" in w.occupancy_label._dom_classes and "pypto-figure" in w.image._dom_classes
    assert isinstance(w.widget, W.VBox) and w.image.value[:4] == b"\x89PNG"


def test_cycles_are_the_simulators_and_change_with_m_l1(w):
    r = simulate_matmul(*SHAPE, chip="Ascend910A", tile=w.tile)
    assert cycles_of(w) == round(r.cycles)
    assert f"cube: {100 * r.cube_utilization:.1f}%" in w.utilization_text
    before, png = cycles_of(w), w.image.value
    w.set(m_l0=32)
    w.sliders["m_l1"].value = 32 if w.sliders["m_l1"].value != 32 else 64
    assert w.report is not None
    after = cycles_of(w)
    assert after != before
    assert after == round(simulate_matmul(*SHAPE, chip="Ascend910A", tile=w.tile).cycles)
    assert w.image.value != png
    assert any(p.get_visible() and len(p.get_path().vertices) > 5 for p in w._lanes)   # the swimlane was redrawn


def test_labels_read_as_plain_text(w, capsys):
    print(w.cycles_label.value)
    printed = capsys.readouterr().out
    assert re.match(r"cycles: \d+ \(", printed) and "<" not in printed
    assert w.cycles_text == w.cycles_label.value
    assert re.fullmatch(r"cube: [\d.]+%, vector: [\d.]+%", w.utilization_text)
    assert "<" not in w.text and w.cycles_text in w.text and w.occupancy_text in w.text
    assert str(w.tile) in w.text


def test_occupancy_label_has_each_buffer_percentage(w):
    r = w.report
    for buf in ("L1", "L0A", "L0B", "L0C", "UB"):
        cap = w.chip.buffer(buf).size_bytes
        assert f"{buf}: {100 * r.buffer_peak.get(buf, 0) / cap:.1f}%" in w.occupancy_label.value
        assert f"{buf}: " in w.occupancy_text


# ---- the sliders offer only well-formed tilings ---------------------------------------------------

def _well_formed(tile: CubeTile, align: int) -> bool:
    d = tile.to_dict()
    return (all(v % align == 0 for v in d.values())
            and all(d[f"{x}_l1"] % d[f"{x}_l0"] == 0 for x in ORDER))


def _step(w, name: str, direction: int) -> int:
    """What a key press on a slider does in the browser: one step within min..max."""
    s = w.sliders[name]
    new = min(max(s.value + direction * s.step, s.min), s.max)
    s.value = new
    return new


def _check_overflows_are_all_reported(w):
    """Every buffer the tiling overflows is listed with a fix, and no other."""
    chip = w.chip
    need = cube_tile_bytes(w.tile, w.dtype, chip)
    if not chip.split_cores:  # the 910A's Cube output passes UB: two m_l0 x n_l0 fp32 slots
        need["UB"] = 2 * w.tile.m_l0 * w.tile.n_l0 * 4
    over = {b for b, v in need.items() if v > chip.buffer(b).size_bytes}
    assert set(w.over) == over, (w.tile, w.over, over)
    lines = w.error_text.splitlines()
    for b in over:
        line = next(ln for ln in lines if ln.startswith(f"{b} "))
        assert "%" in line and "try " in line, line
    try:
        plan_cube(chip, w.tile, w.dtype, w.m, w.k, w.n)
    except TilingError as err:
        assert "does not fit" in str(err), err                 # capacity, never alignment or multiples
        assert w.report is None and w.cycles_text.startswith("cycles: n/a")
        assert over - {"UB"}
    else:
        assert w.report is not None and not (over - {"UB"})


@pytest.mark.parametrize("chip", ["Ascend910B1", "Ascend910A"])
def test_every_single_step_from_the_default_tiling_is_well_formed(chip):
    w = tiling_explorer(2048, 2048, 2048, chip=chip)
    default = w.tile.to_dict()
    moved = 0
    for name in w.sliders:
        for direction in (+1, -1):
            w.set(**default)
            old = w.sliders[name].value
            new = _step(w, name, direction)
            tile = w.tile
            assert _well_formed(tile, w.align), (name, direction, tile)
            for s in w.sliders.values():          # every slider still offers min + i * step
                assert s.min <= s.value <= s.max and (s.value - s.min) % s.step == 0 and s.max % s.step == 0
            if new != old:
                moved += 1
                assert tile.to_dict()[name] == new
            else:  # only a slider at the end of its range stays put: a *_l1 equal to its *_l0, going down
                assert direction == -1 and name.endswith("_l1") and old == default[name.replace("_l1", "_l0")]
            _check_overflows_are_all_reported(w)
    assert moved >= 10


def test_moving_an_l0_takes_its_l1_to_the_nearest_multiple():
    w = tiling_explorer(2048, 2048, 2048, chip="Ascend910B1", tile=CubeTile(128, 256, 64, 256, 128, 128))
    w.sliders["m_l0"].value = 144
    assert (w.tile.m_l0, w.tile.m_l1) == (144, 288)           # 256 / 144 = 1.78: two of them
    assert (w.sliders["m_l1"].min, w.sliders["m_l1"].step) == (144, 144)
    _step(w, "m_l1", +1)
    assert w.tile.m_l1 == 432
    w.sliders["k_l0"].value = 16
    assert w.tile.k_l1 == 256 and w.sliders["k_l1"].step == 16


def test_a_value_set_from_code_moves_to_the_nearest_allowed_one(w):
    w.set(m_l0=64, m_l1=128)
    w.sliders["m_l1"].value = 200                               # not a multiple of 64: 192 is nearest
    assert w.tile.m_l1 == 192 and w.sliders["m_l1"].value == 192
    w.sliders["k_l0"].value = 70                                # not 16-aligned: 64 is nearest
    assert w.tile.k_l0 == 64


def test_set_refuses_values_no_slider_offers(w):
    with pytest.raises(TilingError, match=r"m_l1 = 96 .*multiples of m_l0 = 64.*try 64 or 128"):
        w.set(m_l0=64, m_l1=96)
    with pytest.raises(TilingError, match=r"k_l0 = 100 .*multiples of 16.*try 96 or 112"):
        w.set(k_l0=100)
    with pytest.raises(ValueError, match="no control named q_l0"):
        w.set(q_l0=16)
    with pytest.raises(TilingError, match="whole numbers"):
        w.set(m_l0=64.5)
    with pytest.raises(TilingError, match="not well-formed"):
        tiling_explorer(*SHAPE, chip="Ascend910A", tile=CubeTile(64, 96, 64, 256, 64, 64))


# ---- overflows: every buffer at once, each with a fix ---------------------------------------------

def test_every_overflowing_buffer_is_reported_with_a_fix_that_works():
    w = tiling_explorer(2048, 2048, 2048, chip="Ascend910B1")
    w.set(m_l0=512, m_l1=512, k_l0=256, k_l1=1024, n_l0=128, n_l1=128)
    assert w.report is None and w.error is not None
    assert set(w.over) == {"L1", "L0A", "L0C"}                   # plan_cube names only the first of them
    assert "cycles: n/a" in w.cycles_text and all(b in w.cycles_text for b in ("L1", "L0A", "L0C"))
    by_buffer = {o.buffer: o for o in w.overflows}
    assert by_buffer["L0A"].fraction == pytest.approx(4.0)   # 512 x 256 x 2 B = 256 KB of 64 KB
    assert str(by_buffer["L0A"]).startswith("L0A 400 % (256 of 64 KB): try ")
    for b in ("L1", "L0A", "L0C"):
        assert f"pypto-overflow-{b}" in w.error_label.value and str(by_buffer[b]) in w.error_text
    assert "pypto-over" in w.occupancy_label.value and "#c44e52" in w.occupancy_label.value
    ax = w.figure.axes[0]
    bar = ax.patches[[t.get_text() for t in ax.get_yticklabels()].index("L0A")]
    assert bar.get_facecolor()[:3] == pytest.approx((0xC4 / 255, 0x4E / 255, 0x52 / 255))
    # the swimlane area shows the placeholder with every overflow, not nothing
    assert w._placeholder.get_visible() and all(str(by_buffer[b]) in w._placeholder_text.get_text()
                                                for b in ("L1", "L0A", "L0C"))
    # each suggested value alone fixes its buffer
    for o in w.overflows:
        name, value = re.search(r"try (\w+) = (\d+)", o.fix).groups()
        tile = CubeTile(**w._legal({**w.values, name: int(value)}))
        assert cube_tile_bytes(tile, "fp16", w.chip)[o.buffer] <= o.capacity, (o, tile)
    # back to a legal tiling: the overflow report clears
    w.set(m_l0=128, m_l1=128, k_l0=64, k_l1=256)
    assert w.report is not None and not w.over and w.error_label.value == "" and cycles_of(w) > 0
    assert not w._placeholder.get_visible()


def test_the_figure_keeps_its_size_and_is_sharp():
    w = tiling_explorer(2048, 2048, 2048, chip="Ascend910B1")
    legal = Image.open(io.BytesIO(w.image.value))
    w.set(m_l0=1024)
    refused = Image.open(io.BytesIO(w.image.value))
    assert w.report is None and legal.size == refused.size
    assert w.figure.dpi >= 100
    # two device pixels per CSS pixel at the width the page shows it
    assert legal.size[0] >= 1.5 * widgets.DISPLAY_WIDTH_PX and w.image.layout.width == f"{widgets.DISPLAY_WIDTH_PX}px"


def test_ub_of_the_cube_epilogue_matches_the_simulator(w):
    """The explorer's UB bytes for a Cube kernel (910A: the output passes UB) are the simulator's."""
    assert w._slot_bytes(w.tile)["UB"] == w.report.buffer_peak["UB"]


def test_double_buffer_toggle_changes_cycles(w):
    w.set(m_l0=64, m_l1=64, k_l0=64, k_l1=256)
    on = cycles_of(w)
    w.double_buffer.value = False
    off = cycles_of(w)
    assert off > on
    assert off == round(simulate_matmul(*SHAPE, chip="Ascend910A", tile=w.tile, double_buffer=False).cycles)


def test_each_update_records_its_own_time(w):
    # speed itself is measured in benchmarks/bench_widgets.py; here: the readout the benchmark uses exists
    seen = []
    for v in (64, 128):
        w.sliders["n_l1"].value = v
        seen.append(w.last_update_ms)
    assert all(isinstance(t, float) and t > 0 for t in seen)


# ---- saved notebooks show a picture -----------------------------------------------------------------

def _png_of(bundle) -> Image.Image:
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    png = base64.b64decode(data["image/png"])
    assert png[:4] == b"\x89PNG"
    return Image.open(io.BytesIO(png))


def test_mimebundle_holds_the_widget_a_png_and_text(w):
    from IPython.core.formatters import DisplayFormatter

    data, meta = DisplayFormatter().format(w)                  # what a notebook stores for `w`
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == w.widget.model_id
    img = _png_of(data)                                         # one pixel per CSS pixel: small files
    assert img.size == (widgets.DISPLAY_WIDTH_PX, round(widgets.FIG_SIZE[1] * widgets.STATIC_DPI))
    assert data["text/plain"] == w.text and "VBox" not in data["text/plain"]
    assert meta["image/png"]["width"] == widgets.DISPLAY_WIDTH_PX
    live = Image.open(io.BytesIO(w.image.value)).size
    w.sliders["n_l1"].value = w.sliders["n_l1"].value + w.sliders["n_l1"].step   # the live view still renders
    assert Image.open(io.BytesIO(w.image.value)).size == live and w.figure.dpi == widgets.EXPLORER_DPI


def test_vector_explorer_rows_cols_and_ub_overflow():
    v = vector_tiling_explorer("softmax", 64 * 1024, 1024, chip="Ascend910B1")
    assert list(v.sliders) == ["rows", "cols"] and list(v.occupancy) == ["UB"]
    assert v.sliders["cols"].min == 1024 and v.sliders["cols"].step == 16   # a row-wise op needs the whole row
    r = simulate_vector("softmax", 64 * 1024, chip="Ascend910B1", row_len=1024, tile=v.tile)
    assert cycles_of(v) == round(r.cycles)
    before = cycles_of(v)
    v.sliders["rows"].value = 2
    assert cycles_of(v) != before
    assert v.tile == VecTile(2, 1024)
    v.sliders["rows"].value = 64
    assert v.over == ["UB"] and v.report is None
    (o,) = v.overflows
    assert str(o).startswith("UB ") and "try rows = " in o.fix and "UB" in v.cycles_text
    fit = int(re.search(r"rows = (\d+)", o.fix).group(1))
    v.sliders["rows"].value = fit
    assert not v.over and v.report is not None
    with pytest.raises(TilingError, match="at least the row of 1024"):
        v.set(rows=4, cols=512)
    with pytest.raises(ValueError, match="numel = 0: it must be a positive whole number"):
        vector_tiling_explorer("softmax", 0)
    for direction in (+1, -1):                                   # every step of cols stays aligned
        v.set(rows=1, cols=1024)
        _step(v, "cols", direction)
        assert v.tile.cols % 16 == 0 and v.tile.cols >= 1024


def test_explorer_for_a_model_kernel_and_dashboard():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    om = pypto_lab.optimize(model, torch.randn(8, 64), chip="Ascend910B1", level=3)
    k = next(k for k in om.report().kernels if k.unit == "cube")
    assert k.reports[0].epilogue.activation == "gelu"        # the GELU rides the matmul's epilogue
    e = explorer_for_kernel(k)                               # and the explorer simulates it too
    assert e.tile == CubeTile(**k.reports[0].tile) and cycles_of(e) == round(k.reports[0].cycles)
    d = dashboard(om)
    assert isinstance(d.tab, W.Tab) and len(d.tab.children) == len(d.TITLES)
    for i in range(len(d.TITLES)):
        d.tab.selected_index = i
    assert d.rendered == set(range(len(d.TITLES)))
    assert d.explorer is not None and d.explorer.report is not None
    # the waterfall starts at level 0 (worked out from the model's own inputs)
    lvl0 = pypto_lab.optimize(model, torch.randn(8, 64), chip="Ascend910B1", level=0).report()
    assert d.figures["waterfall"].pypto_data["latency_us"][0] == pytest.approx(lvl0.latency_us)
    data, _ = d._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data and _png_of(data).size[0] > 300
    assert data["text/plain"].startswith("dashboard of ")


def test_dashboard_opens_on_the_first_repeated_block():
    import torchvision

    om = pypto_lab.optimize(torchvision.models.resnet50().eval(), torch.randn(1, 3, 64, 64), chip="Ascend910B1",
                            level=1)
    d = dashboard(om)
    choice = d.pages[0].children[0]
    assert choice.value == "layer1.0" and "whole model" in choice._options_labels
    assert d.figures["fusion graph"].pypto_block == "layer1.0"
    choice.value = ""
    assert d.figures["fusion graph"].pypto_block is None
    assert get_chip("Ascend910B1").name in d.text


def test_every_new_state_is_a_new_image_with_what_it_shows():
    """The browser shows a new picture only when the image's bytes change; the live figure draws
    the swimlane on a relative axis and the overflow placeholder with one fixed line, so two states
    may draw alike: the PNG carries what it shows (its Description), and each new state is new bytes."""
    w = tiling_explorer(2048, 2048, 2048, chip="Ascend910B1")
    seen = [w.image.value]
    for values in (dict(m_l0=1024), dict(m_l0=512), dict(m_l0=256, m_l1=256), dict(double_buffer=False)):
        w.set(**values)
        assert w.image.value != seen[-1], values
        seen.append(w.image.value)
        shown = Image.open(io.BytesIO(w.image.value)).info["Description"]
        assert str(w.tile) in shown and w.cycles_text in shown
