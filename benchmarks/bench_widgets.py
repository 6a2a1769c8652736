"""Update latency of the tiling explorers: what a slider move costs (simulate + redraw + PNG).

Run:  .venv/bin/python benchmarks/bench_widgets.py [--repeats N]
Prints a Markdown table; benchmarks/README.md holds the last results. Each row moves a slider
through a few values the slider offers (every change is one `update()`: re-simulate the kernel,
update the reused Figure's artists, render it to the PNG the ipywidgets.Image shows) and reports
the median and the 90th percentile of the update time, the median of its simulate part, and the
PNG's size in pixels and bytes. The last row steps every slider of the 2048^3 explorer one step up
and back from its default tiling, as a student's key presses do; some of those tilings overflow
a buffer and show the overflow placeholder instead of a swimlane. Warm: numba's JIT and
matplotlib's fonts are loaded by a first round that is not timed.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import time

from PIL import Image

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
STEPS = ("matmul 2048x2048x2048 fp16 on Ascend910B1, every slider one step up and back",
         lambda: tiling_explorer(2048, 2048, 2048, chip="Ascend910B1"))


def _moves(w, slider: str | None, values):
    """The (slider, value) moves of one round."""
    if slider is not None:
        return [(slider, v) for v in values]
    moves = []
    for name, s in w.sliders.items():
        for v in (s.value + s.step, s.value, s.value - s.step, s.value):
            if s.min <= v <= s.max:
                moves.append((name, v))
    return moves


def bench(factory, slider: str | None, values, repeats: int) -> dict:
    w = factory()
    if slider is not None and slider.endswith("_l1"):  # l1 steps by its l0: start l0 at the smallest value
        w.set(**{slider.replace("_l1", "_l0"): min(values)})
    moves = _moves(w, slider, values)
    for name, v in moves:  # warm-up
        w.sliders[name].value = v
    times, sims, refused = [], [], 0
    for _ in range(repeats):
        for name, v in moves:
            w.sliders[name].value = v
            assert w.tile.to_dict()[name] == v, (name, v, w.tile)
            times.append(w.last_update_ms)
            refused += w.report is None
            t = time.perf_counter()
            try:
                w._simulate()
            except ValueError:  # TilingError: the tiling overflows a buffer
                pass
            sims.append((time.perf_counter() - t) * 1e3)
    times.sort()
    png = w.image.value
    return {"n": len(times), "median": statistics.median(times), "p90": times[int(0.9 * (len(times) - 1))],
            "sim": statistics.median(sims), "px": Image.open(io.BytesIO(png)).size, "kb": len(png) / 1024,
            "moves": len(moves), "refused": refused // repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', 'default')}\n")
    print("| explorer | updates | median update | p90 update | median simulate part | PNG |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [(label, factory, slider, values) for label, factory, slider, values in CASES]
    rows.append((*STEPS, None, ()))
    for label, factory, slider, values in rows:
        r = bench(factory, slider, values, args.repeats)
        what = f"slider {slider}" if slider else f"{r['moves']} moves a round, {r['refused']} of them overflowing"
        print(f"| {label}, {what} | {r['n']} | {r['median']:.1f} ms | {r['p90']:.1f} ms | {r['sim']:.1f} ms | "
              f"{r['px'][0]}x{r['px'][1]} px, {r['kb']:.0f} KB |")


if __name__ == "__main__":
    main()
