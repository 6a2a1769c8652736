"""Checker of exercise 03, vector tiles and double buffering: a `simulate_vector` kernel that
reaches a share of its roofline.

A failure is explained from the attempt's simulation: the UB bytes its live tiles take (and
whether a second slot fitted), the tiles each core streams, the busy fraction of each pipe on
the busiest core, the roofline and which of HBM or the Vector unit sets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hw.chip import DTYPE_BYTES, get_chip
from ..hw.kernels import VECTOR_OPS, simulate_vector
from ..hw.tiling import TilingError, VecTile, ceil_div
from .verdict import Attempt, Verdict, bound_line, busy_fractions, busy_line, call_answer, kb


def as_vector_answer(answer) -> tuple[VecTile, bool]:
    """(tile, double_buffer) from ``{"tile": (rows, cols), "double_buffer": bool}``."""
    try:
        rows, cols = answer["tile"]
        db = answer["double_buffer"]
    except (TypeError, KeyError, ValueError):
        raise TypeError(f"{answer!r} is not an answer: write {{'tile': (rows, cols), 'double_buffer': True}}") from None
    if not isinstance(db, bool):
        raise TypeError(f"double_buffer = {db!r}: write True or False")
    return VecTile(rows, cols), db


@dataclass(frozen=True)
class VectorTiles:
    """Exercise 03: a vector tile and double buffering for ``op`` over ``numel`` values that reach
    at least ``target`` of the roofline (``roofline_cycles / cycles``)."""

    chip: str = "Ascend910B1"
    op: str = "gelu"
    numel: int = 16 * 1024 * 1024
    dtype: str = "fp16"
    target: float = 0.90

    @property
    def live_tiles(self) -> int:
        return VECTOR_OPS[self.op].live_buffers

    def check(self, answer) -> Verdict:
        """``answer``: ``{"tile": (rows, cols), "double_buffer": bool}`` or a function returning it."""
        chip = get_chip(self.chip)
        a = Attempt("vector tiles")
        try:
            tile, db = as_vector_answer(call_answer(answer))
        except NotImplementedError as err:
            return a.not_attempted(err, "answer()")
        except Exception as err:
            return a.broken(err, "answer()")
        ub = chip.buffer("UB").size_bytes
        eb = DTYPE_BYTES[self.dtype]
        a.facts.update(tile=tile, double_buffer=db)
        a.say(f"tile {tile}, double_buffer={db}: {self.op} over {self.numel:,} {self.dtype} values on {chip.name}")
        try:
            r = simulate_vector(self.op, self.numel, dtype=self.dtype, chip=chip, tile=tile, double_buffer=db)
        except TilingError as err:
            a.report = err
            why = [str(err)]
            if isinstance(tile.rows, int) and isinstance(tile.cols, int) and tile.rows > 0 and tile.cols > 0:
                need = tile.elems * eb * self.live_tiles
                if need > ub:
                    a.facts["overflow"] = {"UB": (need, ub)}
                    most = ub // (self.live_tiles * eb)
                    why.insert(0, f"UB overflows by {need - ub:,} bytes: {self.op} keeps {self.live_tiles} tiles live, "
                                  f"{self.live_tiles} x {tile.elems:,} x {eb} bytes = {need:,}, UB holds {ub:,}; a tile "
                                  f"of at most {most:,} elements fits ({most // 2:,} with two slots)")
            return a.fail("rule 1, illegal tile", "the tile breaks a rule of the chip", why)
        a.report = r
        one = tile.elems * eb * self.live_tiles
        slots = max(1, r.buffer_peak["UB"] // one)
        eff = r.roofline_cycles / r.cycles
        goal = r.roofline_cycles / self.target
        busy = busy_fractions(r.pipe_busy, r.cycles)
        tiles = ceil_div(self.numel, tile.elems)
        a.facts.update(cycles=r.cycles, target_cycles=goal, efficiency=eff, slots=slots,
                       bound=max(busy, key=busy.get) if busy else "")
        a.say(f"  UB {kb(r.buffer_peak['UB'])} of {kb(ub)} ({slots} slot(s) of {self.live_tiles} live tiles); "
              f"{tiles:,} tiles on {r.cores_used} cores, {ceil_div(tiles, r.cores_used):,} per core")
        a.say(f"  {r.cycles:,.0f} cycles; the roofline ({r.bound}-bound) is {r.roofline_cycles:,.0f}: {eff:.1%} of it")
        a.say(f"  busy fraction per pipe on the busiest core: {busy_line(busy)}")
        if eff >= self.target:
            return a.ok(f"{eff:.1%} of the roofline >= {self.target:.0%}")
        why = []
        if slots == 1:
            if db:
                why.append(f"double buffering was asked, but two slots of {self.live_tiles} live tiles need "
                           f"{2 * one:,} bytes and UB holds {ub:,}: the kernel ran with one slot")
            else:
                why.append("one UB slot: a tile's load (MTE2), compute (VECTOR) and store (MTE3) wait for each "
                           "other, so the memory system idles while the Vector unit works")
        why.append(bound_line(busy))
        if slots == 2 and max(busy.values(), default=0) < 0.9:
            why.append(f"each core streams {ceil_div(tiles, r.cores_used):,} tiles of {kb(tile.elems * eb)}: every "
                       f"load pays the GM round trip before its first byte, and every vector instruction its "
                       f"start-up; fewer, larger tiles amortise them")
        return a.fail("rule 2, roofline", f"{eff:.1%} < {self.target:.0%} of the roofline: {r.cycles:,.0f} cycles "
                      f"where the target is {goal:,.0f} or fewer", why)


__all__ = ["VectorTiles", "as_vector_answer"]
