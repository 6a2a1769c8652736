#!/usr/bin/env python3
"""Speed of `pypto_lab.explore.sweep`: design points per second per worker, and the speed-up
from one to two Dask workers on this machine.

    python benchmarks/bench_sweep.py [--repeats 3] [--workers 1 2]

For each worker count a LocalCluster of that many processes (one thread each, one numba thread)
is started; every worker is warmed first (imports, numba's code from its disk cache, each
model built and captured once: `client.run` runs a point on every worker). Then a sweep of
2 models (mlp, resnet18) x 18 Ascend910B1 variants (hbm_gbps x l1_kb x cube_cores), level 1,
fp16, runs with the cache off, ``--repeats`` times, each repeat on chips no worker has seen
(the clock differs by 1 MHz per repeat, so no kernel cost is memoised from an earlier repeat).
Prints the medians as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

MODELS = ["mlp", "resnet18"]
GRID = {"hbm_gbps": [800, 1600, 3200], "l1_kb": [256, 512, 1024], "cube_cores": [20, 24]}


def measure(n_workers: int, repeats: int) -> dict:
    from distributed import Client, LocalCluster

    from pypto_lab.explore import sweeps as ex

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      env=ex._worker_env()) as cluster, Client(cluster) as client:
        start = time.perf_counter()
        for point in ex.design_points(MODELS, "Ascend910B1", {"clock_mhz": [1700]}):
            client.run(ex.run_point, point)
        warm = time.perf_counter() - start
        times, points = [], 0
        for r in range(repeats):
            variants = {**GRID, "clock_mhz": [1800 + r]}
            start = time.perf_counter()
            df = ex.sweep(MODELS, "Ascend910B1", variants, client=client, cache=False, progress=False)
            times.append(time.perf_counter() - start)
            points = len(df)
    t = statistics.median(times)
    return {"workers": n_workers, "points": points, "seconds": t, "points_per_s": points / t,
            "per_worker": points / t / n_workers, "warm_s": warm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    rows = [measure(n, args.repeats) for n in args.workers]
    print(f"{os.cpu_count()} cores; {rows[0]['points']} points per sweep, median of {args.repeats}\n")
    print("| workers | median s | points/s | points/s/worker | speed-up | warm-up s |")
    print("|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['workers']} | {r['seconds']:.2f} | {r['points_per_s']:.1f} | {r['per_worker']:.1f} | "
              f"{rows[0]['seconds'] / r['seconds']:.2f}x | {r['warm_s']:.1f} |")


if __name__ == "__main__":
    main()
