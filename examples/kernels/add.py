#!/usr/bin/env python3
"""Hello world: out = x + y on the simulated AI Core (Vector unit).

Run:  python examples/kernels/add.py
The kernel is written exactly as for CANN PyPTO; only the import names pypto_lab's SIM mode.
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

runtime_options = {"run_mode": pypto.RunMode.SIM}


@pypto.jit(runtime_options=runtime_options)
def add_kernel(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
    # One vector tile is 64 x 128 fp16 = 16 KiB of UB per operand; the rank matches x and y.
    pypto.set_vec_tile_shapes(64, 128)
    # Kernels return nothing: `out[:] = ...` writes the preallocated output.
    out[:] = x + y


def main(shape=(256, 512), dtype=torch.float16):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    y = torch.randn(shape, dtype=dtype)
    out = torch.empty(shape, dtype=dtype)

    add_kernel(x, y, out)

    return result("add", add_kernel, out, x + y)


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
