"""``pypto.platform``: the NPU architecture the kernels are compiled for (``platform.npuarch``),
read from the chip pypto_lab simulates.

The real ``pypto.platform.npuarch`` (python/pypto/platform.py at 883e7df) names the architecture
of the device, ``DAV_2201`` for the Atlas A2 / A3 parts (the 910B family), ``DAV_1001`` for the
910A, ``DAV_3510`` for the Ascend 950. Here it is the architecture of the chip in force (the
``runtime_options`` ``chip``, else the default chip of `jit`), from its preset's core version.
Setting it selects a chip of that architecture only where pypto_lab has one.
"""

from __future__ import annotations

from ..hw.chip import get_chip
from .errors import NotModelledError

ARCH_OF_CORE = {"AIC-C-220": "DAV_2201", "AIC-C-100": "DAV_1001"}
CHIP_OF_ARCH = {"DAV_2201": "Ascend910B1", "DAV_1001": "Ascend910A"}


def current_chip_name() -> str:
    from . import config
    from .jit import DEFAULT_CHIP

    return config.STATE.section_options.get("runtime", {}).get("chip", DEFAULT_CHIP)


class _Platform:
    """``pypto.platform``."""

    @property
    def npuarch(self) -> str:
        chip = get_chip(current_chip_name())
        return ARCH_OF_CORE.get(chip.core_version, "DAV_UNKNOWN")

    @npuarch.setter
    def npuarch(self, value: str) -> None:
        from . import config

        chip = CHIP_OF_ARCH.get(str(value))
        if chip is None:
            raise NotModelledError(f"pypto.platform.npuarch = {value!r}: pypto_lab has no chip preset of that "
                                   f"architecture. Rule: the architectures modelled are {sorted(CHIP_OF_ARCH)}. "
                                   "Fix: leave npuarch alone, or pick a chip with "
                                   "pypto.set_runtime_options(chip='Ascend910B1')")
        config.STATE.section_options.setdefault("runtime", {})["chip"] = chip


platform = _Platform()

__all__ = ["platform", "ARCH_OF_CORE"]
