"""`pypto_lab.llm.serving_validation`: each published serving row runs the way it was measured (its
load, lengths, requests, cards and stack) or is listed with the reason it cannot; nothing is
invented."""

from __future__ import annotations

import math

import pytest

from pypto_lab.llm.serving_validation import NotExpressible, express, plan, read_rows, validate_serving

ROWS = {int(r["id"]): r for r in read_rows()}


def _row(**kw) -> dict[str, str]:
    base = dict(ROWS[34])   # a vllm bench serve row: Atlas 800I A2, rate 1, 200 prompts, 200 in / 128 out
    base.update(kw)
    return base


def test_every_serving_row_is_run_or_listed_with_a_reason():
    todo, skipped = plan()
    ids = {int(r["id"]) for r, _, _ in todo} | {s["id"] for s in skipped}
    serving = {i for i, r in ROWS.items() if r["framework"] and ("vllm" in r["framework"].lower()
                                                                   or "mindie" in r["framework"].lower())}
    assert ids == serving
    assert not {int(r["id"]) for r, _, _ in todo} & {s["id"] for s in skipped}
    assert all(s["reason"] for s in skipped)


def test_a_run_takes_the_rows_own_numbers():
    todo, _ = plan()
    for row, run, _ in todo:
        assert (run.prompt, run.output) == (int(row["prompt_len"]), int(row["output_len"]))
        assert str(run.requests) + " prompts" in row["notes"]
        if row["batch"].startswith("rate="):
            assert run.concurrency is None and f"rate={run.rate:g} req/s" == row["batch"]


def test_an_output_length_not_stated_is_not_invented():
    for i in (7, 9, 13, 15, 17):   # closed-loop rows of vllm-ascend issue #4395
        with pytest.raises(NotExpressible, match="output length not stated"):
            express(ROWS[i])
    with pytest.raises(NotExpressible, match="output length only a cap"):
        express(ROWS[25])
    with pytest.raises(NotExpressible, match="ShareGPT sample"):
        express(ROWS[4])
    with pytest.raises(NotExpressible, match="W4A4"):
        express(ROWS[19])


def test_each_row_runs_on_its_stack():
    assert express(ROWS[34])[0].stack == "vllm-ascend-aclgraph-0.18"   # vllm-ascend v0.18.0: its measured release
    assert express(ROWS[1])[0].stack == "vllm-ascend-aclgraph"         # main of 2025-07: the derived default
    assert express(_row(framework="vllm-ascend v0.13.0"))[0].stack == "vllm-ascend-aclgraph"
    assert express(_row(framework="vllm-ascend v0.18.1"))[0].stack == "vllm-ascend-aclgraph-0.18"
    run, assumed = express(ROWS[22])   # vllm-ascend v0.7.3: before graph mode
    assert run.stack == "vllm-ascend-eager" and any("v0.9.0rc1" in a for a in assumed)
    mindie = _row(framework="MindIE (version not stated)")
    assert express(mindie)[0].stack == "mindie"
    assert express(_row(framework="vllm-ascend v0.18.0 enforce_eager"))[0].stack == "vllm-ascend-eager"


def test_a_closed_loop_row_is_a_concurrency_at_rate_inf():
    run, _ = express(_row(batch="concurrency=16", prompt_len="2048", output_len="256"))
    assert run.concurrency == 16 and math.isinf(run.rate) and run.load == "concurrency 16"


def test_a_small_row_runs_end_to_end():
    row = _row(id="900", notes="4 prompts at 1 RPS", prompt_len="64", output_len="8", value="50")
    result = validate_serving([row, {**row, "metric": "tpot_ms_mean", "value": "20"}])
    assert [r["kind"] for r in result.rows] == ["TTFT", "ITL"]
    for r in result.rows:
        assert r["simulated"] > 0 and r["error"] == pytest.approx((r["simulated"] - r["published"]) / r["published"])
        assert r["chip_stated"] and r["stack"] == "vllm-ascend-aclgraph-0.18" and r["requests"] == 4
    assert set(result.summary()) == {"TTFT", "ITL"} and len(result.runs) == 1
    assert "not expressible (0 rows)" in result.table()


def test_async_scheduling_follows_the_vllm_version():
    assert express(ROWS[34])[0].async_scheduling              # vllm-ascend v0.18.0: on by default since v0.14.0
    assert not express(ROWS[22])[0].async_scheduling          # v0.7.3
    assert not express(ROWS[1])[0].async_scheduling           # main of 2025-07: no version, synchronous (assumed)
    assert not express(_row(framework="vllm-ascend v0.13.0"))[0].async_scheduling
    assert express(_row(framework="vllm-ascend v0.14.0"))[0].async_scheduling
    run, assumed = express(_row(framework="vllm-ascend (version not in excerpt)"))
    assert not run.async_scheduling and any("version not stated" in a for a in assumed)


def test_an_overloaded_issue_report_is_listed_with_its_reason():
    for i in (20, 21):   # Qwen3-8B at 10 req/s, 1024/2048 tokens: 0.02 req/s served
        with pytest.raises(NotExpressible, match="overloaded server"):
            express(ROWS[i])


def test_the_report_names_the_host_mechanisms_a_row_runs_with():
    from pypto_lab.validation.llm_rows import _serving_mechanisms
    vl = _serving_mechanisms(express(ROWS[34])[0])          # v0.18.0 on the ACL graph stack
    assert any("PIECEWISE" in m for m in vl) and any("async scheduling" in m for m in vl)
    assert _serving_mechanisms(express(ROWS[22])[0]) == ()   # v0.7.3 eager: neither
