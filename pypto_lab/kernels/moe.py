"""The MoE gating coster: `MoeGatingKernel` (MoeGatingTopK) on the Vector tile program, one row of
expert scores per token (`pypto_lab.hw.kernels.gating_topk_op`)."""

from __future__ import annotations

from ..hw.chip import Chip
from ..hw.kernels import gating_topk_op, simulate_vector
from .cost import KernelCost, coster, split_resources
from .ir import MoeGatingKernel


@coster(MoeGatingKernel)
def cost_moe_gating(spec: MoeGatingKernel, chip: Chip) -> KernelCost:
    r = simulate_vector(gating_topk_op(spec.top_k, spec.router), spec.tokens * spec.experts, dtype=spec.dtype,
                        chip=chip, row_len=spec.experts, name=f"MoeGatingTopK top-{spec.top_k} of {spec.experts}")
    return KernelCost.of([r], split_resources(chip, "AIV"))


__all__ = ["cost_moe_gating"]
