"""The teaching errors of the PyPTO workbench: one class per usual mistake (the real framework's FAQ).

Every message names the value, the rule it breaks and a fix. All derive from `PtoError`, a
`ValueError`, so ``except ValueError`` still catches them.
"""

from __future__ import annotations

from ..hw.tiling import TilingError


class PtoError(ValueError):
    """Base class of every pypto_lab.pto error."""


class NoNPUError(PtoError):
    """RunMode.NPU asked for on a machine without an NPU."""


class TileRankError(PtoError, TilingError):
    """The tile shape in force has another rank than the tensor an operation tiles."""


class TileAlignmentError(PtoError, TilingError):
    """The innermost tile dimension is not a whole number of 32-byte blocks (or a cube tile is
    not a multiple of the fractal)."""


class TileCapacityError(PtoError, TilingError):
    """The tiles of an operation group do not fit an on-chip buffer (UB, L1, L0A, L0B, L0C)."""


class TileShapeError(PtoError, TilingError):
    """Any other illegal tile shape (non-positive size, l1 not a multiple of l0, ...)."""


class NoTileShapeError(PtoError):
    """An operation is traced before any tile shape of its unit is set."""


class UnwrittenOutputError(PtoError):
    """An output tensor (or a region of it) is read before the kernel writes it."""


class BroadcastError(PtoError):
    """Operand shapes that do not broadcast (or a matmul whose inner dimensions disagree)."""


class ShapeError(PtoError):
    """A shape that does not fit: slice out of range, reshape of another size, argument shape
    different from its annotation."""


class DTypeError(PtoError):
    """A dtype the operation (or the chip) does not take, or operands of different dtypes."""


class OptionError(PtoError):
    """An unknown option key or value."""


class TraceError(PtoError):
    """Something the tracer cannot record (a Tensor annotation used as a value, a bad index)."""


__all__ = [
    "PtoError", "NoNPUError", "TileRankError", "TileAlignmentError", "TileCapacityError", "TileShapeError",
    "NoTileShapeError", "UnwrittenOutputError", "BroadcastError", "ShapeError", "DTypeError", "OptionError",
    "TraceError",
]
