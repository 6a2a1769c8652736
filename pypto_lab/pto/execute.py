"""What the kernel computes: the Tensor Graph interpreted on the CPU with the NPU's numerics.

* Vector arithmetic runs in the declared dtype: every operation's result is rounded to it
  (computed in fp32, then rounded to nearest even: a correctly rounded fp16/bf16 operation).
* Reductions add (or compare) in the declared dtype as the Vector unit's halving tree does:
  pairwise, rounding after every level.
* matmul: `pypto_lab.hw.numerics.matmul` (inputs in their dtype, exact products, fp32
  accumulation, rounded once on the way out of L0C); int8 x int8 accumulates exactly in int32.
* Casts follow ``pypto.cast``'s CastMode and SaturationMode (`cast_rules`): by default a float
  becomes an integer by truncation toward zero, wrapping on overflow.
* Composite ops round after each vector step they are made of (sigmoid: -x, exp, + 1, 1 / y;
  expm1: exp, - 1); erf / erfc / log / pow are computed in fp32 and rounded once (the chip's
  polynomial approximations are not modelled bit for bit).
* Comparisons give DT_BOOL; matmul ``bias_tensor`` is added to the fp32 accumulator before the
  result leaves L0C.
* A symbolic loop (`loops`) runs iteration by iteration: the first variant whose guards hold is
  run with the index bound; symbolic offsets and tensor reads (``block_table[b, i]``) are
  evaluated then, and an offset or index out of range raises `SymbolicIndexError`.
* A **cost-only** run (``compute=False``, `config.cost_only`) walks the same control flow (loop
  bounds, the variant of every iteration, scalar reads of the kernel's arguments, so the counts the
  cost model extrapolates from are those of the real run) but computes no tensor: outputs keep
  what they held, a returned tensor is uninitialised, and a scalar read of a tensor the kernel
  itself computes gives 0. It is how a kernel is costed at a size whose numerics are too slow.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..hw import numerics
from . import batched, cast_rules, ops_math, special
from .errors import LoopError, SymbolicIndexError
from .graph import ELEMENTWISE, TensorGraph
from .loops import guards_hold
from .symbolic import SymbolicScalar

_FLOAT = ("fp16", "bf16", "fp32")


def _round(x: torch.Tensor, dt) -> torch.Tensor:
    return x.to(dt.torch)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _tree(x: torch.Tensor, dim: int, op, dt) -> torch.Tensor:
    """Reduce ``dim`` pairwise, rounding to ``dt`` after each level (the values are carried in fp32,
    each one exactly a ``dt`` value, so one rounding and one widening per level)."""
    x = _f32(x.movedim(dim, -1))
    while x.shape[-1] > 1:
        n = x.shape[-1]
        if n % 2:
            x, tail = x[..., :-1], x[..., -1:]
        else:
            tail = None
        h = x.shape[-1] // 2
        y = _f32(_round(op(x[..., :h], x[..., h:]), dt))
        x = y if tail is None else torch.cat([y, tail], dim=-1)
    return _round(x, dt).movedim(-1, dim)


def _name(graph: TensorGraph, tid: int) -> str:
    n = graph.nodes[tid]
    return n.attrs.get("name") or f"tensor %{tid}"


class _Run:
    """One run of a Tensor Graph: the values, the bound loop indices, the iterations per variant."""

    def __init__(self, graph: TensorGraph, env: dict, counts: dict, compute: bool = True):
        self.graph, self.env, self.counts, self.compute = graph, env, counts, compute
        self.idx: dict[int, int] = {}
        self.plans: dict[int, dict | None] = {}   # loop node -> how it runs batched (`batched.plan`), None: it does not

    def read(self, tid: int, ix: tuple, expr: SymbolicScalar) -> int:
        t = self.env.get(tid)
        if t is None and not self.compute:   # cost-only: a tensor the kernel computes holds no values
            return np.zeros(np.broadcast(*ix).shape, np.int64) if any(isinstance(i, np.ndarray) for i in ix) else 0
        t = self.env[tid]
        if any(isinstance(i, np.ndarray) for i in ix):   # a guard evaluated for every iteration at once
            arrs = np.broadcast_arrays(*[np.asarray(i, dtype=np.int64) for i in ix])
            for d, (a, n) in enumerate(zip(arrs, t.shape)):
                if a.size and (a.min() < 0 or a.max() >= n):
                    bad = int(a[(a < 0) | (a >= n)][0])
                    raise SymbolicIndexError(
                        f"reading {expr}: index {bad} on dimension {d} of {_name(self.graph, tid)} (shape "
                        f"{list(t.shape)}) is out of range{self._at()}. Rule: a scalar read needs 0 <= index < {n}. "
                        "Fix: bound the index (the loop's stop, or .min(n - 1)), or check the table passed in")
            return t.numpy()[tuple(arrs)].astype(np.int64)
        for d, (i, n) in enumerate(zip(ix, t.shape)):
            if not 0 <= int(i) < n:
                raise SymbolicIndexError(
                    f"reading {expr}: index {int(i)} on dimension {d} of {_name(self.graph, tid)} (shape "
                    f"{list(t.shape)}) is out of range{self._at()}. Rule: a scalar read needs 0 <= index < {n}. Fix: "
                    "bound the index (the loop's stop, or .min(n - 1)), or check the table passed in")
        return int(t[tuple(int(i) for i in ix)])

    def ev(self, x):
        return x.evaluate(self.idx, self.read) if isinstance(x, SymbolicScalar) else x

    def _at(self) -> str:
        if not self.idx:
            return ""
        names = {lid: self.graph.nodes[lid].attrs["idx_name"] for lid in self.idx}
        return " (at " + ", ".join(f"{names[k]} = {v}" for k, v in self.idx.items()) + ")"

    def offsets(self, n, shape, dims, what: str) -> tuple:
        offs = n.attrs["offsets"]
        if not any(isinstance(o, SymbolicScalar) for o in offs):
            return offs
        out = []
        for d, (o, s, size) in enumerate(zip(offs, shape, dims)):
            v = int(self.ev(o))
            if v < 0 or v + s > size:
                root = n.attrs.get("root", n.inputs[-1] if n.op == "assemble" else n.inputs[0])
                raise SymbolicIndexError(
                    f"{what} of {_name(self.graph, root)}: offset {o} = {v} on dimension {d}{self._at()} takes {s} "
                    f"elements of a dimension of size {size} ({n.where or '?'}). Rule: 0 <= offset <= {size - s}. "
                    "Fix: bound the offset (fewer iterations, .min(...) on the index), or check the table that "
                    "the offset is read from")
            out.append(v)
        return tuple(out)

    def run(self, lo: int, hi: int) -> None:
        nodes = self.graph.nodes
        compute = self.compute
        i = lo
        while i < hi:
            n = nodes[i]
            if n.op == "loop":
                self.loop(n)
                i = n.attrs["end"]
            else:
                if compute:
                    _run_node(self, n)
                i += 1

    def loop(self, n) -> None:
        a = n.attrs
        start, stop, step = (int(self.ev(a[k])) for k in ("start", "stop", "step"))
        if step == 0:
            raise SymbolicIndexError(f"pypto.loop {a['name']!r}: the step {a['step']} is 0{self._at()}; it never ends")
        variants = a["variants"]
        counts = self.counts
        its = np.arange(start, stop, step, dtype=np.int64)
        # the variant of every iteration at once: guards are on loop indices only (vectorised)
        sel = np.full(its.size, -1, np.int64)
        vec = {**self.idx, n.id: its}
        for k, var in enumerate(variants):
            hold = np.broadcast_to(np.asarray(guards_hold(var["guards"], vec, self.read), bool), its.shape)
            sel[(sel < 0) & hold] = k
        if (sel < 0).any():
            self.idx[n.id] = int(its[np.argmax(sel < 0)])
            raise LoopError(f"pypto.loop {a['name']!r}: iteration {self.idx[n.id]}{self._at()} takes a path that was "
                            "not traced (its bounds or its enclosing loop's index differ from those traced). Fix: "
                            "make the condition depend only on this loop's index, or unroll a short outer loop")
        for k, c in enumerate(np.bincount(sel, minlength=len(variants)).tolist()):
            if c:
                counts[(n.id, k)] = counts.get((n.id, k), 0) + c
        if its.size > 1 and self.compute:
            p = self.plans.get(n.id, 0)
            if p == 0:
                p = self.plans[n.id] = batched.plan(self.graph, n)
            if p is not None and batched.run_batched(self, n, its, sel, p, _elementwise_node):
                self.idx.pop(n.id, None)
                return
        ranges = [(var["lo"], var["hi"]) for var in variants]
        idx, run, lid = self.idx, self.run, n.id
        for it, v in zip(its.tolist(), sel.tolist()):
            idx[lid] = it
            lo, hi = ranges[v]
            run(lo, hi)
        self.idx.pop(n.id, None)


def run_graph(graph: TensorGraph, args: list[torch.Tensor], counts: dict | None = None,
              compute: bool = True) -> dict[int, torch.Tensor]:
    """Compute every tensor of ``graph``; ``counts`` receives the iterations of each (loop, variant).
    ``compute=False``: the control flow only (see the module's docstring)."""
    env: dict[int, torch.Tensor] = {}
    for pid, t in zip(graph.params, args):
        env[pid] = t
    _Run(graph, env, {} if counts is None else counts, compute).run(0, len(graph.nodes))
    if not compute:
        for r in graph.returns:
            n = graph.nodes[r]
            env.setdefault(r, torch.empty(n.shape, dtype=n.dtype.torch))
    return env


def _window(t: torch.Tensor, offsets, shape) -> torch.Tensor:
    """``t[o0:o0 + s0, ...]`` (a view), by narrowing only the dimensions that shrink."""
    for d, (o, s) in enumerate(zip(offsets, shape)):
        if o or s != t.shape[d]:
            t = t.narrow(d, o, s)
    return t


def _reshape_valid(run: _Run, n, x: torch.Tensor) -> torch.Tensor:
    """A reshape of a tensor that may hold only its valid part: to the node's ``valid_shape`` (sizes
    evaluated now, at most the shape), else to the shape with the first axis holding what there is."""
    valid = n.attrs.get("valid_shape")
    if valid is not None:
        target = tuple(min(int(run.ev(v)), s) for v, s in zip(valid, n.shape))
        if x.numel() == math.prod(target):
            return x.reshape(target)
        if x.numel() == math.prod(n.shape):
            return _window(x.reshape(n.shape), (0,) * len(target), target)
    full = tuple(run.graph.nodes[n.inputs[0]].shape)
    first = next((d for d, (v, f) in enumerate(zip(x.shape, full)) if v < f), len(full))
    rest = math.prod(n.shape[1:])
    prefix = math.prod(full[:first]) == 1 and tuple(x.shape[first + 1:]) == full[first + 1:]
    if prefix and rest and x.numel() % rest == 0:
        # the valid part is a prefix of the row-major order: it stays one in the new shape
        return x.reshape((x.numel() // rest,) + tuple(n.shape[1:]))
    # otherwise the tile's memory layout decides: the valid part in place, the rest zeros (the docs'
    # view example shows the invalid region as zeros; on the chip it is whatever the buffer held)
    padded = torch.zeros(full, dtype=x.dtype)
    _window(padded, (0,) * len(full), tuple(x.shape)).copy_(x)
    return padded.reshape(n.shape)


_ELEMENTWISE = frozenset(ELEMENTWISE)


def _common_valid(ins: list) -> list:
    """Operands of an element-wise op that hold different valid parts (a view whose valid shape is
    read from tensor data holds only that part): each is cut to the part they all hold, axis by
    axis (an axis of size 1 still broadcasts). The result's valid part is that intersection."""
    shapes = [tuple(t.shape) for t in ins]
    if len(set(shapes)) == 1:
        return ins
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + s for s in shapes]
    target = [min((s[d] for s in padded if s[d] != 1), default=1) for d in range(rank)]
    out = []
    for t, s in zip(ins, padded):
        if any(s[d] != 1 and s[d] > target[d] for d in range(rank)):
            off = rank - t.dim()
            for d in range(t.dim()):
                if t.shape[d] != 1 and t.shape[d] > target[d + off]:
                    t = t.narrow(d, 0, target[d + off])
        out.append(t)
    return out


def _run_node(run: _Run, n) -> None:
    if n.op == "param":
        return
    out = _compute(run, n, [run.env[i] for i in n.inputs])
    if out is not None:
        # a value a loop body writes in place (`ops._assemble_carried`) owns its memory
        run.env[n.id] = out.clone() if n.id in run.graph.carried else out


def _elementwise_node(run: _Run, n, ins: list) -> torch.Tensor:
    """The value of an element-wise, reduction or matmul node from its operand values (which may
    carry a leading axis of iterations: `batched`)."""
    return _compute(run, n, ins)


def _compute(run: _Run, n, ins: list):
    """The value of node ``n`` from its operands' values (None for an assemble, which writes)."""
    op = n.op
    dt = n.dtype
    if op in _ELEMENTWISE and len(ins) > 1:
        ins = _common_valid(ins)
    if op == "update":   # a computed tensor with a window written (`ops._assemble_into_value`)
        out = ins[0].clone()
        src = ins[1]
        offs = run.offsets(n, tuple(src.shape), out.shape, "assemble into")
        _window(out, offs, tuple(src.shape)).copy_(src)
        return out
    if op in special.REGISTRY:
        return special.REGISTRY[op].run(n, ins, run.graph)
    elif op == "math":
        return ops_math.compute(n, ins)
    elif op == "alloc":
        return torch.zeros(n.shape, dtype=dt.torch)
    elif op == "view":
        shape = n.shape
        if "valid_shape" in n.attrs:   # a valid part known only now: the ops after it see that part
            shape = tuple(s if v is None else max(0, min(int(run.ev(v)), s)) for v, s in zip(n.attrs["valid_shape"], n.shape))
        # the input may itself hold only its valid part: the window keeps within it
        shape = tuple(min(s, d) for s, d in zip(shape, ins[0].shape)) if ins[0].shape != n.shape else shape
        offs = run.offsets(n, shape, ins[0].shape, "view")
        return _window(ins[0], offs, shape)
    elif op == "reshape":
        x = ins[0]
        if x.numel() == math.prod(n.shape) and "valid_shape" not in n.attrs:
            return x.reshape(n.shape)
        else:
            return _reshape_valid(run, n, x)
    elif op == "transpose":
        if "perm" in n.attrs:
            return ins[0].permute(*n.attrs["perm"]).contiguous()
        else:
            return ins[0].transpose(n.attrs["dim0"], n.attrs["dim1"]).contiguous()
    elif op == "full":
        shape = n.shape
        if "valid_shape" in n.attrs:
            shape = tuple(s if v is None else max(0, min(int(run.ev(v)), s)) for v, s in zip(n.attrs["valid_shape"], n.shape))
        return torch.full(shape, n.attrs["value"], dtype=torch.float64).to(dt.torch)
    elif op == "arange":
        # index * step + start, in the output dtype (fp32: two rounded vector ops)
        idx = torch.arange(n.shape[0], dtype=torch.float64 if dt.lab not in _FLOAT else torch.float32)
        if dt.lab in _FLOAT:
            r = _round(_round(idx * n.attrs["step"], dt).float() + n.attrs["start"], dt)
        else:
            r = (idx * n.attrs["step"] + n.attrs["start"]).to(dt.torch)
        return r
    elif op == "expand":
        x = ins[0]
        lead = tuple(x.shape[:x.dim() - len(n.shape)])   # a leading axis of iterations (`batched`)
        return x.expand(*lead, *n.shape).clone()
    elif op in ("cmp", "cmps"):
        a = ins[0]
        b = ins[1] if op == "cmp" else n.attrs["scalar"]
        fn = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
        return fn[n.attrs["mode"]](a, b)
    elif op == "logical_and":
        return torch.logical_and(ins[0], ins[1])
    elif op == "logical_not":
        return torch.logical_not(ins[0])
    elif op == "where":
        it = iter(ins[1:])
        x = next(it) if "x" not in n.attrs else torch.tensor(n.attrs["x"], dtype=dt.torch)
        y = next(it) if "y" not in n.attrs else torch.tensor(n.attrs["y"], dtype=dt.torch)
        return torch.where(ins[0].to(torch.bool), x.to(dt.torch), y.to(dt.torch))
    elif op == "assemble":
        dst = ins[1]
        src = ins[0]   # its valid part (a tensor whose valid shape is known only at run time holds just that)
        offs = run.offsets(n, tuple(src.shape), dst.shape, "assemble into")
        _window(dst, offs, tuple(src.shape)).copy_(src)
    elif op == "matmul":
        a, b = ins[0], ins[1]
        if n.attrs["a_trans"]:
            a = a.transpose(-1, -2)
        if n.attrs["b_trans"]:
            b = b.transpose(-1, -2)
        if a.shape[-1] != b.shape[-2]:
            # an operand holding its valid part only (valid shape known at run time): the Cube sums
            # over the K both hold, the rest of the tile being no data
            kk = min(a.shape[-1], b.shape[-2])
            a, b = a.narrow(-1, 0, kk), b.narrow(-2, 0, kk)
        ind = run.graph.nodes[n.inputs[0]].dtype.lab
        bias = ins[2].reshape(-1) if len(ins) > 2 else None  # added to the fp32 accumulator (BiasTable)
        if ind == "int8":
            r = numerics.matmul_int8(a, b, bias=bias)
            return r.to(dt.torch) if dt.lab != "int32" else r
        else:
            out = dt.lab if dt.lab in _FLOAT else None
            return numerics.matmul(a, b, dtype=ind, out_dtype=out, bias=bias).to(dt.torch)
    elif op in ("amax", "amin", "sum"):
        x = ins[0]
        d = n.attrs["dim"]
        if op == "sum":
            if dt.lab in _FLOAT:
                r = _tree(x, d, torch.add, dt)
            else:
                r = x.sum(dim=d, keepdim=True, dtype=dt.torch)
        else:
            r = x.amax(dim=d, keepdim=True) if op == "amax" else x.amin(dim=d, keepdim=True)
        return r if n.attrs["keepdim"] else r.squeeze(d)
    elif op == "cast":
        return cast_rules.cast(ins[0], dt.torch, n.attrs.get("mode"), n.attrs.get("satmode"))
    else:
        return _elementwise(op, ins, run.ev(n.attrs.get("scalar")), dt)


def _elementwise(op, ins, s, dt) -> torch.Tensor:
    fl = dt.lab in _FLOAT
    x = [_f32(t) for t in ins] if fl else ins
    a = x[0]
    if op == "add":
        r = a + x[1]
    elif op == "sub":
        r = a - x[1]
    elif op == "mul":
        r = a * x[1]
    elif op == "div":
        r = a / x[1] if fl else torch.div(a, x[1], rounding_mode="trunc")
    elif op == "maximum":
        r = torch.maximum(a, x[1])
    elif op == "minimum":
        r = torch.minimum(a, x[1])
    elif op == "adds":
        r = a + s
    elif op == "subs":
        r = a - s
    elif op == "rsubs":
        r = s - a
    elif op == "muls":
        r = a * s
    elif op == "divs":
        r = a / s
    elif op == "rdivs":
        r = s / a
    elif op == "exp":
        r = torch.exp(a)
    elif op == "sqrt":
        r = torch.sqrt(a)
    elif op == "rsqrt":
        r = torch.rsqrt(a)
    elif op == "reciprocal":
        r = 1.0 / a
    elif op == "neg":
        r = -a
    elif op == "abs":
        r = a.abs()
    elif op == "relu":
        r = torch.relu(a)
    elif op == "maxs":
        r = torch.clamp(a, min=s)
    elif op == "mins":
        r = torch.clamp(a, max=s)
    elif op == "sigmoid":
        # 1 / (1 + exp(-x)) with each vector step rounded to the dtype
        r = _f32(_round(1.0 / _f32(_round(torch.exp(_f32(_round(-a, dt))), dt) + 1.0), dt))
    elif op == "log":
        r = torch.log(a)
    elif op == "expm1":
        r = _f32(_round(torch.exp(a), dt)) - 1.0
    elif op == "erf":
        r = torch.erf(a)
    elif op == "erfc":
        r = torch.erfc(a)
    elif op in ("ceil", "floor", "trunc", "round"):
        r = getattr(torch, op)(a)
    elif op == "pow":
        r = torch.pow(a, x[1])
    elif op == "pows":
        r = torch.pow(a, s)
    else:
        raise NotImplementedError(op)
    return _round(r, dt) if fl else r.to(dt.torch)
