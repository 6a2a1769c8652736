#!/usr/bin/env python3
"""Speed of the LLM engine: `simulate_generation` on a 32-layer 7B config and `serve` of 1,000
requests on one 910B.

    python benchmarks/bench_llm.py [--repeats 5]

Each measurement runs in a fresh subprocess (numba's compiled code cached on disk, the engine's
memoised kernel costs empty: what a new notebook session pays), and the same call is then
repeated in that process (what a second call in a session pays, kernel costs memoised). Prints
the medians.
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
    "llama-2-7b, batch 32, 1,024 + 1,024 tokens (simulate_generation)":
        "from pypto_lab.llm import simulate_generation as f\n"
        "call = lambda: f('llama-2-7b', batch=32, prompt_len=1024, output_len=1024)",
    "1,000 requests, llama-3-8b on one Ascend910B1, rate 10/s (serve)":
        "from pypto_lab.llm import serve as f\n"
        "call = lambda: f('llama-3-8b', 'Ascend910B1', requests=1000, rate=10.0, progress=False)",
}

RUNNER = """
import json, time
{setup}
import pypto_lab.hw.kernels as K
K.simulate_matmul(64, 64, 64)          # numba's cached code loaded, outside the timing
t = time.perf_counter(); call(); first = time.perf_counter() - t
t = time.perf_counter(); call(); again = time.perf_counter() - t
print(json.dumps([first, again]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"{'case':<70} {'fresh process s':>16} {'memoised s':>11}")
    for name, setup in CASES.items():
        firsts, agains = [], []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", RUNNER.format(setup=setup)], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout
            a, b = json.loads(out.strip().splitlines()[-1])
            firsts.append(a)
            agains.append(b)
        print(f"{name:<70} {statistics.median(firsts):>16.2f} {statistics.median(agains):>11.3f}")


if __name__ == "__main__":
    main()
