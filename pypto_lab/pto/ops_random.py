"""Random ops of the PyPTO API: ``uniform`` (U[0, 1)) and ``normal`` (N(0, 1)) with the real
signature ``(shape, key, counter, alg, dtype)`` (docs/zh/api/operation).

Deterministic: the same ``key`` and ``counter`` give the same tensor on every call and run; a
different counter gives another stream. The values come from torch's generator seeded from
(key, counter): they have the documented distribution but are not the NPU's Philox bits.
The cost is modelled as the Philox4x32-10 generator on the Vector unit, per 4 outputs: ten rounds
of two 32-bit multiplies (VMUL) and two xors (VOR, VAND, VNOT, VAND each: the table has no VXOR)
and the key bump (2 VADDS), then VCONV to float and a VMULS by 2^-32; ``normal`` adds Box-Muller
(VLN, VMULS, VSQRT, a Horner polynomial for the cosine, VMUL).
"""

from __future__ import annotations

import math

import torch

from . import special
from .dtypes import as_dtype
from .errors import DTypeError, ShapeError, TraceError
from .ops import _vec_check
from .special import chunks, reps
from .tensor import current_trace

_ROUND = (("VMUL", "INT32_INT32_INT32"),) * 2 + (("VOR", "UINT16_UINT16_UINT16"), ("VAND", "UINT16_UINT16_UINT16"),
                                                  ("VNOT", "UINT16_UINT16"), ("VAND", "UINT16_UINT16_UINT16")) * 2 + (
    ("VADDS", "INT32_INT32_INT32"),) * 2
_PHILOX = _ROUND * 10
_BOX_MULLER = (("VLN", "FP32_FP32"), ("VMULS", "FP32_FP32_FP32"), ("VSQRT", "FP32_FP32")) + (
    ("VMUL", "FP32_FP32_FP32"), ("VADDS", "FP32_FP32_FP32")) * 4 + (("VMUL", "FP32_FP32_FP32"),)


def _random(kind, shape, key, counter, alg, dtype):
    tr = current_trace(f"pypto.{kind}")
    dt = as_dtype(dtype, f"{kind} dtype")
    if dt.lab not in ("fp32", "fp16", "bf16"):
        raise DTypeError(f"{kind}: dtype {dt!r}. Rule: {kind} makes DT_FP32, DT_FP16 or DT_BF16. "
                         "Fix: one of those, then pypto.cast")
    key, counter, alg = list(key), list(counter), list(alg)
    if len(key) != 1 or len(counter) != 2 or len(alg) != 1:
        raise ShapeError(f"{kind}: key {key}, counter {counter}, alg {alg}. Rule: key has 1 value, counter 2, "
                         "alg 1 (e.g. key=[1234], counter=[0, 1], alg=[1])")
    if alg[0] not in (1, 3):
        raise TraceError(f"{kind}: alg=[{alg[0]}]. Rule: 1 (Philox) or 3 (auto select: Philox). Fix: alg=[1]")
    shape = [int(s) for s in shape]
    if not 1 <= len(shape) <= 4 or any(s <= 0 for s in shape):
        raise ShapeError(f"{kind}: shape {shape}. Rule: 1 to 4 positive sizes")
    _vec_check(kind, shape, [dt])
    return tr.new("random", [], shape, dt, {"dist": kind, "key": int(key[0]),
                                           "counter": (int(counter[0]), int(counter[1]))}, vec=True)


def uniform(shape, key, counter, alg, dtype):
    """A tensor of ``shape`` drawn from U[0, 1) (deterministic in key and counter)."""
    return _random("uniform", shape, key, counter, alg, dtype)


def normal(shape, key, counter, alg, dtype):
    """A tensor of ``shape`` drawn from N(0, 1) (deterministic in key and counter)."""
    return _random("normal", shape, key, counter, alg, dtype)


def _run_random(n, ins, graph):
    a = n.attrs
    c0, c1 = a["counter"]
    seed = (a["key"] * 1_000_003 + c0 * 65_537 + c1) % (2 ** 63)
    g = torch.Generator().manual_seed(seed)
    if a["dist"] == "uniform":
        r = torch.rand(n.shape, generator=g, dtype=torch.float32)
    else:
        r = torch.randn(n.shape, generator=g, dtype=torch.float32)
    r = r.to(n.dtype.torch)
    if a["dist"] == "uniform":  # rounding up to 1.0 in a short dtype would leave [0, 1)
        below = torch.nextafter(torch.tensor(1.0, dtype=n.dtype.torch), torch.tensor(0.0, dtype=n.dtype.torch))
        r = torch.minimum(r, below)
    return r


def _tasks_random(n, nodes, chip):
    total = math.prod(n.shape)
    per = max(1, math.prod(min(t, s) for t, s in zip(n.vec_tile, n.shape)))
    instrs = _PHILOX + (("VCONV", "INT32_FP32"), ("VMULS", "FP32_FP32_FP32"))
    if n.attrs["dist"] == "normal":
        instrs += _BOX_MULLER
    if n.dtype.lab != "fp32":
        instrs += (("VCONV", "FP32_" + n.dtype.lab.upper()),)
    out = []
    for e in chunks(total, per):
        steps = [("vec", i, key, reps(chip, -(-e // 4) * 4, 4)) for i, key in instrs]
        out.append(steps + [("store", e * n.dtype.bytes, 1)])
    return out


special.register("random", _run_random, _tasks_random)

__all__ = ["uniform", "normal"]
