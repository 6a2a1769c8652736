"""Neural-network ops of the PyPTO API built from recorded vector ops: ``rms_norm`` and ``var``
(signatures of docs/zh/api/operation). The Tile Graph fuses each into one vector group per row
block; their cost is the instructions of the ops they are made of."""

from __future__ import annotations

import builtins

from .dtypes import DT_FP32
from .errors import DTypeError, ShapeError
from .ops import _norm_dim, _tensor, add, cast, mul, rsqrt, sub, sum


def rms_norm(input, gamma=None, epsilon: float = 1e-6):
    """``input * rsqrt(mean(input ** 2, -1) + epsilon) * gamma`` along the last axis (``gamma`` of
    shape [C] optional); like the real decomposition, fp16/bf16 inputs are computed in fp32 and
    cast back."""
    x = _tensor(input, "rms_norm")
    if x.dtype.lab not in ("fp16", "bf16", "fp32"):
        raise DTypeError(f"rms_norm: input dtype {x.dtype!r}. Rule: rms_norm computes in DT_FP16, DT_BF16 or "
                         "DT_FP32. Fix: pypto.cast(input, pypto.DT_FP32) first")
    c = x.shape[-1]
    # As the real pypto.rms_norm (python/pypto/operator.py): computed in fp32, cast back at the end.
    low = x.dtype.lab != "fp32"
    xf = cast(x, DT_FP32) if low else x
    ms = mul(sum(mul(xf, xf), -1, keepdim=True), 1.0 / c)
    y = mul(xf, rsqrt(add(ms, float(epsilon))))
    if gamma is not None:
        g = _tensor(gamma, "rms_norm")
        if list(g.shape) != [c]:
            raise ShapeError(f"rms_norm: gamma of shape {g.shape} for input {x.shape}. Rule: gamma has shape [C] = "
                             f"[{c}] (the last axis)")
        y = mul(y, cast(g, DT_FP32) if g.dtype.lab != "fp32" else g)
    return cast(y, x.dtype) if low else y


def var(input, dim=None, *, correction: float = 1, keepdim: bool = False):
    """``sum((x - mean) ** 2) / max(0, N - correction)`` over ``dim`` (an axis, a list of axes, or
    None: all), in input's dtype (DT_FP16, DT_BF16, DT_FP32)."""
    x = _tensor(input, "var")
    if x.dtype.lab not in ("fp16", "bf16", "fp32"):
        raise DTypeError(f"var: input dtype {x.dtype!r}. Rule: var takes DT_FP16, DT_BF16 or DT_FP32")
    dims = list(range(x.ndim)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    dims = sorted({_norm_dim("var", d, x.ndim) for d in dims})
    n = 1
    for d in dims:
        n *= x.shape[d]
    m = x
    for d in dims:
        m = sum(m, d, keepdim=True)
    dev = sub(x, mul(m, 1.0 / n))
    s = mul(dev, dev)
    for d in dims:
        s = sum(s, d, keepdim=True)
    denom = builtins.max(0.0, n - correction)
    out = mul(s, (1.0 / denom) if denom else float("inf"))
    if not keepdim:
        from .ops import reshape
        shape = [size for d, size in enumerate(x.shape) if d not in dims] or [1]
        out = reshape(out, shape)
    return out


__all__ = ["rms_norm", "var"]
