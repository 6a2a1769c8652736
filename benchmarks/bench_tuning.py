"""Speed and gain of `pypto_lab.tuning.auto_tune`'s tiling search.

Run:  NUMBA_NUM_THREADS=2 .venv/bin/python benchmarks/bench_tuning.py [--repeats N]

1. Screening speed: every legal tiling of ResNet-50's layer3 conv2 at batch 32 as an implicit
   GEMM (M = 32*14*14 = 6272, K = 256*9 = 2304, N = 256, fp16) enumerated and scored by the
   numba-compiled estimate; candidates per second = legal tilings / wall time (median of warm
   runs; the numba compile is excluded).
2. What the search finds for that kernel: the simulated time of the default tiling and of the
   best of the verified candidates at each level (no cache).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pypto_lab.hw.kernels import simulate_matmul
from pypto_lab.tools.tuning import screen_space

M, K, N = 32 * 14 * 14, 256 * 9, 256
VERIFY = {"fast": 4, "normal": 16, "exhaustive": 128}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"ResNet-50 layer3 conv2, batch 32: GEMM {M} x {K} x {N} fp16")
    print("| chip | space | legal tilings | median screen time | candidates / s |")
    print("|---|---|---:|---:|---:|")
    for chip in ("Ascend910A", "Ascend910B1"):
        for full in (False, True):
            screen_space(chip, M, K, N, "fp16", full=full)  # compile / load the numba cache
            runs = [screen_space(chip, M, K, N, "fp16", full=full) for _ in range(args.repeats)]
            sec = statistics.median(r.seconds for r in runs)
            print(f"| {chip} | {'full' if full else 'powers of two'} | {runs[0].count:,} | {sec * 1e3:.0f} ms | "
                  f"{runs[0].count / sec:,.0f} |")
    print()
    print("| chip | level | simulated | default us | best us | gain |")
    print("|---|---|---:|---:|---:|---:|")
    for chip in ("Ascend910A", "Ascend910B1"):
        default = simulate_matmul(M, K, N, "fp16", chip=chip).time_us
        for level, budget in VERIFY.items():
            scr = screen_space(chip, M, K, N, "fp16", full=level != "fast")
            best = default
            for i in np.argsort(scr.costs, kind="stable")[:budget]:
                best = min(best, simulate_matmul(M, K, N, "fp16", chip=chip, tile=scr.tile(int(i))).time_us)
            print(f"| {chip} | {level} | {budget} | {default:.1f} | {best:.1f} | {100 * (default - best) / default:.1f} % |")


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - t:.1f} s)")
