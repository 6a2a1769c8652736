"""The attention coster: an `AttentionKernel` on the FlashAttention tile program (online softmax,
one kernel) or on the unfused three-kernel sequence (`simulate_attention`)."""

from __future__ import annotations

from ..hw.attention import simulate_attention
from ..hw.chip import Chip
from .cost import KernelCost, coster, split_resources
from .ir import AttentionKernel


@coster(AttentionKernel)
def cost_attention(spec: AttentionKernel, chip: Chip) -> KernelCost:
    blocks = {"block_q": spec.block_q, "block_k": spec.block_k} if spec.flash and spec.block_q else {}
    r = simulate_attention(spec.batch_heads, spec.s_q, spec.s_k, spec.d, dtype=spec.dtype, chip=chip,
                           fused=spec.flash, **blocks)
    return KernelCost.of([r], split_resources(chip, "AIC", "AIV"))
