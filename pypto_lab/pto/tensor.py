"""The traced tensor: ``pypto.Tensor`` as an annotation (``Tensor[...]``, ``Tensor(shape, dtype)``)
and as the proxy value a kernel computes with while it is traced (operators, slicing, slice
assignment, ``move``), plus the trace context that records every operation into the Tensor Graph.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

import numpy as np

from . import config, loops
from .dtypes import (
    CONVERTIBLE_SET,
    DYNAMIC,
    STATIC,
    DataType,
    StatusType,
    SymbolicDim,
    TileOpFormat,
    as_dtype,
    check_representable,
    dim_value,
)
from .errors import (
    DTypeError,
    InPlaceUpdateWarning,
    LoopError,
    ScalarReadError,
    ShapeError,
    TraceError,
    UnwrittenOutputError,
)
from .graph import TensorGraph
from .symbolic import ConcreteScalar, SymbolicScalar, hint_of, is_symbolic

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def _where() -> str:
    """file:line of the user code that called into the tracer."""
    f = sys._getframe(2)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PKG_DIR:
        f = f.f_back
    if f is None:
        return ""
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


class Trace:
    """Records one kernel call into a `TensorGraph` (the state of `pypto.jit` while it traces)."""

    def __init__(self, name: str, chip):
        self.graph = TensorGraph(name)
        self.chip = chip
        self.loops: list[str] = []
        self.events: list[tuple] = []   # ("r"|"w", root, offsets, shape, node id, where) for GM roots
        self.sym_loops: list = []       # symbolic loops whose bodies are being traced (loops.LoopFrame)
        self.bodies: list[tuple] = []   # (lo, hi, loop node) of every traced symbolic loop body
        self.sym_roots: set[int] = set()  # GM roots accessed at symbolic offsets (not checked at trace time)
        self.scalar_roots: set[int] = set()  # GM roots read element by element as SymbolicScalars
        self.data: dict = {}   # param node id -> the first call's tensor (hints of scalar reads)
        # tensors that may hold only part of their shape when the kernel runs: a view (or reshape)
        # whose valid_shape is read from tensor data, and everything computed from one
        self.partial: set[int] = set()
        self.aliases: dict[int, int] = {}   # in-place reshape node -> the param / alloc it reshapes
        self.kernel_guards: list = []
        self.inplace_warned: set[int] = set()   # conditions on argument data this trace assumed (`loops.record_kernel_guard`)

    def read_hint(self, tid: int, ix: tuple, expr=None):
        """The value a scalar read has in the call being traced (its hint), or None."""
        t = self.data.get(tid)
        if t is None:
            return None
        try:
            if isinstance(ix[0] if ix else None, np.ndarray) or any(isinstance(i, np.ndarray) for i in ix):
                arrs = np.broadcast_arrays(*[np.asarray(i) for i in ix])
                ok = np.all([(a >= 0) & (a < n) for a, n in zip(arrs, t.shape)], axis=0)
                out = np.zeros(arrs[0].shape, np.int64)
                sel = tuple(a[ok] for a in arrs)
                out[ok] = t.numpy()[sel].astype(np.int64)
                return out
            if any(not 0 <= int(i) < n for i, n in zip(ix, t.shape)):
                return None
            return int(t[tuple(int(i) for i in ix)])
        except (TypeError, ValueError, RuntimeError):
            return None

    @staticmethod
    def where() -> str:
        """file:line of the user code being traced."""
        return _where()

    def close_body(self, loop: int, lo: int, hi: int) -> None:
        self.bodies.append((lo, hi, loop))

    def _check_body_values(self, inputs) -> None:
        """A value computed in a symbolic loop's body exists per iteration: it cannot be used after
        the body (after the loop, or in the next traced iteration class)."""
        nid = len(self.graph.nodes)
        for i in inputs:
            for lo, hi, loop in self.bodies:
                if lo <= i < hi <= nid:
                    n, ln = self.graph.nodes[i], self.graph.nodes[loop]
                    if n.op in ("param",):
                        continue
                    raise LoopError(
                        f"the result of {n.op} (shape {list(n.shape)}) computed in the body of pypto.loop "
                        f"{ln.attrs['name']!r} ({n.where or '?'}) is used after that body ({_where()}). Rule: a loop "
                        f"of more than {loops.UNROLL_LIMIT} iterations (or with bounds known only at run time) is traced "
                        "once, not unrolled, so a Python variable set in its body does not carry a value from one "
                        "iteration to the next or out of the loop. Fix: write the value to a tensor inside the loop "
                        "(acc[:] = ..., with acc = pypto.tensor(...) made before the loop) and read that tensor")

    def new(self, op, inputs, shape, dtype, attrs=None, vec=False, cube=False) -> Tensor:
        st = config.STATE
        if dtype is not None and dtype not in CONVERTIBLE_SET:
            check_representable(dtype, f"pypto.{op}'s result")
        if st.semantic_label:
            attrs = dict(attrs or {}, semantic_label=st.semantic_label)
        if self.bodies:
            self._check_body_values(inputs)
        node = self.graph.add(op, inputs, shape, dtype, attrs, st.vec_tile if vec else None,
                              st.cube_tile if cube else None, "/".join(self.loops), _where())
        if self.partial and op != "assemble" and any(i in self.partial for i in inputs):
            self.partial.add(node.id)
        elif attrs and "valid_shape" in attrs:
            self.partial.add(node.id)
        return Tensor._bound(self, node.id)

    def node(self, tid: int):
        return self.graph.nodes[tid]

    # ---- GM regions: which kernel argument (or pypto.tensor) a tensor is a window of ----
    def gm_region(self, tid: int):
        """(root id, offsets) if tensor ``tid`` is a parameter / allocated tensor, a view of one, or
        an in-place reshape of one (``pypto.reshape(out, [...], inplace=True)``: the same GM seen
        with another shape, its own root, `aliases` says of which tensor)."""
        n = self.graph.nodes[tid]
        if n.op in ("param", "alloc") or tid in self.aliases:
            return tid, (0,) * len(n.shape)
        if n.op == "view" and "root" in n.attrs:
            return n.attrs["root"], n.attrs["root_offsets"]
        return None

    def note_read(self, tid: int, node_id: int) -> None:
        reg = self.gm_region(tid)
        if reg is not None and any(is_symbolic(o) for o in reg[1]):
            self.sym_roots.add(reg[0])
            return
        if reg is not None and self.graph.nodes[tid].op != "view_pending":
            self.events.append(("r", reg[0], reg[1], self.graph.nodes[tid].shape, node_id, self.graph.nodes[node_id].where))

    def note_write(self, root: int, offsets, shape, node_id: int) -> None:
        if any(is_symbolic(o) for o in offsets):
            self.sym_roots.add(root)   # checked when the kernel runs (execute.py), not here
            return
        self.events.append(("w", root, tuple(offsets), tuple(shape), node_id, self.graph.nodes[node_id].where))

    def check_outputs(self) -> None:
        """An output (a tensor the kernel writes) must not be read where it has not been written yet."""
        written_roots = {self.aliases.get(e[1], e[1]) for e in self.events if e[0] == "w"}
        masks: dict[int, np.ndarray] = {}
        for kind, root, offsets, shape, node_id, where in self.events:
            base = self.aliases.get(root, root)
            if base not in written_roots or base in self.sym_roots or root in self.sym_roots:
                continue
            mask = self._mask(masks, root)
            rn = self.graph.nodes[base]
            root = base
            sl = tuple(slice(o, o + s) for o, s in zip(offsets, shape))
            if kind == "w":
                mask[sl] = True
            elif not mask[sl].all():
                name = rn.attrs.get("name") or f"tensor {root}"
                reader = self.graph.nodes[node_id]
                if rn.op == "param":
                    # a kernel argument read, then written: an in-place update (a KV cache, a recurrent
                    # state) that reads the values it held before the call, legal in the real framework;
                    # only an output made with torch.empty would read garbage: say so, once
                    if root not in self.inplace_warned:
                        self.inplace_warned.add(root)
                        warnings.warn(InPlaceUpdateWarning(
                            f"{name} (shape {rn.shape}) is read by {reader.op} at {where or '?'} (offsets "
                            f"{list(offsets)}) before the kernel writes that region (at {self._first_write(root)}): "
                            "an in-place update, which uses the values it had before the call. If it is an output "
                            "made with torch.empty, those are garbage: compute it from the inputs instead"),
                            stacklevel=4)
                    continue
                raise UnwrittenOutputError(
                    f"{name} (shape {rn.shape}) is an output of the kernel (it is written at "
                    f"{self._first_write(root)}) but {reader.op} at {where or '?'} reads its region "
                    f"offsets {list(offsets)} shape {list(shape)} before that region is written. Rule: an output "
                    "holds no data until the kernel writes it. Fix: compute from the inputs (or an intermediate "
                    "tensor) instead; a pypto.tensor buffer holds nothing before it is written")

    def _mask(self, masks: dict, root: int) -> np.ndarray:
        """The written-elements mask of ``root``'s base tensor, seen in ``root``'s shape (an in-place
        reshape shares its base's mask: a numpy view of it)."""
        base = self.aliases.get(root, root)
        mask = masks.get(base)
        if mask is None:
            mask = masks[base] = np.zeros(self.graph.nodes[base].shape, bool)
        return mask if base == root else mask.reshape(self.graph.nodes[root].shape)

    def unwritten_arguments(self) -> list[str]:
        """Why each kernel argument that is left (partly) unwritten is suspicious: an argument the
        kernel neither reads nor writes, or an output it writes only in part."""
        used = {i for n in self.graph.nodes for i in n.inputs} | self.scalar_roots
        problems = []
        for pid, name in zip(self.graph.params, self.graph.param_names):
            if pid in self.sym_roots:
                continue   # written at symbolic offsets: which elements depends on the run
            shape = list(self.graph.nodes[pid].shape)
            if any(self.aliases.get(r) == pid for r in self.sym_roots):
                continue
            writes = [e for e in self.events if e[0] == "w" and self.aliases.get(e[1], e[1]) == pid]
            if not writes:
                if pid not in used:
                    problems.append(
                        f"argument {name!r} (shape {shape}) is neither read nor written by the kernel: if it is an "
                        "output, it keeps the values it had before the call (whatever torch.empty left there). "
                        f"Fix: write it ({name}[:] = ...), or drop the argument")
                continue
            masks: dict[int, np.ndarray] = {}
            for _, root, offsets, wshape, _, _ in writes:
                self._mask(masks, root)[tuple(slice(o, o + s) for o, s in zip(offsets, wshape))] = True
            mask = masks[pid]
            if not mask.all():
                first = [int(i) for i in np.argwhere(~mask)[0]]
                problems.append(
                    f"output {name!r} (shape {shape}) is written only in part: {int((~mask).sum())} of {mask.size} "
                    f"elements, the first at index {first}, are never written and keep the values they had before "
                    "the call. Fix: write every region (check the loop bounds and slices against the shape), or "
                    "pass only the part the kernel computes (a slice of the torch tensor)")
        return problems

    def _first_write(self, root: int) -> str:
        for e in self.events:
            if e[0] == "w" and e[1] == root:
                return e[5] or "?"
        return "?"


_OPERATORS = None  # the op library (pypto_lab.pto.ops) binds itself here when it loads


def bind_operators(library) -> None:
    """Called by `pypto_lab.pto.ops` on import: Tensor's operators (x + y, x[...] = v, x.exp(), ...)
    call that library's functions. The dependency points one way: the library knows the Tensor."""
    global _OPERATORS
    _OPERATORS = library


def _ops():
    if _OPERATORS is None:
        raise TraceError("the pto op library is not loaded: import pypto_lab.pto (as pypto) before tracing")
    return _OPERATORS


def current_trace(what: str = "this operation") -> Trace:
    tr = config.STATE.trace
    if tr is None:
        raise TraceError(f"{what} needs a kernel being traced: call it inside a function decorated with "
                         "@pypto.jit or @pypto.frontend.jit, and call that function with torch tensors")
    return tr


def _resolve_shape(shape) -> tuple | None:
    if shape is None:
        return None
    return tuple(dim_value(d) for d in shape)


class Tensor:
    """``pypto.Tensor``: an annotation (``Tensor[...]``, ``Tensor[[shape], dtype]``,
    ``Tensor(shape, dtype)``) or, inside a traced kernel, a value of the Tensor Graph."""

    __slots__ = ("spec_shape", "spec_dtype", "name", "format", "_trace", "_id")

    def __new__(cls, shape=None, dtype=None, name: str = "", format=None, *args, **kwargs):
        # inside a kernel being traced, pypto.Tensor([16, 32], dtype) is a new GM buffer, as the real
        # frontend's pypto.tensor (the same class there); an annotation stays an annotation
        if (cls is Tensor and config.STATE.trace is not None and dtype is not None
                and isinstance(shape, (list, tuple)) and shape
                and all(isinstance(d, int) or hasattr(d, "__index__") for d in shape)
                and not any(d is DYNAMIC or d is STATIC or d is Ellipsis for d in shape)):
            return _ops().tensor(list(shape), dtype, name, format)
        return object.__new__(cls)

    def __init__(self, shape=None, dtype=None, name: str = "", format=None, data_ptr=None, device=None,
                 ori_shape=None):
        if getattr(self, "_trace", None) is not None:
            return   # a buffer made by __new__ while tracing
        # the v0.2 annotations (python/pypto/tensor.py at 883e7df): Tensor(), Tensor([]), Tensor(...),
        # Tensor([...]): any shape; Tensor([pypto.DYNAMIC, 32]) / Tensor([pypto.STATIC, ...]): one entry per
        # dimension (DYNAMIC / DYN: any size; STATIC: the size of the first call, fixed at compile time; an
        # int: that size; a trailing ...: any further dimensions)
        self.spec_shape = _annotation_shape(shape)
        self.spec_dtype = None if dtype is None else as_dtype(dtype)
        self.name = name
        self.format = format
        self._trace = None
        self._id = None

    def __class_getitem__(cls, item):
        """``Tensor[...]``, ``Tensor[[shape], dtype]``, ``Tensor[dtype]``, and as the real one also a
        format, a name (str) and a dict of them in any order."""
        if item is Ellipsis:
            return cls()
        params = item if isinstance(item, tuple) else (item,)
        if isinstance(item, tuple) and not any(isinstance(p, (list, tuple, DataType, dict, str)) for p in params):
            return cls(item)  # Tensor[4, 8]: a shape written without brackets
        shape = dtype = fmt = None
        name = ""
        for p in params:
            if isinstance(p, dict):
                shape, dtype = p.get("shape", shape), p.get("dtype", dtype)
                name, fmt = p.get("name", name), p.get("format", fmt)
            elif isinstance(p, (list, tuple)) or p is Ellipsis:
                shape = p
            elif isinstance(p, DataType):
                dtype = p
            elif isinstance(p, str):
                name = p
            elif isinstance(p, TileOpFormat):
                fmt = p
            else:
                raise TraceError(f"pypto.Tensor[{item!r}]: {p!r} is neither a shape, a dtype, a name nor a format. "
                                 "Rule: write Tensor[...], Tensor[[shape], dtype] or Tensor(shape, dtype). Fix: e.g. "
                                 "pypto.Tensor[[pypto.DYNAMIC, 32], pypto.DT_FP32]")
        return cls(shape, dtype, name, fmt)

    @classmethod
    def _bound(cls, trace: Trace, tid: int) -> Tensor:
        t = cls.__new__(cls)
        t.spec_shape = t.spec_dtype = None
        t.format = TileOpFormat.TILEOP_NZ if trace.graph.nodes[tid].attrs.get("format") == "NZ" else \
            TileOpFormat.TILEOP_ND
        t.name = ""
        t._trace, t._id = trace, tid
        return t

    # ---- description ----
    @property
    def is_bound(self) -> bool:
        return self._trace is not None

    def _node(self):
        if self._trace is None:
            raise TraceError("this pypto.Tensor is an annotation, not a value: it has no data to compute with. "
                             "Use the kernel's arguments (or pypto.tensor(...) inside the kernel) instead")
        return self._trace.graph.nodes[self._id]

    @property
    def shape(self) -> list[int]:
        if self._trace is None:
            s = _resolve_shape(self.spec_shape)
            return None if s is None else list(s)
        return [ConcreteScalar(d) for d in self._node().shape]

    @property
    def valid_shape(self) -> list:
        """The valid part of each axis: the shape, except where a view's valid size is read from
        tensor data (a SymbolicScalar, evaluated when the kernel runs)."""
        shape = self.shape
        if self._trace is None or shape is None:
            return shape
        run_valid = self._node().attrs.get("valid_shape")
        if not run_valid:
            return shape
        return [s if v is None else v for v, s in zip(run_valid, shape)]

    @property
    def dtype(self) -> DataType:
        return self.spec_dtype if self._trace is None else self._node().dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(np.prod(self.shape))

    def __repr__(self) -> str:
        if self._trace is None:
            shape = "..." if self.spec_shape is None else list(self.spec_shape)
            return f"pypto.Tensor({shape}, {self.spec_dtype})"
        n = self._node()
        return f"<pypto.Tensor %{n.id} {n.op} {list(n.shape)} {n.dtype}>"

    # ---- a traced tensor is not a Python value ----
    def _describe(self) -> str:
        """What this tensor is, in the user's terms: ``x``, ``x[0, 0]``, ``x[0:32, 0:64]`` or the
        result of an operation."""
        n = self._node()
        graph = self._trace.graph
        root_id = n.attrs.get("root")
        if n.op in ("param", "alloc"):
            return n.attrs.get("name") or f"tensor %{n.id}"
        if n.op == "reshape" and n.inputs and graph.nodes[n.inputs[0]].op == "view" and not n.shape:
            view = graph.nodes[n.inputs[0]]  # x[i, j]: a one-element view reshaped to rank 0
            root = graph.nodes[view.attrs["root"]] if "root" in view.attrs else None
            if root is not None:
                return f"{root.attrs.get('name') or 'tensor'}[{', '.join(map(str, view.attrs['root_offsets']))}]"
        if n.op == "view" and root_id is not None:
            root = graph.nodes[root_id]
            ranges = ", ".join(f"{o}:{o + s}" for o, s in zip(n.attrs["root_offsets"], n.shape))
            return f"{root.attrs.get('name') or 'tensor'}[{ranges}]"
        return f"the result of {n.op} (shape {list(n.shape)}, {n.dtype!r}{', at ' + n.where if n.where else ''})"

    def _not_a_value(self, what: str) -> TraceError:
        if self._trace is None:
            return TraceError(f"{what} of a pypto.Tensor annotation: an annotation has no data. Use the kernel's "
                              "arguments (or pypto.tensor(...) inside the kernel) instead")
        name = self._describe()
        element = name.endswith("]") and ":" not in name
        keep = f"keep it a tensor (x * {name} broadcasts)" if element else "keep it a tensor and compute with it"
        return ScalarReadError(
            f"{what} of {name}: a traced kernel cannot read a tensor's values as a Python value. Rule: while "
            "@pypto.jit traces the function, a pypto.Tensor is a node of the Tensor Graph, not data; its values "
            "exist only when the compiled kernel runs, after tracing, so Python (float, int, bool, if, .item()) "
            f"cannot see them. Fix: {keep}; choose per element with "
            "pypto.where(cond, a, b) (e.g. pypto.where(x[0:1, 0:1] > 0, a, b)); or read the value in torch before "
            "the call and pass it as a Python argument (kernel(x, out, scale=float(x_torch[0, 0])))")

    def __bool__(self):
        raise self._not_a_value("the truth value (if / while / and / or / bool())")

    def __float__(self):
        raise self._not_a_value("float()")

    def __int__(self):
        raise self._not_a_value("int()")

    def __index__(self):
        raise self._not_a_value("operator.index() (an index, a range() bound or a size)")

    def __complex__(self):
        raise self._not_a_value("complex()")

    def item(self):
        raise self._not_a_value(".item()")

    def tolist(self):
        raise self._not_a_value(".tolist()")

    def __len__(self):
        return self.shape[0]

    # ---- cache policy (recorded on the node: the L2 is not modelled tensor by tensor) ----
    def set_cache_policy(self, policy, value: bool) -> None:
        """``t.set_cache_policy(pypto.CachePolicy.NONE_CACHEABLE, True)``: recorded on the tensor's node."""
        from .enums import CachePolicy

        if not isinstance(policy, CachePolicy):
            raise TraceError(f"set_cache_policy({policy!r}, ...): not a pypto.CachePolicy. Fix: "
                             "pypto.CachePolicy.NONE_CACHEABLE")
        self._node().attrs.setdefault("cache_policy", {})[policy.name] = bool(value)

    def get_cache_policy(self, policy) -> bool:
        return bool(self._node().attrs.get("cache_policy", {}).get(getattr(policy, "name", policy), False))

    # ---- slicing ----
    def _parse_key(self, key, write: bool = False):
        """(offsets, sizes, dropped axes, explicit) of an index. ``write``: for ``x[a:] = v`` (a slice
        with a run-time start and no stop) the size is v's, not ``n - a``: it is left None."""
        shape = self.shape
        if not isinstance(key, tuple):
            key = (key,)
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise TraceError("an index may hold at most one '...'")
        if n_ell:
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            fill = len(shape) - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        if len(key) > len(shape):
            raise ShapeError(f"index {key!r} has {len(key)} entries for a tensor of rank {len(shape)} (shape {shape})")
        key = key + (slice(None),) * (len(shape) - len(key))
        offsets, sizes, drop, explicit = [], [], [], []
        for d, (k, n) in enumerate(zip(key, shape)):
            if isinstance(k, slice) and (is_symbolic(k.start) or is_symbolic(k.stop)):
                if k.step not in (None, 1):
                    raise TraceError(f"slice step {k.step} on dimension {d}: only contiguous slices (step 1) are views")
                start = 0 if k.start is None else k.start
                if write and k.stop is None:
                    offsets.append(start)
                    sizes.append(None)
                    explicit.append(False)
                    continue
                stop = n if k.stop is None else k.stop
                size = stop - start
                size = int(size)  # a view's size is a Python int: a guard of the loop body if it is symbolic
                h = hint_of(start)
                if size <= 0 or size > n or (h is not None and not 0 <= h <= n - size):
                    raise ShapeError(f"slice {start}:{stop} of dimension {d} (size {n}) is empty or out of range in "
                                     f"the iteration traced (start {h}, {size} elements); indices must satisfy "
                                     f"0 <= start < stop <= {n}")
                offsets.append(start)
                sizes.append(size)
                explicit.append(True)
            elif is_symbolic(k):
                h = hint_of(k)
                if h is not None and not 0 <= h < n:
                    raise ShapeError(f"index {k} = {h} on dimension {d} is out of range for size {n} in the "
                                     "iteration traced")
                offsets.append(k)
                sizes.append(1)
                drop.append(d)
                explicit.append(True)
            elif isinstance(k, slice):
                if k.step not in (None, 1):
                    raise TraceError(f"slice step {k.step} on dimension {d}: only contiguous slices (step 1) are views")
                start = 0 if k.start is None else int(k.start)
                stop = n if k.stop is None else int(k.stop)
                start = start + n if start < 0 else start
                stop = stop + n if stop < 0 else min(stop, n)
                if not 0 <= start < n or stop <= start:
                    raise ShapeError(f"slice {start}:{stop} of dimension {d} (size {n}) is empty or out of range; "
                                     f"indices must satisfy 0 <= start < stop <= {n}")
                offsets.append(start)
                sizes.append(stop - start)
                explicit.append(k.stop is not None)
            else:
                try:
                    i = int(k)
                except TypeError:
                    raise TraceError(f"index {k!r} on dimension {d}: use ints, slices or '...'") from None
                i = i + n if i < 0 else i
                if not 0 <= i < n:
                    raise ShapeError(f"index {i} on dimension {d} is out of range for size {n}")
                offsets.append(i)
                sizes.append(1)
                drop.append(d)
                explicit.append(True)
        return offsets, sizes, drop, explicit

    def __getitem__(self, key):
        ops = _ops()
        offsets, sizes, drop, _ = self._parse_key(key)
        if (len(drop) == len(sizes) and self.is_bound and self.dtype.lab == "int32"
                and self._trace.gm_region(self._id) is not None):
            # x[b, i] of a DT_INT32 tensor in GM: a scalar read when the kernel runs (GetTensorData);
            # an element of a computed tensor stays a rank-0 tensor (it broadcasts)
            return self._read_scalar(offsets)
        v = ops.view(self, sizes, offsets)
        if drop:
            v = ops.reshape(v, [s for d, s in enumerate(sizes) if d not in drop])
        return v

    def _read_scalar(self, offsets) -> SymbolicScalar:
        tr = self._trace
        reg = tr.gm_region(self._id)
        if reg is None:
            raise TraceError(f"reading an element of {self._describe()} as a scalar: it is computed, not in GM. "
                             "Rule: only kernel arguments and pypto.tensor buffers (GM) can be read element by "
                             "element (the Scalar unit reads GM). Fix: read from the argument, or write the value to "
                             "a pypto.tensor first")
        root, roff = reg
        tr.scalar_roots.add(root)
        idx = [a + b for a, b in zip(roff, offsets)]
        rn = tr.graph.nodes[root]
        name = f"{rn.attrs.get('name') or f'tensor %{root}'}[{', '.join(str(i) for i in idx)}]"
        s = SymbolicScalar.read(root, idx, name)
        hints = [hint_of(i) for i in idx]
        if all(h is not None for h in hints):
            s.hint = tr.read_hint(root, tuple(hints))
        return s

    def __setitem__(self, key, value):
        ops = _ops()
        if not isinstance(value, Tensor):
            raise TraceError(f"slice assignment of {type(value).__name__} {value!r}: assign a pypto.Tensor "
                             "(e.g. out[:] = x + y)")
        offsets, sizes, drop, explicit = self._parse_key(key, write=True)
        vshape = list(value.shape)
        sizes = [v if s is None else s for s, v in zip(sizes, vshape + [None] * (len(sizes) - len(vshape)))]
        if drop and len(vshape) == len(sizes) - len(drop):
            vshape = list(vshape)
            for d in drop:
                vshape.insert(d, 1)
            value = ops.reshape(value, vshape)
        if len(vshape) != len(sizes):
            raise ShapeError(f"assigning a tensor of shape {list(value.shape)} to a slice of rank {len(sizes)} "
                             f"(destination shape {self.shape}): ranks must agree")
        for d, (vs, s) in enumerate(zip(vshape, sizes)):
            if vs > s:
                raise ShapeError(f"assigning shape {vshape} at offsets {offsets} of a tensor of shape {self.shape}: "
                                 f"dimension {d} needs {vs} elements, the slice has {s}. Fix the slice or the value")
        ops.assemble(value, offsets, self)

    def move(self, src: Tensor) -> None:
        """``out.move(x)``: ``out`` takes ``x``'s data. Of the same shape, ``x`` is written into ``out``
        (how kernels fill an output); of another shape, as the real ``Tensor::Move`` does, ``out``
        becomes ``x`` (the handle now denotes x: ``cache.move(pypto.scatter_update(cache_2d, ...))``
        keeps using the updated cache, seen 2-D)."""
        ops = _ops()
        if not isinstance(src, Tensor) or not src.is_bound:
            raise TraceError(f"move: {type(src).__name__} cannot be moved into a Tensor. Rule: move takes a pypto "
                             "tensor of the kernel. Fix: out.move(x) with x computed in the kernel")
        if list(src.shape) != list(self.shape):
            if math.prod(src.shape) != math.prod(self.shape):
                raise ShapeError(f"move: source shape {list(src.shape)} ({math.prod(src.shape)} elements) into a "
                                 f"tensor of shape {self.shape}; a move to another shape keeps the element count. "
                                 "Fix: slice the destination (out[a:b, ...] = x) or reshape the source")
            self._trace, self._id = src._trace, src._id
            return
        if self._trace.gm_region(self._id) is None:   # a computed value: it becomes src
            self._trace, self._id = src._trace, src._id
            return
        ops.assemble(src, [0] * len(self.shape), self)

    # ---- arithmetic ----
    def __add__(self, o):
        return _ops().add(self, o)
    def __radd__(self, o):
        return _ops().add(o, self)
    def __sub__(self, o):
        return _ops().sub(self, o)
    def __rsub__(self, o):
        return _ops().sub(o, self)
    def __mul__(self, o):
        return _ops().mul(self, o)
    def __rmul__(self, o):
        return _ops().mul(o, self)
    def __truediv__(self, o):
        return _ops().div(self, o)
    def __rtruediv__(self, o):
        return _ops().div(o, self)
    def __neg__(self):
        return _ops().neg(self)
    def __matmul__(self, o):
        return _ops().matmul(self, o, self.dtype)
    def __pow__(self, o):
        return _ops().pow(self, o)
    # comparisons give DT_BOOL tensors; == and != stay Python identity (use pypto.eq / pypto.ne)
    def __lt__(self, o):
        return _ops().lt(self, o)
    def __le__(self, o):
        return _ops().le(self, o)
    def __gt__(self, o):
        return _ops().gt(self, o)
    def __ge__(self, o):
        return _ops().ge(self, o)

    # ---- methods mirroring the functions ----
    def exp(self, precision_type=None):
        return _ops().exp(self, precision_type)
    def sqrt(self, precision_type=None):
        return _ops().sqrt(self, precision_type)
    def rsqrt(self, precision_type=None):
        return _ops().rsqrt(self, precision_type)
    def abs(self):
        return _ops().abs(self)
    def sum(self, dim=-1, keepdim=False):
        return _ops().sum(self, dim, keepdim)
    def amax(self, dim=-1, keepdim=False):
        return _ops().amax(self, dim, keepdim)
    def amin(self, dim=-1, keepdim=False):
        return _ops().amin(self, dim, keepdim)
    def transpose(self, dim0=-2, dim1=-1):
        return _ops().transpose(self, dim0, dim1)
    def reshape(self, *shape, valid_shape=None, inplace=False):
        return _ops().reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape,
                              valid_shape=valid_shape, inplace=inplace)
    def view(self, shape=None, offsets=None, *, valid_shape=None, dtype=None):
        return _ops().view(self, shape, offsets, valid_shape=valid_shape, dtype=dtype)
    def cast(self, dtype):
        return _ops().cast(self, dtype)
    def sigmoid(self):
        return _ops().sigmoid(self)
    def log(self, precision_type=None):
        return _ops().log(self, precision_type)
    def softmax(self, dim=-1):
        return _ops().softmax(self, dim)
    def expand_clone(self, shape, *, valid_shape=None):
        return _ops().expand_clone(self, shape, valid_shape=valid_shape)


# ---- the rest of the real Tensor's methods (python/pypto/tensor.py at 883e7df): each calls the op of
# the same name with the tensor first, as the real methods do
_METHODS = ("add", "sub", "mul", "div", "hypot", "prelu", "fmod", "remainder", "maximum", "lrelu", "topk", "sin", "cos",
            "sinh", "cosh", "asinh", "acosh", "sign", "signbit", "tanh", "exp2", "expm1", "erfc", "log1p", "log10", "log2",
            "logical_not", "argmax", "argmin", "round", "ceil", "floor", "trunc", "reciprocal", "relu", "permute",
            "gather", "gathermask", "index_add_", "index_add", "cumsum", "cumprod", "gcd", "triu", "tril", "unsqueeze",
            "clone", "pad", "fillpad", "scatter_update", "scatter_", "scatter", "var", "axpy_", "matmul", "amin")


_LIBRARY: dict = {}  # the package's namespace (pypto_lab.pto binds it here when it loads: `bind_library`)


def bind_library(namespace: dict) -> None:
    """Called by ``pypto_lab/pto/__init__.py`` once every op is imported: the methods below call the
    op of their name from it (the package imports this module, never the other way round)."""
    _LIBRARY.update(namespace)


def _method(name):
    def method(self, *args, **kwargs):
        if name not in _LIBRARY:
            raise TraceError(f"Tensor.{name}: the pto op library is not loaded: import pypto_lab.pto (as pypto) "
                             "before tracing")
        return _LIBRARY[name](self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"``pypto.{name}(self, ...)``."
    return method


for _m in _METHODS:
    setattr(Tensor, _m, _method(_m))


def _assemble(self, input, offsets):
    """``self.assemble(x, offsets)``: ``pypto.assemble(x, offsets, self)``."""
    _ops().assemble(input, offsets, self)


def _fill_(self, value):
    self.move(_ops().full(self.shape, value, self.dtype))
    return self


def _triu_(self, diagonal=0):
    self.move(_LIBRARY["triu"](self, diagonal))
    return self


def _tril_(self, diagonal=0):
    self.move(_LIBRARY["tril"](self, diagonal))
    return self


def _dim(self) -> int:
    return len(self.shape)


def _floordiv(self, other):
    return _ops().floor(_ops().div(self, other))


def _mod(self, other):
    return _LIBRARY["remainder"](self, other)


def _iter(self):
    raise TraceError("a pypto.Tensor is not iterable (as in the real API). Fix: index it (x[i]) or loop with "
                     "pypto.loop over its size")


Tensor.assemble, Tensor.fill_, Tensor.triu_, Tensor.tril_ = _assemble, _fill_, _triu_, _tril_
Tensor.dim, Tensor.__floordiv__, Tensor.__mod__, Tensor.__iter__ = _dim, _floordiv, _mod, _iter
Tensor.__pos__ = lambda self: self
Tensor.greater = lambda self, other: _ops().gt(self, other)
Tensor.id = property(lambda self: self._id)
Tensor.is_empty = lambda self: any(int(d) == 0 for d in (self.shape or []))

_STATUS = {"DYN": DYNAMIC, "DYNAMIC": DYNAMIC, "STATIC": STATIC}


def _annotation_shape(shape):
    """The annotation's shape: None (any) or a tuple of ints, DYNAMIC, STATIC, SymbolicDim, ending
    with Ellipsis when further dimensions may follow."""
    if shape is None or shape is Ellipsis:
        return None
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)):
        raise TraceError(f"pypto.Tensor({shape!r}, ...): the shape is a {type(shape).__name__}. Rule: an annotation's "
                         "shape is a list of ints, pypto.DYNAMIC, pypto.STATIC or named dynamic dims (a trailing ... "
                         "for any further ones). Fix: e.g. pypto.Tensor([pypto.DYNAMIC, 32], pypto.DT_FP32)")
    dims = tuple(_STATUS.get(d.value, d) if isinstance(d, StatusType) else d for d in shape)
    if not dims or dims == (Ellipsis,):
        return None  # Tensor([]) and Tensor([...]): any shape, as in the real frontend
    for i, d in enumerate(dims):
        ok = (d is DYNAMIC or d is STATIC or isinstance(d, SymbolicDim) or (d is Ellipsis and i == len(dims) - 1)
              or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or hasattr(d, "__index__"))
        if not ok:
            raise TraceError(f"pypto.Tensor({list(shape)!r}, ...): entry {i} = {d!r} is not a dimension. Rule: each "
                             "entry is an int >= 0, pypto.DYNAMIC, pypto.STATIC or a named dynamic dim; only the last "
                             "may be ... Fix: e.g. pypto.Tensor([pypto.STATIC, ...], pypto.DT_FP32)")
    return dims


def spec_matches(spec: Tensor, shape, dtype: DataType) -> str | None:
    """Why a torch argument does not match its annotation (None if it does)."""
    if spec.spec_dtype is not None and spec.spec_dtype is not dtype:
        return f"dtype {dtype!r}, annotated {spec.spec_dtype!r}"
    dims = spec.spec_shape
    if dims is not None:
        # as the real frontend (frontend/parser/entry.py _check_input_defs_match_tensors): an annotation
        # with DYNAMIC / STATIC markers (a "status shape") needs at least that many dimensions, its
        # entries checked against the leading ones; one of plain sizes needs exactly its rank
        status = any(d is DYNAMIC or d is STATIC or isinstance(d, SymbolicDim) for d in dims)
        open_end = dims[-1] is Ellipsis or status
        fixed = dims[:-1] if dims[-1] is Ellipsis else dims
        if (len(shape) < len(fixed)) if open_end else (len(fixed) != len(shape)):
            want = f"at least {len(fixed)}" if open_end else str(len(fixed))
            return f"rank {len(shape)} (shape {list(shape)}), annotated rank {want} {list(dims)}"
        for d, (a, s) in enumerate(zip(fixed, shape)):
            if a is DYNAMIC or a is STATIC or isinstance(a, SymbolicDim):
                continue
            if int(a) != int(s):
                return f"size {s} on dimension {d}, annotated {a}"
    return None


def check_dtype_same(op: str, a: Tensor, b: Tensor) -> None:
    if a.dtype is not b.dtype:
        raise DTypeError(f"{op}: operands have dtypes {a.dtype!r} and {b.dtype!r}; the rule: vector operands share "
                         f"one dtype. Fix: pypto.cast(x, {a.dtype!r}) the other operand first")
