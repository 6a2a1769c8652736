"""Wall time of the serving simulator's own Python: 1,000 ShareGPT-like requests on the linear fake
step model (`pypto_lab.llm.linear_step.LinearStepModel`, defaults), so the step model costs
next to nothing and what is timed is the scheduler's loop.

Run:  .venv/bin/python benchmarks/bench_serving.py [--repeats 5] [--requests 1000]

Prints one markdown row per (scheduler, rate): the median wall time of ``--repeats`` runs (after
one warm-up run), the simulated steps and what the run reports.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from pypto_lab.llm.linear_step import LinearStepModel
from pypto_lab.llm.serving import simulate_serving

CASES = [("continuous", float("inf")), ("continuous", 10.0), ("static", float("inf")), ("static", 10.0)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    model = LinearStepModel()
    print(f"machine: {platform.machine()}, python {platform.python_version()}; {args.requests} requests, "
          f"{model.name} (defaults), median of {args.repeats}")
    print("| scheduler | rate (req/s) | median wall time | steps | wall time per step | preemptions | output tokens/s (simulated) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for scheduler, rate in CASES:
        simulate_serving(model, args.requests, rate=rate, scheduler=scheduler, progress=False)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = simulate_serving(model, args.requests, rate=rate, scheduler=scheduler, progress=False)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(f"| {scheduler} | {rate:g} | {med * 1e3:.0f} ms | {r.steps:,} | {med / r.steps * 1e6:.1f} us | "
              f"{r.preemptions} | {r.output_tokens_per_s:,.0f} |")


if __name__ == "__main__":
    main()
