"""The serving simulator (`pypto_lab.llm.serving`) against what a user relies on, with a linear fake
step model (`pypto_lab.llm.linear_step`), never the cost engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_lab.llm import serving
from pypto_lab.llm.lengths import fit, fit_dimension
from pypto_lab.llm.linear_step import LinearStepModel
from pypto_lab.llm.serving import ServingConfigError, simulate_serving
from pypto_lab.llm.step_model import StepModel

INF = float("inf")
MODEL = LinearStepModel()


def pool_of(blocks: int, block_size: int = 128, kv_bytes_per_token: int = 1024) -> LinearStepModel:
    """The linear model with a KV pool of exactly ``blocks`` blocks."""
    return LinearStepModel(kv_bytes_per_token=kv_bytes_per_token, kv_budget_bytes=blocks * block_size * kv_bytes_per_token)


def serve(model=MODEL, **kw):
    kw.setdefault("progress", False)
    return simulate_serving(model, **kw)


@pytest.fixture
def audited(monkeypatch):
    monkeypatch.setattr(serving, "AUDIT_BLOCKS", True)


def test_linear_model_is_a_step_model():
    assert isinstance(MODEL, StepModel)


def test_one_request_times_are_its_steps():
    m = MODEL
    r = serve(m, lengths=[(100, 3)], rate=INF)
    prefill = m.step_ms([(100, 0)], [])
    d1, d2 = m.step_ms([], [100]), m.step_ms([], [101])
    rec = r.records[0]
    assert rec.ttft_ms == pytest.approx(prefill)
    assert rec.e2e_ms == pytest.approx(prefill + d1 + d2)
    assert rec.tpot_ms == pytest.approx((d1 + d2) / 2)
    assert r.steps == 3


def test_long_prompt_is_prefilled_in_chunks():
    m = MODEL
    r = serve(m, lengths=[(10_000, 2)], rate=INF, max_batched_tokens=4096)
    chunks = m.step_ms([(4096, 0)], []) + m.step_ms([(4096, 4096)], []) + m.step_ms([(1808, 8192)], [])
    assert r.records[0].ttft_ms == pytest.approx(chunks)
    assert r.steps == 4


def test_continuous_beats_static_throughput_when_all_arrive_at_once():
    cont = serve(requests=300, rate=INF, scheduler="continuous")
    stat = serve(requests=300, rate=INF, scheduler="static")
    assert cont.output_tokens_per_s > 1.3 * stat.output_tokens_per_s


def test_higher_rate_raises_ttft_p99():
    low = serve(requests=300, rate=2.0)
    high = serve(requests=300, rate=200.0)
    assert high.ttft_ms_p99 > 5 * low.ttft_ms_p99


def test_tiny_pool_preempts_and_every_request_still_completes(audited):
    model = pool_of(12, block_size=16)
    r = serve(model, requests=120, rate=INF, block_size=16, max_num_seqs=32, lengths=[(60, 80)] * 40 + [(20, 100)] * 80)
    assert r.preemptions > 0
    assert r.records[0].preemptions == 0  # the victim is the most recently admitted, never the oldest
    for rec in r.records:
        assert rec.generated_tokens == rec.output_tokens
        assert math.isfinite(rec.finish_s) and rec.finish_s >= rec.first_token_s >= rec.arrival_s
    assert max(f for _, f in r.kv_occupancy) <= 1.0


def test_static_batch_runs_to_completion_before_the_next():
    rows = [(10, 50, 0.0), (10, 2, 0.0), (10, 5, 0.001)]
    stat = serve(lengths=rows, scheduler="static").records
    cont = serve(lengths=rows, scheduler="continuous").records
    assert stat[2].first_token_s >= stat[0].finish_s  # waited for the batch's longest request
    assert cont[2].first_token_s < cont[0].finish_s  # joined the running batch
    assert stat[1].finish_s < stat[0].finish_s  # a short request still ends early


def test_large_pool_never_preempts():
    assert serve(requests=200, rate=INF).preemptions == 0


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 120), st.floats(0, 5)), min_size=1, max_size=25),
    block_size=st.integers(1, 32),
    spare_blocks=st.integers(0, 20),
    max_batched_tokens=st.integers(1, 300),
    max_num_seqs=st.integers(1, 12),
    scheduler=st.sampled_from(["continuous", "static"]),
)
def test_block_accounting_never_exceeds_the_pool(rows, block_size, spare_blocks, max_batched_tokens, max_num_seqs, scheduler):
    largest = max(-(-(p + o) // block_size) for p, o, _ in rows)
    model = pool_of(largest + spare_blocks, block_size)
    old = serving.AUDIT_BLOCKS
    serving.AUDIT_BLOCKS = True  # hypothesis reruns the body, so no function-scoped fixture
    try:
        r = serve(model, requests=len(rows), lengths=rows, block_size=block_size,
                  max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs, scheduler=scheduler)
    finally:
        serving.AUDIT_BLOCKS = old
    assert all(0.0 <= f <= 1.0 for _, f in r.kv_occupancy)
    assert [rec.generated_tokens for rec in r.records] == [rec.output_tokens for rec in r.records]
    assert sorted((rec.prompt_tokens, rec.output_tokens) for rec in r.records) == sorted((p, o) for p, o, _ in rows)


def test_seeds_reproduce_and_differ():
    a = serve(requests=200, rate=20.0, seed=7).to_dict(include_records=True)
    b = serve(requests=200, rate=20.0, seed=7).to_dict(include_records=True)
    c = serve(requests=200, rate=20.0, seed=8).to_dict(include_records=True)
    assert a == b
    assert a["records"] != c["records"]


def test_csv_trace_is_honoured(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n500,20,0.0\n30,7,100.0\n1200,1,0.5\n")
    r = serve(lengths=path, rate=1.0)
    got = [(rec.prompt_tokens, rec.output_tokens, rec.arrival_s) for rec in r.records]
    assert got == [(500, 20, 0.0), (1200, 1, 0.5), (30, 7, 100.0)]  # in arrival order
    assert r.records[2].first_token_s >= 100.0
    assert math.isnan(r.records[1].tpot_ms)  # one output token: no time per output token
    assert r.requests == 3 and sum(rec.generated_tokens for rec in r.records) == 28


def test_list_trace_without_arrivals_uses_rate():
    rows = [(64, 16)] * 50
    r = serve(lengths=rows, rate=INF)
    assert all(rec.arrival_s == 0.0 for rec in r.records)
    r = serve(lengths=rows, rate=5.0, requests=20)
    assert r.requests == 20
    arrivals = [rec.arrival_s for rec in r.records]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0


def test_percentiles_are_ordered():
    for sched in ("continuous", "static"):
        d = serve(requests=300, rate=30.0, scheduler=sched).to_dict()
        for k in ("ttft", "tpot"):
            assert d[f"{k}_ms_p50"] <= d[f"{k}_ms_p90"] <= d[f"{k}_ms_p99"]
        assert d["e2e_ms_p50"] <= d["e2e_ms_p99"]


def test_report_contents():
    r = serve(requests=400, rate=INF)
    d = r.to_dict()
    assert d["parameters"]["scheduler"] == "continuous" and d["parameters"]["block_size"] == 128
    assert 0 < len(d["kv_occupancy"]) <= serving.MAX_OCCUPANCY_POINTS < r.steps
    times = [t for t, _ in d["kv_occupancy"]]
    assert times == sorted(times)
    assert 1.0 <= d["mean_batch_size"] <= 256
    assert len(r.records) == 400 and "records" not in d
    total = sum(rec.output_tokens for rec in r.records)
    assert d["output_tokens_per_s"] == pytest.approx(total / d["duration_s"])
    assert "TTFT" in r.summary()


def test_max_num_seqs_caps_the_batch():
    r = serve(requests=100, rate=INF, max_num_seqs=4)
    assert r.mean_batch_size <= 4


@pytest.mark.parametrize("rate", [0, -1.0, float("nan"), "fast"])
def test_bad_rate_names_rule_value_fix(rate):
    with pytest.raises(ServingConfigError, match=r"rate = .*: requests per second must be a number > 0\. Fix: "
                                                 r"rate=10\.0 or rate=float\('inf'\)"):
        serve(rate=rate)


@pytest.mark.parametrize("bs", [0, -16, 1.5])
def test_bad_block_size_names_rule_value_fix(bs):
    with pytest.raises(ServingConfigError, match=r"block_size = .*: tokens per KV block must be an integer >= 1\. "
                                                 r"Fix: block_size=128"):
        serve(block_size=bs)


def test_request_that_cannot_fit_names_rule_value_fix():
    model = pool_of(10, block_size=128)  # 1,280 tokens of KV
    with pytest.raises(ServingConfigError) as e:
        serve(model, lengths=[(100, 10), (1000, 500)])
    msg = str(e.value)
    assert "request 1 can never fit" in msg and "1000 + output 500 = 1500" in msg
    assert "12 blocks" in msg and "pool is 10 blocks" in msg and "Fix" in msg and "1280 tokens" in msg


def test_bad_csv_names_the_columns(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("input,output\n10,5\n")
    with pytest.raises(ServingConfigError, match=r"prompt_tokens,output_tokens.*has \['input', 'output'\].*Fix"):
        serve(lengths=path)
    path.write_text("prompt_tokens,output_tokens,arrival_s\n10,5,soon\n")
    with pytest.raises(ServingConfigError, match=r"line 2: arrival_s must be a finite time >= 0 s \(got 'soon'\)"):
        serve(lengths=path)


def test_bad_trace_rows_and_scheduler():
    with pytest.raises(ServingConfigError, match=r"row 1.*>= 1 token.*Fix"):
        serve(lengths=[(10, 5), (0, 5)])
    with pytest.raises(ServingConfigError, match=r"scheduler = 'fifo': must be one of continuous, static"):
        serve(scheduler="fifo")


def test_lengths_fit_matches_published_means():
    for f in fit().values():
        assert f.clipped_mean() == pytest.approx(f.target_mean, rel=1e-9)
        s = f.sample(np.random.default_rng(0), 200_000)
        assert s.min() >= 1 and s.max() <= 4096
        assert s.mean() == pytest.approx(f.target_mean, rel=0.02)


def test_lengths_fit_with_a_median_keeps_it():
    f = fit_dimension(300.0, 1, 4096, median=150.0)
    assert f.median == pytest.approx(150.0)
    assert f.clipped_mean() == pytest.approx(300.0, rel=1e-9)
    s = f.sample(np.random.default_rng(1), 200_000)
    assert np.median(s) == pytest.approx(150, rel=0.03)
