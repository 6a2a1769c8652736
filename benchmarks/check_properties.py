"""Search many random shapes for violations of the chip model's invariants.

Run:  .venv/bin/python benchmarks/check_properties.py [--cases N] [--seed S]

The test suite checks the same properties with hypothesis on a few dozen examples per run; this
script runs thousands, for a model change that touches scheduling or bandwidth sharing:
  * roofline: simulated cycles >= max(compute at peak, (A + B + C bytes) / HBM bandwidth);
  * more work (larger m, k, n or batch, same tiling) never takes fewer cycles;
  * double buffering is never slower;
  * the same for vector kernels (roofline on bytes moved, more elements, double buffering).
Prints the number of cases and of violations per property (all should be 0).
"""

from __future__ import annotations

import argparse
import random

from pypto_lab import CubeTile, VecTile, simulate_matmul, simulate_vector
from pypto_lab.hw import get_chip, list_chips
from pypto_lab.hw.kernels import VECTOR_OPS
from pypto_lab.hw.tiling import default_cube_tile

FIXED = CubeTile(64, 64, 64, 128, 64, 64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    chips = list_chips()
    bad = {"matmul roofline": 0, "matmul more work": 0, "matmul double buffer": 0,
           "vector roofline": 0, "vector more work": 0, "vector double buffer": 0}

    def grow(hi):  # half the time no change, so one dimension at a time is covered too
        return 0 if rng.random() < 0.5 else rng.randint(1, hi)

    for _ in range(args.cases):
        chip = rng.choice(chips)
        c = get_chip(chip)
        m, k, n = (rng.randint(1, 2048) for _ in range(3))
        r = simulate_matmul(m, k, n, chip=chip)
        floor = max(m * k * n / (c.cube.macs_per_cycle("fp16") * c.cube_cores),
                    (m * k + k * n + m * n) * 2 / c.hbm_bytes_per_cycle())
        bad["matmul roofline"] += r.cycles < floor * (1 - 1e-9)
        small = simulate_matmul(m, k, n, chip=chip, tile=FIXED)
        big = simulate_matmul(m + grow(300), k + grow(600), n + grow(300), chip=chip, tile=FIXED,
                              batch=1 + grow(2))
        bad["matmul more work"] += big.cycles < small.cycles
        tile = default_cube_tile(c, m, k, n)
        on = simulate_matmul(m, k, n, chip=chip, tile=tile)
        off = simulate_matmul(m, k, n, chip=chip, tile=tile, double_buffer=False)
        bad["matmul double buffer"] += on.cycles > off.cycles + 1e-6

        op = rng.choice([o for o, s in VECTOR_OPS.items() if not s.row_wise])
        numel = rng.randint(1, 1 << 22)
        v = simulate_vector(op, numel, chip=chip)
        moved = numel * 2 * (VECTOR_OPS[op].inputs + 1)
        bad["vector roofline"] += v.cycles < moved / c.hbm_bytes_per_cycle() * (1 - 1e-9)
        vt = VecTile(**v.tile)
        bad["vector more work"] += simulate_vector(op, numel + grow(1 << 20), chip=chip, tile=vt).cycles < v.cycles
        bad["vector double buffer"] += v.cycles > simulate_vector(
            op, numel, chip=chip, tile=vt, double_buffer=False).cycles + 1e-6

    print(f"{args.cases} random cases per property (seed {args.seed})")
    for name, count in bad.items():
        print(f"  {name:22s} violations: {count}")


if __name__ == "__main__":
    main()
