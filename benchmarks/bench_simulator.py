"""Speed of the chip model: event-simulator throughput and end-to-end 4096^3 matmul simulation.

Run:  make bench   (or: .venv/bin/python benchmarks/bench_simulator.py [--repeats N])
Prints a Markdown table; benchmarks/README.md holds the last results and the machine they came from.
Medians of warm runs (the numba JIT is compiled, or loaded from NUMBA_CACHE_DIR, before timing).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from pypto_lab.hw import list_chips
from pypto_lab.hw.kernels import simulate_matmul
from pypto_lab.hw.simulator import _run


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def synthetic_program(n_instr: int, seed: int = 0):
    """A tile-program-like instruction stream: 24 cores x 7 pipes, 1-3 backward flags each,
    30 % of the instructions with a 300-cycle completion latency (GM transfers)."""
    rng = np.random.default_rng(seed)
    lanes = rng.integers(0, 24 * 7, n_instr).astype(np.int64)
    duration = rng.uniform(1, 500, n_instr)
    latency = np.where(rng.random(n_instr) < 0.3, 300.0, 0.0)  # GM transfers: a round-trip floor
    counts = rng.integers(1, 4, n_instr)
    counts[0] = 0
    dep_ptr = np.zeros(n_instr + 1, np.int64)
    np.cumsum(counts, out=dep_ptr[1:])
    owner = np.repeat(np.arange(n_instr), counts)
    back = rng.integers(1, 64, owner.size)
    dep_idx = np.maximum(owner - back, 0).astype(np.int64)
    return lanes, duration, latency, dep_ptr, dep_idx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--instructions", type=int, default=5_000_000)
    args = ap.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', '-')}")
    print()
    print("| measurement | instructions | median time | rate |")
    print("|---|---:|---:|---:|")

    lanes, duration, latency, dep_ptr, dep_idx = synthetic_program(args.instructions)
    _run(lanes[:10], duration[:10], latency[:10], dep_ptr[:11], dep_idx[: dep_ptr[10]], 24 * 7)  # warm the JIT
    t = median_time(lambda: _run(lanes, duration, latency, dep_ptr, dep_idx, 24 * 7), args.repeats)
    print(f"| event simulator core loop, synthetic stream | {args.instructions:,} | {t * 1e3:.1f} ms "
          f"| {args.instructions / t / 1e6:.1f} M instr/s |")

    for chip in list_chips():
        simulate_matmul(4096, 4096, 4096, chip=chip)  # warm
        t = median_time(lambda c=chip: simulate_matmul(4096, 4096, 4096, chip=c), args.repeats)
        r = simulate_matmul(4096, 4096, 4096, chip=chip)
        print(f"| simulate_matmul 4096x4096x4096 fp16 on {chip} (build + simulate) | {r.instruction_count:,} "
              f"| {t * 1e3:.1f} ms | {r.instruction_count / t / 1e6:.2f} M instr/s end to end |")


if __name__ == "__main__":
    main()
