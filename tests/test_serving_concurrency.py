"""The closed-loop client of the serving simulator (``concurrency=N``, `pypto_lab.llm.closed_loop`):
at most N requests in flight, the next sent when one is answered, TTFT from the send; with a
finite rate, arrivals follow it but wait for a free slot. On the linear step model, never the
cost engine."""

from __future__ import annotations

import pytest

from pypto_lab.llm import serving
from pypto_lab.llm.linear_step import LinearStepModel
from pypto_lab.llm.serving import ServingConfigError, simulate_serving

INF = float("inf")


class Recording(LinearStepModel):
    """The linear model, remembering each step's prefill chunks and decode count."""

    def __init__(self, **kw):
        super().__init__(**kw)
        object.__setattr__(self, "steps", [])

    def step_ms(self, prefill, decode):
        self.steps.append((tuple(prefill), len(decode)))
        return super().step_ms(prefill, decode)


def serve(model, **kw):
    kw.setdefault("progress", False)
    return simulate_serving(model, **kw)


@pytest.fixture
def audited(monkeypatch):
    monkeypatch.setattr(serving, "AUDIT_BLOCKS", True)


def test_concurrency_one_runs_one_request_at_a_time(audited):
    m = Recording()
    r = serve(m, requests=12, concurrency=1, lengths=[(300, 8)] * 12)
    assert max(len(pre) + dec for pre, dec in m.steps) == 1
    prefill = LinearStepModel().step_ms([(300, 0)], [])
    assert [rec.ttft_ms for rec in r.records] == pytest.approx([prefill] * 12)   # from the send: no queueing
    for a, b in zip(r.records, r.records[1:]):
        assert b.arrival_s == pytest.approx(a.finish_s)   # sent when the previous one was answered
    assert r.requests_per_s == pytest.approx(1000.0 / r.e2e_ms_mean)
    assert r.parameters["rate"] == INF and r.parameters["concurrency"] == 1


@pytest.mark.parametrize("n", [2, 5, 16])
def test_the_batch_never_exceeds_the_concurrency(audited, n):
    m = Recording()
    r = serve(m, requests=120, concurrency=n, lengths=[(50 + 17 * k % 400, 5 + 11 * k % 60) for k in range(120)])
    assert max(len(pre) + dec for pre, dec in m.steps) == n
    assert all(rec.generated_tokens == rec.output_tokens for rec in r.records)
    # every moment, at most n requests are between their send and their answer
    events = sorted([(rec.arrival_s, 1) for rec in r.records] + [(rec.finish_s, -1) for rec in r.records])
    live = peak = 0
    for _, d in events:   # an answer and a send at one instant: the answer first (-1 sorts first)
        live += d
        peak = max(peak, live)
    assert peak == n


def test_static_batching_with_concurrency_keeps_the_bound():
    m = Recording()
    serve(m, requests=40, concurrency=4, scheduler="static", lengths=[(100, 10 + k % 7) for k in range(40)])
    assert max(len(pre) + dec for pre, dec in m.steps) <= 4


def test_rate_and_concurrency_together_hold_arrivals_back_only_when_full():
    rows = [(200, 40)] * 60
    free = serve(LinearStepModel(), requests=60, rate=2.0, lengths=rows, seed=3)
    wide = serve(LinearStepModel(), requests=60, rate=2.0, lengths=rows, seed=3, concurrency=60)
    assert [r.arrival_s for r in wide.records] == [r.arrival_s for r in free.records]
    assert [r.ttft_ms for r in wide.records] == pytest.approx([r.ttft_ms for r in free.records])
    tight = serve(LinearStepModel(), requests=60, rate=200.0, lengths=rows, seed=3, concurrency=2)
    poisson = serve(LinearStepModel(), requests=60, rate=200.0, lengths=rows, seed=3)
    sent = [r.arrival_s for r in tight.records]
    assert sent == sorted(sent)
    assert all(s >= a - 1e-12 for s, a in zip(sent, (r.arrival_s for r in poisson.records)))
    assert sent[-1] > poisson.records[-1].arrival_s   # held back: the slots were full


def test_closed_loop_ttft_excludes_the_client_queue_that_an_open_burst_includes():
    rows = [(500, 20)] * 64
    burst = serve(LinearStepModel(), requests=64, rate=INF, lengths=rows, max_num_seqs=8)
    loop = serve(LinearStepModel(), requests=64, concurrency=8, lengths=rows)
    assert loop.ttft_ms_mean < burst.ttft_ms_mean / 3


@pytest.mark.parametrize("bad", [0, -3, 2.5, "4", True])
def test_bad_concurrency_names_rule_value_fix(bad):
    with pytest.raises(ServingConfigError) as e:
        serve(LinearStepModel(), requests=4, concurrency=bad)
    msg = str(e.value)
    assert "concurrency" in msg and repr(bad) in msg and "Fix:" in msg


def test_a_run_without_the_new_options_reports_as_before():
    r = serve(LinearStepModel(), requests=50)
    d = r.to_dict()
    assert "concurrency" not in r.parameters and "prefix_cache" not in d
    assert r.parameters["rate"] == 10.0


def test_the_command_line_runs_a_closed_loop_with_a_shared_prefix(capsys):
    from pypto_lab.cli import main

    assert main(["serve", "gpt2", "--requests", "12", "--concurrency", "2", "--shared-prefix", "256", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rate inf req/s, at most 2 in flight" in out and "prefix cache on" in out
    assert main(["serve", "gpt2", "--concurrency", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--concurrency 0: the requests in flight" in err and "e.g. --concurrency 16" in err
