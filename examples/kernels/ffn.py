#!/usr/bin/env python3
"""A small FFN: out = GELU(x @ W1) @ W2 (GELU as x * sigmoid(1.702 x)), fp16.

The sigmoid is written out as 1 / (1 + exp(-1.702 x)) with exp and reciprocal.

Two Cube matmuls with a Vector activation between them: the Tensor Graph has three stages, and
the intermediate (T x F) goes through GM between the two matmuls.
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

T, HID, FF = 128, 256, 512


def gelu(h):
    # sigmoid(z) = 1 / (1 + exp(-z)) from primitives: exp, add, reciprocal
    return h * pypto.reciprocal(pypto.exp(h * -1.702) + 1.0)


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def ffn_kernel(
    x: pypto.Tensor((T, HID), pypto.DT_FP16),
    w1: pypto.Tensor((HID, FF), pypto.DT_FP16),
    w2: pypto.Tensor((FF, HID), pypto.DT_FP16),
    out: pypto.Tensor((T, HID), pypto.DT_FP16),
):
    pypto.set_cube_tile_shapes([64, 64], [64, 256], [128, 128])
    pypto.set_vec_tile_shapes(32, 256)
    h = pypto.matmul(x, w1, pypto.DT_FP16)
    a = gelu(h)
    out[:] = pypto.matmul(a, w2, pypto.DT_FP16)


def main():
    torch.manual_seed(0)
    x = torch.randn((T, HID), dtype=torch.float16)
    w1 = (torch.randn((HID, FF)) / HID ** 0.5).to(torch.float16)
    w2 = (torch.randn((FF, HID)) / FF ** 0.5).to(torch.float16)
    out = torch.empty((T, HID), dtype=torch.float16)

    ffn_kernel(x, w1, w2, out)

    # reference with the kernel's roundings: fp16 storage between the stages, fp32 arithmetic
    h = (x.float() @ w1.float()).half().float()
    a = (h * torch.sigmoid(1.702 * h)).half().float()
    golden = a @ w2.float()
    return result("ffn", ffn_kernel, out, golden, torch.float16)


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
