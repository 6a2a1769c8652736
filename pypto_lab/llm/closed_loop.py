"""The benchmark client of a serving run with a bound on requests in flight: ``concurrency=N``, as
``vllm bench serve --max-concurrency N`` runs it.

vLLM's benchmark (vllm/benchmarks/serve.py) draws each request's send time from the request rate
(all at once for ``--request-rate inf``, the default) and wraps every request in an
``asyncio.Semaphore(max_concurrency)``: a request whose time has come waits until fewer than ``N``
are in flight, first come first served, and its clock (TTFT, end-to-end latency) starts when it is
sent. With rate ``inf`` that is a closed loop: ``N`` workers, each sending its next request as soon
as its previous one is answered. With a finite rate, arrivals follow the rate but at most ``N``
are in flight.

`ClosedLoop` holds the intended times and the free slots; the simulator asks it which requests
are sent by a time (`due`, `send`) and tells it when one finishes (`finished`). The client's own
time (HTTP, tokenisation) is not modelled: a slot freed at the end of an engine step is used by the
next request at that instant.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class ClosedLoop:
    """Send times of ``intended`` requests (their times under the rate, in order) with at most
    ``concurrency`` in flight."""

    def __init__(self, intended: np.ndarray, concurrency: int):
        self.intended = intended
        self.concurrency = int(concurrency)
        self.slots: deque[float] = deque([-math.inf] * self.concurrency)  # when each free slot was freed

    def due(self, k: int) -> float:
        """When request ``k``, the next one not yet sent, will be sent (inf: no slot is free yet)."""
        if not self.slots:
            return math.inf
        return max(float(self.intended[k]), self.slots[0])

    def send(self, k: int) -> float:
        """Send request ``k`` (its time has come and a slot is free): its send time."""
        t = self.due(k)
        self.slots.popleft()
        return t

    def finished(self, t: float, count: int) -> None:
        """``count`` requests were answered at ``t``: their slots are free from then on."""
        self.slots.extend([t] * count)


__all__ = ["ClosedLoop"]
