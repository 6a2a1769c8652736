"""The simulated card behind the server: the serving engine's step model, which also says, for each
step, how busy the AI Cores were and how many bytes crossed HBM — the card's own metrics.

`CardStepModel` is `pypto_lab.llm.engine.ChipStepModel` (same memo key: prefill chunks with their
cached length rounded down to 16, the decode count, the mean decode context rounded to 16; same
kernels from `forward_kernels`; same step time from the stack's timeline), keeping a `StepProfile`
per key instead of the time alone. `tests/test_server.py` checks its times equal
`ChipStepModel.step_ms`, which `serve()` uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..hw.chip import DEFAULT_CHIP, Chip
from ..llm.configs import LLMConfigError, spec_of
from ..llm.engine import ChipStepModel, hardware
from ..llm.forward import forward_kernels, step_timeline
from ..llm.memory import DEFAULT_HBM_UTILIZATION, capacity_bytes, weights_bytes
from ..stack import Stack
from ..stack.preset import DEFAULT_LLM_STACK


@dataclass(frozen=True)
class StepProfile:
    """One engine step on the card: its time, the AI Cores' own kernel time in it (collectives,
    launches and host waits excluded) and the bytes its kernels moved between HBM and the cores."""

    ms: float
    aicore_busy_ms: float
    hbm_bytes: float

    @property
    def aicore_busy(self) -> float:
        return self.aicore_busy_ms / self.ms if self.ms else 0.0


class CardStepModel(ChipStepModel):
    """`ChipStepModel` with a `StepProfile` per step; ``last`` is the latest step's."""

    def __init__(self, spec, hw, max_batched_tokens: int = 8192, hbm_utilization: float = DEFAULT_HBM_UTILIZATION):
        super().__init__(spec, hw, max_batched_tokens, hbm_utilization)
        self._profiles: dict[tuple, StepProfile] = {}
        self.last: StepProfile | None = None
        self.capacity_bytes = capacity_bytes(self.hw, hbm_utilization)
        self.weights_bytes = weights_bytes(self.spec, self.hw)
        # what ChipStepModel set aside for activations: usable HBM - weights - KV budget
        self.activation_bytes = self.capacity_bytes - self.weights_bytes - self.kv_budget_bytes

    def profile(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> StepProfile:
        n = len(decode)
        ctx = round(sum(decode) / n / 16) * 16 if n else 0
        key = (tuple(sorted((int(c), int(p) // 16 * 16) for c, p in prefill)), n, ctx)
        prof = self._profiles.get(key)
        if prof is None:
            ks = forward_kernels(self.spec, self.hw, prefill=[(c, p) for c, p in key[0]], decode=[max(1, ctx)] * n)
            tl = step_timeline(ks, self.hw.stack)
            busy = sum(k.time_us for k in ks if not k.collective)
            moved = sum(k.gm_bytes for k in ks if not k.collective)
            prof = self._profiles[key] = StepProfile(float(tl.step_us) / 1000, busy / 1000, float(moved))
        self.last = prof
        return prof

    def step_ms(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        return self.profile(prefill, decode).ms


def card_step_model(model, chip: str | Chip = DEFAULT_CHIP, cards: int = 1, precision: str = "fp16", *,
                    kv_dtype: str | None = None, stack: str | Stack = DEFAULT_LLM_STACK,
                    max_batched_tokens: int = 8192,
                    hbm_utilization: float = DEFAULT_HBM_UTILIZATION) -> CardStepModel:
    """The card a server simulates: ``model`` on ``cards`` x ``chip`` (tensor parallel over all of
    them) under ``stack``, as `pypto_lab.llm.step_model` builds it for `serve()`."""
    spec = spec_of(model)
    hw = hardware(chip, cards, None, 1, precision, kv_dtype, None, stack)
    if hw.cards // hw.tp > 1:
        raise LLMConfigError(f"cards = {cards}: a server simulates one model replica. Fix: tensor parallel over "
                             "all cards (the default), or one server per replica")
    return CardStepModel(spec, hw, max_batched_tokens, hbm_utilization)


__all__ = ["CardStepModel", "StepProfile", "card_step_model"]
