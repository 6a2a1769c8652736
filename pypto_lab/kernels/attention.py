"""The attention costers: an `AttentionKernel` on the FlashAttention tile program (online softmax,
one kernel) or on the unfused three-kernel sequence (`simulate_attention`), and the kernels derived
from it: causal FlashAttention (block skipping above the diagonal: an LLM's PromptFlashAttention
over a prefill chunk) and `IncreAttentionKernel` (a decode step over the paged KV cache).

A backward `AttentionKernel` (``backward=True``) is FlashAttentionScoreGrad's tile program
(`pypto_lab.hw.attention_grad`); causal, it skips the same blocks at its own block sizes.

The derivations take the cost of the underlying fused attention from a function, so the exact
costers here and the grid strategy (`pypto_lab.kernels.grid`) share them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..hw.attention import default_attention_blocks, simulate_attention
from ..hw.attention_grad import backward_blocks, simulate_attention_backward
from ..hw.chip import Chip
from .cost import KernelCost, cost, coster, split_resources
from .ir import AttentionKernel, IncreAttentionKernel


@coster(AttentionKernel)
def cost_attention(spec: AttentionKernel, chip: Chip) -> KernelCost:
    if spec.flash and spec.causal:
        return causal_attention(spec, chip, lambda a: cost(a, chip))
    if spec.backward:   # FlashAttentionScoreGrad (`pypto_lab.hw.attention_grad`)
        r = simulate_attention_backward(spec.batch_heads, spec.s_q, spec.s_k, spec.d, dtype=spec.dtype, chip=chip,
                                        block_q=spec.block_q, block_k=spec.block_k)
        return KernelCost.of([r], split_resources(chip, "AIC", "AIV"))
    blocks = {"block_q": spec.block_q, "block_k": spec.block_k} if spec.flash and spec.block_q else {}
    r = simulate_attention(spec.batch_heads, spec.s_q, spec.s_k, spec.d, dtype=spec.dtype, chip=chip,
                           fused=spec.flash, **blocks)
    return KernelCost.of([r], split_resources(chip, "AIC", "AIV"))


def causal_attention(spec: AttentionKernel, chip: Chip,
                     fused: Callable[[AttentionKernel], KernelCost]) -> KernelCost:
    """Causal FlashAttention (PromptFlashAttention over a prefill chunk of ``s_q`` tokens after
    ``s_k - s_q`` cached ones) from the fused kernel without a mask (``fused``): block skipping
    keeps the (query block, key block) pairs at or below the diagonal, which the chip's default
    block sizes (or the spec's) give."""
    full = fused(dataclasses.replace(spec, causal=False))
    past = spec.s_k - spec.s_q
    bq, bk = (spec.block_q, spec.block_k) if spec.block_q else \
        backward_blocks(spec.s_q, spec.s_k) if spec.backward else \
        default_attention_blocks(chip, spec.s_q, spec.s_k, spec.d, spec.dtype)[:2]
    nq, nk = -(-spec.s_q // bq), -(-spec.s_k // bk)
    kept = sum(min(nk, -(-(past + (i + 1) * bq) // bk)) for i in range(nq))
    return full.scaled(kept / (nq * nk))


def incre_attention(spec: IncreAttentionKernel, fused: Callable[[AttentionKernel], KernelCost]) -> KernelCost:
    """IncreFlashAttention: the ``group`` query heads of each KV head as the rows of one fused
    block over the cached ``context`` keys; an int8 cache halves a memory-bound kernel's bytes (its
    dequantisation is not charged)."""
    c = fused(AttentionKernel(spec.seqs * spec.kv_heads, spec.group, spec.context, spec.d, spec.dtype, flash=True))
    if spec.kv_dtype == "int8" and c.bound == "memory":
        return KernelCost(c.cycles / 2, c.time_us / 2, c.gm_bytes / 2, c.tile, c.reports, c.resources, c.flops,
                          c.bound, c.hbm_bytes / 2)
    return c


@coster(IncreAttentionKernel)
def cost_incre_attention(spec: IncreAttentionKernel, chip: Chip) -> KernelCost:
    return incre_attention(spec, lambda a: cost(a, chip))


__all__ = ["causal_attention", "cost_attention", "cost_incre_attention", "incre_attention"]
