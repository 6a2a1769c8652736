"""One gate for model descriptions (`pypto_lab.llm.validation`): every way a model reaches the LLM
engine, serving and training is checked by the same rules, each error naming the field as the
user wrote it, the value, the rule and a fix; requests beyond the model's positions are refused
the same way by `simulate_generation` and by serving; the command line gives fixes in its own
syntax. Issue 30's table, rows 1-5 and 7-8, 12."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from torch import nn

from pypto_lab.cli import main
from pypto_lab.llm import KNOWN_MODELS, LLMConfigError, serve, simulate_generation, spec_of
from pypto_lab.llm.linear_step import LinearStepModel
from pypto_lab.llm.serving import ServingConfigError, simulate_serving
from pypto_lab.llm.validation import ContextLengthError, FieldError, check_config

LLAMA = {k: v for k, v in KNOWN_MODELS["llama-2-7b"].items() if not k.startswith("_")}
SMALL = {**LLAMA, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 8, "vocab_size": 1000}


def _every_way(cfg: dict, tmp_path):
    """The same config as a dict, a config.json, a transformers config and a module's .config."""
    from transformers import AutoConfig

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    hf = AutoConfig.for_model(cfg["model_type"], **fields)
    module = nn.Module()
    module.config = hf
    return {"dict": cfg, "config.json": path, "folder": tmp_path, "transformers config": hf, "module": module}


@pytest.mark.parametrize("key, value, rule", [
    ("num_attention_heads", 30, r"num_attention_heads = 30: attention heads must divide hidden_size = 4096"),
    ("num_hidden_layers", -2, r"num_hidden_layers = -2: the number of decoder layers must be an integer >= 1"),
    ("hidden_size", 0, r"hidden_size = 0: the hidden size .* must be an integer >= 1"),
    ("vocab_size", 0, r"vocab_size = 0: the vocabulary .* must be an integer >= 1"),
    ("num_key_value_heads", 5, r"num_key_value_heads = 5: key/value heads must divide num_attention_heads = 32"),
    ("max_position_embeddings", 0, r"max_position_embeddings = 0: the positions .* must be an integer >= 1"),
    ("num_hidden_layers", 32.5, r"num_hidden_layers = 32.5: .* must be an integer"),
    ("num_hidden_layers", "32", r"num_hidden_layers = '32': .* must be an integer"),
    ("num_attention_heads", True, r"num_attention_heads = True: .*true/false is not a count"),
])
def test_a_bad_config_key_is_named_with_its_value_rule_and_fix(key, value, rule):
    with pytest.raises(LLMConfigError, match=rule) as e:
        simulate_generation({**LLAMA, key: value}, batch=1, prompt_len=16, output_len=4)
    assert e.value.field == key and e.value.value == value and "Fix: " in str(e.value)


def test_heads_that_do_not_divide_the_hidden_size_are_refused_not_floored(tmp_path):
    """Row 1: 30 heads on 4096 was costed with head_dim 136. (transformers' own config classes
    refuse it at construction, so it comes as a dict or a config.json.)"""
    cfg = {**SMALL, "num_attention_heads": 10}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    for model in (cfg, path, tmp_path):
        with pytest.raises(LLMConfigError, match=r"num_attention_heads = 10: attention heads must divide "
                                                 r"hidden_size = 256 .*Fix: num_attention_heads=8") as e:
            spec_of(model)
        assert e.value.field == "num_attention_heads"
    with pytest.raises(LLMConfigError, match=r"n_head = 10: attention heads must divide n_embd = 768.*n_head=12"):
        simulate_generation({**KNOWN_MODELS["gpt2"], "n_head": 10}, batch=1, prompt_len=16, output_len=4)


def test_every_way_a_model_comes_passes_the_same_gate(tmp_path):
    """KV heads that do not divide the heads: transformers builds the config; the gate refuses it
    as a dict, a config.json, its folder, a transformers config and a module's .config alike."""
    for way, model in _every_way({**SMALL, "num_key_value_heads": 3}, tmp_path).items():
        with pytest.raises(LLMConfigError, match=r"num_key_value_heads = 3: key/value heads must divide "
                                                 r"num_attention_heads = 8.*Fix: num_key_value_heads=") as e:
            spec_of(model)
        assert e.value.field == "num_key_value_heads", way


def test_an_explicit_head_dim_is_an_architecture_not_an_error():
    qwen3 = spec_of("qwen3-0.6b")   # 16 heads x 128 = 2048 on a hidden size of 1024, as published
    assert (qwen3.heads, qwen3.head_dim, qwen3.hidden) == (16, 128, 1024)


def test_negative_layers_are_refused_every_way(tmp_path):
    """Row 2: -2 layers gave a negative TTFT and negative weights."""
    for way, model in _every_way({**SMALL, "num_hidden_layers": -2}, tmp_path).items():
        if way in ("transformers config", "module"):
            continue   # transformers itself accepts -2: checked below through its to_dict()
        with pytest.raises(LLMConfigError, match="num_hidden_layers = -2"):
            spec_of(model)
    with pytest.raises(LLMConfigError, match="LLMSpec.layers = -2: must be an integer >= 1"):
        spec_of(replace(spec_of("llama-2-7b"), layers=-2))


def test_zero_hidden_size_or_vocabulary_names_the_config_key():
    """Row 4: a raw 'row_len = 0' / 'matmul n = 0' error before; now the key."""
    for key in ("hidden_size", "vocab_size", "intermediate_size"):
        with pytest.raises(LLMConfigError, match=rf"{key} = 0") as e:
            spec_of({**SMALL, key: 0})
        assert e.value.field == key


@pytest.mark.parametrize("patch, field", [
    ({"num_experts_per_tok": 65}, "num_experts_per_tok"), ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
    ({"topk_group": 1, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"n_group": 7}, "n_group"), ({"topk_group": 9}, "topk_group"), ({"first_k_dense_replace": 99}, "first_k_dense_replace"),
])
def test_experts_top_k_and_groups_are_checked_against_each_other(patch, field):
    cfg = {k: v for k, v in KNOWN_MODELS["deepseek-v3"].items() if not k.startswith("_")}
    cfg = {**cfg, "n_routed_experts": 64, **patch}
    with pytest.raises(LLMConfigError) as e:
        spec_of(cfg)
    assert e.value.field == field and "Fix: " in str(e.value)


def test_a_missing_key_is_named():
    cfg = {k: v for k, v in SMALL.items() if k != "intermediate_size"}
    with pytest.raises(LLMConfigError, match=r"no 'intermediate_size' key, which a llama model needs"):
        spec_of(cfg)


def test_a_config_json_that_is_not_utf8_json_is_one_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe{\x00}")
    with pytest.raises(LLMConfigError, match="not UTF-8 text"):
        spec_of(path)
    path.write_text("[1, 2]")
    with pytest.raises(LLMConfigError, match="holds a JSON list, not an object"):
        spec_of(path)


def test_an_llm_spec_built_by_hand_passes_the_same_rules():
    base = spec_of("qwen3-30b-a3b")
    for field, value in (("kv_heads", 3), ("top_k", 129), ("hidden", 0), ("mlp", "relu"), ("rotary_fraction", 1.5),
                         ("qkv_bias", "yes"), ("dense_layers", 49)):
        with pytest.raises(LLMConfigError, match=rf"LLMSpec\.{field} = ") as e:
            spec_of(replace(base, **{field: value}))
        assert e.value.field == f"LLMSpec.{field}"


def test_known_models_pass_the_gate():
    for name in KNOWN_MODELS:
        check_config(KNOWN_MODELS[name], where=name)
        assert spec_of(name).layers > 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(batch=True), "batch"), (dict(batch=0), "batch"), (dict(prompt_len=2.0), "prompt_len"),
    (dict(output_len=-1), "output_len"), (dict(cards=True), "cards"), (dict(launch_us=float("nan")), "launch_us"),
    (dict(hbm_utilization=0), "hbm_utilization"), (dict(hbm_utilization=1.5), "hbm_utilization"),
])
def test_engine_arguments_are_counts_not_bools_or_floats(kwargs, field):
    """Row 3: batch=True was accepted and reported as batch True."""
    with pytest.raises(LLMConfigError) as e:
        simulate_generation("gpt2", **(dict(batch=1, prompt_len=16, output_len=4) | kwargs))
    assert e.value.field == field and f"{field} = " in str(e.value) and "Fix: " in str(e.value)


def test_a_request_beyond_the_positions_is_refused_the_same_way_by_generation_and_serving(tmp_path):
    """Row 5: an 8,000-token prompt on a 4,096-position model was served while simulate_generation
    refused it; a 10^6-token prompt got a KV-pool hint of 90,880 tokens."""
    rule = r"llama-2-7b handles at most 4,096 positions \(its max_position_embeddings\)"
    with pytest.raises(ContextLengthError, match=rule):
        simulate_generation("llama-2-7b", batch=1, prompt_len=8000, output_len=100)
    trace = tmp_path / "trace.csv"
    for prompt in (8000, 1_000_000):
        trace.write_text(f"prompt_tokens,output_tokens\n100,10\n{prompt},100\n")
        with pytest.raises(ContextLengthError, match=rule) as e:
            serve("llama-2-7b", requests=10, lengths=trace, progress=False)
        assert "line 3" in str(e.value) and "90880" not in str(e.value) and "1 of 2 requests" in str(e.value)


def test_sampled_lengths_beyond_the_positions_are_drawn_again():
    """gpt2 holds 1,024 positions; the ShareGPT-like lengths reach 4,096 + 4,096: the draws that do
    not fit are drawn again (the distribution truncated at the positions), and the report says so."""
    sm = LinearStepModel()
    object.__setattr__(sm, "name", "tiny")
    class Tiny(LinearStepModel):
        max_positions = 256
    rep = simulate_serving(Tiny(), requests=300, rate=float("inf"), progress=False)
    assert max(r.prompt_tokens + r.output_tokens for r in rep.records) <= 256
    assert "drawn again" in rep.parameters["lengths"]
    plain = simulate_serving(LinearStepModel(), requests=300, rate=float("inf"), progress=False)
    assert max(r.prompt_tokens + r.output_tokens for r in plain.records) > 256   # the same draw, untruncated


def test_the_cli_words_argument_fixes_as_flags(capsys):
    """Row 12: llm --batch 0 and serve --rate 0 gave Python fixes (batch=1, rate=float('inf'))."""
    assert main(["llm", "gpt2", "--batch", "0"]) == 2
    err = capsys.readouterr().err
    assert "--batch 0: sequences in the batch must be an integer >= 1; e.g. --batch 1" in err and "batch=" not in err
    assert main(["serve", "gpt2", "--rate", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--rate 0: requests per second must be a number > 0; e.g. --rate 10 or --rate inf" in err
    assert "float(" not in err and "rate=" not in err
    assert main(["llm", "gpt2", "--cards", "2", "--tp", "3"]) == 2
    assert "Fix: --tp 1 or --tp 2" in capsys.readouterr().err


def test_the_python_api_words_the_same_fixes_as_arguments():
    with pytest.raises(ServingConfigError, match=r"rate=float\('inf'\)"):
        simulate_serving(LinearStepModel(), rate=0)
    with pytest.raises(FieldError, match=r"Fix: batch=1"):
        simulate_generation("gpt2", batch=0)


def test_training_checks_a_transformers_config_with_the_same_gate():
    from transformers import LlamaConfig

    from pypto_lab.train import simulate_step

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=3, vocab_size=1000)
    ids = torch.randint(0, 1000, (2, 16))
    with pytest.raises(LLMConfigError, match="num_key_value_heads = 3: key/value heads must divide"):
        simulate_step(cfg, {"input_ids": ids, "labels": ids})


def test_the_hf_builder_checks_the_same_gate():
    from pypto_lab.llm.hf import build_causal_lm

    with pytest.raises(LLMConfigError, match="num_key_value_heads = 3"):
        build_causal_lm({**SMALL, "num_key_value_heads": 3})


def test_a_training_batch_of_zero_is_refused():
    """Row 7: a batch of 0 gave a report with batch 0 and non-zero times."""
    from pypto_lab.train import simulate_step
    from pypto_lab.train.step import TrainConfigError

    mlp = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    with pytest.raises(TrainConfigError, match=r"example_batch\[0\] has shape \(0, 64\): a batch needs at least one "
                                               r"sample.*Fix"):
        simulate_step(mlp, (torch.randn(0, 64), torch.randint(0, 10, (0,))), nn.functional.cross_entropy)
    with pytest.raises(TrainConfigError, match="grad_accum = True"):
        simulate_step(mlp, (torch.randn(4, 64), torch.randint(0, 10, (4,))), nn.functional.cross_entropy,
                      grad_accum=True)


def test_the_wrong_input_width_is_one_message_naming_the_layer(capfd):
    """Row 8: a clear message, but after ~20 lines of torch's fake-tensor log."""
    from pypto_lab.train import simulate_step
    from pypto_lab.train.capture import TrainCaptureError

    mlp = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    capfd.readouterr()
    with pytest.raises(TrainCaptureError, match=r"the model cannot take this batch.*inside module '0' \(Linear, "
                                                r"which expects in_features = 64\), called with inputs of shape "
                                                r"\(8, 32\)"):
        simulate_step(mlp, (torch.randn(8, 32), torch.randint(0, 10, (8,))), nn.functional.cross_entropy)
    logged = capfd.readouterr()
    assert "fake_tensor" not in logged.err and "Traceback" not in logged.err
