"""A channel concatenation of convolution outputs in 5HD runs no kernel: the convolutions write
their results at their channel offsets (GE's ConvConcatFusionPass)."""

from __future__ import annotations

import torch
from torch import nn

import pypto_lab


class Branches(nn.Module):
    def __init__(self, c_a: int = 32, c_b: int = 48):
        super().__init__()
        self.a = nn.Conv2d(16, c_a, 1)
        self.b = nn.Conv2d(16, c_b, 3, padding=1)

    def forward(self, x):
        return torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], dim=1) * 2


def _kernels(model, level):
    rep = pypto_lab.optimize(model.eval(), torch.randn(2, 16, 28, 28), chip="Ascend310P3", level=level).report()
    return rep, [k.name.split(":")[0] for k in rep.kernels]


def test_conv_outputs_concatenated_on_channels_need_no_concat_kernel_nor_transdata():
    rep1, k1 = _kernels(Branches(), 1)
    rep2, k2 = _kernels(Branches(), 2)
    assert "ConcatD" in k1                                   # level 1: no device layout, a real copy
    assert "ConcatD" not in k2 and k2.count("TransData") <= 2   # only the graph's own input and output
    layout = next(p for p in rep2.passes if p.name == "layout")
    assert any("written in place" in n.reason for n in layout.notes)


def test_channels_that_are_not_whole_c0_blocks_keep_the_copy():
    _, k = _kernels(Branches(c_a=24), 2)      # 24 channels: one and a half 16-channel blocks
    assert "ConcatD" in k


def test_in_place_concatenation_computes_the_same():
    model = Branches().eval()
    x = torch.randn(2, 16, 28, 28)
    one = pypto_lab.optimize(model, x, chip="Ascend310P3", level=1)(x)   # a ConcatD copy
    two = pypto_lab.optimize(model, x, chip="Ascend310P3", level=2)(x)   # written in place
    assert torch.equal(one, two)
    assert torch.allclose(two, model(x), atol=1e-2)                     # fp16 on the 310P3


class Dense(nn.Module):
    """A DenseNet-style block: each concatenation takes every feature before it again."""

    def __init__(self):
        super().__init__()
        self.f1 = nn.Conv2d(16, 16, 3, padding=1)
        self.f2 = nn.Conv2d(32, 16, 3, padding=1)
        self.f3 = nn.Conv2d(48, 16, 3, padding=1)

    def forward(self, x):
        x0 = torch.relu(x)
        x1 = torch.relu(self.f1(x0))
        c1 = torch.cat([x0, x1], 1)
        x2 = torch.relu(self.f2(c1))
        c2 = torch.cat([x0, x1, x2], 1)
        return self.f3(c2)


def _dense(batch: int):
    x = torch.randn(batch, 16, 28, 28)
    rep = pypto_lab.optimize(Dense().eval(), x, chip="Ascend310P3", level=2).report()
    layout = next(p for p in rep.passes if p.name == "layout")
    return [k.name.split(":")[0] for k in rep.kernels], layout


def test_reused_inputs_share_the_first_concatenations_buffer_and_later_ones_copy_at_batch_1():
    # GE's ConcatNotaskPass: x0 and x1 live in c1's buffer (no kernel); c2 takes them again, so it copies
    kernels, layout = _dense(1)
    assert kernels.count("ConcatD") == 1
    assert any("share one buffer" in n.reason and "ConcatNotaskPass" in n.reason for n in layout.notes)
    assert any(n.node == "cat_1" and "already lives in an earlier concatenation's buffer" in n.reason
               for n in layout.notes)


def test_at_batch_2_a_channel_concatenation_is_not_contiguous_and_every_one_copies():
    kernels, layout = _dense(2)
    assert kernels.count("ConcatD") == 2
    assert any("not contiguous" in n.reason for n in layout.notes)
