"""Generates notebooks/06_profiling_and_traces.ipynb (run: .venv/bin/python notebooks/_build/06_profiling_and_traces.py)."""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 06 · Profiling and traces

The seed article's profiling workflow, on a whole model: optimise ResNet-50, run it, profile the
run with `pypto_lab.profiler.profile` (torch.profiler's shape), read the operator table, export a
Chrome trace and Ascend's `kernel_details.csv`, look at the model's pipe swimlane, and let
`tuning.auto_tune` retile the Cube kernels.

**Where the numbers come from.** There is no NPU here. The *NPU* columns are the simulator's:
every kernel of the optimised graph with its simulated time, placed where the report's schedule
starts it. The *CPU* columns are measured: the wall time of `optimized(x)`, which computes the
real outputs on this machine's CPU with the NPU's numerics. The two clocks have nothing to do with
each other: seconds of CPU emulation stand for microseconds of simulated NPU time.
""")

code("""
%matplotlib inline
import csv
import json
import tempfile
from pathlib import Path

import ipywidgets as W
import matplotlib.pyplot as plt
import torch
import torchvision

import pypto_lab
from pypto_lab import profiler, tuning
from pypto_lab.hw.chip import PIPES
from pypto_lab.viz.views import plot_model_swimlane, plot_swimlane

OUT = Path("..") / "out" / "notebooks"     # exports go here (out/ is ignored by git)
OUT.mkdir(parents=True, exist_ok=True)
""")

md("""
## 1 · Optimise ResNet-50 and run it

ResNet-50 at batch 1 with random weights (the simulated times depend only on shapes; no weights
are downloaded), optimised at level 2 in fp16 for the Ascend 910B1: Conv+BN+ReLU fusion, the
NC1HWC0 layout and GM buffer reuse, but not the tiling search of level 3, so that `auto_tune` has
something to find at the end.
""")

code("""
torch.manual_seed(0)
model = torchvision.models.resnet50().eval()
x = torch.randn(1, 3, 224, 224)
om = pypto_lab.optimize(model, (x,), chip="Ascend910B1", level=2, precision="fp16")
report = om.report()
""")

code("""
# NBVAL_CHECK_OUTPUT
cube = sum(1 for k in report.kernels if k.unit == "cube")
print(f"{report.model} on {report.chip}, level {report.level}, {report.precision}: "
      f"{len(report.kernels)} kernels ({cube} on the Cube)")
""")

code("""
print(f"simulated latency {report.latency_us:.1f} us")
""")

md("""
`om(x)` returns the model's real outputs, computed with what the optimised graph implies: fp16
storage with fp32 accumulation on the Cube, BatchNorm folded into the convolutions' weights. They
are close to the fp32 model's, not equal:
""")

code("""
with torch.no_grad():
    y_npu = om(x)
    y_ref = model(x)
cmp = pypto_lab.compare_tensors(y_npu, y_ref, rtol=1e-2, atol=1e-2 * float(y_ref.abs().max()), verbose=True)
top5_npu = y_npu.topk(5).indices.tolist()[0]
top5_ref = y_ref.topk(5).indices.tolist()[0]
print("top-5 classes, fp32 model:", top5_ref, " optimised:", top5_npu)
print(f"wall time of om(x) on this CPU: {om.last_cpu_us / 1e6:.1f} s (emulating the numerics), "
      f"simulated NPU time: {report.latency_us:.1f} us")
""")

# ---------------------------------------------------------------- profiler
md("""
## 2 · `profiler.profile` and `key_averages().table()`

As in torch: a context manager records every run of an optimised model made inside it. We run
the model twice, so every operator shows 2 calls per kernel of that type.
""")

code("""
with profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU],
                      record_shapes=True, profile_memory=True) as prof:
    with torch.no_grad():
        for _ in range(2):
            om(x)

print(prof.key_averages().table(sort_by="npu_time_total", row_limit=10))
""")

md("""
How to read it:

* `optimized_model.__call__` is the only CPU row. Its *Self CPU* is the measured emulation time;
  its *NPU total* is the sum of the simulated kernels it launched, as torch credits a Python op
  with the device kernels under it.
* Every other row is an NPU operator type, aggregated over both runs. `Conv2D` (each one with its
  BatchNorm, ReLU and, at the end of a bottleneck, the residual add fused in) takes almost all of
  the NPU time: ResNet-50 is a Cube workload. `MaxPool`, the average pool and `TransData` (the
  layout changes the layout pass inserted) run on the Vector cores.
* *NPU Mem* is the GM the operator's outputs occupy, sized as the memory plan sizes them.

`group_by_input_shape=True` splits the rows by shape, which tells you *which* convolutions are
the hot spots:
""")

code("""
print(prof.key_averages(group_by_input_shape=True).table(sort_by="npu_time_total", row_limit=8,
                                                         max_name_column_width=12))
""")

md("""
The rows are ordered by total time, calls × average: layer 3's 3 × 3 convolutions lead because
there are five of that shape per run. Per call, layer 4's 3 × 3 convolution is the slowest, and
it does exactly as many FLOPs as layer 3's. As implicit GEMMs (M = output pixels, K = C_in × 3 × 3,
N = C_out):
""")

code("""
for name in ("Conv2D:layer3.1.conv2", "Conv2D:layer4.1.conv2"):
    k = next(k for k in report.kernels if k.name == name)
    r = k.reports[0]
    s = r.shape
    print(f"{name:22s} GEMM {s['m']:4d} x {s['k']:4d} x {s['n']:3d} = {r.flops / 1e6:6.1f} MFLOP, "
          f"{r.min_gm_bytes / 1e6:.2f} MB to move at least, {r.time_us:.2f} us, cube utilisation {r.cube_utilization:.0%}")
""")

md("""
Layer 4's GEMM is short (7 × 7 = 49 output rows at batch 1) and deep, and its weights are four
times larger (512 × 512 × 3 × 3 against 256 × 256 × 3 × 3). At batch 1 each weight is used for only
49 output pixels, so for the same arithmetic the kernel must bring far more bytes from HBM: it is
closer to memory-bound, and the Cube waits.
""")

# ---------------------------------------------------------------- chrome trace
md("""
## 3 · The Chrome trace

`prof.export_chrome_trace(path)` writes a JSON trace. Open it in **Perfetto**
(<https://ui.perfetto.dev>, *Open trace file*; the file stays in your browser) or in Chrome's
`chrome://tracing` (*Load*). You will see:

* a **CPU** process: the measured `optimized_model.__call__` spans (wall clock from the profile's start);
* an **NPU kernels** process: one slice per kernel on the simulated schedule (a second lane appears
  where two streams overlap kernels at level 3);
* one process per **AI core** (on the 910B: `AIC` Cube cores and `AIV` Vector cores), one thread
  per pipe (MTE2, MTE1, CUBE, FIXP, VECTOR, MTE3), one slice per instruction.

Click a kernel slice to see its arguments: operator, fused ops, GM bytes, block count.
""")

code("""
trace_path = prof.export_chrome_trace(OUT / "resnet50_b1_trace.json")
trace = json.loads(Path(trace_path).read_text())
slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
names = {(e["pid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
print(f"{trace_path}: {Path(trace_path).stat().st_size / 1e6:.1f} MB, {len(slices):,} slices in "
      f"{len(names)} processes")
print("processes:", ", ".join(list(names.values())[:6]), "...")
print("about the time axes:", trace["otherData"]["pypto_lab"]["npu_time_axis"], "|",
      trace["otherData"]["pypto_lab"]["cpu_time_axis"])
kernel_slice = next(e for e in slices if e.get("cat") == "kernel" and e["name"].startswith("Conv2D"))
print("a kernel slice:", kernel_slice["name"], kernel_slice["args"])
""")

# ---------------------------------------------------------------- kernel details
md("""
## 4 · `kernel_details.csv`

`prof.export_kernel_details(path)` writes the columns of the `kernel_details.csv` that Ascend's
profiler produces: one row per kernel per run, with its accelerator core type, start, duration,
wait time, block count and the shapes, dtypes and formats it reads. It is plain CSV, so the
standard library reads it:
""")

code("""
csv_path = prof.export_kernel_details(OUT / "resnet50_b1_kernel_details.csv")
with open(csv_path, newline="") as f:
    rows = list(csv.DictReader(f))
print(f"{csv_path}: {len(rows)} rows ({len(rows) // 2} kernels x 2 runs)\\n")

cols = ["Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)", "Block Num", "Input Formats"]
widths = [30, 10, 16, 14, 12, 9, 16]
print("  ".join(c[:w].ljust(w) for c, w in zip(cols, widths)))
for r in rows[:12]:
    print("  ".join(str(r[c])[:w].ljust(w) for c, w in zip(cols, widths)))
""")

md("""
The first rows are the start of the network: a `TransData` converts the ND input image to the
NC1HWC0 layout the Cube's convolution reads (channels in groups of 16, so a 16-wide fractal can be
loaded in one burst), `conv1` runs on all 24 Cube cores (`AI_CORE`), `MaxPool` on 48 Vector cores
(`AI_VECTOR_CORE`). `MIX_AIC` marks Cube kernels that also use the Vector cores: the convolutions
that end a bottleneck, whose residual add runs as a Vector epilogue. Summing the durations of the
first run by type and by core type:
""")

code("""
run0 = rows[:len(rows) // 2]
by_type, by_core = {}, {}
for r in run0:
    by_type[r["Type"]] = by_type.get(r["Type"], 0.0) + float(r["Duration(us)"])
    by_core[r["Accelerator Core"]] = by_core.get(r["Accelerator Core"], 0.0) + float(r["Duration(us)"])
total = sum(by_type.values())
for t, us in sorted(by_type.items(), key=lambda kv: -kv[1]):
    print(f"{t:20s} {us:8.1f} us  {us / total:6.1%}")
print()
for c, us in by_core.items():
    print(f"{c:20s} {us:8.1f} us  {us / total:6.1%}")

top = sorted(run0, key=lambda r: -float(r["Duration(us)"]))[:12]
fig, ax = plt.subplots(figsize=(8, 3.6))
ax.barh([r["Name"].split(":", 1)[1] for r in top], [float(r["Duration(us)"]) for r in top], color="#c44e52")
ax.invert_yaxis()
ax.set_xlabel("simulated duration (us)")
ax.set_title("ResNet-50 b1, 910B1, level 2: the 12 longest kernels (from kernel_details.csv)")
fig.tight_layout()
""")

# ---------------------------------------------------------------- swimlane
md("""
## 5 · The model swimlane

`plot_model_swimlane(om, start_kernel, count, cores)` draws the pipes of chosen cores over a
window of the model's kernels, each kernel's simulated timeline shifted to its start in the
schedule: the static version of what the trace shows. Cores are numbered chip-wide, as in the
Chrome trace: on the 910B1, 0-23 are the Cube cores (`AIC`) and 24 onward the Vector cores
(`AIV`). Below, `AIC 0` and `AIV 0` over the first five kernels: the convolutions run on the
AIC lane, `TransData` and `MaxPool` on the AIV lane.
""")

code("""
chip = pypto_lab.get_chip(om.report().chip)
fig = plot_model_swimlane(om, start_kernel=0, count=5, cores=(0, chip.cube_cores))
print("kernels in the window:", fig.pypto_data["kernels"])
fig
""")

md("""
`TransData` and `MaxPool` use the Vector pipes (MTE2 → VECTOR → MTE3), the convolutions the Cube
pipes (MTE2 → MTE1 → CUBE → FIXP; their ReLU rides the FixPipe on its way out of L0C). During a
Vector kernel the Cube cores idle and during a Cube kernel the Vector cores do: at level 2 the
kernels run one after another. Level 3's two-stream schedule lets an independent Vector kernel run
next to a Cube one. `conv1` is MTE2-bound: its 7 × 7 × 3 input patches (K = 147) give the Cube
little work per byte loaded.

In Jupyter, the sliders below move the window (a saved copy of the notebook keeps the window as it
was last drawn):
""")

code("""
from pypto_lab.viz.widgets import figure_interact

swimlane_widget = figure_interact(
    lambda start_kernel, count: plot_model_swimlane(om, start_kernel=start_kernel, count=count, cores=(0,)),
    title="the model's swimlane, core 0",
    start_kernel=W.IntSlider(value=20, min=0, max=len(report.kernels) - 1, description="start_kernel"),
    count=W.IntSlider(value=4, min=1, max=12, description="count"))
swimlane_widget
""")

# ---------------------------------------------------------------- auto_tune
md("""
## 6 · `tuning.auto_tune`

For every distinct Cube kernel, `auto_tune` enumerates the legal tilings (they must fit L1,
L0A/L0B/L0C and respect the fractal alignment), screens them all with a fast analytic cost, then
simulates the most promising few and keeps a tiling only when the simulator says it beats the
current one, so a kernel never gets slower. Level `"fast"` searches power-of-two tiles and
simulates at most 4 per kernel. The results go to a JSON cache, here in a temporary directory:
""")

code("""
before = {k.name: k for k in om.report().kernels if k.unit == "cube"}
latency_before = om.report().latency_us
tuning_dir = tempfile.TemporaryDirectory(prefix="pypto_tune_")   # removed when the kernel stops
cache_dir = tuning_dir.name
cache_file = Path(cache_dir) / "tuning.json"
result = tuning.auto_tune(om, tune_config={"level": "fast"}, cache_path=cache_file)
after = {k.name: k for k in om.report().kernels if k.unit == "cube"}
print(result.table())
""")

code("""
print(f"latency {latency_before:.1f} us -> {om.report().latency_us:.1f} us "
      f"({latency_before / om.report().latency_us:.2f}x) after auto_tune")
""")

md("""
Where do the gains come from? The kernels that gained most, with their tiling and the number of
Cube cores that got work, before and after:
""")

code("""
def tile_str(t):
    return f"m[{t['m_l0']},{t['m_l1']}] k[{t['k_l0']},{t['k_l1']}] n[{t['n_l0']},{t['n_l1']}]"

best_rows = sorted(result.rows, key=lambda r: -r.gain_pct)[:4]
for row in best_rows:
    name = row.kernel
    b, a = before[name].reports[0], after[name].reports[0]
    s = b.shape
    print(f"{name}  (GEMM {s['m']} x {s['k']} x {s['n']}): {row.gain_pct:.0f}% faster")
    print(f"   before  {tile_str(b.tile):36s} {b.cores_used:2d} cores  {b.time_us:5.2f} us")
    print(f"   after   {tile_str(a.tile):36s} {a.cores_used:2d} cores  {a.time_us:5.2f} us")
""")

md("""
Two hardware reasons appear:

* **More cores with work.** A Cube kernel's task is one `m_l1 × n_l1` output block. When the
  default blocks are large for a small GEMM, there are fewer blocks than the 24 Cube cores; a
  smaller block gives the idle cores something to do.
* **A shorter pipeline fill.** The Cube cannot start before the first K-panel is in L1 and its
  first piece in L0A/L0B. With a smaller `k_l1` and `k_l0` that first load is shorter, and MTE1 and
  the Cube overlap in finer steps; at batch 1 each block has so little work that the fill and
  drain of its pipeline are a large part of it.

The swimlane of the biggest winner's first Cube core, before and after (and the cycle at which its
Cube starts):
""")

code("""
for when, k in (("before", before[best_rows[0].kernel]), ("after", after[best_rows[0].kernel])):
    tl = k.reports[0].instructions
    first_cube = tl.start[(tl.core == 0) & (tl.pipe == PIPES.index("CUBE"))].min()
    print(f"{when:6s}: first MMAD on core 0 at cycle {first_cube:,.0f}, kernel {k.reports[0].cycles:,.0f} cycles")
""")

code("""
name = best_rows[0].kernel
plot_swimlane(before[name].reports[0], core=0)
""")

code("""
plot_swimlane(after[name].reports[0], core=0)
""")

md("""
A second `auto_tune` with the same cache simulates nothing: every kernel is a cache hit (the
`[cache]` marks), which is how a tuned configuration is reused across sessions. We tune a fresh
optimisation of the same model, since the first one already carries its tuned tiles:
""")

code("""
om2 = pypto_lab.optimize(model, (x,), chip="Ascend910B1", level=2, precision="fp16")
again = tuning.auto_tune(om2, tune_config={"level": "fast"}, cache_path=cache_file)
print(f"simulations: {again.simulations}, cache hits: {sum(r.cached for r in again.rows)} of {len(again.rows)} kernels")
print(f"latency {om2.report().latency_us:.1f} us (first tuning: {om.report().latency_us:.1f} us)")
""")

md("""
How much `auto_tune` finds depends on how good the starting tilings are. At level 3, `optimize`
already runs its own tiling search (the `tune_tiling` pass, which simulates candidate tilings of
every Cube kernel), so `auto_tune` on a level-3 model has less left to gain:
""")

code("""
om3 = pypto_lab.optimize(model, (x,), chip="Ascend910B1", level=3, precision="fp16")
l3_before = om3.report().latency_us
tuning.auto_tune(om3, tune_config={"level": "fast"}, cache_path=Path(cache_dir) / "level3.json")
print(f"level 3: {l3_before:.1f} us -> {om3.report().latency_us:.1f} us after auto_tune "
      f"({l3_before / om3.report().latency_us:.2f}x); level 2 + auto_tune: {om.report().latency_us:.1f} us")
""")

md("""
The seed article recommends auto-tune for compute-bound operators but gives no figure for it;
the simulator's figures are the latency ratios printed above.
""")


if __name__ == "__main__":
    NB.write("06_profiling_and_traces.ipynb")
