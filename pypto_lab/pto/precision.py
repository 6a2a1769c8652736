"""``pypto.PrecisionType``: the precision mode the real framework's math ops take
(``pypto.exp(x, precision_type=pypto.PrecisionType.INTRINSIC)``; div, exp, log, sqrt, rsqrt,
reciprocal, pow at 883e7df: python/pypto/op/math.py). INTRINSIC uses the chip's instruction as
it is, HIGH_PRECISION a longer sequence with less rounding error.

In pypto_lab the choice is checked and recorded on the Tensor Graph node
(``attrs.precision_type``) when it differs from the op's default; the values are computed with
torch at the dtype's precision either way, and the timing is that of the instruction sequence of
the op, so both modes give the same numbers and cycles here (recorded, not modelled).
"""

from __future__ import annotations

import enum

from .errors import DTypeError


class PrecisionType(enum.IntEnum):
    INTRINSIC = 0
    HIGH_PRECISION = 1


def record(out, precision_type, default: PrecisionType, op: str):
    """Check ``precision_type`` and note it on ``out``'s node if it is not ``op``'s default."""
    if precision_type is None or precision_type is default:
        return out
    if not isinstance(precision_type, PrecisionType):
        raise DTypeError(f"pypto.{op}(..., precision_type={precision_type!r}): not a PrecisionType. Rule: "
                         "precision_type is pypto.PrecisionType.INTRINSIC or pypto.PrecisionType.HIGH_PRECISION. "
                         f"Fix: precision_type=pypto.PrecisionType.{default.name}")
    if getattr(out, "is_bound", False):
        out._node().attrs["precision_type"] = precision_type.name
    return out
