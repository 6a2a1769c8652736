"""A `StepModel` with a linear cost, for tests, benchmarks and teaching the serving simulator
without the cost engine: a fixed overhead per step, a cost per token computed and a cost per
(query, key) pair of attention.

    step_ms = overhead_ms
            + per_token_ms * (prefill chunk tokens + decode sequences)
            + per_context_token_ms * (attention pairs)

where a decode of context ``c`` attends ``c + 1`` keys and a prefill chunk of ``n`` tokens after
``c`` cached ones attends ``n*c + n*(n+1)/2``. It knows nothing of a chip; its numbers are whatever
the caller sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LinearStepModel:
    overhead_ms: float = 5.0
    per_token_ms: float = 0.02
    per_context_token_ms: float = 2e-5
    kv_bytes_per_token: int = 128 * 1024
    kv_budget_bytes: int = 32 * 2**30
    name: str = "linear step model"

    def step_ms(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        tokens = len(decode)
        pairs = sum(decode) + len(decode)
        for n, c in prefill:
            tokens += n
            pairs += n * c + n * (n + 1) // 2
        return self.overhead_ms + self.per_token_ms * tokens + self.per_context_token_ms * pairs
