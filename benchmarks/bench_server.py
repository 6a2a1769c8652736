"""The serving twin under a real benchmark client: guidellm drives `pypto_lab.server` closed loop
(a fixed number of concurrent streams) and with Poisson arrivals, and what it measures is set
against offline `pypto_lab.llm.serve()` on the same arrival trace.

For each run: start from an idle server, run ``guidellm run`` (its own processes, OpenAI HTTP
backend, synthetic prompts of ``--prompt`` tokens counted by the MiniLM tokenizer the server also
counts with, ``--output`` tokens with ``ignore_eos``), read guidellm's per-request timings from its
JSON (wall seconds, divided by ``--time-scale`` into the card's seconds), take the arrival time,
prompt and output tokens the server recorded for those same requests (``/sim/requests``), and
serve that trace offline with `serve()`. The table gives mean TTFT, mean inter-token latency (per
request, (last - first token) / (tokens - 1)) and output tokens/s for both, and their difference.

    .venv/bin/python benchmarks/bench_server.py                       # the figures in benchmarks/README.md
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


def compare(srv: TwinServer, bench: dict, args, label: str) -> dict:
    scale = args.time_scale
    reqs = bench["requests"]["successful"]
    recs = {r["id"]: r for r in httpx.get(srv.url + "/sim/requests").json()["requests"]}
    client_ttft, client_itl, ids, toks = [], [], [], 0
    start, end = float("inf"), 0.0
    for r in reqs:
        t = r["info"]["timings"]
        n = int(t["token_iterations"])
        ids.append(int(r["response_id"].split("-")[-1]))
        client_ttft.append((t["first_token_iteration"] - t["request_start"]) / scale * 1e3)
        if n > 1:
            client_itl.append((t["last_token_iteration"] - t["first_token_iteration"]) / (n - 1) / scale * 1e3)
        toks += n
        start, end = min(start, t["request_start"]), max(end, t["last_token_iteration"])
    sim = [recs[i] for i in sorted(ids)]
    t0 = min(r["arrival_s"] for r in sim)
    trace = [(r["prompt_tokens"], r["output_tokens"], r["arrival_s"] - t0) for r in sim]
    off = serve(args.model, chip=args.chip, cards=args.cards, requests=len(trace), lengths=trace, progress=False,
                max_batched_tokens=8192, block_size=128)
    off_ttft = statistics.mean(r.ttft_ms for r in off.records)
    off_itl = statistics.mean(r.tpot_ms for r in off.records if r.output_tokens > 1)
    row = {
        "run": label, "requests": len(reqs), "guidellm_errors": len(bench["requests"].get("errored", [])),
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
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    with TwinServer(args.model, chip=args.chip, cards=args.cards, time_scale=args.time_scale, log_level="error") as srv, \
            tempfile.TemporaryDirectory() as tmp:
        runs = [(f"closed loop, {args.concurrency} streams", f"kind=concurrent,streams={args.concurrency}"),
                (f"Poisson, {args.rate:g} req/s", f"kind=poisson,rate={args.rate / args.time_scale}")]
        for k, (label, profile) in enumerate(runs):
            _idle(srv)
            bench = guidellm(srv, profile, args, Path(tmp) / f"run{k}.json")
            rows.append(compare(srv, bench, args, label))
            lag = [ln for ln in httpx.get(srv.url + "/metrics").text.splitlines()
                   if ln.startswith("pypto_lab:token_release_lag_seconds_sum")]
            rows[-1]["release_lag_s_total"] = float(lag[0].split()[-1]) if lag else None
    print(f"{args.model} on {args.cards} x {args.chip}, time scale {args.time_scale}, {args.requests} requests per run, "
          f"{args.prompt} prompt + {args.output} output tokens (guidellm synthetic, MiniLM tokenizer)")
    print("| run | metric | guidellm (client) | offline serve() | difference |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        for k, name in (("ttft_ms", "mean TTFT ms"), ("itl_ms", "mean ITL ms"), ("output_tokens_per_s", "output tokens/s")):
            print(f"| {r['run']} | {name} | {r['client_' + k]:,.1f} | {r['offline_' + k]:,.1f} | {r['diff_' + k]:+.1%} |")
    if args.json:
        write_json_atomic(args.json, {"args": vars(args), "rows": rows})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
