"""pypto_lab: see, and measure, how a PyTorch model runs on a (simulated) Huawei Ascend NPU.

The chip model lives in `pypto_lab.hw`; the functions below are the public entry points.
"""

from . import amp, debug, deploy, nn, profiler, quantization, tuning
from .capture import CaptureError, Graph, capture
from .custom_ops import CustomOpError, custom_op
from .deploy.om import OMError, OMModel, load_om
from .hw.attention import simulate_attention
from .hw.chip import ChipConfigError, get_chip, list_chips
from .hw.kernels import KernelReport, simulate_conv2d, simulate_matmul, simulate_vector
from .hw.tiling import CubeTile, TilingError, VecTile
from .memory import disable_memory_pool, enable_memory_pool, get_memory_allocator, set_memory_allocator
from .optimize import (
    OptimizedModel,
    OptimizeError,
    get_optimization_options,
    optimize,
    set_optimization_options,
)
from .runtime.compare import CompareError, Comparison, compare_tensors

__version__ = "0.1.0"

__all__ = [
    "CaptureError", "Graph", "capture", "simulate_attention",
    "OptimizedModel", "amp", "debug", "deploy", "nn", "profiler", "quantization", "tuning", "Comparison", "CompareError",
    "compare_tensors", "CustomOpError", "custom_op", "disable_memory_pool", "enable_memory_pool",
    "get_memory_allocator", "set_memory_allocator",
    "ChipConfigError", "CubeTile", "KernelReport", "OptimizeError", "TilingError", "VecTile", "get_chip",
    "get_optimization_options", "list_chips", "optimize", "set_optimization_options", "simulate_conv2d",
    "simulate_matmul", "simulate_vector", "OMError", "OMModel", "load_om",
]
