"""Exercise 03: a vector tile and double buffering for GELU over 16 M values on the 910B1."""

from .common import Exercise

EXERCISE = Exercise(
    slug="03_vector_tiles",
    title="Vector tiles and double buffering",
    teaches=("how a Vector kernel streams tiles GM → UB → Vector → UB → GM, what the UB capacity allows "
             "for the tiles an op keeps live, and why a second UB slot lets loads, compute and stores "
             "overlap."),
    checked=("the tile must be legal (`cols × 2` bytes a multiple of 32, the live tiles within UB) and "
             "the simulated kernel (`simulate_vector`) must reach 90 % of its roofline "
             "(`roofline_cycles / cycles`)."),
    background="`../01_davinci_tour.ipynb`, sections 2 and 6.",
    goal="""
**Goal.** GELU over 16 M fp16 values (16,777,216 elements) on the **Ascend 910B1**'s vector cores.
Choose a vector tile `(rows, cols)` — PyPTO's `set_vec_tile_shapes` — and whether to double buffer,
such that

1. the tile is legal: `cols × 2` bytes a multiple of 32, and GELU's live tiles fit UB;
2. the kernel reaches at least **90 % of its roofline**: the time the HBM traffic or the vector work
   needs at peak, against the simulated time. The HBM peak is the one this kernel's mix of reads and
   writes can reach.
""",
    setup="""
%matplotlib inline
import pypto_lab
from pypto_lab.course import VectorTiles
from pypto_lab.viz.views import plot_swimlane

EX = VectorTiles(chip="Ascend910B1", op="gelu", numel=16 * 1024 * 1024, dtype="fp16", target=0.90)
CHIP = pypto_lab.get_chip(EX.chip)
print(f"{CHIP.name}: {CHIP.vector_cores} vector cores, UB {CHIP.buffer('UB').size_bytes // 1024} KB each; "
      f"{EX.op} keeps {EX.live_tiles} tiles live in UB")
STARTING = {"tile": (1, 1024), "double_buffer": False}
""",
    before=[("The starting point: 1,024-element tiles, single-buffered. Its FAIL says which pipes were "
             "busy and for how long:",
             "print(EX.check(STARTING))")],
    start="""
def answer():
    # ✏️ return {"tile": (rows, cols), "double_buffer": True or False}
    raise NotImplementedError("your vector tile here")
""",
    solution="""
def answer():
    return {"tile": (1, 8192), "double_buffer": True}
""",
    check="""
verdict = EX.check(answer)
print(verdict)
""",
    after=["""
# one core's pipes over time (nothing to draw before a legal attempt)
plot_swimlane(verdict.report) if verdict.facts.get("cycles") else None
"""],
    why="""
An 8,192-element fp16 tile is 16 KB; GELU keeps three such tiles live, and with two slots that is
96 KB of UB's 192 KB. Each GM transfer is then long enough that its fixed start-up is a small share
of it, and with two slots MTE2 loads the next tile while the Vector unit computes on this one, so
the HBM traffic — the roofline of this kernel, as the check prints — never stops.

Try `(1, 16384)`: double-buffered it fills UB exactly; single-buffered the pipes take turns. And
`(1, 32768)` with `double_buffer=True`: one slot fits, two do not, so the kernel quietly runs
single-buffered — the checker says so.
""",
)
