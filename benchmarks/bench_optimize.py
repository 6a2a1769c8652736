"""Speed of whole-model optimisation: passes + kernel costing, capture excluded.

Run:  .venv/bin/python benchmarks/bench_optimize.py [--repeats N]

Medians of warm runs: the model is captured (and the numba JIT loaded) before timing; the
per-chip memo of kernel costs is cleared before every timed run, so each run simulates every
distinct kernel once, as for a chip the model was never costed on (the issue-10 target: ResNet-50
batch 24 at level 3 within 0.4 s). Also times models of 25, 50 and 100 identical-width MLP layers to
show that the cost grows linearly with the layer count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from pypto_lab import optimize
from pypto_lab.capture import capture
from pypto_lab.kernels.cost import clear_memo
from pypto_lab.models.zoo import bert_base, resnet50


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        clear_memo()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def mlp(layers: int) -> nn.Module:
    blocks = []
    for i in range(layers):
        blocks += [nn.Linear(512 + (i % 7) * 16, 512 + ((i + 1) % 7) * 16), nn.GELU()]
    return nn.Sequential(*blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("| model | level | chip | median time (capture excluded) |")
    print("|---|---:|---|---:|")
    cases = [("ResNet-50 batch 24", *resnet50(batch=24), (3,)), ("ResNet-50 batch 32", *resnet50(batch=32), (1, 3)),
             ("BERT-base batch 8 seq 128", *bert_base(batch=8), (1, 3))]
    for label, model, inputs, levels in cases:
        capture(model, inputs)
        for chip in ("Ascend910A", "Ascend910B1"):
            for level in levels:
                optimize(model, inputs, chip=chip, level=level)
                t = timed(lambda m=model, i=inputs, c=chip, lv=level: optimize(m, i, chip=c, level=lv), args.repeats)
                print(f"| {label} | {level} | {chip} | {t * 1e3:.0f} ms |")
    for layers in (25, 50, 100):
        model, x = mlp(layers), torch.randn(64, 512)
        capture(model, (x,))
        optimize(model, (x,), chip="Ascend910B1", level=3)
        t = timed(lambda m=model, x=x: optimize(m, (x,), chip="Ascend910B1", level=3), args.repeats)
        print(f"| MLP of {layers} Linear+GELU layers, batch 64 | 3 | Ascend910B1 | {t * 1e3:.0f} ms ({t / layers * 1e3:.1f} ms per layer) |")


if __name__ == "__main__":
    main()
