"""Exercise 05: rewrite an MLP head so the 910A's layout pass puts no TransData between its matmuls."""

from .common import Exercise

EXERCISE = Exercise(
    slug="05_avoid_the_transdata",
    title="Pick the layout that avoids a TransData",
    teaches=("that on the 910A the Cube's matmuls read and write FRACTAL_NZ, so every op between two "
             "matmuls that needs ND costs two format conversions (TransData) through GM; and which model "
             "choices keep a tensor in NZ: a LayerNorm whose last two axes are multiples of 16, no reshape "
             "or ND-only op between the matmuls."),
    checked=("the level-2 report (`pypto_lab.optimize(model, x, chip='Ascend910A', level=2)`) must show no "
             "TransData kernel between the two matmuls, and the head must keep its layers: two Cube matmuls, "
             "a LayerNorm between them, a hidden width of at least 1000, and the input's shape at the output. "
             "Each TransData left is explained from your model's own shapes and ops."),
    background=("`../03_resnet50_walkthrough.ipynb` section 4 and `../04_bert_walkthrough.ipynb` section 5 "
                "(layout, NC1HWC0, FRACTAL_NZ and TransData); `pypto_lab/passes/layout.py` states every rule."),
    goal="""
**Goal.** The head below — a Linear up to a hidden width, GELU, LayerNorm, a Linear back down —
runs on the **Ascend 910A** at level 2. It works, but the layout pass converts the hidden activations
out of FRACTAL_NZ and back again between the two matmuls. Edit the class so that **no TransData sits
between the matmuls**, keeping its layers (two Linears with a LayerNorm between them, a hidden
width of at least 1000) and the output shape `[8, 64, 256]`.

The TransData at the very start (the input `x` is ND) and at the very end (the output must be ND)
are needed whatever you do; the checker says so.
""",
    setup="""
import torch
from torch import nn
from pypto_lab.course import AvoidTransData

EX = AvoidTransData(chip="Ascend910A", batch=8, tokens=64, d_model=256, min_hidden=1000)
print(f"input x: {list(EX.example().shape)} on {EX.chip}, level {EX.level}")
""",
    edit_hint=("This cell starts with a working but slow head. Change it — the width, the order of the ops, "
               "the reshapes — and run the check; every FAIL names the node that forced each TransData and why."),
    start="""
class Head(nn.Module):
    def __init__(self, d_model=256, hidden=1000):
        super().__init__()
        self.up = nn.Linear(d_model, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x):
        h = nn.functional.gelu(self.up(x))
        h = h.reshape(-1, h.shape[-1])          # flatten the tokens
        h = self.norm(h)
        return self.down(h).reshape(x.shape)
""",
    solution="""
class Head(nn.Module):
    def __init__(self, d_model=256, hidden=1024):          # a multiple of 16
        super().__init__()
        self.up = nn.Linear(d_model, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x):                                  # no reshape: Linear and LayerNorm take [8, 64, C]
        return self.down(self.norm(nn.functional.gelu(self.up(x))))
""",
    check="""
verdict = EX.check(Head)
print(verdict)
""",
    after=["""
# the level-2 kernels of your head, by time (nothing before an attempt)
print(verdict.report.report().table()) if verdict.report is not None else None
"""],
    why="""
Two things forced the conversions, and the starting FAIL names both:

* **The reshape.** `reshape`, `view`, `flatten`, `permute` change how the elements are laid out, and
  FRACTAL_NZ tiles the last two axes in 16×16 fractals, so the layout pass gives every view ND. A
  Linear and a LayerNorm over the last axis work on `[8, 64, C]` directly: the flatten was never
  needed.
* **The width.** CANN's LayerNorm kernel takes and gives FRACTAL_NZ only when the last two axes are
  multiples of 16 (`64` is; `1000 = 16 × 62 + 8` is not). At 1024 (or 1008) the matmul's NZ output
  feeds the LayerNorm and the LayerNorm's NZ output feeds the next matmul, and the GELU rides the
  first matmul's epilogue.

Each TransData is a full GM → UB → GM copy of the hidden activations, so removing two of them
removes two round trips of the largest tensor of the head (compare the kernel tables above).
""",
    further=[("## Going further: an op that only works in ND\n\nA softmax between the matmuls works along "
              "the last axis in ND, whatever the width. The checker names it:",
              """
class SoftmaxHead(Head):
    def forward(self, x):
        return self.down(torch.softmax(self.norm(nn.functional.gelu(self.up(x))), dim=-1))

print(EX.check(SoftmaxHead))
""")],
)
