"""Exercise 04: predict the GM traffic of a conv + BN + residual + ReLU block at levels 0 and 1."""

from .common import Exercise

EXERCISE = Exercise(
    slug="04_fuse_and_predict",
    title="Fuse a block and predict its GM traffic",
    teaches=("what operator fusion saves: every unfused element-wise kernel reads its inputs from GM and "
             "writes its output back, while a fused epilogue works on the tile before it leaves the core; "
             "and what fusion still has to read (the residual)."),
    checked=("your GM byte counts for the whole block at level 0 and at level 1 must be within 2 % of "
             "`pypto_lab.optimize(block, x, level=...).report().gm_bytes`; the checker then lists every "
             "kernel with the tensors it reads and writes."),
    background="`../03_resnet50_walkthrough.ipynb`, section 3 (conv + BN + ReLU fusion).",
    goal="""
**Goal.** The block below — `relu(bn(conv3x3(x)) + x)`, the second half of a ResNet basic block — on a
1×64×56×56 fp16 input on the **Ascend 910A**. Predict the bytes it moves between GM and the cores:

* at **level 0**, where every op is its own kernel (a Cube convolution, then BatchNorm, the add and the
  ReLU on the Vector unit);
* at **level 1**, where BatchNorm is folded into the convolution's weights and bias, and the add and
  the ReLU run in the convolution's epilogue.

The convolution's own traffic (its im2col input, weights and output, at the tiling each level uses)
is given in `CONV[level]`; the size of one activation in `ACT`. Everything else is yours to count.
""",
    setup="""
import inspect
from pypto_lab.course import FusedTraffic, ResidualBlock

EX = FusedTraffic(chip="Ascend910A", channels=64, size=56, batch=1, precision="fp16")
ACT = EX.activation_bytes                           # one 1x64x56x56 fp16 tensor
CONV = {level: EX.conv_alone(level) for level in (0, 1)}   # the convolution alone, no epilogue
print(inspect.getsource(ResidualBlock))
print(f"ACT = {ACT:,} bytes; CONV = {{0: {CONV[0]:,.0f}, 1: {CONV[1]:,.0f}}} bytes")
""",
    start="""
def prediction():
    # ✏️ return {"level0": bytes, "level1": bytes}, e.g. written with CONV and ACT
    raise NotImplementedError("your GM byte counts here")
""",
    solution="""
def prediction():
    level0 = CONV[0] + 2 * ACT + 3 * ACT + 2 * ACT   # BN: 1 in, 1 out; add: 2 in, 1 out; ReLU: 1 in, 1 out
    level1 = CONV[1] + ACT                           # the epilogue reads the residual x once
    return {"level0": level0, "level1": level1}
""",
    check="""
verdict = EX.check(prediction)
print(verdict)
""",
    why="""
At level 0 each Vector kernel streams whole activations through GM: BatchNorm reads the convolution's
output and writes its own (2 activations), the add reads two and writes one (3), the ReLU reads one
and writes one (2). That is 7 activations on top of the convolution.

At level 1 the BatchNorm is gone (folded into the weights and a bias), and on the 910A the AI Core's
Vector unit applies bias, residual add and ReLU to each output tile on its way out of L0C, in UB. Only
the residual `x` has to come from GM, once: 1 activation on top of the convolution. The saving is the
difference, printed by the PASS.
""",
    further=[("## Going further: the same block on the Ascend 910B1\n\nOn the 910B the Cube and the Vector "
              "units sit in separate cores (AIC and AIV). Check the same prediction there — the check explains "
              "the bytes that appear:",
              """
EX_B = FusedTraffic(chip="Ascend910B1", channels=64, size=56, batch=1, precision="fp16")
CONV_B = {level: EX_B.conv_alone(level) for level in (0, 1)}
print(EX_B.check({"level0": CONV_B[0] + 7 * ACT, "level1": CONV_B[1] + ACT}))
""")],
)
