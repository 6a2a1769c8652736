"""Generates notebooks/05_writing_kernels.ipynb (run: .venv/bin/python notebooks/_build/05_writing_kernels.py)."""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 05 · Writing kernels with the PyPTO-style DSL

CANN **PyPTO** lets you write an operator as a Python function over tensors; the framework
cuts it into **tiles**, deals the tiles to the AI Cores and schedules them onto the pipes.
`import pypto_lab.pto as pypto` gives the same programming model in **SIM mode**: the kernel
text is the real framework's, the outputs are real (computed on the CPU with the NPU's
numerics: fp16/bf16 storage, fp32 accumulation), and the time is the cycle-level simulation of
the chip.

A kernel goes through four stages on its first call (then it is cached per input signature):

| stage | what it holds |
|---|---|
| **Tensor Graph** | the traced operations on whole tensors (`x + y`, `amax`, `matmul`) |
| **Tile Graph** | the operations cut into tiles by the tile shapes in force, grouped so a group's tiles live in one on-chip buffer |
| **Block Graph** | the tiles (tasks) dealt round-robin to the cores: Vector cores (AIV) for vector groups, Cube cores (AIC) for matmuls |
| **Execute Graph** | per core, the instructions on each pipe (MTE2 loads, VECTOR / CUBE compute, MTE1, FixPipe, MTE3 stores) with their flags and ping-pong buffers; this is what the event simulator runs |

All kernels here run on the default chip, the **Ascend 910B1** (24 Cube cores, 48 Vector cores).
""")

code("""
%matplotlib inline
import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch

import pypto_lab
import pypto_lab.pto as pypto
from pypto_lab.hw.chip import PIPES
from pypto_lab.viz.views import plot_pipe_busy, plot_swimlane

chip = pypto_lab.get_chip("Ascend910B1")
print(chip.name, "-", chip.cube_cores, "Cube cores,", chip.vector_cores, "Vector cores,",
      chip.buffer("UB").size_bytes // 1024, "KiB of UB per Vector core")
""")

md("""
Every kernel below is checked against torch. The tolerance follows the **storage dtype**: an fp16
result keeps 11 bits of mantissa, so we allow 1 % of the result's scale (the same rule as
`examples/kernels/_common.py`).
""")

code("""
def golden(name, actual, reference, rtol=1e-2, atol_frac=1e-2):
    \"\"\"Compare a kernel's output with torch's; print only the verdict (the details come next).\"\"\"
    a, g = actual.float(), reference.float()
    diff = (a - g).abs()
    atol = atol_frac * max(1.0, float(g.abs().max()))
    ok = bool(torch.isfinite(a).all()) and bool((diff <= atol + rtol * g.abs()).all())
    print(f"{name}: {'PASS' if ok else 'FAIL'} against torch")
    return float(diff.max())
""")

# ---------------------------------------------------------------- hello world
md("""
## 1 · Hello world: `out = x + y`

`@pypto.jit` marks the kernel. `pypto.Tensor[...]` means "a tensor, shape and dtype taken from
the call". Kernels return nothing: they write their preallocated outputs with `out[:] = ...`.
`set_vec_tile_shapes(64, 128)` is the one line of hardware knowledge: it says how big a piece of
each tensor the Vector unit works on at a time.
""")

code("""
@pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def add_kernel(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(64, 128)   # 64 x 128 fp16 = 16 KiB of UB per operand
    out[:] = x + y

torch.manual_seed(0)
x = torch.randn(256, 512, dtype=torch.float16)
y = torch.randn(256, 512, dtype=torch.float16)
out = torch.empty_like(x)
add_kernel(x, y, out)
""")

code("""
# NBVAL_CHECK_OUTPUT
add_diff = golden("add", out, x + y)
""")

code("""
print(f"max |out - (x + y)| = {add_diff:g}")
print(add_kernel.last_run.summary())
""")

md("""
### What a tile is

The Vector unit cannot read GM (the HBM): it computes on the **Unified Buffer** (UB), 192 KiB of
SRAM next to each Vector core. MTE2 copies a tile GM → UB, the Vector unit computes on it, MTE3
copies the result UB → GM. The tile shape is therefore a memory-capacity decision: every tensor
that is live at once in a group needs one tile-sized slot in UB, twice with double buffering.

The Tile Graph of `add_kernel` says exactly that (the numbers are read from the compiled kernel):
""")

code("""
tile_graph = add_kernel.stages["tile_graph"].to_json()
g = tile_graph["groups"][0]
print("tensor shape        ", g["space"])
print("vec tile            ", g["vec_tile"], "->", g["tiles_per_dim"], "tiles per dimension =", g["tiles"], "tiles")
print("tasks (tiles/core)  ", g["tasks"], "tasks of", g["tiles_per_task"], "tile")
print("UB bytes per task   ", g["ub_bytes_per_task"], f"= {g['ub_bytes_per_task'] // (64 * 128 * 2)} live tensors x 64 x 128 x 2 bytes")
print("UB slots            ", g["ub_slots"], "(double buffering: one slot loads while the other computes)")
block_graph = add_kernel.stages["block_graph"].to_json()
print("Block Graph keys    ", list(block_graph))
""")

md("""
### `kernel.last_run`

Every call leaves a `RunResult` in `kernel.last_run`: cycles and time, busy cycles per pipe
(summed over cores in `pipe_busy`, on the busiest core in `pipe_busy_max_core`), the peak bytes of
every on-chip buffer, and the achieved **fraction of peak**. A kernel without matmuls is judged
against HBM bandwidth (bytes it must move ÷ time ÷ bandwidth), a kernel with matmuls against
the Cube's peak FLOP rate.
""")

code("""
run = add_kernel.last_run
print(f"cycles {run.cycles:,.0f}  time {run.time_us:.3f} us  cores used {run.cores_used}  bound: {run.bound}")
print(f"fraction of peak {run.fraction_of_peak:.1%}  ({run.gm_bytes / 1024:.0f} KiB moved)")
print("busy cycles on the busiest core:", {p: round(v) for p, v in run.pipe_busy_max_core.items() if v})
for buf, peak in run.buffer_peak.items():
    if peak:
        print(f"{buf:4s} peak {peak / 1024:6.1f} KiB of {chip.buffer(buf).size_bytes / 1024:.0f} KiB")
""")

md("""
MTE2 (the GM → UB load) is the busiest pipe by far: an add does one Vector instruction per 2
loaded values, so it is **memory-bound**. The fraction of peak is close to HBM bandwidth because
16 cores load at once. `plot_pipe_busy` draws the busy fraction of each pipe on the busiest core
(it reads `pipe_busy`, so we hand it the busiest core's numbers), and `plot_swimlane` draws every
instruction of one core on its pipe:
""")

code("""
def busiest_core_view(run):
    \"\"\"plot_pipe_busy expects per-core busy cycles (as KernelReport has); RunResult sums them over cores.\"\"\"
    return SimpleNamespace(name=run.name, cycles=run.cycles, pipe_busy=run.pipe_busy_max_core)

plot_pipe_busy(busiest_core_view(run))
""")

code("""
plot_swimlane(run)
""")

md("""
On this core the pipes take turns: MTE2 loads the two input tiles, VECTOR adds them (a sliver,
the add is cheap), MTE3 stores the result into L2. The hatched span is that result's write-back
from L2 to HBM, which holds the core's read port. The load is long because all 16 cores share HBM.
""")

# ---------------------------------------------------------------- softmax
md("""
## 2 · Softmax with a loop over rows

`pypto.frontend.jit` with fixed annotations `pypto.Tensor(shape, dtype)`, and `pypto.loop` over
the batch: each iteration computes the softmax of one batch row, `exp(x - max) / sum(exp(x - max))`.
Softmax **reduces along the last axis**, so one tile must hold a whole row: the last tile size
is the row length `D`. The intermediates (`row_max`, `e`, the sum) never leave UB: the Tile Graph
puts them in one group, so only `x` is loaded and only `out` is stored.
""")

code("""
B, S, H, D = 8, 32, 1, 256

def softmax_core(x):
    row_max = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - row_max)
    return e / pypto.sum(e, dim=-1, keepdim=True)

@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def softmax_kernel(x: pypto.Tensor((B, S, H, D), pypto.DT_FP16),
                   out: pypto.Tensor((B, S, H, D), pypto.DT_FP16)):
    pypto.set_vec_tile_shapes(1, 8, 1, D)        # 8 rows of 256 per tile: a whole row per reduction
    for b in pypto.loop(0, B, 1, name="LOOP_B", idx_name="b"):
        out[b:b + 1, ...] = softmax_core(x[b:b + 1, ...])

torch.manual_seed(0)
xs = torch.randn((B, S, H, D), dtype=torch.float16)
out_s = torch.empty_like(xs)
softmax_kernel(xs, out_s)
""")

code("""
# NBVAL_CHECK_OUTPUT
softmax_diff = golden("softmax", out_s, torch.softmax(xs.float(), dim=-1))
""")

code("""
run_s = softmax_kernel.last_run
print(f"max |diff| = {softmax_diff:.2g}")
print(run_s.summary())
for grp in run_s.groups:
    print(f"  group {grp['group']}: {grp['kind']:6s} ops [{grp['ops']}]  {grp['tasks']} tasks on {grp['cores']} cores")
print("busy cycles on the busiest core:", {p: round(v) for p, v in run_s.pipe_busy_max_core.items() if v})
""")

code("""
plot_swimlane(run_s)
""")

md("""
`pypto.loop` is unrolled at trace time: each of the 8 iterations is its own group of
32 rows ÷ 8 rows per tile = 4 tasks, so the kernel spreads over 32 Vector cores.

Here VECTOR has real work per byte (a max, a subtract, an exp, a sum and a divide for every
element): on the busiest core the VECTOR pipe is busier than MTE2, the opposite of the add. The
kernel is bound by the Vector unit rather than by HBM, which is why its fraction of HBM bandwidth
is lower.
""")

# ---------------------------------------------------------------- matmul
md("""
## 3 · Matmul on the Cube: `set_cube_tile_shapes`

A matmul runs on the **Cube** unit, which multiplies 16×16 fp16 fractals with fp32 accumulation.
Its data path is deeper than the Vector unit's:

* **MTE2** loads K-panels of A and B from GM into **L1** (512 KiB),
* **MTE1** copies `m_l0 × k_l0` pieces of A into **L0A** and `k_l0 × n_l0` pieces of B into **L0B** (64 KiB each),
* the **CUBE** accumulates their product into **L0C** (128 KiB, fp32),
* **FixPipe** converts L0C to fp16 and writes it to GM.

`set_cube_tile_shapes([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])` chooses the sizes at both
levels: the L1 block is `m_l1 × n_l1` (one task for one Cube core), K arrives in panels of
`k_l1`, and each MMAD works on `m_l0 × k_l0 × n_l0`.
""")

code("""
M = K = N = 1024

def make_matmul(m_tiles, k_tiles, n_tiles, double_buffer=True):
    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM},
                        pass_options={"double_buffer": double_buffer})
    def matmul_kernel(a: pypto.Tensor((M, K), pypto.DT_FP16),
                      b: pypto.Tensor((K, N), pypto.DT_FP16),
                      out: pypto.Tensor((M, N), pypto.DT_FP16)):
        pypto.set_cube_tile_shapes(m_tiles, k_tiles, n_tiles)
        out[:] = pypto.matmul(a, b, pypto.DT_FP16)
    return matmul_kernel

torch.manual_seed(0)
a = torch.randn(M, K, dtype=torch.float16)
b = torch.randn(K, N, dtype=torch.float16)
mm = make_matmul([128, 128], [128, 512], [128, 128])
out_mm = torch.empty(M, N, dtype=torch.float16)
mm(a, b, out_mm)
""")

code("""
# NBVAL_CHECK_OUTPUT
mm_diff = golden("matmul", out_mm, a.float() @ b.float())
""")

code("""
run_mm = mm.last_run
print(f"max |diff| = {mm_diff:.3g} (fp16 output of sums of {K} products of magnitude ~1)")
print(run_mm.summary())
for buf in ("L1", "L0A", "L0B", "L0C"):
    print(f"{buf:4s} peak {run_mm.buffer_peak[buf] / 1024:6.0f} KiB of {chip.buffer(buf).size_bytes / 1024:4.0f} KiB")
""")

md("""
The buffer peaks follow from the tile shapes: L0A holds two (double-buffered) 128 × 128 fp16
pieces of A = 64 KiB, L0C two 128 × 128 fp32 accumulators = 128 KiB, and L1 two 128 × 512
K-panels of A and two of B = 512 KiB: this tiling fills every buffer exactly. The swimlane of one
Cube core shows the pipes overlapping: MTE2 fetches the next panel while MTE1 and the Cube work
on this one. MTE2 never rests, while the Cube has gaps: at 1024³ each block does too little
arithmetic per byte loaded to hide the loads, which is why the kernel reaches only about half
of the Cube's peak.
""")

code("""
plot_swimlane(run_mm)
""")

# ---------------------------------------------------------------- chrome trace
md("""
## 4 · The swimlane in Chrome's trace viewer

`last_run.export_chrome_trace(path)` writes the whole run (every core) as a Chrome trace: one
*process* per core (`AIC n` for Cube cores, `AIV n` for Vector cores), one *thread* per pipe, one
slice per instruction, times in µs of the chip's clock. To look at it:

* **Perfetto**: open <https://ui.perfetto.dev>, *Open trace file*, pick the JSON (it stays in your
  browser), then zoom with `W`/`S` and pan with `A`/`D`;
* **Chrome**: go to `chrome://tracing`, *Load*, pick the JSON.

The file goes to `out/notebooks/` in the repository (ignored by git).
""")

code("""
trace_dir = Path("..") / "out" / "notebooks"
trace_path = run_mm.export_chrome_trace(trace_dir / "matmul_1024_trace.json")
events = json.loads(Path(trace_path).read_text())["traceEvents"]
slices = [e for e in events if e["ph"] == "X"]
print(f"{trace_path}: {len(slices)} instruction slices on "
      f"{len({e['pid'] for e in slices})} cores")
print("first slice:", slices[0])
""")

# ---------------------------------------------------------------- tile experiments
md("""
## 5 · Tile-size experiments

The same 1024³ matmul with different tile shapes, each with and without double buffering.
Three hardware effects show up in the table:

1. **Start-up amortisation.** Every transfer and every MMAD pays a fixed start-up before it moves
   its first byte or multiplies its first fractal. Small tiles pay it many more times for the same
   work, and a small `m_l1 × n_l1` block also makes the Cube cores re-read A and B from GM more
   often (each block reads a whole K-strip of A and of B).
2. **Idle cores.** A task is one `m_l1 × n_l1` block. 1024² in 256 × 256 blocks is 16 tasks for
   24 Cube cores, so 8 cores stay idle however fast the others are.
3. **Double buffering.** With two slots in L1 and L0A/L0B, MTE2 and MTE1 load the next panel while
   the Cube computes on this one; with one slot each pipe waits for the others.
""")

code("""
tilings = {
    "32 / 32 / 32":          ([32, 32], [32, 32], [32, 32]),
    "64 / 64 / 64":          ([64, 64], [64, 64], [64, 64]),
    "128,128 / 64,256 / 128,256":  ([128, 128], [64, 256], [128, 256]),
    "128,128 / 128,512 / 128,128": ([128, 128], [128, 512], [128, 128]),
    "256,256 / 64,256 / 128,256":  ([256, 256], [64, 256], [128, 256]),
}
rows = []
runs = {}
for label, tiles in tilings.items():
    for db in (True, False):
        k = make_matmul(*tiles, double_buffer=db)
        k(a, b, torch.empty(M, N, dtype=torch.float16))
        r = k.last_run
        runs[label, db] = r
        rows.append((label, db, r.cycles, r.groups[0]["tasks"], r.cores_used, r.fraction_of_peak,
                     len(r.timeline)))

print(f"{'m / k / n tiles':30s} {'dbuf':>5s} {'cycles':>9s} {'tasks':>6s} {'cores':>6s} {'% Cube peak':>12s} {'instructions':>13s}")
for label, db, cyc, tasks, cores, frac, ninstr in rows:
    print(f"{label:30s} {'on' if db else 'off':>5s} {cyc:9,.0f} {tasks:6d} {cores:6d} {frac:12.1%} {ninstr:13,d}")
""")

code("""
fig, ax = plt.subplots(figsize=(9, 3.4))
labels = list(tilings)
xpos = range(len(labels))
for off, db, colour in ((-0.2, True, "#4c72b0"), (0.2, False, "#dd8452")):
    ax.bar([p + off for p in xpos], [runs[lab, db].cycles for lab in labels], width=0.4, color=colour,
           label="double buffering " + ("on" if db else "off"))
ax.set_xticks(list(xpos), [lab.replace(" / ", "\\n") for lab in labels], fontsize=8)
ax.set_yscale("log")
ax.set_ylabel("simulated cycles (log)")
ax.set_title(f"{M}x{K}x{N} fp16 matmul on {chip.name}: cycles by tile shape")
ax.legend()
fig.tight_layout()
""")

md("""
Reading the table: going from 32-wide to 128-wide tiles cuts the cycles by an order of magnitude
for the same FLOPs (fewer, longer instructions and far less re-reading of A and B). The
256 × 256 blocks give only 16 tasks, so only 16 of the 24 Cube cores have work: the per-core view
below shows the idle ones. Turning double buffering off costs at every tile size (the ratios
are printed below), because MTE2, MTE1 and the Cube then take turns instead of overlapping.
""")

code("""
for label in tilings:
    print(f"{label:30s} without double buffering: {runs[label, False].cycles / runs[label, True].cycles:.2f}x slower")
""")

code("""
def plot_core_busy(run, pipe="CUBE"):
    \"\"\"Busy cycles of one pipe on every core of the run (from the simulator's per-core totals).\"\"\"
    busy = run.timeline.busy[:chip.cube_cores, PIPES.index(pipe)]
    fig, ax = plt.subplots(figsize=(9, 2.6))
    ax.bar(range(len(busy)), busy, color=["#c44e52" if v else "#cccccc" for v in busy])
    ax.axhline(run.cycles, color="black", linestyle=":", linewidth=1, label="kernel cycles")
    ax.set_xlabel("Cube core (AIC) id")
    ax.set_ylabel(f"{pipe} busy cycles")
    ax.set_title(f"{run.name}: {pipe} busy per core, {run.cores_used} cores used")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig

big = runs["256,256 / 64,256 / 128,256", True]
cube_busy = big.timeline.busy[:chip.cube_cores, PIPES.index("CUBE")]
print(f"256x256 blocks: {int((cube_busy > 0).sum())} of {chip.cube_cores} Cube cores busy")
plot_core_busy(big);
""")

md("""
### Double buffering, seen on one core

The same tiling with ping-pong buffers (top) and with one slot per buffer (bottom). Without the
second slot, MTE2 cannot load the next panel until the Cube has released the current one, so the
lanes form a staircase instead of running side by side.
""")

code("""
label = "128,128 / 128,512 / 128,128"
for db in (True, False):
    r = runs[label, db]
    print(f"double buffering {'on ' if db else 'off'}: {r.cycles:,.0f} cycles, "
          f"L1 peak {r.buffer_peak['L1'] // 1024} KiB, L0A peak {r.buffer_peak['L0A'] // 1024} KiB")
print(f"slow-down without it: {runs[label, False].cycles / runs[label, True].cycles:.2f}x")
""")

code("""
plot_swimlane(runs[label, True], core=0)
""")

code("""
plot_swimlane(runs[label, False], core=0)
""")

md("""
Double buffering is not free: it doubles the buffer peaks (printed above). On the Vector unit,
where UB is 192 KiB for every live tensor of a group, the trade is sharper. The add of section 1
on a 1024 × 1024 tensor, with small tiles and with tiles so large that two slots no longer fit
(the compiler then falls back to one slot):
""")

code("""
def make_add(tile, double_buffer=True):
    @pypto.jit(pass_options={"double_buffer": double_buffer})
    def add_tiles(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(*tile)
        out[:] = x + y
    return add_tiles

xb = torch.randn(1024, 1024, dtype=torch.float16)
yb = torch.randn(1024, 1024, dtype=torch.float16)
print(f"{'vec tile':>10s} {'dbuf':>5s} {'cycles':>8s} {'tasks':>6s} {'cores':>6s} {'UB peak KiB':>12s} {'% HBM':>7s}")
for tile in [(8, 128), (16, 256), (32, 512), (64, 512)]:
    for db in (True, False):
        k = make_add(tile, db)
        k(xb, yb, torch.empty_like(xb))
        r = k.last_run
        print(f"{str(tile):>10s} {'on' if db else 'off':>5s} {r.cycles:8,.0f} {r.groups[0]['tasks']:6d} "
              f"{r.cores_used:6d} {r.buffer_peak['UB'] / 1024:12.0f} {r.fraction_of_peak:7.1%}")
""")

md("""
With 8 × 128 tiles (2 KiB each) the fixed cost of each transfer dominates, and double buffering
nearly halves the time because it hides half of those start-ups. 32 × 512 is slower than 16 × 256
although its tiles are bigger: 64 tasks on 48 Vector cores make two waves, and in the second
only 16 cores work. With 64 × 512 tiles, three
64 KiB tensors fill UB, so there is one slot whatever you ask for, and each of 32 cores does a
single load-add-store. That still reaches HBM bandwidth here: all cores load at the same time, so
the shared HBM, not the missing overlap, sets the pace.
""")

# ---------------------------------------------------------------- errors
md("""
## 6 · Teaching errors

Mistakes raise one of the errors of `pypto_lab.pto.errors` (all `PtoError`, a `ValueError`). Each
message names the value, the rule it breaks and a fix.

**A tile with fewer sizes than the tensor has dimensions.** Tile size *i* tiles tensor axis *i*;
a longer tile shape is fine (the sizes past the tensor's rank are ignored, as in the real
framework), a shorter one leaves an axis without a size:
""")

code("""
@pypto.jit
def short_tile(x: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(512)          # one size for a 2-D tensor
    out[:] = x + x

try:
    short_tile(x, torch.empty_like(x))
except pypto.TileRankError as err:
    print(type(err).__name__, "\\n", err)
""")

md("""
**A tile row that is not a whole number of 32-byte blocks is padded, not refused.** UB is
addressed in 32-byte blocks, so the compiler pads the last axis of every UB tile up to whole blocks
(the real framework's PadLocalBuffer pass). A row of 100 fp16 (200 bytes) then occupies 224 bytes
of UB, while the transfers still move the real 200 bytes:
""")

code("""
@pypto.jit
def misaligned(x: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(64, 100)      # 100 fp16 = 200 bytes, padded to 224 in UB
    out[:] = x + x

misaligned(x, torch.empty_like(x))
g = misaligned.last_compiled.tile_graph.groups[0]
print("tile", g.tile, "->", g.ub_bytes, "bytes of UB per task =", g.ub_bytes // (64 * 224),
      "live tensors x 64 rows x 224 bytes")
""")

md("""
**Tiles that do not fit UB.** The whole 256 × 512 tensor as one tile needs 256 KiB per tensor;
UB holds 192 KiB for all of them:
""")

code("""
@pypto.jit
def too_big(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(256, 512)
    out[:] = x + y

try:
    too_big(x, y, torch.empty_like(x))
except pypto.TileCapacityError as err:
    print(type(err).__name__, "\\n", err)
""")

md("""
**Reading an output before writing it.** An output tensor is GM the kernel will fill; its old
contents are not data of the kernel (on the NPU they are whatever was there):
""")

code("""
@pypto.jit
def accumulate(x: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(64, 128)
    out[:] = out + x

try:
    accumulate(x, torch.zeros_like(x))
except pypto.UnwrittenOutputError as err:
    print(type(err).__name__, "\\n", err)
""")

md("""
And a matmul tiling whose accumulator is too large for L0C (256 × 256 fp32 = 256 KiB, L0C holds
128 KiB), and asking for a real NPU on a machine that has none:
""")

code("""
try:
    make_matmul([256, 256], [64, 256], [256, 256])(a, b, torch.empty(M, N, dtype=torch.float16))
except pypto.PtoError as err:
    print(type(err).__name__, "\\n", err)

@pypto.jit(runtime_options={"run_mode": pypto.RunMode.NPU})
def on_npu(x: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(64, 128)
    out[:] = x + x

try:
    on_npu(x, torch.empty_like(x))
except pypto.NoNPUError as err:
    print(type(err).__name__, "\\n", err)
""")


# ---------------------------------------------------------------- dynamic shapes and symbolic scalars
md("""
## 7 · Long loops, dynamic shapes and symbolic scalars

The real framework never unrolls `pypto.loop`: the loop index is a **symbolic scalar**, the body
is traced once, and the loop stays one node of the Tensor Graph. Here a loop of more than 64
iterations, or one whose bounds are known only when the kernel runs, is kept the same way. Its
body is traced once per *iteration class* (a Python `if` on the index, or `pypto.is_loop_end`,
splits the iterations into classes). It is costed from a few simulated *waves* of iterations (a
wave fills the cores once), and the remaining iterations are extrapolated from the marginal cost
of a wave. The outputs are still computed iteration by iteration. The cost of tracing and
compiling no longer grows with the trip count:
""")

code("""
@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def row_add(x: pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP16),
            y: pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP16),
            out: pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP16)):
    pypto.set_vec_tile_shapes(8, 64)
    for i in pypto.loop(x.shape[0] // 8, name="LOOP_rows", idx_name="i"):
        out[i * 8:(i + 1) * 8, :] = x[i * 8:(i + 1) * 8, :] + y[i * 8:(i + 1) * 8, :]

xl = torch.randn(80_000, 64, dtype=torch.float16)
outl = torch.empty_like(xl)
row_add(xl, xl, outl)
assert torch.equal(outl, xl + xl)
compiled = row_add.last_compiled
print(f"{xl.shape[0] // 8:,} iterations -> {len(compiled.tensor_graph.nodes)} Tensor Graph nodes, "
      f"traced and compiled in {compiled.compile_seconds * 1e3:.0f} ms")
print(row_add.last_run)
""")

md("""
The summary says how much was simulated and how much was extrapolated. The Chrome trace
(`last_run.export_chrome_trace(path)`) has a "loops" process with one lane per loop, labelled
with its iteration count, instead of ten thousand lanes.

**Tensor reads as scalars.** Paged attention keeps a sequence's keys and values in fixed-size
blocks of a shared pool, and a *block table* says which blocks belong to which sequence. The
kernel reads `block_table[b, j]` as a scalar. That gives a `SymbolicScalar` that is evaluated
from the tensor's data when the kernel runs, and it is used as a view offset. It reads the
sequence's length the same way, as the loop bound. `examples/kernels/paged_attention.py` is such
a kernel (decode attention with an online softmax over the blocks, bf16):
""")

code("""
import sys
sys.path.insert(0, str(Path("../examples/kernels").resolve()))
import paged_attention as pa

torch.manual_seed(0)
r = pa.main()
kern = pa.paged_attention_kernel
print(r.name, "max |diff| vs torch:", f"{r.max_abs_diff:.1e}", "| blocks read:", r.extra["blocks_read"])
print(kern.last_run)
first_traces = kern.trace_count

# a different block table and different lengths: the same compiled kernel, no retrace
q = torch.empty((2, pa.NQ, pa.D), dtype=torch.bfloat16).uniform_(-1, 1)
kc = torch.empty((pa.NUM_BLOCKS, pa.BLOCK, pa.D), dtype=torch.bfloat16).uniform_(-1, 1)
vc = torch.empty_like(kc).uniform_(-1, 1)
lens = [64, 192]
table = pa.make_cache(lens)
out = torch.zeros_like(q)
kern(q, kc, vc, table, torch.tensor(lens, dtype=torch.int32), out)
ref = pa.reference(q, kc, vc, table, lens)
print(f"new table {table.tolist()}: retraced {kern.trace_count - first_traces} times, "
      f"max |diff| {(out.float() - ref).abs().max():.1e}")
print(kern.last_run)
""")

md("""
A table entry that points outside the pool is an error at run time. It names the expression,
its value, the bound and the loop indices at that moment:
""")

code("""
bad = table.clone()
bad[1, 0] = 99                               # there are only 8 blocks
try:
    kern(q, kc, vc, bad, torch.tensor(lens, dtype=torch.int32), torch.zeros_like(q))
except pypto.PtoError as err:
    print(type(err).__name__, "\\n", err)
""")


# ---------------------------------------------------------------- plugging into a model
md("""
## 8 · Plugging a kernel into a model

A pto kernel is the NPU implementation of an operator. `pypto_lab.custom_op(npu_func=kernel)`
(the seed article's decorator) plugs it into a PyTorch model: the decorated function is the
**reference** (it gives the output's shape and dtype, and the op runs it on the CPU when called
outside an optimised model), and the kernel is what `pypto_lab.optimize` costs and what the
optimised model computes with.

An RMSNorm over rows of 512, written in pto with two rows per tile. It takes its inputs, then
its output, all fp16: the report below runs at `precision="fp16"`, and GM holds the op's tensors
in fp16.
""")

code("""
ROWS, HID = 64, 512

def make_rms(rows_per_tile):
    @pypto.frontend.jit
    def rms_kernel(x: pypto.Tensor((ROWS, HID), pypto.DT_FP16), g: pypto.Tensor((HID,), pypto.DT_FP16),
                   out: pypto.Tensor((ROWS, HID), pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(rows_per_tile, HID)
        mean_sq = pypto.sum(x * x, dim=-1, keepdim=True) / HID
        out[:] = x * pypto.rsqrt(mean_sq + 1e-6) * g
    return rms_kernel

def rms_reference(x, g):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g

class Block(torch.nn.Module):
    \"\"\"Linear -> RMSNorm (the op given) -> Linear.\"\"\"
    def __init__(self, norm):
        super().__init__()
        self.norm = norm
        self.up = torch.nn.Linear(256, HID)
        self.gamma = torch.nn.Parameter(1 + 0.1 * torch.randn(HID))
        self.down = torch.nn.Linear(HID, 256)

    def forward(self, x):
        return self.down(self.norm(self.up(x), self.gamma))

torch.manual_seed(0)
xm = torch.randn(ROWS, 256)
""")

md("""
**Before**: the op registered with its reference only (`custom_op()` with no `npu_func`). The
simulator has no kernel for it, so it costs the reference's ATen ops (`mul`, `mean` as a
`sum`, `add`, `sqrt`, `div`, `mul`) as one fused Vector kernel of its own:
""")

code("""
rms_norm = pypto_lab.custom_op(name="rms_norm")(rms_reference)
model = Block(rms_norm).eval()
before = pypto_lab.optimize(model, xm, chip="Ascend910B1", level=1).report()
print(before.table())
print(before.kernels[1].spec.op)
""")

md("""
**After**: the same op with the pto kernel as its `npu_func` (registering the name again replaces
the op). `optimize` simulates the kernel itself on the report's chip, at the op's shapes, in
fp16: the `rms_norm` row is now the kernel's own run, the same figure as calling the kernel by
hand on the same chip.
""")

code("""
# NBVAL_CHECK_OUTPUT
rms_kernel = make_rms(2)
rms_norm = pypto_lab.custom_op(npu_func=rms_kernel, name="rms_norm")(rms_reference)
optimized = pypto_lab.optimize(model, xm, chip="Ascend910B1", level=1)
after = optimized.report()
print(after.table())

k = next(k for k in after.kernels if k.name.startswith("rms_norm"))
xh = torch.randn(ROWS, HID, dtype=torch.float16)
rms_kernel(xh, torch.ones(HID, dtype=torch.float16), torch.empty_like(xh))   # by hand, on the 910B1
print(f"report: {k.time_us:.3f} us, {k.gm_bytes / 1024:.0f} KiB GM   |   by hand: {rms_kernel.last_run}")
print(f"model: {before.latency_us:.2f} us before -> {after.latency_us:.2f} us after")
""")

md("""
The report's RMSNorm time is the pto kernel's simulated run, and the model's latency changed by
exactly the difference between the two RMSNorm rows: the matmuls are untouched. The kernel reads
`x` and `gamma` and writes `out` once (129 KiB); the reference's fused Vector kernel was costed
over a second full-size input (192 KiB), because the cost model from ATen ops assumes every input
has the output's size.
""")

md("""
**Numerics.** `optimized(x)` runs the pto kernel on the op's actual tensors (fp16, as GM holds
them), so the model's output carries the kernel's arithmetic; `model(x)` still runs the reference
in fp32 on the CPU. They agree to fp16 precision:
""")

code("""
with torch.no_grad():
    reference = model(xm)          # outside optimize: the reference, fp32
npu = optimized(xm)                # the pto kernel's numerics (and fp16 matmuls)
print("ran with the pto kernel:", optimized.runtime.last_stats.nodes)
print(f"max |error| = {float((npu - reference).abs().max()):.2e}, max |output| = {float(reference.abs().max()):.2f}")
_ = golden("Block with the pto RMSNorm", npu, reference)
""")

md("""
The kernel is now a model component: change it and the whole model's figure follows. The same
kernel with 32 rows per tile has two tasks, so it runs on 2 of the 48 Vector cores:
""")

code("""
# NBVAL_CHECK_OUTPUT
for rows_per_tile in (1, 2, 8, 32):
    pypto_lab.custom_op(npu_func=make_rms(rows_per_tile), name="rms_norm")(rms_reference)
    rep = pypto_lab.optimize(model, xm, chip="Ascend910B1", level=1).report()
    kk = next(k for k in rep.kernels if k.name.startswith("rms_norm"))
    print(f"{rows_per_tile:2d} rows per tile: rms_norm {kk.time_us:5.3f} us on {kk.reports[0].cores_used:2d} cores, "
          f"model {rep.latency_us:5.3f} us")
""")

md("""
One row per tile makes 64 tasks for 48 Vector cores: two waves, the second on 16 cores. Two rows
per tile (32 tasks on 32 cores) is one wave and the fastest of these; 8 and 32 rows leave most
cores idle. The model's latency moves with the kernel's time, the matmuls staying as they were.
""")

md("""
A kernel that does not fit the report is refused before it runs, naming the rule and the fix.
Here the kernel is written for bf16 while the report runs in fp16:
""")

code("""
@pypto.frontend.jit
def rms_bf16(x: pypto.Tensor((ROWS, HID), pypto.DT_BF16), g: pypto.Tensor((HID,), pypto.DT_BF16),
             out: pypto.Tensor((ROWS, HID), pypto.DT_BF16)):
    pypto.set_vec_tile_shapes(2, HID)
    out[:] = x * pypto.rsqrt(pypto.sum(x * x, dim=-1, keepdim=True) / HID + 1e-6) * g

pypto_lab.custom_op(npu_func=rms_bf16, name="rms_norm")(rms_reference)
try:
    pypto_lab.optimize(model, xm, chip="Ascend910B1", level=1)
except pypto_lab.CustomOpError as err:
    print(type(err).__name__, "\\n", err)
""")

md("""
A kernel whose output shape is not the reference's, or that raises while it is simulated or run,
raises `CustomOpError` naming the op too (the kernel's own error is its `__cause__`).
""")

md("""
## Where next

* `examples/kernels/` has LayerNorm, RMSNorm, an FFN (matmul → GELU → matmul in one kernel) and
  attention, each checked against torch; `examples/kernels/README.md` lists which of the real
  framework's examples run here.
* `kernel.dump_stages(directory)` writes the four stages as JSON, to read what the compiler did.
* `02_tiling_a_matmul` explores the same tile shapes with sliders.
* Section 8's `custom_op(npu_func=kernel)` works for Cube kernels too (a matmul kernel becomes a
  Cube row of the report); `tests/test_pto_custom_op.py` has one.
""")


if __name__ == "__main__":
    NB.write("05_writing_kernels.ipynb")
