"""Running an optimised model: real outputs with the NPU's numerics, compare_tensors, compare_layers."""

import math
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torchvision

import pypto_lab
from pypto_lab import optimize
from pypto_lab.hw import numerics
from pypto_lab.kernels.ir import AttentionKernel
from pypto_lab.runtime.compare import CompareError, compare_tensors
from pypto_lab.runtime.interpreter import RuntimeInputError, flash_attention
from pypto_lab.tools.debug import compare_layers


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _calibrated(model: nn.Module, shape) -> nn.Module:
    """BatchNorm running statistics from a few batches (as a trained model has), then eval mode."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(*shape))
    return model.eval()


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return _calibrated(SmallCNN(), (8, 3, 16, 16)), torch.randn(1, 3, 16, 16)


def _scaled_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| relative to the output's scale (max |ref|)."""
    return float((out - ref).detach().abs().max() / ref.detach().abs().max())


def test_fp32_on_910b_matches_the_model_at_every_level_and_for_other_inputs(cnn):
    model, x = cnn
    for level in (0, 1, 3):
        om = optimize(model, x, chip="Ascend910B1", level=level, precision="fp32")
        for inp in (x, torch.randn(1, 3, 16, 16)):  # the example and other values of the same shape
            out = om(inp)
            # fp32 round-off only (BN folded in fp32, another summation order): measured 1.3e-7
            assert _scaled_error(out, model(inp)) <= 1e-5
    assert om.runtime.last_stats.nodes.get("folded_bn") == 2 and om.last_cpu_us > 0


def test_fp16_bf16_and_int8_stay_within_their_bounds(cnn):
    model, x = cnn
    ref = model(x)
    errors = {}
    for precision in ("fp16", "bf16", "int8"):
        out = optimize(model, x, chip="Ascend910B1", level=1, precision=precision)(x)
        r = compare_tensors(out, ref, verbose=False)
        errors[precision] = _scaled_error(out, ref)
        assert r.cosine_similarity >= {"fp16": 0.9999, "bf16": 0.999, "int8": 0.98}[precision]
    # measured 1.8e-4, 3.7e-3, 2.0e-3: the formats' rounding shows, fp16 being the finest
    assert 0 < errors["fp16"] <= 1e-3 and errors["fp16"] < errors["bf16"] <= 2e-2 and 0 < errors["int8"] <= 2e-2


def test_linear_layer_numerics_are_the_cubes_exactly():
    torch.manual_seed(1)
    lin = nn.Linear(96, 48).eval()
    x = torch.randn(4, 96)
    # every tensor in GM is fp16: input, weight and bias
    x16, w, b = (numerics.round_to(t.detach(), "fp16") for t in (x, lin.weight, lin.bias))
    fp16 = optimize(lin, x, chip="Ascend910B1", level=1, precision="fp16")(x)
    # fp16 products accumulated in fp32, the bias added in fp32, the result stored as fp16
    assert torch.equal(fp16, numerics.round_to(numerics.matmul(x16, w.t(), dtype="fp16", bias=b), "fp16"))
    int8 = optimize(lin, x, chip="Ascend910B1", level=1, precision="int8")(x)
    sx = numerics.symmetric_scale(x16)               # activation: one scale per tensor
    sw = numerics.symmetric_scale(w, dim=1)          # weights: one scale per output channel
    acc = numerics.matmul_int8(numerics.quantize(x16, sx), numerics.quantize(w, sw).t())
    expected = numerics.round_to(acc.to(torch.float32) * (sx * sw.t()) + b, "fp16")
    assert torch.equal(int8, expected)
    assert not torch.equal(int8, fp16)


def test_fp32_on_910a_runs_in_fp16_as_the_report_says(cnn):
    model, x = cnn
    om = optimize(model, x, chip="Ascend910A", level=1, precision="fp32")
    assert any("allow_fp32_to_fp16" in n for n in om.report().notes)
    assert torch.equal(om(x), optimize(model, x, chip="Ascend910A", level=1, precision="fp16")(x))
    assert _scaled_error(om(x), model(x)) > 1e-5  # fp16 rounding shows


def test_resnet50_batch1_fp32_and_fp16():
    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    x = torch.randn(1, 3, 224, 224)
    ref = model(x)
    fp32 = optimize(model, x, chip="Ascend910B1", level=1, precision="fp32")(x)
    assert _scaled_error(fp32, ref) <= 1e-5            # measured 2.7e-7
    fp16 = optimize(model, x, chip="Ascend910B1", level=1, precision="fp16")(x)
    r = compare_tensors(fp16, ref, verbose=False)
    assert r.cosine_similarity >= 0.9999 and _scaled_error(fp16, ref) <= 1e-2   # measured 0.9999998, 6.6e-4


def test_bert_fp16_uses_flash_attentions_online_softmax():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=2)).eval()
    ids = torch.randint(0, 30000, (1, 32))
    ref = model(ids)
    om = optimize(model, (ids,), chip="Ascend910B1", level=1, precision="fp16")
    out = om(ids)
    assert type(out) is type(ref) and out.last_hidden_state.shape == (1, 32, 768)
    stats = om.runtime.last_stats
    assert stats.flash_attention == 2 and stats.unfused_attention == 0
    r = compare_tensors(out.last_hidden_state, ref.last_hidden_state, verbose=False)
    assert r.cosine_similarity >= 0.9999 and r.max_abs_error <= 0.05      # measured 0.9999997, 0.0065
    # the blocks the report costs drive the arithmetic: 8 keys per block -> 4 online-softmax steps
    for node in om.graph.nodes:
        if isinstance(node.kernel, AttentionKernel) and node.kernel.flash:
            node.kernel = replace(node.kernel, block_q=32, block_k=8)
    blocked = om(ids)
    assert om.runtime.last_stats.flash_key_blocks == [4, 4]
    assert not torch.equal(blocked.last_hidden_state, out.last_hidden_state)
    r = compare_tensors(blocked.last_hidden_state, ref.last_hidden_state, verbose=False)
    assert r.cosine_similarity >= 0.9999 and r.max_abs_error <= 0.05
    other = torch.randint(0, 30000, (1, 32))
    assert compare_tensors(om(other).pooler_output, model(other).pooler_output, verbose=False).cosine_similarity >= 0.999


def test_online_softmax_over_key_blocks_equals_softmax():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 20, 16) for _ in range(3))
    mask = torch.ones(20, 24, dtype=torch.bool)
    mask[:, 8:16] = False          # a whole key block masked
    mask[3] = False
    mask[3, 20] = True             # row 3 sees one key, in the last block only
    k, v = torch.randn(2, 3, 24, 16), torch.randn(2, 3, 24, 16)
    add = torch.zeros(20, 24).masked_fill(~mask, -math.inf)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out, blocks = flash_attention(q, k, v, "fp32", 8, add.expand(2, 3, 20, 24))
    assert blocks == 3 and torch.allclose(out, ref, atol=1e-5)
    half, _ = flash_attention(q, k, v, "fp16", 8, add.expand(2, 3, 20, 24))
    assert 0 < (half - ref).abs().max() <= 1e-2
    with pytest.raises(ValueError, match="block_k 0"):
        flash_attention(q, k, v, "fp16", 0)


def test_inputs_of_another_shape_or_dtype_are_refused(cnn):
    model, x = cnn
    om = optimize(model, x, chip="Ascend910B1", level=1, precision="fp16")
    with pytest.raises(RuntimeInputError, match=r"expected shape \(1, 3, 16, 16\) float32, got shape "
                                                r"\(2, 3, 16, 16\) float32.*optimize\(model, new_example_inputs"):
        om(torch.randn(2, 3, 16, 16))
    with pytest.raises(RuntimeInputError, match="got shape .* float64"):
        om(x.double())
    with pytest.raises(RuntimeInputError, match="another structure"):
        om(x, x)


def test_each_call_reports_its_cpu_time_to_the_profiler(cnn, monkeypatch):
    model, x = cnn
    calls = []
    monkeypatch.setattr(sys.modules["pypto_lab.compiler.optimize"], "RUN_HOOKS",
                        [lambda om, inputs, cpu_us: calls.append((om, inputs, cpu_us))])
    om = optimize(model, x, chip="Ascend910B1", level=1, precision="fp16")
    om(x)
    assert len(calls) == 1 and calls[0][0] is om and calls[0][1][0] is x and calls[0][2] == om.last_cpu_us > 0


def test_compare_tensors_fields_on_hand_made_tensors(capsys):
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[1.0, 2.1], [3.0, 0.0]])
    r = compare_tensors(a, b, rtol=1e-3, atol=1e-5)
    assert r.max_abs_error == pytest.approx(4.0)
    assert r.max_rel_error == pytest.approx(0.1 / 2.1, rel=1e-6)   # elements with b == 0 left out
    assert r.mismatches == 2 and r.mismatch_fraction == 0.5 and not r.passed
    assert r.cosine_similarity == pytest.approx(14.2 / math.sqrt(30 * 14.41), rel=1e-6)
    assert r.worst_indices[:2] == [(1, 1), (0, 1)]
    assert "FAIL" in capsys.readouterr().out and "(1, 1)" not in str(r) and "[1, 1]: 4 vs 0" in str(r)
    ok = compare_tensors(a, a + 1e-4, rtol=0, atol=2e-4, verbose=False)
    assert ok.passed and ok.cosine_similarity == pytest.approx(1.0)
    inf = torch.tensor([math.inf, 1.0])
    assert compare_tensors(inf, inf.clone(), verbose=False).passed
    assert not compare_tensors(torch.tensor([math.nan]), torch.tensor([1.0]), verbose=False).passed


def test_compare_tensors_refuses_bad_tolerances_and_shapes():
    a = torch.zeros(2, 3)
    with pytest.raises(CompareError, match="rtol must be a number: got '1e-3'"):
        compare_tensors(a, a, rtol="1e-3")
    with pytest.raises(CompareError, match=r"atol must be >= 0: got -1\.0"):
        compare_tensors(a, a, atol=-1)
    with pytest.raises(CompareError, match=r"shapes differ: a has shape \(2, 3\), b has shape \(3, 2\)"):
        compare_tensors(a, torch.zeros(3, 2))
    with pytest.raises(CompareError, match="pick one tensor"):
        compare_tensors((a,), (a,))


def test_compare_layers_names_the_broken_layer(cnn):
    model, x = cnn
    om = optimize(model, x, chip="Ascend910B1", level=1, precision="fp16")
    healthy = compare_layers(model, om, x)
    assert healthy.first_failure() is None and healthy.first_failure(local=False) is None
    assert [c.layer for c in healthy][:2] == ["conv1 conv2d", "(model) relu"]
    conv1 = healthy[0]
    assert conv1.reference_node == "batch_norm"      # the folded conv is compared with its BN's output
    broken = next(c.name for c in healthy if c.module == "conv2")

    def corrupt(name, value):                         # one layer's numerics broken in the optimised run only
        return value * 1.05 if name == broken else None

    results = compare_layers(model, om, x, hook=corrupt)
    first = results.first_failure()
    assert first is not None and first.name == broken and first.module == "conv2"
    later = [c for c in results if c.index > first.index]
    assert all(c.passed() for c in later)              # on its own, every later layer is fine
    assert not later[0].passed(local=False)            # but the error reached it
    assert "first layer failing on its own: conv2 conv2d" in results.table()
    with pytest.raises(CompareError, match="not the module"):
        compare_layers(SmallCNN(), om, x)


@pytest.mark.parametrize("precision, rel_bound, cosine_floor", [("fp32", 1e-5, 0.999999), ("fp16", 1e-2, 0.9999),
                                                                  ("int8", 0.1, 0.999)])
def test_bert_base_outputs_match_the_model_within_stated_bounds(precision, rel_bound, cosine_floor):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()
    ids = torch.randint(0, 30522, (1, 16))
    om = pypto_lab.optimize(model, (ids,), chip="Ascend910B1", level=3, precision=precision)
    other = torch.randint(0, 30522, (1, 16))                   # other values of the same shape
    with torch.no_grad():
        ref = model(other).last_hidden_state
    out = om(other).last_hidden_state
    err = float((out - ref).abs().max() / ref.abs().max())
    cmp = pypto_lab.compare_tensors(out, ref, verbose=False)
    # measured (Ascend910B1, level 3, seq 16): fp32 7e-7, fp16 1.4e-3, int8 3e-2 relative to max |ref|
    assert err <= rel_bound and cmp.cosine_similarity >= cosine_floor
