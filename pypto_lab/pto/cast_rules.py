"""The numerics of ``pypto.cast`` with its ``CastMode`` and ``SaturationMode``, as
docs/zh/api/operation/pypto-cast.md and docs/zh/api/datatype/CastMode.md (883e7df) state them.

* ``CAST_NONE`` is the framework's default for the conversion: ``CAST_TRUNC`` from a float to an
  integer, ``CAST_RINT`` otherwise (the docs' "默认CastMode规则").
* Widening conversions (fp16 -> fp32, int8 -> fp16, int32 -> int64, ...) are exact: the mode is
  ignored, as the docs say.
* To an integer: the value is rounded by the mode (RINT ties to even, ROUND ties away from zero,
  FLOOR, CEIL, TRUNC); ``SaturationMode.ON`` clamps to the type's range, ``OFF`` keeps the low bits
  (two's complement wrap-around, the docs' "binary truncation"). NaN becomes 0.
* To a float: rounded to the target's precision by the mode, computed exactly from the value in
  fp64 and the two neighbours of the round-to-nearest result (RINT is torch's own conversion;
  ODD: an inexact result gets the neighbour whose last mantissa bit is 1).
* A cast to the same float dtype with an explicit mode rounds to an integral value (the docs'
  "同类型舍入", vtrc); with ``CAST_NONE`` it is the input itself.
"""

from __future__ import annotations

import torch

from .enums import CastMode, SaturationMode

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def default_mode(src: torch.dtype, dst: torch.dtype) -> CastMode:
    return CastMode.CAST_TRUNC if src.is_floating_point and not dst.is_floating_point else CastMode.CAST_RINT


def _round_integral(x: torch.Tensor, mode: CastMode) -> torch.Tensor:
    if mode is CastMode.CAST_RINT:
        return torch.round(x)
    if mode is CastMode.CAST_ROUND:
        return torch.sign(x) * torch.floor(x.abs() + 0.5)
    if mode is CastMode.CAST_FLOOR:
        return torch.floor(x)
    if mode is CastMode.CAST_CEIL:
        return torch.ceil(x)
    return torch.trunc(x)   # TRUNC (and ODD, which has no meaning for integers)


def _to_float(x64: torch.Tensor, dst: torch.dtype, mode: CastMode) -> torch.Tensor:
    near = x64.to(dst)
    if mode is CastMode.CAST_RINT:
        return near
    n64 = near.double()
    inf = torch.full_like(near, float("inf"))
    below = torch.where(n64 > x64, torch.nextafter(near, -inf), near)
    above = torch.where(n64 < x64, torch.nextafter(near, inf), near)
    exact = n64 == x64
    if mode is CastMode.CAST_FLOOR:
        out = below
    elif mode is CastMode.CAST_CEIL:
        out = above
    elif mode is CastMode.CAST_TRUNC:
        out = torch.where(x64 >= 0, below, above)
    elif mode is CastMode.CAST_ROUND:
        d_lo, d_hi = x64 - below.double(), above.double() - x64
        away = torch.where(x64 >= 0, above, below)
        out = torch.where(d_lo == d_hi, away, torch.where(d_lo < d_hi, below, above))
    else:  # ODD
        bits = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}[dst]
        odd_below = (below.view(bits) & 1).bool()
        out = torch.where(odd_below, below, above)
    return torch.where(exact | torch.isnan(x64), near, out)


def cast(x: torch.Tensor, dst: torch.dtype, mode: CastMode | None = None,
         satmode: SaturationMode | None = None) -> torch.Tensor:
    """``x`` converted to ``dst`` by the rules of the module docstring."""
    src = x.dtype
    mode = CastMode.CAST_NONE if mode is None else mode
    if dst is torch.bool:
        return x != 0
    if mode is CastMode.CAST_NONE:
        if src == dst:
            return x
        mode = default_mode(src, dst)
    if src == dst:
        if not dst.is_floating_point:
            return x
        return _round_integral(x.double(), mode).to(dst)
    if dst.is_floating_point:
        if not src.is_floating_point and dst in (torch.float32, torch.float64) and src in (
                torch.int8, torch.uint8, torch.int16, torch.bool):
            return x.to(dst)   # widening: exact
        if src.is_floating_point and torch.finfo(src).bits <= torch.finfo(dst).bits and (
                src != torch.bfloat16 or dst != torch.float16):
            return x.to(dst)   # widening: exact
        if dst not in (torch.float16, torch.bfloat16, torch.float32):
            return x.to(dst)   # the 8-bit floats: torch's conversion (ties to even)
        return _to_float(x.double(), dst, mode)
    info = torch.iinfo(dst)
    v = x.double() if src.is_floating_point else x.to(torch.int64)
    if src.is_floating_point:
        v = torch.nan_to_num(_round_integral(v, mode), nan=0.0)
    if satmode is SaturationMode.ON or not src.is_floating_point:
        v = v.clamp(info.min, info.max)   # integer narrowing: "仅饱和控制" (saturation only)
    else:
        span = float(info.max - info.min + 1)
        v = v.clamp(-2.0 ** 62, 2.0 ** 62)
        v = torch.remainder(v - info.min, span) + info.min
    return v.to(dst)


__all__ = ["cast", "default_mode"]
