"""Automatic prefix caching in the serving simulator (`pypto_lab.llm.prefix_cache`): a shared prompt
prefix is computed once, held once in the KV pool and found by later requests, whose prefill is
only the uncached rest; off, a run is the one without caching. On the linear step model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_lab.llm import serving
from pypto_lab.llm.linear_step import LinearStepModel
from pypto_lab.llm.serving import ServingConfigError, Trace, simulate_serving

INF = float("inf")


class Recording(LinearStepModel):
    def __init__(self, **kw):
        super().__init__(**kw)
        object.__setattr__(self, "prefills", [])

    def step_ms(self, prefill, decode):
        self.prefills.extend(prefill)
        return super().step_ms(prefill, decode)


def serve(model=None, **kw):
    kw.setdefault("progress", False)
    return simulate_serving(model or LinearStepModel(), **kw)


def pool_of(blocks: int, block_size: int = 16, kv: int = 1024) -> LinearStepModel:
    return LinearStepModel(kv_bytes_per_token=kv, kv_budget_bytes=blocks * block_size * kv)


def trace(rows, prefix_id, prefix_tokens, arrival=None) -> Trace:
    p = np.array([r[0] for r in rows], np.int64)
    o = np.array([r[1] for r in rows], np.int64)
    arr = None if arrival is None else np.array(arrival, np.float64)
    return Trace(p, o, arr, tuple(f"row {k}" for k in range(len(rows))), "test trace", tuple(prefix_id),
                 np.array(prefix_tokens, np.int64))


@pytest.fixture
def audited(monkeypatch):
    monkeypatch.setattr(serving, "AUDIT_BLOCKS", True)


def test_a_shared_system_prompt_cuts_ttft_and_kv_use(audited):
    rows = [(100, 60)] * 150
    on = serve(requests=150, rate=20.0, lengths=rows, shared_prefix=1000)
    off = serve(requests=150, rate=20.0, lengths=rows, shared_prefix=1000, prefix_caching=False)
    assert on.ttft_ms_mean < 0.5 * off.ttft_ms_mean
    peak_on, peak_off = max(f for _, f in on.kv_occupancy), max(f for _, f in off.kv_occupancy)
    assert peak_on < 0.5 * peak_off
    # 7 full blocks of 128 (896 of the 1,100 prompt tokens) found by every request but the first
    assert on.prefix_cache["hit_rate"] == pytest.approx(896 * 149 / (1100 * 150))
    assert off.prefix_cache == {**off.prefix_cache, "enabled": False, "hit_rate": 0.0, "hit_tokens": 0}
    assert all(r.prompt_tokens == 1100 for r in on.records)
    assert "prefix cache on" in on.summary() and on.to_dict()["prefix_cache"]["hit_tokens"] == 896 * 149


def test_caching_off_is_the_run_without_a_prefix():
    rows = [(100 + k % 50, 40) for k in range(80)]
    off = serve(requests=80, rate=30.0, lengths=rows, shared_prefix=700, prefix_caching=False)
    plain = serve(requests=80, rate=30.0, lengths=[(p + 700, o) for p, o in rows])
    assert [r.ttft_ms for r in off.records] == [r.ttft_ms for r in plain.records]
    assert [r.e2e_ms for r in off.records] == [r.e2e_ms for r in plain.records]
    assert off.kv_occupancy == plain.kv_occupancy


def test_the_prefill_is_charged_for_the_uncached_tokens_only():
    m = Recording()
    serve(m, lengths=[(300, 2, 0.0), (300, 2, 10.0)], shared_prefix=1000)
    assert m.prefills == [(1300, 0), (1300 - 896, 896)]   # (new tokens, cached tokens they attend over)


def test_a_request_admitted_in_the_same_step_finds_the_blocks_being_computed():
    m = Recording()
    serve(m, lengths=[(10, 2, 0.0), (10, 2, 0.0)], shared_prefix=512, block_size=128)
    assert m.prefills == [(522, 0), (10, 512)]   # vLLM V1 caches blocks when it schedules them


def test_a_fully_cached_prompt_still_computes_its_last_token():
    m = Recording()
    t = trace([(256, 2), (256, 2)], ["sys", "sys"], [256, 256], arrival=[0.0, 5.0])
    r = serve(m, lengths=t, block_size=128)
    assert m.prefills == [(256, 0), (128, 128)]   # at most (256 - 1) // 128 = 1 block found
    assert r.prefix_cache["hit_tokens"] == 128


def test_trace_prefix_groups_share_only_within_a_group():
    m = Recording()
    t = trace([(600, 2), (600, 2), (600, 2), (600, 2)], ["a", "b", "a", ""], [512, 512, 384, 0],
              arrival=[0.0, 1.0, 2.0, 3.0])
    r = serve(m, lengths=t, block_size=128)
    assert m.prefills == [(600, 0), (600, 0), (600 - 384, 384), (600, 0)]
    assert r.prefix_cache["groups"] == 2


def test_idle_cached_blocks_are_evicted_when_the_pool_needs_them(audited):
    # 20 blocks of 16: a group's 8 prefix blocks stay cached while free blocks last, then go
    rows = [(140, 20)] * 6 + [(300, 10)] + [(140, 20)]
    t = trace(rows, ["s"] * 6 + ["", "s"], [128] * 6 + [0, 128], arrival=[k * 1.0 for k in range(8)])
    r = serve(pool_of(20), lengths=t, block_size=16)
    assert r.prefix_cache["evictions"] >= 8
    assert r.records[5].ttft_ms < r.records[0].ttft_ms   # found the prefix
    assert r.records[7].ttft_ms == pytest.approx(r.records[0].ttft_ms)   # evicted by the long request: computed again


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(1, 160), st.integers(1, 60), st.floats(0, 3), st.sampled_from(["", "x", "y"]),
                            st.integers(0, 160)), min_size=1, max_size=20),
    block_size=st.integers(1, 16),
    spare_blocks=st.integers(0, 12),
    max_batched_tokens=st.integers(1, 200),
    max_num_seqs=st.integers(1, 10),
)
def test_block_accounting_with_shared_prefixes_and_preemption(rows, block_size, spare_blocks, max_batched_tokens,
                                                              max_num_seqs):
    pid = [g for _, _, _, g, _ in rows]
    ptok = [min(k, p) if g else 0 for p, _, _, g, k in rows]
    t = trace([(p, o) for p, o, *_ in rows], pid, ptok, arrival=[a for _, _, a, _, _ in rows])
    largest = max(-(-(p + o) // block_size) for p, o, *_ in rows)
    old = serving.AUDIT_BLOCKS
    serving.AUDIT_BLOCKS = True   # hypothesis reruns the body: no function-scoped fixture
    try:
        r = serve(pool_of(largest + spare_blocks, block_size), requests=len(rows), lengths=t, block_size=block_size,
                  max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs)
    finally:
        serving.AUDIT_BLOCKS = old
    assert all(0.0 <= f <= 1.0 for _, f in r.kv_occupancy)
    assert [rec.generated_tokens for rec in r.records] == [rec.output_tokens for rec in r.records]
    assert r.prefix_cache is None if not any(pid) else 0.0 <= r.prefix_cache["hit_rate"] < 1.0


def test_a_preempted_request_finds_its_prefix_again(audited):
    # 14 blocks of 16: the requests outgrow the pool, the latest is preempted and, re-admitted, finds
    # the prefix the others still hold
    t = trace([(70, 60)] * 4, ["s"] * 4, [64] * 4, arrival=[0.0] * 4)
    m = Recording(kv_bytes_per_token=1024, kv_budget_bytes=14 * 16 * 1024)
    r = serve(m, lengths=t, block_size=16)
    assert r.preemptions > 0
    assert all(rec.generated_tokens == rec.output_tokens for rec in r.records)
    assert [c for _, c in m.prefills] == [0] + [64] * (3 + r.preemptions)   # each re-admission finds it too


def test_bad_prefix_arguments_name_rule_value_fix(tmp_path):
    with pytest.raises(ServingConfigError, match=r"shared_prefix = -1: .*Fix: shared_prefix="):
        serve(requests=2, shared_prefix=-1)
    with pytest.raises(ServingConfigError, match=r"prefix_caching = True: prefix caching shares .*Fix: "
                                                 r"prefix_caching=False.*scheduler='continuous'"):
        serve(requests=2, shared_prefix=100, scheduler="static")
    with pytest.raises(ServingConfigError, match=r"prefix_caching = 'yes': must be True"):
        serve(requests=2, prefix_caching="yes")
    static = serve(requests=20, shared_prefix=100, scheduler="static", prefix_caching=False)
    assert static.prefix_cache["enabled"] is False
    csv = tmp_path / "t.csv"
    csv.write_text("prompt_tokens,output_tokens,prefix_id,prefix_tokens\n100,5,sys,200\n")
    with pytest.raises(ServingConfigError, match=r"line 2: prefix_tokens 200 is more than the prompt's 100 tokens"):
        serve(lengths=csv)
    csv.write_text("prompt_tokens,output_tokens,prefix_id,prefix_tokens\n100,5,,50\n")
    with pytest.raises(ServingConfigError, match=r"prefix_tokens 50 without a prefix_id"):
        serve(lengths=csv)
    csv.write_text("prompt_tokens,output_tokens,prefix_id\n100,5,sys\n")
    with pytest.raises(ServingConfigError, match=r"needs both columns prefix_id and prefix_tokens"):
        serve(lengths=csv)
    csv.write_text("prompt_tokens,output_tokens,prefix_id,prefix_tokens\n300,5,sys,256\n300,5,sys,256\n")
    with pytest.raises(ServingConfigError, match=r"shared_prefix = 64: .* is given one way"):
        serve(lengths=csv, shared_prefix=64)
    ok = serve(lengths=csv, rate=INF)
    assert ok.prefix_cache["hit_tokens"] == 256


def test_a_shared_prefix_beyond_the_models_positions_is_refused():
    from pypto_lab.llm.validation import ContextLengthError

    class Short(LinearStepModel):
        max_positions = 512

    with pytest.raises(ContextLengthError, match=r"shared_prefix = 600: .*Fix: shared_prefix=510"):
        serve(Short(), requests=4, shared_prefix=600)
    r = serve(Short(), requests=30, shared_prefix=400)   # sampled lengths are drawn within the 112 positions left
    assert all(rec.prompt_tokens + rec.output_tokens <= 512 for rec in r.records)
