"""The event simulator: pipe instructions with durations and dependencies -> a timeline.

The model of an AI Core's issue logic: instructions arrive in program order; each one runs on
one pipe (MTE1, MTE2, MTE3, FIXP, CUBE, VECTOR, SCALAR of some core); a pipe executes its
instructions in order, one at a time; different pipes run in parallel; an instruction that waits
on a flag (set_flag/wait_flag between pipes) starts only after the instruction that set it ends.
So an instruction starts at ``max(its pipe is free, all its dependencies have ended)``.

`Program` collects instructions (with ``set_flag``/``wait_flag`` helpers and ping-pong buffer
slots); `simulate` runs the compiled core loop (numba) and returns a `Timeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .chip import PIPE_INDEX, PIPES

N_PIPES = len(PIPES)


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


@dataclass
class Timeline:
    """What the simulator returns: one row per instruction, plus totals."""

    core: np.ndarray       # int32, core id of each instruction
    pipe: np.ndarray       # int8, index into PIPES
    kind: np.ndarray       # int16, index into `kinds`
    start: np.ndarray      # float64 cycles: the instruction takes its pipe
    end: np.ndarray        # float64 cycles: the pipe is free again (start + duration)
    ready: np.ndarray      # float64 cycles: its result is ready for waiting instructions
    kinds: list[str]
    total_cycles: float
    busy: np.ndarray       # float64 [n_cores, N_PIPES]: busy cycles of every pipe of every core

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def pipe_busy(self, core: int | None = None) -> dict[str, float]:
        """Busy cycles per pipe, of one core or (core=None) summed over all cores."""
        row = self.busy.sum(axis=0) if core is None else self.busy[core]
        return {name: float(row[i]) for i, name in enumerate(PIPES)}

    def records(self, limit: int | None = None) -> list[dict]:
        n = len(self) if limit is None else min(limit, len(self))
        return [
            {
                "core": int(self.core[i]),
                "pipe": PIPES[self.pipe[i]],
                "op": self.kinds[self.kind[i]],
                "start": float(self.start[i]),
                "end": float(self.end[i]),
                "ready": float(self.ready[i]),
            }
            for i in range(n)
        ]

    def overlapping(self) -> bool:
        """True if any pipe of any core runs two instructions at once (never, by construction)."""
        lane = self.core.astype(np.int64) * N_PIPES + self.pipe
        order = np.lexsort((self.start, lane))
        same = lane[order][1:] == lane[order][:-1]
        return bool(np.any(self.start[order][1:][same] < self.end[order][:-1][same] - 1e-9))


class Program:
    """A list of pipe instructions in program order, built by the tile programs.

    ``emit`` appends one instruction and returns its index; ``deps`` are indices of earlier
    instructions it waits for (the wait_flag side of a set_flag/wait_flag pair).
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

    # set_flag / wait_flag in the words of Ascend C: the producer instruction sets an event,
    # the consumer waits for it. The simulator only needs the producer's index.
    def set_flag(self, core: int, src: str, dst: str, event: int, instr: int) -> None:
        self._flags[(core, src, dst, event)] = instr

    def wait_flag(self, core: int, src: str, dst: str, event: int) -> int | None:
        return self._flags.pop((core, src, dst, event), None)

    def arrays(self):
        n = len(self.pipe)
        counts = np.fromiter((len(d) for d in self.deps), np.int64, n)
        dep_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=dep_ptr[1:])
        dep_idx = np.fromiter((j for d in self.deps for j in d), np.int64, int(dep_ptr[-1]))
        return (
            np.asarray(self.core, np.int32),
            np.asarray(self.pipe, np.int8),
            np.asarray(self.duration, np.float64),
            np.asarray(self.latency, np.float64),
            np.asarray(self.kind, np.int16),
            dep_ptr,
            dep_idx,
        )


class PingPong:
    """Buffer slots of one on-chip buffer: with 2 slots (double buffering) tile i+1 loads while
    tile i is consumed. ``acquire`` returns the instruction that must end before the slot is
    overwritten (the last reader of the tile that occupied it ``slots`` loads ago)."""

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self._last_reader: list[int | None] = [None] * self.slots
        self._next = 0

    def acquire(self) -> tuple[int, int | None]:
        slot = self._next
        self._next = (self._next + 1) % self.slots
        return slot, self._last_reader[slot]

    def release(self, slot: int, reader: int) -> None:
        self._last_reader[slot] = reader


def simulate_arrays(core, pipe, duration, dep_ptr, dep_idx, n_cores: int | None = None, latency=None):
    """Run the compiled event loop on plain arrays. Dependencies must point backwards.

    Returns ``(start, ready, busy[n_cores, 7], total)``; the pipe is free at ``start + duration``.
    """
    core = np.asarray(core, np.int32)
    pipe = np.asarray(pipe, np.int8)
    duration = np.asarray(duration, np.float64)
    n = pipe.shape[0]
    latency = np.zeros(n) if latency is None else np.asarray(latency, np.float64)
    if dep_idx.size:
        owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(dep_ptr))
        if np.any(dep_idx >= owner) or np.any(dep_idx < 0):
            bad = int(np.argmax((dep_idx >= owner) | (dep_idx < 0)))
            raise ValueError(
                f"instruction {owner[bad]} depends on instruction {dep_idx[bad]}: a wait_flag may only "
                "wait for an instruction issued before it (program order); reorder the program"
            )
    if n_cores is None:
        n_cores = int(core.max()) + 1 if n else 1
    lane = core.astype(np.int64) * N_PIPES + pipe
    start, ready, busy, total = _run(lane, duration, latency, dep_ptr, dep_idx, n_cores * N_PIPES)
    return start, ready, busy.reshape(n_cores, N_PIPES), total


def _timeline(core, pipe, duration, latency, kind, dep_ptr, dep_idx, kinds, n_cores) -> Timeline:
    start, ready, busy, total = simulate_arrays(core, pipe, duration, dep_ptr, dep_idx, n_cores, latency)
    return Timeline(core, pipe, kind, start, start + duration, ready, list(kinds), float(total), busy)


def simulate(program: Program, n_cores: int | None = None) -> Timeline:
    """Simulate a `Program` and return its `Timeline`."""
    core, pipe, duration, latency, kind, dep_ptr, dep_idx = program.arrays()
    return _timeline(core, pipe, duration, latency, kind, dep_ptr, dep_idx, program.kinds, n_cores)


def concat_programs(parts: list[tuple[Program, list[int]]]) -> tuple:
    """Lay identical per-core programs side by side: ``parts`` is [(template program, placements)].

    A template is built once with core ids 0..j (e.g. 0 = a cube core, 1 and 2 = its vector cores)
    and replicated for every placement: an int (template core 0 runs there) or a tuple mapping
    template core j to a chip core. Dependency indices are shifted per copy.
    """
    cores, pipes, durs, lats, kinds, ptrs, idxs = [], [], [], [], [], [], []
    offset = 0
    ptr_base = 0
    kind_names: list[str] = []
    for prog, core_ids in parts:
        c, p, d, lat, k, dp, di = prog.arrays()
        remap = np.array([_intern(kind_names, name) for name in prog.kinds], np.int16)
        k = remap[k] if k.size else k
        n = p.shape[0]
        for cid in core_ids:
            mapping = np.atleast_1d(np.asarray(cid, np.int32))  # template core j runs on mapping[j]
            cores.append(mapping[c])
            pipes.append(p)
            durs.append(d)
            lats.append(lat)
            kinds.append(k)
            ptrs.append(dp[:-1] + ptr_base)
            idxs.append(di + offset)
            offset += n
            ptr_base += int(dp[-1])
    if not pipes:
        empty = np.zeros(0, np.int64)
        return (np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(0), np.zeros(0), np.zeros(0, np.int16),
                np.zeros(1, np.int64), empty, kind_names)
    dep_ptr = np.concatenate(ptrs + [np.array([ptr_base], np.int64)])
    return (np.concatenate(cores), np.concatenate(pipes), np.concatenate(durs), np.concatenate(lats),
            np.concatenate(kinds), dep_ptr, np.concatenate(idxs), kind_names)


def _intern(names: list[str], name: str) -> int:
    try:
        return names.index(name)
    except ValueError:
        names.append(name)
        return len(names) - 1


def simulate_chip(parts: list[tuple[Program, list]], n_cores: int) -> Timeline:
    """Simulate per-core programs replicated over the cores that run them."""
    core, pipe, duration, latency, kind, dep_ptr, dep_idx, kinds = concat_programs(parts)
    return _timeline(core, pipe, duration, latency, kind, dep_ptr, dep_idx, kinds, n_cores)
