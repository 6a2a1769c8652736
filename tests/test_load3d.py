"""A convolution's feature map crosses GM once: load3d builds the im2col rows in L1."""

from __future__ import annotations

import pytest
import torch

import pypto_lab
from pypto_lab.hw.kernels import Im2col, simulate_conv2d, simulate_matmul


def test_a_3x3_convolution_reads_its_feature_map_not_its_im2col_rows():
    n, c, h, w, co = 8, 64, 56, 56, 64
    conv = simulate_conv2d(n, c, h, w, co, 3, 1, 1, "fp16", "Ascend310P3")
    through_gm = simulate_matmul(n * h * w, c * 9, co, "fp16", "Ascend310P3")
    feature_map, im2col = n * c * h * w * 2, n * h * w * c * 9 * 2
    # the A operand's first touches: the feature map with its halo rows, far below the 9x im2col
    a_first = conv.min_gm_bytes - co * c * 9 * 2 - n * h * w * co * 2
    assert feature_map <= a_first < 0.5 * im2col
    assert conv.time_us < 0.6 * through_gm.time_us   # the layer is DDR-bound on the 310P3


def test_a_1x1_convolution_reads_what_it_uses_either_way():
    assert Im2col(56, 56, 1, 1, 1).gm_fraction(128) == 1.0
    one = simulate_conv2d(4, 256, 28, 28, 128, 1, 1, 0, "fp16", "Ascend910B1")
    same = simulate_matmul(4 * 28 * 28, 256, 128, "fp16", "Ascend910B1")
    assert one.time_us == pytest.approx(same.time_us)


@pytest.mark.parametrize("rows, expected_in_rows", [(56, 3), (112, 4), (128, 6)])
def test_a_panel_needs_its_output_rows_plus_the_kernel_halo(rows, expected_in_rows):
    im = Im2col(w=56, wo=56, kh=3, kw=3, stride=1)
    assert im.gm_fraction(rows) == pytest.approx(expected_in_rows * 56 / (rows * 9))


def test_the_report_says_what_load3d_kept_off_gm():
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU()).eval()
    rep = pypto_lab.optimize(model, torch.randn(2, 32, 28, 28), chip="Ascend310P3", level=1).report()
    [note] = [n for n in rep.notes if "load3d" in n]
    assert "1 convolutions" in note and "instead of" in note
