#!/usr/bin/env python3
"""Speed of `pypto_lab.train.simulate_step`: a ResNet-50 training step (batch 32 per card, 8
Ascend910B1 cards, O2) and a BERT-base fine-tuning step (batch 32 x 128 tokens, 8 cards).

    python benchmarks/bench_train.py [--repeats 3]

Each measurement runs in a fresh subprocess (numba's compiled code cached on disk, nothing
memoised: what a new notebook session pays for its first step, capture included), then the same
call again in that process (the step's graph and kernel costs memoised: what changing the number
of cards, the bucket size or the accumulation costs), then with another bucket size. Prints the
medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "ResNet-50, batch 32/card, 8 x Ascend910B1, sgd":
        "import torch, torchvision\n"
        "m = torchvision.models.resnet50()\n"
        "b = (torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,)))\n"
        "call = lambda mb=25: simulate_step(m, b, torch.nn.functional.cross_entropy, optimizer='sgd', cards=8,"
        " bucket_mb=mb)",
    "BERT-base fine-tuning, batch 32 x 128, 8 x Ascend910B1, adamw":
        "import torch, transformers\n"
        "m = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))\n"
        "ids = torch.randint(0, 30522, (32, 128))\n"
        "b = {'input_ids': ids, 'labels': torch.zeros(32, dtype=torch.long)}\n"
        "call = lambda mb=25: simulate_step(m, b, cards=8, bucket_mb=mb)",
}

RUNNER = """
import json, time
from pypto_lab.train import simulate_step
{setup}
import pypto_lab.hw.kernels as K
K.simulate_matmul(64, 64, 64)          # numba's cached code loaded, outside the timing
t = time.perf_counter(); call(); first = time.perf_counter() - t
t = time.perf_counter(); call(); again = time.perf_counter() - t
t = time.perf_counter(); call(5); other = time.perf_counter() - t
print(json.dumps([first, again, other]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{'case':<64} {'fresh process s':>16} {'again s':>8} {'5 MB buckets s':>15}")
    for name, setup in CASES.items():
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", RUNNER.format(setup=setup)], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        med = [statistics.median(r[i] for r in runs) for i in range(3)]
        print(f"{name:<64} {med[0]:>16.2f} {med[1]:>8.3f} {med[2]:>15.3f}")


if __name__ == "__main__":
    main()
