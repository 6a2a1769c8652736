"""What a serving simulation needs from a model on a chip: the time of one engine step and the
KV-cache budget.

`StepModel` is the contract between the cost engine (`pypto_lab.llm.engine`, which builds one from
a model, a chip and a card count) and the serving simulator (`pypto_lab.llm.serving`), so either
can be tested without the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class StepModel(Protocol):
    """One model served on ``cards`` chips.

    * ``step_ms(prefill, decode)``: wall time of one engine step (one forward pass) that runs the
      prefill chunks ``prefill`` — pairs ``(chunk_tokens, tokens_already_in_cache)`` — and one new
      token for each sequence of ``decode``, given as its context length (tokens in the cache
      before this step). Either list may be empty, not both.
    * ``kv_bytes_per_token``: KV-cache bytes one token takes, per card.
    * ``kv_budget_bytes``: HBM per card left for the KV cache once weights, activations and the
      runtime's reserve are placed.
    * ``name``: for reports.
    """

    name: str
    kv_bytes_per_token: int
    kv_budget_bytes: int

    def step_ms(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float: ...
