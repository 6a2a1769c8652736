#!/usr/bin/env python3
"""Softmax over the last axis, one batch row per loop iteration.

exp(x - max(x)) / sum(exp(x - max(x))) from amax, exp and sum: each op runs tile by tile on the
Vector unit; reductions along the last axis need the whole row in one tile (the tile's last dim
is the row length).
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

B, S, H, D = 8, 32, 1, 256


def softmax_core(x):
    row_max = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - row_max)
    return e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def softmax_kernel(
    x: pypto.Tensor((B, S, H, D), pypto.DT_FP16),
    out: pypto.Tensor((B, S, H, D), pypto.DT_FP16),
):
    pypto.set_vec_tile_shapes(1, 8, 1, D)
    for b in pypto.loop(0, B, 1, name="LOOP_B", idx_name="b"):
        out[b:b + 1, ...] = softmax_core(x[b:b + 1, ...])


def main():
    torch.manual_seed(0)
    x = torch.randn((B, S, H, D), dtype=torch.float16)
    out = torch.empty_like(x)

    softmax_kernel(x, out)

    golden = torch.softmax(x.float(), dim=-1)
    return result("softmax", softmax_kernel, out, golden, torch.float16)


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
