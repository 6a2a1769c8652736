"""Exercise 01: tile a 3072³ fp16 matmul on the 910B1 so that L0A/L0B ping-pong and the Cube is busy."""

from .common import Exercise

EXERCISE = Exercise(
    slug="01_fit_the_tiles",
    title="Fit the tiles",
    teaches=("how the three tile levels of `set_cube_tile_shapes` fill L1, L0A, L0B and L0C, why the "
             "operand buffers need two tiles each (ping-pong), and how the block size sets how often "
             "A and B are re-read from GM."),
    checked=("`plan_cube` must accept the tiling (alignment, `l1` a multiple of `l0`, capacity), L0A and L0B "
             "must hold two tiles each with double buffering, and the simulated Cube utilisation "
             "(`simulate_matmul(...).cube_utilization`) must reach the target."),
    background="`../02_tiling_a_matmul.ipynb`, sections 1–5.",
    goal="""
**Goal.** A 3072³ fp16 matmul on the **Ascend 910B1**. Choose tile shapes
`([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])` such that

1. the tiling is legal;
2. **L0A and L0B hold two tiles each** (ping-pong), so MTE1 loads the next operands while the Cube
   multiplies — with double buffering on;
3. the Cube is at least **75 % utilised** (simulated cycles against the Cube's peak). The 910B1's
   large GEMMs keep their Cube busy 86–89 % of the time in a public profile; at 3072³ the L2 feeding
   MTE2 holds the best tilings near 80 %.

*Useful numbers* (printed by the next cell from the chip preset): the capacity of each buffer. An fp16
operand tile of `r × c` takes `r × c × 2` bytes, an fp32 accumulator tile `m_l0 × n_l0 × 4`, one K panel
in L1 `(m_l1 + n_l1) × k_l1 × 2`. Very small tiles (16 or 32) take several seconds to simulate.
""",
    setup="""
%matplotlib inline
import pypto_lab
from pypto_lab.course import FitTheTiles
from pypto_lab.viz.views import plot_tiling

EX = FitTheTiles(chip="Ascend910B1", m=3072, k=3072, n=3072, dtype="fp16", target=0.75)
CHIP = pypto_lab.get_chip(EX.chip)
print(f"{CHIP.name}: {CHIP.cube_cores} cube cores; "
      + ", ".join(f"{b} {CHIP.buffer(b).size_bytes // 1024} KB" for b in ("L1", "L0A", "L0B", "L0C")))
STARTING_TILE = ([128, 128], [64, 64], [128, 128])   # level 0's naive tiling
""",
    before=[("What the starting tiling — level 0's naive 128×128 blocks with K in steps of 64 — gets. "
             "Read the FAIL: it names the pipe that bounds the kernel and how many times it re-reads A and B.",
             "print(EX.check(STARTING_TILE))")],
    start="""
def answer():
    # ✏️ return ([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])
    raise NotImplementedError("your tiling here")
""",
    solution="""
def answer():
    return ([256, 256], [64, 256], [128, 128])
""",
    check="""
verdict = EX.check(answer)
print(verdict)
""",
    after=["""
# the buffers your tiling fills, and one core's pipes (nothing to draw before an attempt)
plot_tiling(verdict.report, CHIP, requested=verdict.facts.get("requested")) if verdict.report is not None else None
"""],
    why="""
* **Two tiles in L0A and L0B.** A 256×64 fp16 A tile is 32 KB and a 64×128 B tile 16 KB, so two of
  each fit the 64 KB of L0A and L0B: MTE1 fills one slot while the Cube reads the other.
* **Fewer GM re-reads.** Each 256×128 block reads its A rows and B columns over the whole K once, for
  `256 × 128 × K` multiply-adds. Against a 128×128 block that is a third more work per byte read, so
  the GM loads (MTE2) have less to move per flop (the PASS lines print the GM bytes against the
  minimum).
* **Longer K panels.** `k_l1 = 256` makes each GM transfer four times longer than `k_l1 = 64`, so
  the fixed start-up of a transfer is paid a quarter as often.
* **L1 = L0 in m and n.** Each block is one L0C accumulator, so its L1 panels are used once and
  never come back from GM for another sub-tile.

The 256×128 fp32 accumulator fills L0C alone (one slot), a cost the other gains outweigh. Can you
find a tiling that keeps two accumulators in L0C and still passes?
""",
    further=[("## Going further: a bigger L1 block than the L0 tile\n\nThe checker's traffic lines say how "
              "often each block's operands come from GM. Compare with a tiling whose L1 block holds 2×2 L0 "
              "tiles:",
              "print(EX.check(([128, 256], [128, 256], [128, 256])))")],
)
