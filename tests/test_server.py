"""The serving twin (`pypto_lab.server`): real clients against the simulated card.

The online scheduler is the offline one (same trace, same figures); the `openai` client measures
the card's TTFT and ITL; `/metrics` is Prometheus text with vLLM's names; and the server holds:
loopback by default, a bounded queue (429) and a closing server (503), a client that goes away
frees its KV blocks, bad requests get OpenAI error bodies, 200 concurrent streams lose and repeat
no token, and shutdown drains or cancels. Every server binds 127.0.0.1 on a free port and is
stopped by its test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import pypto_lab.llm.serving as serving  # noqa: E402
from pypto_lab.llm import step_model  # noqa: E402
from pypto_lab.llm.lengths import sample_lengths  # noqa: E402
from pypto_lab.llm.linear_step import LinearStepModel  # noqa: E402
from pypto_lab.llm.online import OnlineScheduler  # noqa: E402
from pypto_lab.llm.serving import ServingConfigError, simulate_serving  # noqa: E402
from pypto_lab.server import TwinServer  # noqa: E402
from pypto_lab.server import text as twin_text  # noqa: E402
from pypto_lab.server.card import card_step_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(model="qwen2-0.5b", chip="Ascend910B1")
WORDS = (ROOT / "datasets" / "sentences" / "sentences.txt").read_text().split()


def _prompt(k: int, words: int) -> str:
    return " ".join((WORDS * (1 + words // len(WORDS) + 1))[k * 13 % len(WORDS):][:words])


@pytest.fixture
def audited(monkeypatch):
    monkeypatch.setattr(serving, "AUDIT_BLOCKS", True)


# --- the scheduler underneath -----------------------------------------------------------------


def test_online_scheduler_gives_the_offline_figures_on_the_same_trace(audited):
    """Requests added as they arrive, one step at a time: every request's TTFT and end-to-end
    latency equal `simulate_serving`'s on the same (prompt, output, arrival) rows, preemptions too."""
    rng = np.random.default_rng(5)
    n = 300
    p, o = sample_lengths(n, rng)
    arr = np.cumsum(rng.exponential(1 / 40.0, n))
    sm = LinearStepModel(kv_bytes_per_token=1024, kv_budget_bytes=12000 * 1024)
    rows = [(int(a), int(b), float(c)) for a, b, c in zip(p, o, arr)]
    off = simulate_serving(sm, requests=n, lengths=rows, block_size=16, max_batched_tokens=1024, progress=False)
    on = OnlineScheduler(sm, max_batched_tokens=1024, block_size=16)
    k = 0
    while True:
        while k < n and arr[k] <= on.t:      # what arrived while the last step ran
            on.add(arr[k], int(p[k]), int(o[k]))
            k += 1
        if on.advance() is None:
            if k == n:
                break
            on.add(arr[k], int(p[k]), int(o[k]))
            k += 1
    assert off.preemptions > 50 and on.preemptions == off.preemptions
    assert on.steps == off.steps
    for a, b in zip((on.record(i) for i in range(n)), off.records):
        assert (a.ttft_ms, a.e2e_ms, a.generated_tokens) == (b.ttft_ms, b.e2e_ms, b.generated_tokens)


def test_cancel_returns_a_running_requests_blocks_and_skips_a_waiting_one(audited):
    sm = LinearStepModel(kv_bytes_per_token=1024, kv_budget_bytes=64 * 16 * 1024)
    on = OnlineScheduler(sm, max_batched_tokens=4096, max_num_seqs=1, block_size=16)
    a = on.add(0.0, 100, 500)
    b = on.add(0.0, 100, 5)
    on.advance()
    assert on.running == 1 and on.waiting == 1 and on.kv_used_blocks == 7   # ceil(101 / 16)
    assert on.cancel(a) and not on.cancel(a)
    assert on.kv_used_blocks == 0 and on.running == 0
    steps = [on.advance() for _ in range(5)]
    assert all(b in s.tokens for s in steps) and b in steps[-1].finished
    assert on.record(b).generated_tokens == 5 and on.record(a).generated_tokens == 1
    with pytest.raises(ServingConfigError, match="can never fit the KV cache"):
        on.add(1.0, 1000, 100)


def test_card_step_model_times_are_chip_step_models():
    """The server's step model keeps a profile per step but times each step as `serve()` does."""
    card = card_step_model(SMALL["model"], SMALL["chip"])
    chip = step_model(SMALL["model"], SMALL["chip"])
    rng = np.random.default_rng(1)
    for _ in range(8):
        pre = [(int(a), int(b)) for a, b in zip(rng.integers(1, 300, 3), rng.integers(0, 500, 3))]
        dec = [int(c) for c in rng.integers(1, 900, int(rng.integers(0, 20)))]
        assert card.step_ms(pre, dec) == chip.step_ms(pre, dec)
        prof = card.last
        assert 0 < prof.aicore_busy <= 1 and prof.hbm_bytes > 0
    assert card.kv_budget_bytes == chip.kv_budget_bytes


# --- real clients -----------------------------------------------------------------------------


def test_openai_client_measures_the_simulated_ttft_and_itl_of_50_concurrent_streams():
    """50 chat completions streamed at once through the `openai` client: the TTFT and inter-token
    latency it measures (wall / time scale) are the server's simulated ones within 5 %. A 70B model
    on 4 cards at time scale 5 keeps the host's own costs (costing a step, 50 clients' parsing)
    small against the card's times; the requests start 5 ms apart, as a load generator ramps."""
    scale, n, tokens = 5.0, 50, 16
    with TwinServer("llama-3-70b", chip="Ascend910B1", cards=4, time_scale=scale) as srv:
        async def one(client, k):
            await asyncio.sleep(0.005 * k)
            t0 = time.perf_counter()
            stream = await client.chat.completions.create(
                model=srv.model, messages=[{"role": "user", "content": _prompt(k, 300)}], max_tokens=tokens,
                stream=True, extra_body={"ignore_eos": True})
            stamps, rid = [], None
            async for chunk in stream:
                rid = chunk.id
                if chunk.choices and chunk.choices[0].delta.content:
                    stamps.append(time.perf_counter())
            return rid, stamps[0] - t0, (stamps[-1] - stamps[0]) / (len(stamps) - 1), len(stamps)

        async def run():
            client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
            # one request first: the client's lazy imports and connection set-up are not a TTFT
            await client.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=1)
            out = await asyncio.gather(*[one(client, k) for k in range(n)])
            await client.close()
            return out

        got = asyncio.run(run())
        sim = {f"chatcmpl-{r['id']}": r for r in httpx.get(srv.url + "/sim/requests").json()["requests"]}
    assert all(g[3] == tokens for g in got)
    client_ttft = statistics.mean(g[1] for g in got) * 1e3 / scale
    client_itl = statistics.mean(g[2] for g in got) * 1e3 / scale
    sim_ttft = statistics.mean(sim[g[0]]["ttft_ms"] for g in got)
    sim_itl = statistics.mean(sim[g[0]]["tpot_ms"] for g in got)
    assert sim_ttft > 500 and sim_itl > 10      # the figures compared are the card's, not zero
    print(f"client TTFT {client_ttft:.1f} ms, card {sim_ttft:.1f} ms; client ITL {client_itl:.2f} ms, card {sim_itl:.2f} ms")
    assert client_ttft == pytest.approx(sim_ttft, rel=0.05), (client_ttft, sim_ttft)
    assert client_itl == pytest.approx(sim_itl, rel=0.05), (client_itl, sim_itl)


@pytest.fixture(scope="module")
def small():
    """A fast server for the protocol tests: a 0.5B model, time 20x faster than the card."""
    with TwinServer(**SMALL, time_scale=0.05, seed=3) as srv:
        yield srv


def test_completion_and_chat_answer_as_openai_documents(small):
    client = openai.OpenAI(base_url=small.base_url, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [small.model]
    prompt = "The train to the coast leaves every morning at seven."
    c = client.completions.create(model=small.model, prompt=prompt, max_tokens=12, extra_body={"ignore_eos": True})
    assert c.object == "text_completion" and c.choices[0].finish_reason == "length"
    assert c.usage.prompt_tokens == twin_text.count_tokens(prompt) == 11   # 10 words and the full stop
    assert c.usage.completion_tokens == 12
    assert c.choices[0].text == twin_text.answer(prompt, 12, seed=3)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]
    r = client.chat.completions.create(model=small.model, messages=msgs, max_tokens=4000)
    rendered = twin_text.render_chat([(m["role"], m["content"]) for m in msgs])
    natural = twin_text.natural_length(rendered, seed=3)
    assert r.usage.completion_tokens == min(natural, 4000)
    assert r.choices[0].finish_reason == ("stop" if natural < 4000 else "length")
    assert r.choices[0].message.content == twin_text.answer(rendered, r.usage.completion_tokens, seed=3)
    # token ids as the prompt; no max_tokens: OpenAI's default of 16 for completions
    c = client.completions.create(model=small.model, prompt=list(range(40)), extra_body={"ignore_eos": True})
    assert c.usage.prompt_tokens == 40 and c.usage.completion_tokens == 16
    stream = client.completions.create(model=small.model, prompt=prompt, max_tokens=5, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == twin_text.answer(prompt, 5, seed=3)
    assert chunks[-1].usage.completion_tokens == 5


def test_metrics_parse_and_carry_vllms_names_and_the_cards(small, caplog):
    client = openai.OpenAI(base_url=small.base_url, api_key="unused", max_retries=0)
    before = _metrics(small)
    with caplog.at_level(logging.INFO, logger="pypto_lab.server"):
        usage = [client.completions.create(model=small.model, prompt=_prompt(k, 50), max_tokens=8,
                                           extra_body={"ignore_eos": True}).usage for k in range(4)]
    after = _metrics(small)
    vllm = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:num_requests_running",
            "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_preemptions",
            "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"]
    card = ["pypto_lab:aicore_busy_ratio", "pypto_lab:hbm_bandwidth_bytes_per_second", "pypto_lab:hbm_used_bytes",
            "pypto_lab:hbm_capacity_bytes", "pypto_lab:kv_cache_used_blocks", "pypto_lab:token_release_lag_seconds"]
    assert not [m for m in vllm + card if m not in after], sorted(after)

    def delta(name, sample):
        return after[name][sample] - before.get(name, {}).get(sample, 0.0)

    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == 32
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usage)
    assert delta("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 4
    assert delta("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 4 * 7
    assert after["vllm:num_requests_running"]["vllm:num_requests_running"] == 0
    assert 0 < after["pypto_lab:aicore_busy_ratio"]["pypto_lab:aicore_busy_ratio"] <= 1
    assert after["pypto_lab:hbm_used_bytes"]["pypto_lab:hbm_used_bytes"] < \
        after["pypto_lab:hbm_capacity_bytes"]["pypto_lab:hbm_capacity_bytes"]
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "pypto_lab.server"]
    done = [e for e in logged if e["event"] == "request_finished"]
    assert len(done) == 4 and all(e["ttft_ms"] > 0 and e["e2e_ms"] >= e["ttft_ms"] for e in done)


def _metrics(srv) -> dict[str, dict[str, float]]:
    """{family: {sample name (unlabelled by model): value}} from /metrics, with the client's parser."""
    text = httpx.get(srv.url + "/metrics").text
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "le" not in s.labels and "finished_reason" not in s.labels:
                out.setdefault(fam.name, {})[s.name] = s.value
        if fam.name == "vllm:request_success":
            out.setdefault(fam.name, {})["total"] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return out


# --- a server that holds ----------------------------------------------------------------------


def test_the_server_binds_loopback_unless_told_otherwise():
    from pypto_lab.cli.commands import build_parser

    args = build_parser().parse_args(["serve", "qwen2-0.5b", "--http", "0"])
    assert args.host == "127.0.0.1"
    srv = TwinServer(**SMALL)
    assert srv.host == "127.0.0.1"


@pytest.mark.parametrize("body, status, param, words", [
    (b'{"model": "qwen2-0.5b", "prompt": "hi", ', 400, None, ["malformed JSON", "Fix"]),
    (b'{"model": "gpt-4", "prompt": "hi"}', 404, "model", ["'gpt-4' does not exist", "qwen2-0.5b"]),
    (b'{"model": "qwen2-0.5b", "prompt": "hi", "max_tokens": 40000}', 400, "max_tokens",
     ["maximum context length is 32768", "40001", "Fix: max_tokens <= 32767"]),
    (b'{"model": "qwen2-0.5b", "prompt": ""}', 400, "prompt", ["empty", "Fix"]),
    (b'{"model": "qwen2-0.5b", "prompt": "hi", "max_tokens": 0}', 400, "max_tokens", ["max_tokens = 0", "Fix"]),
    (b'{"model": "qwen2-0.5b", "prompt": "hi", "n": 2}', 400, "n", ["n = 2", "Fix: n=1"]),
    (b'{"model": "qwen2-0.5b", "prompt": "hi", "max_tokens": "many"}', 400, "max_tokens", ['"many"', "Fix"]),
    (b'{"prompt": "hi"}', 400, "model", ["'model' is required", "Fix"]),
    (b'[1, 2]', 400, None, ["JSON list, not an object", "Fix"]),
    (b'{"model": "qwen2-0.5b", "prompt": ["a", "b"]}', 400, "prompt", ["holds 2 prompts", "Fix"]),
])
def test_bad_completion_requests_get_an_openai_error_body(small, body, status, param, words):
    r = httpx.post(small.url + "/v1/completions", content=body)     # no Content-Type, as curl -d sends it
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    assert all(w in err["message"] for w in words), err["message"]


def test_bad_chat_requests_get_an_openai_error_body(small):
    client = openai.OpenAI(base_url=small.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="messages is empty"):
        client.chat.completions.create(model=small.model, messages=[])
    with pytest.raises(openai.BadRequestError, match="prompt is empty"):
        client.chat.completions.create(model=small.model, messages=[{"role": "user", "content": ""}])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="llama-3-8b", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens <= "):
        client.chat.completions.create(model=small.model, messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=10**6)


def test_a_full_queue_answers_429_and_a_closing_server_503():
    with TwinServer(**SMALL, time_scale=1.0, max_num_seqs=1, max_waiting=2) as srv:
        async def run():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                body = {"model": srv.model, "prompt": "hello there", "max_tokens": 40, "ignore_eos": True}
                return await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(8)])

        rs = asyncio.run(run())
        codes = sorted(r.status_code for r in rs)
        assert set(codes) == {200, 429} and codes.count(429) >= 5, codes
        full = next(r for r in rs if r.status_code == 429)
        assert full.json()["error"]["code"] == "queue_full" and "--max-waiting" in full.json()["error"]["message"]
        assert full.headers["Retry-After"] == "1"
        assert all(r.json()["usage"]["completion_tokens"] == 40 for r in rs if r.status_code == 200)
        srv.engine.stop(drain=True)
        r = httpx.post(srv.url + "/v1/completions", json={"model": srv.model, "prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert httpx.get(srv.url + "/health").status_code == 503


def test_a_client_that_disconnects_mid_stream_frees_its_kv_blocks():
    with TwinServer(**SMALL, time_scale=1.0) as srv:
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
        body = {"model": srv.model, "prompt": _prompt(0, 400), "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=srv.url, timeout=30) as c, c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = [ln for ln in (next(lines) for _ in range(12)) if ln.startswith("data:")]
            assert len(got) >= 5
            state = httpx.get(srv.url + "/sim/card").json()
            assert state["running"] == 1 and state["kv_used_blocks"] >= 4      # 400 + tokens over blocks of 128
        end = time.monotonic() + 10
        while (state := httpx.get(srv.url + "/sim/card").json())["running"] and time.monotonic() < end:
            time.sleep(0.05)
        assert state["running"] == 0 and state["kv_used_blocks"] == 0
        rec = httpx.get(srv.url + "/sim/requests").json()["requests"][-1]
        assert rec["status"] == "cancelled" and 5 <= rec["generated_tokens"] < 3000
        assert "pypto_lab:requests_cancelled_total" in httpx.get(srv.url + "/metrics").text


def test_200_concurrent_streams_lose_and_repeat_no_token():
    n, tokens = 200, 12
    with TwinServer(**SMALL, time_scale=0.02, max_num_seqs=64) as srv:
        async def one(c, k):
            prompt = _prompt(k, 20 + k % 30)
            body = {"model": srv.model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            pieces, usage, done = [], None, False
            async with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    d = json.loads(line[6:])
                    if d["choices"] and d["choices"][0]["finish_reason"] is None:
                        pieces.append(d["choices"][0]["text"])
                    if d.get("usage"):
                        usage = d["usage"]
            return prompt, pieces, usage, done

        async def run():
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
            async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as c:
                return await asyncio.gather(*[one(c, k) for k in range(n)])

        out = asyncio.run(run())
        state = httpx.get(srv.url + "/sim/card").json()
    assert all(done for *_, done in out)
    for prompt, pieces, usage, _ in out:
        assert len(pieces) == tokens and usage["completion_tokens"] == tokens
        assert "".join(pieces) == twin_text.answer(prompt, tokens, seed=0)
    assert state["requests"] == n and state["running"] == 0 and state["kv_used_blocks"] == 0


def test_shutdown_drains_the_running_streams_or_ends_them_with_an_error():
    for drain in (True, False):
        srv = TwinServer(**SMALL, time_scale=1.0, drain=drain).start()
        body = {"model": srv.model, "prompt": "hello", "max_tokens": 300 if drain else 5000, "ignore_eos": True,
                "stream": True}
        with httpx.Client(base_url=srv.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(ln for ln in lines if ln.startswith("data:"))
            assert json.loads(first[6:])["choices"][0]["text"]
            t = time.monotonic()
            import threading

            stopper = threading.Thread(target=srv.stop)
            stopper.start()
            rest = [ln for ln in lines if ln.startswith("data:")]
            stopper.join(60)
        assert not stopper.is_alive() and not srv.engine.alive
        assert rest[-1] == "data: [DONE]"
        if drain:      # every token came, then the end
            texts = [json.loads(ln[6:])["choices"][0]["text"] for ln in rest[:-1]]
            assert len(texts) == 300 and json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        else:          # ended at once, with an error event
            assert "error" in json.loads(rest[-2][6:]) and time.monotonic() - t < 10
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.url + "/health", timeout=2)


def test_cli_serve_http_answers_and_stops_cleanly_on_sigint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "pypto_lab.cli", "serve", "qwen2-0.5b", "--chip", "Ascend910B1",
                             "--http", str(port), "--time-scale", "0.1", "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        c = client.completions.create(model="qwen2-0.5b", prompt="hello", max_tokens=3)
        assert c.usage.completion_tokens == 3
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert "127.0.0.1" in out and proc.returncode in (0, -signal.SIGINT), err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert '"event": "request_finished"' in err and "Application shutdown complete" in err


@pytest.mark.parametrize("argv, words", [
    (["--http", "99999"], ["--http 99999", "0-65535", "Fix"]),
    (["--http", "0", "--time-scale", "0"], ["--time-scale 0.0", "positive", "Fix"]),
])
def test_cli_serve_http_refuses_a_bad_port_or_time_scale(argv, words, capsys):
    from pypto_lab.cli import main

    assert main(["serve", "qwen2-0.5b", *argv]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
