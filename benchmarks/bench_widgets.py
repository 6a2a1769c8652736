"""Update latency of the tiling explorers: what a slider move costs (simulate + redraw + PNG).

Run:  .venv/bin/python benchmarks/bench_widgets.py [--repeats N]
Prints a Markdown table; benchmarks/README.md holds the last results. Each row cycles a slider
through a few legal values (every change is one `update()`: re-simulate the kernel, update the
reused Figure's artists, render it to the PNG the ipywidgets.Image shows) and reports the median
and the 90th percentile of the update time, and the median of its simulate part. Warm: numba's
JIT and matplotlib's fonts are loaded by a first round that is not timed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from pypto_lab.viz.widgets import tiling_explorer, vector_tiling_explorer

CASES = [
    # (label, factory, slider, values)
    ("ResNet-50 layer3 conv2, batch 1: matmul 196x2304x256 fp16 on Ascend910A",
     lambda: tiling_explorer(196, 2304, 256, chip="Ascend910A"), "m_l1", (64, 128, 192, 128)),
    ("ResNet-50 layer3 conv2, batch 1: matmul 196x2304x256 fp16 on Ascend910B1",
     lambda: tiling_explorer(196, 2304, 256, chip="Ascend910B1"), "k_l1", (256, 512, 1024, 512)),
    ("ResNet-50 layer1 conv2, batch 1: matmul 3136x576x64 fp16 on Ascend910A",
     lambda: tiling_explorer(3136, 576, 64, chip="Ascend910A"), "m_l1", (64, 128, 256, 128)),
    ("BERT-base softmax, batch 1 seq 128: 12x128x128 fp16 on Ascend910B1 (Vector)",
     lambda: vector_tiling_explorer("softmax", 12 * 128 * 128, 128, chip="Ascend910B1"), "rows", (8, 16, 32, 16)),
]


def bench(factory, slider: str, values, repeats: int) -> tuple[float, float, float, int]:
    w = factory()
    if slider.endswith("_l1"):  # keep l1 a multiple of l0
        w.set(**{slider.replace("_l1", "_l0"): min(values)})
    for v in values:  # warm-up
        w.sliders[slider].value = v
    times, sims = [], []
    for _ in range(repeats):
        for v in values:
            w.sliders[slider].value = v
            assert w.error is None, w.error
            times.append(w.last_update_ms)
            t = time.perf_counter()
            w._simulate()
            sims.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], statistics.median(sims), len(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', 'default')}\n")
    print("| explorer | updates | median update | p90 update | median simulate part |")
    print("|---|---:|---:|---:|---:|")
    for label, factory, slider, values in CASES:
        med, p90, sim, n = bench(factory, slider, values, args.repeats)
        print(f"| {label}, slider {slider} | {n} | {med:.1f} ms | {p90:.1f} ms | {sim:.1f} ms |")


if __name__ == "__main__":
    main()
