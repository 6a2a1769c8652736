"""vLLM's async scheduling (``--async-scheduling``, on by default from vLLM v0.14.0): the engine
schedules step k+1 as soon as step k is submitted, so a request arriving while step k runs joins
step k+2, not k+1; an idle engine schedules an arrival at once."""

from __future__ import annotations

import pytest

from pypto_lab.llm.linear_step import LinearStepModel
from pypto_lab.llm.serving import ServingConfigError, simulate_serving

STEP_MS = 10.0
FLAT = LinearStepModel(overhead_ms=STEP_MS, per_token_ms=0.0, per_context_token_ms=0.0)


def _run(async_scheduling: bool, arrivals=(0.0, 0.0251)):
    # request 0 decodes for a while; request 1 arrives 5.1 ms into its third step
    rows = [(16, 50, arrivals[0]), (16, 4, arrivals[1])]
    return simulate_serving(FLAT, requests=2, lengths=rows, progress=False, async_scheduling=async_scheduling)


def test_an_arrival_during_a_step_joins_the_step_after_the_next():
    sync, asy = _run(False), _run(True)
    # synchronous: it waits for the step under way (4.9 ms), then its prefill step (10 ms)
    assert sync.records[1].ttft_ms == pytest.approx(4.9 + STEP_MS)
    # async: the next step was scheduled before it arrived: one more step to wait
    assert asy.records[1].ttft_ms == pytest.approx(4.9 + 2 * STEP_MS)
    assert asy.parameters["async_scheduling"] is True and "async_scheduling" not in sync.parameters


def test_an_idle_engine_schedules_an_arrival_at_once():
    rows = [(16, 4, 0.0), (16, 4, 1.0)]   # the second arrives long after the first has finished
    for flag in (False, True):
        rep = simulate_serving(FLAT, requests=2, lengths=rows, progress=False, async_scheduling=flag)
        assert rep.records[1].ttft_ms == pytest.approx(STEP_MS)


def test_decode_steps_are_the_same():
    sync, asy = _run(False), _run(True)
    assert sync.records[0].tpot_ms == pytest.approx(asy.records[0].tpot_ms)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_async_scheduling_must_be_a_bool(value):
    with pytest.raises(ServingConfigError, match="async_scheduling"):
        simulate_serving(FLAT, requests=2, lengths=[(16, 4)] * 2, progress=False, async_scheduling=value)


def test_static_batching_has_no_step_ahead():
    with pytest.raises(ServingConfigError, match="async_scheduling.*static"):
        simulate_serving(FLAT, requests=2, lengths=[(16, 4)] * 2, progress=False, scheduler="static",
                         async_scheduling=True)
