"""Whole kernels measured on a real chip, against the chip model.

``datasets/calibration/msprof_kernel_details_910B1.csv`` holds kernels of one public msprof
profile (Ascend/msprof-analyze ``test/ut/advisor/advisor_backend/compute_advice/kernel_details.csv``
at 8399c1cd, recorded 2023-11-09): a GPT-3-style fp16 training step whose kernels run on 24 cube
blocks at 1,850 MHz (``aic_total_cycles / aicore_time`` per block), i.e. an Ascend 910B1. Its
GEMMs and its largest Vector kernels are kept, with shapes, dtypes, formats and durations.

`gemm_rows` reads the GEMMs as `CubeKernel` shapes (``C[m, n] = A[m, k] @ B^T`` with the weight
``[n, k]`` in ND, as the profile's input shapes give them; a BatchMatMul's leading dimension is its
batch) and `compare_gemms` simulates each with the tile the planner picks (`pypto_lab.train.plan.tuned`)
and returns simulated against measured. ``scripts/fit_l2_read_rate.py`` fits the AIC-C-220 presets'
L2 read rate to the large ones; `stream_rows` gives the Vector kernels' measured GB/s for reading.
"""

from __future__ import annotations

import csv
import statistics
import sys
from dataclasses import dataclass
from functools import reduce
from operator import mul

from ..files.paths import DATASETS_DIR

PROFILE = DATASETS_DIR / "calibration" / "msprof_kernel_details_910B1.csv"
PROFILE_CHIP = "Ascend910B1"
# GEMMs that run at least this long: launch, tail and the last partial wave of blocks are then a few
# per cent at most, so the steady state (what the L2 read rate sets) decides the time
LARGE_GEMM_US = 100.0
_DTYPE = {"FLOAT16": "fp16", "FLOAT": "fp32", "DT_BF16": "bf16"}
_BYTES = {"FLOAT16": 2, "FLOAT": 4, "UINT8": 1, "INT32": 4, "INT64": 8}


@dataclass(frozen=True)
class GemmShape:
    name: str          # the profile's kernel type and shape, e.g. "MatMul 4096x12288x4608"
    batch: int
    m: int
    k: int
    n: int
    dtype: str
    measured_us: float  # median over the profile's runs of this shape
    runs: int


@dataclass(frozen=True)
class GemmComparison:
    shape: GemmShape
    simulated_us: float

    @property
    def error(self) -> float:
        return self.simulated_us / self.shape.measured_us - 1


def _dims(text: str) -> list[list[int]]:
    return [[int(x) for x in part.split(",")] for part in text.split(";") if part.strip()]


def _rows():
    with open(PROFILE, newline="", encoding="utf-8") as f:
        yield from csv.DictReader(f)


def gemm_rows() -> list[GemmShape]:
    """The profile's GEMMs, one per distinct shape, with the median measured duration."""
    runs: dict[tuple, list[float]] = {}
    for r in _rows():
        if "MatMul" not in r["type"]:
            continue
        a, b = _dims(r["input_shapes"])
        dtype = _DTYPE[r["input_dtypes"].split(";")[0]]
        if r["type"] == "BatchMatMul":       # [batch, m, k] @ [batch, k, n]
            key = (r["type"], a[0], a[1], a[2], b[2], dtype)
        else:                                # [m, k] @ [n, k]^T
            key = (r["type"], 1, a[0], a[1], b[0], dtype)
        runs.setdefault(key, []).append(float(r["duration_us"]))
    return [GemmShape(f"{t} {f'{bt}x' if bt > 1 else ''}{m}x{k}x{n}", bt, m, k, n, dt,
                      statistics.median(v), len(v))
            for (t, bt, m, k, n, dt), v in runs.items()]


def compare_gemms(chip=PROFILE_CHIP, shapes: list[GemmShape] | None = None) -> list[GemmComparison]:
    """Each GEMM shape simulated on ``chip`` (a preset name or `Chip`) with the planner's tile."""
    from ..hw.chip import get_chip
    from ..kernels.ir import CubeKernel
    from ..train.plan import tuned

    chip = get_chip(chip)
    out = []
    for s in shapes if shapes is not None else gemm_rows():
        cost = tuned(CubeKernel("MatMulV2", s.batch, s.m, s.k, s.n, s.dtype, s.dtype), chip)
        out.append(GemmComparison(s, cost.time_us))
    return out


def stream_rows() -> list[dict]:
    """The profile's Vector kernels: type, bytes read and written (from shapes and dtypes), the
    measured duration and the GB/s it implies."""
    out = []
    for r in _rows():
        if "MatMul" in r["type"]:
            continue
        moved = []
        for shapes, dtypes in ((r["input_shapes"], r["input_dtypes"]), (r["output_shapes"], r["output_dtypes"])):
            total = 0
            for dims, dt in zip(_dims(shapes), dtypes.split(";")):
                total += reduce(mul, dims, 1) * _BYTES.get(dt, 2)
            moved.append(total)
        us = float(r["duration_us"])
        out.append({"type": r["type"], "input_shapes": r["input_shapes"], "read_bytes": moved[0],
                    "written_bytes": moved[1], "duration_us": us, "gb_per_s": sum(moved) / us / 1e3})
    return out


def check_presets(presets, preset_value, fitted: float, tolerance: float, what: str) -> int:
    """The exit code of a fitting script's ``--check``: 1, with the presets named on stderr, if a
    preset's value (``preset_value(name)``) is further than ``tolerance`` from the ``fitted`` one."""
    off = [p for p in presets if abs(preset_value(p) - fitted) > tolerance]
    if off:
        print(f"out of sync with the fit: {', '.join(off)}; write the {what} printed above into "
              "pypto_lab/hw/presets/<chip>.toml", file=sys.stderr)
        return 1
    return 0


__all__ = ["LARGE_GEMM_US", "PROFILE", "PROFILE_CHIP", "GemmComparison", "GemmShape", "check_presets", "compare_gemms",
           "gemm_rows", "stream_rows"]
