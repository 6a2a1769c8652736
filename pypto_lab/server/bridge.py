"""The bridge between the HTTP side and the simulated card: one engine thread runs the online
scheduler (`pypto_lab.llm.online.OnlineScheduler`) against the wall clock and hands each step's
tokens to the requests' asyncio queues when the simulated card would have produced them.

Time: the engine's clock starts at 0 when the bridge starts; a request arriving ``w`` wall seconds
later arrives at ``w / time_scale`` simulated seconds. The engine admits what arrived by the start
of a step, runs it (its length from the card's step model), sleeps until the step's end on the wall
clock (``start + end_s * time_scale``) and releases its tokens; requests that came in meanwhile join
the next step — the order of events of `simulate_serving` on the same arrival times. When a step
takes longer to cost than to run, its tokens leave late; ``pypto_lab:token_release_lag_seconds``
counts by how much, and the simulated figures are unaffected.

The HTTP side never touches the scheduler: ``submit`` and ``cancel`` post to an inbox under a lock,
and the engine thread applies them between steps (a cancelled request's KV blocks are free for the
next step). ``stop(drain=True)`` refuses new requests and lets the admitted ones finish;
``drain=False`` ends them (their streams get an error) and stops at the next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..llm.online import OnlineScheduler, OnlineStep
from .card import CardStepModel
from .metrics import Metrics

log = logging.getLogger("pypto_lab.server")

RECORDS_KEPT = 100_000


class QueueFull(RuntimeError):
    """The waiting queue is at its bound; the message names it and the fix."""


class ShuttingDown(RuntimeError):
    """The engine is stopping and takes no new request."""


@dataclass(eq=False)
class Handle:
    """One request as both sides see it: the engine thread fills its fields and posts events on its
    queue (``("token", k)``, ``("end", finish_reason, record)``, ``("error", message)``)."""

    id: int
    prompt_tokens: int
    output_tokens: int
    finish_reason: str                     # "length" or "stop": why the answer ends at output_tokens
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival_s: float = math.nan
    emitted: int = 0                       # tokens posted (engine thread)
    last_token_s: float = math.nan
    done: bool = False


class Engine:
    """The engine thread and its scheduler. ``card``: the step model; ``max_waiting``: the bound
    on requests waiting for admission (beyond it ``submit`` raises `QueueFull`)."""

    def __init__(self, card: CardStepModel, metrics: Metrics, *, model_name: str, time_scale: float = 1.0,
                 max_batched_tokens: int = 8192, max_num_seqs: int = 256, block_size: int = 128,
                 max_waiting: int = 1024):
        self.card, self.metrics, self.model_name = card, metrics, model_name
        self.time_scale = float(time_scale)
        self.max_waiting = int(max_waiting)
        self.sched = OnlineScheduler(card, max_batched_tokens, max_num_seqs, block_size)
        self._cv = threading.Condition()
        self._inbox: list[tuple[float, Handle]] = []
        self._cancels: list[Handle] = []
        self._next_id = 0
        self._last_stamp = 0.0
        self._waiting_now = 0
        self._live: dict[int, Handle] = {}
        self._closing = False
        self._stop_now = threading.Event()
        self._t0 = 0.0
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.records: deque[dict[str, Any]] = deque(maxlen=RECORDS_KEPT)
        m = metrics
        m.kv_blocks.set(self.sched.kv_blocks)
        m.hbm_capacity.set(card.capacity_bytes)
        m.time_scale.set(self.time_scale)
        self._publish_state()

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="pypto-lab-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def closing(self) -> bool:
        return self._closing

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Refuse new requests; with ``drain`` let the admitted ones finish (up to ``timeout`` wall
        seconds), then end the rest and the thread."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread is None:
            return
        if drain:
            self._thread.join(timeout)
        self._stop_now.set()
        with self._cv:
            self._cv.notify_all()
        self._thread.join(timeout)

    # --- the HTTP side ----------------------------------------------------------------------

    def now_s(self) -> float:
        """The simulated time that corresponds to the wall clock now."""
        return (time.monotonic() - self._t0) / self.time_scale

    def submit(self, prompt_tokens: int, output_tokens: int, finish_reason: str,
               loop: asyncio.AbstractEventLoop) -> Handle:
        with self._cv:
            if self._closing or not self.alive:
                self.metrics.rejected("shutting_down")
                raise ShuttingDown("the server is shutting down and takes no new request. Fix: retry on another "
                                   "replica, or after it restarts")
            queued = self._waiting_now + len(self._inbox)
            if queued >= self.max_waiting:
                self.metrics.rejected("queue_full")
                raise QueueFull(f"{queued} requests are waiting for admission, the bound (--max-waiting) is "
                                f"{self.max_waiting}. Fix: retry after a pause (Retry-After), send fewer requests "
                                "at once, or start the server with a larger --max-waiting")
            h = Handle(self._next_id, prompt_tokens, output_tokens, finish_reason, loop)
            self._next_id += 1
            stamp = max(self.now_s(), self._last_stamp)
            self._last_stamp = stamp
            h.arrival_s = stamp
            self._inbox.append((stamp, h))
            self._cv.notify_all()
        return h

    def cancel(self, h: Handle) -> None:
        """The client went away: drop ``h`` at the next step boundary (no-op once it has ended)."""
        with self._cv:
            if not h.done:
                self._cancels.append(h)
                self._cv.notify_all()

    def state(self) -> dict[str, Any]:
        s = self.sched
        return {"simulated_time_s": s.t, "running": s.running, "waiting": s.waiting, "kv_blocks": s.kv_blocks,
                "kv_used_blocks": s.kv_used_blocks, "preemptions": s.preemptions, "steps": s.steps,
                "requests": s.requests, "time_scale": self.time_scale, "closing": self._closing,
                "engine_alive": self.alive}

    # --- the engine thread ------------------------------------------------------------------

    def _take_inbox(self) -> None:
        """Apply what the HTTP side posted (called with the lock held)."""
        for stamp, h in self._inbox:
            i = self.sched.add(stamp, h.prompt_tokens, h.output_tokens)
            if i != h.id:
                raise RuntimeError(f"request ids out of step: scheduler {i}, handle {h.id} (a bug)")
            self._live[i] = h
        self._inbox.clear()
        self._waiting_now = self.sched.waiting
        for h in self._cancels:
            if self._live.pop(h.id, None) is not None and self.sched.cancel(h.id):
                h.done = True
                self.metrics.cancelled.inc()
                self._log("request_cancelled", h, generated=h.emitted)
                self.records.append(self._record(h, "cancelled"))
        self._cancels.clear()

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    self._take_inbox()
                    if self._stop_now.is_set() or (self._closing and not self._live):
                        break
                step = self.sched.advance()
                self._publish_state()
                if step is None:
                    with self._cv:
                        if not self._inbox and not self._cancels and not self._stop_now.is_set() \
                                and not (self._closing and not self._live):
                            self._cv.wait(0.5)
                    continue
                profile = self.card.last
                target = self._t0 + step.end_s * self.time_scale
                wait = target - time.monotonic()
                if wait > 0 and self._stop_now.wait(wait):
                    break
                self._release(step, profile, max(0.0, time.monotonic() - target))
        except BaseException as exc:  # the engine must not die silently: every stream hears of it
            self.error = exc
            log.exception("engine thread failed")
        finally:
            self._end_all("the server stopped before this request finished" if self.error is None else
                          f"the engine failed: {self.error!r}")

    def _publish_state(self) -> None:
        s, m = self.sched, self.metrics
        self._waiting_now = s.waiting
        m.running.set(s.running)
        m.waiting.set(s.waiting)
        used = s.kv_used_blocks / s.kv_blocks
        m.kv_usage.set(used)
        m.gpu_cache.set(used)
        m.kv_used.set(s.kv_used_blocks)
        m.sim_time.set(s.t)
        kv_bytes = s.kv_used_blocks * s.block_size * s.kv_bytes_per_token
        m.hbm_used.set(self.card.weights_bytes + self.card.activation_bytes + kv_bytes)

    def _release(self, step: OnlineStep, profile, lag: float) -> None:
        m = self.metrics
        dt = step.end_s - step.start_s
        m.steps.inc()
        m.step_s.inc(dt)
        m.lag.observe(lag)
        m.iteration_tokens.observe(sum(n for n, _ in step.prefill) + len(step.decode))
        if step.new_preemptions:
            m.preemptions.inc(step.new_preemptions)
        if profile is not None:
            m.aicore_busy.set(profile.aicore_busy)
            m.aicore_busy_s.inc(profile.aicore_busy_ms / 1000)
            m.hbm_bytes.inc(profile.hbm_bytes)
            bw = profile.hbm_bytes / (profile.ms / 1000) if profile.ms else 0.0
            m.hbm_bw.set(bw)
            m.hbm_bw_ratio.set(bw / (self.card.hw.chip.hbm_gbps * 1e9))
        events: list[tuple[Handle, tuple]] = []
        for i in step.tokens:
            h = self._live.get(i)
            if h is None:       # cancelled while the step ran
                continue
            if h.emitted == 0:
                m.ttft.observe(step.end_s - h.arrival_s)
                m.prompt_tokens.inc(h.prompt_tokens)
            else:
                gap = step.end_s - h.last_token_s
                m.itl.observe(gap)
                m.tpot_gap.observe(gap)
            h.last_token_s = step.end_s
            events.append((h, ("token", h.emitted)))
            h.emitted += 1
        m.generation_tokens.inc(len(events))
        for i in step.finished:
            h = self._live.pop(i, None)
            if h is None:
                continue
            h.done = True
            rec = self.sched.record(i)
            if h.emitted != rec.generated_tokens:
                raise RuntimeError(f"request {i}: {h.emitted} tokens released, the scheduler generated "
                                   f"{rec.generated_tokens} (a bug)")
            m.e2e.observe(rec.e2e_ms / 1000)
            if rec.output_tokens > 1:
                m.tpot.observe(rec.tpot_ms / 1000)
            m.req_prompt.observe(rec.prompt_tokens)
            m.req_gen.observe(rec.generated_tokens)
            m.success(h.finish_reason)
            out = self._record(h, "finished", rec)
            self.records.append(out)
            self._log("request_finished", h, **{k: out[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms", "preemptions")})
            events.append((h, ("end", h.finish_reason, out)))
        self._post(events)
        self._publish_state()

    def _record(self, h: Handle, status: str, rec=None) -> dict[str, Any]:
        """One request as ``/sim/requests`` lists it: simulated seconds and ms, None where undefined."""
        d = {"id": h.id, "status": status, "arrival_s": h.arrival_s, "prompt_tokens": h.prompt_tokens,
             "output_tokens": h.output_tokens, "generated_tokens": h.emitted, "finish_reason": h.finish_reason,
             "first_token_s": None, "finish_s": None, "ttft_ms": None, "tpot_ms": None, "e2e_ms": None,
             "preemptions": 0}
        if rec is not None:
            d.update(first_token_s=rec.first_token_s, finish_s=rec.finish_s, ttft_ms=rec.ttft_ms, e2e_ms=rec.e2e_ms,
                     tpot_ms=None if math.isnan(rec.tpot_ms) else rec.tpot_ms, preemptions=rec.preemptions)
        if status == "cancelled":
            d["finish_reason"] = None
        return d

    def _post(self, events: list[tuple[Handle, tuple]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for h, ev in events:
            by_loop.setdefault(h.loop, []).append((h, ev))
        for loop, evs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, evs)
            except RuntimeError:   # that loop has closed: nobody is listening
                pass

    def _end_all(self, message: str) -> None:
        with self._cv:
            self._closing = True
            live = list(self._live.values()) + [h for _, h in self._inbox]
            self._live.clear()
            self._inbox.clear()
        for h in live:
            h.done = True
        self._post([(h, ("error", message)) for h in live])

    def _log(self, event: str, h: Handle, **extra) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info(json.dumps({"event": event, "id": h.id, "model": self.model_name, "arrival_s": round(h.arrival_s, 6),
                                 "prompt_tokens": h.prompt_tokens, "output_tokens": h.output_tokens,
                                 "finish_reason": h.finish_reason, **extra}))


def _deliver(events: list[tuple[Handle, tuple]]) -> None:
    for h, ev in events:
        h.queue.put_nowait(ev)


__all__ = ["Engine", "Handle", "QueueFull", "ShuttingDown"]
