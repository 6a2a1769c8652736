"""Shape and mask ops of the PyPTO API built from recorded ops: ``unsqueeze``, ``permute``,
``tril`` / ``triu``, ``pad``, ``one_hot``, ``prelu`` (signatures of docs/zh/api/operation).

unsqueeze is a reshape (no data movement); permute a transpose; tril / triu and prelu are
``math`` nodes (a compare and a select on the Vector unit, ops_math.INSTRS); pad writes the input
and the padding (VECTORDUP) into a new GM tensor; one_hot compares the indices with an arange
(VCMPV) and casts the mask to DT_INT64 (VCONV)."""

from __future__ import annotations

from . import config
from .dtypes import DT_INT64
from .errors import DTypeError, ShapeError, TraceError
from .ops import _tensor, arange, assemble, cast, eq, full, reshape, tensor, transpose
from .ops_math import _math

_FLOAT = ("fp16", "bf16", "fp32")


def unsqueeze(input, dim: int):
    """``input`` with a new axis of size 1 at ``dim`` (-rank-1 <= dim <= rank)."""
    x = _tensor(input, "unsqueeze")
    d = int(dim)
    if not -x.ndim - 1 <= d <= x.ndim:
        raise ShapeError(f"unsqueeze: dim={dim} for a rank-{x.ndim} tensor. Rule: -{x.ndim + 1} <= dim <= {x.ndim}")
    d = d % (x.ndim + 1)
    return reshape(x, list(x.shape[:d]) + [1] + list(x.shape[d:]))


def permute(input, perm):
    """The axes of ``input`` in the order ``perm`` (a permutation of all of them)."""
    return transpose(input, list(perm))


def _tri(fn, input, diagonal):
    x = _tensor(input, fn)
    if x.ndim < 2:
        raise ShapeError(f"{fn}: input of shape {x.shape}. Rule: the input has at least 2 dimensions (a matrix)")
    t = _math(fn, [x], _FLOAT + ("int8", "int16", "int32"), scalar=int(diagonal))
    return t


def tril(input, diagonal=0):
    """The lower triangle (``col - row <= diagonal``) of the last two axes; zeros elsewhere."""
    return _tri("tril", input, diagonal)


def triu(input, diagonal=0):
    """The upper triangle (``col - row >= diagonal``) of the last two axes; zeros elsewhere."""
    return _tri("triu", input, diagonal)


def prelu(input, weight):
    """``x`` where ``x >= 0`` else ``weight * x``; ``weight`` has one value per channel (axis 1; a
    1-D input's only axis) or a single value."""
    x, w = _tensor(input, "prelu"), _tensor(weight, "prelu")
    if w.ndim != 1:
        raise ShapeError(f"prelu: weight of shape {w.shape}. Rule: weight is 1-D: [C] or [1]")
    c = x.shape[1] if x.ndim >= 2 else x.shape[0]
    if w.shape[0] not in (1, c):
        raise ShapeError(f"prelu: weight of {w.shape[0]} values for an input of {c} channels (shape {x.shape}). "
                         f"Rule: weight has 1 or C = {c} values")
    if x.ndim >= 2:
        w = reshape(w, [1, w.shape[0]] + [1] * (x.ndim - 2))
    return _math("prelu", [x, w], _FLOAT)


def pad(input, pad, mode: str = "constant", value=0):
    """``input`` padded with ``value`` on the right of the last axis and the bottom of the one
    before it: ``pad = (0, right)`` or ``(0, right, 0, bottom)`` (the real API supports only those)."""
    x = _tensor(input, "pad")
    if mode != "constant":
        raise TraceError(f"pad: mode={mode!r}. Rule: only 'constant' padding is supported")
    p = [int(v) for v in pad]
    if len(p) not in (2, 4) or p[0::2] != [0] * (len(p) // 2) or any(v < 0 for v in p) or len(p) // 2 > x.ndim:
        raise ShapeError(f"pad: pad={list(pad)}. Rule: (0, right) or (0, right, 0, bottom): right / bottom padding "
                         "of the last two axes only, non-negative")
    right, bottom = p[1], (p[3] if len(p) == 4 else 0)
    shape = list(x.shape)
    shape[-1] += right
    if bottom:
        shape[-2] += bottom
    out = tensor(shape, x.dtype, "pad")
    assemble(x, [0] * x.ndim, out)
    if right:
        assemble(full(list(x.shape[:-1]) + [right], value, x.dtype), [0] * (x.ndim - 1) + [x.shape[-1]], out)
    if bottom:
        rows = list(shape)
        rows[-2] = bottom
        assemble(full(rows, value, x.dtype), [0] * (x.ndim - 2) + [x.shape[-2], 0], out)
    return out


def one_hot(input, num_classes: int):
    """DT_INT64 tensor of shape ``input.shape + [num_classes]``: 1 at each index, 0 elsewhere."""
    x = _tensor(input, "one_hot")
    if x.dtype.lab not in ("int32", "int16"):
        raise DTypeError(f"one_hot: input dtype {x.dtype!r}. Rule: the indices are DT_INT32 or DT_INT16. "
                         "Fix: pypto.cast(input, pypto.DT_INT32)")
    n = int(num_classes)
    if n < 1:
        raise ShapeError(f"one_hot: num_classes={num_classes}. Rule: num_classes >= 1")
    saved = config.STATE.vec_tile
    config.STATE.vec_tile = (-(-n // 8) * 8,)  # the class ids are one 1-D tile of whole 32-byte blocks
    try:
        classes = arange(n)
        if x.dtype is not classes.dtype:
            classes = cast(classes, x.dtype)
    finally:
        config.STATE.vec_tile = saved
    return cast(eq(reshape(x, list(x.shape) + [1]), classes), DT_INT64)


__all__ = ["unsqueeze", "permute", "tril", "triu", "prelu", "pad", "one_hot"]
