#!/usr/bin/env python3
"""Matmul on the Cube unit with explicit cube tile shapes, and what the tiling does to cycles.

set_cube_tile_shapes([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1]): the L1 block is m_l1 x n_l1 with K
panels of k_l1; each MMAD works on m_l0 x k_l0 (L0A) times k_l0 x n_l0 (L0B) into L0C. Inputs are
fp16, accumulation fp32, the output is rounded to fp16.
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result, run_metrics  # noqa: E402

M, K, N = 512, 512, 512


def make_kernel(m_tiles, k_tiles, n_tiles):
    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
    def matmul_kernel(
        a: pypto.Tensor((M, K), pypto.DT_FP16),
        b: pypto.Tensor((K, N), pypto.DT_FP16),
        out: pypto.Tensor((M, N), pypto.DT_FP16),
    ):
        pypto.set_cube_tile_shapes(m_tiles, k_tiles, n_tiles)
        out[:] = pypto.matmul(a, b, pypto.DT_FP16)

    return matmul_kernel


# the tiling the example checks, and a small one to compare with
TILING = ([128, 128], [64, 256], [128, 256])
SMALL_TILING = ([32, 32], [32, 32], [32, 32])


def main():
    torch.manual_seed(0)
    a = torch.randn((M, K), dtype=torch.float16)
    b = torch.randn((K, N), dtype=torch.float16)
    out = torch.empty((M, N), dtype=torch.float16)

    kernel = make_kernel(*TILING)
    kernel(a, b, out)
    golden = a.float() @ b.float()
    r = result("matmul", kernel, out, golden, torch.float16)

    small = make_kernel(*SMALL_TILING)
    small(a, b, torch.empty_like(out))
    small_cycles, _, small_frac = run_metrics(small)
    r.extra["small_tiling_cycles"] = small_cycles
    print(f"  tiles {SMALL_TILING}: {small_cycles:,} cycles ({100 * small_frac:.1f}% of peak) "
          f"vs {r.cycles:,} with {TILING}")
    return r


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
