"""The simulated Ascend chip: presets, AI Core model, tiling rules, event simulator, numerics,
calibration against measured micro-benchmarks, the energy model."""

from .attention import simulate_attention
from .calibration import microbench as _microbench
from .chip import (
    PIPES,
    Buffer,
    Chip,
    ChipConfigError,
    CubeUnit,
    DataPath,
    VectorTiming,
    VectorUnit,
    get_chip,
    list_chips,
    load_chip,
)
from .compile_notice import install as _install_compile_notice
from .energy import EnergyModelError, EnergySummary, EnergyTable, kernel_energy, kernel_traffic
from .kernels import KernelReport, simulate_conv2d, simulate_matmul, simulate_vector
from .simulator import Program, Timeline, simulate
from .tiling import CubeTile, TilingError, VecTile


def microbench(chip, table, path_or_instr, dtypes="", x=None, m=None, k=None, n=None):
    """The model's prediction for one row of the calibration CSV, in the CSV's unit
    (GB/s for transfers, ops/cycle for mmad and vector). See `pypto_lab.hw.calibration`."""
    return _microbench(get_chip(chip), table, path_or_instr, dtypes, x=x, m=m, k=k, n=n)


__all__ = [
    "PIPES", "Buffer", "Chip", "ChipConfigError", "CubeTile", "CubeUnit", "DataPath", "EnergyModelError",
    "EnergySummary", "EnergyTable", "KernelReport", "kernel_energy", "kernel_traffic",
    "Program", "Timeline", "TilingError", "VecTile", "VectorTiming", "VectorUnit", "get_chip",
    "list_chips", "load_chip", "microbench", "simulate", "simulate_attention", "simulate_conv2d", "simulate_matmul",
    "simulate_vector",
]


_install_compile_notice()   # numba compiles on first use: a first run on a machine says so, not a silent wait
