"""What the Ascend Cube unit computes, with its numerics, reproduced on the CPU with torch.

Use it to see how much a model's results move when its matmuls and convolutions run on the
Cube instead of in float64: storage rounding of the inputs, fp32 (or int32) accumulation, and
the rounding of the result on its way out of L0C.

Numerics rules, from the Ascend C programming guide (CANN 8.x: Mmad, Fixpipe and Cast pages):

* fp16 and bf16 inputs are multiplied and accumulated in fp32 in L0C (``Mmad``: half x half
  -> float; bfloat16 x bfloat16 -> float). Here the inputs are rounded to their storage format
  (round to nearest, ties to even), upcast to fp32 and multiplied with a float32
  ``torch.matmul``. A product of two fp16 (or bf16) values has at most 22 (16) significant bits,
  so it is exact in fp32: the only rounding left is that of the fp32 additions, as in L0C.
* fp32 inputs (Cube of AIC-C-220 chips such as the 910B) stay plain IEEE fp32. CANN may run
  fp32 matmuls in HF32 (inputs truncated to a shorter mantissa) when the framework allows it;
  that mode is not modelled.
* int8 x int8 is accumulated in int32 (``Mmad``: int8 x int8 -> int32), exactly. Results that do
  not fit in int32 raise `NumericsError` instead of wrapping silently.
* The result leaves L0C as fp32, or rounded to fp16/bf16 (FixPipe, or the Vector unit on chips
  without FixPipe) when ``out_dtype`` asks for it; int32 accumulators are dequantized by a
  multiply in fp32 (FixPipe's dequantization, modelled as one fp32 multiply) before that rounding.
* Float-to-int8 conversion (`quantize`) rounds half to even by default, like Ascend C's
  ``RoundMode::CAST_RINT``; ``rounding="round"`` gives ``CAST_ROUND`` (half away from zero).
  Out-of-range values saturate to [-128, 127].

Summation order: the Cube adds its products fractal by fractal (k0 = 16 fp16 values, 32 int8
values per step) and then tile by tile along K; torch adds them in its own blocked order. Both
are fp32 sums of the same exact products, so both obey the same error bound
``|C - C_exact| <= gamma_K * (|A| @ |B|)`` with ``gamma_K = K u / (1 - K u)``, ``u = 2**-24``, but
they need not agree bit for bit: expect differences of a few fp32 ulps of the partial sums.
int8 results are exact and therefore identical to the hardware's.

Bias: for fp16/bf16/fp32 it is kept in fp32 and added to the fp32 accumulator; for int8 it is
an int32 added to the int32 accumulator, i.e. in the accumulator's type (a modelling choice).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .chip import get_chip

FLOAT_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
CUBE_DTYPES = ("fp16", "bf16", "fp32", "int8")
ACCUMULATOR = {"fp16": "fp32", "bf16": "fp32", "fp32": "fp32", "int8": "int32"}
OUT_DTYPES = ("fp16", "bf16", "fp32")
ROUNDING_MODES = ("rint", "round")
INT8_RANGE = (-128, 127)
INT32_RANGE = (-(2**31), 2**31 - 1)

# An integer sum is exact in a float format while every partial sum stays below 2**(mantissa+1).
_EXACT_INT_FP32 = 2**24
_EXACT_INT_FP64 = 2**53


class NumericsError(ValueError):
    """Bad input to the Cube model: the message names the rule, the value and a fix."""


# ---- dtypes ------------------------------------------------------------------------------------


def cube_dtypes(chip: Any = None) -> tuple[str, ...]:
    """Input dtypes the model computes; with ``chip``, only those that chip's Cube takes."""
    if chip is None:
        return CUBE_DTYPES
    fractals = _get_chip(chip).cube.fractals
    return tuple(dt for dt in CUBE_DTYPES if dt in fractals)


def _get_chip(chip: Any):
    return get_chip(chip)


def _check_float_dtype(dtype: str, what: str = "dtype", allowed: tuple[str, ...] = ("fp16", "bf16", "fp32")):
    if dtype not in allowed:
        hint = " (for int8 use matmul_int8 / conv2d_int8)" if dtype == "int8" else ""
        raise NumericsError(
            f"unknown {what} {dtype!r}: known {what}s are {', '.join(allowed)}; pass one of them{hint}"
        )


def _check_chip(chip: Any, dtype: str) -> None:
    if chip is None:
        return
    c = _get_chip(chip)
    if not c.cube.supports(dtype):
        raise NumericsError(
            f"{c.name}'s Cube does not take {dtype} inputs: its Cube dtypes are "
            f"{', '.join(cube_dtypes(c))}; use one of them, or a chip whose Cube takes {dtype} "
            f"(e.g. Ascend910B1)"
        )


# ---- rounding ----------------------------------------------------------------------------------


def _as_tensor(x: Any, name: str) -> torch.Tensor:
    # Python numbers go through numpy so that floats stay float64 (torch would make them float32)
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    t = t.detach().cpu()
    if t.is_complex() or t.dtype == torch.bool:
        raise NumericsError(f"{name} must hold real numbers: got dtype {t.dtype}; convert it to float")
    return t


def _fp64_to_fp32_round_to_odd(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounding to odd: keeps a sticky bit, so that a second rounding to
    fp16/bf16 gives the correctly rounded result (torch's own cast rounds twice)."""
    f = x.to(torch.float32)
    inexact = f.to(torch.float64) != x
    too_big = inexact & (f.to(torch.float64).abs() > x.abs())
    f = torch.where(too_big, torch.nextafter(f, torch.zeros_like(f)), f)
    bits = f.view(torch.int32) | inexact.to(torch.int32)
    return bits.view(torch.float32)


def round_to(x: Any, dtype: str = "fp16") -> torch.Tensor:
    """``x`` rounded to ``dtype`` (fp16, bf16 or fp32), round to nearest, ties to even, returned
    as a float32 tensor. Values beyond the format's range become +-inf (IEEE); the chip's
    saturation modes are not modelled."""
    _check_float_dtype(dtype)
    t = _as_tensor(x, "x")
    if not t.is_floating_point():
        t = t.to(torch.float64)
    if t.dtype == torch.float64 and dtype != "fp32":
        t = _fp64_to_fp32_round_to_odd(t)
    return t.to(FLOAT_DTYPES[dtype]).to(torch.float32)


def _leave_l0c(acc: torch.Tensor, out_dtype: str | None) -> torch.Tensor:
    if out_dtype is None or out_dtype == "fp32":
        return acc
    return acc.to(FLOAT_DTYPES[out_dtype])


@contextmanager
def _ieee_fp32():
    """Make float32 CPU matmuls plain IEEE fp32 even if the user allowed bf16/tf32 shortcuts
    (``torch.set_float32_matmul_precision("medium")`` turns them into bf16 on AMX CPUs)."""
    backend = torch.backends.mkldnn.matmul
    saved = backend.fp32_precision
    if saved in ("none", "ieee"):
        yield
        return
    backend.fp32_precision = "ieee"
    try:
        yield
    finally:
        backend.fp32_precision = saved


def _fp32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with _ieee_fp32():
        return torch.matmul(a.to(torch.float32), b.to(torch.float32))


# ---- shape checks ------------------------------------------------------------------------------


def _broadcast(*shapes) -> tuple[int, ...] | None:
    """The broadcast of ``shapes``, or None if they do not broadcast. (Plain Python: the first
    call of torch.broadcast_shapes costs half a second of imports.)"""
    ndim = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes], strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _check_matmul_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() == 0 or b.dim() == 0:
        raise NumericsError(
            f"matmul needs tensors of 1 or more dimensions: got shapes {tuple(a.shape)} and "
            f"{tuple(b.shape)}; use * for a scalar product"
        )
    k_b = b.shape[-2] if b.dim() >= 2 else b.shape[0]
    if a.shape[-1] != k_b:
        raise NumericsError(
            f"inner dimensions differ: a has shape {tuple(a.shape)}, b has shape {tuple(b.shape)}; "
            f"a.shape[-1] ({a.shape[-1]}) must equal b.shape[-2] ({k_b}); transpose or reshape one input"
        )
    if a.dim() > 2 and b.dim() > 2 and _broadcast(a.shape[:-2], b.shape[:-2]) is None:
        raise NumericsError(
            f"batch dimensions do not broadcast: a has shape {tuple(a.shape)}, b has shape "
            f"{tuple(b.shape)}; make the leading dimensions equal or 1"
        )


def _check_bias_shape(bias: torch.Tensor, out_shape: torch.Size) -> None:
    if _broadcast(bias.shape, out_shape) != tuple(out_shape):
        raise NumericsError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to the result shape "
            f"{tuple(out_shape)}; give one value per output column (shape ({out_shape[-1]},))"
        )


# ---- float matmul ------------------------------------------------------------------------------


def matmul(
    a: Any,
    b: Any,
    dtype: str = "fp16",
    out_dtype: str | None = None,
    bias: Any = None,
    chip: Any = None,
) -> torch.Tensor:
    """``a @ b`` as the Cube computes it: inputs rounded to ``dtype`` (fp16, bf16, fp32), exact
    products summed in fp32, plus an fp32 ``bias``; returned as fp32, or rounded to ``out_dtype``.
    Batch dimensions broadcast as in ``torch.matmul``. With ``chip`` (a name or a Chip), a dtype
    that chip's Cube does not take is an error."""
    _check_float_dtype(dtype)
    if out_dtype is not None:
        _check_float_dtype(out_dtype, "out_dtype", OUT_DTYPES)
    _check_chip(chip, dtype)
    a = _as_tensor(a, "a")
    b = _as_tensor(b, "b")
    _check_matmul_shapes(a, b)
    acc = _fp32_matmul(round_to(a, dtype), round_to(b, dtype))
    if bias is not None:
        bias = round_to(_as_tensor(bias, "bias"), "fp32")
        _check_bias_shape(bias, acc.shape)
        acc = acc + bias
    return _leave_l0c(acc, out_dtype)


# ---- int8 --------------------------------------------------------------------------------------


def _int_values(x: Any, name: str, lo: int, hi: int, kind: str, fix: str) -> torch.Tensor:
    """``x`` as a tensor of integers within [lo, hi], checked; int8 tensors pass unchecked."""
    t = _as_tensor(x, name)
    if t.dtype == torch.int8 and (lo, hi) == INT8_RANGE:
        return t
    if t.is_floating_point():
        bad = ~torch.isfinite(t) | (t != torch.round(t))
        if bad.any():
            value = t[bad][0].item()
            raise NumericsError(f"{kind} input must hold integers: {name} holds {value!r}; {fix}")
    if t.numel():
        low, high = t.min().item(), t.max().item()
        if low < lo or high > hi:
            raise NumericsError(
                f"{kind} input out of range: {name} holds values in [{low:g}, {high:g}], {kind} is "
                f"[{lo}, {hi}]; {fix}"
            )
    return t


def _int8_values(x: Any, name: str) -> torch.Tensor:
    """Checked int8 values, as float32 (which holds them exactly)."""
    t = _int_values(x, name, *INT8_RANGE, "int8", "quantize it first with quantize(x, scale)")
    return t.to(torch.float32)


def _int32_values(x: Any, name: str) -> torch.Tensor:
    """Checked int32 values, as int64."""
    t = _int_values(x, name, *INT32_RANGE, "int32", "pass an int32 accumulator or bias")
    return t.to(torch.int64)


def _exact_float(bound: float) -> torch.dtype:
    """A float format in which integer sums whose partial sums stay within ``bound`` are exact."""
    if bound <= _EXACT_INT_FP32:
        return torch.float32
    if bound <= _EXACT_INT_FP64:
        return torch.float64
    raise NumericsError(  # needs K > 2**39: unreachable with real memory
        f"int8 sum too long to compute exactly: bound {bound:g} > 2**53; split K"
    )


def _max_abs(t: torch.Tensor) -> int:
    return int(t.abs().max().item()) if t.numel() else 0


def _exact_int_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact ``a @ b`` of integer-valued float tensors, by a float matmul that cannot round
    (result: float32 or float64 holding integers)."""
    k = a.shape[-1]
    ftype = _exact_float(k * _max_abs(a) * _max_abs(b))
    if ftype == torch.float32:
        return _fp32_matmul(a, b)
    return torch.matmul(a.to(ftype), b.to(ftype))


def _to_int32(acc: torch.Tensor) -> torch.Tensor:
    if acc.numel():
        low, high = int(acc.min().item()), int(acc.max().item())
        if low < INT32_RANGE[0] or high > INT32_RANGE[1]:
            raise NumericsError(
                f"int32 accumulator overflow: the exact result spans [{low}, {high}], int32 is "
                f"[{INT32_RANGE[0]}, {INT32_RANGE[1]}]; split K into parts or use smaller values"
            )
    return acc.to(torch.int32)


def matmul_int8(a_q: Any, b_q: Any, bias: Any = None, chip: Any = None) -> torch.Tensor:
    """int8 ``a_q @ b_q`` with int32 accumulation, exact; ``bias`` is int32, added to the
    accumulator. Inputs may be any integer or integer-valued float tensors within [-128, 127].
    Returns an int32 tensor; batch dimensions broadcast as in ``torch.matmul``."""
    _check_chip(chip, "int8")
    a = _int8_values(a_q, "a_q")
    b = _int8_values(b_q, "b_q")
    _check_matmul_shapes(a, b)
    acc = _exact_int_gemm(a, b)
    if bias is not None:
        bias = _int32_values(bias, "bias")
        _check_bias_shape(bias, acc.shape)
        acc = acc.to(torch.int64) + bias
    return _to_int32(acc)


def _positive_scale(scale: Any, name: str) -> torch.Tensor:
    s = _as_tensor(scale, name).to(torch.float32)
    bad = ~(torch.isfinite(s) & (s > 0))
    if s.numel() == 0 or bad.any():
        value = s[bad][0].item() if s.numel() else "an empty tensor"
        raise NumericsError(
            f"{name} must be finite and > 0: got {value}; use symmetric_scale(x) to pick one"
        )
    return s


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    whole = torch.trunc(v)
    return whole + torch.sign(v) * ((v - whole).abs() >= 0.5)


def quantize(
    x: Any, scale: Any, zero_point: int = 0, dtype: str = "int8", rounding: str = "rint"
) -> torch.Tensor:
    """``clamp(round(x / scale) + zero_point, -128, 127)`` as an int8 tensor, computed in fp32.

    ``rounding="rint"`` (default) rounds half to even, like Ascend C's ``CAST_RINT``;
    ``"round"`` rounds half away from zero (``CAST_ROUND``). ``scale`` may be a tensor that
    broadcasts against ``x`` (per-channel scales)."""
    if dtype != "int8":
        raise NumericsError(f"unknown quantized dtype {dtype!r}: known quantized dtypes are int8; pass 'int8'")
    if rounding not in ROUNDING_MODES:
        raise NumericsError(
            f"unknown rounding {rounding!r}: known roundings are {', '.join(ROUNDING_MODES)}; pass one of them"
        )
    lo, hi = INT8_RANGE
    if isinstance(zero_point, bool) or not isinstance(zero_point, int) or not lo <= zero_point <= hi:
        raise NumericsError(f"zero_point must be an integer in [{lo}, {hi}]: got {zero_point!r}; pass e.g. 0")
    t = _as_tensor(x, "x").to(torch.float32)
    if torch.isnan(t).any():
        raise NumericsError("x holds NaN, which has no int8 value; replace the NaNs first")
    scale = _positive_scale(scale, "scale")
    if _broadcast(scale.shape, t.shape) != tuple(t.shape):
        raise NumericsError(
            f"scale of shape {tuple(scale.shape)} does not broadcast to x of shape {tuple(t.shape)}; "
            f"pass one scale, or one per channel shaped to broadcast (e.g. from symmetric_scale(x, dim))"
        )
    v = t / scale
    q = torch.round(v) if rounding == "rint" else _round_half_away(v)
    return torch.clamp(q + zero_point, lo, hi).to(torch.int8)


def dequantize(
    acc_int32: Any, scale_a: Any, scale_b: Any, bias: Any = None, out_dtype: str = "fp16"
) -> torch.Tensor:
    """``acc * (scale_a * scale_b) + bias`` in fp32 (FixPipe's dequantization), rounded to
    ``out_dtype``. ``scale_a`` is a scalar or per-row (shape (..., M, 1)), ``scale_b`` a scalar or
    per-column (shape (N,)); ``bias`` is a float added after scaling. Zero points must be 0
    (symmetric quantization): with others the accumulator needs offset corrections first."""
    _check_float_dtype(out_dtype, "out_dtype", OUT_DTYPES)
    acc = _int32_values(acc_int32, "acc_int32")
    scale = _positive_scale(scale_a, "scale_a") * _positive_scale(scale_b, "scale_b")
    out = acc.to(torch.float32) * scale
    if bias is not None:
        out = out + round_to(_as_tensor(bias, "bias"), "fp32")
    return _leave_l0c(out, out_dtype)


def symmetric_scale(x: Any, dim: int | None = None) -> torch.Tensor:
    """Scale of symmetric int8 quantization, ``max|x| / 127``: per tensor, or along ``dim``
    (kept as size 1) for per-channel scales. An all-zero slice gets scale 1."""
    t = _as_tensor(x, "x").to(torch.float32).abs()
    amax = t.max() if dim is None else t.amax(dim=dim, keepdim=True)
    return torch.where(amax > 0, amax / INT8_RANGE[1], torch.ones_like(amax))


def per_channel_scale(w: Any, dim: int = 0) -> torch.Tensor:
    """Symmetric int8 scale per slice along ``dim`` (kept; every other dimension reduced to size
    1): one ``max|w| / 127`` per output channel of a weight. An all-zero slice gets scale 1."""
    t = _as_tensor(w, "w").to(torch.float32).abs()
    other = tuple(d for d in range(t.dim()) if d != dim % t.dim())
    amax = t.amax(dim=other, keepdim=True) if other else t
    return torch.where(amax > 0, amax / INT8_RANGE[1], torch.ones_like(amax))


def quantized_matmul(
    a: Any, b: Any, bias: Any = None, per_channel: bool = False, out_dtype: str = "fp16"
) -> torch.Tensor:
    """Float ``a @ b`` through the int8 Cube: symmetric per-tensor scales (per output column of
    ``b`` if ``per_channel``), `quantize`, `matmul_int8`, `dequantize` (float ``bias`` added
    after scaling)."""
    scale_a = symmetric_scale(a)
    scale_b = symmetric_scale(b, dim=-2) if per_channel else symmetric_scale(b)
    acc = matmul_int8(quantize(a, scale_a), quantize(b, scale_b))
    return dequantize(acc, scale_a, scale_b, bias=bias, out_dtype=out_dtype)


# ---- conv2d ------------------------------------------------------------------------------------


def _pair(value: Any, name: str, minimum: int) -> tuple[int, int]:
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in pair):
        raise NumericsError(
            f"{name} must be an integer >= {minimum} or a pair of them: got {value!r}; pass e.g. {minimum}"
        )
    return pair


def _conv_geometry(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, groups):
    """Checked shapes of one conv2d: returns (stride, padding, dilation, out_h, out_w)."""
    stride = _pair(stride, "stride", 1)
    padding = _pair(padding, "padding", 0)
    dilation = _pair(dilation, "dilation", 1)
    if x.dim() != 4 or w.dim() != 4:
        raise NumericsError(
            f"conv2d needs x of shape (N, C, H, W) or (C, H, W) and w of shape (O, C/groups, kh, kw): "
            f"got {tuple(x.shape)} and {tuple(w.shape)}; reshape them"
        )
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise NumericsError(f"groups must be an integer >= 1: got {groups!r}; pass e.g. 1")
    channels, out_channels = x.shape[1], w.shape[0]
    if channels != w.shape[1] * groups or out_channels % groups:
        raise NumericsError(
            f"channels do not match groups={groups}: x has shape {tuple(x.shape)}, w has shape "
            f"{tuple(w.shape)}; need x.shape[1] == w.shape[1] * groups and w.shape[0] divisible by groups"
        )
    size = []
    for i in range(2):
        span = dilation[i] * (w.shape[2 + i] - 1) + 1
        size.append((x.shape[2 + i] + 2 * padding[i] - span) // stride[i] + 1)
    if min(size) < 1:
        raise NumericsError(
            f"kernel larger than the padded input: x has shape {tuple(x.shape)}, w has shape "
            f"{tuple(w.shape)}, padding {padding}, dilation {dilation}; pad more or use a smaller kernel"
        )
    return stride, padding, dilation, size[0], size[1]


def _conv_as_gemm(x, w, stride, padding, dilation, groups, gemm):
    """conv2d as implicit GEMM: im2col (exact copies) then ``gemm(weights, columns)``."""
    stride, padding, dilation, out_h, out_w = _conv_geometry(x, w, stride, padding, dilation, groups)
    n = x.shape[0]
    out_channels, k = w.shape[0], w.shape[1] * w.shape[2] * w.shape[3]
    cols = F.unfold(x, w.shape[2:], dilation=dilation, padding=padding, stride=stride)
    cols = cols.reshape(n, groups, k, out_h * out_w)
    weights = w.reshape(groups, out_channels // groups, k)
    return gemm(weights, cols).reshape(n, out_channels, out_h, out_w)


def _batched(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    return (x.unsqueeze(0), True) if x.dim() == 3 else (x, False)


def conv2d(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    dtype: str = "fp16",
    out_dtype: str | None = None,
    chip: Any = None,
) -> torch.Tensor:
    """``torch.nn.functional.conv2d`` as the Cube computes it (implicit GEMM): inputs rounded to
    ``dtype``, exact products summed in fp32 over C/groups x kh x kw, fp32 ``bias`` per output
    channel; returned as fp32, or rounded to ``out_dtype``. Zero padding only."""
    _check_float_dtype(dtype)
    if out_dtype is not None:
        _check_float_dtype(out_dtype, "out_dtype", OUT_DTYPES)
    _check_chip(chip, dtype)
    x, unbatched = _batched(round_to(_as_tensor(x, "x"), dtype))
    w = round_to(_as_tensor(w, "w"), dtype)
    out = _conv_as_gemm(x, w, stride, padding, dilation, groups, _fp32_matmul)
    if bias is not None:
        out = out + _conv_bias(round_to(_as_tensor(bias, "bias"), "fp32"), out.shape[1])
    out = out[0] if unbatched else out
    return _leave_l0c(out, out_dtype)


def _conv_bias(bias: torch.Tensor, channels: int) -> torch.Tensor:
    if bias.shape != (channels,):
        raise NumericsError(
            f"conv2d bias must have one value per output channel: got shape {tuple(bias.shape)}, "
            f"need ({channels},)"
        )
    return bias.reshape(1, channels, 1, 1)


def conv2d_int8(
    x_q: Any,
    w_q: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    chip: Any = None,
) -> torch.Tensor:
    """int8 conv2d with int32 accumulation, exact; ``bias`` is int32 per output channel.

    Computed as implicit GEMM on float copies of the integers: a sum of K = C/groups*kh*kw
    products of magnitude <= 2**14 is exact in fp32 while K * max|x| * max|w| <= 2**24 and in
    fp64 up to 2**53 (K up to 2**39); the format is chosen from that bound. Returns int32."""
    _check_chip(chip, "int8")
    x, unbatched = _batched(_int8_values(x_q, "x_q"))
    w = _int8_values(w_q, "w_q")
    out = _conv_as_gemm(x, w, stride, padding, dilation, groups, _exact_int_gemm)
    if bias is not None:
        out = out.to(torch.int64) + _conv_bias(_int32_values(bias, "bias"), out.shape[1])
    out = out[0] if unbatched else out
    return _to_int32(out)
