"""The precision a lowering is for: which dtype each kind of kernel multiplies, keeps in GM and
computes in. One description for every front end: `optimize` makes it from the run's precision
and the chip (`Precision.of_run`), a training step from its AMP policy
(`pypto_lab.train.policy.Policy.precision`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hw.chip import Chip


@dataclass(frozen=True)
class Precision:
    """``cube``: what the Cube multiplies; ``cube_out``: what a Cube kernel writes to GM; ``vector``:
    what Vector kernels keep in GM and compute in; ``stats``: what the operators the table marks
    ``fp32`` (softmax, norms, sums and their gradients) compute in; ``casts_around_cube``: a Cube
    op's fp32 inputs are cast to ``cube`` before it and its output back to fp32 after it (apex
    AMP O1); ``name``: the precision a user asked for ("fp16", "int8", ...), for rules that report it."""

    cube: str
    vector: str
    cube_out: str = ""
    stats: str = ""
    casts_around_cube: bool = False
    name: str = ""

    def __post_init__(self):
        if not self.cube_out:
            object.__setattr__(self, "cube_out", self.cube)
        if not self.stats:
            object.__setattr__(self, "stats", self.vector)
        if not self.name:
            object.__setattr__(self, "name", self.cube)

    @classmethod
    def of_run(cls, chip: Chip, precision: str) -> Precision:
        """An inference run's precision before any precision pass: the Cube multiplies ``precision``
        where the chip has it, fp16 otherwise (int8 starts as fp16: `quantize_int8` turns the Cube
        kernels to int8); Vector kernels keep fp16, bf16 or fp32 in GM and compute in it (the
        `mixed_precision` pass then widens softmax, norms and sums to fp32)."""
        cube = precision if precision != "int8" and chip.cube.supports(precision) else "fp16"
        vector = precision if precision in ("fp16", "bf16", "fp32") else "fp16"
        return cls(cube, vector, name=precision)


def as_precision(chip: Chip, precision: str | Precision) -> Precision:
    """``precision`` itself, or the run's `Precision` for a precision name."""
    return precision if isinstance(precision, Precision) else Precision.of_run(chip, precision)


__all__ = ["Precision", "as_precision"]
