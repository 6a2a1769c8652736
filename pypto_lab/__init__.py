"""pypto_lab: see, and measure, how a PyTorch model runs on a (simulated) Huawei Ascend NPU.

The chip model lives in `pypto_lab.hw`; the functions below are the public entry points.
"""

from .graph import CaptureError, Graph, capture
from .hw.attention import simulate_attention
from .hw.chip import ChipConfigError, get_chip, list_chips
from .hw.kernels import KernelReport, simulate_conv2d, simulate_matmul, simulate_vector
from .hw.tiling import CubeTile, TilingError, VecTile
from .optimize import OptimizeError, get_optimization_options, optimize, set_optimization_options

__version__ = "0.1.0"

__all__ = [
    "CaptureError", "Graph", "capture", "simulate_attention",
    "ChipConfigError", "CubeTile", "KernelReport", "OptimizeError", "TilingError", "VecTile", "get_chip",
    "get_optimization_options", "list_chips", "optimize", "set_optimization_options", "simulate_conv2d",
    "simulate_matmul", "simulate_vector",
]
