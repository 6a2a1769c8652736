"""The teaching errors of the PyPTO workbench: one class per usual mistake (the real framework's FAQ).

Every message names the value, the rule it breaks and a fix. All derive from `PtoError`, a
`ValueError`, so ``except ValueError`` still catches them. Mistakes that may be intended are
warnings instead (`PtoWarning`, a `UserWarning`).
"""

from __future__ import annotations

from ..hw.tiling import TilingError


class PtoError(ValueError):
    """Base class of every pypto_lab.pto error."""


class NoNPUError(PtoError):
    """RunMode.NPU asked for on a machine without an NPU."""


class TileRankError(PtoError, TilingError):
    """The vector tile shape in force has fewer sizes than the tensor an operation tiles has
    dimensions (or the operation is on a rank-0 element). A longer tile shape is legal: size i tiles
    axis i and the rest are ignored, as in the real framework."""


class TileAlignmentError(PtoError, TilingError):
    """A cube tile size is not a multiple of the fractal side. (A vector tile whose innermost
    dimension is not a whole number of 32-byte blocks is legal: it is padded in UB.)"""


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


class IndexBoundsError(PtoError, IndexError):
    """An index tensor holds a value outside the dimension it indexes (gather, scatter,
    index_select, ...): found when the kernel runs, since index values exist only then."""


class FormatError(PtoError):
    """A tensor argument's storage format (ND / FRACTAL_NZ) does not match its annotation, or is one
    pypto_lab does not model."""


class OptionError(PtoError):
    """An unknown option key or value."""


class SemanticLabelError(OptionError):
    """A semantic label (``pypto.set_semantic_label``) that is not a str or has the reserved form
    ``func<magic>_<order>``."""


class NotModelledError(PtoError, NotImplementedError):
    """A name of the real API that pypto_lab accepts but does not model (an experimental op of the
    real framework whose numerics or hardware path the lab has not built yet)."""


class TraceError(PtoError):
    """Something the tracer cannot record (a Tensor annotation used as a value, a bad index)."""


class ScalarReadError(TraceError):
    """A traced tensor used as a Python value (``float(x[0, 0])``, ``int(t)``, ``t.item()``,
    ``if x[0, 0] > 0:``): while tracing it holds no data yet."""


class LoopError(PtoError):
    """Loop bounds ``pypto.loop`` / ``loop_unroll`` cannot iterate (a step of 0, a bound that is
    not a whole number, an unbound dynamic dimension)."""


class SymbolicIndexError(PtoError, IndexError):
    """A symbolic offset or index (a loop index, a value read from a block table) that is out of
    range for its tensor when the kernel runs."""


class PtoWarning(UserWarning):
    """Base class of pypto_lab.pto's warnings: likely mistakes that may also be intended."""


class InPlaceUpdateWarning(PtoWarning):
    """A kernel argument read before the kernel writes it: an in-place update (legal), or an output
    allocated uninitialised whose garbage is read."""


class ViewBeyondTensorWarning(PtoWarning):
    """A view whose window reaches past the end of its tensor: the part outside holds no data."""


class UnwrittenOutputWarning(PtoWarning):
    """A kernel argument that the kernel never writes (nor reads), or an output it writes only in
    part: what is not written keeps the values it had before the call."""


__all__ = [
    "PtoError", "NoNPUError", "TileRankError", "TileAlignmentError", "TileCapacityError", "TileShapeError",
    "NoTileShapeError", "UnwrittenOutputError", "BroadcastError", "ShapeError", "DTypeError", "OptionError",
    "SemanticLabelError", "NotModelledError", "TraceError", "ScalarReadError", "LoopError", "SymbolicIndexError", "IndexBoundsError",
    "PtoWarning", "UnwrittenOutputWarning",
]
