"""Sorting, selection and scans of the PyPTO API: ``topk``, ``argsort``, ``argmax``, ``argmin``,
``cumsum``, ``cumprod`` (signatures of docs/zh/api/operation).

Costs (one task per vector tile of rows, the sorted / scanned axis whole in UB):

* topk / argsort: a merge sort of (value, index) pairs on the Vector unit, VMRGSORT merging four
  sorted lists per pass over 8-byte pairs: ``1 + ceil(log4(L / 32))`` passes for a row of L
  (32-element sorted blocks first), then VREDUCEV2 to pick values and / or indices out of the pairs.
* argmax / argmin along the last axis: VCMAX / VCMIN (each repeat yields its maximum and its
  index), a second pass over the partial results when a row spans several repeats; along another
  axis: per row, VCMPV then two VSELs (keep the better value and its index).
* cumsum / cumprod along the last axis: a Hillis-Steele scan, ``ceil(log2 L)`` passes of VADD /
  VMUL; along another axis: one VADD / VMUL per row onto the running row.
"""

from __future__ import annotations

import enum
import math

import torch

from . import special
from .dtypes import DT_INT32, DT_INT64
from .errors import ShapeError
from .ops import _norm_dim, _tensor, _vec_check
from .ops_index import _check_dtype
from .special import chunks, reps, rows_per_task, vkey
from .tensor import current_trace

_FLOAT = ("fp16", "bf16", "fp32")


class TopKAlgo(enum.Enum):
    """The algorithm of topk (docs/zh/api/datatype/TopKAlgo.md)."""

    MERGE_SORT = 0
    RADIX_SELECT = 1


def _rows_of(shape, d):
    """(rows, length of axis d, elements after d) of a tensor reduced / sorted along ``d``."""
    return math.prod(shape[:d]) * math.prod(shape[d + 1:]), shape[d], math.prod(shape[d + 1:])


def _sort_passes(length: int) -> int:
    blocks = -(-length // 32)
    return 1 + (math.ceil(math.log(blocks, 4)) if blocks > 1 else 0)


def _sort_steps(chip, n, rows, length, eb):
    pairs = rows * length
    key = "FP32_UINT64_FP32" if eb >= 4 else "FP16_UINT64_FP16"
    return [("vec", "VMRGSORT", key, reps(chip, pairs, 8)) for _ in range(_sort_passes(length))]


# ---- topk / argsort ----------------------------------------------------------------------------

def topk(input, k: int, dim=None, largest: bool = True, algo=TopKAlgo.MERGE_SORT):
    """The ``k`` largest (``largest=False``: smallest) elements of every row along the last axis,
    sorted, and their indices (DT_INT32): a tuple ``(values, indices)``."""
    tr = current_trace("pypto.topk")
    x = _tensor(input, "topk")
    d = len(x.shape) - 1 if dim is None else _norm_dim("topk", dim, x.ndim)
    if d != len(x.shape) - 1:
        raise ShapeError(f"topk: dim={dim}. Rule: topk works along the last axis only (dim=-1). "
                         "Fix: pypto.transpose the axis to the end first")
    name = getattr(algo, "name", str(algo))
    if name == "MERGE_SORT":
        _check_dtype("topk", x, ("fp32",))
    else:
        _check_dtype("topk", x, ("bf16", "fp16", "fp32", "int32", "int16", "int8", "uint8"))
    if not 1 <= int(k) <= x.shape[-1]:
        raise ShapeError(f"topk: k={k} for rows of {x.shape[-1]} elements. Rule: 1 <= k <= input.shape[-1]")
    _vec_check("topk", x.shape, [x.dtype])
    shape = list(x.shape[:-1]) + [int(k)]
    attrs = {"k": int(k), "largest": bool(largest), "dim": d}
    vals = tr.new("topk", [x._id], shape, x.dtype, dict(attrs, part="values"), vec=True)
    tr.note_read(x._id, vals._id)
    idx = tr.new("topk", [x._id, vals._id], shape, DT_INT32, dict(attrs, part="indices"), vec=True)
    return vals, idx


def _run_topk(n, ins, graph):
    v, i = torch.topk(ins[0], n.attrs["k"], dim=-1, largest=n.attrs["largest"], sorted=True)
    return v if n.attrs["part"] == "values" else i.to(torch.int32)


def _tasks_topk(n, nodes, chip):
    x = nodes[n.inputs[0]]
    rows, length, _ = _rows_of(x.shape, len(x.shape) - 1)
    k, eb = n.attrs["k"], x.dtype.bytes
    out = []
    for r in chunks(rows, rows_per_task(n, length)):
        if n.attrs["part"] == "values":
            out.append([("load", r * length * eb, 1)] + _sort_steps(chip, n, r, length, eb) + [
                ("vec", "VREDUCEV2", "UINT32_UINT32_UINT32", reps(chip, r * k, 8)), ("store", r * k * eb, 1)])
        else:  # the indices leave UB after the values' sort: their extraction and store
            out.append([("vec", "VREDUCEV2", "UINT32_UINT32_UINT32", reps(chip, r * k, 8)), ("store", r * k * 4, 1)])
    return out


special.register("topk", _run_topk, _tasks_topk)


def argsort(input, dim=None, descending: bool = True):
    """The indices (DT_INT32) that sort ``input`` along ``dim`` (stable: equal values keep their order)."""
    tr = current_trace("pypto.argsort")
    x = _tensor(input, "argsort")
    _check_dtype("argsort", x, ("fp32", "fp16"))
    d = len(x.shape) - 1 if dim is None else _norm_dim("argsort", dim, x.ndim)
    if x.ndim == 4 and d == 0:
        raise ShapeError("argsort: sorting axis 0 of a 4-D tensor. Rule: not supported by the real API. "
                         "Fix: pypto.transpose another axis into place")
    _vec_check("argsort", x.shape, [x.dtype])
    out = tr.new("argsort", [x._id], x.shape, DT_INT32, {"dim": d, "descending": bool(descending)}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def _run_argsort(n, ins, graph):
    return torch.argsort(ins[0], dim=n.attrs["dim"], descending=n.attrs["descending"], stable=True).to(torch.int32)


def _tasks_argsort(n, nodes, chip):
    x = nodes[n.inputs[0]]
    rows, length, _ = _rows_of(x.shape, n.attrs["dim"])
    eb = x.dtype.bytes
    return [[("load", r * length * eb, 1)] + _sort_steps(chip, n, r, length, eb)
            + [("vec", "VREDUCEV2", "UINT32_UINT32_UINT32", reps(chip, r * length, 8)), ("store", r * length * 4, 1)]
            for r in chunks(rows, rows_per_task(n, length))]


special.register("argsort", _run_argsort, _tasks_argsort)


# ---- argmax / argmin ---------------------------------------------------------------------------

def _argreduce(mode, input, dim, keepdim):
    tr = current_trace(f"pypto.{mode}")
    x = _tensor(input, mode)
    _check_dtype(mode, x, _FLOAT)
    d = _norm_dim(mode, dim, x.ndim)
    _vec_check(mode, x.shape, [x.dtype])
    shape = list(x.shape)
    if keepdim:
        shape[d] = 1
    else:
        del shape[d]
    out = tr.new("argreduce", [x._id], shape, DT_INT32, {"mode": mode, "dim": d, "keepdim": bool(keepdim)}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def argmax(input, dim: int, keepdim: bool = False):
    """The index (DT_INT32) of the largest value along ``dim`` (the first one if several are equal)."""
    return _argreduce("argmax", input, dim, keepdim)


def argmin(input, dim: int, keepdim: bool = False):
    """The index (DT_INT32) of the smallest value along ``dim`` (the first one if several are equal)."""
    return _argreduce("argmin", input, dim, keepdim)


def _run_argreduce(n, ins, graph):
    fn = torch.argmax if n.attrs["mode"] == "argmax" else torch.argmin
    return fn(ins[0], dim=n.attrs["dim"], keepdim=n.attrs["keepdim"]).to(torch.int32)


def _tasks_argreduce(n, nodes, chip):
    x = nodes[n.inputs[0]]
    d, eb = n.attrs["dim"], x.dtype.bytes
    rows, length, inner = _rows_of(x.shape, d)
    key, cross = vkey(x.dtype), "VCMAX" if n.attrs["mode"] == "argmax" else "VCMIN"
    tasks = []
    for r in chunks(rows, rows_per_task(n, length)):
        steps = [("load", r * length * eb, 1)]
        if d == len(x.shape) - 1:
            steps.append(("vec", cross, key, reps(chip, r * length, eb)))
            per_row = reps(chip, length, eb)
            if per_row > 1:  # one (value, index) per repeat: reduce the partials
                steps.append(("vec", cross, key, reps(chip, r * per_row * 2, eb)))
        else:
            for _ in range(length - 1):
                steps += [("vec", "VCMPV", key, reps(chip, r, eb)), ("vec", "VSEL", key, reps(chip, r, eb)),
                          ("vec", "VSEL", key, reps(chip, r, 4))]
        steps.append(("store", r * 4, 1))
        tasks.append(steps)
    return tasks


special.register("argreduce", _run_argreduce, _tasks_argreduce)


# ---- cumsum / cumprod --------------------------------------------------------------------------

def _cumulative(mode, input, dim):
    tr = current_trace(f"pypto.{mode}")
    x = _tensor(input, mode)
    _check_dtype(mode, x, ("fp16", "bf16", "int16", "int32", "fp32") if mode == "cumsum" else _FLOAT)
    d = _norm_dim(mode, dim, x.ndim)
    _vec_check(mode, x.shape, [x.dtype])
    dt = DT_INT64 if x.dtype.lab in ("int16", "int32") else x.dtype
    out = tr.new("cumulative", [x._id], x.shape, dt, {"mode": mode, "dim": d}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def cumsum(input, dim: int):
    """Running sum along ``dim``; DT_INT16 / DT_INT32 input gives DT_INT64 (as the real API)."""
    return _cumulative("cumsum", input, dim)


def cumprod(input, dim: int):
    """Running product along ``dim`` (DT_FP16, DT_BF16, DT_FP32)."""
    return _cumulative("cumprod", input, dim)


def _run_cumulative(n, ins, graph):
    x, d, mode = ins[0], n.attrs["dim"], n.attrs["mode"]
    if x.dtype in (torch.int16, torch.int32):
        return torch.cumsum(x.long(), dim=d)
    dt = x.dtype
    op = torch.add if mode == "cumsum" else torch.mul
    y = x.movedim(d, -1)
    if d == len(x.shape) - 1:  # Hillis-Steele: pass s combines element i with element i - 2^s, rounded to dt
        s = 1
        while s < y.shape[-1]:
            z = y.clone()
            z[..., s:] = op(y[..., s:].float(), y[..., :-s].float()).to(dt)
            y, s = z, s * 2
    else:  # row after row onto the running row
        y = y.clone()
        for i in range(1, y.shape[-1]):
            y[..., i] = op(y[..., i].float(), y[..., i - 1].float()).to(dt)
    return y.movedim(-1, d).contiguous()


def _tasks_cumulative(n, nodes, chip):
    x = nodes[n.inputs[0]]
    d, eb = n.attrs["dim"], x.dtype.bytes
    rows, length, inner = _rows_of(x.shape, d)
    instr = "VADD" if n.attrs["mode"] == "cumsum" else "VMUL"
    key = vkey(x.dtype)
    tasks = []
    for r in chunks(rows, rows_per_task(n, length)):
        steps = [("load", r * length * eb, 1)]
        if d == len(x.shape) - 1:
            steps += [("vec", instr, key, reps(chip, r * length, eb)) for _ in range(math.ceil(math.log2(length)))
                      ] if length > 1 else []
        else:
            steps += [("vec", instr, key, reps(chip, r, eb)) for _ in range(length - 1)]
        steps.append(("store", r * length * n.dtype.bytes, 1))
        tasks.append(steps)
    return tasks


special.register("cumulative", _run_cumulative, _tasks_cumulative)

__all__ = ["TopKAlgo", "topk", "argsort", "argmax", "argmin", "cumsum", "cumprod"]


# ---- prod --------------------------------------------------------------------------------------

def prod(input, dim: int, keepdim: bool = False):
    """The product along ``dim`` (DT_FP32, DT_INT32, DT_INT16), in input's dtype: a halving tree of
    VMULs along the last axis (no cross-lane multiply instruction), row after row along another."""
    tr = current_trace("pypto.prod")
    x = _tensor(input, "prod")
    _check_dtype("prod", x, ("fp32", "int32", "int16"))
    d = _norm_dim("prod", dim, x.ndim)
    _vec_check("prod", x.shape, [x.dtype])
    shape = list(x.shape)
    if keepdim:
        shape[d] = 1
    else:
        del shape[d]
    out = tr.new("prod", [x._id], shape, x.dtype, {"dim": d, "keepdim": bool(keepdim)}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def _run_prod(n, ins, graph):
    x, d = ins[0], n.attrs["dim"]
    y = x.movedim(d, -1)
    if x.dtype.is_floating_point:  # pairwise, rounded to the dtype after each level
        while y.shape[-1] > 1:
            h = y.shape[-1] // 2
            head = (y[..., :h].float() * y[..., h:2 * h].float()).to(x.dtype)
            y = torch.cat([head, y[..., 2 * h:]], dim=-1)
        r = y[..., 0]
    else:  # exact, wrapping at the dtype's width as the Vector unit's integer multiply does
        r = y.long().prod(-1).to(x.dtype)
    return r.unsqueeze(d) if n.attrs["keepdim"] else r


def _tasks_prod(n, nodes, chip):
    x = nodes[n.inputs[0]]
    d, eb = n.attrs["dim"], x.dtype.bytes
    rows, length, _ = _rows_of(x.shape, d)
    key = vkey(x.dtype)
    tasks = []
    for r in chunks(rows, rows_per_task(n, length)):
        steps = [("load", r * length * eb, 1)]
        if d == len(x.shape) - 1:
            m = length
            while m > 1:
                m = -(-m // 2)
                steps.append(("vec", "VMUL", key, reps(chip, r * m, eb)))
        else:
            steps += [("vec", "VMUL", key, reps(chip, r, eb)) for _ in range(length - 1)]
        steps.append(("store", r * eb, 1))
        tasks.append(steps)
    return tasks


special.register("prod", _run_prod, _tasks_prod)
__all__ += ["prod"]
