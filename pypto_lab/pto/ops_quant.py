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

from . import ops as _ops
from .dtypes import DT_FP32, as_dtype
from .enums import CastMode, SaturationMode
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
    return cast(y, ot, CastMode.CAST_RINT, SaturationMode.ON)


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


# ---- matmul with a dequant / quant epilogue (matmul's extend_params scale / scale_tensor) ---------

def _fp19(v: float) -> float:
    """``v`` as the FixPipe reads a scale: 1 sign, 8 exponent and the top 10 mantissa bits."""
    import struct
    bits = struct.unpack("<I", struct.pack("<f", float(v)))[0] & ~((1 << 13) - 1)
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def matmul_with_epilogue(input, mat2, out_dtype, epilogue: dict, **kwargs):
    """``matmul(..., extend_params={'scale' | 'scale_tensor', 'relu_type'})`` of the docs (tables 4
    and 5): DT_INT8 x DT_INT8 -> DT_FP16 / DT_BF16 (dequantization) or any -> DT_INT8
    (quantization), the accumulator times the scale (a Python float, per tensor, read as the FixPipe
    does with a 10-bit mantissa; or ``scale_tensor``, one DT_FP32 value per output column -- the
    real API packs these as DT_UINT64, which pypto_lab has not -- used at full precision), an
    optional ReLU, then the cast.

    Cost: the Cube's matmul into DT_INT32 / DT_FP32, then the epilogue as recorded vector ops
    (VCONV, VMUL(S), VRELU, VCONV). On chips whose L0C drains through UB (Ascend910A / 310P) the
    Vector unit does do this; on the 910B family the FixPipe applies it on the way out of L0C, so
    there this overstates the cost by those vector instructions and a GM round trip."""
    from . import config
    from .dtypes import DT_INT32
    from .ops import matmul, relu
    from .tiling import suggest_vec_tile

    a, b = _tensor(input, "matmul"), _tensor(mat2, "matmul")
    od = as_dtype(out_dtype, "matmul out dtype") if out_dtype is not None else None
    dequant = a.dtype.lab == "int8" and od is not None and od.lab in ("fp16", "bf16")
    quant = od is not None and od.lab == "int8" and a.dtype.lab in ("fp16", "bf16", "fp32", "int8")
    if not (dequant or quant):
        raise DTypeError(f"matmul: extend_params scale / scale_tensor with inputs {a.dtype!r} and out_dtype {od!r}. "
                         "Rule: dequantization takes DT_INT8 inputs and gives DT_FP16 (or DT_BF16); quantization "
                         "gives DT_INT8 from DT_FP16, DT_BF16, DT_FP32 or DT_INT8 inputs. Fix: set out_dtype")
    if ("scale" in epilogue) == ("scale_tensor" in epilogue):
        raise ShapeError("matmul: give exactly one of extend_params 'scale' (per tensor) and 'scale_tensor' "
                         "(per output column)")
    acc = matmul(a, b, DT_INT32 if a.dtype.lab == "int8" else DT_FP32, **kwargs)
    saved = config.STATE.vec_tile
    if saved is None or len(saved) != acc.ndim:
        config.STATE.vec_tile = suggest_vec_tile(acc.shape, DT_FP32)
    try:
        y = cast(acc, DT_FP32)
        if "scale" in epilogue:
            y = mul(y, _fp19(epilogue["scale"]))
        else:
            s = _tensor(epilogue["scale_tensor"], "matmul scale_tensor")
            n = acc.shape[-1]
            if s.dtype is not DT_FP32 or s.shape[-1] != n or len(s.shape) > 2 or (len(s.shape) == 2 and s.shape[0] != 1):
                raise ShapeError(f"matmul: scale_tensor {s.dtype!r} of shape {s.shape}. Rule (pypto_lab): DT_FP32 of "
                                 f"shape [1, {n}] or [{n}], one scale per output column")
            y = mul(y, s)
        r = epilogue.get("relu_type")
        if r is not None and "NO_RELU" not in str(getattr(r, "name", r)).upper():
            y = relu(y)
        out = cast(y, od, CastMode.CAST_RINT, SaturationMode.ON)  # saturating, round half to even
    finally:
        config.STATE.vec_tile = saved
    return out


_ops.MATMUL_EPILOGUE[0] = matmul_with_epilogue

__all__ += ["matmul_with_epilogue"]
