#!/usr/bin/env python3
"""LayerNorm over the hidden axis in bf16: (x - mean) / sqrt(var + eps) * gamma + beta."""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

T, HID = 128, 256
EPS = 1e-5


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def layer_norm_kernel(
    x: pypto.Tensor((T, HID), pypto.DT_BF16),
    gamma: pypto.Tensor((HID,), pypto.DT_BF16),
    beta: pypto.Tensor((HID,), pypto.DT_BF16),
    out: pypto.Tensor((T, HID), pypto.DT_BF16),
):
    # a whole row per tile: the mean and variance are reductions along the last axis
    pypto.set_vec_tile_shapes(16, HID)
    mean = pypto.sum(x, dim=-1, keepdim=True) / HID
    centered = x - mean
    var = pypto.sum(centered * centered, dim=-1, keepdim=True) / HID
    out[:] = centered / pypto.sqrt(var + EPS) * gamma + beta


def main():
    torch.manual_seed(0)
    x = torch.randn((T, HID), dtype=torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(HID)).to(torch.bfloat16)
    beta = (0.1 * torch.randn(HID)).to(torch.bfloat16)
    out = torch.empty_like(x)

    layer_norm_kernel(x, gamma, beta, out)

    golden = torch.nn.functional.layer_norm(x.float(), (HID,), gamma.float(), beta.float(), EPS)
    return result("layer_norm", layer_norm_kernel, out, golden, torch.bfloat16)


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
