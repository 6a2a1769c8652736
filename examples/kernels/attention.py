#!/usr/bin/env python3
"""Scaled dot-product attention: softmax(Q Kᵀ / sqrt(d)) V, unfused, fp16.

QKᵀ and PV are batched matmuls on the Cube (batch = B x heads); the scale and the softmax run on
the Vector unit with a whole key row per tile.
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

B, NH, S, D = 2, 4, 128, 64
SCALE = 1.0 / D ** 0.5


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def attention_kernel(
    q: pypto.Tensor((B, NH, S, D), pypto.DT_FP16),
    k: pypto.Tensor((B, NH, S, D), pypto.DT_FP16),
    v: pypto.Tensor((B, NH, S, D), pypto.DT_FP16),
    out: pypto.Tensor((B, NH, S, D), pypto.DT_FP16),
):
    pypto.set_cube_tile_shapes([64, 128], [64, 64], [64, 128])
    pypto.set_vec_tile_shapes(1, 1, 32, S)
    scores = pypto.matmul(q, pypto.transpose(k, 2, 3), pypto.DT_FP16) * SCALE
    row_max = pypto.amax(scores, dim=-1, keepdim=True)
    e = pypto.exp(scores - row_max)
    p = e / pypto.sum(e, dim=-1, keepdim=True)
    out[:] = pypto.matmul(p, v, pypto.DT_FP16)


def main():
    torch.manual_seed(0)
    q, k, v = (torch.randn((B, NH, S, D), dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)

    attention_kernel(q, k, v, out)

    golden = torch.softmax(q.float() @ k.float().transpose(-1, -2) * SCALE, dim=-1) @ v.float()
    return result("attention", attention_kernel, out, golden, torch.float16)


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
