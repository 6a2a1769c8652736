"""The precision policy of a training step: apex AMP's opt levels (O0, O1, O2) at fp16 or bf16.

A `Policy` says which dtype the Cube multiplies, which dtype Vector kernels keep in GM, which the
model's weights and gradients are held in, whether the optimizer keeps fp32 master weights and
whether the loss is scaled; `Policy.precision` is the same policy as the lowering table reads it
(`pypto_lab.lowering.precision.Precision`: the table lowers the joint graph's nodes with it as
`optimize` lowers a model's nodes with the run's precision).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lowering.precision import Precision

AMP_LEVELS = ("O0", "O1", "O2")
PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Policy:
    """Mixed precision of a training step (apex AMP's opt levels, as the seed's §4.2 uses them).

    * O0: everything fp32.
    * O1: the Cube ops (convolutions, matmuls) multiply in half; their fp32 inputs are cast to half
      and their outputs back to fp32 (Vector cast kernels); everything else stays fp32.
    * O2: the model is half (BatchNorm computes in fp32); the optimizer keeps fp32 master weights
      and writes the half copy back.
    fp16 scales the loss (dynamic loss scaling, an overflow check on the gradients each step);
    bf16 needs no scaling.
    """

    amp: str
    half: str   # "fp16" or "bf16" (unused at O0)

    @property
    def cube_dtype(self) -> str:
        return "fp32" if self.amp == "O0" else self.half

    @property
    def act_dtype(self) -> str:
        """What vector kernels keep in GM."""
        return self.half if self.amp == "O2" else "fp32"

    @property
    def cube_out_dtype(self) -> str:
        return self.half if self.amp == "O2" else ("fp32" if self.amp == "O0" else self.half)

    @property
    def param_dtype(self) -> str:
        return self.half if self.amp == "O2" else "fp32"

    @property
    def master_weights(self) -> bool:
        return self.amp == "O2"

    @property
    def loss_scaling(self) -> bool:
        return self.amp != "O0" and self.half == "fp16"

    @property
    def casts_around_cube(self) -> bool:
        return self.amp == "O1"

    @property
    def precision(self) -> Precision:
        """The policy as the lowering table reads it: statistics (softmax, norms, BatchNorm, sums and
        their gradients) always computed in fp32, O1's casts around the Cube ops."""
        return Precision(self.cube_dtype, self.act_dtype, self.cube_out_dtype, "fp32", self.casts_around_cube,
                         self.half if self.amp != "O0" else "fp32")


def policy_of(precision: str, amp: str | None) -> Policy:
    """The policy for ``precision`` (fp32 / fp16 / bf16) and ``amp`` (None, "O0", "O1", "O2").
    ``amp=None`` means O2 for a half precision (the seed's choice) and O0 for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}: training runs in one of {', '.join(PRECISIONS)}. "
                         "Fix: precision='fp16'")
    if amp is not None and amp not in AMP_LEVELS:
        raise ValueError(f"amp = {amp!r}: an apex opt level, one of {', '.join(AMP_LEVELS)} (or None). "
                         "Fix: amp='O2' (the seed's §4.2) or amp='O1'")
    if precision == "fp32":
        if amp not in (None, "O0"):
            raise ValueError(f"amp = {amp!r} with precision='fp32': O1 and O2 train in half precision. Fix: "
                             "precision='fp16' (or 'bf16') with amp, or amp=None for fp32")
        return Policy("O0", "fp16")
    return Policy("O2" if amp is None else amp, precision)


BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
