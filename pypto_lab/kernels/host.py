"""The host coster: a CPU fallback (`HostKernel`) pays its inputs device -> host and its outputs
host -> device over the card's link (``chip.host_link_gbps``, PCIe 4.0 x16 on the shipped
presets); the CPU's own compute time is not modelled."""

from __future__ import annotations

from ..hw.chip import Chip
from .cost import KernelCost, coster
from .ir import HostKernel


@coster(HostKernel)
def cost_host(spec: HostKernel, chip: Chip) -> KernelCost:
    nbytes = spec.bytes_in + spec.bytes_out
    time_us = nbytes / (chip.host_link_gbps * 1e3) if chip.host_link_gbps else 0.0
    return KernelCost(time_us * chip.clock_mhz, time_us, float(nbytes), {}, (), ("host",))
