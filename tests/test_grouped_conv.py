"""Depthwise and grouped convolutions as CANN's Conv2D runs them: groups packed into whole C0
blocks of a block-diagonal weight (`pypto_lab.lowering.lower.grouped_conv_gemm`)."""

import pytest
import torch

from pypto_lab.compiler.optimize import optimize
from pypto_lab.hw.chip import get_chip
from pypto_lab.hw.kernels import Im2col, simulate_matmul
from pypto_lab.kernels.ir import CubeKernel
from pypto_lab.lowering.lower import grouped_conv_gemm


def test_a_depthwise_conv_packs_16_channels_per_fractal():
    # 32 channels, 3x3, one channel per group: 2 GEMMs of K = 16 channels x 9 taps, N = 16
    assert grouped_conv_gemm(32, 1, 1, 9, 12544) == (2, 12544, 144, 16)
    # 8 groups of 4 channels: 4 groups fill one C0 block, so 2 GEMMs of K = 16 x 9, N = 16
    assert grouped_conv_gemm(8, 4, 4, 9, 100) == (2, 100, 144, 16)
    # groups of 32 channels already fill C0: one GEMM per group, nothing packed
    assert grouped_conv_gemm(4, 32, 32, 9, 100) == (4, 100, 32 * 9, 32)
    # fewer groups than would fill a block: all of them in one GEMM
    assert grouped_conv_gemm(2, 1, 1, 9, 100) == (1, 100, 16 * 9, 16)


class Depthwise(torch.nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)

    def forward(self, x):
        return self.dw(x)


def test_a_depthwise_convs_cube_use_is_at_most_a_16th_because_only_the_diagonal_is_useful():
    x = torch.randn(4, 32, 112, 112)
    rep = optimize(Depthwise().eval(), (x,), chip="Ascend310P3", level=2, precision="fp16").report()
    conv = next(k for k in rep.kernels if k.spec.kind == "cube")
    spec, r = conv.spec, conv.reports[0]
    assert (spec.batch, spec.m, spec.k, spec.n) == (2, 4 * 112 * 112, 144, 16)
    assert spec.useful_macs == 4 * 112 * 112 * 32 * 9
    assert r.flops == 2 * spec.useful_macs                 # flops count the work the convolution needs
    assert 0 < r.cube_utilization <= 1 / 16                # 15 of 16 MACs of each fractal multiply zeros
    # the lowering it replaces: one GEMM per channel with K = 9, N = 1 (each fractal 9/256 useful)
    chip = get_chip("Ascend310P3")
    per_channel = simulate_matmul(4 * 112 * 112, 9, 1, chip=chip, batch=32, im2col=Im2col(112, 112, 3, 3, 1))
    packed = simulate_matmul(spec.m, spec.k, spec.n, chip=chip, batch=spec.batch, im2col=Im2col(112, 112, 3, 3, 1),
                             useful_macs=spec.useful_macs)
    assert packed.pipe_busy["CUBE"] < per_channel.pipe_busy["CUBE"]
    assert packed.cube_utilization > per_channel.cube_utilization


def test_useful_macs_is_checked_with_rule_and_fix():
    with pytest.raises(ValueError, match="useful_macs = 5000.*to 4,096. Fix"):
        CubeKernel("Conv2D", 1, 16, 16, 16, "fp16", "fp16", useful_macs=5000)
    with pytest.raises(ValueError, match="useful_macs = 0.*more than 0.*Fix: pass None"):
        simulate_matmul(16, 16, 16, chip="Ascend310P3", useful_macs=0)
