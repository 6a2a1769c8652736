"""``pypto.runtime``: what the model files call of the real runtime module (python/pypto/runtime.py
at 883e7df). ``_device_synchronize()`` waits for the device's stream on the NPU; in SIM mode every
kernel call has finished (values computed, run simulated) when it returns, so it does nothing.
"""

from __future__ import annotations

from .dtypes import RunMode


def _device_synchronize() -> None:
    """Nothing to wait for: a SIM kernel call returns when its run is complete."""


__all__ = ["RunMode", "_device_synchronize"]
