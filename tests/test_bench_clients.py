"""benchmarks/bench_server.py's readers of the benchmark clients' per-request exports (guidellm's
JSON, aiperf's profile_export files), on small exports written here: neither client runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_server.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_server", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _chunk(server_id: int, content: str | None) -> dict:
    delta = {"role": "assistant", "content": ""} if content is None else {"content": content}
    body = {"id": f"chatcmpl-{server_id}", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return {"perf_ns": 0, "packets": [{"name": "data", "value": json.dumps(body)}]}


def _aiperf_export(folder: Path, records: list[dict], raw: list[dict]) -> Path:
    folder.mkdir()
    (folder / "profile_export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "profile_export_raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    return folder


def _record(xid: str, start_ns: int, end_ns: int, ttft_ms: float, itl_ms: float, osl: int) -> dict:
    return {"metadata": {"x_request_id": xid, "request_start_ns": start_ns, "request_end_ns": end_ns,
                         "benchmark_phase": "profiling"},
            "metrics": {"time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                        "inter_token_latency": {"value": itl_ms, "unit": "ms"},
                        "output_sequence_length": {"value": osl, "unit": "tokens"}}}


def test_aiperf_records_carry_the_server_ids_and_seconds(bench, tmp_path):
    records = [_record("a", 2_000_000_000, 5_000_000_000, 400.0, 40.0, 64),
               _record("b", 1_000_000_000, 4_000_000_000, 100.0, 30.0, 1),
               {"metadata": {"x_request_id": "c", "benchmark_phase": "profiling"}, "metrics": {},
                "error": {"code": 500, "message": "boom"}}]
    raw = [{"metadata": {"x_request_id": "a"}, "responses": [_chunk(7, None), _chunk(7, "x"),
                                                             {"perf_ns": 1, "packets": [{"name": "data", "value": "[DONE]"}]}]},
           {"metadata": {"x_request_id": "b"}, "responses": [_chunk(3, "y")]},
           {"metadata": {"x_request_id": "c"}, "responses": []}]
    reqs, errors = bench.aiperf_requests(_aiperf_export(tmp_path / "run", records, raw))
    assert errors == 1
    assert [r["id"] for r in reqs] == [7, 3]
    a = reqs[0]
    assert (a["start_s"], a["end_s"], a["output_tokens"]) == (2.0, 5.0, 64)
    assert a["ttft_s"] == pytest.approx(0.4) and a["itl_s"] == pytest.approx(0.04)


def test_aiperf_record_without_a_server_id_names_the_fix(bench, tmp_path):
    folder = _aiperf_export(tmp_path / "run", [_record("a", 0, 1, 1.0, 1.0, 2)],
                            [{"metadata": {"x_request_id": "a"}, "responses": []}])
    with pytest.raises(ValueError, match="--export-level raw"):
        bench.aiperf_requests(folder)


def test_guidellm_requests_give_ttft_and_itl_per_request(bench):
    timing = {"request_start": 10.0, "first_token_iteration": 10.5, "last_token_iteration": 12.5, "token_iterations": 5}
    doc = {"requests": {"successful": [{"response_id": "chatcmpl-12", "info": {"timings": timing}}],
                        "errored": [{}, {}]}}
    reqs, errors = bench.guidellm_requests(doc)
    assert errors == 2
    assert reqs == [{"id": 12, "start_s": 10.0, "end_s": 12.5, "ttft_s": 0.5, "itl_s": 0.5, "output_tokens": 5}]


def test_a_missing_aiperf_executable_says_how_to_install_it(bench, tmp_path):
    args = SimpleNamespace(aiperf=str(tmp_path / "no-such-aiperf"), prompt=8, output=4, requests=2,
                           aiperf_server_metrics=False)
    srv = SimpleNamespace(model="m", url="http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match="venv of its own"):
        bench.aiperf(srv, ["--concurrency", "1"], args, tmp_path / "out")
