#!/usr/bin/env python3
"""RMSNorm (LLaMA style) in bf16: x * rsqrt(mean(x^2) + eps) * gamma."""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

T, HID = 128, 512
EPS = 1e-6


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def rms_norm_kernel(
    x: pypto.Tensor((T, HID), pypto.DT_BF16),
    gamma: pypto.Tensor((HID,), pypto.DT_BF16),
    out: pypto.Tensor((T, HID), pypto.DT_BF16),
):
    pypto.set_vec_tile_shapes(8, HID)
    mean_sq = pypto.sum(x * x, dim=-1, keepdim=True) / HID
    out[:] = x * pypto.rsqrt(mean_sq + EPS) * gamma


def main():
    torch.manual_seed(0)
    x = torch.randn((T, HID), dtype=torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(HID)).to(torch.bfloat16)
    out = torch.empty_like(x)

    rms_norm_kernel(x, gamma, out)

    xf = x.float()
    golden = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()
    return result("rms_norm", rms_norm_kernel, out, golden, torch.bfloat16)


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
