"""Generator of notebooks/02_tiling_a_matmul.ipynb (run it, then execute the notebook in place).

    cd /work/main && .venv/bin/python notebooks/_build/02_tiling_a_matmul.py
"""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 02 · Tiling a matmul on the Cube

A matmul `C[m, n] = A[m, k] @ B[k, n]` does not fit in an AI Core: the Cube reads its operands
from L0A (64 KB) and L0B (64 KB) and accumulates into L0C (128 KB on the 910B1), and those are
fed from L1 (512 KB), fed from GM. A **tiling** says how big a piece of the problem each level
holds. It decides

* how many cores get work (blocks of C are dealt round-robin to the cube cores),
* how often each byte is fetched from GM (bigger blocks reuse each A row and B column more),
* how much fixed cost per instruction is paid (GM latency, MMAD start-up),
* whether the pipes can overlap (double buffering needs two tiles in a buffer).

This notebook takes one problem — a 2048³ fp16 matmul on the **Ascend 910B1** (24 cube cores) —
through all of that, with the simulator's numbers for each effect.
""")

code("""
%matplotlib inline
import numpy as np
from matplotlib.figure import Figure

import pypto_lab
from pypto_lab import CubeTile, TilingError
from pypto_lab.hw.tiling import plan_cube, cube_tile_bytes, cube_tile_candidates, naive_cube_tile
from pypto_lab.tuning import screen_space
from pypto_lab.viz.views import plot_tiling, plot_swimlane, plot_roofline
from pypto_lab.viz.widgets import tiling_explorer

CHIP = pypto_lab.get_chip("Ascend910B1")
M = K = N = 2048
CAP = {b: CHIP.buffer(b).size_bytes for b in ("L1", "L0A", "L0B", "L0C")}
print(CHIP.name, CHIP.cube_cores, "cube cores;", {b: f"{v // 1024} KB" for b, v in CAP.items()})
""")

md("""
## 1 · `set_cube_tile_shapes([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])`

pypto_lab's `CubeTile` mirrors PyPTO's call. The `l1` sizes describe what one core task holds in
L1, the `l0` sizes what one Cube instruction works on:

```
for each block of C, m_l1 x n_l1 (dealt to the cube cores round-robin):
    if k_l1 covers K: load A m_l1 x K and B K x n_l1 once (MTE2, GM -> L1); they stay
    for each sub-tile m_l0 x n_l0 of the block (one accumulator in L0C):
        for each K panel of k_l1 (if K needs several: MTE2 A m_l0 x k_l1, B k_l1 x n_l0, GM -> L1):
            for each K step of k_l0 (MTE1: A m_l0 x k_l0 -> L0A, B k_l0 x n_l0 -> L0B):
                MMAD: L0C += L0A @ L0B         (CUBE, one 16x16x16 fractal per cycle)
        drain L0C -> GM                         (FIXP on the 910B)
```

When K needs several panels, a block's sub-tiles cannot share what is in L1 — the panel a
sub-tile needs next was not loaded yet — so each streams its own rows of A and columns of B
(PyPTO's tile graph does the same: its L1 tile of A is `m_l0 × k_l1`, of B `k_l1 × n_l0`).
Section 5 measures what that means for choosing `l1` larger than `l0`.

Counting the work of one tiling from these rules:
""")

code("""
tile = CubeTile.from_pypto([128, 128], [64, 256], [128, 128])
blocks = -(-M // tile.m_l1) * -(-N // tile.n_l1)
print(f"tile {tile}: {blocks} blocks of {tile.m_l1}x{tile.n_l1} over {CHIP.cube_cores} cores = "
      f"{blocks / CHIP.cube_cores:.2f} waves")
print(f"per block: {K // tile.k_l1} K panels in L1, {K // tile.k_l0} MMADs of "
      f"{tile.m_l0}x{tile.k_l0}x{tile.n_l0} = {(tile.m_l0 // 16) * (tile.k_l0 // 16) * (tile.n_l0 // 16)} fractals each")
r = pypto_lab.simulate_matmul(M, K, N, chip=CHIP, tile=tile)
counts = {}
for k in r.instructions.kind[r.instructions.core == 0]:
    counts[r.instructions.kinds[k]] = counts.get(r.instructions.kinds[k], 0) + 1
print("instructions the simulator issued on core 0:", counts)
""")

md("""
## 2 · What a tiling costs in each buffer: `plan_cube`

`plan_cube` checks a tiling against PyPTO's rules and returns its buffer plan. Per operand a tile
takes `CeilAlign(rows, 16) x CeilAlign(cols, 16) x sizeof(dtype)` bytes — fp16 operands in L0A,
L0B and L1, the **fp32** accumulator in L0C — and with double buffering a buffer holds two tiles
(ping-pong) *when two fit*, else one.
""")

code("""
def show_plan(tile, double_buffer=True):
    plan = plan_cube(CHIP, tile, "fp16", M, K, N, double_buffer=double_buffer)
    print(f"{str(tile):28s}", "  ".join(
        f"{b} {plan.slots[b]}x{plan.bytes_per_slot[b] // 1024:3d} KB = {plan.slots[b] * plan.bytes_per_slot[b] / CAP[b]:4.0%}"
        for b in ("L1", "L0A", "L0B", "L0C")))

for t in (CubeTile.from_pypto([128, 128], [64, 256], [128, 128]),
          CubeTile.from_pypto([256, 256], [64, 256], [128, 128]),
          CubeTile.from_pypto([128, 128], [128, 512], [128, 128])):
    show_plan(t)
""")

md("""
Read the second line: a 256×128 fp32 accumulator is 128 KB, the whole of the 910B1's L0C, so L0C
holds **one** slot — the next sub-tile's MMADs wait while FixPipe drains it. The first and third
tilings keep two 64 KB accumulators. The third doubles `k_l0` and `k_l1`: 128 × 128 × 2 B = 32 KB
per operand tile, so two still fit L0A and L0B exactly, and two K panels of 512 fill L1. Double
buffering is decided buffer by buffer.

## 3 · An illegal tiling and its error

Ask for more than a buffer holds and `TilingError` names the buffer, the bytes, the capacity and
a tiling that fits. The same for the alignment and nesting rules:
""")

code("""
illegal = {
    "L0A overflow": CubeTile.from_pypto([256, 256], [256, 256], [64, 64]),
    "L0C overflow": CubeTile.from_pypto([256, 256], [64, 256], [256, 256]),
    "not 32-byte aligned": CubeTile.from_pypto([100, 100], [64, 256], [128, 128]),
    "l1 not a multiple of l0": CubeTile.from_pypto([128, 192], [64, 256], [128, 128]),
}
errors = {}
for label, t in illegal.items():
    try:
        pypto_lab.simulate_matmul(M, K, N, chip=CHIP, tile=t)
    except TilingError as err:
        errors[label] = err
        print(f"{label}:\\n    {err}\\n")
""")

code("""
bad = illegal["L0A overflow"]
plot_tiling(errors["L0A overflow"], CHIP, requested=cube_tile_bytes(bad, "fp16", CHIP))
""")

md("""
## 4 · The tiling explorer

The explorer re-runs the simulator on every slider move: occupancy of each buffer against its
capacity, cycles, Cube utilisation and the pipe swimlane of one core. Its sliders offer only what
section 3's alignment and nesting rules allow: each step is the next well-formed tiling, and moving
`m_l0` takes `m_l1` to the nearest multiple of it. What is left to break is capacity: a tiling that
overflows lists every buffer it overflows, each with a size that fixes it, where the swimlane was.
It is live in Jupyter or Voilà (a saved notebook shows a picture of it); below it, static
renderings of the same view for three tilings.
""")

code("""
w = tiling_explorer(M, K, N, chip="Ascend910B1", dtype="fp16")
w
""")

code("""
w.set(m_l0=128, m_l1=128, k_l0=64, k_l1=64, n_l0=128, n_l1=128)   # set the sliders from code, as a student would by hand
print(w.text)
""")

code("""
w.set(m_l0=512, k_l0=128)   # m_l1 and k_l1 follow to multiples of them; L0A and L0C overflow
print(w.text)
w.set(m_l0=128, m_l1=128, k_l0=64, k_l1=64)
""")

code("""
NAIVE = naive_cube_tile(CHIP, M, K, N)           # what level 0 of optimize() uses
DEFAULT = cube_tile_candidates(CHIP, M, K, N)[0]  # the default tiling
SMALL = CubeTile.from_pypto([64, 64], [64, 256], [64, 64])
reports = {}
for label, t in (("naive", NAIVE), ("small", SMALL), ("default", DEFAULT)):
    reports[label] = pypto_lab.simulate_matmul(M, K, N, chip=CHIP, tile=t)
    r = reports[label]
    print(f"{label:8s} {str(t):28s} {r.cycles:9,.0f} cycles  cube {r.cube_utilization:4.0%}  "
          f"GM {r.gm_bytes / 1e6:6.1f} MB")
""")

code("""
plot_tiling(reports["naive"], CHIP)
""")

code("""
plot_tiling(reports["small"], CHIP)
""")

code("""
plot_tiling(reports["default"], CHIP)
""")

md("""
## 5 · A sweep of tile sizes

Square output blocks from 32×32 to 256×128 (one sub-tile per block, `k_l0 = 64`, `k_l1 = 256`),
each with and without double buffering:
""")

code("""
SIZES = [(32, 32), (64, 64), (96, 96), (128, 128), (176, 176), (256, 128)]
sweep = []
for bm, bn in SIZES:
    for db in (True, False):
        t = CubeTile(bm, bm, 64, 256, bn, bn)
        r = pypto_lab.simulate_matmul(M, K, N, chip=CHIP, tile=t, double_buffer=db)
        tl = r.instructions
        mmad = tl.kind == tl.kinds.index("mmad")
        sweep.append(dict(block=f"{bm}x{bn}", db=db, r=r, mmads=int(mmad.sum()), fractals=(bm // 16) * 4 * (bn // 16),
                          mmad_cycles=float(np.mean(tl.end[mmad] - tl.start[mmad]))))
print(f"{'block':>8s} {'double buf':>10s} {'cycles':>10s} {'cube':>5s} {'GM MB':>7s} {'flops/B':>7s} "
      f"{'GM B/cycle':>10s} {'MMADs':>7s} {'fractals':>8s} {'cycles/MMAD':>11s}")
for s in sweep:
    r = s["r"]
    print(f"{s['block']:>8s} {str(s['db']):>10s} {r.cycles:10,.0f} {r.cube_utilization:5.0%} {r.gm_bytes / 1e6:7.1f} "
          f"{r.flops / r.gm_bytes:7.0f} {r.gm_bytes / r.cycles:10,.0f} {s['mmads']:7d} {s['fractals']:8d} {s['mmad_cycles']:11.1f}")
print(f"for reference, the chip's L2: {CHIP.l2_bytes_per_cycle():,.0f} B/cycle, HBM: {CHIP.hbm_bytes_per_cycle():,.0f} B/cycle")
""")

code("""
fig = Figure(figsize=(10, 3.6))
ax1, ax2 = fig.subplots(1, 2)
for db, style in ((True, "o-"), (False, "s--")):
    sel = [s for s in sweep if s["db"] == db]
    lab = "double-buffered" if db else "single-buffered"
    ax1.plot([s["block"] for s in sel], [s["r"].cube_utilization for s in sel], style, label=lab)
    ax2.plot([s["block"] for s in sel], [s["r"].gm_bytes / 1e6 for s in sel], style, label=lab)
ax1.set_ylabel("Cube utilisation")
ax1.set_ylim(0, 1)
ax1.set_xlabel("output block m_l1 x n_l1")
ax1.legend(fontsize=8)
ax2.set_yscale("log")
ax2.set_ylabel("GM traffic, MB")
ax2.set_xlabel("output block m_l1 x n_l1")
fig.suptitle(f"matmul {M}x{K}x{N} fp16 on {CHIP.name}", fontsize=10)
fig.tight_layout()
fig
""")

md("""
Three effects, each with its hardware reason:

* **Reuse.** A block of `bm × bn` reads `(bm + bn) × k` operand elements to do `bm × bn × k`
  MACs, so its flops per GM byte grow with the block (the `flops/B` column), and the total GM
  traffic falls from over a gigabyte to about 200 MB. The double-buffered kernels all pull a
  similar number of bytes per cycle from the memory system (`GM B/cycle`), close to what the
  shared L2 delivers to 24 cores at once: the operands are re-read from L2 by every core that needs
  them, and the L2 bandwidth sets the pace. Fewer bytes is then directly fewer cycles.
* **Start-up amortisation.** Each MMAD pays a fixed start-up on top of its fractals (compare
  `cycles/MMAD` with `fractals`): a share of about a ninth for a 32×64×32 MMAD, under one percent
  from 128×64×128 on. Each GM transfer likewise pays a round-trip latency of hundreds of cycles
  (notebook 01), which a small tile cannot hide.
* **Double buffering** lets MTE2/MTE1 fill one slot while the Cube works on the other. Where it
  is off, loads and MMADs take turns and the Cube idles during every load — roughly half the
  utilisation at every size. (For 256×128 the plan still double-buffers L0A, L0B and L1 but not
  L0C, which it fills on its own: section 2.)
* **Bigger is not always better**, because of the cores: next section.
""")

md("""
### Blocks larger than one instruction: `m_l1 > m_l0`

The sweep kept `l1 = l0`: one sub-tile per block. A 256×256 block of four 128×128 sub-tiles could
share its operands in L1 — but only while they stay there, that is while one K panel covers K.
The same two tilings on two depths of K:
""")

code("""
reuse_rows = []
for k in (256, K):
    for t in (CubeTile.from_pypto([128, 128], [64, 256], [128, 128]),
              CubeTile.from_pypto([128, 256], [64, 256], [128, 256])):
        r = pypto_lab.simulate_matmul(M, k, N, chip=CHIP, tile=t)
        reuse_rows.append((k, t, r))
        blocks = -(-M // t.m_l1) * -(-N // t.n_l1)
        print(f"K = {k:4d}  {str(t):28s} {blocks:3d} blocks, {-(-k // t.k_l1)} K panels:  "
              f"GM {r.gm_bytes / 1e6:6.1f} MB  {r.cycles:9,.0f} cycles  cube {r.cube_utilization:4.0%}")
for (k, _, small), (_, _, big) in zip(reuse_rows[::2], reuse_rows[1::2]):
    print(f"K = {k:4d}: the 256x256 blocks move {big.gm_bytes / small.gm_bytes:.2f}x the bytes "
          f"in {big.cycles / small.cycles:.2f}x the cycles")
""")

md("""
With K = 256 one panel holds all of K: a 256×256 block loads its 256 rows of A and 256 columns
of B once for its four sub-tiles — each operand element is read half as often as with 128×128
blocks — and the kernel moves and takes markedly less. With K = 2048 there are eight panels; each
sub-tile streams its own rows and columns through L1, the operand bytes are exactly those of
128×128 blocks, and the larger block only changes how the work is dealt out (64 blocks instead of
256 over 24 cores). Larger L1 blocks pay when K is short; when K is long, the L0 tile (`m_l0`,
`n_l0`) is what sets the reuse.
""")

md("""
## 6 · Idle cores: blocks against cores

Blocks of C are dealt round-robin to the 24 cube cores, so the kernel takes `ceil(blocks / 24)`
*waves*; in the last one only `blocks mod 24` cores work. On a 1024³ matmul this matters more
than anything else:
""")

code("""
M2 = K2 = N2 = 1024
idle_rows = []
for t in (CubeTile.from_pypto([64, 64], [64, 256], [64, 64]),
          CubeTile.from_pypto([128, 128], [64, 256], [128, 128]),
          CubeTile.from_pypto([176, 176], [64, 128], [176, 176]),
          CubeTile.from_pypto([256, 256], [64, 256], [128, 256])):
    r = pypto_lab.simulate_matmul(M2, K2, N2, chip=CHIP, tile=t)
    blocks = -(-M2 // t.m_l1) * -(-N2 // t.n_l1)
    waves = -(-blocks // CHIP.cube_cores)
    idle_rows.append((t, r, blocks, waves))
    print(f"{str(t):28s} {blocks:3d} blocks -> {waves} waves, last wave {blocks - (waves - 1) * CHIP.cube_cores:2d}/24 cores, "
          f"cores used {r.cores_used:2d}: {r.cycles:7,.0f} cycles, cube {r.cube_utilization:4.0%}")
""")

md("""
64 blocks of 128×128 take three waves, the last one with 16 of 24 cores busy: a third of the
third wave idles. 176×176 blocks (1024 is not a multiple of 176, so the edge blocks are partial)
make 36 blocks in two waves: the second is half empty too, but there are only two, and the big
blocks reuse their operands better. 256×256 blocks make only 16 blocks for 24 cores: eight cores
never get any work, and one wave of large blocks is all the kernel has. The default tiling's
estimate weighs exactly this — waves × per-block cost — but only over a short list of power-of-two
tiles, and 176 is not a power of two; a search does better.

## 7 · Default against tuned

`cube_tile_candidates` ranks a short list of legal power-of-two tilings by a per-block estimate;
the first is the default. `pypto_lab.tuning` screens *every* legal tiling (hundreds of thousands)
with a numba-compiled analytic cost and then simulates the best few, as `auto_tune` does for every
Cube kernel of a model. Here for four shapes: the naive tiling of level 0 (128×128 blocks, K by
64), the default, and the best of the 16 best-screened tilings after simulation:
""")

code("""
SHAPES = [(2048, 2048, 2048), (1024, 1024, 1024), (4096, 768, 3072), (1000, 3000, 700)]
tuned_rows = []
for m, k, n in SHAPES:
    naive = pypto_lab.simulate_matmul(m, k, n, chip=CHIP, tile=naive_cube_tile(CHIP, m, k, n))
    default = pypto_lab.simulate_matmul(m, k, n, chip=CHIP)
    scr = screen_space(CHIP, m, k, n)
    cands = [scr.tile(int(i)) for i in np.argsort(scr.costs, kind="stable")[:16]]
    best = min([default] + [pypto_lab.simulate_matmul(m, k, n, chip=CHIP, tile=t) for t in cands],
               key=lambda r: r.cycles)
    tuned_rows.append((f"{m}x{k}x{n}", naive, default, best, scr.count))
    print(f"{m}x{k}x{n:<5d} screened {scr.count:7,d}: naive {naive.time_us:7.1f} us ({naive.cube_utilization:3.0%})  "
          f"default {default.time_us:7.1f} us ({default.cube_utilization:3.0%})  tuned {best.time_us:7.1f} us "
          f"({best.cube_utilization:3.0%}) {CubeTile(**best.tile)}")
""")

code("""
fig = Figure(figsize=(8, 3.4))
ax = fig.add_subplot()
x = np.arange(len(tuned_rows))
for i, (label, col) in enumerate((("naive (level 0)", "#8c8c8c"), ("default", "#4c72b0"), ("tuned", "#c44e52"))):
    ax.bar(x + (i - 1) * 0.27, [row[1 + i].cube_utilization for row in tuned_rows], 0.27, label=label, color=col)
ax.set_xticks(x, [row[0] for row in tuned_rows])
ax.set_ylabel("Cube utilisation")
ax.set_ylim(0, 1)
ax.legend(fontsize=8)
ax.set_title(f"naive, default and tuned tilings on {CHIP.name}", fontsize=9)
fig.tight_layout()
fig
""")

md("""
Against the naive tiling, the default wins most of what there is to win: its K panels are four
times longer in L1 (fewer, larger GM transfers) and its blocks bigger. Tuning adds a little more,
most where the default's power-of-two blocks divide badly over 24 cores (1024³: the 176×176 family
of the section above). The same search on a model is one call, `pypto_lab.tuning.auto_tune`,
which writes the tiles into the graph and never keeps a slower one. It simulates its own sample of
the best-screened tilings (the best half plus a seeded draw from the top 2 %), so its pick for the
1024³ `Linear` can differ from the loop above:
""")

code("""
import torch

torch.manual_seed(0)
om = pypto_lab.optimize(torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False)), torch.randn(1024, 1024),
                        chip="Ascend910B1", level=1)
result = pypto_lab.tuning.auto_tune(om, tune_config={"level": "normal", "progress": False}, cache_path=False)
print(result.table().split("\\n", 1)[1])
""")

md("""
## 8 · The sweep on the roofline

Each point is one tiling of section 5 (all the same 2048³ problem, so the same flops): its
arithmetic intensity is flops per byte it actually moves between GM and the cores, its height the
TFLOPS the simulator measured. Small blocks move more bytes for the same work and slide left and
down; the double-buffered points follow the L2 slope, as the `GM B/cycle` column said — above the
HBM line because most of those bytes are L2 hits. Single-buffered tilings sit at about half the
height at the same intensity: the Cube idles during every load whatever the bandwidth.
""")

code("""
best = max((s["r"] for s in sweep), key=lambda r: r.tflops)
fig = plot_roofline(best)
ax = fig.axes[0]
for db, marker in ((True, "o"), (False, "s")):
    sel = [s for s in sweep if s["db"] == db]
    ax.scatter([s["r"].flops / s["r"].gm_bytes for s in sel], [s["r"].tflops for s in sel], marker=marker,
               facecolors="none", edgecolors="black", s=40, zorder=4,
               label="sweep, " + ("double-buffered" if db else "single-buffered"))
    if db:
        for s in sel[:-1]:  # 176x176 and 256x128 share a point: label it once
            ax.annotate(s["block"], (s["r"].flops / s["r"].gm_bytes, s["r"].tflops), fontsize=7,
                        xytext=(-12, 6), textcoords="offset points")
ax.set_title(f"matmul {M}x{K}x{N}: tile sweep on the {CHIP.name} roofline", fontsize=9)
ax.legend(fontsize=7, loc="lower right")
fig
""")

md("""
Next: `exercises/01_fit_the_tiles.ipynb` asks you to find a tiling that fits L0A/L0B with
ping-pong and keeps the Cube 80 % busy, and `exercises/02_beat_the_default.ipynb` to beat the
default on the 1024³ case of section 6.
""")

NB.write("02_tiling_a_matmul.ipynb")
