"""A symbolic loop's iterations run at once, when they are independent: the numerics of `execute`
with a leading iteration axis instead of a Python loop over iterations.

A loop of 100,000 iterations run one by one costs a dozen torch calls per iteration (views,
arithmetic, the write-back); run at once, each node of the body is one torch call over every
iteration. That is only the same computation when no iteration sees another's results, so a
loop is batched only if all of these hold (else `execute` runs it iteration by iteration):

* its bodies hold only views and reshapes, element-wise ops (not ``tril`` / ``triu`` /
  ``fillpad``, which depend on the tile's position), reductions, casts, matmuls and assembles,
  no nested loop, no special op (gather, sort, ...) and no run-time valid shape;
* a body reads GM (views of kernel arguments or ``pypto.tensor`` buffers, values the body writes
  in place (``acc[:] = ...``), and scalar reads in its offsets) only from tensors no body of the
  loop writes: nothing flows between iterations;
* the windows the iterations write do not overlap (they are disjoint along some axis, checked on
  the offsets of every iteration), so the order of the writes does not matter;
* a view's offsets into a tensor computed in the body are the same in every iteration.

Each operation rounds as it does per iteration (element-wise ops and the reductions' pairwise
trees work row by row whatever the leading axis); a batched matmul sums the same exact products
in fp32 in torch's order, within the error bound `pypto_lab.hw.numerics` states for every matmul.
"""

from __future__ import annotations

import numpy as np
import torch

from .graph import ELEMENTWISE, REDUCTIONS
from .symbolic import SymbolicScalar

_MATH_POSITIONAL = ("tril", "triu", "fillpad")
_OK = frozenset(ELEMENTWISE) | frozenset(REDUCTIONS) | {"view", "reshape", "assemble", "matmul", "transpose"}


def _evaluate(x, run, idx):
    return x.evaluate(idx, run.read) if isinstance(x, SymbolicScalar) else x


def _roots_read(n, nodes) -> set:
    out = set()
    for off in n.attrs.get("offsets", ()):
        if isinstance(off, SymbolicScalar):
            out |= _scalar_reads(off)
    return out


def _scalar_reads(expr) -> set:
    if expr.kind == "read":
        out = {expr.args[0]}
        for i in expr.args[1]:
            if isinstance(i, SymbolicScalar):
                out |= _scalar_reads(i)
        return out
    out = set()
    for a in expr.args:
        if isinstance(a, SymbolicScalar):
            out |= _scalar_reads(a)
    return out


def plan(graph, loop_node) -> dict | None:
    """Whether the loop's bodies can run batched (the structural rules of the module docstring):
    per body the node ids, the roots it writes and reads; None if not."""
    nodes = graph.nodes
    bodies, written, read = [], set(), set()
    for var in loop_node.attrs["variants"]:
        ids = list(range(var["lo"], var["hi"]))
        body = set(ids)
        for i in ids:
            n = nodes[i]
            if n.op not in _OK or (n.op == "math" and n.attrs.get("fn") in _MATH_POSITIONAL):
                return None
            if "valid_shape" in n.attrs:
                return None
            if isinstance(n.attrs.get("scalar"), SymbolicScalar) and n.attrs["scalar"].depends_on_data():
                return None
            read |= _roots_read(n, nodes)
            if n.op == "assemble":
                written.add(n.attrs["root"])
            elif n.op == "view":
                src = n.inputs[0]
                if src in body:
                    if any(isinstance(o, SymbolicScalar) and o.loop_ids() for o in n.attrs["offsets"]):
                        return None   # a window of a per-iteration value that moves with the iteration
                elif "root" in n.attrs:
                    read.add(n.attrs["root"])
                else:
                    return None
            else:
                for j in n.inputs:
                    if j not in body:
                        jn = nodes[j]
                        root = jn.attrs.get("root", j) if jn.op in ("view", "param", "alloc") or j in graph.carried \
                            else None
                        if root is not None:
                            read.add(root)
        bodies.append(ids)
    if written & read:
        return None
    return {"bodies": bodies, "written": written}


def _window_index(offsets: np.ndarray, shape) -> tuple:
    """Index arrays selecting, for every iteration (rows of ``offsets``), the window of ``shape``
    at its offsets: a tuple of broadcastable LongTensors of shape (N, s0, s1, ...)."""
    n, rank = offsets.shape
    out = []
    for d in range(rank):
        ix = torch.from_numpy(offsets[:, d]).view(n, *([1] * rank)) + torch.arange(shape[d]).view(
            *([1] * (d + 1)), shape[d], *([1] * (rank - d - 1)))
        out.append(ix)
    return tuple(out)


def _varying(offsets: np.ndarray) -> list[int]:
    return [d for d in range(offsets.shape[1]) if not (offsets[:, d] == offsets[0, d]).all()]


def _gather(base: torch.Tensor, offsets: np.ndarray, shape) -> torch.Tensor:
    """The windows of ``shape`` at each row of ``offsets``, stacked: (N, *shape). With one axis
    whose offset varies (a row loop), an index_select along it; else advanced indexing."""
    var = _varying(offsets)
    n = offsets.shape[0]
    if len(var) == 1:
        d = var[0]
        x = base
        for e, (o, s) in enumerate(zip(offsets[0].tolist(), shape)):
            if e != d and (o or s != x.shape[e]):
                x = x.narrow(e, o, s)
        idx = (torch.from_numpy(offsets[:, d]).view(n, 1) + torch.arange(shape[d])).reshape(-1)
        y = x.index_select(d, idx)                             # [..., N * s_d, ...]
        y = y.reshape(*y.shape[:d], n, shape[d], *y.shape[d + 1:])
        return y.movedim(d, 0)
    return base[_window_index(offsets, shape)]


def _scatter(dst: torch.Tensor, offsets: np.ndarray, shape, values: torch.Tensor) -> None:
    """Write ``values`` (N, *shape) into the windows of ``dst`` at the rows of ``offsets``."""
    var = _varying(offsets)
    n = offsets.shape[0]
    values = values.to(dst.dtype)
    if len(var) == 1:
        d = var[0]
        x = dst
        for e, (o, s) in enumerate(zip(offsets[0].tolist(), shape)):
            if e != d and (o or s != x.shape[e]):
                x = x.narrow(e, o, s)
        idx = (torch.from_numpy(offsets[:, d]).view(n, 1) + torch.arange(shape[d])).reshape(-1)
        v = values.movedim(0, d)                               # [..., N, s_d, ...]
        v = v.reshape(*v.shape[:d], n * shape[d], *v.shape[d + 2:])
        x.index_copy_(d, idx, v)
        return
    dst.index_put_(_window_index(offsets, shape), values)


def _offsets(run, offs, its_idx, count) -> np.ndarray:
    cols = []
    for o in offs:
        v = _evaluate(o, run, its_idx)
        cols.append(np.broadcast_to(np.asarray(v, dtype=np.int64), (count,)))
    return np.stack(cols, axis=1) if cols else np.zeros((count, 0), np.int64)


def _disjoint(offsets: np.ndarray, shape) -> bool:
    """The windows at ``offsets`` (one row per iteration) of ``shape`` do not overlap: along some
    axis, sorted offsets are at least the window's size apart."""
    if offsets.shape[0] <= 1:
        return True
    for d, s in enumerate(shape):
        col = np.sort(offsets[:, d])
        if (np.diff(col) >= s).all():
            return True
    return False


def _check_bounds(what, offsets, shape, dims, n, run):
    lo = offsets.min(axis=0) if offsets.size else None
    hi = (offsets + np.asarray(shape, np.int64)).max(axis=0) if offsets.size else None
    if lo is not None and ((lo < 0).any() or (hi > np.asarray(dims, np.int64)).any()):
        return False
    return True


def run_batched(run, loop_node, its: np.ndarray, sel: np.ndarray, p: dict, compute) -> bool:
    """Run every iteration of ``loop_node`` at once (``its``: the iteration values, ``sel``: the
    variant of each). False, having changed nothing, when the iterations turn out to depend on
    each other or to leave their tensors (overlapping writes, an offset out of range): the caller
    then runs them one by one, which reports such errors with the iteration. ``compute(run, node,
    operand values)`` is the executor's value of one node (`execute._elementwise_node`)."""

    graph = run.graph
    nodes = graph.nodes
    env = run.env
    lid = loop_node.id
    pending = []   # (root tensor, index tuple, values) written after every read is done
    all_writes: dict[int, list] = {}
    computed: list[tuple[int, dict]] = []
    for k, ids in enumerate(p["bodies"]):
        mask = sel == k
        if not mask.any():
            continue
        sub = its[mask]
        count = int(sub.size)
        idx = dict(run.idx)
        idx[lid] = sub
        vals: dict[int, torch.Tensor] = {}
        batched: set[int] = set()

        def get(j, vals=vals):
            return vals[j] if j in vals else env[j]

        for i in ids:
            n = nodes[i]
            op = n.op
            if op == "view":
                src = n.inputs[0]
                if src in vals:
                    x = vals[src]
                    offs = [int(_evaluate(o, run, run.idx)) for o in n.attrs["offsets"]]
                    lead = 1 if src in batched else 0
                    for d, (o, s) in enumerate(zip(offs, n.shape)):
                        if o or s != x.shape[d + lead]:
                            x = x.narrow(d + lead, o, s)
                    vals[i] = x
                    if src in batched:
                        batched.add(i)
                    continue
                root = n.attrs["root"]
                base = env[root]
                offsets = _offsets(run, n.attrs["root_offsets"], idx, count)
                if not _check_bounds("view", offsets, n.shape, base.shape, n, run):
                    return False
                if (offsets == offsets[:1]).all():
                    x = base
                    for d, (o, s) in enumerate(zip(offsets[0].tolist(), n.shape)):
                        if o or s != x.shape[d]:
                            x = x.narrow(d, o, s)
                    vals[i] = x
                else:
                    vals[i] = _gather(base, offsets, n.shape)
                    batched.add(i)
            elif op == "reshape":
                src = n.inputs[0]
                x = get(src)
                if src in batched:
                    vals[i] = x.reshape((x.shape[0],) + tuple(n.shape))
                    batched.add(i)
                else:
                    vals[i] = x.reshape(n.shape)
            elif op == "assemble":
                src_id = n.inputs[0]
                src = get(src_id)
                root = n.attrs["root"]
                dst = env[root]
                offsets = _offsets(run, n.attrs["root_offsets"], idx, count)
                shape = tuple(n.shape)
                if not _check_bounds("assemble", offsets, shape, dst.shape, n, run):
                    return False
                if src_id not in batched:
                    src = src.expand((count,) + tuple(src.shape))
                all_writes.setdefault(root, []).append((offsets, shape))
                pending.append((dst, offsets, shape, src))
            elif op in ("amax", "amin", "sum"):
                src = n.inputs[0]
                x = get(src)
                node = type(n)(n.id, n.op, n.inputs, n.shape, n.dtype, dict(n.attrs))
                rank = len(nodes[src].shape)
                node.attrs["dim"] = n.attrs["dim"] % rank - rank   # counted from the end: batch-proof
                vals[i] = compute(run, node, [x])
                if src in batched:
                    batched.add(i)
            elif op == "transpose":
                src = n.inputs[0]
                x = get(src)
                lead = 1 if src in batched else 0
                if "perm" in n.attrs:
                    perm = list(range(lead)) + [d + lead for d in n.attrs["perm"]]
                    vals[i] = x.permute(*perm).contiguous()
                else:
                    vals[i] = x.transpose(n.attrs["dim0"] + lead, n.attrs["dim1"] + lead).contiguous()
                if lead:
                    batched.add(i)
            else:
                ins = [get(j) for j in n.inputs]
                scalar = n.attrs.get("scalar")
                if isinstance(scalar, SymbolicScalar) and scalar.loop_ids():
                    return False
                if op == "matmul" or op in ELEMENTWISE:
                    b_in = [j in batched for j in n.inputs]
                    vals[i] = compute(run, n, ins)
                    if any(b_in):
                        batched.add(i)
                else:
                    return False
        computed.append((k, vals))
    # every write of every iteration: disjoint windows, or the order of iterations would matter
    for ws in all_writes.values():
        shapes = {s for _, s in ws}
        if len(shapes) != 1:
            return False
        offs = np.concatenate([o for o, _ in ws], axis=0)
        if not _disjoint(offs, next(iter(shapes))):
            return False
    for dst, offsets, shape, values in pending:
        _scatter(dst, offsets, shape, values)
    return True


__all__ = ["plan", "run_batched"]
