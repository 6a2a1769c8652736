"""Element-wise math of the PyPTO API beyond the first set: trigonometric and hyperbolic functions,
exp2 / log2 / log10 / log1p / cbrt, sign / signbit / isnan / isfinite, lrelu, hypot / atan2,
fmod / remainder / floor_div / ceil_div, the bitwise ops, gcd, clone, axpy_ (signatures of
docs/zh/api/operation).

Each records one ``math`` node (an element-wise kind: the Tile Graph fuses it with its
neighbours). `instructions` gives the Vector instructions it issues, each with its timing key in
the chip's table. The chip has no instruction for most of these functions; they are modelled as
the usual vector compositions, named per function below (range reduction + Horner polynomials
for sin / cos, exp / ln identities, a rational polynomial for atan / asin / acos, binary GCD).
Numerics: computed in fp32 and rounded once to the dtype (the chip's polynomials are not
modelled bit for bit); integer ops are exact.
"""

from __future__ import annotations

import torch

from .dtypes import DT_BOOL
from .errors import DTypeError
from .ops import _nary, _tensor, assemble
from .tensor import current_trace

_FLOAT = ("fp16", "bf16", "fp32")
_INT = ("int8", "int16", "int32")

# ---- instruction compositions (instruction names; keys are filled per dtype) -------------------
_HORNER4 = ("VMUL", "VADDS") * 4
_REDUCE_PI = ("VMULS", ("VCONV", "{D}_INT32"), ("VCONV", "INT32_{D}"), "VMULS", "VSUB")  # x - round(x/pi)*pi
_SIN = _REDUCE_PI + ("VMUL",) + _HORNER4 + ("VMUL", "VMUL")                            # poly in x^2, sign
_ATAN = ("VABS", "VREC", "VMIN", "VMUL") + _HORNER4 + ("VMUL", ("VCMPVS", "{D}_{D}_{D}"), "VSEL", "VMULS", "VADDS")
_XOR = (("VOR", "UINT16_UINT16_UINT16"), ("VAND", "UINT16_UINT16_UINT16"), ("VNOT", "UINT16_UINT16"),
        ("VAND", "UINT16_UINT16_UINT16"))
_TO_F = (("VCONV", "INT32_FP32"),)
_TO_I = (("VCONV", "FP32_INT32"),)

INSTRS = {
    "sin": _SIN, "cos": ("VADDS",) + _SIN, "tan": _SIN + ("VADDS",) + _SIN + ("VDIV",),
    "tanh": ("VMULS", "VEXP", "VADDS", "VMULS", "VADDS", "VDIV"),            # (1 - e^-2x) / (1 + e^-2x)
    "sinh": ("VEXP", "VREC", "VSUB", "VMULS"), "cosh": ("VEXP", "VREC", "VADD", "VMULS"),
    "atan": _ATAN, "asin": ("VMUL", "VMULS", "VADDS", "VSQRT", "VDIV") + _ATAN,   # atan(x / sqrt(1 - x^2))
    "acos": ("VMUL", "VMULS", "VADDS", "VSQRT", "VDIV") + _ATAN + ("VMULS", "VADDS"),
    "asinh": ("VMUL", "VADDS", "VSQRT", "VADD", "VLN"), "acosh": ("VMUL", "VADDS", "VSQRT", "VADD", "VLN"),
    "atanh": ("VADDS", "VMULS", "VADDS", "VDIV", "VLN", "VMULS"),
    "exp2": ("VMULS", "VEXP"), "log2": ("VLN", "VMULS"), "log10": ("VLN", "VMULS"), "log1p": ("VADDS", "VLN"),
    "cbrt": ("VABS", "VLN", "VMULS", "VEXP", ("VCMPVS", "{D}_{D}_{D}"), "VMULS", "VSEL"),
    "sign": (("VCMPVS", "{D}_{D}_{D}"), "VSEL", ("VCMPVS", "{D}_{D}_{D}"), "VSEL"),
    "isnan": (("VCMPV", "{D}_{D}_{D}"),), "isfinite": ("VABS", ("VCMPVS", "{D}_{D}_{D}")),
    "signbit": (("VSHR", "{I}_{I}"),),
    "lrelu": (("VLRELU", "{D}_{D}_{D}"),),
    "hypot": ("VMUL", "VMUL", "VADD", "VSQRT"),
    "atan2": ("VDIV",) + _ATAN + (("VCMPVS", "{D}_{D}_{D}"), "VADDS", "VSEL"),
    "fmod": ("VDIV", ("VCONV", "{D}_INT32"), ("VCONV", "INT32_{D}"), "VMUL", "VSUB"),
    "remainder": ("VDIV", ("VCONV", "{D}_INT32"), ("VCONV", "INT32_{D}"), "VMUL", "VSUB"),
    "floor_div": ("VDIV", ("VCONV", "{D}_INT32"), ("VCONV", "INT32_{D}")),
    "bitwise_and": (("VAND", "UINT16_UINT16_UINT16"),), "bitwise_or": (("VOR", "UINT16_UINT16_UINT16"),),
    "bitwise_xor": _XOR, "bitwise_not": (("VNOT", "UINT16_UINT16"),),
    "bitwise_left_shift": (("VSHL", "{I}_{I}"),), "bitwise_right_shift": (("VSHR", "{I}_{I}"),),
    "clone": (("VCOPY", "{C}"),), "fillpad": (("VCOPY", "{C}"),), "axpy": (("VAXPY", "{D}_{D}_{D}"),),
    "tril": (("VCMPVS", "{D}_{D}_{D}"), "VSEL"), "triu": (("VCMPVS", "{D}_{D}_{D}"), "VSEL"),  # mask, select
    "prelu": (("VCMPVS", "{D}_{D}_{D}"), "VMUL", "VSEL"),
}
# integer division-like ops go through fp32 on the Vector unit (no integer divide)
_INT_VIA_FLOAT = {
    "fmod": _TO_F * 2 + ("VDIV", ("VCONV", "FP32_INT32"), ("VCONV", "INT32_FP32"), "VMUL", "VSUB") + _TO_I,
    "remainder": _TO_F * 2 + ("VDIV", ("VCONV", "FP32_INT32"), ("VCONV", "INT32_FP32"), "VMUL", "VSUB") + _TO_I,
    "floor_div": _TO_F * 2 + ("VDIV",) + _TO_I, "ceil_div": _TO_F * 2 + ("VDIV",) + _TO_I,
}
# binary GCD of 32-bit integers: at most 64 steps of shift / compare / subtract
_GCD = (("VAND", "UINT16_UINT16_UINT16"), ("VSHR", "INT32_INT32"), "VMIN", "VMAX", "VSUB",
        ("VCMPVS", "INT32_INT32_INT32"), "VSEL") * 64


def instructions(n, nodes) -> list[tuple[str, str]]:
    """The (instruction, timing key) list of a ``math`` node, for its input dtype."""
    fn = n.attrs["fn"]
    dt = nodes[n.inputs[0]].dtype
    d = dt.lab.upper()
    ikey = "INT32" if dt.bytes >= 4 else "INT16"
    ckey = "UINT32_UINT32" if dt.bytes >= 4 else "UINT16_UINT16"
    if fn == "gcd":
        seq = _GCD
    elif dt.lab in _INT and fn in _INT_VIA_FLOAT:
        seq = _INT_VIA_FLOAT[fn]
        d = "FP32"
    else:
        seq = INSTRS[fn]
    out = []
    for item in seq:
        instr, key = item if isinstance(item, tuple) else (item, None)
        if key is None:
            key = f"{d}_{d}" if instr in ("VABS", "VEXP", "VLN", "VSQRT", "VREC", "VRSQRT") else f"{d}_{d}_{d}"
        out.append((instr, key.format(D=d, I=ikey, C=ckey)))
    return out


# ---- numerics ---------------------------------------------------------------------------------

_TORCH = {
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh, "sinh": torch.sinh,
    "cosh": torch.cosh, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "asinh": torch.asinh,
    "acosh": torch.acosh, "atanh": torch.atanh, "exp2": torch.exp2, "log2": torch.log2, "log10": torch.log10,
    "log1p": torch.log1p, "sign": torch.sign, "hypot": torch.hypot, "atan2": torch.atan2,
    "isnan": torch.isnan, "isfinite": torch.isfinite, "signbit": torch.signbit,
}


def compute(n, ins) -> torch.Tensor:
    fn, a = n.attrs["fn"], n.attrs
    dt = n.dtype
    xs = list(ins)
    if "scalar" in a:
        xs.append(torch.tensor(a["scalar"], dtype=torch.float64))
    fl = ins[0].dtype.is_floating_point
    if fn in ("isnan", "isfinite", "signbit"):
        return _TORCH[fn](ins[0])
    if fn == "clone":
        return ins[0].clone()
    if fn == "fillpad":   # the valid part (what the input holds), the rest of the shape filled
        out = torch.full(n.shape, a["value"], dtype=torch.float64).to(ins[0].dtype)
        out[tuple(slice(0, s) for s in ins[0].shape)] = ins[0]
        return out
    if fn in ("tril", "triu"):
        return getattr(torch, fn)(ins[0], int(a["scalar"]))
    if fl:
        f = [x.float() if x.is_floating_point() else x.to(torch.float32) for x in xs]
        if fn in _TORCH:
            r = _TORCH[fn](*f)
        elif fn == "cbrt":
            r = torch.sign(f[0]) * torch.abs(f[0]).pow(1.0 / 3.0)
        elif fn == "lrelu":
            r = torch.where(f[0] >= 0, f[0], f[0] * f[1])
        elif fn == "fmod":
            r = torch.fmod(f[0], f[1])
        elif fn == "remainder":
            r = torch.remainder(f[0], f[1])
        elif fn == "floor_div":
            r = torch.floor(f[0] / f[1])
        elif fn == "axpy":
            r = f[0] + f[1] * f[2]
        elif fn == "prelu":
            r = torch.where(f[0] >= 0, f[0], f[0] * f[1])
        else:
            raise NotImplementedError(fn)
        return r.to(dt.torch)
    x = [t.long() for t in xs]
    if fn == "bitwise_and":
        r = x[0] & x[1]
    elif fn == "bitwise_or":
        r = x[0] | x[1]
    elif fn == "bitwise_xor":
        r = x[0] ^ x[1]
    elif fn == "bitwise_not":
        r = ~x[0]
    elif fn == "bitwise_left_shift":
        r = x[0] << x[1]
    elif fn == "bitwise_right_shift":
        r = x[0] >> x[1]
    elif fn == "gcd":
        r = torch.gcd(x[0], x[1])
    elif fn == "sign":
        r = torch.sign(x[0])
    elif fn == "fmod":
        r = torch.fmod(x[0], x[1])
    elif fn == "remainder":
        r = torch.remainder(x[0], x[1])
    elif fn == "floor_div":
        r = torch.div(x[0], x[1], rounding_mode="floor")
    elif fn == "ceil_div":
        r = -torch.div(-x[0], x[1], rounding_mode="floor")
    elif fn == "axpy":
        r = x[0] + x[1] * x[2]
    else:
        raise NotImplementedError(fn)
    return r.to(dt.torch)


# ---- the API ----------------------------------------------------------------------------------

def _math(fn, tensors, allowed, scalar=None, out_dtype=None):
    current_trace(f"pypto.{fn}")
    ts = [_tensor(t, fn) for t in tensors]
    for t in ts:
        if t.dtype.lab not in allowed:
            names = ", ".join("DT_" + a.upper() for a in allowed)
            raise DTypeError(f"{fn}: operand dtype {t.dtype!r}. Rule: {fn} takes {names}. "
                             "Fix: pypto.cast the operand to one of them first")
    attrs = {"fn": fn}
    if scalar is not None:
        attrs["scalar"] = float(scalar)
    return _nary("math", ts, out_dtype or ts[0].dtype, attrs)


def _unary_float(fn):
    def op(input, precision_type=None):
        return _math(fn, [input], _FLOAT)
    op.__name__ = fn
    op.__doc__ = f"torch.{fn} element-wise (DT_FP16, DT_BF16, DT_FP32); Vector instructions: ops_math.INSTRS[{fn!r}]."
    return op


sin, cos, tan, tanh, sinh, cosh = (_unary_float(f) for f in ("sin", "cos", "tan", "tanh", "sinh", "cosh"))
asin, acos, atan, asinh, acosh, atanh = (_unary_float(f) for f in ("asin", "acos", "atan", "asinh", "acosh", "atanh"))
exp2, log2, log10, log1p, cbrt = (_unary_float(f) for f in ("exp2", "log2", "log10", "log1p", "cbrt"))


def sign(input):
    """-1, 0 or 1 per element, in input's dtype (floats, DT_INT16, DT_INT32)."""
    return _math("sign", [input], _FLOAT + ("int16", "int32"))


def isnan(input):
    """DT_BOOL: true where input is NaN (VCMPV of x with itself)."""
    return _math("isnan", [input], _FLOAT, out_dtype=DT_BOOL)


def isfinite(input):
    """DT_BOOL: true where input is neither inf nor NaN."""
    return _math("isfinite", [input], _FLOAT, out_dtype=DT_BOOL)


def signbit(input):
    """DT_BOOL: true where the sign bit is set (also -0.0), a shift of the sign bit (VSHR)."""
    return _math("signbit", [input], _FLOAT + ("int16", "int32"), out_dtype=DT_BOOL)


def lrelu(input, negative_slope=0.01):
    """``x`` where ``x >= 0``, else ``negative_slope * x`` (VLRELU)."""
    return _math("lrelu", [input], _FLOAT, scalar=float(getattr(negative_slope, "value", negative_slope)))


def hypot(input, other):
    """``sqrt(input ** 2 + other ** 2)`` (shapes broadcast)."""
    return _math("hypot", [input, other], _FLOAT)


def atan2(y, x):
    """The angle of (x, y) in (-pi, pi] (shapes broadcast)."""
    return _math("atan2", [y, x], _FLOAT)


def _int_or_tensor(fn, input, other, allowed):
    if isinstance(other, (int, float)) and not isinstance(input, (int, float)):
        return _math(fn, [input], allowed, scalar=other)
    if isinstance(input, (int, float)):
        other_t = _tensor(other, fn)
        from .ops import full
        input = full(list(other_t.shape), input, other_t.dtype)
    return _math(fn, [input, other], allowed)


def fmod(input, other, precision_type=None):
    """C fmod: the remainder with the sign of input (``input - trunc(input / other) * other``)."""
    return _int_or_tensor("fmod", input, other, _FLOAT + ("int16", "int32"))


def remainder(input, other, precision_type=None):
    """Python modulo: the remainder with the sign of other (``input - floor(input / other) * other``)."""
    return _int_or_tensor("remainder", input, other, _FLOAT + ("int16", "int32"))


def floor_div(input, other):
    """``floor(input / other)`` in input's dtype."""
    return _int_or_tensor("floor_div", input, other, _FLOAT + ("int16", "int32"))


def ceil_div(self, other):
    """``ceil(self / other)`` for integers."""
    return _int_or_tensor("ceil_div", self, other, ("int16", "int32"))


def bitwise_and(input, other):
    return _int_or_tensor("bitwise_and", input, other, _INT)


def bitwise_or(input, other):
    return _int_or_tensor("bitwise_or", input, other, _INT)


def bitwise_xor(input, other):
    """Bitwise xor: VOR, VAND, VNOT, VAND (the table has no VXOR)."""
    return _int_or_tensor("bitwise_xor", input, other, _INT)


def bitwise_not(input):
    return _math("bitwise_not", [input], _INT)


def bitwise_left_shift(input, other):
    return _int_or_tensor("bitwise_left_shift", input, other, ("int16", "int32"))


def bitwise_right_shift(input, other):
    """Arithmetic shift right (the sign is kept for signed dtypes)."""
    return _int_or_tensor("bitwise_right_shift", input, other, ("int16", "int32"))


def gcd(input, other):
    """Greatest common divisor of integers (binary GCD on the Vector unit)."""
    return _int_or_tensor("gcd", input, other, ("int16", "int32"))


def clone(input):
    """A copy of ``input`` (VCOPY)."""
    return _math("clone", [input], _FLOAT + _INT + ("bool", "uint8", "int64"))


def fillpad(input, mode: str = "constant", value=0):
    """``input`` at its full shape, the part beyond its valid shape (a view's or reshape's
    ``valid_shape``, known when the kernel runs) set to ``value`` (docs/zh/api/operation/pypto-fillpad.md:
    1-2-D, the 'constant' mode only, the value converted to the input's dtype; a copy, VCOPY)."""
    from .errors import NotModelledError, ShapeError

    x = _tensor(input, "fillpad")
    if mode != "constant":
        raise NotModelledError(f"fillpad(mode={mode!r}): the real API supports only 'constant' padding. "
                               "Fix: mode='constant'")
    if not 1 <= x.ndim <= 2:
        raise ShapeError(f"fillpad: input of rank {x.ndim} (shape {x.shape}). Rule: 1-D or 2-D inputs. Fix: "
                         "pypto.reshape to 2-D first")
    v = float(value) if isinstance(value, str) else value   # the docs' example passes "-inf"
    t = _math("fillpad", [x], _FLOAT + _INT + ("uint8", "uint16", "uint32"))
    t._node().attrs["value"] = float(v) if x.dtype.lab in _FLOAT else int(v)
    return t


def axpy_(y, x, alpha=1.0):
    """In place ``y += alpha * x`` (VAXPY); returns y. If y is a kernel argument it is updated."""
    y_t, x_t = _tensor(y, "axpy_"), _tensor(x, "axpy_")
    r = _math("axpy", [y_t, x_t], _FLOAT + ("int16", "int32"), scalar=alpha)
    tr = current_trace("pypto.axpy_")
    reg = tr.gm_region(y_t._id)
    if reg is not None and list(r.shape) == list(y_t.shape):
        # an in-place update reads the values y had before the call: not a read of an unwritten output
        tr.events = [e for e in tr.events if not (e[0] == "r" and e[1] == reg[0] and e[4] == r._id)]
        assemble(r, [0] * y_t.ndim, y_t)
    return r


__all__ = ["sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "exp2",
           "log2", "log10", "log1p", "cbrt", "sign", "isnan", "isfinite", "signbit", "lrelu", "hypot", "atan2", "fmod",
           "remainder", "floor_div", "ceil_div", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
           "bitwise_left_shift", "bitwise_right_shift", "gcd", "clone", "axpy_"]
