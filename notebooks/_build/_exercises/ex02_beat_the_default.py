"""Exercise 02: beat the default tiling of a 1024³ matmul on the 910B1 (blocks, waves, idle cores)."""

from .common import Exercise

EXERCISE = Exercise(
    slug="02_beat_the_default",
    title="Beat the default",
    teaches=("that on a small problem the number of blocks against the number of cores (the waves, and "
             "the idle cores of the last one) matters as much as the size of each block."),
    checked=("the tiling must be legal and its simulated time, double-buffered, at least 10 % below that "
             "of pypto_lab's default tiling (`default_cube_tile`) for the same matmul."),
    background="`../02_tiling_a_matmul.ipynb`, sections 6 and 7.",
    goal="""
**Goal.** A 1024³ fp16 matmul on the **Ascend 910B1**. pypto_lab's default tiling leaves much of the
Cube idle on this small problem. Find a legal tiling, with double buffering, whose simulated time is
**at least 10 % below the default's**.

Hint: count the blocks (`ceil(m / m_l1) × ceil(n / n_l1)`) and the waves they make over the cube
cores, and what the last wave leaves idle. Tile sizes need not be powers of two: any multiple of 16
elements is aligned for fp16.
""",
    setup="""
%matplotlib inline
import pypto_lab
from pypto_lab import CubeTile
from pypto_lab.course import BeatTheDefault
from pypto_lab.viz.views import plot_tiling

EX = BeatTheDefault(chip="Ascend910B1", m=1024, k=1024, n=1024, dtype="fp16", gain=0.10)
CHIP = pypto_lab.get_chip(EX.chip)
DEFAULT = EX.default()
print(f"{CHIP.name}: {CHIP.cube_cores} cube cores; default tiling {CubeTile(**DEFAULT.tile)}: "
      f"{DEFAULT.cycles:,.0f} cycles, Cube {DEFAULT.cube_utilization:.0%}")
""",
    before=[("The default itself, and a bigger-is-better guess. Read what each FAIL says about blocks, waves "
             "and idle cores:",
             """
print(EX.check(CubeTile(**DEFAULT.tile)))
print()
print(EX.check(([256, 256], [64, 256], [128, 256])))
""")],
    start="""
def answer():
    # ✏️ return ([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])
    raise NotImplementedError("your tiling here")
""",
    solution="""
def answer():
    return ([176, 176], [64, 128], [176, 176])
""",
    check="""
verdict = EX.check(answer)
print(verdict)
""",
    after=["""
plot_tiling(verdict.report, CHIP, requested=verdict.facts.get("requested")) if verdict.report is not None else None
"""],
    why="""
176 does not divide 1024 (five full blocks and a partial one per side), but 6 × 6 = 36 blocks make
two waves over 24 cores (the check prints the default's blocks and waves beside them). Each block
is larger than a 128 × 128 one, so it reuses its operands more, and `m_l1 = m_l0`, `n_l1 = n_l0` keep each block a single
L0C accumulator (176 × 176 × 4 bytes = 121 KB: one slot of L0C). `pypto_lab.tuning`
(`screen_space`, `auto_tune`) finds answers like this by screening every legal tiling.
""",
)
