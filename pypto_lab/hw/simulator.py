"""The event simulator: pipe instructions with durations and dependencies -> a timeline.

The model of an AI Core's issue logic: instructions arrive in program order; each one runs on
one pipe (MTE1, MTE2, MTE3, FIXP, CUBE, VECTOR, SCALAR of some core); a pipe executes its
instructions in order, one at a time; different pipes run in parallel; an instruction that waits
on a flag (set_flag/wait_flag between pipes) starts only after the instruction that set it ends.
So an instruction starts at ``max(its pipe is free, all its dependencies have ended)``.

`Program` collects instructions (with ``set_flag``/``wait_flag`` helpers and ping-pong buffer
slots); `simulate` runs the compiled core loop (numba) and returns a `Timeline`. Compiled tile
programs (`pypto_lab.hw.programs`) hand over plain arrays (`ProgramArrays`) instead.

Cores do not interact inside the event loop (the shared memory system enters through the
transfer rates the kernels compute beforehand, and no dependency crosses from one core's copy of
a program to another's), so a program placed on several cores has the same timeline on each.
`simulate_placed` therefore simulates every distinct program once and `Timeline` replicates the
result over its placements: ``len(timeline)`` counts the instructions of the whole chip,
``timeline.simulated`` the instructions the event loop actually stepped. The per-instruction
arrays (``core``, ``pipe``, ``kind``, ``start``, ``end``, ``ready``) are laid out on first use,
in the order a chip-wide program would list them (program by program, placement by placement),
up to `MAX_TIMELINE_ROWS` instructions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numba import njit

from .chip import PIPE_INDEX, PIPES

N_PIPES = len(PIPES)
KIND_DTYPE = np.int32  # instruction kind ids: a pto kernel names one kind per tensor and loop iteration

# Per-instruction arrays of one timeline take about 33 bytes per instruction (core, pipe, kind,
# start, end, ready): beyond this many instructions a timeline keeps its totals only.
MAX_TIMELINE_ROWS = 32_000_000


class InstructionLimitError(ValueError):
    """A program or timeline is too large for this machine's memory: the message names the number
    of instructions, the limit and a fix."""


@njit(cache=True, nogil=True)
def _run(pipe, duration, latency, dep_ptr, dep_idx, n_lanes):
    """Core loop: O(instructions + dependencies). ``pipe`` is a global lane id (core * 7 + pipe).

    An instruction holds its pipe for ``duration`` cycles; its result is ready for the
    instructions that wait on it after ``max(duration, latency)`` (a transfer's round trip can
    outlast the pipe's issue time: the pipe moves on while the data is still in flight).
    """
    n = pipe.shape[0]
    start = np.empty(n, np.float64)
    ready = np.empty(n, np.float64)
    lane_free = np.zeros(n_lanes, np.float64)
    busy = np.zeros(n_lanes, np.float64)
    total = 0.0
    for i in range(n):
        lane = pipe[i]
        t = lane_free[lane]
        for j in range(dep_ptr[i], dep_ptr[i + 1]):
            e = ready[dep_idx[j]]
            if e > t:
                t = e
        start[i] = t
        d = duration[i]
        lane_free[lane] = t + d
        busy[lane] += d
        r = t + (d if d > latency[i] else latency[i])
        ready[i] = r
        if r > total:
            total = r
    return start, ready, busy, total


class ProgramArrays(NamedTuple):
    """A program as plain arrays: what `Program.to_arrays` and the compiled tile programs give.

    ``dep_idx[dep_ptr[i]:dep_ptr[i + 1]]`` are the instructions instruction ``i`` waits for;
    ``kind`` indexes ``kinds``."""

    core: np.ndarray       # int32
    pipe: np.ndarray       # int8, index into PIPES
    duration: np.ndarray   # float64 cycles the pipe is busy
    latency: np.ndarray    # float64 cycles until the result is ready, at least
    kind: np.ndarray       # int32, index into kinds
    dep_ptr: np.ndarray    # int64 [n + 1]
    dep_idx: np.ndarray    # int64
    kinds: list

    @property
    def size(self) -> int:
        """The number of instructions."""
        return int(self.pipe.shape[0])


class SimulatedProgram(NamedTuple):
    """A template program that a compiled tile program simulated while it built it, without
    storing it (`pypto_lab.hw.programs.CubeProgram.simulate`): its totals, and how to build its
    instructions again when a timeline's rows are asked for."""

    size: int              # instructions
    busy: np.ndarray       # float64 [template cores, 7]
    total: float           # cycles until its last result is ready
    kinds: list            # the kinds it uses, in order of first use
    build: Callable[[], ProgramArrays]  # the same program as arrays (kinds numbered as in ``kinds``)


class _Part(NamedTuple):
    """One simulated program and the cores it is placed on (``placements[p, j]``: the chip core
    that template core ``j`` runs on in copy ``p``). ``rows`` is (core, pipe, kind, duration,
    start, ready) of the template, or a function that builds and simulates it again."""

    size: int
    rows: tuple | Callable[[], tuple]
    remap: np.ndarray      # the template's kind ids -> the timeline's
    placements: np.ndarray


class Timeline:
    """What the simulator returns: one row per instruction (``core``, ``pipe``, ``kind``,
    ``start``, ``end``, ``ready``), plus totals (``kinds``, ``total_cycles``,
    ``busy[n_cores, 7]``, the busy cycles of every pipe of every core).

    ``start`` is when an instruction takes its pipe, ``end`` when the pipe is free again
    (start + duration), ``ready`` when its result is ready for waiting instructions. A timeline
    of replicated programs (`simulate_placed`) lays its rows out on first use."""

    def __init__(self, core, pipe, kind, start, end, ready, kinds, total_cycles, busy):
        self._rows = (core, pipe, kind, start, end, ready)
        self._parts: list[_Part] = []
        self._len = int(np.shape(start)[0])
        self.simulated = self._len
        self.kinds = list(kinds)
        self.total_cycles = float(total_cycles)
        self.busy = busy

    @classmethod
    def _replicated(cls, parts: list[_Part], kinds: list[str], total: float, busy: np.ndarray) -> Timeline:
        tl = cls.__new__(cls)
        tl._rows = None
        tl._parts = parts
        tl._len = sum(p.size * int(p.placements.shape[0]) for p in parts)
        tl.simulated = sum(p.size for p in parts)
        tl.kinds = kinds
        tl.total_cycles = float(total)
        tl.busy = busy
        return tl

    def __len__(self) -> int:
        return self._len

    def _laid_out(self) -> tuple:
        if self._rows is None:
            if self._len > MAX_TIMELINE_ROWS:
                raise InstructionLimitError(
                    f"this timeline has {self._len:,} instructions ({self.simulated:,} simulated, replicated over "
                    f"the cores); laying out its per-instruction rows needs about {self._len * 33 / 1e9:.1f} GB, over "
                    f"the limit of {MAX_TIMELINE_ROWS:,} instructions (pypto_lab.hw.simulator.MAX_TIMELINE_ROWS). "
                    "Its totals (total_cycles, busy, pipe_busy()) are available; for the rows, simulate a smaller "
                    "problem or use larger tiles")
            cols: list[list[np.ndarray]] = [[], [], [], [], [], []]
            for p in self._parts:
                core, pipe, kind, duration, start, ready = p.rows() if callable(p.rows) else p.rows
                copies = int(p.placements.shape[0])
                cols[0].append(p.placements[:, core].reshape(-1).astype(np.int32))
                cols[1].append(np.tile(pipe, copies))
                cols[2].append(np.tile(p.remap[kind] if kind.size else kind.astype(KIND_DTYPE), copies))
                cols[3].append(np.tile(start, copies))
                cols[4].append(np.tile(start + duration, copies))
                cols[5].append(np.tile(ready, copies))
            empty = (np.int32, np.int8, KIND_DTYPE, np.float64, np.float64, np.float64)
            self._rows = tuple(np.concatenate(c) if c else np.zeros(0, t) for c, t in zip(cols, empty))
        return self._rows

    def programs(self):
        """The distinct simulated programs: for each, ``(rows, placements)`` where ``rows`` is
        (core, pipe, kind, start, end, ready) of one copy with template core ids, and
        ``placements[p, j]`` the chip core of template core ``j`` in copy ``p``. Lays out one
        program at a time, so it works past `MAX_TIMELINE_ROWS`."""
        if not self._parts:
            core, pipe, kind, start, end, ready = self._laid_out()
            yield (core, pipe, kind, start, end, ready), np.arange(self.busy.shape[0])[None, :]
            return
        for p in self._parts:
            core, pipe, kind, duration, start, ready = p.rows() if callable(p.rows) else p.rows
            kind = p.remap[kind] if kind.size else kind.astype(KIND_DTYPE)
            yield (core, pipe, kind, start, start + duration, ready), p.placements

    core = property(lambda self: self._laid_out()[0], doc="int32, core id of each instruction")
    pipe = property(lambda self: self._laid_out()[1], doc="int8, index into PIPES")
    kind = property(lambda self: self._laid_out()[2], doc="int32, index into `kinds`")
    start = property(lambda self: self._laid_out()[3], doc="float64 cycles: the instruction takes its pipe")
    end = property(lambda self: self._laid_out()[4], doc="float64 cycles: the pipe is free again")
    ready = property(lambda self: self._laid_out()[5], doc="float64 cycles: its result is ready")

    def pipe_busy(self, core: int | None = None) -> dict[str, float]:
        """Busy cycles per pipe, of one core or (core=None) summed over all cores."""
        row = self.busy.sum(axis=0) if core is None else self.busy[core]
        return {name: float(row[i]) for i, name in enumerate(PIPES)}

    def records(self, limit: int | None = None) -> list[dict]:
        n = len(self) if limit is None else min(limit, len(self))
        core, pipe, kind, start, end, ready = self._laid_out()
        return [
            {
                "core": int(core[i]),
                "pipe": PIPES[pipe[i]],
                "op": self.kinds[kind[i]],
                "start": float(start[i]),
                "end": float(end[i]),
                "ready": float(ready[i]),
            }
            for i in range(n)
        ]

    def overlapping(self) -> bool:
        """True if any pipe of any core runs two instructions at once (never, by construction)."""
        core, pipe, _, start, end, _ = self._laid_out()
        lane = core.astype(np.int64) * N_PIPES + pipe
        order = np.lexsort((start, lane))
        same = lane[order][1:] == lane[order][:-1]
        return bool(np.any(start[order][1:][same] < end[order][:-1][same] - 1e-9))

    def __repr__(self) -> str:
        return (f"Timeline({len(self):,} instructions, {self.simulated:,} simulated, "
                f"{self.total_cycles:,.0f} cycles, {self.busy.shape[0]} cores)")


class Program:
    """A list of pipe instructions in program order, built by the tile programs.

    ``emit`` appends one instruction and returns its index; ``deps`` are indices of earlier
    instructions it waits for (the wait_flag side of a set_flag/wait_flag pair). ``extend``
    appends a block of instructions a compiled tile program built (`ProgramArrays`).
    """

    def __init__(self):
        self.core: list[int] = []
        self.pipe: list[int] = []
        self.duration: list[float] = []
        self.latency: list[float] = []
        self.kind: list[int] = []
        self.deps: list[tuple[int, ...]] = []
        self.kinds: list[str] = []
        self._kind_index: dict[str, int] = {}
        self._flags: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self.pipe)

    def kind_id(self, name: str) -> int:
        k = self._kind_index.get(name)
        if k is None:
            k = self._kind_index[name] = len(self.kinds)
            self.kinds.append(name)
        return k

    def emit(self, core: int, pipe: str, cycles: float, kind: str, deps=(), latency: float = 0.0) -> int:
        """Append an instruction holding ``pipe`` for ``cycles``; its result is ready after
        ``max(cycles, latency)``. (The hot path of every tile program: kept lean.)"""
        if cycles < 0 or latency < 0:
            raise ValueError(f"instruction {kind!r} on {pipe}: duration {cycles} / latency {latency} < 0 cycles")
        idx = len(self.pipe)
        self.core.append(core)
        self.pipe.append(PIPE_INDEX[pipe])
        self.duration.append(cycles)
        self.latency.append(latency)
        k = self._kind_index.get(kind)
        self.kind.append(self.kind_id(kind) if k is None else k)
        self.deps.append(tuple([d for d in deps if d is not None and d >= 0]) if deps else ())
        return idx

    def extend(self, block: ProgramArrays) -> None:
        """Append instructions built elsewhere (their dependencies already index this program)."""
        n = block.size
        if not n:
            return
        durations, latencies = block.duration.tolist(), block.latency.tolist()
        if min(durations) < 0 or min(latencies) < 0:
            raise ValueError("a compiled tile program emitted an instruction with a negative duration or latency")
        remap = {}
        kinds = block.kind.tolist()
        for k in kinds:  # intern in order of first use, as emit would
            if k not in remap:
                remap[k] = self.kind_id(block.kinds[k])
        self.core.extend(block.core.tolist())
        self.pipe.extend(block.pipe.tolist())
        self.duration.extend(durations)
        self.latency.extend(latencies)
        self.kind.extend([remap[k] for k in kinds])
        idx = block.dep_idx.tolist()
        ptr = block.dep_ptr.tolist()
        self.deps.extend([tuple(idx[ptr[i]:ptr[i + 1]]) for i in range(n)])

    # set_flag / wait_flag in the words of Ascend C: the producer instruction sets an event,
    # the consumer waits for it. The simulator only needs the producer's index.
    def set_flag(self, core: int, src: str, dst: str, event: int, instr: int) -> None:
        self._flags[(core, src, dst, event)] = instr

    def wait_flag(self, core: int, src: str, dst: str, event: int) -> int | None:
        return self._flags.pop((core, src, dst, event), None)

    def to_arrays(self) -> ProgramArrays:
        n = len(self.pipe)
        counts = np.fromiter((len(d) for d in self.deps), np.int64, n)
        dep_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=dep_ptr[1:])
        dep_idx = np.fromiter((j for d in self.deps for j in d), np.int64, int(dep_ptr[-1]))
        return ProgramArrays(
            np.asarray(self.core, np.int32),
            np.asarray(self.pipe, np.int8),
            np.asarray(self.duration, np.float64),
            np.asarray(self.latency, np.float64),
            np.asarray(self.kind, KIND_DTYPE),
            dep_ptr,
            dep_idx,
            list(self.kinds),
        )

    def arrays(self) -> tuple:
        """(core, pipe, duration, latency, kind, dep_ptr, dep_idx) as numpy arrays."""
        return tuple(self.to_arrays())[:7]


class PingPong:
    """Buffer slots of one on-chip buffer: with 2 slots (double buffering) tile i+1 loads while
    tile i is consumed. ``acquire`` returns the instruction that must end before the slot is
    overwritten (the last reader of the tile that occupied it ``slots`` loads ago)."""

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self._last_reader: list = [None] * self.slots
        self._next = 0

    def acquire(self) -> tuple[int, int | None]:
        slot = self._next
        self._next = (self._next + 1) % self.slots
        return slot, self._last_reader[slot]

    def release(self, slot: int, reader) -> None:
        self._last_reader[slot] = reader

    def state(self) -> np.ndarray:
        """``[next slot, last reader of slot 0, 1, ...]`` (-1: none) for compiled tile programs."""
        readers = [-1 if r is None else r for r in self._last_reader]
        if any(not isinstance(r, (int, np.integer)) for r in readers):
            raise TypeError("PingPong.state: a slot's reader is not one instruction index")
        return np.array([self._next, *readers], np.int64)

    def load_state(self, state: np.ndarray) -> None:
        """Take back the state a compiled tile program advanced."""
        self._next = int(state[0])
        self._last_reader = [None if r < 0 else int(r) for r in state[1:].tolist()]


@njit(cache=True, nogil=True)
def _lanes(core, pipe, dep_ptr, dep_idx):
    """Global lane ids (core * 7 + pipe), and the first instruction that waits for itself or a
    later one (-1: none)."""
    n = pipe.shape[0]
    lane = np.empty(n, np.int64)
    bad = -1
    for i in range(n):
        lane[i] = core[i] * 7 + pipe[i]
        if bad < 0:
            for j in range(dep_ptr[i], dep_ptr[i + 1]):
                if dep_idx[j] >= i or dep_idx[j] < 0:
                    bad = i
                    break
    return lane, bad


def simulate_arrays(core, pipe, duration, dep_ptr, dep_idx, n_cores: int | None = None, latency=None):
    """Run the compiled event loop on plain arrays. Dependencies must point backwards.

    Returns ``(start, ready, busy[n_cores, 7], total)``; the pipe is free at ``start + duration``.
    """
    core = np.asarray(core, np.int32)
    pipe = np.asarray(pipe, np.int8)
    duration = np.asarray(duration, np.float64)
    n = pipe.shape[0]
    latency = np.zeros(n) if latency is None else np.asarray(latency, np.float64)
    dep_ptr = np.asarray(dep_ptr, np.int64)
    dep_idx = np.asarray(dep_idx, np.int64)
    lane, bad = _lanes(core, pipe, dep_ptr, dep_idx)
    if bad >= 0:
        deps = dep_idx[dep_ptr[bad]:dep_ptr[bad + 1]]
        wrong = int(deps[(deps >= bad) | (deps < 0)][0])
        raise ValueError(
            f"instruction {bad} depends on instruction {wrong}: a wait_flag may only "
            "wait for an instruction issued before it (program order); reorder the program"
        )
    if n_cores is None:
        n_cores = int(core.max()) + 1 if n else 1
    start, ready, busy, total = _run(lane, duration, latency, dep_ptr, dep_idx, n_cores * N_PIPES)
    return start, ready, busy.reshape(n_cores, N_PIPES), total


def simulate(program: Program, n_cores: int | None = None) -> Timeline:
    """Simulate a `Program` and return its `Timeline`."""
    a = program.to_arrays()
    start, ready, busy, total = simulate_arrays(a.core, a.pipe, a.duration, a.dep_ptr, a.dep_idx, n_cores, a.latency)
    return Timeline(a.core, a.pipe, a.kind, start, start + a.duration, ready, a.kinds, float(total), busy)


def simulate_placed(parts: list[tuple[Program | ProgramArrays | SimulatedProgram, list]], n_cores: int) -> Timeline:
    """Simulate per-core programs placed on the cores that run them.

    ``parts`` is [(template program, placements)]: a template is built with core ids 0..j (e.g.
    0 = a cube core, 1 and 2 = its vector cores) and placed once per placement, an int (template
    core 0 runs there) or a tuple mapping template core j to a chip core (or all placements as
    one array, a row per placement). Every template is
    simulated once (a `SimulatedProgram` already was); its timeline holds on each placement
    (cores do not interact in the event loop), so the chip's timeline replicates it (module
    docstring)."""
    kinds: list[str] = []
    kind_index: dict[str, int] = {}
    out: list[_Part] = []
    busy = np.zeros((n_cores, N_PIPES))
    total = 0.0
    for prog, core_ids in parts:
        if isinstance(core_ids, np.ndarray):
            placements = core_ids.astype(np.int64, copy=False).reshape(len(core_ids), -1)
        else:
            placements = np.array([np.atleast_1d(np.asarray(c, np.int64)) for c in core_ids], np.int64)
        if not placements.size:
            continue
        width = placements.shape[1]
        if isinstance(prog, SimulatedProgram):
            size, tbusy, t, names, rows = prog.size, prog.busy, prog.total, prog.kinds, _rebuilt(prog.build)
            used = int(np.nonzero(tbusy.any(axis=1))[0].max()) + 1 if tbusy.any() else 1
        else:
            a = prog.to_arrays() if isinstance(prog, Program) else prog
            size, names = a.size, a.kinds
            used = int(a.core.max()) + 1 if size else 1
            start, ready, tbusy, t = simulate_arrays(a.core, a.pipe, a.duration, a.dep_ptr, a.dep_idx, used,
                                                     a.latency)
            rows = (a.core, a.pipe, a.kind, a.duration, start, ready)
        if used > width:
            raise ValueError(f"a program uses template cores 0..{used - 1} but its placements map only {width} of "
                             "them; give every placement a chip core per template core")
        k = min(width, tbusy.shape[0])
        for row in placements:
            busy[row[:k]] += tbusy[:k]
        total = max(total, float(t))
        remap = np.array([_intern(kinds, kind_index, name) for name in names], KIND_DTYPE)
        out.append(_Part(size, rows, remap, placements))
    return Timeline._replicated(out, kinds, total, busy)


def _rebuilt(build: Callable[[], ProgramArrays]) -> Callable[[], tuple]:
    """The rows of a program built again and simulated (the same figures as when it was first run)."""
    def rows() -> tuple:
        a = build()
        start, ready, _, _ = simulate_arrays(a.core, a.pipe, a.duration, a.dep_ptr, a.dep_idx, None, a.latency)
        return a.core, a.pipe, a.kind, a.duration, start, ready
    return rows


def _intern(names: list[str], index: dict[str, int], name: str) -> int:
    k = index.get(name)
    if k is None:
        k = index[name] = len(names)
        names.append(name)
    return k


__all__ = ["InstructionLimitError", "KIND_DTYPE", "MAX_TIMELINE_ROWS", "PingPong", "Program", "ProgramArrays",
           "SimulatedProgram", "Timeline", "simulate", "simulate_arrays", "simulate_placed"]
