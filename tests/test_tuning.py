"""pypto_lab.tuning.auto_tune: screened tiling space, simulator-verified, cached."""

import json

import numpy as np
import pytest
import torch

import pypto_lab
from pypto_lab.hw.chip import PRESET_DIR, get_chip
from pypto_lab.hw.tiling import CubeTile, plan_cube
from pypto_lab.lowering.costing import cost_kernels
from pypto_lab.tools.tuning import TuneError, auto_tune, screen_space


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 768)
        self.down = torch.nn.Linear(768, 256)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _optimized(chip="Ascend910B1"):
    torch.manual_seed(0)
    return pypto_lab.optimize(_MLP().eval(), torch.randn(512, 256), chip=chip, level=1)


@pytest.mark.parametrize("chip", ["Ascend910A", "Ascend910B1"])
def test_screened_space_is_legal(chip):
    scr = screen_space(chip, 1000, 576, 200, "fp16", epilogue="bias")
    assert scr.count > 1000 and np.isfinite(scr.costs).all() and (scr.costs > 0).all()
    c = get_chip(chip)
    rng = np.random.default_rng(0)
    for i in rng.choice(scr.count, 200, replace=False):
        plan_cube(c, scr.tile(int(i)), "fp16", 1000, 576, 200, True, "bias")  # raises if illegal
    small = screen_space(chip, 1000, 576, 200, "fp16", full=False)
    assert 0 < small.count < scr.count


def test_auto_tune_never_slower_and_applies_tiles(tmp_path):
    om = _optimized()
    before = {k.name: k.time_us for k in om.report().kernels}
    latency = om.report().latency_us
    result = auto_tune(om, {"level": "fast", "seed": 0, "progress": False}, cache_path=tmp_path / "t.json")
    assert result.rows and result.simulations > 0 and result.candidates > 0
    for row in result.rows:
        assert row.tuned_us <= row.default_us
        assert row.gain_pct >= 0
    assert om.report() is result.report
    assert om.report().latency_us <= latency + 1e-9
    after = {k.name: k.time_us for k in om.report().kernels}
    assert all(after[n] <= before[n] + 1e-9 for n in before)
    tiled = [r for r in result.rows if r.tile is not None]
    for row in tiled:
        anchor = next(n for n in om.graph.nodes if getattr(n.kernel, "tile", None) == row.tile)
        assert isinstance(anchor.kernel.tile, CubeTile)
    assert "auto_tune" in result.table() and om.report().passes[-1].name == "auto_tune"


def test_second_run_hits_the_cache(tmp_path):
    path = tmp_path / "tuning.json"
    first = auto_tune(_optimized(), {"level": "fast", "progress": False}, cache_path=path)
    data = json.loads(path.read_text())
    fingerprint = get_chip("Ascend910B1").fingerprint  # the chip's name and its numbers key the cache
    assert data["version"] == 1 and any(k.startswith(f"Ascend910B1@{fingerprint}|b1|512x256x768|fp16|")
                                        for k in data["entries"])
    second = auto_tune(_optimized(), {"level": "fast", "progress": False}, cache_path=path)
    assert second.simulations == 0 and all(r.cached for r in second.rows)
    assert [r.tile for r in second.rows] == [r.tile for r in first.rows]
    assert second.report.latency_us == pytest.approx(first.report.latency_us)


def test_same_seed_same_result():
    cfg = {"level": "normal", "num_trials": 6, "seed": 3, "progress": False}
    a = auto_tune(_optimized("Ascend910A"), cfg, cache_path=False)
    b = auto_tune(_optimized("Ascend910A"), cfg, cache_path=False)
    assert [(r.tile, r.tuned_us, r.trials) for r in a.rows] == [(r.tile, r.tuned_us, r.trials) for r in b.rows]
    assert all(r.trials <= 6 for r in a.rows)


@pytest.mark.parametrize("cfg, match", [
    ({"level": "ultra"}, "level = 'ultra' is not known; choose one of fast, normal, exhaustive"),
    ({"num_trials": 0}, "num_trials = 0: must be a positive integer"),
    ({"trials": 5}, "unknown tune_config key"),
    ("fast", "must be a dict"),
])
def test_bad_config(cfg, match):
    with pytest.raises(TuneError, match=match):
        auto_tune(_optimized(), cfg, cache_path=False)


def test_needs_an_optimized_model():
    with pytest.raises(TuneError, match="needs the result of pypto_lab.optimize"):
        auto_tune("resnet50", cache_path=False)
    with pytest.raises(TuneError, match="_MLP itself, and it has not been optimised"):
        auto_tune(_MLP(), cache_path=False)


def test_unreadable_cache_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TuneError, match="bad.json is not readable JSON"):
        auto_tune(_optimized(), {"level": "fast", "progress": False}, cache_path=bad)


def _preset_copy(tmp_path, name: str, clock_mhz: float):
    """A user's copy of the 910B1 preset under another file name, with its name and clock changed."""
    text = (PRESET_DIR / "Ascend910B1.toml").read_text()
    text = text.replace('name = { value = "Ascend910B1"', f'name = {{ value = "{name}"')
    text = text.replace("clock_mhz = { value = 1850.0", f"clock_mhz = {{ value = {clock_mhz}")
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["Ascend910B1", "MyNPU"])
def test_a_users_own_preset_survives_auto_tune_and_the_profiler(tmp_path, name):
    """The chip is resolved once by optimize: auto_tune and the profiler cost on the user's preset
    (a copy with half the clock, same name or renamed), never on the shipped one."""
    path = _preset_copy(tmp_path, name, 925.0)
    free = pypto_lab.get_stack("atc-om").with_values(launch_us=0.0)   # the chip's time alone
    om = pypto_lab.optimize(_MLP(), torch.randn(512, 256), chip=str(path), level=1, stack=free)
    slow = om.report()
    assert slow.chip.clock_mhz == 925.0 and slow.chip.name == name
    shipped = pypto_lab.optimize(_MLP(), torch.randn(512, 256), chip="Ascend910B1", level=1, stack=free).report()
    assert slow.latency_us > 1.5 * shipped.latency_us                 # half the clock: slower
    result = auto_tune(om, {"level": "fast", "progress": False}, cache_path=False)
    assert result.report.chip is slow.chip and result.report.latency_us <= slow.latency_us + 1e-9
    on_mine = sum(k.time_us for k in cost_kernels(om.graph, slow.chip))          # the tuned graph, recosted
    on_shipped = sum(k.time_us for k in cost_kernels(om.graph, get_chip("Ascend910B1")))
    # half the clock, but the preset's L2 and HBM rates are in GB/s and stay: the tuned kernels that wait
    # on L2 slow down by less than the Cube
    assert result.report.latency_us == pytest.approx(on_mine) and on_mine > 1.3 * on_shipped
    assert all(r.tuned_us <= r.default_us for r in result.rows)
    with pypto_lab.profiler.profile() as prof:
        om(torch.randn(512, 256))
    assert prof.key_averages().table()
    prof.export_chrome_trace(tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
