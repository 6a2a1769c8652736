"""The operations of the PyPTO API (``pypto.add``, ``exp``, ``amax``, ``sum``, ``matmul``,
``transpose``, ``reshape``, ``cast``, ``view``, ``assemble``, ``tensor``, ``sigmoid``, ``softmax``,
``log``, ``erfc``, ``pow``, ``clip``, the rounding ops, comparisons, ``where``, ``full``,
``arange``, ``concat``, ``expand_clone``, ...): each checks its operands and the tile shape in
force, then records one node of the Tensor Graph (composite ops such as ``softmax``, ``clip`` and
``concat`` record the nodes they are made of)."""

from __future__ import annotations

import builtins
import functools
import math
import sys
import warnings

from . import config
from .dtypes import DT_BOOL, DT_FP32, DT_INT32, STORAGE_ONLY, SymbolicDim, as_dtype, dim_value
from .errors import (
    BroadcastError,
    DTypeError,
    NoTileShapeError,
    ScalarReadError,
    ShapeError,
    TileRankError,
    TraceError,
    ViewBeyondTensorWarning,
)
from .precision import PrecisionType, record
from .symbolic import SymbolicScalar, hint_of, is_symbolic
from .tensor import Tensor, bind_operators, check_dtype_same, current_trace
from .tiling import check_cube_tile, suggest_vec_tile

_SCALAR = (int, float)


def _vec_check(op: str, ref_shape, dtypes) -> None:
    """The rules of the vector tile shape in force for an op iterating ``ref_shape``.

    As in the real framework, tile size *i* applies to tensor axis *i* (clamped to the axis) and
    sizes beyond the tensor's rank are ignored (``ElementwiseInputVecTile`` in
    framework/src/interface/operation/tile_shape_resolver.cpp; the Tiled*Operation functions index
    ``vecTile[cur]`` for each tensor axis ``cur``). A tile with fewer sizes than the tensor has
    dimensions is refused, as ``TileShapeVerifier::VerifyTileShapeSize``
    (framework/src/interface/operation/tile_shape_verifier.h) refuses it. An innermost tile that
    is not a whole number of 32-byte blocks is legal: the real PadLocalBuffer pass
    (framework/src/passes/tile_graph_pass/graph_constraint/pad_local_buffer.cpp) pads the tile's
    last dimension in UB to 32 bytes, and `tiling` charges UB for the padded rows."""
    tile = config.STATE.vec_tile
    dt = dtypes[0]
    if not len(ref_shape):
        raise TileRankError(
            f"{op} on a single element (a rank-0 tensor, e.g. x[0, 0]). Rule: the Vector unit computes whole tiles "
            "of 1 to 4 dimensions, and an element has none. Fix: keep a one-element slice of the tensor's rank "
            "(x[0:1, 0:1]), or combine the element with a whole tensor (x * x[0, 0] broadcasts)")
    if tile is None:
        raise NoTileShapeError(
            f"{op} on a tensor of shape {list(ref_shape)} is traced before any vector tile shape is set. Rule: every "
            "vector operation is split into tiles of the shape set by pypto.set_vec_tile_shapes. Fix: call "
            f"pypto.set_vec_tile_shapes{suggest_vec_tile(ref_shape, dt)} before it")
    if len(tile) < len(ref_shape):
        raise TileRankError(
            f"{op}: the vector tile shape {tile} has rank {len(tile)} but the tensor it tiles has shape "
            f"{list(ref_shape)} (rank {len(ref_shape)}). Rule: the tile shape needs at least one size per tensor "
            "dimension: size i tiles tensor axis i, and sizes beyond the tensor's rank are ignored (the real "
            "framework's TileShapeVerifier refuses a tile shape shorter than the output's shape). "
            f"Fix: pypto.set_vec_tile_shapes{suggest_vec_tile(ref_shape, dt)} before this operation")


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


def _arith_check(op: str, *tensors) -> None:
    """Only DT_FP16/BF16/FP32 and DT_INT8/16/32 compute: every other dtype is storage only."""
    for t in tensors:
        if isinstance(t, Tensor) and t.dtype is not None and t.dtype.lab in STORAGE_ONLY:
            raise DTypeError(
                f"{op}: operand dtype {t.dtype!r} is storage only here. Rule: the Vector unit of the modelled chips "
                "computes in DT_FP16, DT_BF16, DT_FP32, DT_INT8, DT_INT16 or DT_INT32 (the other dtypes, e.g. DT_INT64, "
                "DT_UINT8/16/32/64, DT_BOOL, DT_DOUBLE and the 8-bit floats, can be loaded, stored, cast, compared into "
                "and selected with pypto.where). Fix: pypto.cast(x, pypto.DT_FP32) (or DT_INT32) first")


def _fscalar(v):
    """A tensor-scalar operand: a float, or a SymbolicScalar evaluated when the kernel runs."""
    if isinstance(v, SymbolicScalar):
        return float(v.args[0]) if v.kind == "imm" else v
    return float(v)


def _binary(op: str, a, b):
    from .element import Element

    a = a.value if isinstance(a, Element) else a   # pypto.Element(dtype, v): the scalar v
    b = b.value if isinstance(b, Element) else b
    if isinstance(a, _SCALAR + (SymbolicScalar,)) and isinstance(b, _SCALAR + (SymbolicScalar,)):
        return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op]
    tr = current_trace(f"pypto.{op}")
    _arith_check(op, a, b)
    if isinstance(b, _SCALAR + (SymbolicScalar,)):
        a = _tensor(a, op)
        _vec_check(op, a.shape, [a.dtype])
        kind = {"add": "adds", "sub": "subs", "mul": "muls", "div": "divs"}[op]
        out = tr.new(kind, [a._id], a.shape, a.dtype, {"scalar": _fscalar(b)}, vec=True)
        tr.note_read(a._id, out._id)
        return out
    if isinstance(a, _SCALAR + (SymbolicScalar,)):
        b = _tensor(b, op)
        _vec_check(op, b.shape, [b.dtype])
        kind = {"add": "adds", "sub": "rsubs", "mul": "muls", "div": "rdivs"}[op]
        out = tr.new(kind, [b._id], b.shape, b.dtype, {"scalar": _fscalar(a)}, vec=True)
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


def div(input, other, precision_type=PrecisionType.HIGH_PRECISION):
    return record(_binary("div", input, other), precision_type, PrecisionType.HIGH_PRECISION, "div")


def _minmax(op, a, b):
    tr = current_trace(f"pypto.{op}")
    if isinstance(b, _SCALAR) or isinstance(a, _SCALAR):
        x, s = (a, b) if isinstance(b, _SCALAR) else (b, a)
        return _scalar_op(op[:3] + "s", x, s)
    a, b = _tensor(a, op), _tensor(b, op)
    _arith_check(op, a, b)
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
    _arith_check(op, x)
    if float_only and x.dtype.lab not in ("fp16", "bf16", "fp32"):
        raise DTypeError(f"{op}: input dtype {x.dtype!r}; {op} takes DT_FP16, DT_BF16 or DT_FP32. "
                         f"Fix: pypto.cast(x, pypto.DT_FP32) first")
    _vec_check(op, x.shape, [x.dtype])
    out = tr.new(op, [x._id], x.shape, x.dtype, vec=True)
    tr.note_read(x._id, out._id)
    return out


def exp(input, precision_type=PrecisionType.INTRINSIC):
    return record(_unary("exp", input), precision_type, PrecisionType.INTRINSIC, "exp")


def sqrt(input, precision_type=PrecisionType.INTRINSIC):
    return record(_unary("sqrt", input), precision_type, PrecisionType.INTRINSIC, "sqrt")


def rsqrt(input, precision_type=PrecisionType.INTRINSIC):
    return record(_unary("rsqrt", input), precision_type, PrecisionType.INTRINSIC, "rsqrt")


def reciprocal(input, precision_type=PrecisionType.HIGH_PRECISION):
    return record(_unary("reciprocal", input), precision_type, PrecisionType.HIGH_PRECISION, "reciprocal")


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
    _arith_check(op, x)
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
    """``input`` converted to ``dtype``: the rounding of ``mode`` (`CastMode`; ``CAST_NONE``, the
    default, is TRUNC from a float to an integer and RINT otherwise) and, to an integer, the overflow
    rule of ``satmode`` (`SaturationMode`: OFF wraps, ON clamps). `cast_rules` has the details."""
    from .enums import CastMode, SaturationMode

    tr = current_trace("pypto.cast")
    x = _tensor(input, "cast")
    dt = as_dtype(dtype, "cast dtype")
    if mode is not None and not isinstance(mode, CastMode):
        raise DTypeError(f"pypto.cast(..., mode={mode!r}): not a CastMode. Rule: mode is one of pypto.CastMode "
                         f"({', '.join(m.name for m in CastMode)}). Fix: e.g. mode=pypto.CastMode.CAST_RINT")
    if satmode is not None and not isinstance(satmode, SaturationMode):
        raise DTypeError(f"pypto.cast(..., satmode={satmode!r}): not a SaturationMode. Rule: satmode is "
                         "pypto.SaturationMode.OFF or .ON. Fix: satmode=pypto.SaturationMode.ON to clamp")
    explicit = mode is not None and mode is not CastMode.CAST_NONE
    if dt is x.dtype and not (explicit and dt.torch.is_floating_point):
        return x
    _vec_check("cast", x.shape, [x.dtype, dt])
    attrs = {"src": x.dtype.name}
    if mode is not None:
        attrs["mode"] = mode
    if satmode is not None:
        attrs["satmode"] = satmode
    out = tr.new("cast", [x._id], x.shape, dt, attrs, vec=True)
    tr.note_read(x._id, out._id)
    return out


def transpose(input, dim0=-2, dim1=-1):
    """Swap two axes (a data movement on the Vector unit; its tile shape is that of the input).

    ``transpose(x, [0, 1, 3, 2])`` (a permutation of all axes, as the real API also takes) moves
    every axis at once."""
    tr = current_trace("pypto.transpose")
    x = _tensor(input, "transpose")
    if isinstance(dim0, (list, tuple)):
        perm = [int(d) % x.ndim if -x.ndim <= int(d) < x.ndim else -1 for d in dim0]
        if sorted(perm) != list(range(x.ndim)):
            raise ShapeError(f"transpose: {list(dim0)} is not a permutation of the {x.ndim} axes of a tensor of shape "
                             f"{x.shape}. Rule: every axis 0..{x.ndim - 1} appears once. Fix: e.g. "
                             f"{list(range(x.ndim - 2)) + [x.ndim - 1, x.ndim - 2]} swaps the last two")
        moved = [d for d in range(x.ndim) if perm[d] != d]
        if not moved:
            return x
        if len(moved) == 2:
            dim0, dim1 = moved
        else:
            _vec_check("transpose", x.shape, [x.dtype])
            out = tr.new("transpose", [x._id], [x.shape[d] for d in perm], x.dtype, {"perm": tuple(perm)}, vec=True)
            tr.note_read(x._id, out._id)
            return out
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
    if valid_shape is not None:
        if len(valid_shape) != len(shape):
            raise ShapeError(f"reshape: valid_shape {list(valid_shape)} for shape {list(shape)}. Rule: one valid size "
                             "per axis of the new shape")
        # the valid part of the result (what a view with a valid shape holds, reshaped), applied when
        # the kernel runs
        attrs["valid_shape"] = tuple(v if is_symbolic(v) else int(_as_int(v)) for v in valid_shape)
    reg = tr.gm_region(x._id)
    out = tr.new("reshape", [x._id], shape, x.dtype, attrs)
    xn = tr.graph.nodes[x._id]
    if reg is not None and reg[0] == x._id and not attrs:
        # a whole GM tensor reshaped (in place or not, it is the same memory seen with another
        # shape: the real framework writes through it): writes into it land in the original
        tr.aliases[out._id] = tr.aliases.get(x._id, x._id) if xn.op == "reshape" else x._id
    elif reg is not None:
        tr.note_read(x._id, out._id)
    return out


def view(input, shape=None, offsets=None, *, valid_shape=None, dtype=None):
    """A window of ``input``: ``shape`` elements from ``offsets`` (``x[a:b, ...]`` is a view)."""
    tr = current_trace("pypto.view")
    x = _tensor(input, "view")
    if dtype is not None:
        if shape is not None or offsets is not None or valid_shape is not None:
            x = view(x, shape, offsets, valid_shape=valid_shape)
        return _reinterpret(tr, x, as_dtype(dtype, "view dtype"))
    shape = list(x.shape) if shape is None else [int(_as_int(s)) for s in shape]
    offsets = [0] * len(shape) if offsets is None else [_offset(o) for o in offsets]
    if valid_shape is not None:
        _valid(shape, valid_shape, "view")   # checked; the view keeps its shape, its valid part is recorded
    if len(shape) != x.ndim or len(offsets) != x.ndim:
        raise ShapeError(f"view of a rank-{x.ndim} tensor needs {x.ndim} sizes and offsets; got shape {shape}, "
                         f"offsets {offsets}")
    run_valid = valid_of(valid_shape, shape)
    implicit = {}
    for d, (o, s, n) in enumerate(zip(offsets, shape, x.shape)):
        h = hint_of(o)
        v = run_valid[d] if run_valid is not None else None
        if v is None and h is not None and 0 <= h < n and h + s > n:
            # a window reaching past the end of the tensor (the DeepSeek-V4 sparse attention views
            # 1,024 block-table entries of a row of 16): the real framework takes it; only the part
            # inside the tensor holds data (on the NPU the rest is whatever memory follows), so that
            # part is the view's valid part
            implicit[d] = n - o
            continue
        # a valid size read from tensor data bounds the window instead of the shape (the real
        # framework moves only the valid part: a 256-row view of which 128 rows are valid may start
        # 128 rows before the end); it is checked again when the kernel runs
        s_used = s if v is None else hint_of(v)
        if s <= 0 or (h is not None and s_used is not None and (h < 0 or h + builtins.min(s, s_used) > n)):
            at = f"{o} (= {h} in the iteration traced)" if is_symbolic(o) else f"{o}"
            raise ShapeError(f"view: dimension {d} takes {s} elements from offset {at} of a dimension of size {n}; "
                             f"the rule is 0 <= offset and offset + size <= {n}"
                             + (" (the size being the valid size when that is known only at run time)" if v is not None
                                else ""))
    if implicit:
        run_valid = tuple(implicit.get(d, run_valid[d] if run_valid is not None else None) for d in range(len(shape)))
        warnings.warn(ViewBeyondTensorWarning(
            f"view of {list(shape)} at offsets {[str(o) for o in offsets]} reaches past the end of a tensor of shape "
            f"{list(x.shape)} on axes {sorted(implicit)} ({tr.where()}): only the part inside the tensor holds data "
            "(its valid part); ops after it compute on that part. If this is not intended, shrink the view"),
            stacklevel=2)
    attrs = {"offsets": tuple(offsets)}
    if run_valid is not None:
        attrs["valid_shape"] = run_valid
    elif all(not is_symbolic(o) and o == 0 for o in offsets) and shape == x.shape:
        return x
    reg = tr.gm_region(x._id)
    if reg is not None:
        attrs["root"] = reg[0]
        attrs["root_offsets"] = tuple(a + b for a, b in zip(reg[1], offsets))
    out = tr.new("view", [x._id], shape, x.dtype, attrs)
    return out


def _reinterpret(tr, x, dt):
    """``pypto.view(x, dtype=dt)``: the bytes of each row read as ``dt`` (the last axis scales by the
    ratio of the element sizes, as in the docs' fp32 -> int8 example); a copy through UB here."""
    if dt is x.dtype:
        return x
    last = x.shape[-1] * x.dtype.bytes
    if last % dt.bytes:
        raise ShapeError(f"pypto.view(dtype={dt!r}): a row of {x.shape[-1]} {x.dtype!r} is {last} bytes, not whole "
                         f"{dt!r} elements ({dt.bytes} bytes each). Rule: the last axis's bytes divide by the new "
                         "element size. Fix: view a wider or narrower slice first")
    shape = list(x.shape[:-1]) + [last // dt.bytes]
    out = tr.new("bitcast", [x._id], shape, dt, {"rows": True})
    tr.note_read(x._id, out._id)
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
    offsets = [_offset(o) for o in offsets]
    reg = tr.gm_region(dst._id)
    if reg is None:
        through = _squeezed_gm(tr, dst)
        if through is not None:   # x[b, n] of a GM tensor, squeezed: write into that GM window
            base, keep = through
            full_off = [0] * base.ndim
            full_shape = [1] * base.ndim
            for k, d in enumerate(keep):
                full_off[d] = offsets[k] if k < len(offsets) else 0
                full_shape[d] = src.shape[k]
            return assemble(reshape(src, full_shape), full_off, base)
        return _assemble_into_value(tr, src, offsets, dst)
    if src.ndim != dst.ndim or len(offsets) != dst.ndim:
        raise ShapeError(f"assemble: source shape {src.shape}, offsets {offsets} and destination shape {dst.shape} "
                         "must have the same rank")
    partial = src._id in tr.partial   # holds its valid part only, known when the kernel runs: checked then
    for d, (o, s, n) in enumerate(zip(offsets, src.shape, dst.shape)):
        o = hint_of(o)
        if o is not None and (o < 0 or (o + s > n and not partial)):
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


def _squeezed_gm(tr, dst):
    """(the GM view, its axes dst keeps) when ``dst`` is a reshape of a view of GM that only drops
    axes of size 1 (``states[b, n]`` of a [B, N, D, D] argument): the same memory, written through."""
    n = tr.graph.nodes[dst._id]
    if n.op != "reshape" or n.attrs:
        return None
    src_id = n.inputs[0]
    if tr.gm_region(src_id) is None:
        return None
    shape = tr.graph.nodes[src_id].shape
    keep = [d for d, s in enumerate(shape) if s != 1]
    if [shape[d] for d in keep] != [s for s in n.shape if s != 1] or len(n.shape) != len(keep):
        return None
    return Tensor._bound(tr, src_id), keep


def _assemble_into_value(tr, src, offsets, dst):
    """``assemble`` into a tensor the kernel computed (not GM): as in the real framework, where a
    logical tensor can be written in place (``last_state[:] = cur_state`` in Qwen3-Next), the handle
    ``dst`` then denotes the written tensor: an ``update`` node (dst with the window replaced), which
    every later use of that pypto.Tensor object reads."""
    if src.ndim != dst.ndim or len(offsets) != dst.ndim:
        raise ShapeError(f"assemble: source shape {src.shape}, offsets {offsets} and destination shape {dst.shape} "
                         "must have the same rank")
    if src.dtype is not dst.dtype:
        raise DTypeError(f"assemble: source dtype {src.dtype!r} differs from the destination's {dst.dtype!r}. "
                         f"Fix: pypto.cast(x, {dst.dtype!r}) before writing it")
    for d, (o, s_, n_) in enumerate(zip(offsets, src.shape, dst.shape)):
        h = hint_of(o)
        if h is not None and (h < 0 or (h + s_ > n_ and src._id not in tr.partial)):
            raise ShapeError(f"assemble: source of shape {src.shape} at offsets {offsets} does not fit the destination "
                             f"of shape {dst.shape} (dimension {d}: {h} + {s_} > {n_}). Fix the offsets or slice the "
                             "source")
    if tr.sym_loops and dst._id < tr.sym_loops[-1].node:
        return _assemble_carried(tr, src, offsets, dst)
    out = tr.new("update", [dst._id, src._id], dst.shape, dst.dtype, {"offsets": tuple(offsets)}, vec=True)
    dst._trace, dst._id = out._trace, out._id
    return None


def _assemble_carried(tr, src, offsets, dst):
    """``acc[:] = pypto.add(acc, part)`` in the body of a symbolic loop (traced once), ``acc`` computed
    before the loop (``pypto.full``): a value carried from iteration to iteration. As in the real
    framework, where the body is one function and a tensor it writes that lives outside it is memory
    the iterations share, ``acc`` becomes a buffer (its value lives in GM: `graph.carried`) and the
    write an ``assemble`` into it; each iteration reads what the previous one wrote, and what follows
    the loop reads the last write. Such a loop runs iteration by iteration (`batched.plan`)."""
    tr.graph.carried.add(dst._id)
    node = tr.new("assemble", [src._id, dst._id], src.shape, src.dtype,
                  {"offsets": tuple(offsets), "root": dst._id, "root_offsets": tuple(offsets), "carried": True})
    tr.note_read(src._id, node._id)
    return None


def tensor(shape=None, dtype=None, name: str = "", format=None, data_ptr=None, device=None, ori_shape=None):
    """A new tensor in GM (inside a kernel: a buffer to write with assemble / slice assignment).
    Outside a kernel it is an annotation as ``pypto.Tensor(shape, dtype)`` (``pypto.tensor()``: any
    shape and dtype)."""
    tr = config.STATE.trace
    if tr is None:
        return Tensor(shape, dtype, name, format, data_ptr, device, ori_shape)
    if shape is None:
        raise ShapeError("pypto.tensor() inside a kernel has no shape. Rule: a tensor made while tracing is a GM "
                         "buffer of a given shape (pypto.tensor() without arguments is an annotation only). Fix: "
                         "pypto.tensor([m, n], pypto.DT_FP32)")
    dtype = DT_FP32 if dtype is None else dtype
    shape = [dim_value(s) if not isinstance(s, int) else s for s in shape]
    return tr.new("alloc", [], shape, as_dtype(dtype), {"name": name or ""})


MATMUL_EPILOGUE: list = [None]  # set by ops_quant (which imports this module): matmul with scale / relu_type


def matmul(input, mat2, out_dtype=None, *, a_trans=False, b_trans=False, c_matrix_nz=False, extend_params=None):
    """``input @ mat2`` on the Cube: ``(..., m, k) @ (..., k, n)``, inputs in their dtype, fp32
    accumulation, result in ``out_dtype`` (default: the input dtype; int32 for int8)."""
    tr = current_trace("pypto.matmul")
    a, b = _tensor(input, "matmul"), _tensor(mat2, "matmul")
    check_dtype_same("matmul", a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul: operands of shapes {a.shape} and {b.shape}; both need rank >= 2")
    bias = None
    epilogue = {k: v for k, v in (extend_params or {}).items() if k in ("scale", "scale_tensor", "relu_type")}
    if epilogue:  # dequant / quant on the way out of L0C: ops_quant.matmul_with_epilogue registers itself here
        rest = {k: v for k, v in extend_params.items() if k not in epilogue}
        return MATMUL_EPILOGUE[0](input, mat2, out_dtype, epilogue, a_trans=a_trans, b_trans=b_trans,
                                  c_matrix_nz=c_matrix_nz, extend_params=rest or None)
    if extend_params:
        unknown = sorted(k for k in extend_params if k != "bias_tensor")
        if unknown:
            raise TraceError(f"matmul: extend_params keys {unknown} are not supported by pypto_lab; 'bias_tensor', "
                             "'scale', 'scale_tensor' and 'relu_type' are. Fix: apply them with vector ops after the "
                             "matmul")
        bias = extend_params.get("bias_tensor")
        if bias is not None:
            bias = _tensor(bias, "matmul bias_tensor")
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
    check_cube_tile(tr.chip, tile, a.dtype, m, ka, n, f"matmul {list(a.shape)} @ {list(b.shape)}", a_trans=bool(a_trans))
    inputs = [a._id, b._id]
    if bias is not None:
        if bias.shape[-1] != n or math.prod(bias.shape) != n:
            raise ShapeError(f"matmul: bias_tensor of shape {bias.shape} for an output with n = {n} columns. Rule: "
                             f"the bias holds one value per output column, shape [{n}] or [1, {n}]. Fix: "
                             f"pypto.reshape(bias, [1, {n}]) or slice it")
        inputs.append(bias._id)
    node = tr.new("matmul", inputs, list(batch) + [m, n], od,
                  {"m": m, "k": ka, "n": n, "a_trans": bool(a_trans), "b_trans": bool(b_trans),
                   "in_dtype": a.dtype.name, "bias": bias is not None}, cube=True)
    for i in inputs:
        tr.note_read(i, node._id)
    return node


# ---- element-wise ops beyond the arithmetic operators ------------------------------------------
# Each records one Tensor Graph node; `schedule` maps it to the chip's VECTOR instructions (or a
# documented composition of them) and `execute` computes it in the declared dtype.

def _scalar_op(kind: str, x, s):
    """A tensor op with a Python scalar operand (``maxs``, ``mins``, ``pows``, ...)."""
    tr = current_trace(f"pypto.{kind}")
    x = _tensor(x, kind)
    _arith_check(kind, x)
    _vec_check(kind, x.shape, [x.dtype])
    out = tr.new(kind, [x._id], x.shape, x.dtype, {"scalar": float(s)}, vec=True)
    tr.note_read(x._id, out._id)
    return out


def _nary(op: str, tensors, dtype, attrs=None, check_dtype=True):
    """An element-wise node over broadcast tensor operands."""
    tr = current_trace(f"pypto.{op}")
    tensors = [_tensor(t, op) for t in tensors]
    if check_dtype:
        for t in tensors[1:]:
            check_dtype_same(op, tensors[0], t)
    shape = tensors[0].shape
    for t in tensors[1:]:
        shape = broadcast_shapes(op, shape, t.shape)
    _vec_check(op, shape, [t.dtype for t in tensors] + [dtype])
    out = tr.new(op, [t._id for t in tensors], shape, dtype, attrs or {}, vec=True)
    for t in tensors:
        tr.note_read(t._id, out._id)
    return out


def sigmoid(input):
    """``1 / (1 + exp(-x))`` (VMULS, VEXP, VADDS, VREC on the Vector unit)."""
    return _unary("sigmoid", input)


def log(input, precision_type=PrecisionType.INTRINSIC):
    """Natural logarithm (VLN)."""
    return record(_unary("log", input), precision_type, PrecisionType.INTRINSIC, "log")


def expm1(input):
    """``exp(x) - 1`` (VEXP, VADDS)."""
    return _unary("expm1", input)


def erf(input):
    """The error function: a rational polynomial on the Vector unit (no VERF instruction; see schedule)."""
    return _unary("erf", input)


def erfc(input):
    """``1 - erf(x)`` (erf's polynomial, then VMULS and VADDS)."""
    return _unary("erfc", input)


def ceil(input):
    return _unary("ceil", input)


def floor(input):
    return _unary("floor", input)


def trunc(input):
    return _unary("trunc", input)


def round(input, decimals: int = 0):
    """Round half to even (as torch.round), with ``decimals`` digits after the point."""
    if decimals:
        scale = 10.0 ** int(decimals)
        return div(_unary("round", mul(input, scale)), scale)
    return _unary("round", input)


def pow(input, exponent, precision_type=PrecisionType.HIGH_PRECISION):
    """``input ** exponent`` for a tensor and a tensor or Python scalar (VLN, VMUL(S), VEXP; a scalar
    exponent 2 is one VMUL)."""
    return record(_pow(input, exponent), precision_type, PrecisionType.HIGH_PRECISION, "pow")


def _pow(input, exponent):
    if isinstance(exponent, _SCALAR):
        if isinstance(input, _SCALAR):
            return input ** exponent
        x = _tensor(input, "pow")
        if x.dtype.lab not in ("fp16", "bf16", "fp32"):
            raise DTypeError(f"pow: input dtype {x.dtype!r}; pow takes DT_FP16, DT_BF16 or DT_FP32. "
                             "Fix: pypto.cast(x, pypto.DT_FP32) first")
        return _scalar_op("pows", x, exponent)
    _arith_check("pow", input, exponent)
    return _nary("pow", [input, exponent], _tensor(input, "pow").dtype)


def clip(input, min=None, max=None):
    """``min(max(input, min), max)``; ``min`` / ``max`` are tensors (broadcast) or Python scalars
    (VMAX / VMIN or VMAXS / VMINS)."""
    if min is None and max is None:
        raise TraceError("clip: give min=, max= or both (a tensor or a Python scalar)")
    x = input
    if min is not None:
        x = maximum(x, min)
    if max is not None:
        x = minimum(x, max)
    return x


def softmax(input, dim=-1):
    """``exp(x - max) / sum(exp(x - max))`` along ``dim``: amax, sub, exp, sum, div recorded as one
    row program that the Tile Graph fuses into a single vector group (the row stays in UB). Like the
    real framework's decomposition, an fp16/bf16 input is cast to fp32 first and the result cast back."""
    x = _tensor(input, "softmax")
    if x.dtype.lab not in ("fp16", "bf16", "fp32"):
        raise DTypeError(f"softmax: input dtype {x.dtype!r}; softmax takes DT_FP32 (the real API) or DT_FP16 / "
                         "DT_BF16 here. Fix: pypto.cast(x, pypto.DT_FP32) first")
    d = _norm_dim("softmax", dim, x.ndim)
    # As the real pypto.softmax (python/pypto/operator.py): computed in fp32, cast back at the end.
    xf = x if x.dtype.lab == "fp32" else cast(x, DT_FP32)
    e = exp(sub(xf, amax(xf, d, keepdim=True)))
    y = div(e, sum(e, d, keepdim=True))
    return y if x.dtype.lab == "fp32" else cast(y, x.dtype)


# ---- comparisons, logical ops, selection -------------------------------------------------------

def _compare(mode: str, input, other):
    for t in (input, other):
        if isinstance(t, Tensor) and t.is_bound and not t.shape:  # `if x[0, 0] > 0:`
            raise ScalarReadError(
                f"comparing {t._describe()}, a single element, with {mode}: the result would have to be a Python "
                "bool to branch on, but a traced tensor holds no data yet (its values exist only when the compiled "
                "kernel runs). Rule: a kernel's control flow depends on Python values (shapes, loop indices, "
                "arguments), never on tensor data. Fix: compute both branches and choose per element with "
                "pypto.where(x[0:1, 0:1] > 0, a, b), or read the value in torch before the call and pass the "
                "decision as a Python argument")
    if isinstance(other, _SCALAR) and isinstance(input, Tensor):
        x = _tensor(input, mode)
        tr = current_trace(f"pypto.{mode}")
        _vec_check(mode, x.shape, [x.dtype, DT_BOOL])
        out = tr.new("cmps", [x._id], x.shape, DT_BOOL, {"mode": mode, "scalar": float(other)}, vec=True)
        tr.note_read(x._id, out._id)
        return out
    if isinstance(input, _SCALAR):
        flip = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[mode]
        return _compare(flip, other, input)
    return _nary("cmp", [input, other], DT_BOOL, {"mode": mode})


def eq(input, other):
    """``input == other`` element-wise, a DT_BOOL tensor (VCMPV / VCMPVS)."""
    return _compare("eq", input, other)


def ne(input, other):
    return _compare("ne", input, other)


def lt(input, other):
    return _compare("lt", input, other)


def le(input, other):
    return _compare("le", input, other)


def gt(input, other):
    return _compare("gt", input, other)


def ge(input, other):
    return _compare("ge", input, other)


def logical_and(input, other):
    """Element-wise AND of two tensors (non-zero is true), a DT_BOOL tensor (VAND)."""
    return _nary("logical_and", [input, other], DT_BOOL, check_dtype=False)


def logical_not(input):
    """Element-wise NOT (zero is true), a DT_BOOL tensor (VNOT)."""
    return _nary("logical_not", [input], DT_BOOL)


def where(condition, input, other):
    """``input`` where ``condition`` is true, else ``other`` (VSEL). ``input`` / ``other`` are
    tensors or Python scalars; shapes broadcast."""
    cond = _tensor(condition, "where")
    tensors, attrs = [cond], {}
    dt = None
    for name, v in (("x", input), ("y", other)):
        if isinstance(v, _SCALAR):
            attrs[name] = float(v)
        else:
            v = _tensor(v, "where")
            tensors.append(v)
            if dt is not None and v.dtype is not dt:
                raise DTypeError(f"where: input and other have dtypes {dt!r} and {v.dtype!r}; they must agree. "
                                 f"Fix: pypto.cast(other, {dt!r})")
            dt = v.dtype
    return _nary("where", tensors, dt or DT_FP32, attrs, check_dtype=False)


# ---- tensor creation ---------------------------------------------------------------------------

def _scalar_value(v, what: str):
    if isinstance(v, SymbolicDim):
        v = dim_value(v)
    if hasattr(v, "value") and not isinstance(v, (int, float)):  # an Element-like object
        v = v.value
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v
    raise TraceError(f"{what}: {v!r} is not a number; give an int or a float")


def _valid(shape, valid_shape, op):
    """The shape a tensor with ``valid_shape`` has in the Tensor Graph: its valid part where that is
    known while tracing; where it depends on tensor data (``(seq_len[b] - i * t).min(t)``) the full
    size, an upper bound the tiles and the cost use, the valid size being applied when the kernel
    runs (see `valid_of`)."""
    if len(valid_shape) != len(shape):
        raise ShapeError(f"{op}: valid_shape {list(valid_shape)} for shape {list(shape)}. Rule: one valid size per "
                         "axis. Fix: pypto.min(tile, size - offset) per axis")
    vs = [s if is_symbolic(v) else int(_as_int(v)) for v, s in zip(valid_shape, shape)]
    if any(v <= 0 or v > s for v, s in zip(vs, shape)):
        raise ShapeError(f"{op}: valid_shape {vs} for shape {list(shape)}. Rule: same rank, 0 < valid <= size on "
                         "every axis. Fix: pypto.min(tile, size - offset) per axis")
    return vs


def valid_of(valid_shape, shape=None):
    """The valid sizes to record on a node: per axis a SymbolicScalar (known when the kernel runs),
    an int smaller than the axis (known now), or None (the whole axis); None when the whole
    tensor is valid. A tensor with a valid part holds only that part when the kernel runs (the
    real tile computes on its valid shape; beyond it, memory is undefined)."""
    if valid_shape is None:
        return None
    out = []
    for d, v in enumerate(valid_shape):
        if is_symbolic(v):
            out.append(v)
        else:
            iv = int(_as_int(v))
            out.append(iv if shape is not None and iv < shape[d] else None)
    return tuple(out) if any(v is not None for v in out) else None


def full(size, fill_value, dtype=None, *, valid_shape=None):
    """A tensor of ``size`` filled with ``fill_value`` (VECTORDUP), of ``dtype`` (default: DT_INT32
    for an int, DT_FP32 for a float). With ``valid_shape`` the tensor is its valid part (shapes are
    concrete here, as for ``view``)."""
    tr = current_trace("pypto.full")
    v = _scalar_value(fill_value, "full fill_value")
    dt = as_dtype(dtype, "full dtype") if dtype is not None else (
        DT_BOOL if isinstance(v, bool) else DT_INT32 if isinstance(v, int) else DT_FP32)
    shape = [dim_value(s) if not isinstance(s, int) else s for s in size]
    attrs = {"value": float(v)}
    if valid_shape is not None:
        _valid(shape, valid_shape, "full")
        run_valid = valid_of(valid_shape, shape)
        if run_valid is not None:   # the tensor holds its valid part (known now or when the kernel runs)
            attrs["valid_shape"] = run_valid
    _vec_check("full", shape, [dt])
    return tr.new("full", [], shape, dt, attrs, vec=True)


def zeros(size, dtype=DT_FP32, *, valid_shape=None):
    """``full(size, 0, dtype)``."""
    return full(size, 0, dtype, valid_shape=valid_shape)


def ones(size, dtype=DT_FP32, *, valid_shape=None):
    return full(size, 1, dtype, valid_shape=valid_shape)


def arange(start=0, end=None, step=1, dtype=None):
    """The 1-D tensor ``start, start + step, ...`` below ``end`` (``arange(n)`` is ``0..n-1``):
    DT_INT32 if all three are ints, else DT_FP32, computed on the Vector unit as index * step +
    start in that dtype (VECTORDUP, VMULS, VADDS)."""
    tr = current_trace("pypto.arange")
    if end is None:
        start, end = 0, start
    start, end, step = (_scalar_value(v, "arange") for v in (start, end, step))
    if step == 0 or (end - start) / step <= 0:
        raise ShapeError(f"arange({start}, {end}, {step}): the rule is step != 0 and (end - start) / step > 0. "
                         "Fix the bounds or the sign of step")
    n = int(math.ceil((end - start) / step))
    ints = all(isinstance(v, int) for v in (start, end, step))
    dt = as_dtype(dtype, "arange dtype") if dtype is not None else (DT_INT32 if ints else DT_FP32)
    _vec_check("arange", [n], [dt])
    return tr.new("arange", [], [n], dt, {"start": float(start), "step": float(step)}, vec=True)


# ---- layout ------------------------------------------------------------------------------------

def expand_clone(input, shape, *, valid_shape=None):
    """``input`` broadcast along its size-1 axes to ``shape``, as a new tensor (VBRCB / VCOPY)."""
    x = _tensor(input, "expand_clone")
    shape = [dim_value(s) if not isinstance(s, int) else s for s in shape]
    if valid_shape is not None:
        shape = _valid(shape, valid_shape, "expand_clone")
    if len(shape) != x.ndim or any(s != t and s != 1 for s, t in zip(x.shape, shape)):
        raise BroadcastError(f"expand_clone: shape {x.shape} cannot expand to {shape}. Rule: same rank, and only "
                             "axes of size 1 grow. Fix: reshape the input so that the axes to grow have size 1")
    tr = current_trace("pypto.expand_clone")
    _vec_check("expand_clone", shape, [x.dtype])
    out = tr.new("expand", [x._id], shape, x.dtype, vec=True)
    tr.note_read(x._id, out._id)
    return out


def concat(tensors, dim: int = 0):
    """The tensors joined along ``dim``: a GM tensor that each input is assembled into (MTE2/MTE3
    copies, or the stores of the vector groups that compute the inputs)."""
    ts = [_tensor(t, "concat") for t in tensors]
    if not ts:
        raise TraceError("concat: give a list of at least one tensor")
    d = _norm_dim("concat", dim, ts[0].ndim)
    for t in ts[1:]:
        check_dtype_same("concat", ts[0], t)
        if t.ndim != ts[0].ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape)) if i != d):
            raise ShapeError(f"concat along dim {d}: shapes {[x.shape for x in ts]}. Rule: same rank and equal sizes "
                             "on every other axis. Fix: slice or reshape the inputs")
    shape = list(ts[0].shape)
    shape[d] = builtins.sum(t.shape[d] for t in ts)
    out = tensor(shape, ts[0].dtype, "concat")
    off = 0
    for t in ts:
        offsets = [0] * len(shape)
        offsets[d] = off
        assemble(t, offsets, out)
        off += t.shape[d]
    return out


# ---- scalar helpers of the real API ------------------------------------------------------------

def _as_int(v):
    return dim_value(v) if isinstance(v, SymbolicDim) else v


def _offset(o):
    """An offset: an int, or a SymbolicScalar evaluated when the kernel runs."""
    if isinstance(o, SymbolicScalar):
        return o.args[0] if o.kind == "imm" else o
    return int(_as_int(o))


def min(*args):
    """``pypto.min(a, b, ...)``: the smallest of scalars / symbolic sizes (e.g. the valid length of
    a tail tile). For tensors use pypto.minimum (element-wise) or pypto.amin (a reduction)."""
    if any(isinstance(a, Tensor) for a in args):
        raise TraceError("pypto.min takes scalars (ints, symbolic sizes); for tensors use pypto.minimum(a, b) "
                         "(element-wise) or pypto.amin(x, dim) (a reduction)")
    vals = [_as_int(a) for a in (args[0] if len(args) == 1 else args)]
    if any(isinstance(v, SymbolicScalar) for v in vals):
        return functools.reduce(lambda a, b: SymbolicScalar(a).min(b) if isinstance(a, int) else a.min(b), vals)
    return builtins.min(vals)


def max(*args):
    """``pypto.max(a, b, ...)``: the largest of scalars / symbolic sizes (see pypto.min)."""
    if any(isinstance(a, Tensor) for a in args):
        raise TraceError("pypto.max takes scalars (ints, symbolic sizes); for tensors use pypto.maximum(a, b) "
                         "(element-wise) or pypto.amax(x, dim) (a reduction)")
    vals = [_as_int(a) for a in (args[0] if len(args) == 1 else args)]
    if any(isinstance(v, SymbolicScalar) for v in vals):
        return functools.reduce(lambda a, b: SymbolicScalar(a).max(b) if isinstance(a, int) else a.max(b), vals)
    return builtins.max(vals)


bind_operators(sys.modules[__name__])  # Tensor's operators (x + y, x[...], ...) call this library
