"""Generates notebooks/07_precision_and_quantization.ipynb (run: .venv/bin/python notebooks/_build/07_precision_and_quantization.py)."""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 07 · Precision and quantisation

The Cube unit multiplies **fp16** or **bf16** fractals with fp32 accumulation, or **int8** with
int32 accumulation (the 910B also has fp32 fractals, at a quarter of the fp16 rate). Lower precision
halves (fp16) or quarters (int8) the bytes every kernel moves and raises the Cube's peak rate; the
price is rounding error. This notebook measures both sides:

1. the error of a whole network in fp32 / fp16 / bf16 / int8 against the fp32 model
   (`compare_tensors`), layer by layer (`debug.compare_layers`), and how to find a layer that
   goes wrong;
2. mixed precision: which operators stay fp32, why, and what that costs on the Vector unit;
3. `amp.initialize` O1 / O2 with a `GradScaler` on a tiny training loop;
4. `quantize_dynamic` / `quantize_static` on all-MiniLM-L6-v2's real weights, and the simulated
   speed of fp32, fp16 and int8.

The outputs are real: `optimized(x)` computes them on the CPU with the NPU's numerics (fp16/bf16
storage, fp32 accumulation; int8 × int8 with exact int32 accumulation, dequantised in fp32).
""")

code("""
%matplotlib inline
import copy

import matplotlib.pyplot as plt
import torch
import torchvision
from torch import nn

import pypto_lab
from pypto_lab import amp, debug
from pypto_lab import quantization as Q
from pypto_lab.passes.mixed_precision import FP32_KEPT

CHIP = "Ascend910B1"   # the 910B's Cube has fp16, bf16, fp32 and int8 fractals
""")

# ---------------------------------------------------------------- section 1
md("""
## 1 · One network in four precisions

ResNet-18 with random weights (no download; the errors depend on the arithmetic, not on what the
network has learnt) at batch 1, optimised at level 2 for each precision, run, and compared with
the plain fp32 PyTorch model. Errors are relative to the largest |logit|.
""")

code("""
torch.manual_seed(0)
model = torchvision.models.resnet18().eval()
x = torch.randn(1, 3, 224, 224)
with torch.no_grad():
    ref = model(x)

results = {}
for precision in ("fp32", "fp16", "bf16", "int8"):
    om = pypto_lab.optimize(model, (x,), chip=CHIP, level=2, precision=precision)
    with torch.no_grad():
        out = om(x)
    c = pypto_lab.compare_tensors(out, ref, verbose=False)
    results[precision] = (om, c, out)

print(f"{'precision':9s} {'max |err| / max |ref|':>22s} {'cosine':>10s} {'top-5 same':>11s} {'simulated us':>13s}")
for precision, (om, c, out) in results.items():
    same = out.topk(5).indices.tolist() == ref.topk(5).indices.tolist()
    print(f"{precision:9s} {c.max_abs_error / c.reference_max_abs:22.2e} {c.cosine_similarity:10.6f} "
          f"{str(same):>11s} {om.report().latency_us:13.1f}")
""")

md("""
Each step down costs accuracy in proportion to the bits of mantissa kept: fp16 keeps 11, bf16 8
(bf16 trades mantissa for fp32's exponent range), int8 about 7 bits of a per-tensor or per-channel
scale. fp32 matches to rounding noise: the Cube accumulates in fp32 and only BatchNorm folding
changes the order of operations. bf16 runs exactly as fast as fp16 (same bytes, same fractal rate
on this chip); int8 is faster again because every operand is half as big as in fp16.

`compare_tensors` itself prints a verdict against tolerances, as the seed article's
`compare_tensors(cpu_tensor, npu_tensor, rtol=1e-3, atol=1e-5)` does. For fp16 that tight
tolerance fails, as it should; tolerances must follow the precision:
""")

code("""
out16 = results["fp16"][2]
_ = pypto_lab.compare_tensors(out16, ref, rtol=1e-3, atol=1e-5)
print()
_ = pypto_lab.compare_tensors(out16, ref, rtol=1e-2, atol=1e-2 * float(ref.abs().max()))
""")

# ---------------------------------------------------------------- layers
md("""
### Layer by layer: `debug.compare_layers`

`compare_layers(model, optimized, inputs)` runs the captured program twice, in fp32 and with the
NPU's numerics, and compares every node. Two errors per layer:

* **accumulated**: the optimised run's value against the reference, with every earlier layer's
  error carried in;
* **local**: the layer's own NPU numerics applied to the *reference* inputs, its own error alone.

For fp16 and int8, the relative error of every layer:
""")

code("""
layers = {}
for precision in ("fp16", "int8"):
    with torch.no_grad():
        layers[precision] = debug.compare_layers(model, results[precision][0], (x,))

def rel(c):
    return c.max_abs_error / c.reference_max_abs if c.reference_max_abs else 0.0

fig, ax = plt.subplots(figsize=(10, 3.4))
for precision, colour in (("fp16", "#4c72b0"), ("int8", "#c44e52")):
    lc = layers[precision]
    ax.plot([rel(c.local) for c in lc], color=colour, linestyle=":", label=f"{precision} local")
    ax.plot([rel(c.accumulated) for c in lc], color=colour, label=f"{precision} accumulated")
ax.set_yscale("log")
ax.set_xlabel("layer (graph order)")
ax.set_ylabel("max |err| / max |ref|")
ax.set_title("ResNet-18 on " + CHIP + ": error of every layer against fp32")
ax.legend(ncol=2, fontsize=8)
fig.tight_layout()
""")

code("""
for precision, lc in layers.items():
    worst = max(lc, key=lambda c: rel(c.local))
    print(f"{precision}: {len(lc)} layers compared; largest local error at {worst.layer} ({rel(worst.local):.1e}), "
          f"final accumulated {rel(lc[-1].accumulated):.1e}")
""")

md("""
The local errors do not grow along the network. For int8 they alternate: the convolutions (int8
on the Cube) sit near 1e-2, because each one's input is rounded to 256 levels of one scale, while
the ReLUs and residual adds between them (fp16 on the Vector unit) sit at fp16's level. The
accumulated error grows slowly: each layer adds its own rounding to what it inherits, and the
residual additions keep feeding earlier errors forward. It falls at the very end, where the
average pool averages the errors of the last 7 × 7 positions.

### Localising a broken layer

Now a deliberate fault: we zero one output channel of `layer2.1.conv1` in the optimised run (as a
wrong weight layout or a bad kernel might) through `compare_layers`' `hook`, and ask which layer
is to blame. The accumulated comparison fails everywhere after the fault; the local one only where
the fault is made, so `first_failure()` names it:
""")

code("""
om16 = results["fp16"][0]
target = next(c.name for c in layers["fp16"] if c.module == "layer2.1.conv1")

def broken_channel(node_name, value):
    if node_name == target:
        value = value.clone()
        value[:, 7] = 0          # one of 128 channels lost
        return value
    return None

with torch.no_grad():
    faulty = debug.compare_layers(model, om16, (x,), hook=broken_channel)
first = faulty.first_failure()
print("first layer failing on its own:", first.layer, f"(node {first.name})")
print(f"accumulated failures: {len(faulty.failures(local=False))} layers, local failures: {len(faulty.failures())}")
print()
print("\\n".join(faulty.table(only_failures=True).splitlines()[:7]))
""")

# ---------------------------------------------------------------- mixed precision
md("""
## 2 · Mixed precision: what stays fp32, and what it costs

Under mixed precision the Cube operators (convolutions, matmuls, attention's products) run in
fp16, but a few operators keep **fp32 arithmetic**. The seed article warns that softmax "may need
to stay fp32 to avoid numerical instability". `amp.FP32_OPS` is the list `amp.autocast` keeps in
fp32, and the `mixed_precision` pass does the same on the simulated chip (fp32 in UB, fp16 in GM):
""")

code("""
print("kept fp32 on the chip:", ", ".join(sorted(FP32_KEPT)))
print("run in fp16 by autocast:", ", ".join(amp.FP16_OPS[:12]), "...")
""")

md("""
**Why these ops.** They are reductions: a sum of many terms whose rounding errors add up, or whose
partial sums leave fp16's range (max 65,504). Below, softmax and a LayerNorm variance computed on
the Vector unit's way (a pairwise tree of additions, every partial result rounded to the compute
dtype), from the same fp16 inputs, against an fp64 reference:
""")

code("""
def tree_sum(t):
    \"\"\"Pairwise reduction along the last axis, every partial sum rounded to t's dtype.\"\"\"
    while t.shape[-1] > 1:
        if t.shape[-1] % 2:
            t = torch.cat([t, torch.zeros_like(t[..., :1])], -1)
        t = t[..., ::2] + t[..., 1::2]
    return t

def softmax_in(logits, dtype):
    v = logits.to(dtype)
    e = torch.exp(v - v.amax(-1, keepdim=True))
    return (e / tree_sum(e)).half()          # stored in fp16 either way

def layernorm_in(v, dtype):
    v = v.to(dtype)
    n = v.shape[-1]
    mean = tree_sum(v) / n
    var = tree_sum(v * v) / n - mean * mean
    return ((v - mean) / torch.sqrt(var + 1e-5)).half(), var

torch.manual_seed(0)
logits = (torch.randn(64, 1024) * 4).half()
p_ref = torch.softmax(logits.double(), -1)
acts = (torch.randn(8, 768) * 2 + 60).half()       # activations with a large mean, as after a residual add
ln_ref = nn.functional.layer_norm(acts.double(), (768,))
for dtype in (torch.float16, torch.float32):
    p = softmax_in(logits, dtype).double()
    y, var = layernorm_in(acts, dtype)
    print(f"compute in {str(dtype)[6:]}: softmax max |err| {(p - p_ref).abs().max():.1e}; "
          f"LayerNorm variance {var.flatten()[0].item():.4g}, max |err| {(y.double() - ln_ref).abs().max():.2g}")
""")

md("""
In fp16 the softmax error is several times larger, and the LayerNorm collapses: the sum of squares
of 768 values near 60 is about 2.8 million, far past fp16's 65,504, so the variance is infinite
and every output becomes 0. In fp32 both are at the level of the final fp16 rounding.

**What it costs.** Keeping fp32 *compute* with fp16 *storage* costs a VCONV up after each load and
one down before each store, and UB tiles twice as large; GM traffic stays fp16.
`simulate_vector(..., compute_dtype="fp32")` simulates exactly that. BERT-base's attention softmax
(batch 8, 12 heads, 128 × 128) and a LayerNorm over 768, on both chips:
""")

code("""
cases = {"softmax": (8 * 12 * 128 * 128, 128), "layernorm": (8 * 128 * 768, 768)}
rows = []
for chip in ("Ascend910B1", "Ascend910A"):
    for op, (numel, row) in cases.items():
        t16 = pypto_lab.simulate_vector(op, numel, dtype="fp16", chip=chip, row_len=row)
        mix = pypto_lab.simulate_vector(op, numel, dtype="fp16", chip=chip, row_len=row, compute_dtype="fp32")
        t32 = pypto_lab.simulate_vector(op, numel, dtype="fp32", chip=chip, row_len=row)
        rows.append((chip, op, t16, mix, t32))
print(f"{'chip':12s} {'op':10s} {'fp16':>8s} {'fp16 GM, fp32 UB':>17s} {'fp32':>8s}   (us; bound of the mixed kernel)")
for chip, op, t16, mix, t32 in rows:
    print(f"{chip:12s} {op:10s} {t16.time_us:8.2f} {mix.time_us:17.2f} {t32.time_us:8.2f}   "
          f"{mix.time_us / t16.time_us:.2f}x fp16, {mix.bound}")
""")

md("""
On the 910B1 the Vector unit is fast enough that these kernels stay memory-bound, so fp32
arithmetic on fp16 data costs little for LayerNorm and about a fifth for softmax (the kernel still
moves fp16 bytes), while going all-fp32 would double the bytes. On the 910A's slower Vector unit the kernels are compute-bound: the casts
are real extra work, and for softmax the mixed kernel is even slower than pure fp32, which needs no
casts. Either way the cost is confined to these few operators: the matmuls and convolutions, where
the time is, run in fp16.
""")

# ---------------------------------------------------------------- amp
md("""
## 3 · `amp.initialize` O1 / O2 and `GradScaler`

The seed article's training recipe: `model, optimizer = amp.initialize(model, optimizer, opt_level="O2")`.

* **O1** leaves the weights in fp32 and runs the forward under `autocast`: the ops of
  `amp.FP16_OPS` in fp16, those of `amp.FP32_OPS` in fp32.
* **O2** casts the weights to fp16 (norm layers stay fp32), casts inputs to fp16 and outputs back
  to fp32, and the optimizer updates **fp32 master weights**: an update of 1e-4 to a weight of 1.0
  is below fp16's resolution there (the spacing of fp16 numbers near 1 is about 1e-3) and would be
  lost.
* **Loss scaling**: small gradients underflow in fp16 (below about 6e-8 they become 0). Multiplying
  the loss by a scale before `backward` lifts them into range; the optimizer divides it out in fp32.
""")

code("""
g = torch.tensor([3e-9, 2e-8, 1e-6, 1e-4])
print("gradients              ", g.tolist())
print("in fp16                ", g.half().float().tolist())
print("x 65536 in fp16, / 65536", (g * 65536).half().float().div(65536).tolist())
""")

md("""
A tiny classifier (Linear → LayerNorm → ReLU → Linear) on synthetic data, trained for 60 steps at
O0 (fp32), O1 and O2 with dynamic loss scaling (`amp.scale_loss`, as apex has):
""")

code("""
torch.manual_seed(0)
X = torch.randn(512, 32)
Y = (X @ torch.randn(32, 1) + 0.1 * torch.randn(512, 1) > 0).float()
base = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 1))

curves, info = {}, {}
for level in ("O0", "O1", "O2"):
    net = copy.deepcopy(base)
    net, opt = amp.initialize(net, torch.optim.SGD(net.parameters(), lr=0.1), opt_level=level)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        logits = net(X)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), Y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.item())
    curves[level] = losses
    info[level] = (net[0].weight.dtype, net[1].weight.dtype, opt.master_params()[0].dtype, logits.dtype,
                   opt.scaler.get_scale(), opt.skipped_steps)

print(f"{'level':5s} {'Linear w':>9s} {'LayerNorm w':>12s} {'master w':>9s} {'output':>8s} {'scale':>8s} "
      f"{'skipped':>8s} {'loss 0 -> 59':>16s}")
for level, (lw, nw, mw, od, scale, skipped) in info.items():
    c = curves[level]
    print(f"{level:5s} {str(lw)[6:]:>9s} {str(nw)[6:]:>12s} {str(mw)[6:]:>9s} {str(od)[6:]:>8s} {scale:8.0f} "
          f"{skipped:8d} {c[0]:7.4f} -> {c[-1]:.4f}")
""")

code("""
fig, ax = plt.subplots(figsize=(7, 3))
for level, style in (("O0", "-"), ("O1", "--"), ("O2", ":")):
    ax.plot(curves[level], style, label=level)
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.set_title("The same model at O0 / O1 / O2: the curves overlap")
ax.legend()
fig.tight_layout()
""")

md("""
The three curves overlap: at this scale fp16 with fp32 masters loses nothing. At O2 the model's
Linear weights are fp16 while the optimizer's masters are fp32, and the LayerNorm stays fp32.

**Dynamic loss scaling at work.** Starting from a scale that is far too large, the scaled
gradients overflow to inf; the scaler skips that step (the weights are not touched) and halves the
scale, until the gradients fit; after `growth_interval` clean steps it tries doubling again, and
backs off once more if that overflows:
""")

code("""
net = copy.deepcopy(base)
net, opt = amp.initialize(net, torch.optim.SGD(net.parameters(), lr=0.1), opt_level="O2")
opt.scaler = amp.GradScaler(init_scale=2.0 ** 24, growth_interval=10)   # deliberately too large
scales, skipped = [], []
for _ in range(40):
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(net(X), Y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    before = opt.skipped_steps
    opt.step()
    scales.append(opt.scaler.get_scale())
    skipped.append(opt.skipped_steps > before)
print(f"skipped steps: {sum(skipped)} (steps {[i for i, s in enumerate(skipped) if s]})")
print("scale after each step:", [f"2^{int(torch.log2(torch.tensor(s)))}" for s in scales[:16]], "...")
""")

# ---------------------------------------------------------------- quantisation
md("""
## 4 · int8 on real weights: all-MiniLM-L6-v2

all-MiniLM-L6-v2 (a 6-layer, 384-wide sentence encoder) with its real weights, from a package that
ships them (nothing is downloaded). We embed the hand-written sentences of `datasets/sentences`
(mean-pooled, L2-normalised, as sentence-transformers does) with the fp32 model and with two int8
versions of its Linear layers:

* `quantize_dynamic`: int8 weights (one scale per output channel); each input is quantised at run
  time with the scale of its own max |x|;
* `quantize_static`: the same weights, but the input scales are fixed in advance by observing
  calibration data. We calibrate on the first half of the sentences and evaluate on the second
  half, so the calibration has not seen the test sentences.
""")

code("""
from pypto_lab.models import zoo

mini, (ids,) = zoo.minilm(batch=8, seq=128)
tok = Q.minilm_tokenizer()
sentences = Q.load_sentences()
calib_sents, test_sents = sentences[:len(sentences) // 2], sentences[len(sentences) // 2:]

emb_fp32 = Q.sentence_embeddings(mini, tok, test_sents)
q_dyn = Q.quantize_dynamic(mini, {nn.Linear}, dtype=torch.qint8)
calib = [dict(tok(calib_sents[i:i + 16], padding=True, return_tensors="pt")) for i in range(0, len(calib_sents), 16)]
q_static = Q.quantize_static(mini, calib)
emb = {"int8 dynamic": Q.sentence_embeddings(q_dyn, tok, test_sents),
       "int8 static": Q.sentence_embeddings(q_static, tok, test_sents)}
""")

code("""
# NBVAL_CHECK_OUTPUT
n_q = sum(isinstance(m, Q.QuantizedLinear) for m in q_dyn.modules())
n_lin = sum(isinstance(m, nn.Linear) for m in mini.modules())
print(f"{n_q} of {n_lin} Linear layers quantised; {len(calib_sents)} calibration sentences, {len(test_sents)} test sentences")
""")

code("""
for name, e in emb.items():
    cos = (emb_fp32 * e).sum(-1)
    print(f"{name:13s} cosine to fp32 embeddings: mean {cos.mean():.4f}, min {cos.min():.4f}")
""")

md("""
What matters for a sentence encoder is whether it still ranks sentences the same way. For each
test sentence, its nearest neighbour among the others, in fp32 and in int8:
""")

code("""
def neighbours(e):
    sim = e @ e.T
    sim.fill_diagonal_(-2)
    return sim.argmax(-1)

nn_fp32 = neighbours(emb_fp32)
for name, e in emb.items():
    got = neighbours(e)
    agree = (got == nn_fp32).float().mean()
    sim = emb_fp32 @ emb_fp32.T
    flipped = (got != nn_fp32).nonzero().flatten()
    gaps = [float(sim[i, nn_fp32[i]] - sim[i, got[i]]) for i in flipped]
    print(f"{name:13s} same nearest neighbour as fp32 for {agree:.0%} of {len(test_sents)} sentences; "
          f"where it differs, the fp32 similarities of the two candidates differ by at most {max(gaps, default=0):.3f}")
""")

md("""
Where int8 picks another neighbour, the two candidates were nearly tied in fp32 already (the
largest gap is printed above, on a cosine scale where unrelated sentences sit far below related
ones): an embedding error of a few 1e-2 is enough to swap near-ties, not to confuse unrelated
sentences.
""")

md("""
### The simulated speed of fp32, fp16 and int8

The same encoder at batch 8 × 128 tokens, optimised at level 2 on the 910B1: the float model at
fp32, fp16 and the compiler's own int8 (`precision="int8"`: Cube in int8, input scales static),
and the two quantised models (their Linear layers are int8 custom ops, the rest fp16):
""")

code("""
variants = [("fp32", mini, "fp32"), ("fp16", mini, "fp16"), ('precision="int8"', mini, "int8"),
            ("quantize_dynamic", q_dyn, "fp16"), ("quantize_static", q_static, "fp16")]
speed = {}
for name, m, precision in variants:
    speed[name] = pypto_lab.optimize(m, (ids,), chip=CHIP, level=2, precision=precision).report()
base_us = speed["fp32"].latency_us
for name, rep in speed.items():
    print(f"{name:18s} {rep.latency_us:7.1f} us   {base_us / rep.latency_us:4.2f}x vs fp32   "
          f"{speed['fp16'].latency_us / rep.latency_us:4.2f}x vs fp16")
""")

code("""
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.barh(list(speed), [r.latency_us for r in speed.values()],
        color=["#8c8c8c", "#4c72b0", "#55a868", "#c44e52", "#dd8452"])
ax.invert_yaxis()
ax.set_xlabel("simulated latency (us)")
ax.set_title(f"all-MiniLM-L6-v2, batch 8 x 128, {CHIP}, level 2")
fig.tight_layout()
""")

md("""
Reading the figures, next to the seed article's claim that fp16 is **1.5–2× faster** than fp32:

* **fp16 vs fp32** is the "vs fp32" column of the fp16 row, in the article's range: every tensor
  is half the bytes and the Cube's fp16 rate is higher. (`benchmarks/README.md` has ResNet-50
  batch 32 at 1.96×.)
* **int8 is not another 2×.** MiniLM is small (384 wide): its matmuls are short, and a large part
  of the time is in Vector kernels (softmax, LayerNorm, GELU, the attention's reshapes) that stay
  fp16. int8 only speeds up the Cube part.
* **`quantize_dynamic` is slower than fp16.** Before each int8 matmul the kernel must find the
  scale of its input, then quantise it: two Vector passes over the activation, each reading it
  from GM. At this size they cost more than the int8 Cube saves. Static scales (`quantize_static`,
  or the compiler's `precision="int8"`) need no max-reduction, which is why calibration matters for
  speed as well as for accuracy.

The first query projection's kernel in each variant, part by part, and the share of the Cube
kernels in the fp16 model:
""")

code("""
for name in ("fp16", 'precision="int8"', "quantize_dynamic", "quantize_static"):
    k = next(k for k in speed[name].kernels if k.name.endswith("encoder.layer.0.attention.self.query"))
    parts = ", ".join(f"{r.name} ({r.unit}) {r.time_us:.2f}" for r in k.reports)
    print(f"{name:18s} {k.name.split(':')[0]:20s} {k.time_us:5.2f} us = {parts}")
fp16 = speed["fp16"]
cube_us = sum(k.time_us for k in fp16.kernels if k.unit == "cube")
print(f"\\nfp16 model: Cube kernels {cube_us:.0f} us of {sum(k.time_us for k in fp16.kernels):.0f} us of kernel time")
""")
md("""
Even with a static scale, this small projection (1024 × 384 × 384) is slower in int8 than in fp16:
its input comes from a LayerNorm, not from another Cube kernel, so it must be quantised first, and
that Vector pass costs more than the int8 Cube saves. The int8 gain comes from the larger matmuls
(the feed-forward layers, 384 → 1536 → 384) and from inputs that another Cube kernel already
produced in int8-ready form.
""")



if __name__ == "__main__":
    NB.write("07_precision_and_quantization.ipynb")
