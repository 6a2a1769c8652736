"""pypto_lab.nn.FusedBERTLayer: BertLayer's math, and what optimize fuses in it."""

import pytest
import torch
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertLayer

import pypto_lab
from pypto_lab.models.nn import FusedBERTLayer


def _bert(hidden=64, heads=4, inter=128):
    torch.manual_seed(0)
    return BertLayer(BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=inter)).eval()


def _out(layer, *args):
    out = layer(*args)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("npu_optimized", [True, False])
def test_equals_bert_layer(npu_optimized):
    bert = _bert()
    fused = FusedBERTLayer(64, 4, 128, npu_optimized=npu_optimized).load_from_bert_layer(bert).eval()
    x = torch.randn(2, 16, 64)
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, ..., 11:] = torch.finfo(torch.float32).min
    with torch.no_grad():
        assert torch.allclose(fused(x), _out(bert, x), atol=1e-5, rtol=0)
        assert torch.allclose(fused(x, mask), _out(bert, x, mask), atol=1e-5, rtol=0)
        padding = torch.ones(2, 16)
        padding[1, 11:] = 0
        assert torch.allclose(fused(x, padding), fused(x, mask), atol=1e-5, rtol=0)


def test_from_bert_layer_takes_config():
    bert = _bert(32, 2, 64)
    fused = FusedBERTLayer.from_bert_layer(bert).eval()
    assert (fused.hidden_size, fused.num_attention_heads, fused.intermediate_size) == (32, 2, 64)
    x = torch.randn(1, 8, 32)
    with torch.no_grad():
        assert torch.allclose(fused(x), _out(bert, x), atol=1e-5, rtol=0)


def test_optimize_fuses_attention_layernorm_and_gelu():
    layer = FusedBERTLayer(64, 4, 128).eval()
    report = pypto_lab.optimize(layer, torch.randn(2, 16, 64), chip="Ascend910B1", level=1).report()
    ops = [[t.split(".")[1] for t in k.fused_ops] for k in report.kernels]
    assert sum("scaled_dot_product_attention" in o for o in ops) == 1
    flash = next(k for k in report.kernels if "scaled_dot_product_attention" in k.fused_ops[0])
    assert flash.name.startswith("FlashAttentionScore") and len(flash.fused_ops) == 1
    norms = [o for o in ops if "layer_norm" in o]
    assert len(norms) == 2 and all(o == ["add", "layer_norm"] for o in norms)
    assert ["linear", "gelu"] in ops
    assert not report.fallback_ops
    assert len(report.kernels) == 9  # q, k, v, attention, out dense, add+LN, dense+GELU, dense, add+LN


def test_unoptimized_form_has_no_fused_attention():
    layer = FusedBERTLayer(64, 4, 128, npu_optimized=False).eval()
    report = pypto_lab.optimize(layer, torch.randn(2, 16, 64), chip="Ascend910B1", level=1).report()
    assert not any("scaled_dot_product_attention" in t for k in report.kernels for t in k.fused_ops)


@pytest.mark.parametrize("kwargs, match", [
    ({"hidden_size": 100, "num_attention_heads": 12}, "not a multiple of num_attention_heads"),
    ({"hidden_act": "swiglu"}, "hidden_act = 'swiglu' is not known"),
    ({"intermediate_size": 0}, "intermediate_size = 0"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FusedBERTLayer(**kwargs)


def test_bad_input_and_weights():
    layer = FusedBERTLayer(64, 4, 128)
    with pytest.raises(ValueError, match=r"\(batch, seq, 64\)"):
        layer(torch.randn(2, 16, 32))
    with pytest.raises(ValueError, match="build FusedBERTLayer with the BERT config"):
        layer.load_from_bert_layer(_bert(32, 2, 64))
    with pytest.raises(ValueError, match="pass a transformers BertLayer"):
        layer.load_from_bert_layer(torch.nn.Linear(2, 2))
