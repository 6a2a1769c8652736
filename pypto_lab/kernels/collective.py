"""The collective coster: a `CollectiveKernel` (an HCCL collective over a server topology) costed
by `pypto_lab.hw.collectives.collective` (alpha-beta per algorithm step, the topology's launch of
the communication op once). It holds the cards' links, not their cores; one card costs nothing."""

from __future__ import annotations

from ..hw.chip import Chip
from ..hw.collectives import collective
from .cost import KernelCost, coster
from .ir import CollectiveKernel


@coster(CollectiveKernel)
def cost_collective(spec: CollectiveKernel, chip: Chip) -> KernelCost:
    if spec.cards <= 1:
        return KernelCost(0.0, 0.0, 0.0, {}, (), ("link",), bound="link")
    c = collective(spec.op, spec.nbytes, spec.cards, spec.topology)
    return KernelCost(c.time_us * chip.clock_mhz, c.time_us, 0.0, {}, (), ("link",), bound="link")


__all__ = ["cost_collective"]
