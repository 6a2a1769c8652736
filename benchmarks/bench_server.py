"""The serving twin under a real benchmark client: guidellm (default) or aiperf drives
`pypto_lab.server` closed loop (a fixed number of concurrent streams) and with Poisson arrivals,
and what it measures is set against offline `pypto_lab.llm.serve()` on the same arrival trace.

For each run: start from an idle server, run the client (its own processes, OpenAI chat
completions streamed, synthetic prompts of ``--prompt`` tokens counted by the MiniLM tokenizer the
server also counts with, ``--output`` tokens with ``ignore_eos``), read its per-request timings
(guidellm's JSON; aiperf's ``profile_export.jsonl``, its own TTFT and ITL, with the server's
request ids from ``profile_export_raw.jsonl``), divide wall seconds by ``--time-scale`` into the
card's seconds, take the arrival time, prompt and output tokens the server recorded for those same
requests (``/sim/requests``), and serve that trace offline with `serve()`. The table gives mean
TTFT, mean inter-token latency (per request, (last - first token) / (tokens - 1)) and output
tokens/s for both, and their difference.

aiperf's pins conflict with the project's venv (rich~=14.1 against import-linter's rich>=14.2,
huggingface-hub<2 against transformers'), so it lives in a venv of its own, passed as ``--aiperf``.

    .venv/bin/python benchmarks/bench_server.py                       # the figures in benchmarks/README.md
    .venv/bin/python benchmarks/bench_server.py --client aiperf --aiperf /tmp/aiperf-venv/bin/aiperf
    .venv/bin/python benchmarks/bench_server.py --model llama-3-8b --cards 1 --time-scale 3 --json out/b.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pypto_lab.files import write_json_atomic  # noqa: E402
from pypto_lab.llm import serve  # noqa: E402
from pypto_lab.server import TwinServer  # noqa: E402
from pypto_lab.server.text import tokenizer_dir  # noqa: E402


def _idle(srv: TwinServer, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = httpx.get(srv.url + "/sim/card").json()
        if s["running"] == 0 and s["waiting"] == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("the server did not become idle")


def guidellm(srv: TwinServer, profile: str, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "guidellm", "run",
           "--backend", f"kind=openai_http,target={srv.url},model={srv.model}",
           "--profile", profile,
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt},output_tokens={args.output}",
           "--tokenizer", f"kind=hf_auto,model={tokenizer_dir()}",
           "--constraint", f"kind=max_requests,count={args.requests}",
           "--output", f"kind=json,path={out}", "--disable-console"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode:
        raise RuntimeError(f"guidellm failed ({run.returncode}): {run.stderr[-3000:]}")
    return json.loads(out.read_text())["benchmarks"][0]


def guidellm_requests(bench: dict) -> tuple[list[dict], int]:
    """guidellm's successful requests as client records (wall seconds) and its error count."""
    reqs = []
    for r in bench["requests"]["successful"]:
        t = r["info"]["timings"]
        n = int(t["token_iterations"])
        reqs.append({"id": int(r["response_id"].split("-")[-1]), "start_s": t["request_start"],
                     "end_s": t["last_token_iteration"], "ttft_s": t["first_token_iteration"] - t["request_start"],
                     "itl_s": (t["last_token_iteration"] - t["first_token_iteration"]) / (n - 1) if n > 1 else None,
                     "output_tokens": n})
    return reqs, len(bench["requests"].get("errored", []))


def aiperf(srv: TwinServer, load: list[str], args, out: Path) -> Path:
    """``aiperf profile`` against the twin (``load``: its timing options); returns its artifact folder."""
    cmd = [args.aiperf, "profile", "--model", srv.model, "--url", srv.url,
           "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer_dir()),
           "--isl", str(args.prompt), "--isl-stddev", "0", "--osl", str(args.output), "--osl-stddev", "0",
           "--extra-inputs", "ignore_eos:true", *load, "--request-count", str(args.requests),
           "--random-seed", "1", "--ui", "none", "--wait-for-model-timeout", "0",
           "--export-level", "raw", "--artifact-dir", str(out)]
    if not args.aiperf_server_metrics:      # as guidellm: nothing but the benchmark's requests reaches the twin
        cmd.append("--no-server-metrics")
    # aiperf 0.13 in offline mode looks a local tokenizer folder up as a hub snapshot and fails;
    # online it loads the folder directly (no download: the tokenizer is the package's files)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    except FileNotFoundError:
        raise RuntimeError(f"the aiperf executable {args.aiperf!r} was not found. Fix: install aiperf in a venv of "
                           "its own (see benchmarks/README.md) and pass --aiperf /path/to/venv/bin/aiperf") from None
    if run.returncode:
        raise RuntimeError(f"aiperf failed ({run.returncode}): {(run.stdout + run.stderr)[-3000:]}")
    return out


def aiperf_requests(folder: Path) -> tuple[list[dict], int]:
    """aiperf's per-request records (``profile_export.jsonl``: its own TTFT, ITL and output tokens)
    as client records (wall seconds) and its error count; the server's request id is read from
    the chunks of the same request in ``profile_export_raw.jsonl``."""
    ids = {}
    for line in (folder / "profile_export_raw.jsonl").read_text().splitlines():
        raw = json.loads(line)
        for resp in raw.get("responses") or []:
            chunk = next((p["value"] for p in resp.get("packets", []) if p["value"].startswith("{")), None)
            if chunk:
                ids[raw["metadata"]["x_request_id"]] = int(json.loads(chunk)["id"].split("-")[-1])
                break
    reqs, errors = [], 0
    for line in (folder / "profile_export.jsonl").read_text().splitlines():
        r = json.loads(line)
        meta, m = r["metadata"], r.get("metrics") or {}
        if r.get("error") or meta.get("benchmark_phase") != "profiling" or "time_to_first_token" not in m:
            errors += 1
            continue
        if meta["x_request_id"] not in ids:
            raise ValueError(f"aiperf's record of request {meta['x_request_id']} has no response chunk carrying the "
                             f"server's id in {folder / 'profile_export_raw.jsonl'}. Fix: run aiperf with "
                             "--export-level raw (the script does) and keep both files of the same run")
        itl = m.get("inter_token_latency")
        reqs.append({"id": ids[meta["x_request_id"]], "start_s": meta["request_start_ns"] / 1e9,
                     "end_s": meta["request_end_ns"] / 1e9, "ttft_s": m["time_to_first_token"]["value"] / 1e3,
                     "itl_s": itl["value"] / 1e3 if itl else None,
                     "output_tokens": int(m["output_sequence_length"]["value"])})
    return reqs, errors


def compare(srv: TwinServer, reqs: list[dict], errors: int, args, label: str) -> dict:
    """One run's client figures (``reqs``: wall seconds) against offline `serve()` of the trace the
    server recorded for those requests."""
    scale = args.time_scale
    recs = {r["id"]: r for r in httpx.get(srv.url + "/sim/requests").json()["requests"]}
    client_ttft = [r["ttft_s"] / scale * 1e3 for r in reqs]
    client_itl = [r["itl_s"] / scale * 1e3 for r in reqs if r["itl_s"] is not None]
    toks = sum(r["output_tokens"] for r in reqs)
    start, end = min(r["start_s"] for r in reqs), max(r["end_s"] for r in reqs)
    sim = [recs[i] for i in sorted(r["id"] for r in reqs)]
    t0 = min(r["arrival_s"] for r in sim)
    trace = [(r["prompt_tokens"], r["output_tokens"], r["arrival_s"] - t0) for r in sim]
    off = serve(args.model, chip=args.chip, cards=args.cards, requests=len(trace), lengths=trace, progress=False,
                max_batched_tokens=8192, block_size=128)
    off_ttft = statistics.mean(r.ttft_ms for r in off.records)
    off_itl = statistics.mean(r.tpot_ms for r in off.records if r.output_tokens > 1)
    row = {
        "run": label, "requests": len(reqs), "client_errors": errors,
        "client_ttft_ms": statistics.mean(client_ttft), "offline_ttft_ms": off_ttft,
        "client_itl_ms": statistics.mean(client_itl), "offline_itl_ms": off_itl,
        "client_output_tokens_per_s": toks / ((end - start) / scale), "offline_output_tokens_per_s": off.output_tokens_per_s,
        "server_ttft_ms": statistics.mean(r["ttft_ms"] for r in sim),
        "server_itl_ms": statistics.mean(r["tpot_ms"] for r in sim if r["tpot_ms"] is not None),
        "mean_prompt_tokens": statistics.mean(r["prompt_tokens"] for r in sim),
        "preemptions": off.preemptions,
    }
    for k in ("ttft_ms", "itl_ms", "output_tokens_per_s"):
        row[f"diff_{k}"] = row[f"client_{k}"] / row[f"offline_{k}"] - 1
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--chip", default="Ascend910B1")
    ap.add_argument("--cards", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=4.0, help="wall s per simulated s (default 4)")
    ap.add_argument("--concurrency", type=int, default=16, help="closed loop: streams in flight (default 16)")
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson: simulated requests/s (default 4)")
    ap.add_argument("--requests", type=int, default=64, help="requests per run (default 64)")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens (default 256)")
    ap.add_argument("--output", type=int, default=64, help="output tokens (default 64)")
    ap.add_argument("--client", choices=("guidellm", "aiperf"), default="guidellm",
                    help="the benchmark client (default guidellm)")
    ap.add_argument("--aiperf", default="aiperf",
                    help="the aiperf executable (default: aiperf on PATH; it lives in a venv of its own)")
    ap.add_argument("--aiperf-server-metrics", action="store_true",
                    help="let aiperf scrape the twin's /metrics during the run (its default; off here)")
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    with TwinServer(args.model, chip=args.chip, cards=args.cards, time_scale=args.time_scale, log_level="error") as srv, \
            tempfile.TemporaryDirectory() as tmp:
        closed, poisson = f"closed loop, {args.concurrency} streams", f"Poisson, {args.rate:g} req/s"
        if args.client == "guidellm":
            runs = [(closed, f"kind=concurrent,streams={args.concurrency}"),
                    (poisson, f"kind=poisson,rate={args.rate / args.time_scale}")]
        else:
            runs = [(closed, ["--concurrency", str(args.concurrency)]),
                    (poisson, ["--request-rate", str(args.rate / args.time_scale), "--arrival-pattern", "poisson"])]
        for k, (label, load) in enumerate(runs):
            _idle(srv)
            if args.client == "guidellm":
                reqs, errors = guidellm_requests(guidellm(srv, load, args, Path(tmp) / f"run{k}.json"))
            else:
                reqs, errors = aiperf_requests(aiperf(srv, load, args, Path(tmp) / f"run{k}"))
            rows.append(compare(srv, reqs, errors, args, label))
            lag = [ln for ln in httpx.get(srv.url + "/metrics").text.splitlines()
                   if ln.startswith("pypto_lab:token_release_lag_seconds_sum")]
            rows[-1]["release_lag_s_total"] = float(lag[0].split()[-1]) if lag else None
    print(f"{args.model} on {args.cards} x {args.chip}, time scale {args.time_scale}, {args.requests} requests per run, "
          f"{args.prompt} prompt + {args.output} output tokens ({args.client} synthetic, MiniLM tokenizer)")
    print(f"| run | metric | {args.client} (client) | offline serve() | difference |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        for k, name in (("ttft_ms", "mean TTFT ms"), ("itl_ms", "mean ITL ms"), ("output_tokens_per_s", "output tokens/s")):
            print(f"| {r['run']} | {name} | {r['client_' + k]:,.1f} | {r['offline_' + k]:,.1f} | {r['diff_' + k]:+.1%} |")
    print("client errors:", [r["client_errors"] for r in rows], "preemptions:", [r["preemptions"] for r in rows],
          "server mean TTFT / ITL ms:", [(round(r["server_ttft_ms"], 2), round(r["server_itl_ms"], 2)) for r in rows],
          "release lag s:", [r["release_lag_s_total"] for r in rows])
    if args.json:
        write_json_atomic(args.json, {"args": vars(args), "rows": rows})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
