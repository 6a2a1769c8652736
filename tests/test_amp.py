"""pypto_lab.amp: autocast lists, initialize O1/O2 with fp32 master weights, dynamic loss scaling."""

import pytest
import torch
from torch import nn

import pypto_lab
from pypto_lab.precision import amp


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 1))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    return x, x[:, :1] * 2 - x[:, 1:2]


def test_o1_lists_match_the_seed_and_the_chip_pass():
    from pypto_lab.passes.mixed_precision import FP32_KEPT

    assert {"softmax", "layer_norm", "sum", "exp", "log", "cross_entropy", "mse_loss"} <= set(amp.FP32_OPS)
    assert {"matmul", "linear", "conv2d", "bmm"} <= set(amp.FP16_OPS)
    assert FP32_KEPT <= set(amp.FP32_OPS)
    assert not set(amp.FP16_OPS) & set(amp.FP32_OPS)
    model, _ = amp.initialize(_mlp(), torch.optim.SGD(_mlp().parameters(), lr=0.1), opt_level="O1")
    assert "softmax" in model._pypto_amp.fp32_ops and model._pypto_amp.opt_level == "O1"


def test_autocast_runs_matmul_in_fp16_and_softmax_in_fp32():
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    with amp.autocast():
        y = lin(x)
        p = torch.softmax(y, dim=-1)
        n = nn.functional.layer_norm(y, (16,))
        assert amp.is_autocast_enabled()
        with amp.autocast(enabled=False):
            assert lin(x).dtype == torch.float32
    assert y.dtype == torch.float16 and p.dtype == torch.float32 and n.dtype == torch.float32
    assert lin.weight.dtype == torch.float32 and not amp.is_autocast_enabled()
    with amp.autocast(dtype=torch.bfloat16):
        assert (x @ lin.weight).dtype == torch.bfloat16


def test_optimize_inside_autocast_defaults_to_its_precision():
    model, x = nn.Sequential(nn.Linear(64, 64), nn.Softmax(-1)), torch.randn(8, 64)
    with amp.autocast(dtype=torch.bfloat16):
        assert pypto_lab.optimize(model, x, chip="Ascend910B1").report().precision == "bf16"
    pypto_lab.set_optimization_options({"auto_mixed_precision": False})
    try:
        assert pypto_lab.optimize(model, x, chip="Ascend910B1").report().precision == "fp32"
        with amp.autocast():
            assert pypto_lab.optimize(model, x, chip="Ascend910B1").report().precision == "fp16"
    finally:
        pypto_lab.set_optimization_options({"auto_mixed_precision": True})


def test_o1_model_trains_under_autocast():
    model = _mlp()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.05), opt_level="O1")
    x, y = _data()
    assert model[0].weight.dtype == torch.float32
    losses = []
    for _ in range(20):
        loss = nn.functional.mse_loss(model(x), y)
        assert loss.dtype == torch.float32
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_o2_step_reduces_loss_with_fp32_masters():
    model = _mlp()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.05), opt_level="O2")
    assert model[0].weight.dtype == torch.float16 and model[3].weight.dtype == torch.float16
    assert model[1].weight.dtype == torch.float32          # the norm stays fp32
    assert all(m.dtype == torch.float32 for m in opt.master_params())
    x, y = _data()
    losses = []
    for _ in range(30):
        out = model(x)
        assert out.dtype == torch.float32
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(m.dtype == torch.float32 for m in opt.master_params())
    w, master = opt.pairs[0]
    assert w.dtype == torch.float16 and master.dtype == torch.float32 and w is not master
    assert torch.equal(w, master.half())                     # copied back after every step
    # 2**16 overflows fp16 at first: those steps were skipped and the scale backed off, then it trained
    skipped = opt.skipped_steps
    assert 0 <= skipped <= 8 and opt.scaler.get_scale() == 2.0 ** (16 - skipped)


def test_overflow_skips_the_step_and_backs_off():
    model = _mlp()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O2")
    opt.scaler.scale_value = 2.0 ** 40        # scaled fp16 grads overflow to inf
    before = [m.detach().clone() for m in opt.master_params()]
    x, y = _data()
    loss = nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    assert opt.skipped_steps == 1 and opt.scaler.get_scale() == 2.0 ** 39
    assert all(torch.equal(a, b) for a, b in zip(before, opt.master_params()))


def test_grad_scaler_with_a_plain_optimizer_grows_and_backs_off():
    torch.manual_seed(0)
    lin = nn.Linear(4, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    scaler = amp.GradScaler(init_scale=8.0, growth_interval=2)
    x = torch.randn(16, 4)
    for _ in range(2):
        opt.zero_grad()
        scaler.scale(lin(x).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 16.0                     # two clean steps: grown once
    w = lin.weight.detach().clone()
    opt.zero_grad()
    scaler.scale(lin(x).pow(2).mean() * float("inf")).backward()
    assert scaler.step(opt) is None
    scaler.update()
    assert torch.equal(w, lin.weight) and scaler.get_scale() == 8.0 and scaler.skipped_steps == 1


def test_bad_arguments_name_the_rule():
    with pytest.raises(amp.AmpError, match="opt_level 'O4'.*O0, O1, O2"):
        amp.initialize(_mlp(), None, opt_level="O4")
    with pytest.raises(amp.AmpError, match="torch.float16 or torch.bfloat16"):
        with amp.autocast(dtype=torch.float32):
            pass
    with pytest.raises(amp.AmpError, match="backoff_factor=2"):
        amp.GradScaler(backoff_factor=2)
    with pytest.raises(amp.AmpError, match="growth_interval=0"):
        amp.GradScaler(growth_interval=0)
    with pytest.raises(amp.AmpError, match="returned by amp.initialize"):
        with amp.scale_loss(torch.tensor(1.0), torch.optim.SGD(_mlp().parameters(), lr=0.1)):
            pass
    m = amp.initialize(_mlp(), None, "O1")
    with pytest.raises(amp.AmpError, match="already initialised at O1"):
        amp.initialize(m, None, "O2")
