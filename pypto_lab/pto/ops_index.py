"""The indexing ops of the PyPTO API: ``gather``, ``index_select``, ``scatter_update`` (the
KV-cache write of paged attention), ``scatter`` / ``scatter_`` and ``index_add`` / ``index_add_``,
with the signatures of the real docs (docs/zh/api/operation).

Each records one node of a kind in `graph.SPECIAL_KINDS`. Its cost is data movement that
scales with the rows it indexes: a row-gathering op issues one MTE2 transfer per indexed row
(and one MTE3 transfer per written row for scatters), never a load of the whole source.
Index values exist only when the kernel runs, so an index out of bounds raises
`IndexBoundsError` from execution, with the value, where it is, and the bound.
"""

from __future__ import annotations

import math

import torch

from . import special
from .errors import DTypeError, IndexBoundsError, ShapeError, TraceError
from .ops import _norm_dim, _tensor, _vec_check
from .special import chunks, copy_key, reps, rows_per_task, vkey
from .symbolic import SymbolicScalar
from .tensor import check_dtype_same, current_trace

_INDEX_DTYPES = ("int32", "int64")


def _check_dtype(op, x, allowed, what="input"):
    if x.dtype.lab not in allowed:
        names = ", ".join("DT_" + a.upper() for a in allowed)
        raise DTypeError(f"{op}: {what} dtype {x.dtype!r}. Rule: {op} takes {what} in {names}. "
                         f"Fix: pypto.cast({what}, one of those) first")


def _check_index(op, index, allowed=_INDEX_DTYPES):
    _check_dtype(op, index, allowed, "index")


def _bounds(op: str, index: torch.Tensor, bound: int, dim: int) -> None:
    """Raise IndexBoundsError for the first index value outside [0, bound)."""
    bad = (index < 0) | (index >= bound)
    if bool(bad.any()):
        pos = tuple(int(p) for p in bad.nonzero()[0])
        val = int(index[pos])
        raise IndexBoundsError(
            f"{op}: index{list(pos)} = {val} is out of bounds for dimension {dim} of size {bound}. Rule: every index "
            f"value lies in 0..{bound - 1} (negative values are not wrapped). Fix: clamp or mask the indices before "
            f"the call (e.g. pypto.clip on the index tensor), or check how they were computed")


def _root_attrs(tr, x) -> dict:
    reg = tr.gm_region(x._id)
    return {} if reg is None else {"root": reg[0], "root_offsets": tuple(reg[1])}


_GATHER_DT = ("int16", "int32", "fp16", "fp32", "bf16")
_SELECT_DT = ("int8", "int16", "int32", "uint8", "fp16", "fp32", "bf16")
_SCATTER_DT = ("fp32", "fp16", "bf16", "int8", "uint8", "int16", "int32")
_UPDATE_DT = ("fp32", "fp16", "bf16", "int32", "int16")
_INDEX_ADD_DT = ("fp32", "fp16", "bf16", "int8", "int16", "int32")


# ---- gather ------------------------------------------------------------------------------------

def gather(input, dim: int, index):
    """``out[i][j] = input[index[i][j]][j]`` (dim 0) / ``input[i][index[i][j]]`` (dim 1), ...: torch.gather.
    The output has the shape of ``index`` and the dtype of ``input``; the ``dim`` axis of input is
    kept whole in UB and the elements are picked there (VGATHER)."""
    tr = current_trace("pypto.gather")
    x, idx = _tensor(input, "gather"), _tensor(index, "gather")
    _check_dtype("gather", x, _GATHER_DT)
    _check_index("gather", idx)
    d = _norm_dim("gather", dim, x.ndim)
    if idx.ndim != x.ndim or any(i > s for k, (i, s) in enumerate(zip(idx.shape, x.shape)) if k != d):
        raise ShapeError(f"gather: index of shape {idx.shape} for input of shape {x.shape} (dim {d}). Rule: same rank, "
                         "and index.shape[i] <= input.shape[i] for every i != dim. Fix: slice the index or the input")
    _vec_check("gather", idx.shape, [x.dtype, idx.dtype])
    out = tr.new("gather", [x._id, idx._id], idx.shape, x.dtype, {"dim": d}, vec=True)
    tr.note_read(x._id, out._id)
    tr.note_read(idx._id, out._id)
    return out


def _run_gather(n, ins, graph):
    x, idx = ins
    d = n.attrs["dim"]
    _bounds("gather", idx, x.shape[d], d)
    # only the leading index.shape[i] entries of the other axes take part (index may be smaller)
    x = x[tuple(slice(0, s) if k != d else slice(None) for k, s in enumerate(idx.shape))]
    return torch.gather(x, d, idx.long())


def _tasks_gather(n, nodes, chip):
    x, idx = nodes[n.inputs[0]], nodes[n.inputs[1]]
    d = n.attrs["dim"]
    total = math.prod(n.shape)
    per = max(1, math.prod(min(t, s) for t, s in zip(n.vec_tile, n.shape)))
    out = []
    for e in chunks(total, per):
        slab = -(-e // idx.shape[d]) * x.shape[d]   # the index rows' whole `dim` axis of input
        out.append([("load", e * idx.dtype.bytes, 1), ("load", slab * x.dtype.bytes, 1),
                    ("vec", "VGATHER", copy_key(x.dtype), reps(chip, e, x.dtype.bytes)),
                    ("store", e * x.dtype.bytes, 1)])
    return out


special.register("gather", _run_gather, _tasks_gather)


# ---- index_select ------------------------------------------------------------------------------

def index_select(input, dim: int, index):
    """The slices of ``input`` along ``dim`` at ``index`` (1-D or 2-D): output shape
    ``input.shape[:dim] + index.shape + input.shape[dim+1:]``. Each selected slice is one MTE2
    transfer from GM."""
    tr = current_trace("pypto.index_select")
    x, idx = _tensor(input, "index_select"), _tensor(index, "index_select")
    _check_dtype("index_select", x, _SELECT_DT)
    _check_index("index_select", idx)
    if idx.ndim not in (1, 2):
        raise ShapeError(f"index_select: index of shape {idx.shape}. Rule: the index is 1-D or 2-D. "
                         "Fix: pypto.reshape(index, [-1])")
    d = _norm_dim("index_select", dim, x.ndim)
    shape = list(x.shape[:d]) + list(idx.shape) + list(x.shape[d + 1:])
    _vec_check("index_select", shape, [x.dtype])
    out = tr.new("index_select", [x._id, idx._id], shape, x.dtype, {"dim": d}, vec=True)
    tr.note_read(x._id, out._id)
    tr.note_read(idx._id, out._id)
    return out


def _run_index_select(n, ins, graph):
    x, idx = ins
    d = n.attrs["dim"]
    _bounds("index_select", idx, x.shape[d], d)
    r = torch.index_select(x, d, idx.reshape(-1).long())
    return r.reshape(n.shape)


def _row_tasks(n, outer, nidx, inner, eb, ib, chip):
    """Tasks of a row gather: ``outer * nidx`` rows of ``inner`` elements, a tile's worth per task:
    load the task's indices, one MTE2 per row, one store of the rows."""
    rows = outer * nidx
    out = []
    for r in chunks(rows, rows_per_task(n, inner)):
        out.append([("load", min(r, nidx) * ib, 1), ("load", inner * eb, r), ("store", r * inner * eb, 1)])
    return out


def _tasks_index_select(n, nodes, chip):
    x, idx = nodes[n.inputs[0]], nodes[n.inputs[1]]
    d = n.attrs["dim"]
    return _row_tasks(n, math.prod(x.shape[:d]), math.prod(idx.shape), math.prod(x.shape[d + 1:]),
                      x.dtype.bytes, idx.dtype.bytes, chip)


special.register("index_select", _run_index_select, _tasks_index_select)


# ---- scatter_update (paged attention's KV-cache write) ----------------------------------------

def scatter_update(input, dim: int, index, src):
    """In place: row ``index[i][j]`` of ``input`` becomes row ``i * s + j`` of ``src``.

    2-D: input ``[blockNum * blockSize, d]``, index ``[b, s]``, src ``[b * s, d]``;
    4-D: input ``[blockNum, blockSize, 1, d]`` (row ``index // blockSize``, ``index % blockSize``),
    src ``[b, s, 1, d]``. ``dim`` stays -2. Returns the updated input (``x = scatter_update(x, ...)``).
    Only the indexed rows move: MTE2 of the src tile and the indices, one MTE3 per row."""
    tr = current_trace("pypto.scatter_update")
    x, idx, s = (_tensor(t, "scatter_update") for t in (input, index, src))
    # the docs list DT_FP32/FP16/BF16/INT32/INT16, but the framework's ScatterUpdate checks only the
    # index's dtype (vector/indexing.cpp at 883e7df): rows of any dtype move (the models' int8 caches)
    _check_index("scatter_update", idx, ("int64", "int32", "int16"))
    check_dtype_same("scatter_update", x, s)
    if dim not in (-2, x.ndim - 2):
        raise ShapeError(f"scatter_update: dim={dim}. Rule: keep the default -2 (rows of d elements are updated). "
                         "Fix: dim=-2")
    if x.ndim not in (2, 4) or idx.ndim != 2 or s.ndim != x.ndim:
        raise ShapeError(f"scatter_update: input {x.shape}, index {idx.shape}, src {s.shape}. Rule: input 2-D "
                         "[blockNum*blockSize, d] with src [b*s, d], or input 4-D [blockNum, blockSize, 1, d] with src "
                         "[b, s, 1, d]; index [b, s]")
    b, sl = idx.shape
    want = [b * sl, x.shape[-1]] if x.ndim == 2 else [b, sl, 1, x.shape[-1]]
    if list(s.shape) != want or (x.ndim == 4 and x.shape[2] != 1):
        raise ShapeError(f"scatter_update: src of shape {s.shape} for index {idx.shape} and input {x.shape}. "
                         f"Rule: src has shape {want}. Fix: reshape src to {want}")
    _vec_check("scatter_update", s.shape, [x.dtype])
    out = tr.new("scatter_update", [x._id, idx._id, s._id], x.shape, x.dtype, _root_attrs(tr, x), vec=True)
    tr.note_read(idx._id, out._id)
    tr.note_read(s._id, out._id)
    if "root" in out._node().attrs:
        a = out._node().attrs
        tr.note_write(a["root"], a["root_offsets"], x.shape, out._id)
    return out


def _run_scatter_update(n, ins, graph):
    x, idx, s = ins
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    flat = idx.reshape(-1).long()
    _bounds("scatter_update", idx, rows, 0)
    src = s.reshape(-1, d).to(x.dtype)
    if x.ndim == 2:
        x[flat] = src
    else:
        bs = x.shape[1]
        x[flat // bs, flat % bs, 0] = src
    return x


def _tasks_scatter_update(n, nodes, chip):
    x, idx, s = (nodes[i] for i in n.inputs)
    d, eb, ib = x.shape[-1], x.dtype.bytes, idx.dtype.bytes
    rows = math.prod(s.shape[:-1])
    return [[("load", r * ib, 1), ("load", r * d * eb, 1), ("store", d * eb, r)]
            for r in chunks(rows, rows_per_task(n, d))]


special.register("scatter_update", _run_scatter_update, _tasks_scatter_update, inplace=True)


# ---- scatter / scatter_ ------------------------------------------------------------------------

def _scatter(kind, input, dim, index, src, reduce):
    tr = current_trace(f"pypto.{kind}")
    x, idx = _tensor(input, kind), _tensor(index, kind)
    _check_dtype(kind, x, _SCATTER_DT)
    _check_index(kind, idx)
    if reduce not in (None, "add", "multiply"):
        raise TraceError(f"{kind}: reduce={reduce!r}. Rule: reduce is None (replace), 'add' or 'multiply'")
    d = _norm_dim(kind, dim, x.ndim)
    inputs, attrs = [x._id, idx._id], {"dim": d, "reduce": reduce}
    if isinstance(src, (int, float)) or hasattr(src, "value") and not hasattr(src, "_id"):
        v = float(getattr(src, "value", src))
        if not math.isfinite(v):
            raise TraceError(f"{kind}: src = {v}. Rule: a scalar src is finite (no inf / nan). Fix: a finite value")
        attrs["value"] = v
        sshape = None
    else:
        s = _tensor(src, kind)
        check_dtype_same(kind, x, s)
        inputs.append(s._id)
        sshape = s.shape
    if idx.ndim != x.ndim or any(i > n for k, (i, n) in enumerate(zip(idx.shape, x.shape)) if k != d) or (
            sshape is not None and (len(sshape) != idx.ndim or any(i > n for i, n in zip(idx.shape, sshape)))):
        raise ShapeError(f"{kind}: input {x.shape}, index {idx.shape}, src {sshape or 'scalar'} (dim {d}). Rule: same "
                         "rank; index.shape[i] <= input.shape[i] for i != dim and index.shape[i] <= src.shape[i] "
                         "for every i. Fix: slice the index")
    _vec_check(kind, idx.shape, [x.dtype])
    if kind == "scatter_":
        attrs.update(_root_attrs(tr, x))
    out = tr.new(kind, inputs, x.shape, x.dtype, attrs, vec=True)
    for i in inputs[(1 if kind == "scatter_" else 0):]:
        tr.note_read(i, out._id)
    a = out._node().attrs
    if "root" in a:
        tr.note_write(a["root"], a["root_offsets"], x.shape, out._id)
    return out


def scatter(input, dim: int, index, src, *, reduce: str = None):
    """torch.scatter: ``out[..., index[i][j], ...] = src[i][j]`` along ``dim`` (src a tensor or a
    scalar; ``reduce='add'`` / ``'multiply'`` combine instead of replacing). ``input`` is copied."""
    return _scatter("scatter", input, dim, index, src, reduce)


def scatter_(input, dim: int, index, src, *, reduce: str = None):
    """In-place scatter: writes into ``input`` (a kernel argument) and returns it."""
    return _scatter("scatter_", input, dim, index, src, reduce)


def _run_scatter(n, ins, graph):
    x, idx = ins[0], ins[1]
    d, red = n.attrs["dim"], n.attrs["reduce"]
    _bounds(n.op, idx, x.shape[d], d)
    dst = x if n.op == "scatter_" else x.clone()
    if "value" in n.attrs:
        src = torch.full(idx.shape, n.attrs["value"], dtype=torch.float64).to(x.dtype)
    else:
        src = ins[2][tuple(slice(0, s) for s in idx.shape)]
    if red is None:
        dst.scatter_(d, idx.long(), src)
    else:
        dst.scatter_reduce_(d, idx.long(), src, "sum" if red == "add" else "prod")
    return dst


def _tasks_scatter(n, nodes, chip):
    x, idx = nodes[n.inputs[0]], nodes[n.inputs[1]]
    d, eb = n.attrs["dim"], x.dtype.bytes
    total = math.prod(idx.shape)
    per = max(1, math.prod(min(t, s) for t, s in zip(n.vec_tile, idx.shape)))
    key = vkey(x.dtype)
    tasks = []
    if n.op == "scatter":  # the untouched part of input reaches the output: a copy of input
        tasks.append([("load", math.prod(x.shape) * eb, 1), ("store", math.prod(x.shape) * eb, 1)])
    for e in chunks(total, per):
        slab = -(-e // idx.shape[d]) * x.shape[d]   # the input rows (whole `dim` axis) the index tile updates
        steps = [("load", e * idx.dtype.bytes, 1), ("load", slab * eb, 1)]
        if len(n.inputs) > 2:
            steps.append(("load", e * eb, 1))
        # per position along dim: compare the slab's positions with the index (VCMPV) and select (VSEL)
        for _ in range(idx.shape[d]):
            steps.append(("vec", "VCMPV", key, reps(chip, slab, eb)))
            if n.attrs["reduce"]:
                steps.append(("vec", "VADD" if n.attrs["reduce"] == "add" else "VMUL", key, reps(chip, slab, eb)))
            steps.append(("vec", "VSEL", key, reps(chip, slab, eb)))
        steps.append(("store", slab * eb, 1))
        tasks.append(steps)
    return tasks


special.register("scatter", _run_scatter, _tasks_scatter)
special.register("scatter_", _run_scatter, _tasks_scatter, inplace=True)


# ---- index_add / index_add_ --------------------------------------------------------------------

def _index_add(kind, input, dim, index, source, alpha):
    tr = current_trace(f"pypto.{kind}")
    x, idx, s = (_tensor(t, kind) for t in (input, index, source))
    _check_dtype(kind, x, _INDEX_ADD_DT)
    _check_index(kind, idx)
    check_dtype_same(kind, x, s)
    d = _norm_dim(kind, dim, x.ndim)
    if idx.ndim != 1 or s.ndim != x.ndim or s.shape[d] != idx.shape[0] or any(
            a != b for k, (a, b) in enumerate(zip(s.shape, x.shape)) if k != d):
        raise ShapeError(f"{kind}: input {x.shape}, index {idx.shape}, source {s.shape} (dim {d}). Rule: index is 1-D "
                         f"with source.shape[dim] entries; source has input's shape on every other axis")
    _vec_check(kind, s.shape, [x.dtype])
    attrs = {"dim": d, "alpha": float(alpha)}
    if kind == "index_add_":
        attrs.update(_root_attrs(tr, x))
    out = tr.new(kind, [x._id, idx._id, s._id], x.shape, x.dtype, attrs, vec=True)
    for i in (x._id, idx._id, s._id)[(1 if kind == "index_add_" else 0):]:
        tr.note_read(i, out._id)
    if "root" in attrs:
        tr.note_write(attrs["root"], attrs["root_offsets"], x.shape, out._id)
    return out


def index_add(input, dim: int, index, source, *, alpha=1):
    """``input`` with ``alpha * source[.., i, ..]`` added to slice ``index[i]`` along ``dim`` (a copy)."""
    return _index_add("index_add", input, dim, index, source, alpha)


def index_add_(input, dim: int, index, source, *, alpha=1):
    """In-place index_add: adds into ``input`` (a kernel argument) and returns it."""
    return _index_add("index_add_", input, dim, index, source, alpha)


def _run_index_add(n, ins, graph):
    x, idx, s = ins
    d, alpha = n.attrs["dim"], n.attrs["alpha"]
    _bounds(n.op, idx, x.shape[d], d)
    dst = x if n.op == "index_add_" else x.clone()
    fl = x.dtype.is_floating_point
    for i, j in enumerate(idx.tolist()):  # in index order, each add rounded to the dtype (VMULS, VADD)
        row = s.select(d, i)
        if fl:
            add = (row.float() * alpha).to(x.dtype) if alpha != 1 else row
            dst.select(d, j).copy_((dst.select(d, j).float() + add.float()).to(x.dtype))
        else:
            dst.select(d, j).add_((row.long() * int(alpha)).to(x.dtype))
    return dst


def _tasks_index_add(n, nodes, chip):
    x, idx = nodes[n.inputs[0]], nodes[n.inputs[1]]
    d, eb = n.attrs["dim"], x.dtype.bytes
    inner = math.prod(x.shape[d + 1:])
    rows = math.prod(x.shape[:d]) * idx.shape[0]
    key = vkey(x.dtype)
    tasks = []
    if n.op == "index_add":
        tasks.append([("load", math.prod(x.shape) * eb, 1), ("store", math.prod(x.shape) * eb, 1)])
    for r in chunks(rows, rows_per_task(n, inner)):
        steps = [("load", min(r, idx.shape[0]) * idx.dtype.bytes, 1), ("load", r * inner * eb, 1),
                 ("load", inner * eb, r)]
        if n.attrs["alpha"] != 1:
            steps.append(("vec", "VMULS", key, reps(chip, r * inner, eb)))
        steps += [("vec", "VADD", key, reps(chip, r * inner, eb)), ("store", inner * eb, r)]
        tasks.append(steps)
    return tasks


special.register("index_add", _run_index_add, _tasks_index_add)
special.register("index_add_", _run_index_add, _tasks_index_add, inplace=True)


__all__ = ["gather", "index_select", "scatter_update", "scatter", "scatter_", "index_add", "index_add_"]


# ---- the UB variants of index_add (same semantics; the real API keeps the rows in UB) ----------

def index_add_ub(input, dim: int, index, source, *, alpha=1):
    """The UB variant of index_add (the real API's, with more constraints): same result and, here,
    the same costing as index_add."""
    return _index_add("index_add", input, dim, index, source, alpha)


def index_add__ub(input, dim: int, index, source, *, alpha=1):
    """The UB variant of index_add_ (in place): same result and costing as index_add_."""
    return _index_add("index_add_", input, dim, index, source, alpha)


# ---- index_put_ ----------------------------------------------------------------------------------

def index_put_(input, indices: tuple, values, accumulate: bool = False):
    """In place: ``input[indices] = values`` (``+=`` with ``accumulate=True``), ``indices`` a tuple of
    k 1-D index tensors of the same length n selecting along the first k axes; ``values`` has shape
    ``[n] + input.shape[k:]``. One MTE3 transfer per selected row (an MTE2 read of it too when
    accumulating). Returns None, as the real API."""
    tr = current_trace("pypto.index_put_")
    x, v = _tensor(input, "index_put_"), _tensor(values, "index_put_")
    _check_dtype("index_put_", x, _SCATTER_DT)
    check_dtype_same("index_put_", x, v)
    idx = [_tensor(i, "index_put_") for i in (indices if isinstance(indices, (tuple, list)) else (indices,))]
    for i in idx:
        _check_index("index_put_", i)
    k = len(idx)
    n = idx[0].shape[0] if idx and idx[0].ndim == 1 else -1
    if not 1 <= k <= x.ndim or any(i.ndim != 1 or i.shape[0] != n for i in idx):
        raise ShapeError(f"index_put_: {k} index tensors of shapes {[i.shape for i in idx]} for input {x.shape}. "
                         f"Rule: 1 to {x.ndim} 1-D index tensors of one length n")
    want = [n] + list(x.shape[k:])
    if list(v.shape) != want:
        raise ShapeError(f"index_put_: values of shape {v.shape}. Rule: values has shape [n] + input.shape[k:] = {want}")
    _vec_check("index_put_", v.shape, [x.dtype])
    attrs = dict(_root_attrs(tr, x), accumulate=bool(accumulate), k=k)
    out = tr.new("index_put_", [x._id, v._id] + [i._id for i in idx], x.shape, x.dtype, attrs, vec=True)
    for t in [v] + idx:
        tr.note_read(t._id, out._id)
    if "root" in attrs:
        tr.note_write(attrs["root"], attrs["root_offsets"], x.shape, out._id)
    return None


def _run_index_put(n, ins, graph):
    x, v, idx = ins[0], ins[1], ins[2:]
    for d, i in enumerate(idx):
        _bounds("index_put_", i, x.shape[d], d)
    x.index_put_(tuple(i.long() for i in idx), v, accumulate=n.attrs["accumulate"])
    return x


def _tasks_index_put(n, nodes, chip):
    x, v = nodes[n.inputs[0]], nodes[n.inputs[1]]
    k, eb = n.attrs["k"], x.dtype.bytes
    inner = math.prod(x.shape[k:])
    ib = sum(nodes[i].dtype.bytes for i in n.inputs[2:])
    tasks = []
    for r in chunks(v.shape[0], rows_per_task(n, inner)):
        steps = [("load", r * ib, 1), ("load", r * inner * eb, 1)]
        if n.attrs["accumulate"]:
            steps += [("load", inner * eb, r), ("vec", "VADD", vkey(x.dtype), reps(chip, r * inner, eb))]
        tasks.append(steps + [("store", inner * eb, r)])
    return tasks


special.register("index_put_", _run_index_put, _tasks_index_put, inplace=True)
__all__ += ["index_add_ub", "index_add__ub", "index_put_"]


# ---- gather_in_ub (pypto.experimental in the real API): paged-attention token gather -------------

def gather_in_ub(param, indices, block_table, block_size: int, axis: int = -2):
    """The rows of the paged KV cache ``param`` [token_size, hidden] holding the tokens ``indices``
    [1, k] (e.g. a topk's output): token t lives in logical block ``t // block_size``, physical
    block ``block_table[0, t // block_size]``, row ``physical * block_size + t % block_size``.
    Output [k, hidden]; one MTE2 transfer per token row. (``pypto.experimental.gather_in_ub`` in
    the real API; this module does not own the experimental namespace.)"""
    tr = current_trace("pypto.experimental.gather_in_ub")
    p, idx, bt = (_tensor(t, "gather_in_ub") for t in (param, indices, block_table))
    # the docs list DT_FP32 / DT_FP16; the real models gather int8 keys and bf16 caches with it too
    _check_dtype("gather_in_ub", p, ("fp32", "fp16", "bf16", "int8"), "param")
    _check_index("gather_in_ub", idx, ("int32",))
    _check_dtype("gather_in_ub", bt, ("int32",), "block_table")
    if axis not in (-2, 0):
        raise ShapeError(f"gather_in_ub: axis={axis}. Rule: only -2 (token rows) is supported")
    if p.ndim != 2 or idx.ndim != 2 or idx.shape[0] != 1 or bt.ndim != 2 or bt.shape[0] != 1 or int(block_size) < 1:
        raise ShapeError(f"gather_in_ub: param {p.shape}, indices {idx.shape}, block_table {bt.shape}, block_size "
                         f"{block_size}. Rule: param [token_size, hidden], indices [1, k], block_table [1, n], "
                         "block_size >= 1")
    shape = [idx.shape[1], p.shape[1]]
    _vec_check("gather_in_ub", shape, [p.dtype])
    src, attrs = _paged_source(tr, p)
    attrs["block_size"] = int(block_size)
    out = tr.new("gather_in_ub", [src, idx._id, bt._id], shape, p.dtype, attrs, vec=True)
    for t in (p, idx, bt):
        tr.note_read(t._id, out._id)
    return out


def _paged_source(tr, p) -> tuple[int, dict]:
    """The tensor a paged gather reads: on the NPU the ``param`` of gather_in_ub / gather_in_l1 is an
    address in GM, and the physical rows it reads are counted from the start of ``param``, wherever
    they are (the DeepSeek-V4 sparse attention passes a view of the first rows of the whole cache).
    So a view (at offsets known now) of a kernel argument or buffer is read through its root: the rows
    from the view's first row on, the columns the view holds."""
    reg = tr.gm_region(p._id)
    n = tr.graph.nodes[p._id]
    if n.op == "view" and reg is not None and not any(isinstance(o, SymbolicScalar) for o in reg[1]):
        return reg[0], {"param_offsets": tuple(int(o) for o in reg[1]), "param_cols": int(n.shape[1])}
    return p._id, {}


def _run_gather_in_ub(n, ins, graph):
    p, idx, bt = ins
    if "param_offsets" in n.attrs:   # read through the root of a view (see _paged_source)
        r0, c0 = n.attrs["param_offsets"]
        p = p[r0:, c0:c0 + n.attrs["param_cols"]]
    bs = n.attrs["block_size"]
    what = n.attrs.get("what", "gather_in_ub")
    tok = idx.reshape(-1).long()
    _bounds(what, (tok // bs).reshape(1, -1), bt.shape[1], 1)  # the logical block of each token
    rows = bt[0].long()[tok // bs] * bs + tok % bs
    _bounds(f"{what} (physical row)", rows.reshape(1, -1), p.shape[0], 0)
    out = p[rows]
    size = n.attrs.get("size")
    return out[:, :size].contiguous() if size is not None else out


def _tasks_gather_in_ub(n, nodes, chip):
    p = nodes[n.inputs[0]]
    k, hidden = n.shape   # (gather_in_l1: the first `size` columns of each row)
    bt = nodes[n.inputs[2]]
    tasks = []
    for r in chunks(k, rows_per_task(n, hidden)):
        tasks.append([("load", r * 4, 1), ("load", bt.shape[1] * 4, 1), ("load", hidden * p.dtype.bytes, r),
                      ("store", r * hidden * p.dtype.bytes, 1)])
    return tasks


special.register("gather_in_ub", _run_gather_in_ub, _tasks_gather_in_ub)


def gather_in_l1(src, indices, block_table, block_size: int, size: int, is_b_matrix: bool = False,
                 is_trans: bool = False):
    """``pypto.experimental.gather_in_l1``: the first ``size`` columns of the rows of the paged
    tensor ``src`` [token_size, hidden] holding the tokens ``indices`` [1, k] (token t: row
    ``block_table[0, t // block_size] * block_size + t % block_size``), moved to L1 as a matmul
    operand; output [k, size] (``is_b_matrix`` / ``is_trans`` say how the Cube will read it and
    are recorded). Numerics: a row gather. Cost: one MTE2 transfer of ``size`` elements per row,
    as gather_in_ub's (the real op lands in L1, not UB: the same GM traffic)."""
    tr = current_trace("pypto.experimental.gather_in_l1")
    p, idx, bt = (_tensor(t, "gather_in_l1") for t in (src, indices, block_table))
    _check_dtype("gather_in_l1", p, ("fp32", "fp16", "bf16", "int8"), "src")
    _check_index("gather_in_l1", idx, ("int32", "int64"))
    _check_dtype("gather_in_l1", bt, ("int32",), "block_table")
    if p.ndim != 2 or idx.ndim != 2 or idx.shape[0] != 1 or bt.ndim != 2 or bt.shape[0] != 1 or int(block_size) < 1:
        raise ShapeError(f"gather_in_l1: src {p.shape}, indices {idx.shape}, block_table {bt.shape}, block_size "
                         f"{block_size}. Rule: src [token_size, hidden], indices [1, k], block_table [1, n], "
                         "block_size >= 1")
    if not 0 < int(size) <= p.shape[1]:
        raise ShapeError(f"gather_in_l1: size={size} of rows of {p.shape[1]} columns. Rule: 0 < size <= the "
                         "source's columns. Fix: size=" + str(p.shape[1]))
    shape = [idx.shape[1], int(size)]
    src, attrs = _paged_source(tr, p)
    attrs.update({"block_size": int(block_size), "size": int(size), "what": "gather_in_l1",
                  "is_b_matrix": bool(is_b_matrix), "is_trans": bool(is_trans)})
    out = tr.new("gather_in_ub", [src, idx._id, bt._id], shape, p.dtype, attrs, vec=True)
    for t in (p, idx, bt):
        tr.note_read(t._id, out._id)
    return out


__all__ += ["gather_in_ub", "gather_in_l1"]
