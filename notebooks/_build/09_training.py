"""Generates notebooks/09_training.ipynb (run: .venv/bin/python notebooks/_build/09_training.py).

Training on simulated Ascend 910B cards with pypto_lab.train.simulate_step: ResNet-50 and BERT
fine-tuning steps on 1 and 8 cards, the forward/backward/optimizer/communication breakdown, O1
against O2 (cost and numerics), gradient checkpointing, DDP as the seed writes it, a bucket-size
sweep, scaling to two servers, the Chrome trace, a data loader that starves the NPU, and an LLM
step with fused Vector kernels and MC2, memory advice and the configuration search over parallel
layouts.
"""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 09 · Training on the simulated NPU: forward, backward, optimizer, all-reduce, input pipeline

Half of the first seed article (`shared/seeds/`, summarised in its README) is about **training** on
Ascend: `amp.initialize(model, optimizer, opt_level="O2")` then `loss.backward()` and
`optimizer.step()` (§4.2), gradient checkpointing when memory runs short and prefetching when
"NPU utilisation is low" (§5.2), `init_process_group(backend="hccl")` with
`DistributedDataParallel`, gradient accumulation and `bucket_size` (§7.1), `NPUDataLoader` (§8.2),
and the timeline of compute/communication overlap (§5.3, §9.3).

`pypto_lab.train.simulate_step(model, example_batch, ...)` costs **one training step** of a real
PyTorch model on simulated cards:

1. AOT autograd traces the step (forward, loss and backward) as **one joint graph**, on fake
   tensors, so nothing big is computed on this laptop;
2. every node becomes the kernels CANN runs for it: a convolution's forward and its two gradient
   convolutions (`Conv2DBackpropInput`, `Conv2DBackpropFilter`), a linear layer's matmul and its two
   gradient matmuls, training BatchNorm's reduce/update pairs, softmax and its gradient, …, each
   costed on the chip model like an inference kernel;
3. the optimizer is the fused Vector kernels CANN ships (SGD, Adam, AdamW), on fp32 master weights
   under O2, with the loss-scale overflow check;
4. the memory plan holds the weights, gradients, optimizer state and every activation the backward
   reads; data-parallel gradients are all-reduced in **buckets** as the backward produces them, on
   a communication stream, over the card-to-card links of a real server preset.

Every figure in this notebook is computed by the simulator or measured here; none is typed in.
""")

code("""
%matplotlib inline
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
import torchvision
import transformers
from torch import nn

from pypto_lab import distributed
from pypto_lab.data import NPUDataLoader, image_folder
from pypto_lab.train import HBMCapacityError, simulate_step
from pypto_lab.train.numerics import step_gradients

CHIP = "Ascend910B1"
transformers.logging.set_verbosity_error()
""")

# ---------------------------------------------------------------- 1 ResNet-50
md("""
## 1 · A ResNet-50 training step on one card

The batch is what **one card** sees per step: 32 images of 224×224 and their labels. The loss is
`F.cross_entropy`; the optimizer SGD with momentum; the precision the seed's O2 (fp16 compute, fp32
master weights, dynamic loss scaling). The weights are torchvision's random initialisation: the
cost of a step does not depend on the values.
""")

code("""
resnet = torchvision.models.resnet50()
images = (torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,)))

t0 = time.perf_counter()
r50_1 = simulate_step(resnet, images, F.cross_entropy, optimizer="sgd", chip=CHIP, cards=1, amp="O2")
print(r50_1.table())
print(f"(captured and costed in {time.perf_counter() - t0:.1f} s on this machine)")
""")

md("""
Read the table from the top. The **backward** takes about twice the forward: each convolution
has two gradient convolutions, each as big as the forward one (except the first layer, whose input
needs no gradient). The **optimizer** is small for a CNN: 25.6 M parameters, a few Vector passes over
each. The **HBM** line is the memory plan: the activations the backward reads dominate, and the
last line is how far the batch could grow on this card.

Which kernels take the time? The report keeps every kernel of the step:
""")

code("""
from collections import Counter

by_op = Counter()
for k in r50_1.kernels:
    by_op[(k.phase, getattr(k.spec, "op", type(k.spec).__name__))] += k.time_us / 1e3
print(f"{'phase':<10} {'kernel':<28} {'ms':>7}")
for (phase, op), ms in by_op.most_common(10):
    print(f"{phase:<10} {op:<28} {ms:7.2f}")
""")

# ---------------------------------------------------------------- 2 BERT
md("""
## 2 · BERT-base fine-tuning

A sequence-classification fine-tune: `BertForSequenceClassification` built from its
`transformers` config (random weights: nothing is downloaded), a batch of 32 sequences of 128
tokens as a **dict**, whose `labels` make the model return its own `.loss`, so no `loss_fn` is
needed. AdamW keeps two fp32 moments per parameter: the optimizer is now a visible part of the
step, and of the memory.
""")

code("""
bert = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))
tokens = {"input_ids": torch.randint(0, 30522, (32, 128)), "labels": torch.zeros(32, dtype=torch.long)}

bert_1 = simulate_step(bert, tokens, optimizer="adamw", chip=CHIP, cards=1, amp="O2")
print(bert_1.table())
""")

# ---------------------------------------------------------------- 3 eight cards
md("""
## 3 · Eight cards: where the all-reduce goes

With `cards=8` each card runs the same step on its own 32 samples (data parallel); after the
backward every gradient must be **all-reduced** across the eight cards. DDP does not wait for the
end of the backward: it groups gradients into buckets (25 MB by default) in the order the backward
produces them, and all-reduces a bucket on a separate stream as soon as it is full. Only what is
left after the backward's last kernel, the **exposed** communication, lengthens the step.

The eight cards are one Atlas 800 A2 server (HCCS links between the cards; the topology preset is
chosen for the chip and the card count).
""")

code("""
r50_8 = simulate_step(resnet, images, F.cross_entropy, optimizer="sgd", chip=CHIP, cards=8, amp="O2")
bert_8 = simulate_step(bert, tokens, optimizer="adamw", chip=CHIP, cards=8, amp="O2")
print(r50_8.table(), "\\n")
print(bert_8.table())
""")

code("""
def breakdown(ax, reports, labels, title):
    parts = [("forward_ms", "forward"), ("backward_ms", "backward"), ("exposed_comm_ms", "exposed all-reduce"),
             ("optimizer_ms", "optimizer")]
    bottom = [0.0] * len(reports)
    for key, name in parts:
        vals = [r.to_dict()[key] for r in reports]
        ax.bar(labels, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(reports):
        ax.text(i, bottom[i], f"{r.samples_per_s:,.0f}/s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per step (one card)")
    ax.set_title(title)


fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
breakdown(axes[0], [r50_1, r50_8], ["1 card", "8 cards"], "ResNet-50, 32 images/card, SGD")
breakdown(axes[1], [bert_1, bert_8], ["1 card", "8 cards"], "BERT-base, 32x128 tokens/card, AdamW")
axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
fig.tight_layout()
""")

md("""
The bars' labels are **global** samples per second (all cards). The red segment is the exposed
all-reduce, the time the optimizer waits for the last bucket; the rest of the communication hides
under the backward. BERT-base has four times ResNet-50's gradients (110 M against 25.6 M
parameters), so its all-reduce takes longer (`comm_ms`) and more of it sticks out.
""")

# ---------------------------------------------------------------- 4 amp
md("""
## 4 · Mixed precision: O0, O1 and O2

The seed's `amp.initialize(model, optimizer, opt_level="O2")` is, on the simulator, the `amp=`
argument. The levels change **which kernels run**:

| level | Cube ops (conv, matmul) | everything else | weights |
|---|---|---|---|
| O0 | fp32 (the Cube's fp32 rate is half its fp16 rate) | fp32 | fp32 |
| O1 | fp16; each one's fp32 inputs are **cast** to fp16 and its output back to fp32 by Vector cast kernels | fp32 | fp32 |
| O2 | fp16 | fp16 (BatchNorm statistics fp32) | fp16 copy for compute, fp32 master weights for the update |

O1 and O2 also scale the loss and check the gradients for overflow before the update.
""")

code("""
rows = []
for name, model, batch, loss_fn, opt in (("ResNet-50", resnet, images, F.cross_entropy, "sgd"),
                                         ("BERT-base", bert, tokens, None, "adamw")):
    for amp in ("O0", "O1", "O2"):
        r = simulate_step(model, batch, loss_fn, optimizer=opt, chip=CHIP, cards=1,
                          precision="fp32" if amp == "O0" else "fp16", amp=amp)
        casts = sum(1 for k in r.kernels if getattr(k.spec, "op", "").startswith("Cast"))
        rows.append((name, amp, r.step_ms, r.peak_hbm_bytes / 2**30, casts))
print(f"{'model':<10} {'amp':<4} {'step ms':>8} {'HBM GiB':>8} {'cast kernels':>13}")
for row in rows:
    print(f"{row[0]:<10} {row[1]:<4} {row[2]:8.2f} {row[3]:8.2f} {row[4]:13d}")
""")

md("""
O2 is the fastest and the smallest: everything runs in half, activations take half the bytes.
**O1 can be slower than O0**: each cast is a separate Vector kernel that reads and writes its
tensor through HBM, and around BERT's many mid-sized matmuls those round trips cost more than the
faster fp16 Cube saves. This is why the seed recommends O2 on Ascend, and why CANN fuses casts into
neighbouring kernels where it can (the simulator does not fuse elementwise kernels in training
steps: see the last section).

The levels also change **the numbers**. `step_gradients` runs the step's joint graph on the CPU with
the level's roundings (fp16 storage of activations and gradients, fp32 accumulation, loss scaling)
and returns the loss and the gradients; on a small CNN we compare them with torch's autograd in
fp32:
""")

code("""
# NBVAL_CHECK_OUTPUT
torch.manual_seed(0)
cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                    nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
cnn.zero_grad()
F.cross_entropy(cnn(x), y).backward()
reference = {k: p.grad.clone() for k, p in cnn.named_parameters()}
scale = max(float(g.abs().max()) for g in reference.values())

for precision, amp in (("fp32", "O0"), ("fp16", "O1"), ("fp16", "O2")):
    loss, grads = step_gradients(cnn, (x, y), F.cross_entropy, precision=precision, amp=amp)
    worst = max(float((grads[k] - reference[k]).abs().max()) for k in reference) / scale
    print(f"{amp}: largest gradient difference from fp32 autograd = {worst:.0e} of the largest gradient"
          f" -> {'within' if worst < 2e-2 else 'OUTSIDE'} half-precision error")
""")

# ---------------------------------------------------------------- 5 memory
md("""
## 5 · Memory: the largest batch, and gradient checkpointing

The seed's §5.2: "when memory runs short, use gradient checkpointing". A checkpointed block keeps
only its input; the backward runs the block's forward again to get back what it needs. With
`checkpoint=True` every transformer layer (or every top-level block of a CNN) is checkpointed; the
report shows the memory saved and the recomputation paid:
""")

code("""
plain = bert_1
ckpt = simulate_step(bert, tokens, optimizer="adamw", chip=CHIP, cards=1, amp="O2", checkpoint=True)
for name, r in (("no checkpointing", plain), ("checkpoint=True", ckpt)):
    print(f"{name:<17} step {r.step_ms:7.2f} ms (recompute {r.recompute_ms:5.2f} ms)  "
          f"activations {r.memory['activations'] / 2**30:5.2f} GiB  peak {r.peak_hbm_bytes / 2**30:5.2f} GiB  "
          f"largest batch {r.largest_batch}")
print(ckpt.notes[-1])
""")

md("""
The trade in one line: one extra forward per step (the `recompute` time) buys several times the
largest batch. A step that does not fit does not run: the simulator raises
`HBMCapacityError`, with what fills the card and the largest batch that would fit. On the
64 GiB card that takes a big batch; try it on a small convolutional net, where capturing at a
huge batch is cheap:
""")

code("""
# NBVAL_CHECK_OUTPUT
try:
    # torch.empty reserves address space only: the capture reads shapes, never the values
    simulate_step(cnn, (torch.empty(2_000_000, 3, 16, 16), torch.empty(2_000_000, dtype=torch.long)),
                  F.cross_entropy, chip=CHIP, cards=1)
except HBMCapacityError as err:
    print(err)
""")

# ---------------------------------------------------------------- 6 DDP
md("""
## 6 · Data parallel as the seed writes it

The seed's §7.1 starts the HCCL group and wraps the model in torch's own `DistributedDataParallel`.
Here the process group is simulated: `pypto_lab.distributed.init_process_group(backend="hccl")`
sets the simulated world size (an argument, or `WORLD_SIZE` as `torchrun` sets it) and starts a
one-process gloo group underneath, so torch's DDP runs as written. `simulate_step` reads the
number of cards from the group and the **bucket size** from the DDP wrapper. Gradient accumulation
(`grad_accum=4`: four micro-batches per optimizer step) all-reduces only after the last one.
""")

code("""
distributed.init_process_group(backend="hccl", world_size=8)
local_rank = distributed.local_rank()
ddp_model = nn.parallel.DistributedDataParallel(bert, device_ids=[local_rank], broadcast_buffers=False,
                                                bucket_cap_mb=25)
ddp = simulate_step(ddp_model, tokens, optimizer="adamw", chip=CHIP, amp="O2")
accum = simulate_step(ddp_model, tokens, optimizer="adamw", chip=CHIP, amp="O2", grad_accum=4)
distributed.destroy_process_group()

for name, r in (("DDP, 1 micro-batch", ddp), ("DDP, grad_accum=4", accum)):
    print(f"{name:<19} cards {r.cards}  bucket {r.bucket_mb:g} MB  global batch {r.global_batch}  "
          f"step {r.step_ms:7.2f} ms  all-reduce {r.comm_ms:5.2f} ms ({r.exposed_comm_ms:.2f} exposed)  "
          f"{r.samples_per_s:,.0f} samples/s")
""")

md("""
(torch itself warns that `broadcast_buffers` is deprecated in favour of `forward_sync_buffers`;
the seed's argument still works.) With accumulation the step carries four forwards and backwards but still one all-reduce and one
optimizer update, so the communication and the update are spread over four times the samples.
""")

# ---------------------------------------------------------------- 7 buckets
md("""
## 7 · The bucket size

Small buckets start communicating early, but each all-reduce pays a fixed latency; huge buckets
pay it once but wait until most of the backward is done, so little of the communication can hide.
The sweep on 8 cards:
""")

code("""
sizes = [1, 5, 25, 100, 400]
sweep = {name: [simulate_step(m, b, lf, optimizer=o, chip=CHIP, cards=8, amp="O2", bucket_mb=mb) for mb in sizes]
         for name, m, b, lf, o in (("ResNet-50", resnet, images, F.cross_entropy, "sgd"),
                                   ("BERT-base", bert, tokens, None, "adamw"))}
print(f"{'model':<10} {'bucket MB':>9} {'buckets':>8} {'all-reduce ms':>14} {'exposed ms':>11} {'step ms':>8}")
for name, reps in sweep.items():
    for mb, r in zip(sizes, reps):
        print(f"{name:<10} {mb:9g} {len(r.buckets):8d} {r.comm_ms:14.2f} {r.exposed_comm_ms:11.2f} {r.step_ms:8.2f}")

fig, ax = plt.subplots(figsize=(6, 3.2))
for name, reps in sweep.items():
    ax.plot(sizes, [r.exposed_comm_ms for r in reps], "o-", label=name)
ax.set_xscale("log")
ax.set_xlabel("bucket size (MB)")
ax.set_ylabel("exposed all-reduce (ms)")
ax.legend()
fig.tight_layout()
""")

md("""
Read the two columns together: the total all-reduce time falls as buckets grow (fewer
latencies), while the exposed part rises, because a large bucket can only start when most of the
backward is over: with one bucket nothing overlaps at all. Within one server the latencies of many
small buckets still hide under the backward, so small buckets give the shortest step here; what
the simulator leaves out is DDP's own per-bucket work on the host (hooks, flattening), which is
why real runs do not go below a few MB. **Try**: the same sweep at `cards=16`, where every
all-reduce also crosses the network between two servers.
""")

# ---------------------------------------------------------------- 8 scaling
md("""
## 8 · Scaling from 1 to 8 to 16 cards

Sixteen cards are two Atlas 800T A2 servers: inside a server the cards talk over HCCS, between the
servers over RoCE, which is slower; the all-reduce becomes hierarchical. Scaling efficiency is the
global throughput over the card count times one card's throughput.
""")

code("""
cards = [1, 8, 16]
print(f"{'model':<10} {'cards':>5} {'topology':<18} {'samples/s':>10} {'efficiency':>10} {'exposed ms':>11}")
scaling = {}
for name, m, b, lf, o in (("ResNet-50", resnet, images, F.cross_entropy, "sgd"),
                          ("BERT-base", bert, tokens, None, "adamw")):
    reps = [simulate_step(m, b, lf, optimizer=o, chip=CHIP, cards=n, amp="O2") for n in cards]
    scaling[name] = reps
    for n, r in zip(cards, reps):
        eff = r.samples_per_s / (n * reps[0].samples_per_s)
        topo = r.topology or "one card"
        print(f"{name:<10} {n:5d} {topo:<18} {r.samples_per_s:10,.0f} {eff:10.1%} {r.exposed_comm_ms:11.2f}")
""")

code("""
fig, ax = plt.subplots(figsize=(6, 3.2))
for name, reps in scaling.items():
    ax.plot(cards, [r.samples_per_s / reps[0].samples_per_s for r in reps], "o-", label=name)
ax.plot(cards, cards, "k:", label="linear")
ax.set_xlabel("cards")
ax.set_ylabel("speed-up over one card")
ax.legend()
fig.tight_layout()
""")

# ---------------------------------------------------------------- 9 trace
md("""
## 9 · The timeline

The seed's §5.3 and §9.3 look at the overlap of compute and communication on a timeline.
`report.chrome_trace(path)` writes one card's step as a Chrome trace: open it in
`chrome://tracing` or [Perfetto](https://ui.perfetto.dev). Lane 0 is the AI cores (forward,
backward, optimizer kernels), lane 1 the HCCL stream with one event per bucket. Here it is drawn
directly from the same events:
""")

code("""
out = Path("out")
out.mkdir(exist_ok=True)
trace = bert_8.chrome_trace(out / "train_step_trace.json")
events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
colours = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green", "comm": "tab:red"}
fig, ax = plt.subplots(figsize=(10, 2.4))
for e in events:
    ax.broken_barh([(e["ts"] / 1e3, e["dur"] / 1e3)], (1 - e["tid"] - 0.4, 0.8), color=colours[e["cat"]])
ax.set_yticks([1, 0], ["AI cores", "HCCL"])
ax.set_xlabel("ms")
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()], labels=list(colours),
          ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.5))
ax.set_title(f"BERT-base step on card 0 of 8: {bert_8.step_ms:.1f} ms, {bert_8.exposed_comm_ms:.2f} ms exposed")
fig.tight_layout()
print(f"wrote {out / 'train_step_trace.json'} ({len(events)} events)")
""")

# ---------------------------------------------------------------- 10 loader
md("""
## 10 · The input pipeline: an NPU waiting for data

The seed's §8.2 feeds the NPU with `NPUDataLoader(dataset, batch_size, shuffle, num_workers,
pin_memory, prefetch_factor)`, and §5.2 warns of "low NPU utilisation: data not ready".
`pypto_lab.data.NPUDataLoader` is torch's `DataLoader` over a real dataset
(`datasets/train_images`: small PNGs, decoded and resized to 224×224 on this machine's CPU),
which also **measures** how long each batch takes to come out on this machine and **models** its
copy to the card over the host link (pinned memory at link rate; pageable memory pays a host copy
first). Pass it to `simulate_step(loader=...)` and the step is set against the feed.

First the way many scripts start: no worker processes, no pinned memory. The folder is repeated
so that an epoch has enough batches to time.
""")

code("""
# NBVAL_IGNORE_OUTPUT
images_ds = torch.utils.data.ConcatDataset([image_folder(size=224)] * 8)
slow = NPUDataLoader(images_ds, batch_size=32, shuffle=True, num_workers=0, pin_memory=False, seed=0)
starved = simulate_step(resnet, images, F.cross_entropy, optimizer="sgd", chip=CHIP, cards=1, amp="O2",
                        loader=slow)
print(starved.table())
""")

md("""
The step is now as long as the feed: the NPU computes for its 14 ms or so and waits the rest
(`data wait`). The note is the seed's warning, with the measured host wait, the modelled copy,
and what to change. The fix the seed gives is worker processes that load batches ahead of the
step, and pinned memory so that the copy runs at the link's rate and overlaps the compute:
""")

code("""
# NBVAL_IGNORE_OUTPUT
fast = NPUDataLoader(images_ds, batch_size=32, shuffle=True, num_workers=2, pin_memory=True, prefetch_factor=2,
                     seed=0)
fed = simulate_step(resnet, images, F.cross_entropy, optimizer="sgd", chip=CHIP, cards=1, amp="O2", loader=fast)
print(fed.table())
per_worker = slow.profile(batches=10).samples_per_s
need = r50_1.to_dict()["samples_per_s"] / per_worker
print(f"\\none process decodes {per_worker:,.0f} images/s here; one 910B card trains on "
      f"{r50_1.samples_per_s:,.0f} images/s: about {need:.0f} loader processes keep it fed")
""")

code("""
# NBVAL_IGNORE_OUTPUT
print(f"NPU idle per step: {starved.data_wait_ms:.1f} ms without workers -> {fed.data_wait_ms:.1f} ms "
      "with 2 workers, pinned memory and prefetching")
if fed.data_wait_ms >= starved.data_wait_ms:   # the loader's times are measured on this machine, now
    import os
    print(f"(the workers did not help this time: this machine's {os.cpu_count()} cores are busy with other work, "
          "and the workers measure what is left)")
""")

md("""
This machine has two cores, so two workers are all it can give; the measured rate per process
says how many a real host needs for one card, and eight cards need eight times that. This is why
ImageNet training servers pair each NPU with many CPU cores, and why DVPP (the chip's own image
decoder and resizer) exists.

The other fix is to do less on the host per step: here the images are decoded and resized once,
kept as fp16 tensors (half the bytes to copy), and the loader only picks and stacks them:
""")

code("""
# NBVAL_IGNORE_OUTPUT
decoded = image_folder(size=224)
pixels = torch.stack([decoded[i][0] for i in range(len(decoded))]).half()
labels = torch.tensor([decoded[i][1] for i in range(len(decoded))])
cached_ds = torch.utils.data.ConcatDataset([torch.utils.data.TensorDataset(pixels, labels)] * 8)
cached = NPUDataLoader(cached_ds, batch_size=32, shuffle=True, num_workers=2, pin_memory=True, prefetch_factor=2,
                       seed=0)
light = simulate_step(resnet, images, F.cross_entropy, optimizer="sgd", chip=CHIP, cards=1, amp="O2",
                      loader=cached)
print(f"step {light.step_ms:.1f} ms, NPU idle {light.data_wait_ms:.1f} ms")
print(light.notes[-1])
""")

md("""
Your numbers differ from run to run and machine to machine: the host side is measured, on a machine
that may be busy with other work. Run the three loaders again and compare.
""")

# ---------------------------------------------------------------- 11 LLM
md("""
## 11 · An LLM step: fused Vector kernels and MC2

Eager PyTorch runs every ATen op of the step as its own kernel: a LLaMA RMSNorm is six of them
(pow, mean, add, rsqrt, two multiplies), each reading its input from HBM and writing its result
back, and SwiGLU and the rotary embedding are a handful more, forward and backward. MindSpeed's
LLaMA scripts train with `--use-fused-rmsnorm --use-fused-swiglu --use-fused-rotary-pos-emb`
(single kernels) and `--use-mc2`, which runs each tensor-parallel collective fused with the matmul
beside it, chunk by chunk, so the communication hides under the compute.

`simulate_step(..., fuse_vector=True)` runs every chain of Vector kernels as one kernel
(`pypto_lab.lowering.fusion`: the intermediates stay in UB; what the backward or the next matmul reads
is still written), and `mc2=True` overlaps each collective with its GEMM. A config-built causal LM
is fused by default; here a small LLaMA on 8 cards with `tp=8` is costed three ways.
""")

code("""
llama = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5504, num_hidden_layers=4,
                                 num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)
ids = torch.randint(0, 32000, (2, 2048))
llm_batch = {"input_ids": ids, "labels": ids}
ways = {"eager (one kernel per op)": dict(fuse_vector=False),
        "fused Vector kernels": dict(fuse_vector=True),
        "fused + MC2": dict(fuse_vector=True, mc2=True)}
llm = {}
print(f"{'':<27} {'Vector kernels':>14} {'Vector ms':>10} {'TP comm ms':>11} {'step ms':>8} {'tokens/s':>9}")
for label, kw in ways.items():
    r = simulate_step(llama, llm_batch, optimizer="adamw", chip=CHIP, cards=8, tp=8, precision="bf16",
                      amp="O2", sequence_parallel=True, **kw)
    llm[label] = r
    vec = [k for k in r.kernels if type(k.spec).__name__ == "VectorKernel" and k.phase != "optimizer"
           and not k.name.startswith("TP")]
    print(f"{label:<27} {len(vec):14d} {sum(k.time_us for k in vec) / 1e3:10.2f} {r.tp_comm_ms:11.2f} "
          f"{r.step_ms:8.2f} {r.tokens_per_s:9,.0f}")
""")

code("""
fused = llm["fused Vector kernels"]
norm = next(k for k in fused.kernels if k.phase == "forward" and "Rsqrt" in k.spec.op)
print("one forward RMSNorm kernel:", norm.spec.op, f"({norm.time_us:.1f} us, {norm.spec.inputs} tensors in "
      "and out beyond its one result)")
print(next(n for n in fused.notes if n.startswith("Vector fusion")))
""")

md("""
Fusion removes most Vector kernels and their HBM round trips; MC2 then takes most of the
tensor-parallel collectives off the critical path. `benchmarks/train_validation.py` runs the
published ModelLink LLaMA configurations this way (their scripts pass these flags): the simulated
throughput moves from about a third too slow to 17-31 % too fast (as of this writing), the same side as the CNN rows
(what the simulator leaves out, host dispatch above all, only ever costs time).
**Try**: `sequence_parallel=False`, or a longer sequence, and watch which part of the step grows.
""")

# ---------------------------------------------------------------- 12 layouts and the search
md("""
## 12 · Parallel layouts, memory advice and the configuration search

A large model trains under a **layout**: `tp` (tensor parallel), `pp` (pipeline stages, `vpp`
virtual chunks per stage for the interleaved schedule), `cp` (context parallel: ring attention),
`dp` (the rest), a sharded optimizer (`zero=1|2|3` or Megatron's `distributed_optimizer=True`),
recomputation (`recompute="selective"|"full"`) and the micro-batches of a step. `simulate_step`
takes them as Megatron and DeepSpeed users write them (`pypto_lab.train.megatron_args` reads a
script's argument list, `pypto_lab.train.deepspeed_config` a DeepSpeed JSON).

When a layout does not fit a card, `HBMCapacityError` gives the memory per card by part and the
cheapest changes that fit, each with the memory it would need:
""")

code("""
llama70 = transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                   num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                                   max_position_embeddings=4096)
one = {"input_ids": torch.zeros(1, 4096, dtype=torch.long)}
try:
    simulate_step(llama70, one, chip="Ascend910B2", cards=64, tp=8, pp=2, micro_batches=256, precision="bf16",
                  sequence_parallel=True)
except HBMCapacityError as e:
    print(str(e).replace(". ", ".\\n"))
""")

md("""
Which layout is fastest? `pypto_lab.explore.train_search.search_layouts` lists every layout
Megatron allows for a model, cards and global batch, keeps those that fit (memory is computed
before any kernel is costed; each layout gets the least recomputation that fits), costs them with
the same step model as `simulate_step` and ranks them by tokens per second. Layouts that share a
micro-batch size and `cp` share one captured step, and those groups run on the Dask sweep of
notebook 10 (`local=True` here keeps it in this process). `benchmarks/bench_train_search.py` runs
the full Llama-2-70B search on 64 cards (about a minute on two cores).

Here: Llama-2-7B on 16 cards, global batch 64 x 4,096 tokens (about 20 s in this process). The
winner, tp 1 with two pipeline stages, is the tp and pp ModelLink's own Llama-2-7B script sets (for 8 cards).
""")

code("""
from pypto_lab.explore.train_search import search_layouts

llama7 = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                                  max_position_embeddings=4096)
t0 = time.perf_counter()
found = search_layouts(llama7, 16, 64, 4096, chip="Ascend910B2", mc2=True, micro_batch_sizes=(1, 2), cp=(1, 2),
                       local=True)
print(f"searched in {time.perf_counter() - t0:.0f} s")
print(found.table(12))
print()
print(found.why())
""")

code("""
frame = found.frame()
fig, ax = plt.subplots(figsize=(8, 3.5))
for tp_, g in frame.groupby("tp"):
    ax.scatter(g["peak_gib"], g["tokens_per_s_per_card"], label=f"tp={tp_}", s=18)
ax.axvline(64, color="grey", lw=0.8, ls="--")
ax.set_xlabel("HBM per card (GiB)"); ax.set_ylabel("tokens/s per card")
ax.set_title("every fitting layout of Llama-2-7B on 16 x 910B2"); ax.legend(); fig.tight_layout(); plt.show()
""")

md("""
`why()` sets the winner's step out in parts (compute, recomputation, tensor / context parallel
communication inside the passes, the pipeline bubble, exposed data-parallel communication, the
optimizer) and, against the next layouts of another shape, names the parts that differ most.
Every row carries the `simulate_step` arguments that reproduce it (`found.best["args"]`): rerun
it to see its trace, bubbles and all.

**Try**: `micro_batch_sizes=(1, 2, 4)`, `zero=(0, 1, 3)` with `stack="torch_npu-eager"`
(DeepSpeed's ZeRO stages instead of Megatron's distributed optimizer), or twice the global batch,
and watch the pipeline layouts climb as the bubble shrinks.
""")

# ---------------------------------------------------------------- 13 limits
md("""
## 13 · What is modelled, and what is not

Modelled: the joint graph's kernels (forward, backward, recomputation) on the calibrated chip
model; fused optimizer kernels with fp32 master weights; O0/O1/O2 kernels and numerics, loss
scaling and its overflow check; the memory plan, the largest batch and `HBMCapacityError`;
DDP buckets overlapped with the backward on a communication stream over the server topology;
gradient accumulation; tensor parallelism (`tp=`, Megatron style, with sequence parallelism) for
transformer models, and MC2's overlap of their collectives with the matmuls; pipeline parallelism
(1F1B and interleaved), context parallelism (ring attention), ZeRO 1-3 / FSDP and Megatron's
distributed optimizer, full and selective recomputation; FlashAttention and
fused Vector kernels for causal LMs; QAT's fake-quantisation kernels; the loader's measured host
time and modelled copies.

Not modelled, so read the figures with this in mind:

- a **module** (ResNet-50, BERT here) trains unfused, as eager torch_npu runs it: every
  activation, cast and residual add is its own kernel through HBM (`fuse_vector=True` fuses them,
  as graph mode would);
- the attention **mask add** of BERT-style models is not costed (the mask is dropped at capture);
- **expert parallelism** (`ep=`) is accepted and checked but its all-to-alls are not costed, and
  transformers' MoE layers do not capture yet;
- the loader's host time is this machine's, not a training server's.

How close is it? `benchmarks/train_validation.py` compares `simulate_step` with published Ascend
training throughputs (`datasets/published_training/`, each row with its source and a quote);
`pypto-lab validate --set training` prints the table, per row with its error.

**Try**: `checkpoint=True` on ResNet-50; `tp=2` on BERT with 8 cards; your own model and loss.
""")


NB.write("09_training.ipynb")
