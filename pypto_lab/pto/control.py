"""Control flow of the PyPTO API: ``loop``, ``loop_unroll``, ``cond``, ``is_loop_begin``,
``is_loop_end``.

A loop of at most `loops.UNROLL_LIMIT` iterations with bounds known while tracing is unrolled
(each iteration's operations enter the Tensor Graph with their loop path; the index is a Python
int, so ``if idx < 2:`` and ``lst[idx]`` work directly). A longer loop, or one whose bounds are
`SymbolicScalar` values known only at run time (a count read from a tensor), stays one loop node:
its body is traced once per class of iterations with a symbolic index (`loops`)."""

from __future__ import annotations

from . import config, loops
from .dtypes import dim_value
from .errors import LoopError
from .symbolic import ConcreteScalar, SymbolicScalar, is_symbolic


class LoopIndex(ConcreteScalar):
    """An iteration index of an unrolled loop that remembers its loop (for is_loop_begin /
    is_loop_end); arithmetic on it gives ConcreteScalars (``.min`` / ``.max`` work)."""

    def __new__(cls, value, start, stop, step, name):
        obj = int.__new__(cls, value)
        obj.loop = (start, stop, step, name)
        return obj


_counter = [0]


def _bound(what: str, value, call: str) -> int:
    """A loop bound as a Python int (a SymbolicDim resolved to the size it is bound to)."""
    if isinstance(value, float) and not value.is_integer():
        raise LoopError(f"{call}: the {what} {value!r} is not a whole number. Rule: loop bounds count iterations. "
                        f"Fix: round it first (math.ceil({value!r}) or int({value!r}))")
    if isinstance(value, SymbolicScalar):
        return value.args[0] if value.kind == "imm" else value
    v = value if isinstance(value, int) else dim_value(value)
    if v is None:
        raise LoopError(f"{call}: the {what} {value!r} is a dynamic dimension with no size yet. Rule: loops are "
                        "unrolled while tracing, so their bounds must be known then. Fix: use the size of a tensor "
                        "argument (x.shape[0]) or a dimension an argument's annotation binds")
    return int(v)


def _ints(args, call: str = "pypto.loop"):
    if not 1 <= len(args) <= 3:
        raise LoopError(f"{call}{tuple(args)}: {len(args)} bounds given. Rule: {call} takes (stop), (start, stop) or "
                        f"(start, stop, step), like range(). Fix: e.g. {call}(0, n, 1)")
    names = {1: ("stop",), 2: ("start", "stop"), 3: ("start", "stop", "step")}[len(args)]
    vals = dict(zip(names, (_bound(n, a, call) for n, a in zip(names, args))))
    start, stop, step = vals.get("start", 0), vals["stop"], vals.get("step", 1)
    if not is_symbolic(step) and step == 0:
        raise LoopError(f"{call}({start}, {stop}, 0): a step of 0 never reaches the stop. Rule: the step is a "
                        f"non-zero integer, as in range(). Fix: {call}({start}, {stop}, 1) to visit every index, or "
                        f"{call}({start}, {stop}, tile) to visit one index per tile")
    return start, stop, step


def loop(*args, name: str | None = None, idx_name: str | None = None, submit_before_loop: bool = False,
         parallel: bool = False, unroll_list=None, **ignored):
    """``for i in pypto.loop(start, stop, step, name=..., idx_name=...)`` (or ``loop(stop)``). Other
    keywords are ignored, as the real ``pypto.loop(**kwargs)`` reads only the ones it knows."""
    if len(args) == 4:  # loop(start, stop, step, max_unroll) as in some examples
        args = args[:3]
    start, stop, step = _ints(args)
    _counter[0] += 1
    name = name or f"loop_{_counter[0]}"
    tr = config.STATE.trace
    symbolic = any(is_symbolic(b) for b in (start, stop, step))
    if tr is not None and (symbolic or len(range(start, stop, step)) > loops.UNROLL_LIMIT):
        yield from loops.symbolic_loop(tr, start, stop, step, name, idx_name or name)
        return
    if symbolic:
        raise LoopError(f"pypto.loop({start}, {stop}, {step}) outside a kernel being traced: its bounds are known "
                        "only when a kernel runs. Fix: use it inside a @pypto.jit kernel")
    for i in range(start, stop, step):
        idx = LoopIndex(i, start, stop, step, name)
        if tr is not None:
            tr.loops.append(f"{name}[{i}]")
        try:
            yield idx
        finally:
            if tr is not None:
                tr.loops.pop()


def loop_unroll(*args, name: str | None = None, idx_name: str | None = None, unroll_list=None,
                submit_before_loop: bool = False, **ignored):
    """Yields ``(idx, unroll_factor)`` as the real ``pypto.loop_unroll`` does
    (python/pypto/_controller.py at 883e7df): for each factor ``p`` of ``unroll_list`` (1 always
    added), largest first, a ``pypto.loop(nstart, stop - left, step * p)`` with ``left = (stop - start)
    % (step * p)``, whose body handles ``p`` iterations; the next factor starts where it stopped.
    Each of those loops is a `loop`: unrolled while tracing when short and known, a symbolic loop
    when long or when its bounds are known only at run time (a trip count read from a tensor), its
    body then traced once per factor."""
    start, stop, step = _ints(args, "pypto.loop_unroll")
    if not is_symbolic(step) and step < 0:
        raise LoopError(f"pypto.loop_unroll({start}, {stop}, {step}): the step is negative. Rule: loop_unroll counts "
                        "up (step > 0). Fix: count up and index from the end (n - 1 - idx), or use pypto.loop, which "
                        "takes a negative step")
    if is_symbolic(step):
        raise LoopError(f"pypto.loop_unroll({start}, {stop}, {step}): the step is known only at run time. Rule: "
                        "the step of loop_unroll is a whole number known while tracing (the unrolled bodies are "
                        "step x factor apart). Fix: a constant step")
    bad = [f for f in (unroll_list or []) if isinstance(f, bool) or not isinstance(f, int) or f < 1]
    if bad:
        raise LoopError(f"pypto.loop_unroll: unroll_list {list(unroll_list)} holds {bad[0]!r}. Rule: unroll factors "
                        "are positive integers (1 is always added). Fix: e.g. unroll_list=[4, 2, 1]")
    factors = sorted(set(list(unroll_list or []) + [1]), reverse=True)
    _counter[0] += 1
    name = name or f"loop_{_counter[0]}"
    nstart = start
    for p in factors:
        nstep = step * p
        left = (stop - start) % nstep
        for idx in loop(nstart, stop - left, nstep, name=f"{name}_LoopUnroll{p}", idx_name=idx_name or name,
                        submit_before_loop=submit_before_loop):
            yield idx, p
        nstart = stop - left


def cond(scalar) -> bool:
    """``if pypto.cond(expr):`` — the condition of a traced branch. An int or a concrete value is
    evaluated while tracing; a symbolic condition on loop indices (``i < 3``, ``is_loop_end(i)``)
    splits the loop's iterations into classes, each traced once and picked per iteration when
    the kernel runs; a condition on tensor data raises `ScalarReadError` (use pypto.where)."""
    return bool(scalar)


def _loop_of(idx):
    if not isinstance(idx, SymbolicScalar) or idx.kind != "idx":
        raise LoopError(f"{idx!r} is not the index of a pypto.loop. Rule: is_loop_begin / is_loop_end take the "
                        "index a pypto.loop yields. Fix: pass the loop variable itself (for i in pypto.loop(n): "
                        "... pypto.is_loop_end(i))")
    tr = config.STATE.trace
    return tr.graph.nodes[idx.args[0]].attrs


def is_loop_begin(idx, *args):
    if isinstance(idx, SymbolicScalar):
        return idx == _loop_of(idx)["start"]
    loop_info = getattr(idx, "loop", None)
    start = loop_info[0] if loop_info else 0
    return int(idx) == start


def is_loop_end(idx, *args):
    if isinstance(idx, SymbolicScalar):
        if args:
            return idx == args[0] - 1
        a = _loop_of(idx)
        start, stop, step = a["start"], a["stop"], a["step"]
        return idx == start + ((stop - start - 1) // step) * step
    loop_info = getattr(idx, "loop", None)
    if args:
        return int(idx) == int(args[0]) - 1
    if not loop_info:
        return False
    start, stop, step, _ = loop_info
    last = start + ((stop - start - 1) // step) * step
    return int(idx) == last
