"""Pipeline schedules of a training step: 1F1B and interleaved 1F1B as Megatron-Core runs them,
each stage's forward and backward passes of every micro-batch placed in time, with the bubbles
between them.

`order(pp, vpp, m, stage)` is the sequence of passes one stage runs, as Megatron-Core's schedules
issue them (`megatron/core/pipeline_parallel/schedules.py`):

* 1F1B (``forward_backward_pipelining_without_interleaving``): stage ``s`` runs ``pp - s - 1``
  warm-up forwards, then alternates one forward and one backward, then drains the remaining
  backwards (Narayanan et al., SC'21, section 2.2, PipeDream-Flush);
* interleaved 1F1B (``..._with_interleaving``, ``vpp`` model chunks per stage): ``(pp - s - 1) * 2 +
  (vpp - 1) * pp`` warm-up forwards; the ``k``-th forward runs chunk ``(k // pp) % vpp`` of
  micro-batch ``(k // (pp * vpp)) * pp + k % pp``, the ``k``-th backward the chunks in reverse;
  when the micro-batches equal the stages every forward runs first.

`simulate` places the passes: a pass starts when its stage is free and its input has arrived (a
forward the activations of the previous chunk, a backward the gradient of the next one) plus one
point-to-point transfer between different stages; sends do not hold the sender (Megatron's
batched isend/irecv). What a stage spends waiting is its bubble: with equal stages 1F1B idles
``(pp - 1) / (m + pp - 1)`` of the step, interleaving divides the warm-up and drain by ``vpp``
(Narayanan et al., section 2.2: bubble ``(p - 1) / (v m)`` of the ideal time).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


class Pass(NamedTuple):
    """One forward ("F") or backward ("B") pass of micro-batch ``micro`` through model chunk
    ``chunk`` (0..vpp-1) of stage ``stage``, placed in time (a named tuple: a step of a large
    pipeline places tens of thousands)."""

    stage: int
    kind: str
    micro: int
    chunk: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Schedule:
    """Every pass of a step on every stage, and where each stage idled."""

    pp: int
    vpp: int
    micro_batches: int
    passes: tuple[Pass, ...]

    def of(self, stage: int) -> list[Pass]:
        return list(self._by_stage[stage])

    @functools.cached_property
    def _by_stage(self) -> tuple[tuple[Pass, ...], ...]:
        out: list[list[Pass]] = [[] for _ in range(self.pp)]
        for p in self.passes:
            out[p.stage].append(p)
        return tuple(tuple(ps) for ps in out)

    @functools.cached_property
    def end_us(self) -> float:
        return max(p.end_us for p in self.passes)

    def busy_us(self, stage: int) -> float:
        return self._stats[stage][0]

    def last_backward_end(self, stage: int) -> float:
        return self._stats[stage][1]

    @functools.cached_property
    def _stats(self) -> tuple[tuple[float, float], ...]:
        """Per stage: its busy time and the end of its last backward."""
        return tuple((sum(p.end_us - p.start_us for p in ps), max(p.end_us for p in ps if p.kind == "B"))
                     for ps in self._by_stage)

    def bubble_us(self, stage: int) -> float:
        """Time stage ``stage`` idles between the step's start and the end of its last pass."""
        return self.last_backward_end(stage) - self.busy_us(stage)

    @property
    def bubble_fraction(self) -> float:
        """The largest share of the pipeline's span any stage spends idle."""
        span = self.end_us
        return max(0.0, max((span - self.busy_us(s)) / span for s in range(self.pp))) if span > 0 else 0.0

    def idle(self, stage: int) -> list[tuple[float, float]]:
        """The gaps of stage ``stage`` (start, end), from 0 to its last pass."""
        gaps, t = [], 0.0
        for p in sorted(self.of(stage), key=lambda p: p.start_us):
            if p.start_us > t + 1e-9:
                gaps.append((t, p.start_us))
            t = max(t, p.end_us)
        return gaps


def order(pp: int, vpp: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """The passes stage ``stage`` runs, in order, as (kind, micro-batch, chunk)."""
    return list(_order(pp, vpp, m, stage))


@functools.lru_cache(maxsize=256)
def _order(pp: int, vpp: int, m: int, stage: int) -> tuple[tuple[str, int, int], ...]:
    if vpp == 1:
        warm = min(pp - stage - 1, m)
        out = [("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            out += [("F", warm + i, 0), ("B", i, 0)]
        out += [("B", m - warm + j, 0) for j in range(warm)]
        return tuple(out)
    total = m * vpp

    def micro(k: int) -> int:
        return (k // (pp * vpp)) * pp + k % pp

    def fwd(k: int) -> tuple[str, int, int]:
        return ("F", micro(k), (k // pp) % vpp)

    def bwd(k: int) -> tuple[str, int, int]:
        return ("B", micro(k), vpp - 1 - (k // pp) % vpp)

    warm = total if m == pp else min(total, (pp - stage - 1) * 2 + (vpp - 1) * pp)
    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out += [fwd(warm + k), bwd(k)]
    out += [bwd(k) for k in range(total - warm, total)]
    return tuple(out)


def simulate(forward_us: Sequence[Sequence[float]], backward_us: Sequence[Sequence[float]], m: int,
             p2p_us: float = 0.0) -> Schedule:
    """Place every pass of ``m`` micro-batches: ``forward_us[s][c]`` and ``backward_us[s][c]`` are
    one micro-batch's forward and backward through chunk ``c`` of stage ``s``; ``p2p_us`` the
    transfer between two stages (activations forward, their gradient backward)."""
    pp, vpp = len(forward_us), len(forward_us[0])
    chunks = pp * vpp                       # global chunk g = c * pp + s (Megatron's model chunks)
    orders = [_order(pp, vpp, m, s) for s in range(pp)]
    # done[(micro * chunks + global chunk) * 2 + (1 for a backward)]: the pass's end
    done: dict[int, float] = {}
    free = [0.0] * pp
    at = [0] * pp
    passes: list[Pass] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progress = False
        for s in range(pp):
            seq = orders[s]
            n, k, t = len(seq), at[s], free[s]
            fw, bw = forward_us[s], backward_us[s]
            while k < n:
                kind, i, c = seq[k]
                g = c * pp + s
                if kind == "F":
                    dep = (i * chunks + g - 1) * 2 if g > 0 else -1
                    dep_stage = (g - 1) % pp
                else:
                    dep = (i * chunks + g + 1) * 2 + 1 if g < chunks - 1 else (i * chunks + g) * 2
                    dep_stage = (g + 1) % pp if g < chunks - 1 else s
                if dep >= 0:
                    got = done.get(dep)
                    if got is None:
                        break
                    ready = got + (p2p_us if dep_stage != s else 0.0)
                else:
                    ready = 0.0
                start = t if t > ready else ready
                t = start + (fw[c] if kind == "F" else bw[c])
                done[(i * chunks + g) * 2 + (kind == "B")] = t
                passes.append(Pass(s, kind, i, c, start, t))
                k += 1
                remaining -= 1
                progress = True
            at[s], free[s] = k, t
        if not progress:   # pragma: no cover - the orders above never deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    return Schedule(pp, vpp, m, tuple(passes))


def in_flight(pp: int, vpp: int, m: int, stage: int) -> list[int]:
    """The most micro-batches whose activations chunk ``c`` of stage ``stage`` holds at once
    (forwards run whose backward has not), for each chunk: what the stage's memory must keep."""
    live = [0] * vpp
    peak = [0] * vpp
    for kind, _, c in _order(pp, vpp, m, stage):
        live[c] += 1 if kind == "F" else -1
        peak[c] = max(peak[c], live[c])
    return peak


def peak_activations(pp: int, vpp: int, m: int, stage: int, per_chunk: Sequence[float]) -> float:
    """The stage's largest sum of live activations over its pass order (``per_chunk[c]``: one
    micro-batch's activations of chunk ``c``)."""
    return max((sum(n * a for n, a in zip(live, per_chunk)) for live in _live_peaks(pp, vpp, m, stage)),
               default=0.0)


@functools.lru_cache(maxsize=256)
def _live_peaks(pp: int, vpp: int, m: int, stage: int) -> tuple[tuple[int, ...], ...]:
    """The live micro-batches per chunk at each point of the pass order where a run of forwards
    ends (the live sum can only peak there), each distinct vector once."""
    live = [0] * vpp
    out: set[tuple[int, ...]] = set()
    seq = _order(pp, vpp, m, stage)
    for k, (kind, _, c) in enumerate(seq):
        live[c] += 1 if kind == "F" else -1
        if kind == "F" and (k + 1 == len(seq) or seq[k + 1][0] == "B"):
            out.add(tuple(live))
    return tuple(sorted(out))


__all__ = ["Pass", "Schedule", "in_flight", "order", "peak_activations", "simulate"]
