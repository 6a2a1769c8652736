"""pypto_lab: see, and measure, how a PyTorch model runs on a (simulated) Huawei Ascend NPU.

The chip model lives in `pypto_lab.hw`; the functions below are the public entry points.
"""

from .hw.chip import ChipConfigError, get_chip, list_chips
from .hw.kernels import KernelReport, simulate_conv2d, simulate_matmul, simulate_vector
from .hw.tiling import CubeTile, TilingError, VecTile

__version__ = "0.1.0"

__all__ = [
    "ChipConfigError", "CubeTile", "KernelReport", "TilingError", "VecTile", "get_chip", "list_chips",
    "simulate_conv2d", "simulate_matmul", "simulate_vector",
]
