"""Control flow of the PyPTO API: ``loop``, ``loop_unroll``, ``cond``, ``is_loop_begin``,
``is_loop_end``. Loops are unrolled while tracing (each iteration's operations enter the Tensor
Graph with their loop path); loop indices are Python ints, so ``if idx < 2:`` works directly."""

from __future__ import annotations

from . import config
from .dtypes import dim_value


class LoopIndex(int):
    """An iteration index that remembers its loop (for is_loop_begin / is_loop_end)."""

    def __new__(cls, value, start, stop, step, name):
        obj = int.__new__(cls, value)
        obj.loop = (start, stop, step, name)
        return obj


_counter = [0]


def _ints(args):
    vals = [dim_value(a) if not isinstance(a, int) else a for a in args]
    if len(vals) == 1:
        return 0, vals[0], 1
    if len(vals) == 2:
        return vals[0], vals[1], 1
    if len(vals) == 3:
        return vals[0], vals[1], vals[2]
    raise TypeError("loop takes (stop), (start, stop) or (start, stop, step)")


def loop(*args, name: str | None = None, idx_name: str | None = None, submit_before_loop: bool = False,
         parallel: bool = False, unroll_list=None):
    """``for i in pypto.loop(start, stop, step, name=..., idx_name=...)`` (or ``loop(stop)``)."""
    if len(args) == 4:  # loop(start, stop, step, max_unroll) as in some examples
        args = args[:3]
    start, stop, step = _ints(args)
    _counter[0] += 1
    name = name or f"loop_{_counter[0]}"
    tr = config.STATE.trace
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
                submit_before_loop: bool = False):
    """Yields ``(idx, unroll_factor)``: the largest factor of ``unroll_list`` (always with 1) that
    still fits the remaining iterations; the body then handles ``unroll_factor`` iterations."""
    start, stop, step = _ints(args)
    factors = sorted(set(list(unroll_list or []) + [1]), reverse=True)
    _counter[0] += 1
    name = name or f"loop_{_counter[0]}"
    tr = config.STATE.trace
    i = start
    while i < stop:
        left = -(-(stop - i) // step)
        f = next(f for f in factors if f <= left)
        if tr is not None:
            tr.loops.append(f"{name}[{i}x{f}]")
        try:
            yield LoopIndex(i, start, stop, step, name), f
        finally:
            if tr is not None:
                tr.loops.pop()
        i += f * step


def cond(scalar) -> bool:
    """``if pypto.cond(expr):`` — the condition of a traced branch (evaluated while tracing)."""
    return bool(scalar)


def is_loop_begin(idx, *args) -> bool:
    loop_info = getattr(idx, "loop", None)
    start = loop_info[0] if loop_info else 0
    return int(idx) == start


def is_loop_end(idx, *args) -> bool:
    loop_info = getattr(idx, "loop", None)
    if args:
        return int(idx) == int(args[0]) - 1
    if not loop_info:
        return False
    start, stop, step, _ = loop_info
    last = start + ((stop - start - 1) // step) * step
    return int(idx) == last
