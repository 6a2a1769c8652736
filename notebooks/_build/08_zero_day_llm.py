"""Generates notebooks/08_zero_day_llm.ipynb (run: .venv/bin/python notebooks/_build/08_zero_day_llm.py).

Part 1 (this file's cells down to PART2_CELLS): a new MoE architecture on the simulated Ascend the
day it appears: optimize, how its router runs as a chain of small kernels, the router written as a pto kernel, plugged in with
custom_op, the report before and after. Part 2 goes in PART2_CELLS at the end (prefill and decode,
serving, HBM); the generator appends it after part 1. Part 3 (after PART2_CELLS): DeepSeek-V3.2,
Qwen3-Next and GLM-4.5 decoding with their own pto kernels plugged into the engine's step.
"""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 08 · A 0-day LLM: a new architecture on Ascend the day it is published

The second seed article (`shared/seeds/004_*`, summarised in `shared/seeds/README.md`) tells how
Ant Group's **Ling** MoE model ran on Ascend on the day it was released ("0 Day" support), and
credits CANN **PyPTO**: a new model brings operators no library has yet, and PyPTO lets you write
them in Python instead of waiting for them.

This notebook replays that day on the simulator, with a small model that is new in the same way as
Ling is, `pypto_lab.llm.ling_like`:

1. run the new model through `pypto_lab.optimize` and read how the NPU runs it: its new piece, a
   **group-limited top-k router**, becomes a chain of a dozen small kernels per layer (an op the
   lowering table did not know would be named as a **CPU fallback**);
2. write the router as one `pypto_lab.pto` kernel and check it against torch;
3. plug it in with `custom_op(npu_func=kernel)` and read the report again: the router is one kernel
   whose time is its own simulation, and the model's time follows;
4. tune the kernel the way you would on day 1, and check that the model still computes what it
   computed before.

Every figure is computed by the simulator or measured by this notebook; none is typed in.
""")

code("""
%matplotlib inline
import inspect

import matplotlib.pyplot as plt
import torch

import pypto_lab
from pypto_lab.llm.ling_like import LingLikeConfig, LingLikeForCausalLM, group_limited_topk
from pypto_lab.llm.ling_like_kernels import gating_kernel, gating_op_name, use_plain_gating, use_pto_gating

CHIP, LEVEL, PRECISION = "Ascend910B1", 2, "bf16"   # Ling ships in bf16
""")

# ---------------------------------------------------------------- the model
md("""
## 1 · The new model

`LingLikeForCausalLM` is a decoder written in plain PyTorch, with what makes Ling-style MoE models
new:

| part | what it does |
|---|---|
| **sigmoid router, group-limited top-k** | one sigmoid score per expert; the experts are split into groups; a group is worth its best score; only the best `topk_group` groups stay eligible; the best `top_k` experts among them are chosen |
| **routing bias** | a per-expert correction (what aux-loss-free load balancing trains) is added to the scores **for the choice only**; the weights are the unbiased scores of the chosen experts, renormalised to 1 and scaled by `routed_scaling` |
| **shared expert** | a SwiGLU that every token goes through, beside the routed experts |
| **QK-norm** | RMSNorm on each head of q and k before RoPE |
| GQA, RoPE, RMSNorm, SwiGLU experts | the familiar parts |

To capture with `torch.export` the model keeps every shape static: the experts are computed
**densely** (every expert on every token, one batched matmul over the stacked expert weights) and
weighted by a `[tokens, experts]` matrix holding each token's routing weights at its chosen experts.
A tiny model can afford that; a serving stack would dispatch the tokens instead.
""")

code("""
cfg = LingLikeConfig()
model = LingLikeForCausalLM(cfg).eval()        # weights drawn from cfg.seed: the same every run
ids = torch.randint(0, cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
print(cfg)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; "
      f"{cfg.experts} experts in {cfg.expert_groups} groups of {cfg.group_size}, top-{cfg.top_k} of the best "
      f"{cfg.topk_group} groups, {cfg.shared_experts} shared expert")
with torch.no_grad():
    logits = model(ids)
print("input_ids", list(ids.shape), "-> logits", list(logits.shape))
""")

md("""
What the router does to a few tokens of layer 0: the group values (each group's best biased score),
the groups kept, and the experts chosen with their weights. Every chosen expert belongs to a kept
group, even when an expert of another group scores higher:
""")

code("""
gate0 = model.layers[0].moe.gate
seen = {}
hook = gate0.register_forward_pre_hook(lambda mod, args: seen.setdefault("x", args[0]))
with torch.no_grad():
    model(ids)
hook.remove()
router_logits = (seen["x"] @ gate0.weight.t()).detach()        # [tokens, experts], what the router sees
weights, chosen = group_limited_topk(router_logits, gate0.bias, cfg.expert_groups, cfg.topk_group,
                                     cfg.top_k, cfg.routed_scaling)
biased = torch.sigmoid(router_logits) + gate0.bias
group_value = biased.view(-1, cfg.expert_groups, cfg.group_size).amax(-1)
for t in range(4):
    kept = sorted(torch.topk(group_value[t], cfg.topk_group).indices.tolist())
    best_anywhere = torch.topk(biased[t], cfg.top_k).indices.tolist()
    pairs = ", ".join(f"e{e} (g{e // cfg.group_size}) {w:.2f}" for e, w in zip(chosen[t].tolist(), weights[t].tolist()))
    print(f"token {t}: group values {[round(v, 3) for v in group_value[t].tolist()]} keep {kept} -> {pairs};"
          f" without the group limit: {sorted(best_anywhere)}")
""")

# ---------------------------------------------------------------- optimize
md("""
## 2 · Day 0: optimize the new model, read its kernels

`optimize` captures the model, maps each ATen op to an NPU kernel from its lowering table and
costs every kernel on the chip. An op the table does not know **falls back to the CPU**: it runs
on the host, and the report lists it. This model has none:
""")

code("""
before_om = pypto_lab.optimize(model, ids, chip=CHIP, level=LEVEL, precision=PRECISION)
before = before_om.report()
print(before.table(top=8))
""")

code("""
# NBVAL_CHECK_OUTPUT
print("CPU fallbacks:", before.fallback_ops)
for k in before.kernels:
    if k.unit == "cpu":
        print(f"  {k.name:32s} on the host")
""")

md("""
Everything maps (attention to a fused FlashAttention kernel, the experts to batched matmuls,
QK-norm and RMSNorm to Vector kernels, both **top-k's of the router** — the best groups, then the
best experts — to CANN's TopKV2). But the router, written in torch, is a chain of small kernels
(sigmoid, add, max over groups, top-k, fill, scatter, select, top-k, gather, sum, divide), each a
separate launch that writes its result to GM for the next:
""")

code("""
def router_kernels(report, layer=0):
    return [k for k in report.kernels if k.name.endswith(f"layers.{layer}.moe.gate")]

for k in router_kernels(before):
    print(f"{k.name:40s} {k.unit:7s} {k.time_us:6.2f} us")
print(f"router of layer 0: {len(router_kernels(before))} kernels, "
      f"{sum(k.time_us for k in router_kernels(before)):.2f} us in sum")
""")

# ---------------------------------------------------------------- the kernel
md("""
## 3 · Write the router as a pto kernel

`pypto_lab.llm.ling_like_kernels.gating_kernel(cfg)` is the whole router in one `pypto_lab.pto`
kernel (the approach of `examples/kernels/moe_gating_topk.py`, adapted to this model: any token
count, the routing scale, the run's GM dtype in and out with the router math in fp32, as Ling's
own router computes). It takes the router logits and the bias, and writes the weights and the
expert ids:
""")

code("""
print(inspect.getsource(gating_kernel))
""")

md("""
Run on the router logits of layer 0 in bf16, it chooses the experts torch chooses (compared as sets:
the order inside a token's top-k does not matter) with weights equal within bf16 rounding:
""")

code("""
kernel = gating_kernel(cfg)
T = router_logits.shape[0]
w_pto = torch.empty(T, cfg.top_k, dtype=torch.bfloat16)
ids_pto = torch.empty(T, cfg.top_k, dtype=torch.int32)
kernel(router_logits.bfloat16(), gate0.bias.bfloat16(), w_pto, ids_pto)

ref_w, ref_ids = group_limited_topk(router_logits.bfloat16().float(), gate0.bias.bfloat16().float(),
                                    cfg.expert_groups, cfg.topk_group, cfg.top_k, cfg.routed_scaling)
order, ref_order = ids_pto.long().argsort(-1), ref_ids.argsort(-1)
same_experts = torch.equal(ids_pto.long().gather(1, order), ref_ids.gather(1, ref_order))
w_err = float((w_pto.float().gather(1, order) - ref_w.gather(1, ref_order)).abs().max())
""")

code("""
# NBVAL_CHECK_OUTPUT
print(f"experts chosen: {'the same as torch' if same_experts else 'DIFFERENT from torch'} for all {T} tokens")
print(f"weights within bf16 rounding (|diff| <= 1e-2): {w_err <= 1e-2}")
""")

code("""
run = kernel.last_run
print(f"max |weight - torch| = {w_err:.1e}")
print(run)
for grp in run.groups:
    print(f"  step {grp['group']:2d}: {grp['kind']:7s} {grp['ops']:20s} {grp['tasks']} task(s) on {grp['cores']} core(s)")
""")

md("""
The kernel is a chain of steps, each on the results of the one before: the router's work is tiny
(64 tokens × 16 experts), so its time is the chain's latency, not HBM or the Vector unit. With all
64 tokens in one tile, each step is one task on one core.
""")

# ---------------------------------------------------------------- plug it in
md("""
## 4 · Plug it in: `custom_op(npu_func=kernel)`

`use_pto_gating(model, kernel)` registers the router as a custom operator,
`custom_op(npu_func=kernel)` with `group_limited_topk` as its torch reference, and makes every
layer's gate call it. Outside `optimize` the op runs its reference, so the model computes exactly
what it computed before:
""")

code("""
# NBVAL_CHECK_OUTPUT
with torch.no_grad():
    plain_logits = model(ids)
    use_pto_gating(model, kernel)
    print("eager output unchanged:", torch.equal(model(ids), plain_logits))
""")

code("""
after_om = pypto_lab.optimize(model, ids, chip=CHIP, level=LEVEL, precision=PRECISION)
after = after_om.report()
print(after.table(top=8))
""")

code("""
# NBVAL_CHECK_OUTPUT
print("CPU fallbacks:", after.fallback_ops)
print("router of layer 0:", [f"{k.name} ({k.unit}, {k.spec.kind})" for k in router_kernels(after)])
""")

code("""
gate_entry = next(k for k in after.kernels if k.name.startswith(gating_op_name(cfg)))
print(f"report:  {gate_entry.name}: {gate_entry.cycles:,.0f} cycles, {gate_entry.time_us:.2f} us")
print(f"by hand: {run}")
print(f"router of layer 0: {sum(k.time_us for k in router_kernels(before)):.2f} us in "
      f"{len(router_kernels(before))} kernels -> {sum(k.time_us for k in router_kernels(after)):.2f} us in "
      f"{len(router_kernels(after))} (the gate's logits matmul, then the pto kernel)")
print(f"model: {before.latency_us:.1f} us -> {after.latency_us:.1f} us, "
      f"{len(before.kernels)} -> {len(after.kernels)} kernels")
""")

md("""
The router is one kernel per layer, whose report entry is the kernel's own simulated run at the
model's shapes in bf16 (the same cycles as the run by hand above). Whether the model got faster is
the simulator's answer, not ours: one chain of 14 one-core steps against a dozen small launches
with their round trips through GM. Day 0 is about running correctly on the NPU; day 1
is tuning.
""")

# ---------------------------------------------------------------- tune
md("""
## 5 · Day 1: tune the kernel, watch the model

Each step of the kernel ran as one task on one core. `rows_per_tile` cuts the 64 tokens into tiles
of that many rows, so each step spreads over more Vector cores. The model's figure follows the
kernel's:
""")

code("""
sweep = {}
for rows in (None, 16, 8, 4):
    k_rows = gating_kernel(cfg, rows_per_tile=rows)
    rep = pypto_lab.optimize(use_pto_gating(model, k_rows), ids, chip=CHIP, level=LEVEL,
                             precision=PRECISION).report()
    entry = next(k for k in rep.kernels if k.name.startswith(gating_op_name(cfg)))
    sweep[rows] = (k_rows, rep)
    print(f"rows per tile {str(rows or T):>3s}: router kernel {entry.time_us:5.2f} us on "
          f"{entry.reports[0].cores_used:2d} cores, model {rep.latency_us:5.1f} us")
best_rows = min(sweep, key=lambda r: sweep[r][1].latency_us)
tuned_kernel, tuned = sweep[best_rows]
use_pto_gating(model, tuned_kernel)
print(f"fastest: {best_rows or T} rows per tile; model {before.latency_us:.1f} us (torch router, "
      f"{len(router_kernels(before))} kernels) "
      f"-> {after.latency_us:.1f} us (pto, one tile) -> {tuned.latency_us:.1f} us (pto, tuned)")
""")

md("""
The slowest kernels of the three reports side by side (the router's kernels in orange), and on the
right the router of layer 0 as a whole: the sum of its kernels' simulated times.

What the pto kernel removes in these figures is the dozen launches and the GM round trips
between the router's steps; the tuning shortens each step of its chain:
""")

code("""
def slowest(report, n=8):
    return sorted(report.kernels, key=lambda k: -k.time_us)[:n]

def label(k):
    op, where = k.name.split(":")[0], k.name.split(":")[-1].removeprefix("layers.")
    return ("router (pto)" if op == gating_op_name(cfg) else op) + " · " + where

reports = {"torch router": before, "pto router, one tile": after,
           f"pto router, {best_rows or T} rows per tile": tuned}
fig, axes = plt.subplots(1, 4, figsize=(17, 3.6), gridspec_kw={"width_ratios": [3, 3, 3, 2]})
for ax, (title, rep) in zip(axes, reports.items()):
    ks = slowest(rep)[::-1]
    ax.barh([label(k) for k in ks], [k.time_us for k in ks],
            color=["tab:orange" if ".moe.gate" in k.name else "tab:blue" for k in ks])
    ax.set_title(f"{title}\\nmodel {rep.latency_us:.1f} us, {len(rep.kernels)} kernels", fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("simulated time (us)")
    ax.set_xlim(0, max(k.time_us for r in reports.values() for k in r.kernels) * 1.05)
router = [sum(k.time_us for k in router_kernels(r)) for r in reports.values()]
n_router = [len(router_kernels(r)) for r in reports.values()]
bars = axes[3].bar(["torch", "pto\\n1 tile", f"pto\\n{best_rows or T} rows"], router, color="tab:orange")
axes[3].bar_label(bars, [f"{n} kernels" for n in n_router], fontsize=7)
axes[3].set_title("router of layer 0\\n(sum of its kernels)", fontsize=9)
axes[3].set_ylabel("simulated time (us)")
fig.tight_layout()
""")

# ---------------------------------------------------------------- numerics
md("""
## 6 · Same model, same experts

`optimized(ids)` computes with the pto kernel's own arithmetic. Routing is discontinuous: a score
rounded differently can swap an expert, and the token's output then moves a lot. So the exact check
is made in fp32, where both runs see the same numbers: the plain model (top-k on the host) and the
pto model choose the same experts in every layer, and their logits agree.
""")

code("""
def routed_experts(om, pto):
    \"\"\"The expert ids each layer chose in a run of ``om`` (read from the run's recorded nodes).\"\"\"
    record = {}
    om.runtime.run((ids,), record=record)
    if pto:
        keys = [n for n in record if n.startswith(gating_op_name(cfg))]
        return [record[n][1].long().sort(-1).values for n in sorted(keys)], record
    keys = [n for n in record if n.startswith("topk")][1::2]          # per layer: the groups', then the experts'
    return [record[n][1].sort(-1).values for n in keys], record

pto_fp32 = pypto_lab.optimize(model, ids, chip=CHIP, level=LEVEL, precision="fp32")
plain_fp32 = pypto_lab.optimize(use_plain_gating(model), ids, chip=CHIP, level=LEVEL, precision="fp32")
use_pto_gating(model, tuned_kernel)
e_pto, _ = routed_experts(pto_fp32, pto=True)
e_plain, _ = routed_experts(plain_fp32, pto=False)
out_pto, out_plain = pto_fp32(ids), plain_fp32(ids)
""")

code("""
# NBVAL_CHECK_OUTPUT
for layer, (a, b) in enumerate(zip(e_pto, e_plain)):
    print(f"layer {layer}: the same experts for {int((a == b).all(-1).sum())} of {a.shape[0]} tokens")
print("logits within 1e-4:", torch.allclose(out_pto, out_plain, atol=1e-4, rtol=1e-4))
""")

code("""
print(f"max |logit difference| in fp32: {float((out_pto - out_plain).abs().max()):.1e} "
      f"(logits up to {float(out_plain.abs().max()):.1f})")
""")

md("""
## Part 1 in short

* A new architecture ran through `optimize` unchanged; the report showed its new router as a chain
  of a dozen small kernels per layer.
* The router became one `pypto_lab.pto` kernel, checked against torch, and `custom_op(npu_func=...)`
  made it a model component: its report entry is its own simulation, and the model's latency
  follows the kernel's.
* Tuning the kernel is one argument, and the model's figure answers.
""")


# ---------------------------------------------------------------- part 2
# Part 2 (prefill and decode timing, serving, HBM) is appended here. Entries are ("md", text) or
# ("code", text) pairs, added to the notebook in order after part 1. Part 1 leaves defined: cfg,
# model (routing through the tuned pto kernel, tuned_kernel), ids, CHIP, LEVEL, PRECISION, and the
# reports before, after, tuned.
PART2_CELLS: list[tuple[str, str]] = [
    ("md", """
# Part 2 · Sizing the deployment: first token, next tokens, HBM, batching, cards

Day 0 is also the day users ask the questions of the seed's section 3: does the model fit in HBM,
what is the largest batch, how fast come the first token and each next one, and what do batching,
more cards and a serving scheduler buy. `pypto_lab.llm` answers them for the same architecture at
a deployable size, from its shapes alone (no weights are allocated):

* `simulate_generation(model, batch, prompt_len, output_len, chip, cards)`: the prefill (the time
  to the first token, **TTFT**) and every decode step (the time per output token, **TPOT**), each a
  sequence of CANN kernels (RmsNorm, RoPE, PromptFlashAttention / IncreFlashAttention,
  MoeGatingTopK, GroupedMatmul, ...) simulated on the chip;
* `serve(model, chip, requests, rate)`: requests arriving at random, batched continuously.

The model below keeps part 1's mechanisms (sigmoid router, groups, a shared expert, QK-norm) at
about 15 B parameters. Its sizes are our choice for the lesson, not a published config.
"""),
    ("code", """
from dataclasses import replace
from pypto_lab import llm
from pypto_lab.files.progress import progress

spec = llm.LLMSpec(
    name="ling-like-15b", vocab=126464, hidden=2048, layers=28, heads=16, kv_heads=4, head_dim=128,
    intermediate=5632, qk_norm=True, max_positions=32768,
    experts=64, top_k=6, expert_intermediate=1408, shared_experts=2, shared_intermediate=1408,
    expert_groups=8, topk_groups=4, router="sigmoid", dense_layers=1)
active = spec.weight_params() - spec.moe_layers * (spec.experts - spec.top_k) * 3 * spec.hidden * spec.expert_intermediate
print(f"{spec.name}: {spec.weight_params() / 1e9:.1f} B parameters, {active / 1e9:.1f} B active per token")
"""),
    ("code", """
# NBVAL_IGNORE_OUTPUT
r = llm.simulate_generation(spec, batch=1, prompt_len=2048, output_len=512, chip=CHIP, precision="bf16")
print(r.table())
"""),
    ("md", """
### Why decode is memory-bound

The prefill pushes 2,048 tokens through every weight at once: the Cube is busy. A decode step
pushes **one** token per sequence, yet must still read every weight it uses (and the whole KV cache)
from HBM. The roofline line above says it: the step does a few flops per byte read, far below the
chip's ridge point (its peak flops divided by its HBM bandwidth), so its time is bytes / bandwidth.
For an MoE, only the experts the batch's tokens chose are read, which is why MoE decode is cheap at
batch 1 and grows as the batch touches more experts.
"""),
    ("code", """
ro = r.roofline
print(f"decode step at context {ro['context']}: {ro['intensity']:.1f} flop/byte against a ridge of "
      f"{ro['ridge']:.0f}; HBM {ro['hbm_fraction']:.0%} busy, Cube {ro['cube_fraction']:.1%} busy")
"""),
    ("md", """
### Batching: more tokens per weight read, until the KV cache fills HBM

Decoding a batch reads the weights once for all its sequences, so tokens per second rise almost
in proportion to the batch. Each sequence brings its own KV cache, though, and the step grows with
the bytes of KV it reads; when weights + KV + activations exceed the card, the engine raises
`HBMCapacityError` and says which batch would fit.
"""),
    ("code", """
PROMPT, OUTPUT = 2048, 512
best = llm.largest_batch(spec, llm.hardware(CHIP, precision="bf16"), PROMPT + OUTPUT, PROMPT)
batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= best} | {best})
rows = [llm.simulate_generation(spec, batch=b, prompt_len=PROMPT, output_len=OUTPUT, chip=CHIP, precision="bf16")
        for b in progress(batches, desc="batch sizes", delay=2)]
try:
    llm.simulate_generation(spec, batch=best + 1, prompt_len=PROMPT, output_len=OUTPUT, chip=CHIP, precision="bf16")
except llm.HBMCapacityError as e:
    print("batch", best + 1, "->", type(e).__name__ + ":", str(e)[:260], "...")
fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
ax[0].plot(batches, [x.tpot_ms for x in rows], "o-"); ax[0].set(xscale="log", xlabel="batch", ylabel="TPOT (ms)")
ax[1].plot(batches, [x.decode_tokens_per_s for x in rows], "o-", color="C1")
ax[1].set(xscale="log", xlabel="batch", ylabel="decode tokens/s")
gib = 2 ** 30
ax[2].stackplot(batches, [x.hbm.weights_bytes / gib for x in rows], [x.hbm.kv_cache_bytes / gib for x in rows],
                [x.hbm.activation_bytes / gib for x in rows], labels=["weights", "KV cache", "activations"])
ax[2].axhline(rows[0].hbm.capacity_bytes / gib, color="k", ls="--", label="usable HBM")
ax[2].set(xscale="log", xlabel="batch", ylabel="GiB per card"); ax[2].legend(fontsize=8, loc="upper left")
fig.suptitle(f"{spec.name} on one {CHIP}, {PROMPT} + {OUTPUT} tokens (largest batch that fits: {best})")
fig.tight_layout()
"""),
    ("md", """
### More cards: tensor parallelism and what its all-reduces cost

Megatron's split gives each card a slice of every head group and every expert, so each card reads
a fraction of the weights per step: the step shrinks. But every layer now ends its attention and
its MLP with an **all-reduce** of the activations over HCCS, costed by HCCL's algorithms on the
Atlas server's links (`pypto_lab.hw.collectives`). At small batch those collectives are latency:
they do not shrink with more cards.
"""),
    ("code", """
tp_rows = []
for cards in (1, 2, 4, 8):
    x = llm.simulate_generation(spec, batch=16, prompt_len=PROMPT, output_len=OUTPUT, chip=CHIP, cards=cards,
                                precision="bf16")
    tp_rows.append((cards, x.tpot_ms, x.comm_ms_per_step, x.hbm.weights_bytes / gib))
    print(f"{cards} card(s): TPOT {x.tpot_ms:6.2f} ms, of which all-reduce {x.comm_ms_per_step:5.2f} ms; "
          f"weights {x.hbm.weights_bytes / gib:5.2f} GiB per card")
fig, ax = plt.subplots(figsize=(5.5, 3))
c = [t[0] for t in tp_rows]
ax.bar([str(v) for v in c], [t[1] - t[2] for t in tp_rows], label="kernels")
ax.bar([str(v) for v in c], [t[2] for t in tp_rows], bottom=[t[1] - t[2] for t in tp_rows], label="all-reduce")
ax.set(xlabel="cards (tensor parallel)", ylabel="decode step (ms)", title="batch 16"); ax.legend()
fig.tight_layout()
"""),
    ("md", """
### Serving: continuous batching against a static batch

Real traffic arrives at random with prompts and answers of every length. `serve` draws them
(Poisson arrivals; ShareGPT-like lengths, `datasets/serving/`) and runs vLLM's scheduler: each
step decodes one token for every running request and fills the rest of its token budget with
prefill chunks of new ones; KV blocks are paged, and a request is preempted when they run out. The
static scheduler, for comparison, waits for a batch to finish before it starts the next.
"""),
    ("code", """
runs = {}
for sched in ("continuous", "static"):
    for rate in (2.0, 8.0, 32.0):
        runs[sched, rate] = llm.serve(spec, CHIP, requests=200, rate=rate, seed=0, scheduler=sched,
                                      precision="bf16", progress=False)

def kv_peak(rep):
    return max(occ for _, occ in rep.kv_occupancy)

print(f"{'scheduler':<11} {'rate/s':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'tokens/s':>9} "
      f"{'KV peak':>8} {'preempted':>9}")
for (sched, rate), rep in runs.items():
    d = rep.to_dict()
    print(f"{sched:<11} {rate:>6g} {d['ttft_ms_p50']:>9.0f} {d['ttft_ms_p99']:>9.0f} {d['tpot_ms_p50']:>9.2f} "
          f"{d['output_tokens_per_s']:>9.0f} {kv_peak(rep):>8.1%} {d['preemptions']:>9}")
print(f"KV cache: {runs['continuous', 2.0].kv_blocks} blocks of 128 tokens per card")
"""),
    ("md", """
How to read it:

* **Continuous batching** answers in tens of milliseconds at every rate: a new request is
  prefilled in the next step, beside the running decodes. Throughput grows with the rate until
  the step's token budget and the decode steps' cost level it off.
* **Nothing is preempted** because nothing runs out: the KV cache peaks at a few percent of its
  blocks (the *KV peak* column). The weights take about half of the card's HBM and the rest,
  about half a million tokens of KV, is far more than 200 ShareGPT-like requests ever hold at once.
  The static scheduler never preempts by construction: it reserves each request's prompt *and*
  output blocks before starting it, as a cache without paging must.
* **Static batching's TTFT does not grow with the rate**, and that is what request-level batching
  does, not noise: a batch decodes until its *longest* request ends (ShareGPT-like outputs reach
  4,096 tokens), and everyone who arrives meanwhile waits for that. Which requests share a batch
  decides the median. At 32 requests/s the first batch holds the first few requests and ends within
  seconds; about half of all requests arrive meanwhile and form the second batch, which starts at
  once, so their wait is short (the p50); that batch then runs for its longest member, and everyone
  arriving during it waits for all of it (the p99). At 8 requests/s an early, small batch has a
  long answer, and most requests arrive while it decodes and wait for its end. Run it with another
  `seed` and the medians move; the staircase stays. The figure shows it: each request's arrival
  against its first token.
"""),
    ("code", """
fig, axes = plt.subplots(1, 3, figsize=(13, 3.2), sharey=True)
for ax, rate in zip(axes, (2.0, 8.0, 32.0)):
    for sched, colour in (("static", "C3"), ("continuous", "C0")):
        recs = runs[sched, rate].records
        ax.scatter([r.arrival_s for r in recs], [r.first_token_s for r in recs], s=6, color=colour, label=sched)
    ax.set(title=f"{rate:g} requests/s", xlabel="arrival (s)")
axes[0].set_ylabel("first token (s)")
axes[0].legend()
fig.tight_layout()
"""),
    ("md", """
A flat run of red dots is one static batch: everyone who arrived during the batch before it gets
the first token at the same moment. Continuous batching stays on the diagonal.

Preemption appears once the KV cache is what runs out. Give the engine only 51% of the card's
HBM (vLLM's `gpu_memory_utilization`; as if another model shared the card) and the same traffic
at 32 requests/s fills every block: the most recently admitted requests are preempted, and later
prefill their prompt and the tokens they had generated again.
"""),
    ("code", """
runs["continuous, 51% of HBM", 32.0] = tight = llm.serve(spec, CHIP, requests=200, rate=32.0, seed=0, precision="bf16",
                                                         hbm_utilization=0.51, progress=False)
d = tight.to_dict()
print(f"{tight.kv_blocks} KV blocks: {d['preemptions']} preemptions, KV peak {kv_peak(tight):.0%}, "
      f"TTFT p50 {d['ttft_ms_p50']:.0f} ms, p99 {d['ttft_ms_p99']:.0f} ms, {d['output_tokens_per_s']:.0f} tokens/s")
"""),
    ("md", """
Pick a run to see the KV cache fill and drain over time (the fraction of the paged blocks in use):
""" ),
    ("code", """
import ipywidgets as widgets
from matplotlib.figure import Figure
from pypto_lab.viz.widgets import figure_interact

def occupancy_figure(run):
    rep = runs[run]
    t, occ = zip(*rep.kv_occupancy)
    fig = Figure(figsize=(7, 2.6))
    ax = fig.add_subplot()
    ax.plot(t, occ)
    ax.set(xlabel="time (s)", ylabel="KV blocks in use", ylim=(0, 1.05),
           title=f"{run[0]}, {run[1]:g} requests/s: {rep.to_dict()['preemptions']} preemptions")
    fig.tight_layout()
    return fig

figure_interact(occupancy_figure, title="KV cache in use", run=widgets.Dropdown(
    options=[(f"{s}, {r:g}/s", (s, r)) for s, r in runs], value=("continuous, 51% of HBM", 32.0),
    description="run"))
"""),
    ("md", """
### How far to trust these figures

The same engine, run on published Ascend figures (`pypto-lab validate --set llm`): the torchair
READMEs' prefill and decode step latencies on an Atlas 800I A2 (7B to 72B models, 1 and 8 cards,
batch 1 to 48, prompts padded to 1,024 tokens), each row on the stack it was measured on and with
its own model code. The cell runs the decode rows of two models (about 20 s); the full table, with
every regime, is `pypto-lab validate --set all` and `benchmarks/README.md`.
"""),
    ("code", """
# NBVAL_IGNORE_OUTPUT
from pypto_lab.validation.compare import Summary
from pypto_lab.validation.llm_rows import fixed_batch, read_rows

rows = [r for r in read_rows() if r["model"] in ("Qwen2-7B", "Llama-2-70B") and r["id"] not in ("100", "101", "102", "103")]
with progress(total=12, desc="published rows", unit="setup") as bar:
    checked = Summary(fixed_batch(rows, tick=lambda: bar.update(1)))
for c in checked.ran:
    print(f"{c.model:<12} {c.setup:<30} {c.metric:<24} published {c.published:8.1f}  simulated {c.simulated:8.1f}  "
          f"{c.error:+6.0%}")
"""),
    ("md", """
Where to trust it, and why:

* **Prefill** lands within about ±20 %: it is the Cube's work, and the Cube is what the
  micro-benchmarks calibrate best.
* **Decode at small batch** lands within a few percent once the stack is right: the torchair
  READMEs run IncreFlashAttention with `actual_seq_lengths` and *tiling sink*, so each layer's
  attention is tiled on the AICPU first. That task's time is the one constant fitted to these rows
  (`scripts/derive_stack_constants.py`, about 116 µs; leaving any one model out moves it between
  104 and 139 µs), and the 70B rows it was never fitted on land within 2–9 %.
* **Decode at large batch on a model with several KV heads per card** (Qwen2-7B at batch 32–48) is
  still 20–30 % too fast: the KV cache is read faster than the real kernel reads it. Its keys sit in
  BSND order, so one head's rows are 256-byte pieces strided through the cache; how fast the data
  movers read such pieces is not in any public figure the workbench could use.
* **Eager mode** (torch_npu single-operator mode) is several times too fast on the 70B model: the
  host's Python and dispatch per operator of the model code is charged only per kernel.
"""),
    ("md", """
## Part 2 in short

* **Decode is memory-bound**: each step reads the weights it uses and the KV cache, doing a few
  flops per byte; the prefill is the compute-bound part.
* **Batching** raises tokens per second almost linearly while the weights dominate the bytes read,
  and stops where weights + KV cache + activations fill HBM: the engine names that batch.
* **Tensor parallelism** divides the bytes each card reads, but adds two all-reduces per layer that
  do not shrink with more cards.
* **Continuous batching** keeps the batch full as requests come and go, which a static batch
  cannot: higher throughput at the same load, and the KV cache is where it runs out.
"""),
]

for kind, text in PART2_CELLS:
    {"md": md, "code": code}[kind](text)


# ---- Part 3: the 2025 models with their own kernels in the decode step (issue 27, part 4) ----------
md("""
## Part 3: three 2025 models, each with its new kernel in the decode step

DeepSeek-V3.2, Qwen3-Next and GLM-4.5 each bring a layer the engine's stock kernels do not have:
DeepSeek Sparse Attention (a lightning indexer picks 2,048 cached tokens, attention reads only
those), Gated DeltaNet linear attention in three of every four Qwen3-Next layers (a fixed-size
recurrent state instead of a KV cache), and GLM-4.5's MoE fused into one kernel. The engine reads
the three from their public `config.json` and models those layers with its own kernels; a pto
kernel can take a layer kind's place, as `custom_op(npu_func=...)` does for `optimize`:

```python
simulate_generation(model, ..., kernels={"attention" | "linear_attention" | "moe": kernel})
```

Each plugged kernel is run in SIM, cost-only, at the decode step's real shapes on the card (heads
and widths divided by tensor parallelism), once per shape; the report names it with its simulated
µs per call and calls per step. The kernels are the workbench's own, written in `pypto_lab.pto`
from each model's public code (`pypto_lab/llm/model_kernels.py`), checked against torch references
in `tests/test_llm_plugged.py`. These are decode kernels: the prefill keeps the engine's kernels.
A kernel declared `plug.LayerKernel(..., phase="prefill")` runs the prefill instead (at the prompts'
shapes: `scripts/day0_real_kernels.py` plugs the real framework's chunked gated delta rule there).
""")
code("""
from pypto_lab.llm import plug, simulate_generation

setups = [("deepseek-v3.2", dict(cards=16, precision="w8a16"), "attention", plug.sparse_mla_attention()),
          ("qwen3-next", dict(cards=4), "linear_attention", plug.gated_delta_rule()),
          ("glm-4.5", dict(cards=16), "moe", plug.fused_moe())]
for name, kw, kind, kernel in setups:
    base = simulate_generation(name, batch=1, prompt_len=4096, output_len=16, context_points=2, **kw)
    r = simulate_generation(name, batch=1, prompt_len=4096, output_len=16, context_points=2,
                            kernels={kind: kernel}, **kw)
    print(f"{name}: TPOT {base.tpot_ms:.3f} ms with the engine's kernels, {r.tpot_ms:.3f} ms plugged")
    print(r.plugged_table())
""")
md("""
**Sparse against dense attention.** DeepSeek-V3.2 with the sparse kernel (and the indexer's own
kernels, which score every cached token) against the same model run as dense MLA (the whole latent
cache, no indexer), per decode step on one of 16 cards. At short context the indexer costs more
than it saves; past about 64 k tokens the sparse step stays nearly flat while the dense one grows
with the cache.
""")
code("""
from pypto_lab.llm.configs import spec_of
from pypto_lab.llm.engine import hardware
from pypto_lab.llm.forward import forward_kernels, step_time_us

spec, hw = spec_of("deepseek-v3.2"), hardware("Ascend910B1", cards=16, precision="w8a16")
sparse = plug.resolve(spec, hw, {"attention": plug.sparse_mla_attention()})
dense = plug.resolve(spec, hw, {"attention": plug.dense_mla_attention()})
for c in (4096, 16384, 65536, 131072):
    s, d = (step_time_us(forward_kernels(spec, hw, decode=[c], plugged=p), hw.stack) / 1000 for p in (sparse, dense))
    print(f"context {c:>7,}: sparse {s:6.2f} ms, dense MLA {d:6.2f} ms per decode step")
""")


if __name__ == "__main__":
    NB.write("08_zero_day_llm.ipynb")
