#!/usr/bin/env python3
"""The HBM presets' ``hbm_mixed_loss``, fitted to Vector kernels measured on a 910B1.

    python scripts/fit_hbm_mixed_loss.py            # the fit, leave-one-shape-out, each kernel's error
    python scripts/fit_hbm_mixed_loss.py --check    # exit 1 unless the presets carry the fitted value

The public msprof profile of a 910B1 (`pypto_lab.validation.kernel_profile`) has streaming Vector
kernels far larger than the 192 MB L2. Those that only read (ReduceSumD, 302 MB) stream at about
1.65 TB/s, and the one that only writes (ZerosLike, 1.09 GB) at 1.79 TB/s. Those that read and write
as much as they read (RealDiv by a scalar, Mul by a scalar) stream at 1.27-1.29 TB/s, where the
model streamed them at ~1.57 TB/s. DRAM loses time each time its bus turns between reads and
writes, so a kernel whose traffic mixes both reaches less of the bandwidth than one that only reads
or only writes. `Chip.hbm_stream_efficiency` charges it as ``1 - hbm_mixed_loss * mix``.
``mix = 2 min(r, w) / (r + w)`` is 0 for one direction and 1 for equal reads and writes.

The fit: least squares on relative error, bounded scalar minimisation. It runs over the profile's
kernels that read and write equal amounts and that the model can express as one-input element-wise
kernels (RealDiv and Mul by a scalar, each shape at its median time). Left out are kernels whose
measured rate is above the preset's HBM rate, because part of their input was still in L2 from the
kernel before. Only equal mixes are fitted. The linear scaling for other mixes is the model's
assumption. It is checked, not fitted, on the mixes the profile also has (Cast 2:1 and ApplyAdamW
4:3), which the script prints by their implied rates.

The constant goes into every HBM preset, as the pipe constants of the 910B1 fit are carried to the
910A. The 910A's HBM2 is the same DRAM family as the 910B's HBM2e. The 310P3 keeps 0: its
LPDDR4X is another DRAM standard, and no kernel measured on it was found.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy.optimize import minimize_scalar  # noqa: E402

from pypto_lab.explore.sweeps import variant_chip  # noqa: E402
from pypto_lab.hw.chip import get_chip  # noqa: E402
from pypto_lab.hw.kernels import VectorOp, simulate_vector  # noqa: E402
from pypto_lab.validation.kernel_profile import PROFILE_CHIP, check_presets, stream_rows  # noqa: E402

HBM_PRESETS = ("Ascend910A", "Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4")
BOUNDS = (0.0, 0.6)
TOLERANCE = 0.002
SCALE_BY_SCALAR = VectorOp(1, 2, (("VMULS", 1),))   # x * c or x / c: one tensor in, one out
_DTYPE = {2: "fp16", 4: "fp32"}


def fit_kernels() -> list[tuple[str, int, str, float]]:
    """(label, elements, dtype, median measured us) of the equal-mix one-input kernels."""
    hbm = get_chip(PROFILE_CHIP).hbm_gbps
    runs: dict[tuple, list[float]] = {}
    for r in stream_rows():
        parts = r["input_shapes"].split(";")
        scalar = len(parts) == 2 and parts[1].strip() in ("", "1")
        if r["type"] not in ("RealDiv", "Mul") or not scalar or r["read_bytes"] <= 0:
            continue
        if "," in parts[0] or r["gb_per_s"] > hbm:   # a multi-dim operand, or its input partly still in L2
            continue
        elems = int(parts[0])
        eb = round(r["written_bytes"] / elems)
        runs.setdefault((r["type"], elems, _DTYPE[eb]), []).append(r["duration_us"])
    return [(f"{t} {n:,} {dt}", n, dt, statistics.median(v)) for (t, n, dt), v in sorted(runs.items())]


def simulated(loss_value: float, kernels) -> list[float]:
    chip = variant_chip(PROFILE_CHIP, hbm_mixed_loss=loss_value)
    return [simulate_vector(SCALE_BY_SCALAR, n, dt, chip=chip).time_us for _, n, dt, _ in kernels]


def loss(value: float, kernels) -> float:
    return sum((s / k[3] - 1) ** 2 for s, k in zip(simulated(value, kernels), kernels))


def fit(kernels) -> float:
    res = minimize_scalar(loss, bounds=BOUNDS, args=(kernels,), method="bounded", options={"xatol": TOLERANCE})
    return float(res.x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless the presets carry the fitted value")
    args = ap.parse_args()
    kernels = fit_kernels()
    value = fit(kernels)
    print(f"hbm_mixed_loss, fitted on {len(kernels)} kernel shapes of the {PROFILE_CHIP} profile: {value:.3f}")
    outs = [fit([k for k in kernels if k is not left]) for left in kernels]
    print(f"leave one shape out: {min(outs):.3f}-{max(outs):.3f}")
    base = simulated(0.0, kernels)
    print(f"{'kernel':34s} {'measured us':>12s} {'loss 0':>9s} {'fitted':>9s} {'error':>7s}")
    for k, b, s in zip(kernels, base, simulated(value, kernels)):
        print(f"{k[0]:34s} {k[3]:12.1f} {b:9.1f} {s:9.1f} {s / k[3] - 1:+7.1%}")
    chip = get_chip(PROFILE_CHIP)
    print("other mixes, not fitted (implied rate = the model's equal-mix rate scaled by the efficiency):")
    for r in stream_rows():
        if r["type"] in ("Cast", "ApplyAdamW") and r["read_bytes"] > chip.l2_bytes and r["gb_per_s"] < chip.hbm_gbps:
            ratio = chip.hbm_stream_efficiency(r["read_bytes"], r["written_bytes"])
            eff = 1 - value * 2 * min(r["read_bytes"], r["written_bytes"]) / (r["read_bytes"] + r["written_bytes"])
            print(f"  {r['type']:10s} {r['input_shapes'][:28]:28s} measured {r['gb_per_s']:6.0f} GB/s, "
                  f"model {0.98 * chip.hbm_gbps * eff:6.0f} GB/s (efficiency {eff:.3f}; preset now {ratio:.3f})")
    for preset in HBM_PRESETS:
        print(f"{preset}: hbm_mixed_loss = {value:.3f} (preset: {get_chip(preset).hbm_mixed_loss:.3f})")
    if not args.check:
        return 0
    return check_presets(HBM_PRESETS, lambda p: get_chip(p).hbm_mixed_loss, value, 2 * TOLERANCE + 0.002,
                         "hbm_mixed_loss value")


if __name__ == "__main__":
    sys.exit(main())
