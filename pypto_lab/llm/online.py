"""Continuous batching driven online: requests are added one by one as they arrive and the engine
is advanced one step at a time, for a server (`pypto_lab.server`) whose clients wait on the
simulated card.

`OnlineScheduler` runs the very scheduler of `serving.simulate_serving` (`serving._Continuous`:
the same admission, chunked prefill, paged KV blocks and preemption by recompute) on a `_Sim` whose
per-request arrays grow as requests come. Time is simulated seconds, as offline: ``advance()``
admits the requests that arrived by ``t``, runs one engine step and moves ``t`` to its end; when
nothing runs or waits it jumps to the next arrival it already knows of, and otherwise returns
None. So an online run and `simulate_serving` given the same ``(prompt, output, arrival_s)`` rows
schedule the same steps and give every request the same TTFT and end-to-end latency
(`tests/test_server.py` checks it). What is online only: ``cancel`` (a client that went away: its
KV blocks go back to the pool at once) and the `OnlineStep` each step reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .serving import RequestRecord, ServingConfigError, _Continuous, _kv_pool, _Sim
from .step_model import StepModel
from .validation import check_count

_FIRST_CAPACITY = 256
_OCCUPANCY_KEEP = 4096  # occupancy points an online run keeps (the oldest half is dropped past it)


@dataclass(frozen=True)
class OnlineStep:
    """One engine step: it ran from ``start_s`` to ``end_s`` (simulated seconds) over the prefill
    chunks ``prefill`` (pairs ``(chunk_tokens, tokens_already_cached)``) and the decodes ``decode``
    (their contexts); ``tokens`` are the request ids that each got one token at ``end_s``,
    ``finished`` those that got their last one, ``new_preemptions`` how many sequences the step
    preempted."""

    start_s: float
    end_s: float
    prefill: tuple[tuple[int, int], ...]
    decode: tuple[int, ...]
    tokens: tuple[int, ...]
    finished: tuple[int, ...]
    new_preemptions: int

    @property
    def duration_ms(self) -> float:
        return (self.end_s - self.start_s) * 1e3


class _OnlineSim(_Sim):
    """A `_Sim` whose requests are appended as they arrive; cancelled ones never join the queue."""

    def __init__(self, step_model: StepModel, block_size: int, pool: int):
        z = np.zeros(0, np.int64)
        super().__init__(step_model, np.zeros(0), z, z, block_size, pool, False, "continuous")
        self.cancelled = np.zeros(0, bool)
        self.last: tuple[tuple, tuple] | None = None
        self._grow(_FIRST_CAPACITY)
        self.n = 0

    def _grow(self, capacity: int) -> None:
        def widen(a: np.ndarray, fill) -> np.ndarray:
            out = np.full(capacity, fill, dtype=a.dtype)
            out[:a.size] = a
            return out

        self.arrival = widen(self.arrival, math.inf)
        for name in ("prompt", "outlen", "computed", "out", "blocks", "preempt"):
            setattr(self, name, widen(getattr(self, name), 0))
        self.first = widen(self.first, math.nan)
        self.finish = widen(self.finish, math.nan)
        self.cancelled = widen(self.cancelled, False)

    def add(self, arrival_s: float, prompt: int, output: int) -> int:
        if self.n == self.arrival.size:
            self._grow(2 * self.arrival.size)
        i = self.n
        self.arrival[i], self.prompt[i], self.outlen[i] = arrival_s, prompt, output
        self.n += 1
        return i

    def arrive(self) -> None:
        while self.nxt < self.n and self.arrival[self.nxt] <= self.t:
            if not self.cancelled[self.nxt]:
                self.waiting.append(self.nxt)
            self.nxt += 1

    def step(self, prefill: list[tuple[int, int]], decode: list[int]) -> None:
        super().step(prefill, decode)
        self.last = (tuple(prefill), tuple(decode))
        if len(self.occ_t) > _OCCUPANCY_KEEP:
            del self.occ_t[:_OCCUPANCY_KEEP // 2]
            del self.occ_used[:_OCCUPANCY_KEEP // 2]


class OnlineScheduler:
    """`simulate_serving`'s continuous batching for requests that come one at a time.

    * ``add(arrival_s, prompt_tokens, output_tokens)``: a request that arrived at ``arrival_s``
      (simulated seconds, not before the previous one) asking for ``output_tokens`` tokens; returns
      its id (0, 1, ... in arrival order).
    * ``advance()``: one engine step (`OnlineStep`), or None when nothing has arrived to run.
    * ``cancel(id)``: drop a request wherever it is; its KV blocks are free for the next step.
    * ``t``, ``running``, ``waiting``, ``kv_used_blocks``, ``kv_blocks``, ``preemptions``: the state.
    * ``record(id)``: the request's `serving.RequestRecord` once it has finished.
    """

    def __init__(self, step_model: StepModel, max_batched_tokens: int = 8192, max_num_seqs: int = 256,
                 block_size: int = 128):
        block_size = check_count("block_size", block_size, 128, cls=ServingConfigError, what="tokens per KV block")
        max_batched_tokens = check_count("max_batched_tokens", max_batched_tokens, 8192, cls=ServingConfigError, what="the tokens one step may run")
        max_num_seqs = check_count("max_num_seqs", max_num_seqs, 256, cls=ServingConfigError, what="the sequences one step may run")
        self.step_model = step_model
        self.kv_bytes_per_token, self.kv_budget_bytes, self.kv_blocks = _kv_pool(step_model, block_size)
        self.block_size, self.max_batched_tokens, self.max_num_seqs = block_size, max_batched_tokens, max_num_seqs
        self._sim = _OnlineSim(step_model, block_size, self.kv_blocks)
        self._batcher = _Continuous(self._sim, max_batched_tokens, max_num_seqs)
        self._step: tuple | None = None
        self._batcher.on_step = self._took

    # --- the state --------------------------------------------------------------------------

    @property
    def t(self) -> float:
        """Simulated seconds: the end of the last step, or the last arrival jumped to."""
        return self._sim.t

    @property
    def running(self) -> int:
        return int(self._batcher.ids.size)

    @property
    def waiting(self) -> int:
        """Requests that arrived by ``t`` and wait for admission, plus those not yet reached."""
        s = self._sim
        return len(s.waiting) + int(np.count_nonzero(~s.cancelled[s.nxt:s.n]))

    @property
    def kv_used_blocks(self) -> int:
        return self.kv_blocks - self._sim.free

    @property
    def preemptions(self) -> int:
        return self._batcher.preemptions

    @property
    def steps(self) -> int:
        return self._sim.steps

    @property
    def requests(self) -> int:
        return self._sim.n

    def max_tokens_per_request(self) -> int:
        """The most tokens (prompt + output) one request may hold: the whole KV pool."""
        return self.kv_blocks * self.block_size

    # --- driving it -------------------------------------------------------------------------

    def add(self, arrival_s: float, prompt_tokens: int, output_tokens: int) -> int:
        prompt_tokens = check_count("prompt_tokens", prompt_tokens, 1, cls=ServingConfigError, what="the prompt's tokens (a non-empty prompt)")
        output_tokens = check_count("output_tokens", output_tokens, 1, cls=ServingConfigError, what="the tokens asked for (max_tokens >= 1)")
        if not math.isfinite(arrival_s):
            raise ServingConfigError(f"arrival_s must be a finite time (got {arrival_s!r}). Fix: the caller's clock.")
        last = float(self._sim.arrival[self._sim.n - 1]) if self._sim.n else 0.0
        if arrival_s < last:
            raise ServingConfigError(f"arrival_s {arrival_s!r} comes before the previous request's {last!r}: requests "
                                     "are added in arrival order. Fix: stamp them from one monotonic clock.")
        total = prompt_tokens + output_tokens
        if total > self.max_tokens_per_request():
            raise ServingConfigError(
                f"prompt {prompt_tokens} + output {output_tokens} = {total} tokens can never fit the KV cache of "
                f"{self.kv_blocks} blocks of {self.block_size} ({self.max_tokens_per_request()} tokens). Fix: ask for "
                f"at most {self.max_tokens_per_request() - prompt_tokens} output tokens, or a shorter prompt.")
        return self._sim.add(float(arrival_s), prompt_tokens, output_tokens)

    def cancel(self, i: int) -> bool:
        """Drop request ``i``: True if it was still waiting, running or yet to arrive."""
        s = self._sim
        if not 0 <= i < s.n or s.cancelled[i] or not math.isnan(s.finish[i]):
            return False
        s.cancelled[i] = True
        return i >= s.nxt or self._batcher.cancel(i)

    def next_arrival(self) -> float | None:
        """The arrival time of the next request added but not yet admitted, or None."""
        s = self._sim
        while s.nxt < s.n and s.cancelled[s.nxt]:
            s.nxt += 1
        return float(s.arrival[s.nxt]) if s.nxt < s.n else None

    def advance(self) -> OnlineStep | None:
        s = self._sim
        while True:
            s.arrive()
            if self._batcher.ids.size == 0 and not s.waiting:
                nxt = self.next_arrival()
                if nxt is None:
                    return None
                s.t = max(s.t, nxt)
                continue
            before, start, pre = s.steps, s.t, self._batcher.preemptions
            self._step = None
            self._batcher.iterate()
            if s.steps > before:
                got, fid = self._step
                prefill, decode = s.last
                return OnlineStep(start, s.t, prefill, decode, tuple(got.tolist()), tuple(fid.tolist()),
                                  self._batcher.preemptions - pre)
            # no step ran: partial prefills held every block and the latest was preempted; go again

    def _took(self, got: np.ndarray, fid: np.ndarray) -> None:
        self._step = (got, fid)

    # --- what happened ----------------------------------------------------------------------

    def generated(self, i: int) -> int:
        """Tokens request ``i`` has generated so far."""
        pos = np.flatnonzero(self._batcher.ids == i)
        return int(self._batcher.gen[pos[0]]) if pos.size else int(self._sim.out[i])

    def record(self, i: int) -> RequestRecord:
        s = self._sim
        a, f, e = float(s.arrival[i]), float(s.first[i]), float(s.finish[i])
        ttft, e2e = (f - a) * 1e3, (e - a) * 1e3
        n = int(s.outlen[i])
        tpot = (e2e - ttft) / (n - 1) if n > 1 else math.nan
        return RequestRecord(i, a, int(s.prompt[i]), n, f, e, ttft, tpot, e2e, int(s.preempt[i]), int(s.out[i]))

    def kv_occupancy(self) -> list[tuple[float, float]]:
        """(time, fraction of the KV pool in use) at the start of each of the latest steps."""
        s = self._sim
        return [(float(t), u / self.kv_blocks) for t, u in zip(s.occ_t, s.occ_used)]


__all__ = ["OnlineScheduler", "OnlineStep"]
