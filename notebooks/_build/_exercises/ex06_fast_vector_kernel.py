"""Exercise 06: make a correct but slow pypto kernel, out = relu(x + y), beat a cycle target."""

from .common import Exercise

EXERCISE = Exercise(
    slug="06_fast_vector_kernel",
    title="A fast Vector kernel in pypto",
    teaches=("writing a kernel in `pypto_lab.pto` (PyPTO's programming model) and choosing its vec tile: "
             "how many tasks each Vector core runs, how much of UB a task's live tensors take, and why a "
             "memory-bound kernel needs long transfers to reach HBM bandwidth."),
    checked=("your kernel is run on two fixed 4096 × 1024 fp16 tensors; `out` must match "
             "`torch.relu(x + y)` within fp16 tolerance, and the simulated cycles (`kernel.last_run.cycles`) "
             "must be at most the target: the bytes the kernel must move at 85 % of the chip's HBM "
             "bandwidth."),
    background="`../05_writing_kernels.ipynb`, sections 1 and 5; `examples/kernels/add.py`.",
    goal="""
**Goal.** `out = relu(x + y)` over 4096 × 1024 fp16 tensors on the **Ascend 910B1**. The kernel in the
edit cell is correct but slow: its vec tile is tiny. Make it **correct and at most `EX.target_cycles`
cycles** (printed below: the time to move x, y and out once at 85 % of the HBM bandwidth that a
stream of two reads to one write reaches; DRAM loses time turning between reads and writes).

You may change anything in the kernel — the tile shape, the ops, loops — as long as it is a
`@pypto.jit` kernel taking `(x, y, out)` and writing `out`.
""",
    setup="""
%matplotlib inline
import torch
import pypto_lab
import pypto_lab.pto as pypto
from pypto_lab.course import FastAddRelu
from pypto_lab.viz.views import plot_swimlane

EX = FastAddRelu(chip="Ascend910B1", rows=4096, cols=1024, share=0.85)
CHIP = pypto_lab.get_chip(EX.chip)
print(f"{CHIP.name}: {CHIP.vector_cores} vector cores, UB {CHIP.buffer('UB').size_bytes // 1024} KB each; "
      f"target: {EX.target_cycles:,} cycles for {EX.min_bytes / 1e6:.1f} MB")
""",
    edit_hint=("This cell starts with a correct kernel on a 1 × 128 tile. Edit it and run the check: a "
               "FAIL names the busiest pipe, the tasks per core and the UB each task takes."),
    start="""
@pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
def add_relu(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(1, 128)          # ✏️ 128 fp16 values = 256 bytes per operand per task
    out[:] = pypto.relu(x + y)
""",
    solution="""
@pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
def add_relu(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(8, 1024)         # 16 KB per operand; 3 live tensors x 2 slots = 96 KB of UB
    out[:] = pypto.relu(x + y)
""",
    check="""
verdict = EX.check(add_relu)
print(verdict)
""",
    after=["""
# one core's pipes over time (nothing to draw before the kernel runs)
plot_swimlane(verdict.report) if verdict.report is not None else None
"""],
    why="""
`relu(x + y)` does two cheap vector instructions per element and moves 6 bytes per element (two fp16
loads, one store): it is memory-bound, and only HBM bandwidth limits it. With 1 × 128 tiles every
Vector core runs hundreds of tasks, each a few hundred bytes per operand, and every load, store and
instruction pays its fixed start-up that many times — the pipes spend their time starting, not
moving.

An 8 × 1024 tile is 16 KB per operand: x, y and out live at once (48 KB per task), two slots fit in
192 KB, so MTE2 loads the next task while the Vector unit and MTE3 finish this one, and each core
runs about ten long tasks. MTE2 then streams without pause, and the check prints how close to HBM
bandwidth that brings the kernel. A 64 × 1024 tile does not fit UB at all: the pto compiler's `TileCapacityError` names
the bytes and a tile that fits.
""",
    further=[("## Going further: too big a tile\n\nThe compiler refuses tiles whose live tensors overflow UB; "
              "the checker passes its teaching error on:",
              """
@pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
def add_relu_huge(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
    pypto.set_vec_tile_shapes(64, 1024)
    out[:] = pypto.relu(x + y)

print(EX.check(add_relu_huge))
""")],
)
