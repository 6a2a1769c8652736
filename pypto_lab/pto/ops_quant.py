"""Quantization ops of the PyPTO API: ``quantize`` (DT_FP32 -> DT_INT8 symmetric, DT_UINT8
asymmetric) and ``dequantize`` (DT_INT8 / DT_INT16 -> DT_FP32), per row (``axis=-1``) or per
column (``axis=-2``) scales, signatures of docs/zh/api/operation.

Both are compositions of recorded vector ops (VMUL with the scale spread over the row, VADD /
VSUB of the zero points, VCONV), so the Tile Graph fuses them and their cost is those
instructions'. The docs' formula for asymmetric quantize reads ``round(x * scale + zero_points)``
but their worked example (x = 1.1, scale = 1, zero_points = -5 gives 6) computes
``round(x * scale - zero_points)``; this follows the example, and ``dequantize`` its inverse
form ``(x + zero_points) * scale`` as documented.
"""

from __future__ import annotations

from .dtypes import DT_FP32, as_dtype
from .errors import DTypeError, ShapeError
from .ops import _tensor, add, cast, mul, reshape, sub


def _scale_view(op, x, t, axis, what):
    """``t`` (shape of x without the quantized axis) reshaped to broadcast against ``x``."""
    t = _tensor(t, op)
    if t.dtype is not DT_FP32:
        raise DTypeError(f"{op}: {what} dtype {t.dtype!r}. Rule: {what} is DT_FP32. Fix: pypto.cast({what}, "
                         "pypto.DT_FP32)")
    ax = axis % x.ndim
    want = list(x.shape[:ax]) + list(x.shape[ax + 1:])
    if list(t.shape) != want:
        raise ShapeError(f"{op}: {what} of shape {t.shape} for input {x.shape} with axis={axis}. Rule: {what} has the "
                         f"shape of input without axis {axis}: {want}")
    shape = list(x.shape)
    shape[ax] = 1
    return reshape(t, shape)


def _axis(op, x, axis):
    if axis not in (-1, -2, x.ndim - 1, x.ndim - 2) or (x.ndim == 1 and axis not in (-1, 0)):
        raise ShapeError(f"{op}: axis={axis} for a rank-{x.ndim} input. Rule: axis is one of the last two axes "
                         "(-1 or -2; -1 for a 1-D input)")
    return axis % x.ndim


def quantize(input, scale, otype, axis: int = -1, zero_points=None):
    """``round(input * scale)`` as DT_INT8, or ``round(input * scale - zero_points)`` as DT_UINT8
    (asymmetric, see the module note); saturating, round half to even."""
    x = _tensor(input, "quantize")
    if x.dtype is not DT_FP32:
        raise DTypeError(f"quantize: input dtype {x.dtype!r}. Rule: quantize takes DT_FP32. "
                         "Fix: pypto.cast(input, pypto.DT_FP32) first")
    ot = as_dtype(otype, "quantize otype")
    if ot.lab not in ("int8", "uint8"):
        raise DTypeError(f"quantize: otype {ot!r}. Rule: DT_INT8 (symmetric) or DT_UINT8 (asymmetric)")
    if ot.lab == "uint8" and zero_points is None:
        raise ShapeError("quantize: otype DT_UINT8 is asymmetric quantization and needs zero_points. "
                         "Fix: pass zero_points (shape of input without axis), or otype=pypto.DT_INT8")
    ax = _axis("quantize", x, axis)
    y = mul(x, _scale_view("quantize", x, scale, ax, "scale"))
    if zero_points is not None:
        y = sub(y, _scale_view("quantize", x, zero_points, ax, "zero_points"))
    return cast(y, ot)


def dequantize(input, scale, otype=DT_FP32, axis: int = -1, zero_points=None):
    """``(float(input) + zero_points) * scale`` as DT_FP32."""
    x = _tensor(input, "dequantize")
    if x.dtype.lab not in ("int8", "int16"):
        raise DTypeError(f"dequantize: input dtype {x.dtype!r}. Rule: dequantize takes DT_INT8 or DT_INT16")
    ot = as_dtype(otype, "dequantize otype")
    if ot is not DT_FP32:
        raise DTypeError(f"dequantize: otype {ot!r}. Rule: otype is DT_FP32")
    ax = _axis("dequantize", x, axis)
    y = cast(x, DT_FP32)
    if zero_points is not None:
        y = add(y, _scale_view("dequantize", x, zero_points, ax, "zero_points"))
    return mul(y, _scale_view("dequantize", x, scale, ax, "scale"))


__all__ = ["quantize", "dequantize"]
