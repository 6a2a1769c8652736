"""pypto_lab.deploy.pipeline: what a user deploying with AscendCL-style streams relies on."""

import json
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import pypto_lab
from pypto_lab.deploy import PipelineError, pipeline, plot_throughput_latency, plot_timeline, sweep
from pypto_lab.hw.chip import get_chip
from pypto_lab.train.data import NPUDataLoader, link_copy_ms

CHIP = get_chip("Ascend910B1")


def _om(latency_us: float, batch: int = 4, in_bytes: int = 4 * 3 * 224 * 224 * 4, out_bytes: int = 4 * 4000):
    """An object whose .report() returns a report-like object (as an OM loaded later would)."""
    rep = SimpleNamespace(model="fake", chip=CHIP, level=3, precision="fp16", batch=batch, latency_us=latency_us)
    return SimpleNamespace(report=lambda: rep), in_bytes // batch, out_bytes // batch


def _run(om, **kw):
    obj, ib, ob = om
    kw.setdefault("preprocess_ms", 0.0)
    return pipeline(obj, input_bytes=ib, output_bytes=ob, **{"batch": 4, **kw})


@pytest.fixture(scope="module")
def tiny():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 10)).eval()
    return pypto_lab.optimize(m, (torch.randn(2, 3, 32, 32),), chip="Ascend910B1", level=3, precision="fp16")


# ---- throughput and latency -----------------------------------------------------------------

def test_streams_raise_throughput_when_copies_matter():
    om = _om(latency_us=100.0)  # H2D of 2.4 MB is ~76 us: as long as compute
    sync = _run(om, streams=1, mode="sync")
    for n in (2, 3, 4):
        res = _run(om, streams=n)
        assert res.throughput_per_s > 1.3 * sync.throughput_per_s
    # the AI cores are the bottleneck with overlap: throughput approaches batch / compute
    assert _run(om, streams=4, requests=200).throughput_per_s == pytest.approx(4 / 100e-6, rel=0.03)


def test_streams_raise_throughput_when_preprocessing_matters():
    om = _om(latency_us=1.0, in_bytes=1000, out_bytes=100)
    sync = _run(om, streams=1, mode="sync", preprocess_ms=0.5)
    one = _run(om, streams=1, preprocess_ms=0.5)
    two = _run(om, streams=2, preprocess_ms=0.5)
    assert one.throughput_per_s >= sync.throughput_per_s
    assert two.throughput_per_s > 1.8 * sync.throughput_per_s  # a host thread per stream


def test_streams_never_lower_throughput_when_compute_dominates():
    om = _om(latency_us=5000.0, in_bytes=1000, out_bytes=100)
    sync = _run(om, streams=1, mode="sync")
    for n in (1, 2, 4):
        assert _run(om, streams=n).throughput_per_s >= sync.throughput_per_s * (1 - 1e-9)


def test_async_cuts_latency_under_load_and_costs_latency_at_saturation():
    om = _om(latency_us=100.0)
    sync = _run(om, streams=1, mode="sync", requests=64)
    # offered 1.3x what the blocking program sustains: it queues, the pipeline keeps up
    rate = 1.3 * sync.throughput_per_s
    loaded_sync = _run(om, streams=1, mode="sync", requests=64, rate_per_s=rate)
    loaded_async = _run(om, streams=2, requests=64, rate_per_s=rate)
    assert loaded_async.latency_ms < 0.5 * loaded_sync.latency_ms
    assert loaded_async.latency_p99_ms < loaded_sync.latency_p99_ms
    # unloaded, one batch takes the sum of its stages either way
    stages = sum(sync.costs.ms(s) for s in ("preprocess", "h2d", "compute", "d2h"))
    assert sync.latency_ms == pytest.approx(stages)
    # closed loop, more streams queue on the shared engines: latency rises with them
    assert _run(om, streams=4).latency_ms > sync.latency_ms


def test_larger_batch_raises_throughput_and_latency(tiny):
    small = pipeline(tiny, batch=1, streams=2, preprocess_ms=0.0)
    large = pipeline(small.source, batch=16, streams=2, preprocess_ms=0.0)
    assert large.throughput_per_s > small.throughput_per_s
    assert large.costs.compute_ms > small.costs.compute_ms     # one batch computes longer
    assert large.costs.input_bytes == 16 * 3 * 32 * 32 * 4
    assert sorted(small.source.reports) == [1, 2, 16]  # re-optimised per batch, and kept


# ---- conservation and order ---------------------------------------------------------------

@pytest.mark.parametrize("streams,mode,rate,in_bytes,pre", [
    (1, "sync", None, 2_408_448, 0.01), (1, "async", None, 2_408_448, 0.01), (3, "async", None, 2_408_448, 0.01),
    (2, "async", 20000.0, 2_408_448, 0.01), (2, "async", None, 1000, 0.0), (4, "async", None, 1000, 0.0),
    (3, "async", None, 40_000_000, 0.2)])
def test_conservation_and_stage_order(streams, mode, rate, in_bytes, pre):
    res = _run(_om(latency_us=80.0, in_bytes=in_bytes), streams=streams, mode=mode, preprocess_ms=pre,
               rate_per_s=rate, requests=24)
    wall = res.wall_us
    for r, u in res.utilization.items():
        assert 0 <= u <= 1 + 1e-9, r
        assert res.busy_us(r) <= wall + 1e-6
        ops = sorted((o for o in res.ops if o.resource == r), key=lambda o: o.start_us)
        assert all(a.end_us <= b.start_us + 1e-9 for a, b in zip(ops, ops[1:])), f"{r} runs two at once"
    by_req = {}
    for o in res.ops:
        by_req.setdefault(o.request, {})[o.stage] = o
    assert len(by_req) == res.requests
    for r, st in by_req.items():
        chain = [st[s] for s in ("preprocess", "h2d", "compute", "d2h")]
        assert all(a.end_us <= b.start_us + 1e-9 for a, b in zip(chain, chain[1:])), f"request {r} out of order"
        assert chain[0].start_us >= res.arrival_us[r] - 1e-9
        assert {o.stream for o in chain} == {r % streams}
    for r in range(streams, res.requests):  # a stream runs its device work in launch order
        assert by_req[r]["h2d"].start_us >= by_req[r - streams]["d2h"].end_us - 1e-9
    if mode == "sync":
        for r in range(1, res.requests):
            assert by_req[r]["preprocess"].start_us >= by_req[r - 1]["d2h"].end_us - 1e-9


def test_trace_has_one_lane_per_stream_and_engine(tmp_path):
    res = _run(_om(latency_us=80.0), streams=3, preprocess_ms=0.01)
    path = tmp_path / "pipe.json"
    trace = res.chrome_trace(path)
    assert json.loads(path.read_text()) == trace
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(n for (pid, _), n in names.items() if pid == 0) == ["stream 0", "stream 1", "stream 2"]
    assert sorted(n for (pid, _), n in names.items() if pid == 1) == sorted(
        ["host thread 0", "host thread 1", "host thread 2", "H2D DMA", "AI cores", "D2H DMA"])
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * 4 * res.requests
    assert not list(tmp_path.glob(".*.tmp"))


# ---- inputs -------------------------------------------------------------------------------

def test_accepts_optimized_model_module_and_report_objects(tiny):
    a = pipeline(tiny, batch=2, streams=2, preprocess_ms=0.0)
    b = pipeline(tiny.model, batch=2, streams=2, example_inputs=(torch.randn(2, 3, 32, 32),), preprocess_ms=0.0)
    assert a.costs.compute_ms == pytest.approx(tiny.report().latency_us / 1e3)
    assert b.costs.compute_ms == pytest.approx(a.costs.compute_ms, rel=1e-6)
    assert a.costs.input_bytes == 2 * 3 * 32 * 32 * 4 and a.costs.output_bytes == 2 * 10 * 4
    wrapped = SimpleNamespace(report=tiny.report)  # only .report(): its batch, sizes given
    c = pipeline(wrapped, batch=2, input_bytes=3 * 32 * 32 * 4, output_bytes=40, preprocess_ms=0.0)
    assert c.costs == a.costs
    assert pipeline(tiny, preprocess_ms=0.0).batch == 2  # batch=None: the model's own


def test_copies_reuse_the_data_loader_model():
    assert link_copy_ms(CHIP, 10**7, True) == NPUDataLoader([0], chip=CHIP).h2d_ms(10**7, pinned=True)
    pinned = _run(_om(latency_us=80.0), streams=1)
    pageable = _run(_om(latency_us=80.0), streams=1, pinned=False)
    assert pinned.costs.h2d_ms == pytest.approx(link_copy_ms(CHIP, pinned.costs.input_bytes))
    assert pageable.costs.h2d_ms > pinned.costs.h2d_ms


def test_preprocess_callable_is_timed_and_image_default_is_measured(tiny):
    res = _run(_om(latency_us=80.0), streams=1, preprocess_ms=None, preprocess=lambda s: time.sleep(0.002),
               sample=0)
    assert res.costs.preprocess_ms >= 4 * 2.0  # batch 4 x >= 2 ms
    default = pipeline(tiny, batch=2, streams=1)
    assert default.costs.preprocess_ms > 0
    assert any("shipped PNG" in n for n in default.notes)


@pytest.mark.parametrize("kwargs,words", [
    ({"streams": 0}, ["streams must be an integer >= 1", "got 0", "streams=1"]),
    ({"batch": 0}, ["batch must be an integer >= 1", "got 0", "batch=1"]),
    ({"streams": 2.5}, ["streams must be an integer", "2.5"]),
    ({"streams": 2, "mode": "sync"}, ["mode='sync' runs one stream", "streams=2", "mode='async'"]),
    ({"mode": "fast"}, ["mode must be one of async, sync", "'fast'"]),
    ({"preprocess_ms": -1.0}, ["preprocess_ms must be a finite time >= 0", "-1.0"]),
    ({"rate_per_s": 0}, ["rate_per_s must be a finite rate > 0", "got 0"]),
    ({"batch": 8}, ["batch 8", "only gives one at batch 4", "batch=4"]),
])
def test_bad_arguments_name_the_rule_the_value_and_the_fix(kwargs, words):
    with pytest.raises(PipelineError) as err:
        _run(_om(latency_us=80.0), **kwargs)
    for w in words:
        assert w in str(err.value)


def test_non_models_are_refused_with_the_fix():
    with pytest.raises(PipelineError, match="model_or_om must be an OptimizedModel.*got str.*pypto_lab.optimize"):
        pipeline("resnet50", batch=1)
    with pytest.raises(PipelineError, match="nn.Module needs example inputs.*example_inputs=None"):
        pipeline(nn.Linear(4, 4), batch=1)
    with pytest.raises(PipelineError, match=r"report\(\) must return a Report.*returned int"):
        pipeline(SimpleNamespace(report=lambda: 3), batch=1)
    with pytest.raises(PipelineError, match="input_bytes= and output_bytes="):
        pipeline(_om(80.0)[0], batch=4, preprocess_ms=0.0)


# ---- sweep, figures, widget ---------------------------------------------------------------

def test_sweep_rows_curve_and_widget(tiny):
    s = sweep(tiny, batches=[1, 2], streams=[1, 2], preprocess_ms=0.05)
    assert [(r["batch"], r["streams"], r["mode"]) for r in s.rows] == [
        (1, 1, "sync"), (1, 1, "async"), (1, 2, "async"), (2, 1, "sync"), (2, 1, "async"), (2, 2, "async")]
    assert s.row(2, 2)["throughput_per_s"] > s.row(2, 1, "sync")["throughput_per_s"]
    assert "samples/s" in s.table()
    assert plot_throughput_latency(s).axes and plot_timeline(s.results[2]).axes
    again = s.results[0].sweep(batches=[2], streams=[4])
    assert [r["streams"] for r in again.rows] == [1, 4]

    w = pypto_lab.deploy.pipeline_widget(tiny, batches=[1, 2], preprocess_ms=0.05)
    w.streams.value = 3
    assert w.result.streams == 3 and "samples/s" in w.text
    w.mode.value = "sync"
    assert w.result.mode == "sync" and w.result.streams == 1
    assert w.image.value[:4] == b"\x89PNG"
