"""Generator of notebooks/exercises/*.ipynb (run it, then execute each notebook in place).

    cd /work/main && .venv/bin/python notebooks/_build/exercises.py

Each exercise ships with a working reference answer in the cell the student edits, so the
notebooks pass under nbval; the checker lives in the notebook (not in pypto_lab).
"""

from _notebook import NOTEBOOKS, Notebook

OUT = NOTEBOOKS / "exercises"
md, code = Notebook.md, Notebook.code


def write(name: str, nb: Notebook) -> None:
    nb.write(f"exercises/{name}")


EDIT_BANNER = "## ✏️ Your answer — edit this cell\n\nThe value below is a working reference answer; replace it with your own and run the cells below."

# ---------------------------------------------------------------------------------------------
c = Notebook()
md(c, """
# Exercise 1 · Fit the tiles

**Goal.** A 3072³ fp16 matmul on the **Ascend 910B1**. Choose tile shapes
`([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])` — PyPTO's `set_cube_tile_shapes` — such that

1. the tiling is legal (alignment, `l1` a multiple of `l0`, every buffer within capacity);
2. **L0A and L0B hold two tiles each** (ping-pong), so MTE1 can load the next operands while the
   Cube multiplies — with double buffering on;
3. the Cube is at least **80 % utilised** (simulated cycles against the Cube's peak).

The starting tiling below — level 0's naive 128×128 blocks with K in steps of 64 — is legal and
fits, but fails 3. Background: `../02_tiling_a_matmul.ipynb`, sections 1–5.

*Useful numbers*: an fp16 operand tile of `r × c` takes `r × c × 2` bytes; L0A and L0B hold 64 KB,
L0C 128 KB (fp32 accumulator: `m_l0 × n_l0 × 4` bytes), L1 512 KB (`(m_l1 + n_l1) × k_l1 × 2`
bytes per K panel). Very small tiles (16 or 32) take several seconds to simulate.
""")
code(c, """
%matplotlib inline
import pypto_lab
from pypto_lab import CubeTile, TilingError
from pypto_lab.hw.tiling import plan_cube
from pypto_lab.viz.views import plot_tiling

CHIP = pypto_lab.get_chip("Ascend910B1")
M = K = N = 3072
TARGET = 0.80
STARTING_TILE = ([128, 128], [64, 64], [128, 128])
""")
md(c, """
### The checker

`check(answer)` runs the simulator and prints PASS or FAIL with the reason. It returns the verdict
and keeps the last report in `LAST` for plotting.
""")
code(c, """
LAST = {}

def check(answer):
    tile = answer if isinstance(answer, CubeTile) else CubeTile.from_pypto(*answer)
    print(f"tile {tile}")
    try:
        plan = plan_cube(CHIP, tile, "fp16", M, K, N, double_buffer=True)
    except TilingError as err:
        print(f"FAIL (rule 1, illegal tiling): {err}")
        LAST["report"] = err
        return "FAIL"
    for buf in ("L0A", "L0B"):
        cap = CHIP.buffer(buf).size_bytes
        one = plan.bytes_per_slot[buf]
        print(f"  {buf}: {plan.slots[buf]} x {one // 1024} KB of {cap // 1024} KB")
        if plan.slots[buf] < 2:
            print(f"FAIL (rule 2): one {buf} tile is {one} bytes; two need {2 * one}, {buf} holds {cap}: "
                  f"no ping-pong, MTE1 and the Cube would take turns. Shrink k_l0 or the {'m' if buf == 'L0A' else 'n'}_l0 side.")
            return "FAIL"
    r = pypto_lab.simulate_matmul(M, K, N, chip=CHIP, tile=tile, double_buffer=True)
    LAST["report"] = r
    blocks = -(-M // tile.m_l1) * -(-N // tile.n_l1)
    busy = {p: v / r.cycles for p, v in r.pipe_busy.items() if v}
    print(f"  {r.cycles:,.0f} cycles = {r.time_us:.1f} us, Cube utilisation {r.cube_utilization:.1%}; "
          f"{blocks} blocks on {r.cores_used} cores; GM traffic {r.gm_bytes / 1e6:.0f} MB")
    print("  busy fraction per pipe on the busiest core: " + ", ".join(f"{p} {v:.0%}" for p, v in busy.items()))
    if r.cube_utilization < TARGET:
        busiest = max((p for p in busy if p != "CUBE"), key=busy.get)
        print(f"FAIL (rule 3): Cube utilisation {r.cube_utilization:.1%} < {TARGET:.0%}. The busiest data pipe is "
              f"{busiest} ({busy[busiest]:.0%} busy): larger blocks re-read fewer operand bytes, longer K panels "
              f"(k_l1) mean fewer, larger GM transfers; and check that the blocks keep all {CHIP.cube_cores} cores busy.")
        return "FAIL"
    print(f"PASS: legal, L0A and L0B double-buffered, Cube utilisation {r.cube_utilization:.1%} >= {TARGET:.0%}")
    return "PASS"
""")
md(c, "What the starting tiling gets:")
code(c, """
check(STARTING_TILE);
""")
md(c, EDIT_BANNER)
code(c, """
# ✏️ EDIT ME: ([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])
ANSWER = ([256, 256], [64, 256], [128, 128])
""")
md(c, "### Check")
code(c, """
verdict = check(ANSWER)
""")
code(c, """
# NBVAL_CHECK_OUTPUT
print(verdict)
""")
code(c, """
plot_tiling(LAST["report"], CHIP) if not isinstance(LAST["report"], Exception) else None
""")
md(c, """
### Why the reference answer works

256×128 output blocks hold a 256×64 A tile (32 KB) and a 64×128 B tile (16 KB) per MMAD — two of
each fit L0A and L0B. Each block reads `(256 + 128) × k` operand elements for `256 × 128 × k` MACs:
about twice the reuse of 128×128 blocks, so half the GM traffic per flop. K panels of 256 instead
of 64 make each GM transfer four times longer, paying the GM round-trip latency a quarter as
often. Its 256×128 accumulator fills L0C alone (128 KB, one slot), a cost the other gains outweigh.
Can you find one that keeps two accumulators in L0C and still passes?
""")
write("01_fit_the_tiles.ipynb", c)

# ---------------------------------------------------------------------------------------------
c = Notebook()
md(c, """
# Exercise 2 · Beat the default

**Goal.** A 1024³ fp16 matmul on the **Ascend 910B1** (24 cube cores). pypto_lab's default tiling
(`cube_tile_candidates(...)[0]`) leaves much of the Cube idle on this small problem. Find a legal
tiling, with double buffering, whose simulated time is **at least 10 % below the default's**.

Hint: count the blocks (`ceil(m / m_l1) × ceil(n / n_l1)`) and the waves they make over 24 cores,
and what the last wave leaves idle — `../02_tiling_a_matmul.ipynb`, section 6. Tile sizes need
not be powers of two: any multiple of 16 elements is aligned for fp16.
""")
code(c, """
%matplotlib inline
import pypto_lab
from pypto_lab import CubeTile, TilingError
from pypto_lab.hw.tiling import cube_tile_candidates
from pypto_lab.viz.views import plot_tiling

CHIP = pypto_lab.get_chip("Ascend910B1")
M = K = N = 1024
GAIN = 0.10
DEFAULT = pypto_lab.simulate_matmul(M, K, N, chip=CHIP)
print(f"default tiling {CubeTile(**DEFAULT.tile)}: {DEFAULT.cycles:,.0f} cycles, Cube {DEFAULT.cube_utilization:.0%}")
""")
md(c, "### The checker")
code(c, """
LAST = {}

def waves(tile):
    blocks = -(-M // tile.m_l1) * -(-N // tile.n_l1)
    return blocks, -(-blocks // CHIP.cube_cores)

def check(answer):
    tile = answer if isinstance(answer, CubeTile) else CubeTile.from_pypto(*answer)
    try:
        r = pypto_lab.simulate_matmul(M, K, N, chip=CHIP, tile=tile, double_buffer=True)
    except TilingError as err:
        print(f"FAIL (illegal tiling): {err}")
        return "FAIL"
    LAST["report"] = r
    b, w = waves(tile)
    bd, wd = waves(CubeTile(**DEFAULT.tile))
    gain = 1 - r.cycles / DEFAULT.cycles
    print(f"tile {tile}: {b} blocks -> {w} wave(s), the last with {b - (w - 1) * CHIP.cube_cores} of "
          f"{CHIP.cube_cores} cores (default: {bd} blocks -> {wd} waves)")
    print(f"  {r.cycles:,.0f} cycles against the default's {DEFAULT.cycles:,.0f}: {gain:+.1%} time saved; "
          f"Cube {r.cube_utilization:.0%} (default {DEFAULT.cube_utilization:.0%})")
    if gain < GAIN:
        why = (f"only {r.cores_used} of {CHIP.cube_cores} cores get a block, the others idle" if r.cores_used < CHIP.cube_cores
               else "the last wave leaves cores idle, or the blocks are too small to reuse their operands")
        print(f"FAIL: {gain:.1%} < {GAIN:.0%} saved; {why}.")
        return "FAIL"
    print(f"PASS: {gain:.1%} faster than the default")
    return "PASS"
""")
md(c, "The default itself, and a bigger-is-better guess:")
code(c, """
check(CubeTile(**DEFAULT.tile))
print()
check(([256, 256], [64, 256], [128, 256]));
""")
md(c, EDIT_BANNER)
code(c, """
# ✏️ EDIT ME: ([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])
ANSWER = ([176, 176], [64, 128], [176, 176])
""")
md(c, "### Check")
code(c, """
verdict = check(ANSWER)
""")
code(c, """
# NBVAL_CHECK_OUTPUT
print(verdict)
""")
code(c, """
plot_tiling(LAST["report"], CHIP)
""")
md(c, """
### Why the reference answer works

176 does not divide 1024 (five full blocks and a partial one per side), but 6 × 6 = 36 blocks make
two waves over 24 cores instead of the default's three, and each block is larger, so it reuses
its operands more. A 176×176 fp32 accumulator is 121 KB: one slot of L0C. `pypto_lab.tuning`
(`screen_space`, `auto_tune`) finds answers like this by screening every legal tiling.
""")
write("02_beat_the_default.ipynb", c)

# ---------------------------------------------------------------------------------------------
c = Notebook()
md(c, """
# Exercise 3 · Vector tiles and double buffering

**Goal.** GELU over 16 M fp16 values (16,777,216 elements) on the **Ascend 910B1**'s 48 vector
cores. Choose a vector tile `(rows, cols)` — PyPTO's `set_vec_tile_shapes` — and whether to double
buffer, such that

1. the tile is legal: `cols × 2` bytes a multiple of 32, and the GELU's live tiles fit UB (192 KB);
2. the kernel reaches at least **90 % of its roofline** (`roofline_cycles / cycles`: the time the
   HBM traffic or the vector work needs at peak, against the simulated time).

The starting point — 1,024-element tiles, single-buffered — reaches about a third of it.
Background: `../01_davinci_tour.ipynb`, sections 2 and 6.
""")
code(c, """
%matplotlib inline
import pypto_lab
from pypto_lab import VecTile, TilingError
from pypto_lab.hw.kernels import VECTOR_OPS
from pypto_lab.viz.views import plot_swimlane

CHIP = pypto_lab.get_chip("Ascend910B1")
OP, NUMEL = "gelu", 16 * 1024 * 1024
TARGET = 0.90
STARTING = {"tile": (1, 1024), "double_buffer": False}
print(f"GELU keeps {VECTOR_OPS[OP].live_buffers} tiles live in UB; UB holds {CHIP.buffer('UB').size_bytes // 1024} KB")
""")
md(c, "### The checker")
code(c, """
LAST = {}

def check(answer):
    tile, db = VecTile(*answer["tile"]), bool(answer["double_buffer"])
    try:
        r = pypto_lab.simulate_vector(OP, NUMEL, dtype="fp16", chip=CHIP, tile=tile, double_buffer=db)
    except TilingError as err:
        print(f"FAIL (rule 1, illegal tile): {err}")
        return "FAIL"
    LAST["report"] = r
    eff = r.roofline_cycles / r.cycles
    ub = CHIP.buffer("UB").size_bytes
    busy = {p: v / r.cycles for p, v in r.pipe_busy.items() if v}
    print(f"tile {tile}, double_buffer={db}: UB {r.buffer_peak['UB'] // 1024} of {ub // 1024} KB, "
          f"{r.cycles:,.0f} cycles, {r.bound}-bound roofline {r.roofline_cycles:,.0f} cycles -> {eff:.1%} of it")
    print("  busy fraction per pipe on the busiest core: " + ", ".join(f"{p} {v:.0%}" for p, v in busy.items()))
    if eff < TARGET:
        if not db:
            why = ("single-buffered: each tile's load (MTE2), GELU (VECTOR) and store (MTE3) take turns, "
                   "so the memory system idles while the Vector unit works")
        elif r.buffer_peak["UB"] < ub // 4:
            why = ("the tiles are small: every GM transfer pays a round-trip latency of hundreds of cycles "
                   "and every vector instruction a minimum time, whatever its size")
        else:
            why = "the pipes do not overlap enough"
        print(f"FAIL (rule 2): {eff:.1%} < {TARGET:.0%} of the roofline; {why}.")
        return "FAIL"
    print(f"PASS: {eff:.1%} of the roofline")
    return "PASS"
""")
code(c, """
check(STARTING);
""")
md(c, EDIT_BANNER)
code(c, """
# ✏️ EDIT ME: tile (rows, cols) and double buffering
ANSWER = {"tile": (1, 8192), "double_buffer": True}
""")
md(c, "### Check")
code(c, """
verdict = check(ANSWER)
""")
code(c, """
# NBVAL_CHECK_OUTPUT
print(verdict)
""")
code(c, """
plot_swimlane(LAST["report"])
""")
md(c, """
### Why the reference answer works

An 8,192-element fp16 tile is 16 KB; GELU keeps three such tiles live, and with two slots that is
96 KB of UB's 192 KB. Each GM transfer is then large enough that its round-trip latency is a small
share of it, and with two slots MTE2 loads the next tile while the Vector unit computes on this
one, so the HBM traffic — which bounds this kernel — never stops. Try `(1, 16384)`:
double-buffered it fills UB exactly and passes; single-buffered it cannot overlap and fails.
""")
write("03_vector_tiles.ipynb", c)

# ---------------------------------------------------------------------------------------------
(OUT / "README.md").write_text("""# Exercises

Self-checking puzzles on the simulated Ascend 910B1. Each notebook has a `check(answer)` cell that
runs the simulator and prints **PASS** or **FAIL** with the reason, and one cell marked
**✏️ EDIT ME** with the answer. The notebooks ship with a working reference answer in that cell
(so they run clean under `make test`); to use them as exercises, replace it — or clear it — and
run the notebook from the top.

| notebook | puzzle | background |
|---|---|---|
| `01_fit_the_tiles.ipynb` | tile a 3072³ fp16 matmul so that L0A/L0B hold two tiles each and the Cube is ≥ 80 % utilised | `../02_tiling_a_matmul.ipynb` §1–5 |
| `02_beat_the_default.ipynb` | beat the default tiling of a 1024³ matmul by ≥ 10 % (blocks, waves and idle cores) | `../02_tiling_a_matmul.ipynb` §6 |
| `03_vector_tiles.ipynb` | choose a vector tile and double buffering for GELU over 16 M values to reach ≥ 90 % of the roofline | `../01_davinci_tour.ipynb` §2, §6 |

The checkers are small functions inside each notebook, built only on the public API
(`simulate_matmul`, `simulate_vector`, `plan_cube`), so you can read exactly what is tested.
The notebooks are generated by `notebooks/_build/exercises.py`.
""")
print(f"wrote {OUT / 'README.md'}")
