"""Data-rearranging ops of the PyPTO API: ``gathermask``, ``interleave`` / ``deinterleave``,
``pack`` / ``unpack``, ``atomic_add``, and ``expand_exp_dif`` (signatures of docs/zh/api/operation).

gathermask is the Vector unit's GatherMask with a built-in pattern (VREDUCEV2); interleave /
deinterleave move elements with VGATHER (each of the two outputs loads the half of the inputs it
is made of); pack / unpack reinterpret bytes (a GM -> UB -> GM copy); atomic_add accumulates a tile
into a GM region with MTE3's atomic add (a load of the source and one store); expand_exp_dif is
``exp(input - other)`` recorded as sub and exp (VSUB, VEXP) and fused.
"""

from __future__ import annotations

import math

import torch

from . import special
from .dtypes import DT_UINT8, as_dtype
from .errors import DTypeError, ShapeError, TraceError
from .ops import _tensor, _vec_check, exp, sub
from .ops_index import _root_attrs
from .special import chunks, copy_key, reps
from .tensor import check_dtype_same, current_trace


def _elems_per_task(n):
    tile = n.vec_tile or n.shape
    return max(1, math.prod(min(t, s) for t, s in zip(tile, n.shape)) if len(tile) >= len(n.shape) else 1)


# ---- gathermask --------------------------------------------------------------------------------

_PATTERN = {1: (2, 0), 2: (2, 1), 3: (4, 0), 4: (4, 1), 5: (4, 2), 6: (4, 3), 7: (1, 0)}


def gathermask(self, pattern_mode: int):
    """The elements of the last axis a built-in pattern keeps: 1 / 2 the first / second of every 2,
    3..6 the first..fourth of every 4, 7 all of them."""
    tr = current_trace("pypto.gathermask")
    x = _tensor(self, "gathermask")
    if int(pattern_mode) not in _PATTERN:
        raise TraceError(f"gathermask: pattern_mode={pattern_mode}. Rule: 1 to 7")
    step, _ = _PATTERN[int(pattern_mode)]
    if x.shape[-1] % step:
        raise ShapeError(f"gathermask: last axis of {x.shape[-1]} elements with pattern {pattern_mode}. Rule: the last "
                         f"axis is a multiple of {step}")
    _vec_check("gathermask", x.shape, [x.dtype])
    out = tr.new("gathermask", [x._id], list(x.shape[:-1]) + [x.shape[-1] // step], x.dtype,
                 {"mode": int(pattern_mode)}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def _run_gathermask(n, ins, graph):
    step, first = _PATTERN[n.attrs["mode"]]
    return ins[0][..., first::step].contiguous()


def _tasks_gathermask(n, nodes, chip):
    x = nodes[n.inputs[0]]
    step = _PATTERN[n.attrs["mode"]][0]
    eb = x.dtype.bytes
    key = "UINT32_UINT32_UINT32" if eb >= 4 else "UINT16_UINT16_UINT16"
    return [[("load", e * step * eb, 1), ("vec", "VREDUCEV2", key, reps(chip, e * step, eb)), ("store", e * eb, 1)]
            for e in chunks(math.prod(n.shape), _elems_per_task(n))]


special.register("gathermask", _run_gathermask, _tasks_gathermask)


# ---- interleave / deinterleave -----------------------------------------------------------------

def _pair(kind, a, b):
    tr = current_trace(f"pypto.{kind}")
    a = _tensor(a, kind)
    ins = [a]
    if b is not None:
        b = _tensor(b, kind)
        check_dtype_same(kind, a, b)
        if list(b.shape) != list(a.shape):
            raise ShapeError(f"{kind}: input {a.shape} and other {b.shape}. Rule: the same shape")
        ins.append(b)
    cols = a.shape[-1] if b is not None else a.shape[-1] // 2
    if b is None and a.shape[-1] % 2:
        raise ShapeError(f"{kind}: a single input's last axis ({a.shape[-1]}) is the interleaved stream; it must be even")
    shape = list(a.shape[:-1]) + [cols]
    _vec_check(kind, shape, [a.dtype])
    outs = []
    for part in (0, 1):
        o = tr.new("interleave", [t._id for t in ins], shape, a.dtype, {"mode": kind, "part": part}, vec=True)
        for t in ins:
            tr.note_read(t._id, o._id)
        outs.append(o)
    return tuple(outs)


def interleave(input, other):
    """Interleave ``input`` and ``other`` along the last axis (``input[0], other[0], input[1], ...``);
    return the stream's first and second halves."""
    return _pair("interleave", input, other)


def deinterleave(input, other=None):
    """The inverse of interleave: the even and the odd elements of the stream (``input`` followed by
    ``other``, or ``input`` alone)."""
    return _pair("deinterleave", input, other)


def _run_interleave(n, ins, graph):
    if n.attrs["mode"] == "interleave":
        stream = torch.stack([ins[0], ins[1]], dim=-1).reshape(*ins[0].shape[:-1], -1)
        c = ins[0].shape[-1]
        return stream[..., c:] if n.attrs["part"] else stream[..., :c]
    stream = torch.cat(ins, dim=-1) if len(ins) > 1 else ins[0]
    return stream[..., n.attrs["part"]::2].contiguous()


def _tasks_interleave(n, nodes, chip):
    eb = n.dtype.bytes
    # each output is made of as many input elements as it holds
    return [[("load", e * eb, 1), ("vec", "VGATHER", copy_key(n.dtype), reps(chip, e, eb)), ("store", e * eb, 1)]
            for e in chunks(math.prod(n.shape), _elems_per_task(n))]


special.register("interleave", _run_interleave, _tasks_interleave)


# ---- pack / unpack -----------------------------------------------------------------------------

def pack(self):
    """The bytes of ``self`` (flattened) as a 1-D DT_UINT8 tensor."""
    tr = current_trace("pypto.pack")
    x = _tensor(self, "pack")
    out = tr.new("bitcast", [x._id], [math.prod(x.shape) * x.dtype.bytes], DT_UINT8, {})
    tr.note_read(x._id, out._id)
    return out


def unpack(self, dstDataType):
    """The bytes of a DT_UINT8 tensor read as ``dstDataType`` elements (1-D)."""
    tr = current_trace("pypto.unpack")
    x = _tensor(self, "unpack")
    if x.dtype is not DT_UINT8:
        raise DTypeError(f"unpack: input dtype {x.dtype!r}. Rule: unpack takes DT_UINT8 (e.g. from pypto.pack)")
    dt = as_dtype(dstDataType, "unpack dstDataType")
    nb = math.prod(x.shape)
    if nb % dt.bytes:
        raise ShapeError(f"unpack: {nb} bytes do not make whole {dt!r} elements ({dt.bytes} bytes each)")
    out = tr.new("bitcast", [x._id], [nb // dt.bytes], dt, {})
    tr.note_read(x._id, out._id)
    return out


def _run_bitcast(n, ins, graph):
    if n.attrs.get("rows"):   # pypto.view(x, dtype=...): row by row (the valid rows and bytes the input holds)
        return ins[0].contiguous().view(n.dtype.torch).clone()
    return ins[0].contiguous().reshape(-1).view(torch.uint8).view(n.dtype.torch).clone()


def _tasks_bitcast(n, nodes, chip):
    nb = math.prod(n.shape) * n.dtype.bytes
    return [[("load", nb, 1), ("store", nb, 1)]]


special.register("bitcast", _run_bitcast, _tasks_bitcast)


# ---- update: a window written into a computed tensor (ops._assemble_into_value) ---------------

def _run_update(n, ins, graph):   # computed in execute (its offsets may be known only at run time)
    raise AssertionError("update nodes are computed by execute._compute")


def _tasks_update(n, nodes, chip):
    """The tensor passes through UB with the window written: its bytes in and out, the source's in
    (one task; an upper bound where the real compiler keeps the tensor in UB)."""
    dst, src = nodes[n.inputs[0]], nodes[n.inputs[1]]
    nd = math.prod(dst.shape) * dst.dtype.bytes
    ns = math.prod(src.shape) * src.dtype.bytes
    return [[("load", nd, 1), ("load", ns, 1), ("store", nd, 1)]]


special.register("update", _run_update, _tasks_update)


# ---- atomic_add --------------------------------------------------------------------------------

def atomic_add(src, offsets, dst):
    """In place: ``dst[offsets : offsets + src.shape] += src``, with MTE3's atomic add (concurrent
    tasks may add into the same region). ``dst`` is a kernel argument or a pypto.tensor."""
    tr = current_trace("pypto.atomic_add")
    s, d = _tensor(src, "atomic_add"), _tensor(dst, "atomic_add")
    check_dtype_same("atomic_add", s, d)
    if d.dtype.lab not in ("fp32", "fp16", "bf16", "int32", "int16", "int8"):
        raise DTypeError(f"atomic_add: dtype {d.dtype!r}. Rule: MTE3 adds DT_FP32, DT_FP16, DT_BF16, DT_INT32, "
                         "DT_INT16 or DT_INT8")
    offs = [int(o) for o in offsets]
    if len(offs) != d.ndim or s.ndim != d.ndim or any(o < 0 or o + n > m for o, n, m in zip(offs, s.shape, d.shape)):
        raise ShapeError(f"atomic_add: src {s.shape} at offsets {offs} does not fit dst {d.shape}. Rule: same rank, "
                         "0 <= offset and offset + src size <= dst size on every axis")
    attrs = dict(_root_attrs(tr, d), offsets=tuple(offs))
    if "root" not in attrs:
        raise TraceError("atomic_add: dst must be a kernel argument or a pypto.tensor (or a slice of one)")
    out = tr.new("atomic_add", [d._id, s._id], d.shape, d.dtype, attrs)
    tr.note_read(s._id, out._id)
    # an accumulation keeps what it does not add to: dst as a whole holds data after it
    tr.note_write(attrs["root"], attrs["root_offsets"], d.shape, out._id)
    return None


def _run_atomic_add(n, ins, graph):
    d, s = ins
    region = tuple(slice(o, o + k) for o, k in zip(n.attrs["offsets"], s.shape))
    if d.is_floating_point():
        d[region] = (d[region].float() + s.float()).to(d.dtype)
    else:
        d[region] += s
    return d


def _tasks_atomic_add(n, nodes, chip):
    s = nodes[n.inputs[1]]
    nb = math.prod(s.shape) * s.dtype.bytes
    return [[("load", nb, 1), ("store", nb, 1)]]


special.register("atomic_add", _run_atomic_add, _tasks_atomic_add, inplace=True)


# ---- expand_exp_dif ----------------------------------------------------------------------------

def expand_exp_dif(input, other):
    """``exp(input - other)`` (shapes broadcast)."""
    return exp(sub(input, other))


__all__ = ["gathermask", "interleave", "deinterleave", "pack", "unpack", "atomic_add", "expand_exp_dif"]
