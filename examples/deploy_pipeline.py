"""The seed article's deployment advice (section 7.3: pipelines, asynchronous inference, a tuned batch
size) as measured curves: ResNet-50 on a simulated Ascend910B1 through `pypto_lab.deploy`.

Run:  .venv/bin/python examples/deploy_pipeline.py [--preprocess-ms 0] [--png out/pipeline.png]

Prints the sweep over batch 1/8/32 x streams 1/2/4 (plus the blocking one-stream program), then the
latency of batch 32 under an open-loop load of 18,000 samples/s (more than the blocking program
sustains), sync against 2 streams. ``--preprocess-ms`` is the host pre-processing per sample (0:
inputs arrive pre-processed, e.g. decoded by DVPP on the device); leave it out with
``--measure-preprocess`` to time decode + resize of the shipped images on this machine instead.
"""

from __future__ import annotations

import argparse

import torch
import torchvision

import pypto_lab
from pypto_lab.deploy import pipeline, plot_throughput_latency, sweep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preprocess-ms", type=float, default=0.0)
    ap.add_argument("--measure-preprocess", action="store_true")
    ap.add_argument("--png", default=None)
    args = ap.parse_args()
    pre = None if args.measure_preprocess else args.preprocess_ms
    model = torchvision.models.resnet50().eval()
    om = pypto_lab.optimize(model, (torch.randn(1, 3, 224, 224),), chip="Ascend910B1", level=3, precision="fp16")
    s = sweep(om, batches=[1, 8, 32], streams=[1, 2, 4], preprocess_ms=pre)
    print(s.table())
    source = s.results[0].source  # the reports at each batch, already optimised
    for mode, streams in (("sync", 1), ("async", 2)):
        r = pipeline(source, batch=32, streams=streams, mode=mode, preprocess_ms=pre, rate_per_s=18000, requests=64)
        print(f"offered 18,000 samples/s at batch 32, {mode} {streams} stream(s): "
              f"{r.throughput_per_s:,.0f} samples/s, latency mean {r.latency_ms:.2f} ms, p99 {r.latency_p99_ms:.2f} ms")
    if args.png:
        plot_throughput_latency(s).savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
