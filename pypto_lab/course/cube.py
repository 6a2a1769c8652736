"""Checkers of the Cube tiling exercises: fit the tiles (01) and beat the default (02).

Every figure a message gives is computed from the student's own tiling: the buffer that
overflows and by how many bytes, the pipe that bounds the simulated kernel, the bytes it moves
between GM and the cores against the least it must move, the blocks and waves over the cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hw.chip import DTYPE_BYTES, Chip, get_chip
from ..hw.kernels import KernelReport, simulate_matmul
from ..hw.tiling import CubeTile, TilingError, ceil_div, cube_tile_bytes, default_cube_tile, plan_cube
from .verdict import Attempt, Verdict, bound_line, busy_fractions, busy_line, call_answer, kb, mb

BUFFER_FORMULAS = {
    "L0A": "m_l0 x k_l0 operand elements",
    "L0B": "k_l0 x n_l0 operand elements",
    "L0C": "m_l0 x n_l0 accumulator elements",
    "L1": "(m_l1 + n_l1) x k_l1 operand elements (one K panel of A and of B)",
}


def as_tile(answer) -> CubeTile:
    """A `CubeTile` from PyPTO's ``([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])`` or a CubeTile."""
    if isinstance(answer, CubeTile):
        return answer
    try:
        m, k, n = answer
        return CubeTile.from_pypto(list(m), list(k), list(n))
    except (TypeError, ValueError, IndexError):
        raise TypeError(f"{answer!r} is not a tiling: write ([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1]), "
                        "e.g. ([128, 128], [64, 256], [128, 128])") from None


def requested_bytes(chip: Chip, tile: CubeTile, dtype: str) -> dict[str, int] | None:
    """Bytes one tile takes in each buffer (None when a tile size is not a positive integer)."""
    if not all(isinstance(v, int) and v > 0 for v in tile.to_dict().values()):
        return None
    return cube_tile_bytes(tile, dtype, chip)


def overflows(chip: Chip, tile: CubeTile, dtype: str) -> dict[str, tuple[int, int]]:
    """Buffers one tile of ``tile`` does not fit: {buffer: (bytes needed, capacity)}."""
    need = requested_bytes(chip, tile, dtype) or {}
    return {b: (n, chip.buffer(b).size_bytes) for b, n in need.items() if n > chip.buffer(b).size_bytes}


def illegal_tiling_lines(chip: Chip, tile: CubeTile, dtype: str, err: TilingError) -> list[str]:
    """Why a tiling is illegal: each overflowing buffer with its bytes, else the rule of the error."""
    over = overflows(chip, tile, dtype)
    if not over:
        return [str(err)]
    eb = DTYPE_BYTES[dtype]
    lines = []
    for buf, (need, cap) in over.items():
        per = DTYPE_BYTES[chip.cube.accumulator[dtype]] if buf == "L0C" else eb
        lines.append(f"{buf} overflows by {need - cap:,} bytes: one tile is {BUFFER_FORMULAS[buf]} x {per} bytes "
                     f"= {need:,} bytes ({kb(need)}), {buf} holds {cap:,} ({kb(cap)})")
    lines.append(str(err))
    return lines


def blocks_and_waves(chip: Chip, tile: CubeTile, m: int, n: int) -> tuple[int, int, int]:
    """(blocks of C, waves over the cube cores, blocks in the last wave)."""
    blocks = ceil_div(m, tile.m_l1) * ceil_div(n, tile.n_l1)
    waves = ceil_div(blocks, chip.cube_cores)
    return blocks, waves, blocks - (waves - 1) * chip.cube_cores


def traffic_lines(r: KernelReport, tile: CubeTile, m: int, k: int, n: int, dtype: str) -> list[str]:
    """The GM bytes of a matmul against the minimum, and where the re-reads come from.

    The minimum reads A and B once and writes C once (``report.min_gm_bytes``). A blocked matmul
    reads A's rows once per block column and B's columns once per block row; when the simulator
    counts more than that, and the excess matches the L0 sub-tiles of a block while K spans
    several L1 panels, the L1 block is re-read per sub-tile."""
    eb = DTYPE_BYTES[dtype]
    ob = DTYPE_BYTES["int32" if dtype == "int8" else dtype]  # simulate_matmul's default out_dtype
    c_bytes = m * n * ob
    reads, least = r.gm_bytes - c_bytes, r.min_gm_bytes - c_bytes
    a_bytes, b_bytes = m * k * eb, k * n * eb
    cols, rows = ceil_div(n, tile.n_l1), ceil_div(m, tile.m_l1)
    blocked = a_bytes * cols + b_bytes * rows
    lines = [f"GM traffic: {mb(r.gm_bytes)}, {r.gm_bytes / r.min_gm_bytes:.1f}x the {mb(r.min_gm_bytes)} minimum "
             f"(A and B read once, C written once): the kernel re-reads its operands {reads / least:.1f}x",
             f"with {tile.m_l1}x{tile.n_l1} blocks, A ({mb(a_bytes)}) is read once per block column ({cols}x) and "
             f"B ({mb(b_bytes)}) once per block row ({rows}x): {mb(blocked)}; larger m_l1 and n_l1 re-read less"]
    extra = reads / blocked if blocked else 1.0
    if extra > 1.05:
        panels = ceil_div(k, tile.k_l1)
        subs = ceil_div(tile.m_l1, tile.m_l0) * ceil_div(tile.n_l1, tile.n_l0)
        if panels > 1 and subs > 1 and abs(extra - subs) <= 0.1 * subs:
            lines.append(f"the simulator reads {extra:.1f}x even that: K spans {panels} L1 panels of k_l1 = {tile.k_l1}, "
                         f"so each block's L1 panels come again from GM for each of its {subs} L0 sub-tiles "
                         f"({tile.m_l1 // tile.m_l0} x {tile.n_l1 // tile.n_l0} of {tile.m_l0}x{tile.n_l0}); "
                         f"make m_l1 = m_l0 and n_l1 = n_l0 (or k_l1 >= K = {k} if L1 holds it)")
        else:
            lines.append(f"the simulator reads {extra:.1f}x that count")
    return lines


def _sim_lines(chip: Chip, r: KernelReport, tile: CubeTile, m: int, n: int) -> list[str]:
    blocks, waves, last = blocks_and_waves(chip, tile, m, n)
    busy = busy_fractions(r.pipe_busy, r.cycles)
    return [f"{r.cycles:,.0f} cycles = {r.time_us:.1f} us, Cube utilisation {r.cube_utilization:.1%}; "
            f"{blocks} blocks on {r.cores_used} of {chip.cube_cores} cube cores: {waves} wave(s), the last with "
            f"{last} block(s)",
            f"busy fraction per pipe on the busiest core: {busy_line(busy)}"]


@dataclass(frozen=True)
class FitTheTiles:
    """Exercise 01: a legal tiling whose L0A and L0B hold two tiles each (ping-pong) and whose
    Cube is at least ``target`` utilised, with double buffering on."""

    chip: str = "Ascend910B1"
    m: int = 3072
    k: int = 3072
    n: int = 3072
    dtype: str = "fp16"
    target: float = 0.75

    def check(self, answer) -> Verdict:
        """``answer``: a tiling ``([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])`` or a function returning one."""
        chip = get_chip(self.chip)
        a = Attempt("fit the tiles")
        try:
            tile = as_tile(call_answer(answer))
        except NotImplementedError as err:
            return a.not_attempted(err, "answer()")
        except Exception as err:  # the student's code: quote it, never raise
            return a.broken(err, "answer()")
        a.say(f"tile {tile} for a {self.m}x{self.k}x{self.n} {self.dtype} matmul on {chip.name}")
        a.facts["tile"] = tile
        try:
            plan = plan_cube(chip, tile, self.dtype, self.m, self.k, self.n, double_buffer=True)
        except TilingError as err:
            a.report = err
            a.facts["overflow"] = overflows(chip, tile, self.dtype)
            a.facts["requested"] = requested_bytes(chip, tile, self.dtype)
            return a.fail("rule 1, illegal tiling", "the tiling breaks a rule of the chip",
                          illegal_tiling_lines(chip, tile, self.dtype, err))
        a.say("  " + ", ".join(f"{b} {plan.slots[b]} x {kb(plan.bytes_per_slot[b])} of {kb(chip.buffer(b).size_bytes)}"
                               for b in ("L0A", "L0B", "L0C", "L1")))
        for buf, side in (("L0A", "m_l0"), ("L0B", "n_l0")):
            if plan.slots[buf] < 2:
                one, cap = plan.bytes_per_slot[buf], chip.buffer(buf).size_bytes
                a.facts["single_slot"] = buf
                return a.fail("rule 2, no ping-pong", f"{buf} holds one tile, not two",
                              [f"one {buf} tile is {one:,} bytes; two need {2 * one:,} and {buf} holds {cap:,}: "
                               f"MTE1 cannot load the next tile while the Cube multiplies this one, so they take turns",
                               f"halve k_l0 or {side} (two tiles of {cap // 2:,} bytes at most)"])
        r = simulate_matmul(self.m, self.k, self.n, dtype=self.dtype, chip=chip, tile=tile, double_buffer=True)
        a.report = r
        for line in _sim_lines(chip, r, tile, self.m, self.n):
            a.say("  " + line)
        compute = r.cube_utilization * r.cycles
        goal = compute / self.target
        a.facts.update(cycles=r.cycles, target_cycles=goal, utilization=r.cube_utilization,
                       gm_bytes=r.gm_bytes, min_gm_bytes=r.min_gm_bytes)
        if r.cube_utilization < self.target:
            busy = busy_fractions(r.pipe_busy, r.cycles)
            a.facts["bound"] = max(busy, key=busy.get)
            return a.fail("rule 3, Cube utilisation",
                          f"{r.cube_utilization:.1%} < {self.target:.0%}: {r.cycles:,.0f} cycles where the target is "
                          f"{goal:,.0f} or fewer",
                          [bound_line(busy)] + traffic_lines(r, tile, self.m, self.k, self.n, self.dtype))
        return a.ok(f"legal, L0A and L0B double-buffered, Cube utilisation {r.cube_utilization:.1%} >= {self.target:.0%}",
                    traffic_lines(r, tile, self.m, self.k, self.n, self.dtype))


@dataclass(frozen=True)
class BeatTheDefault:
    """Exercise 02: a legal tiling, double-buffered, at least ``gain`` faster than the default
    tiling (`default_cube_tile`) of the same matmul."""

    chip: str = "Ascend910B1"
    m: int = 1024
    k: int = 1024
    n: int = 1024
    dtype: str = "fp16"
    gain: float = 0.10

    def default(self) -> KernelReport:
        chip = get_chip(self.chip)
        tile = default_cube_tile(chip, self.m, self.k, self.n, self.dtype)
        return simulate_matmul(self.m, self.k, self.n, dtype=self.dtype, chip=chip, tile=tile, double_buffer=True)

    def check(self, answer) -> Verdict:
        chip = get_chip(self.chip)
        a = Attempt("beat the default")
        try:
            tile = as_tile(call_answer(answer))
        except NotImplementedError as err:
            return a.not_attempted(err, "answer()")
        except Exception as err:
            return a.broken(err, "answer()")
        base = self.default()
        base_tile = CubeTile(**base.tile)
        goal = (1 - self.gain) * base.cycles
        a.facts.update(tile=tile, default_cycles=base.cycles, target_cycles=goal)
        a.say(f"tile {tile} for a {self.m}x{self.k}x{self.n} {self.dtype} matmul on {chip.name}; the default "
              f"{base_tile} takes {base.cycles:,.0f} cycles, so the target is {goal:,.0f} or fewer")
        try:
            r = simulate_matmul(self.m, self.k, self.n, dtype=self.dtype, chip=chip, tile=tile, double_buffer=True)
        except TilingError as err:
            a.report = err
            a.facts["overflow"] = overflows(chip, tile, self.dtype)
            a.facts["requested"] = requested_bytes(chip, tile, self.dtype)
            return a.fail("illegal tiling", "the tiling breaks a rule of the chip",
                          illegal_tiling_lines(chip, tile, self.dtype, err))
        a.report = r
        for line in _sim_lines(chip, r, tile, self.m, self.n):
            a.say("  " + line)
        saved = 1 - r.cycles / base.cycles
        a.facts.update(cycles=r.cycles, saved=saved)
        if r.cycles > goal:
            why = []
            blocks, waves, last = blocks_and_waves(chip, tile, self.m, self.n)
            b0, w0, last0 = blocks_and_waves(chip, base_tile, self.m, self.n)
            slots = waves * chip.cube_cores
            why.append(f"{blocks} blocks make {waves} wave(s) on {chip.cube_cores} cores: {slots - blocks} of {slots} "
                       f"core-turns idle ({(slots - blocks) / slots:.0%}); the default's {b0} blocks make {w0} wave(s) "
                       f"with {w0 * chip.cube_cores - b0} idle")
            if r.cores_used < chip.cube_cores:
                why.append(f"only {r.cores_used} of {chip.cube_cores} cores get a block: smaller blocks spread the work")
            why.append(bound_line(busy_fractions(r.pipe_busy, r.cycles)))
            why.extend(traffic_lines(r, tile, self.m, self.k, self.n, self.dtype))
            return a.fail("not fast enough", f"{saved:+.1%} time saved against the default, {self.gain:.0%} needed "
                          f"({r.cycles:,.0f} cycles, target {goal:,.0f})", why)
        return a.ok(f"{saved:.1%} faster than the default ({r.cycles:,.0f} against {base.cycles:,.0f} cycles)")


__all__ = ["BeatTheDefault", "FitTheTiles", "as_tile", "blocks_and_waves", "illegal_tiling_lines", "overflows",
           "requested_bytes", "traffic_lines"]
