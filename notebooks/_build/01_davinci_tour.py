"""Generator of notebooks/01_davinci_tour.ipynb (run it, then execute the notebook in place).

    cd /work/main && .venv/bin/python notebooks/_build/01_davinci_tour.py
"""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 01 · A tour of the DaVinci AI Core: cores, pipes, memory levels and the calibration curves

An Ascend NPU is a set of **AI Cores** in front of a shared L2 cache and HBM. Inside a core,
work is split between units that each run their own in-order instruction queue — a *pipe* — and
talk through small on-chip buffers. Everything pypto_lab simulates follows from three facts you
will meet in this notebook:

1. **how many cores** there are, and whether the Cube (matrix) and Vector units share a core;
2. **which pipe moves which data**, at what rate and with what fixed cost per instruction;
3. **how big each buffer is**, which bounds how much work one instruction can do.

Every number below is read from a chip preset (`pypto_lab/hw/presets/*.toml`, each constant with
its public source) or produced by the simulator; the last part compares the model with 3,664
micro-benchmarks measured on real 910B chips.
""")

code("""
%matplotlib inline
import collections
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

import pypto_lab
from pypto_lab.hw.chip import PIPES
from pypto_lab.hw import calibration
from pypto_lab.viz.views import plot_swimlane, plot_pipe_busy, PIPE_COLOURS

CHIPS = pypto_lab.list_chips()
b1 = pypto_lab.get_chip("Ascend910B1")
a = pypto_lab.get_chip("Ascend910A")
CHIPS
""")

md("""
## 1 · Cores: Cube and Vector, together or apart

The **Cube** multiplies matrix fractals (16×16×16 in fp16: 4,096 MACs per cycle); the **Vector**
unit runs SIMD instructions on 256-byte repeats (element-wise ops, reductions, casts). On the
first-generation **910A** (core version AIC-C-100) every AI Core holds both units. On the
**910B** (AIC-C-220) they were split into separate *cube cores* (AIC) and *vector cores* (AIV),
one AIC for two AIVs, that exchange data only through GM/L2.
""")

code("""
# NBVAL_CHECK_OUTPUT
print(f"{'chip':12s} {'core':10s} {'cube':>5s} {'vector':>6s}  {'Cube and Vector':22s} {'clock':>9s}")
for name in CHIPS:
    c = pypto_lab.get_chip(name)
    layout = "separate cores" if c.split_cores else "in the same core"
    print(f"{name:12s} {c.core_version:10s} {c.cube_cores:5d} {c.vector_cores:6d}  {layout:22s} {c.clock_mhz:6.0f} MHz")
""")

code("""
for key in ("chip.cube_cores", "chip.vector_cores", "chip.split_cores"):
    print(f"910B1 {key:18s} <- {b1.sources[key]}")
    print(f"910A  {key:18s} <- {a.sources[key]}")
""")

md("""
The split matters most for what happens *after* a matmul. The Cube accumulates into **L0C**
(fp32). On the 910B, **FixPipe** drains L0C straight to GM, converting to fp16 on the way; an
element-wise epilogue such as GELU then has to run on a *vector* core, which reads C back from GM
and writes it again. On the 910A there is no FixPipe: L0C drains through the **Vector** unit into
**UB** (and MTE3 writes UB to GM), so a GELU can be applied in UB on the way out, with no extra GM
traffic — but the Vector pipe of the same core is busy with it.

The same 1024³ fp16 matmul, with and without a GELU epilogue, on both chips:
""")

code("""
rows = []
for chip in ("Ascend910A", "Ascend910B1"):
    for ep in ("none", "gelu"):
        r = pypto_lab.simulate_matmul(1024, 1024, 1024, chip=chip, epilogue=ep)
        rows.append((chip, ep, r))
        print(f"{chip:12s} epilogue {ep:5s}: {r.cycles:8,.0f} cycles, GM traffic {r.gm_bytes / 1e6:5.1f} MB, "
              f"busiest core's CUBE / VECTOR / FIXP busy {r.pipe_busy['CUBE']:6,.0f} / {r.pipe_busy['VECTOR']:6,.0f} / "
              f"{r.pipe_busy['FIXP']:4,.0f} cycles")
""")

code("""
plot_swimlane(rows[1][2], core=0)   # 910A with GELU: the drain runs on the VECTOR and MTE3 lanes of the cube core
""")

code("""
plot_swimlane(rows[3][2], core=0)   # 910B1 with GELU: the cube core only drains through FIXP to GM
""")

md("""
On the 910A the GELU occupies the VECTOR lane of the cube core itself, between the L0C drain and
MTE3: on this core it is busy longer than the Cube is with all its MMADs, and the kernel's cycles grow by the
amounts printed above, with the same GM traffic. On the 910B1 the cube core has no VECTOR work
with or without GELU — its output leaves through FIXP — and the epilogue's cost shows up instead
as extra GM traffic (C written by FixPipe, read back and written again by a vector core) and the
extra cycles printed above.

## 2 · Pipes: who moves what

Each core has seven pipes. Instructions on one pipe run in order; different pipes run in
parallel, synchronised by `set_flag`/`wait_flag` pairs. That is the whole reason double
buffering works: MTE2 can load the next tile while the Cube computes on this one.

| pipe | what it does |
|---|---|
| **MTE2** | GM → L1 / UB (and GM → L0A/L0B): every load from memory |
| **MTE1** | L1 → L0A / L0B (the Cube's operands), L1 → BiasTable / FixPipe buffer |
| **CUBE** | MMAD: fractal matrix multiply-accumulate into L0C |
| **FIXP** | FixPipe (910B): L0C → GM or L1, with dtype conversion |
| **VECTOR** | SIMD instructions on UB; on 910A/310P also the L0C → UB drain |
| **MTE3** | UB → GM (and UB → L1 on 910A/310P) |
| **SCALAR** | address arithmetic and control (not modelled as a bottleneck here) |

Each way data moves is a `DataPath` in the preset, carried by one pipe: the pipe is busy
`startup + bytes / rate` cycles, and a GM access's data is ready no earlier than its round-trip
`latency`. Here are the 910B1's:
""")

code("""
def path_table(chip):
    print(f"{chip.name}: {'path':18s} {'pipe':6s} {'B/cycle':>8s} {'start-up':>9s} {'latency':>8s}")
    for name, p in chip.paths.items():
        print(f"{'':{len(chip.name) + 2}s}{p.src + ' -> ' + p.dst:18s} {p.pipe:6s} {p.bytes_per_cycle:8.1f} "
              f"{p.startup_cycles:9.1f} {p.latency_cycles:8.1f}")

path_table(b1)
""")

code("""
path_table(a)
""")

md("""
Two things to notice. The 910A has no `L0C -> GM` path: its L0C leaves through the **VECTOR** pipe
into UB, as section 1 showed; the 910B1 has FixPipe paths instead, plus the BiasTable (BT) and
FixPipe buffer (FB) that hold a fused bias or quantisation scales. And the GM paths have
**round-trip latencies of 150–330 cycles** against start-ups of a few cycles on-chip: a GM load
only reaches its bandwidth if it is big, or if several are in flight. The effective bandwidth of
one isolated transfer, `bytes / max(latency, startup + bytes / rate)`, straight from these constants:
""")

code("""
sizes = np.geomspace(256, 1 << 20, 60)
fig = Figure(figsize=(8, 3.6))
ax = fig.add_subplot()
for i, name in enumerate(("GM_TO_L1", "GM_TO_UB", "L1_TO_L0A", "L1_TO_L0B", "L0C_TO_GM", "UB_TO_GM")):
    p = b1.data_path(name)
    ax.plot(sizes / 1024, [s / p.cycles(s) for s in sizes], label=f"{name} ({p.pipe})",
            color=f"C{i}", linestyle="-" if p.src == "GM" or p.dst == "GM" else "--")
ax.set_xscale("log")
ax.set_xlabel("bytes per transfer (KiB)")
ax.set_ylabel("bytes per cycle")
ax.set_title("Ascend910B1: one transfer's effective rate, from the preset's DataPath constants", fontsize=9)
ax.legend(fontsize=7)
fig.tight_layout()
fig
""")

md("""
## 3 · Memory levels

From far to near: **HBM** (GM, tens of GB, shared by all cores), **L2** (tens to hundreds of MB,
shared), then per core **L1** (the Cube's staging buffer for A and B panels), **L0A / L0B** (the
Cube's operands), **L0C** (its fp32/int32 accumulator) and **UB** (the Vector unit's working
memory). The on-chip buffers are tiny: a Cube instruction's operands must fit L0A and L0B, so
tile sizes are bounded by these numbers (notebook 02).
""")

code("""
# NBVAL_CHECK_OUTPUT
names = ("L1", "L0A", "L0B", "L0C", "UB", "BT", "FB")
print(f"{'chip':12s} " + " ".join(f"{n:>6s}" for n in names) + "   (KB per core)     L2 MB   HBM GB")
for name in CHIPS:
    c = pypto_lab.get_chip(name)
    cells = [f"{c.buffers[n].size_bytes // 1024:6d}" if n in c.buffers else f"{'-':>6s}" for n in names]
    print(f"{name:12s} " + " ".join(cells) + f"   {'':15s} {c.l2_bytes / 2**20:7.0f} {c.hbm_bytes / 2**30:7.0f}")
""")

code("""
for key in ("buffers.L1.size_bytes", "buffers.L0A.size_bytes", "buffers.L0C.size_bytes", "buffers.UB.size_bytes",
            "chip.l2_bytes", "chip.l2_gbps", "chip.hbm_gbps"):
    print(f"{key:24s} <- {b1.sources[key]}")
""")

md("""
The 910B1 halves L1 and L0C against the 910A (512 KB and 128 KB instead of 1 MB and 256 KB)
while its clock is 1.85× higher: its cores are faster, but each holds less, which is why a
256×256 fp32 accumulator (256 KB) fits the 910A's L0C and not the 910B1's. Bandwidths and what
each level costs to reach, per core and per chip:
""")

code("""
for c in (a, b1):
    print(f"{c.name}: HBM {c.hbm_gbps:,.0f} GB/s = {c.hbm_bytes_per_cycle():.0f} B/cycle for the chip, "
          f"{c.hbm_bytes_per_cycle() / c.cube_cores:.1f} B/cycle per cube core; "
          f"L2 {c.l2_gbps:,.0f} GB/s = {c.l2_bytes_per_cycle() / c.cube_cores:.0f} B/cycle per core; "
          f"GM->L1 path {c.data_path('GM_TO_L1').bytes_per_cycle:.0f} B/cycle per core")
""")

md("""
So when all cube cores stream from HBM at once, each gets far less than its own MTE2 path could
carry; the simulator shares HBM and L2 between the cores (a first touch of data comes from HBM, a
re-read of data whose working set fits comes from L2). That is why a matmul has to *reuse*
what it loads — the subject of notebook 02.

## 4 · The calibration curves: the model against measured micro-benchmarks

The timing constants above are not guesses: `python -m pypto_lab.hw.fit` fits them to
`datasets/calibration/ascend_mskpp_microbench.csv`, 3,664 per-core micro-benchmarks measured on
910B1/910B3/950 and published in Huawei's MindStudio mskpp. `pypto_lab.hw.calibration.microbench`
predicts any row of that CSV from a chip's constants — the same constants the event simulator
charges per instruction. Measured points against the model's curve for four transfers, the Cube's
MMAD and two vector instructions:
""")

code("""
ROWS = [r for r in calibration.load_microbench() if r["chip"] == "Ascend910B1"]
print(f"{len(ROWS)} Ascend910B1 rows; by table:", dict(collections.Counter(r["table"] for r in ROWS)))

def series(table, what, dtypes=""):
    sel = sorted((r for r in ROWS if (r["table"], r["path_or_instr"], r["dtypes"]) == (table, what, dtypes)),
                 key=lambda r: (r["m"] or 0, r["k"] or 0, r["n"] or 0, r["x"] or 0))
    pred = [calibration.microbench(b1, table, what, dtypes, x=r["x"], m=r["m"], k=r["k"], n=r["n"]) for r in sel]
    return sel, np.array([r["value"] for r in sel]), np.array(pred)
""")

code("""
PANELS = [("transfer_bursts", "GM_TO_UB", "", "KiB"), ("transfer_bursts", "UB_TO_GM", "", "KiB"),
          ("transfer_bursts", "L1_TO_L0A", "", "KiB"), ("transfer_bursts", "L0C_TO_GM", "", "KiB"),
          ("vector", "VADD", "FP16_FP16_FP16", "elements"), ("vector", "VEXP", "FP16_FP16", "elements")]
fig = Figure(figsize=(11, 8.5))
fit_err = {}
for i, (table, what, dts, unit) in enumerate(PANELS):
    ax = fig.add_subplot(3, 3, i + 1)
    sel, meas, pred = series(table, what, dts)
    x = np.array([r["x"] for r in sel])
    ax.plot(x, meas, "o", ms=3, color="#4c72b0", label="measured")
    ax.plot(x, pred, "-", color="#c44e52", label="model")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(f"{what} {dts}".strip(), fontsize=9)
    ax.set_xlabel(unit, fontsize=8)
    ax.set_ylabel(sel[0]["unit"].replace("ops/cycle", "B/cycle") if table == "vector" else sel[0]["unit"], fontsize=8)
    ax.tick_params(labelsize=7)
    fit_err[f"{table}/{what}"] = float(np.mean(np.abs(pred - meas) / meas) * 100)
    if i == 0:
        ax.legend(fontsize=7)
# the Cube: one MMAD of m x k x n, operations per cycle against its fractal count
sel, meas, pred = series("mmad", "MMAD", "FP16_FP16_FP32")
frac = np.array([calibration.mmad_fractals(r["m"], r["k"], r["n"], (16, 16, 16)) for r in sel])
order = np.argsort(frac)
ax = fig.add_subplot(3, 3, 7)
ax.plot(frac, meas, "o", ms=3, color="#4c72b0")
ax.plot(frac[order], pred[order], "-", color="#c44e52")
ax.set_xscale("log")
ax.set_title("MMAD FP16_FP16_FP32", fontsize=9)
ax.set_xlabel("16x16x16 fractals in one MMAD", fontsize=8)
ax.set_ylabel("operations / cycle", fontsize=8)
ax.tick_params(labelsize=7)
fit_err["mmad/MMAD"] = float(np.mean(np.abs(pred - meas) / meas) * 100)
# relative error of every panel
ax = fig.add_subplot(3, 3, (8, 9))
ax.barh(list(fit_err), list(fit_err.values()), color="#8172b2")
ax.set_xlabel("mean |model - measured| / measured, %", fontsize=8)
ax.tick_params(labelsize=7)
ax.invert_yaxis()
fig.suptitle("Ascend910B1: measured micro-benchmarks (mskpp) vs the model's prediction", fontsize=10)
fig.tight_layout()
fig
""")

code("""
for k, v in fit_err.items():
    print(f"{k:28s} mean error {v:5.2f} %")
for instr, dts in (("VADD", "FP16_FP16_FP16"), ("VEXP", "FP16_FP16")):
    t = b1.vector.timing(instr, dts)
    print(f"{instr} {dts}: {t.cycles_per_repeat:.2f} cycles per 256-B repeat -> plateau "
          f"{b1.vector.repeat_bytes / t.cycles_per_repeat:.0f} B/cycle; at least {t.min_cycles:.1f} cycles per instruction")
print(f"MMAD: {b1.cube.startup_cycles:.2f} start-up cycles + one cycle per fractal")
""")

md("""
What the curves say about the hardware:

* **GM transfers** (GM_TO_UB, UB_TO_GM) rise linearly with size and then bend sharply into a
  plateau. The linear part is the round-trip latency floor: below a few KiB a transfer costs the
  same whatever its size, so its bandwidth grows with it. The model's `max(latency, startup +
  bytes/rate)` reproduces the bend; the rows just before it are where it misses most.
* **L1 → L0A** is on-chip: a start-up of about two cycles, then 256 B/cycle — it reaches its
  plateau at a few KiB.
* **L0C → GM** (FixPipe) saturates at its rate almost at once; the measured points scatter a few
  percent around the plateau, which a single rate cannot follow.
* **MMAD** costs one cycle per 16×16×16 fractal plus a small start-up, so a one-fractal MMAD runs
  at under half the peak and a large one close to 8,192 operations per cycle (4,096 MACs).
* **Vector** instructions run at 256 bytes per 1 or 2 cycles once they have a few repeats (VADD:
  two cycles per repeat, so 128 B/cycle; VEXP close to four), as printed above; below a few
  repeats the minimum instruction time dominates.

Those fixed costs — latency per GM transfer, start-up per MMAD, minimum cycles per vector
instruction — are what tiles must be large enough to amortise.

## 5 · The fidelity table (`pypto-lab calibrate`)

`pypto-lab calibrate --chip Ascend910B1` compares the model with *every* row of that chip it
covers (one line per table/path/dtypes). Grouped by family:
""")

code("""
result = calibration.calibrate("Ascend910B1")
keys = [k for k in result if not k.startswith("_")]
fam = collections.defaultdict(list)
for k in keys:
    table, what = k.split("/")[:2]
    family = f"{table}/{what}" if table != "vector" else "vector (all instructions)"
    fam[family].append(result[k])
print(f"{'family':34s} {'keys':>4s} {'rows':>5s} {'MAPE %':>7s} {'max APE %':>9s}")
for family, es in sorted(fam.items()):
    n = sum(e["rows"] for e in es)
    mape = sum(e["mape"] * e["rows"] for e in es) / n
    print(f"{family:34s} {len(es):4d} {n:5d} {mape:7.2f} {max(e['max_ape'] for e in es):9.2f}")
print()
print("\\n".join(calibration.format_calibration(result).splitlines()[-4:]))
""")

code("""
worst = sorted(keys, key=lambda k: -result[k]["mape"])[:8]
for k in worst:
    print(f"{k:40s} rows {result[k]['rows']:3d}  MAPE {result[k]['mape']:6.2f} %  max {result[k]['max_ape']:6.2f} %")
""")

md("""
The worst keys are known quirks of the published data rather than of the model: several 16-bit
vector keys (VMLA, VMADDRELU, VREDUCE, VREDUCEV2, VSHL, VGATHERB on 16-bit types) list their
element count `x` inconsistently with their cycle count, and VCONV INT4_FP16 rows use the bytes of
another operand (see `datasets/calibration/README.md`). Among the transfers, the MiB-scale
GM → L1 rows include a large benchmark-harness cost that is not a property of the pipe, and the
GM transfers' worst rows sit at the bend between the latency floor and the plateau.
`GM_TO_L1_TRANS` (a load with ND→NZ format conversion, a saw-tooth in the data) is not modelled
and is counted as *not covered*. The 910A and 310P3 presets have no public measurements: their
pipe timings are carried over from the 910B1 fit, as their preset sources say.

## 6 · A vector kernel and its swimlane

A row-wise **softmax** over 8,192 rows of 1,024 fp16 values on the 910B1's 48 vector cores. Each
core streams tiles of whole rows: MTE2 loads a tile into UB, the Vector unit runs max, subtract,
exp, sum and divide on it (plus one cross-lane reduction per row), MTE3 stores it. With two UB
slots (double buffering) the next load overlaps this tile's arithmetic.
""")

code("""
sm = pypto_lab.simulate_vector("softmax", 8192 * 1024, dtype="fp16", chip="Ascend910B1", row_len=1024)
print(f"{sm.name}: tile {sm.tile}, {sm.cores_used} vector cores, {sm.cycles:,.0f} cycles = {sm.time_us:.1f} us, "
      f"UB {sm.buffer_peak['UB'] // 1024} KB of {b1.buffer('UB').size_bytes // 1024} KB, {sm.bound}-bound; "
      f"{sm.roofline_cycles / sm.cycles:.0%} of the roofline")
plot_swimlane(sm)
""")

code("""
plot_pipe_busy(sm)
""")

code("""
single = pypto_lab.simulate_vector("softmax", 8192 * 1024, dtype="fp16", chip="Ascend910B1", row_len=1024,
                                   tile=pypto_lab.VecTile(**sm.tile), double_buffer=False)
print(f"single-buffered: {single.cycles:,.0f} cycles ({single.cycles / sm.cycles:.2f}x the double-buffered kernel), "
      f"{single.roofline_cycles / single.cycles:.0%} of the roofline")
plot_swimlane(single)
""")

md("""
Softmax does about five vector instructions per element, but on the 910B1 the kernel is still
**memory-bound**: the roofline compares the vector work at the plateau rate with the bytes over
HBM, and the 48 vector cores finish their arithmetic faster than HBM can deliver the rows. In the
double-buffered swimlane the MTE2 lane is solid — loads, and the HBM write-backs of earlier stores
that hold the read port (hatched) — so memory sets the pace and the Vector lane works in the gaps. Single-buffered, each tile's load, arithmetic and store take turns, and the
memory system idles while the Vector unit works. Vector tiles and double buffering are the
subject of `exercises/03_vector_tiles.ipynb`; Cube tiles are next, in `02_tiling_a_matmul.ipynb`.
""")

NB.write("01_davinci_tour.ipynb")
