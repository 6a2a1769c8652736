"""The operations of the PyPTO API (``pypto.add``, ``exp``, ``amax``, ``sum``, ``matmul``,
``transpose``, ``reshape``, ``cast``, ``view``, ``assemble``, ``tensor``, ...): each checks its
operands and the tile shape in force, then records one node of the Tensor Graph."""

from __future__ import annotations

import builtins
import math

from . import config
from .dtypes import DT_FP32, DT_INT32, DataType, as_dtype, dim_value
from .errors import (
    BroadcastError,
    DTypeError,
    NoTileShapeError,
    ShapeError,
    TileAlignmentError,
    TileRankError,
    TraceError,
)
from .tensor import Tensor, check_dtype_same, current_trace

_SCALAR = (int, float)


def suggest_vec_tile(shape, dtype: DataType) -> tuple[int, ...]:
    """A legal vector tile for ``shape``: the whole innermost dimension (32-B aligned) and as many
    rows as make about 16 KB."""
    shape = list(shape)
    align = max(1, 32 // dtype.bytes)
    last = -(-shape[-1] // align) * align
    rows_budget = max(1, 16384 // (last * dtype.bytes))
    tile = [1] * len(shape)
    tile[-1] = last
    for d in range(len(shape) - 2, -1, -1):
        take = builtins.min(shape[d], rows_budget)
        tile[d] = take
        rows_budget = builtins.max(1, rows_budget // builtins.max(1, take))
        if rows_budget == 1:
            break
    return tuple(tile)


def _vec_check(op: str, ref_shape, dtypes) -> None:
    """The rules of the vector tile shape in force for an op iterating ``ref_shape``."""
    tile = config.STATE.vec_tile
    dt = dtypes[0]
    if tile is None:
        raise NoTileShapeError(
            f"{op} on a tensor of shape {list(ref_shape)} is traced before any vector tile shape is set. Rule: every "
            "vector operation is split into tiles of the shape set by pypto.set_vec_tile_shapes. Fix: call "
            f"pypto.set_vec_tile_shapes{suggest_vec_tile(ref_shape, dt)} before it")
    if len(tile) != len(ref_shape):
        raise TileRankError(
            f"{op}: the vector tile shape {tile} has rank {len(tile)} but the tensor it tiles has shape "
            f"{list(ref_shape)} (rank {len(ref_shape)}). Rule: the tile shape gives one size per tensor dimension. "
            f"Fix: pypto.set_vec_tile_shapes{suggest_vec_tile(ref_shape, dt)} before this operation")
    for d in dtypes:
        nbytes = tile[-1] * d.bytes
        if nbytes % 32:
            align = max(1, 32 // d.bytes)
            fix = -(-tile[-1] // align) * align
            raise TileAlignmentError(
                f"{op}: the innermost vector tile size {tile[-1]} x {d.bytes} bytes ({d!r}) = {nbytes} bytes is not a "
                f"multiple of 32 bytes. Rule: the innermost tile dimension must be 32-byte aligned (UB blocks are "
                f"32 bytes). Fix: use {fix} (a multiple of {align}) as the last size of set_vec_tile_shapes")


def _tensor(x, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TraceError(f"{op}: expected a pypto.Tensor, got {type(x).__name__} {x!r}")
    x._node()  # raises for annotations
    return x


def broadcast_shapes(op: str, a, b) -> tuple[int, ...]:
    a, b = list(a), list(b)
    n = builtins.max(len(a), len(b))
    pa, pb = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for d, (x, y) in enumerate(zip(pa, pb)):
        if x != y and x != 1 and y != 1:
            raise BroadcastError(
                f"{op}: shapes {a} and {b} do not broadcast: dimension {d} (aligned from the right) is {x} vs {y}. "
                "Rule: sizes must be equal or one of them 1. Fix: slice or reshape one operand so that they agree, "
                "e.g. keep reduced dimensions with keepdim=True")
        out.append(builtins.max(x, y))
    return tuple(out)


def _binary(op: str, a, b):
    if isinstance(a, _SCALAR) and isinstance(b, _SCALAR):
        return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op]
    tr = current_trace(f"pypto.{op}")
    if isinstance(b, _SCALAR):
        a = _tensor(a, op)
        _vec_check(op, a.shape, [a.dtype])
        kind = {"add": "adds", "sub": "subs", "mul": "muls", "div": "divs"}[op]
        out = tr.new(kind, [a._id], a.shape, a.dtype, {"scalar": float(b)}, vec=True)
        tr.note_read(a._id, out._id)
        return out
    if isinstance(a, _SCALAR):
        b = _tensor(b, op)
        _vec_check(op, b.shape, [b.dtype])
        kind = {"add": "adds", "sub": "rsubs", "mul": "muls", "div": "rdivs"}[op]
        out = tr.new(kind, [b._id], b.shape, b.dtype, {"scalar": float(a)}, vec=True)
        tr.note_read(b._id, out._id)
        return out
    a, b = _tensor(a, op), _tensor(b, op)
    check_dtype_same(op, a, b)
    shape = broadcast_shapes(op, a.shape, b.shape)
    _vec_check(op, shape, [a.dtype])
    out = tr.new(op, [a._id, b._id], shape, a.dtype, vec=True)
    tr.note_read(a._id, out._id)
    tr.note_read(b._id, out._id)
    return out


def add(input, other, alpha=1):
    """``input + alpha * other`` (tensors broadcast; either may be a Python scalar)."""
    if alpha != 1:
        other = mul(other, alpha)
    return _binary("add", input, other)


def sub(input, other, alpha=1):
    if alpha != 1:
        other = mul(other, alpha)
    return _binary("sub", input, other)


def mul(input, other):
    return _binary("mul", input, other)


def div(input, other):
    return _binary("div", input, other)


def _minmax(op, a, b):
    tr = current_trace(f"pypto.{op}")
    a, b = _tensor(a, op), _tensor(b, op)
    check_dtype_same(op, a, b)
    shape = broadcast_shapes(op, a.shape, b.shape)
    _vec_check(op, shape, [a.dtype])
    out = tr.new(op, [a._id, b._id], shape, a.dtype, vec=True)
    tr.note_read(a._id, out._id)
    tr.note_read(b._id, out._id)
    return out


def maximum(input, other):
    return _minmax("maximum", input, other)


def minimum(input, other):
    return _minmax("minimum", input, other)


def _unary(op: str, x, float_only=True):
    tr = current_trace(f"pypto.{op}")
    x = _tensor(x, op)
    if float_only and x.dtype.lab not in ("fp16", "bf16", "fp32"):
        raise DTypeError(f"{op}: input dtype {x.dtype!r}; {op} takes DT_FP16, DT_BF16 or DT_FP32. "
                         f"Fix: pypto.cast(x, pypto.DT_FP32) first")
    _vec_check(op, x.shape, [x.dtype])
    out = tr.new(op, [x._id], x.shape, x.dtype, vec=True)
    tr.note_read(x._id, out._id)
    return out


def exp(input):
    return _unary("exp", input)


def sqrt(input):
    return _unary("sqrt", input)


def rsqrt(input):
    return _unary("rsqrt", input)


def reciprocal(input):
    return _unary("reciprocal", input)


def neg(input):
    return _unary("neg", input, float_only=False)


def abs(input):
    return _unary("abs", input, float_only=False)


def relu(input):
    return _unary("relu", input, float_only=False)


def _norm_dim(op, dim, rank):
    if isinstance(dim, (list, tuple)):
        if len(dim) != 1:
            raise TraceError(f"{op}: dim={list(dim)}; reduce one axis at a time (the real API takes a single axis)")
        dim = dim[0]
    d = int(dim)
    if not -rank <= d < rank:
        raise ShapeError(f"{op}: dim={dim} is out of range for a tensor of rank {rank}; use -{rank}..{rank - 1}")
    return d % rank


def _reduce(op: str, x, dim, keepdim):
    tr = current_trace(f"pypto.{op}")
    x = _tensor(x, op)
    d = _norm_dim(op, dim, x.ndim)
    _vec_check(op, x.shape, [x.dtype])
    shape = list(x.shape)
    if keepdim:
        shape[d] = 1
    else:
        del shape[d]
    out = tr.new(op, [x._id], shape, x.dtype, {"dim": d, "keepdim": bool(keepdim)}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def amax(input, dim=-1, keepdim=False):
    """Maximum over one axis (``dim``; ``keepdim`` keeps it with size 1)."""
    return _reduce("amax", input, dim, keepdim)


def amin(input, dim=-1, keepdim=False):
    return _reduce("amin", input, dim, keepdim)


def sum(input, dim=-1, keepdim=False):
    return _reduce("sum", input, dim, keepdim)


def cast(input, dtype, mode=None, satmode=None):
    """``input`` converted to ``dtype`` (round to nearest even)."""
    tr = current_trace("pypto.cast")
    x = _tensor(input, "cast")
    dt = as_dtype(dtype, "cast dtype")
    if dt is x.dtype:
        return x
    _vec_check("cast", x.shape, [x.dtype, dt])
    out = tr.new("cast", [x._id], x.shape, dt, {"src": x.dtype.name}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def transpose(input, dim0=-2, dim1=-1):
    """Swap two axes (a data movement on the Vector unit; its tile shape is that of the input)."""
    tr = current_trace("pypto.transpose")
    x = _tensor(input, "transpose")
    d0, d1 = _norm_dim("transpose", dim0, x.ndim), _norm_dim("transpose", dim1, x.ndim)
    _vec_check("transpose", x.shape, [x.dtype])
    shape = list(x.shape)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    out = tr.new("transpose", [x._id], shape, x.dtype, {"dim0": d0, "dim1": d1}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def reshape(input, shape, *, valid_shape=None, inplace=False):
    tr = current_trace("pypto.reshape")
    x = _tensor(input, "reshape")
    shape = [dim_value(s) if not isinstance(s, int) else s for s in shape]
    n = math.prod(x.shape)
    if shape.count(-1) == 1:
        rest = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = n // builtins.max(1, rest)
    if math.prod(shape) != n:
        raise ShapeError(f"reshape of shape {x.shape} ({n} elements) to {shape} ({math.prod(shape)} elements): "
                         "the number of elements must stay the same")
    attrs = {}
    reg = tr.gm_region(x._id)
    out = tr.new("reshape", [x._id], shape, x.dtype, attrs)
    if reg is not None:
        tr.note_read(x._id, out._id)
    return out


def view(input, shape=None, offsets=None, *, valid_shape=None, dtype=None):
    """A window of ``input``: ``shape`` elements from ``offsets`` (``x[a:b, ...]`` is a view)."""
    tr = current_trace("pypto.view")
    x = _tensor(input, "view")
    if valid_shape is not None or dtype is not None:
        raise TraceError("pypto.view: valid_shape= and dtype= (reinterpretation) are not supported by pypto_lab")
    shape = list(x.shape) if shape is None else [int(s) for s in shape]
    offsets = [0] * len(shape) if offsets is None else [int(o) for o in offsets]
    if len(shape) != x.ndim or len(offsets) != x.ndim:
        raise ShapeError(f"view of a rank-{x.ndim} tensor needs {x.ndim} sizes and offsets; got shape {shape}, "
                         f"offsets {offsets}")
    for d, (o, s, n) in enumerate(zip(offsets, shape, x.shape)):
        if o < 0 or s <= 0 or o + s > n:
            raise ShapeError(f"view: dimension {d} takes {s} elements from offset {o} of a dimension of size {n}; "
                             f"the rule is 0 <= offset and offset + size <= {n}")
    if offsets == [0] * x.ndim and shape == x.shape:
        return x
    attrs = {"offsets": tuple(offsets)}
    reg = tr.gm_region(x._id)
    if reg is not None:
        attrs["root"] = reg[0]
        attrs["root_offsets"] = tuple(a + b for a, b in zip(reg[1], offsets))
    out = tr.new("view", [x._id], shape, x.dtype, attrs)
    return out


def assemble(input, offsets, out=None, parallel=False):
    """Write ``input`` into ``out`` at ``offsets``; or ``assemble([(x, offsets), ...], out)``."""
    if isinstance(input, list):
        dst = offsets
        for src, offs in input:
            assemble(src, offs, dst)
        return None
    tr = current_trace("pypto.assemble")
    src = _tensor(input, "assemble")
    dst = _tensor(out, "assemble")
    offsets = [int(o) for o in offsets]
    reg = tr.gm_region(dst._id)
    if reg is None:
        raise TraceError("assemble: the destination must be a kernel argument or a pypto.tensor (or a slice of one); "
                         "computed values cannot be written into")
    if src.ndim != dst.ndim or len(offsets) != dst.ndim:
        raise ShapeError(f"assemble: source shape {src.shape}, offsets {offsets} and destination shape {dst.shape} "
                         "must have the same rank")
    for d, (o, s, n) in enumerate(zip(offsets, src.shape, dst.shape)):
        if o < 0 or o + s > n:
            raise ShapeError(f"assemble: source of shape {src.shape} at offsets {offsets} does not fit the destination "
                             f"of shape {dst.shape} (dimension {d}: {o} + {s} > {n}). Fix the offsets or slice the source")
    if src.dtype is not dst.dtype:
        raise DTypeError(f"assemble: source dtype {src.dtype!r} differs from the destination's {dst.dtype!r}. "
                         f"Fix: pypto.cast(x, {dst.dtype!r}) before writing it")
    root, roff = reg
    abs_off = tuple(a + b for a, b in zip(roff, offsets))
    node = tr.new("assemble", [src._id, dst._id], src.shape, src.dtype, {"offsets": tuple(offsets), "root": root,
                                                                         "root_offsets": abs_off})
    tr.note_read(src._id, node._id)
    tr.note_write(root, abs_off, src.shape, node._id)
    return None


def tensor(shape, dtype=DT_FP32, name: str = "", format=None):
    """A new tensor in GM (inside a kernel: a buffer to write with assemble / slice assignment)."""
    tr = config.STATE.trace
    if tr is None:
        return Tensor(shape, dtype, name)
    shape = [dim_value(s) if not isinstance(s, int) else s for s in shape]
    return tr.new("alloc", [], shape, as_dtype(dtype), {"name": name or ""})


def matmul(input, mat2, out_dtype=None, *, a_trans=False, b_trans=False, c_matrix_nz=False, extend_params=None):
    """``input @ mat2`` on the Cube: ``(..., m, k) @ (..., k, n)``, inputs in their dtype, fp32
    accumulation, result in ``out_dtype`` (default: the input dtype; int32 for int8)."""
    tr = current_trace("pypto.matmul")
    a, b = _tensor(input, "matmul"), _tensor(mat2, "matmul")
    check_dtype_same("matmul", a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul: operands of shapes {a.shape} and {b.shape}; both need rank >= 2")
    if extend_params:
        raise TraceError("matmul: extend_params (bias, scales) are not supported by pypto_lab; add the bias with a "
                         "vector add after the matmul")
    m, ka = (a.shape[-1], a.shape[-2]) if a_trans else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if b_trans else (b.shape[-2], b.shape[-1])
    if ka != kb:
        raise BroadcastError(f"matmul: inner dimensions differ: {a.shape}{'ᵀ' if a_trans else ''} @ "
                             f"{b.shape}{'ᵀ' if b_trans else ''} has k = {ka} vs {kb}. Rule: (m, k) @ (k, n). "
                             "Fix: transpose an operand (a_trans=/b_trans=) or check the shapes")
    batch = broadcast_shapes("matmul (batch dimensions)", a.shape[:-2], b.shape[:-2])
    od = as_dtype(out_dtype, "matmul out dtype") if out_dtype is not None else (
        DT_INT32 if a.dtype.lab == "int8" else a.dtype)
    tile = config.STATE.cube_tile
    if tile is None:
        raise NoTileShapeError(
            f"matmul {list(a.shape)} @ {list(b.shape)} is traced before any cube tile shape is set. Rule: the Cube "
            "works on tiles set by pypto.set_cube_tile_shapes([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1]). Fix: call "
            "e.g. pypto.set_cube_tile_shapes([64, 64], [64, 256], [64, 64]) before it")
    from .tiling import check_cube_tile
    check_cube_tile(tr.chip, tile, a.dtype, m, ka, n, f"matmul {list(a.shape)} @ {list(b.shape)}")
    node = tr.new("matmul", [a._id, b._id], list(batch) + [m, n], od,
                  {"m": m, "k": ka, "n": n, "a_trans": bool(a_trans), "b_trans": bool(b_trans),
                   "in_dtype": a.dtype.name}, cube=True)
    tr.note_read(a._id, node._id)
    tr.note_read(b._id, node._id)
    return node
