"""Design-space sweeps (pypto_lab.explore): variant chips, the table, the cache, Pareto fronts."""

import dataclasses

import pandas as pd
import pytest
from distributed import Client, LocalCluster

from pypto_lab.explore import sweeps as ex
from pypto_lab.hw.chip import ChipConfigError, get_chip


@pytest.fixture(scope="module")
def client():
    # threads in this process: no worker start-up cost, and a monkeypatched run_point is seen
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c


def test_variant_chip_is_derived_and_validated():
    base = get_chip("Ascend910B1")
    chip = ex.variant_chip("Ascend910B1", l1_kb=1024, hbm_gbps=3200)
    assert chip.name == "Ascend910B1+l1_kb=1024,hbm_gbps=3200"
    assert chip.buffer("L1").size_bytes == 1024 * 1024 and chip.hbm_gbps == 3200.0
    assert chip.cube_cores == base.cube_cores and chip.fingerprint != base.fingerprint
    assert ex.variant_chip("Ascend910B1").fingerprint == base.fingerprint
    assert ex.variant_chip(base, l2_mb=96).l2_bytes == 96 * 2**20


@pytest.mark.parametrize("values, rule", [
    ({"l1_kb": 0}, "'buffers.L1.size_bytes' = 0: impossible value: must be > 0"),
    ({"l1_kb": -64}, "'buffers.L1.size_bytes' = -65536: impossible value: must be > 0"),
    ({"cube_cores": 2.5}, "'chip.cube_cores' = 2.5: must be an integer"),
    ({"hbm_gbps": 0}, "'chip.hbm_gbps' = 0.0: impossible value: must be > 0"),
])
def test_impossible_variant_gets_the_preset_error(values, rule):
    with pytest.raises(ChipConfigError, match="derived from .*Ascend910B1.toml") as info:
        ex.variant_chip("Ascend910B1", **values)
    assert rule in str(info.value) and "fix:" in str(info.value)


def test_bad_arguments_name_the_rule_and_a_fix(tmp_path):
    with pytest.raises(ex.SweepError, match=r"variant key 'l3_kb' is not known.*valid keys: l1_kb, "):
        ex.variant_chip("Ascend910B1", l3_kb=4096)
    with pytest.raises(ex.SweepError, match=r"variant l1_kb = 'big': must be a number"):
        ex.design_points("mlp", "Ascend910B1", {"l1_kb": ["big"]})
    with pytest.raises(ex.SweepError, match=r"variant hbm_gbps = \[\]: needs at least one value"):
        ex.design_points("mlp", "Ascend910B1", {"hbm_gbps": []})
    with pytest.raises(ex.SweepError, match=r"batch 0: must be a positive integer; fix"):
        ex.design_points("mlp", "Ascend910B1", batch=[1, 0])
    with pytest.raises(ex.SweepError, match=r"level 7 is not known; fix"):
        ex.design_points("mlp", "Ascend910B1", level=7)
    with pytest.raises(ex.SweepError, match=r"model 'resnet9' is not known; fix: use one of mlp, "):
        ex.design_points("resnet9", "Ascend910B1")
    with pytest.raises(ex.SweepError, match=r"chip 'Ascend999' is not known; fix"):
        ex.design_points("mlp", "Ascend999")
    edited = dataclasses.replace(get_chip("Ascend910B1"), hbm_gbps=1.0)
    with pytest.raises(ex.SweepError, match="differs from its preset file"):
        ex.design_points("mlp", edited)
    with pytest.raises(ex.SweepError, match="both client= and scheduler= given"):
        ex.sweep("mlp", "Ascend910B1", client=object(), scheduler="tcp://x:8786", cache_dir=tmp_path)
    with pytest.raises(ex.SweepError, match=r"scheduler = 'localhost': must be a scheduler address"):
        ex.sweep("mlp", "Ascend910B1", scheduler="localhost", cache_dir=tmp_path)


def test_one_row_per_point_with_the_variant_columns(client, tmp_path):
    df = ex.sweep(["mlp"], ["Ascend910B1"], variants={"hbm_gbps": [800, 3200], "l1_kb": [256, 512]},
                  batch=[1, 4], client=client, cache_dir=tmp_path, progress=False)
    assert len(df) == 2 * 2 * 2
    for col in ("model", "chip", "hbm_gbps", "l1_kb", "batch", "level", "precision", "latency_us",
                "throughput_per_s", "energy_mj", "peak_memory_bytes", "area_mm2", "bound"):
        assert col in df.columns
    assert set(zip(df.hbm_gbps, df.l1_kb, df.batch)) == {(h, kb, b) for h in (800, 3200) for kb in (256, 512)
                                                         for b in (1, 4)}
    assert (df.latency_us > 0).all() and not df.from_cache.any()
    assert df.chip.iloc[0] == "Ascend910B1+hbm_gbps=800,l1_kb=256"
    # the mlp streams its weights: more HBM bandwidth never slows it, and it is memory bound
    for _, group in df.groupby(["l1_kb", "batch"]):
        lat = group.sort_values("hbm_gbps").latency_us.tolist()
        assert lat[1] <= lat[0]
    assert (df.bound == "memory").all()
    # a bigger L1 costs area
    a = df.groupby("l1_kb").area_mm2.first()
    assert a[512] > a[256]


def test_more_hbm_bandwidth_never_slows_a_memory_bound_model(client, tmp_path):
    df = ex.sweep("mlp", "Ascend910B2", variants={"hbm_gbps": [400, 800, 1600, 3200, 6400]}, client=client,
                  cache_dir=tmp_path, progress=False)
    lat = df.sort_values("hbm_gbps").latency_us.tolist()
    assert all(b <= a for a, b in zip(lat, lat[1:])) and lat[-1] < lat[0]


def test_cache_hit_does_not_recompute(client, tmp_path, monkeypatch):
    # run_point reaches the workers by reference (tasks are pickled even in-process), and every
    # point it simulates builds (or takes from the worker's memo) its model through _build_model
    calls = []
    real = ex._build_model

    def counting(spec, batch):
        calls.append(spec.name)
        return real(spec, batch)

    monkeypatch.setattr(ex, "_build_model", counting)
    kw = dict(variants={"clock_mhz": [1000, 1850]}, client=client, cache_dir=tmp_path, progress=False)
    first = ex.sweep("mlp", "Ascend910B1", **kw)
    assert len(calls) == 2 and not first.from_cache.any()
    second = ex.sweep("mlp", "Ascend910B1", **kw)
    assert len(calls) == 2 and second.from_cache.all()
    pd.testing.assert_series_equal(first.latency_us, second.latency_us)
    # a new point computes only itself; cache=False computes everything
    ex.sweep("mlp", "Ascend910B1", **{**kw, "variants": {"clock_mhz": [1000, 1850, 2000]}})
    assert len(calls) == 3
    ex.sweep("mlp", "Ascend910B1", **{**kw, "cache": False})
    assert len(calls) == 5


def test_pareto_on_a_small_table():
    df = pd.DataFrame({"name": list("abcdef"), "area": [1, 2, 3, 2, 4, 1], "lat": [10, 5, 5, 7, 1, 10],
                       "m": ["x", "x", "x", "y", "y", "y"]})
    front = ex.pareto(df, "area", "lat")
    assert front.name.tolist() == ["a", "b", "e"]          # c ties b's latency at more area; d, f dominated
    assert ex.pareto(df, "area", "lat", by="m").name.tolist() == ["a", "b", "f", "d", "e"]
    assert ex.pareto(df, "area", "lat", maximize=["lat"]).name.tolist() == ["a"]   # smallest and slowest
    best = ex.pareto(df.assign(tput=1 / df.lat), "area", "tput", maximize=["tput"])
    assert best.name.tolist() == ["a", "b", "e"]
    with pytest.raises(ex.SweepError, match="column 'latency' is not in the table; fix: use one of name, area"):
        ex.pareto(df, "area", "latency")


def test_ai_cores_keeps_the_presets_vector_core_ratio():
    chip = ex.variant_chip("Ascend910B1", ai_cores=12)
    assert (chip.cube_cores, chip.vector_cores) == (12, 24) and chip.name == "Ascend910B1+ai_cores=12"
    assert ex.variant_chip("Ascend910B1", cube_cores=12).vector_cores == 48
    with pytest.raises(ex.SweepError, match="ai_cores and cube_cores / vector_cores both given"):
        ex.variant_chip("Ascend910B1", ai_cores=12, cube_cores=12)
