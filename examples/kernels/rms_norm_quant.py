#!/usr/bin/env python3
"""RMSNorm fused with per-token int8 quantisation (the input stage of a quantised matmul), bf16 in.

y = x * rsqrt(mean(x^2) + eps) * gamma in fp32; each token's row gets its own symmetric scale
127 / max|y| and is quantised with ``pypto.quantize`` (round half to even, saturating to int8);
the kernel also returns the dequantisation scale max|y| / 127 that the matmul after it needs.
Written here from that description; the torch reference below computes the same in fp32.
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import check, result  # noqa: E402

T, HID = 16, 512
EPS = 1e-6


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def rms_norm_quant_kernel(
    x: pypto.Tensor((T, HID), pypto.DT_BF16),
    gamma: pypto.Tensor((1, HID), pypto.DT_BF16),
    codes: pypto.Tensor((T, HID), pypto.DT_INT8),
    dequant_scale: pypto.Tensor((T, 1), pypto.DT_FP32),
):
    pypto.set_vec_tile_shapes(8, HID)
    xf = pypto.cast(x, pypto.DT_FP32)
    mean_sq = pypto.sum(xf * xf, dim=-1, keepdim=True) / HID
    y = xf * pypto.rsqrt(mean_sq + EPS) * pypto.cast(gamma, pypto.DT_FP32)

    row_max = pypto.amax(pypto.abs(y), dim=-1, keepdim=True)             # (T, 1)
    scale = pypto.div(pypto.full([T, 1], 127.0, pypto.DT_FP32), row_max)
    codes[:] = pypto.quantize(y, pypto.reshape(scale, [T]), pypto.DT_INT8, -1, None)
    dequant_scale[:] = row_max / 127.0


def reference(x, gamma):
    """(int8 codes, dequantisation scale) in torch, fp32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()
    row_max = y.abs().amax(-1, keepdim=True)
    q = torch.round(y * (127.0 / row_max)).clamp(-128, 127).to(torch.int8)
    return q, row_max / 127.0


def main():
    torch.manual_seed(0)
    x = torch.randn((T, HID), dtype=torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn((1, HID))).to(torch.bfloat16)
    codes = torch.empty((T, HID), dtype=torch.int8)
    dequant_scale = torch.empty((T, 1), dtype=torch.float32)

    rms_norm_quant_kernel(x, gamma, codes, dequant_scale)

    q_ref, s_ref = reference(x, gamma)
    scale_ok, scale_diff = check(dequant_scale, s_ref, torch.float32)
    exact = float((codes == q_ref).float().mean())
    print(f"rms_norm_quant: dequant scale {'ok' if scale_ok else 'WRONG'} (max|diff| {scale_diff:.3g}), "
          f"{100 * exact:.2f}% of the int8 codes equal torch's")
    r = result("rms_norm_quant", rms_norm_quant_kernel, codes, q_ref, torch.int8,
               scale_max_abs_diff=scale_diff, exact_fraction=exact)
    r.passed = r.passed and scale_ok and exact >= 0.99
    return r


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
