"""Symbolic loops: a ``pypto.loop`` kept as one loop node of the Tensor Graph instead of being
unrolled (a loop of more than `UNROLL_LIMIT` iterations, or whose bounds are known only when the
kernel runs, such as a count read from a tensor).

**Tracing.** The body is traced with a symbolic index (`SymbolicScalar`) whose *hint* is the
iteration being traced. Where the body needs a Python value of the index (``if idx < 3:``, a
slice's size, ``int(idx)``) the hint is used and recorded as a *guard*. After a pass, the loop
checks (vectorised over every iteration) which iterations satisfy all its guards; the first
iteration that does not is traced again as the next *variant* (iteration class). A body without
guards is traced once, whatever the trip count; ``if pypto.is_loop_begin(i):`` gives two variants
(first, rest). A variant per iteration (``int(idx)`` everywhere) is refused past `MAX_VARIANTS`.

**Running.** `execute.run_graph` runs the loop iteration by iteration: it picks the first variant
whose guards hold, binds the index, evaluates symbolic offsets, tensor reads and bounds, and
counts the iterations of every variant.

**Costing** (`cost_copies` / `expand`). Iterations are independent tasks to the scheduler: the
tasks of iteration i+1 go to the next cores (round robin, `blocks`) and start when their inputs
are ready, so a loop runs *waves* of iterations side by side. A wave W is as many iterations as
fill the cores once (ceil(cores / tasks of one iteration)). Each variant's body is tiled,
scheduled and simulated for two waves (``2W`` copies, or every iteration when there are fewer) in
one flat copy of the graph, the *base*: the second wave queues behind the first on the same
cores and overlaps it (loads under compute, ping-pong UB slots), so it shows the steady state.
The base minus one wave, divided by W, is the variant's marginal cost per iteration; the run's
cost is the base plus, per variant, ``(iterations - simulated copies) x marginal``. Cycles, flops,
bytes and pipe busy time are extrapolated alike. Assumptions: the second wave is the steady state;
variants run in the order traced (first / middle / last are simulated in that order); loops
nested in a symbolic loop use W = 1. Scalar reads of tensor data are not costed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import config, symbolic
from .errors import LoopError
from .graph import TensorGraph
from .symbolic import SymbolicScalar, evaluate, hint_of

UNROLL_LIMIT = 64     # loops of at most this many iterations (known bounds) are unrolled while tracing
MAX_VARIANTS = 64     # at most this many distinct traced bodies per symbolic loop


@dataclass
class LoopFrame:
    """A symbolic loop while its body is traced."""

    node: int
    name: str
    idx: SymbolicScalar
    guards: list = field(default_factory=list)   # of the variant being traced: (expr, expected, where)


def frames() -> list[LoopFrame]:
    tr = config.STATE.trace
    return [] if tr is None else tr.sym_loops


def record_guard(expr: SymbolicScalar, truth: bool) -> None:
    """``expr``'s hint was used as a Python value: the traced body holds where it comes out the same."""
    ids = expr.loop_ids()
    if not ids:
        return False
    for fr in reversed(frames()):
        if fr.node in ids:
            text = str(expr)
            if any(str(g[0]) == text for g in fr.guards):
                return True
            fr.guards.append((expr, bool(expr.hint) if truth else int(expr.hint), truth, config.STATE.trace.where()))
            return True
    return False


symbolic.GUARD_HOOK = record_guard


def record_kernel_guard(expr: SymbolicScalar, truth: bool) -> bool:
    """A value read from the kernel's argument data used as a Python value outside any symbolic loop
    (``if start_pos % ratio + s1 < ratio:`` in a short, unrolled loop): the real frontend compiles
    both branches into the kernel and picks one when it runs; here the trace takes the branch the
    data of this call takes, and records the condition as a *kernel guard*: a later call whose data
    takes another path is traced again (`jit`), so each call runs, and is costed, as its data go."""
    tr = config.STATE.trace
    if tr is None:
        return False
    text = str(expr)
    if not any(str(g[0]) == text for g in tr.kernel_guards):
        tr.kernel_guards.append((expr, bool(expr.hint) if truth else int(expr.hint), truth, tr.where()))
    return True


symbolic.KERNEL_GUARD_HOOK = record_kernel_guard


def guards_hold(guards, idx: dict, read=None):
    """True (or a boolean array when ``idx`` holds arrays) where every guard comes out as traced."""
    ok = True
    for expr, expected, truth, _ in guards:
        v = evaluate(expr, idx, read)
        if truth:
            v = (v != 0) if isinstance(v, np.ndarray) else bool(v)
        hit = v == expected
        ok = np.logical_and(ok, hit) if isinstance(hit, np.ndarray) or isinstance(ok, np.ndarray) else (ok and hit)
    return ok


def symbolic_loop(tr, start, stop, step, name: str, idx_name: str):
    """The generator behind ``pypto.loop`` for a loop kept symbolic: yields once per variant."""
    graph: TensorGraph = tr.graph
    node = graph.add("loop", [], (), None, {"name": name, "idx_name": idx_name, "start": start, "stop": stop,
                                            "step": step, "variants": []}, loop="/".join(tr.loops))
    outer = {f.node: f.idx.hint for f in tr.sym_loops}
    s0, s1, st = hint_of(start), hint_of(stop), hint_of(step)
    data_bound = any(isinstance(b, SymbolicScalar) and b.depends_on_data() for b in (start, stop, step))
    values = None
    if s0 is not None and s1 is not None and st is not None:
        if st == 0:
            raise LoopError(f"pypto.loop({start}, {stop}, {step}): the step is 0 in the iteration traced. Rule: the "
                            "step is a non-zero integer. Fix: a positive step")
        values = np.arange(s0, s1, st, dtype=np.int64)
        if values.size == 0:
            node.attrs["end"] = len(graph.nodes)
            return
    hint = s0 if s0 is not None else 0
    uncovered = None if values is None else np.ones(values.size, bool)
    while True:
        idx = SymbolicScalar.index(node.id, f"loop_idx_{idx_name}", int(hint))
        frame = LoopFrame(node.id, name, idx)
        variant = {"guards": frame.guards, "lo": len(graph.nodes), "hi": None, "hint": int(hint)}
        node.attrs["variants"].append(variant)
        tr.sym_loops.append(frame)
        tr.loops.append(f"{name}[{idx_name}]")
        try:
            yield idx
        finally:
            tr.loops.pop()
            tr.sym_loops.pop()
            variant["hi"] = len(graph.nodes)
            tr.close_body(node.id, variant["lo"], variant["hi"])
        if values is None:
            break
        covered = guards_hold(frame.guards, {**outer, node.id: values}, tr.read_hint)
        covered = np.broadcast_to(np.asarray(covered, bool), values.shape)
        # bounds read from tensor data: the first call's values only pick the classes to trace; the
        # iterations (and so how many copies the cost base simulates) are those of each run
        variant["count"] = None if data_bound else int((covered & uncovered).sum())
        uncovered &= ~covered
        if not uncovered.any():
            break
        if len(node.attrs["variants"]) >= MAX_VARIANTS:
            expr, _, _, where = frame.guards[-1] if frame.guards else (None, None, None, "?")
            raise LoopError(
                f"pypto.loop {name!r} ({values.size} iterations) needs more than {MAX_VARIANTS} traced bodies: the "
                f"body uses its index as a Python value ({expr} at {where}), so every iteration differs. Rule: a loop "
                f"of more than {UNROLL_LIMIT} iterations is traced once per class of iterations, not per iteration. "
                "Fix: keep the index symbolic (slices x[i * t:(i + 1) * t], pypto.view offsets, pypto.cond on "
                "comparisons), or loop over fewer, larger tiles")
        hint = int(values[np.argmax(uncovered)])
    node.attrs["end"] = len(graph.nodes)


# ---- costing: a flat copy of the graph with every variant's body repeated ----

MAX_WAVE = 128        # at most this many copies of a body per wave of the cost model
BASE_WAVES = 4        # waves of iterations simulated per loop variant
MARGINAL_WAVES = 2    # the last this many waves give the marginal cost (two: a ping-pong period of UB slots)


def cost_copies(graph: TensorGraph, waves: dict) -> tuple[dict, dict]:
    """(loop node, variant) -> copies simulated in the base, and the copies of one *wave*.

    A wave is as many iterations as fill the chip's cores once (``waves``: computed from the tasks
    of one copy of the body; 1 for loops nested in a symbolic loop). The base holds two waves (or
    every iteration, when there are fewer): the second shows the steady state, iterations queueing
    behind the first wave on the same cores and overlapping it."""
    copies, wave = {}, {}
    for n in graph.nodes:
        if n.op == "loop":
            for v, var in enumerate(n.attrs["variants"]):
                w = waves.get((n.id, v), 1)
                count = var.get("count")
                full = BASE_WAVES * w
                copies[(n.id, v)] = full if count is None else min(count, full)
                wave[(n.id, v)] = max(1, min(w, copies[(n.id, v)] // BASE_WAVES or 1)) * MARGINAL_WAVES
                wave[(n.id, v)] = min(wave[(n.id, v)], copies[(n.id, v)])
    return copies, wave


def nested(graph: TensorGraph) -> set:
    """The (loop, variant) keys of loops inside another symbolic loop's body."""
    out = set()
    for n in graph.nodes:
        if n.op == "loop":
            for var in n.attrs["variants"]:
                for j in range(var["lo"], var["hi"]):
                    if graph.nodes[j].op == "loop":
                        out |= {(j, v) for v in range(len(graph.nodes[j].attrs["variants"]))}
    return out


def expand(graph: TensorGraph, copies: dict) -> tuple[TensorGraph, list[tuple]]:
    """A flat Tensor Graph (no loop nodes) with the body of variant v of loop l repeated
    ``copies[(l, v)]`` times, and per new node the (loop, variant) path it was copied from."""
    nodes = graph.nodes
    out = TensorGraph(graph.name)
    remap: dict[int, int] = {}
    paths: list[tuple] = []

    def emit(lo, hi, path):
        i = lo
        while i < hi:
            n = nodes[i]
            if n.op == "loop":
                for v, var in enumerate(n.attrs["variants"]):
                    for _c in range(copies.get((n.id, v), 0)):
                        emit(var["lo"], var["hi"], path + ((n.id, v),))
                i = n.attrs["end"]
                continue
            attrs = dict(n.attrs)
            if "root" in attrs:
                attrs["root"] = remap[attrs["root"]]
            new = out.add(n.op, [remap[j] for j in n.inputs], n.shape, n.dtype, attrs, n.vec_tile, n.cube_tile,
                          n.loop, n.where)
            remap[i] = new.id
            paths.append(path)
            i += 1

    emit(0, len(nodes), ())
    out.params = [remap[p] for p in graph.params]
    out.param_names = list(graph.param_names)
    out.returns = [remap[r] for r in graph.returns]
    out.carried = {remap[c] for c in graph.carried if c in remap}
    return out, paths


def loop_nodes(graph: TensorGraph) -> list:
    return [n for n in graph.nodes if n.op == "loop"]


def enclosing_copies(graph: TensorGraph, copies: dict) -> dict:
    """(loop, variant) -> how many copies of its enclosing bodies the base holds (1 at top level)."""
    out = {}

    def walk(lo, hi, mult):
        i = lo
        while i < hi:
            n = graph.nodes[i]
            if n.op == "loop":
                for v, var in enumerate(n.attrs["variants"]):
                    out[(n.id, v)] = mult
                    walk(var["lo"], var["hi"], mult * copies.get((n.id, v), 0))
                i = n.attrs["end"]
                continue
            i += 1

    walk(0, len(graph.nodes), 1)
    return out


__all__ = ["UNROLL_LIMIT", "MAX_VARIANTS", "symbolic_loop", "record_guard", "guards_hold", "expand", "cost_copies"]
