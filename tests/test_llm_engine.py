"""The LLM cost engine: configs, prefill/decode costs, HBM capacity, precisions, MoE, step model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pypto_lab.hw.chip import get_chip
from pypto_lab.hw.kernels import simulate_matmul
from pypto_lab.kernels import grid
from pypto_lab.kernels.cost import cost
from pypto_lab.kernels.ir import AttentionKernel, CubeKernel, VectorKernel
from pypto_lab.llm import HBMCapacityError, LLMConfigError, simulate_generation, spec_of, step_model
from pypto_lab.llm.forward import Hardware, expected_expert_load, forward_kernels, step_time_us
from pypto_lab.llm.step_model import StepModel


def _matmul(chip, m, k, n, batch=1):
    """The grid strategy's cost of an fp16 matmul (what the LLM engine uses)."""
    return cost(CubeKernel("MatMulV2", batch, m, k, n, "fp16", "fp16"), chip, "grid")


@pytest.mark.parametrize("name, billions", [("llama-2-7b", 6.74), ("llama-3-8b", 8.03), ("llama-2-70b", 68.98),
                                            ("qwen3-30b-a3b", 30.53), ("mixtral-8x7b", 46.70), ("gpt2", 0.124),
                                            ("deepseek-v3", 671.0), ("qwen2.5-7b", 7.61), ("qwen3-32b", 32.8),
                                            ("qwen3-235b-a22b", 235.0)])
def test_known_models_have_their_published_parameter_counts(name, billions):
    assert spec_of(name).weight_params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_a_config_json_path_a_transformers_config_and_a_dict_give_the_same_spec(tmp_path):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=1000)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    a, b, c = spec_of(cfg), spec_of(tmp_path / "config.json"), spec_of(cfg.to_dict())
    for s in (a, b, c):
        assert (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate) == (256, 2, 8, 2, 32, 512)


def test_an_unknown_model_names_the_known_ones():
    with pytest.raises(LLMConfigError, match="llama-2-7b"):
        spec_of("llama-9-1b")
    with pytest.raises(LLMConfigError, match="kv_lora_rank"):
        spec_of({"model_type": "deepseek_v3", "hidden_size": 7168})


def test_generation_report_has_what_an_llm_user_asks_for():
    r = simulate_generation("llama-2-7b", batch=4, prompt_len=256, output_len=64)
    d = r.to_dict()
    for key in ("ttft_ms", "tpot_ms", "decode_tokens_per_s", "weights_bytes", "kv_cache_bytes", "peak_hbm_bytes",
                "prefill_kernels", "decode_kernels", "comm_ms", "roofline", "step_vs_context"):
        assert key in d
    assert d["weights_bytes"] == pytest.approx(2 * 6.74e9, rel=0.01)
    assert d["kv_cache_bytes"] == 4 * 320 * 2 * 32 * 32 * 128 * 2
    assert d["decode_tokens_per_s"] == pytest.approx(4 * 1000 / d["tpot_ms"])
    names = {k["name"] for k in d["decode_kernels"]}
    assert {"IncreFlashAttention", "MatMul_qkv", "AddRmsNorm", "RotaryPositionEmbedding", "SwiGlu",
            "ScatterUpdate_kv_cache"} <= names
    assert "PromptFlashAttention" in {k["name"] for k in d["prefill_kernels"]}
    assert d["roofline"]["bound"] == "memory"   # decode at batch 4 reads every weight for 4 tokens
    assert d["comm_ms"] == 0


def test_a_decode_step_grows_with_context_and_batching_raises_throughput():
    r = simulate_generation("llama-3-8b", batch=8, prompt_len=512, output_len=2048)
    steps = [t for _, t in r.step_vs_context]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    small = simulate_generation("llama-3-8b", batch=1, prompt_len=512, output_len=128)
    big = simulate_generation("llama-3-8b", batch=32, prompt_len=512, output_len=128)
    assert big.tpot_ms > small.tpot_ms                                # more KV to read per step
    assert big.decode_tokens_per_s > 10 * small.decode_tokens_per_s    # but the weights are read once for 32


def test_a_model_that_does_not_fit_names_the_cards_it_needs():
    with pytest.raises(HBMCapacityError, match=r"cards=4") as e:
        simulate_generation("llama-2-70b", batch=1, prompt_len=128, output_len=128)
    assert isinstance(e.value, MemoryError) and "weights" in str(e.value)


def test_a_batch_that_does_not_fit_names_the_largest_that_does():
    with pytest.raises(HBMCapacityError, match=r"largest batch that fits is (\d+)") as e:
        simulate_generation("llama-2-7b", batch=512, prompt_len=2048, output_len=2048)
    best = int(__import__("re").search(r"largest batch that fits is (\d+)", str(e.value)).group(1))
    simulate_generation("llama-2-7b", batch=best, prompt_len=2048, output_len=2048)   # and that one does


def test_int8_kv_and_int8_weights_shrink_what_decode_reads():
    base = simulate_generation("llama-2-7b", batch=16, prompt_len=1024, output_len=128)
    kv8 = simulate_generation("llama-2-7b", batch=16, prompt_len=1024, output_len=128, kv_dtype="int8")
    w8 = simulate_generation("llama-2-7b", batch=16, prompt_len=1024, output_len=128, precision="w8a16")
    assert kv8.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    assert kv8.tpot_ms < base.tpot_ms
    assert w8.hbm.weights_bytes * 2 == pytest.approx(base.hbm.weights_bytes, rel=1e-6)
    assert w8.tpot_ms < base.tpot_ms


def test_gqa_reads_the_kv_cache_once_per_kv_head():
    spec = spec_of("llama-3-8b")
    hw = Hardware(get_chip("Ascend910B1"))
    gqa = {k.name: k for k in forward_kernels(spec, hw, decode=[4096] * 8)}
    mha = {k.name: k for k in forward_kernels(replace(spec, kv_heads=32), hw, decode=[4096] * 8)}
    ratio = mha["IncreFlashAttention"].time_us / gqa["IncreFlashAttention"].time_us
    assert 3 < ratio < 5   # 4x the KV heads, 4x the bytes of a memory-bound kernel


def test_moe_decode_reads_only_the_experts_its_tokens_chose():
    a1, _ = expected_expert_load(1, 8, 128)
    a64, _ = expected_expert_load(64, 8, 128)
    assert a1 == 8 and 8 < a64 < 128
    spec = spec_of("qwen3-30b-a3b")
    hw = Hardware(get_chip("Ascend910B1"))
    one = {k.name: k for k in forward_kernels(spec, hw, decode=[512])}
    many = {k.name: k for k in forward_kernels(spec, hw, decode=[512] * 64)}
    assert many["GroupedMatmul_down"].cost.hbm_bytes > 4 * one["GroupedMatmul_down"].cost.hbm_bytes


def test_interpolated_matmul_times_stay_close_to_a_direct_simulation():
    chip = get_chip("Ascend910B1")
    m = 1000   # between grid points
    lo, hi = grid.grid_points(m)
    assert lo < m < hi
    direct = simulate_matmul(m, 4096, 4096, "fp16", chip).time_us
    assert _matmul(chip, m, 4096, 4096).time_us == pytest.approx(direct, rel=0.08)


def test_the_step_model_is_a_serving_step_model():
    sm = step_model("llama-3-8b")
    assert isinstance(sm, StepModel)
    assert sm.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert 0 < sm.kv_budget_bytes < get_chip("Ascend910B1").hbm_bytes
    mixed = sm.step_ms([(512, 0)], [1000] * 16)
    assert mixed > sm.step_ms([], [1000] * 16) > 0
    spec, hw = spec_of("llama-3-8b"), Hardware(get_chip("Ascend910B1"))
    assert sm.step_ms([], [1008] * 16) == pytest.approx(
        step_time_us(forward_kernels(spec, hw, decode=[1008] * 16), hw.stack) / 1000)


@pytest.mark.parametrize("kwargs, rule", [
    (dict(batch=0), "batch"), (dict(precision="fp8"), "precision"), (dict(kv_dtype="fp4"), "kv_dtype"),
    (dict(prompt_len=4000, output_len=200), "positions"), (dict(cards=2, tp=3), "divisor"),
])
def test_bad_arguments_name_the_rule(kwargs, rule):
    args = dict(batch=1, prompt_len=128, output_len=16) | kwargs
    with pytest.raises(LLMConfigError, match=rule):
        simulate_generation("llama-2-7b", **args)


@pytest.mark.parametrize("bh, s_q, s_k", [(1024, 512, 512), (640, 1, 2048), (192, 1024, 1024)])
def test_attention_over_many_heads_scales_a_smaller_simulation_faithfully(bh, s_q, s_k):
    from pypto_lab.hw.attention import simulate_attention

    chip = get_chip("Ascend910B1")
    direct = simulate_attention(bh, s_q, s_k, 128, "fp16", chip).time_us
    assert grid.waves(AttentionKernel(bh, s_q, s_k, 128, "fp16", flash=True), chip).time_us == pytest.approx(
        direct, rel=0.10)


@pytest.mark.parametrize("m, k, n", [(65536, 2048, 2816), (50000, 1024, 4096), (100000, 2048, 64)])
def test_long_matmuls_are_linear_in_their_rows(m, k, n):
    chip = get_chip("Ascend910B1")
    direct = simulate_matmul(m, k, n, "fp16", chip).time_us
    assert _matmul(chip, m, k, n).time_us == pytest.approx(direct, rel=0.05)


@pytest.mark.parametrize("op, numel, row_len", [("add", 3 << 22, None), ("rmsnorm", 40000 * 2048, 2048)])
def test_long_vector_kernels_are_linear_in_their_length(op, numel, row_len):
    from pypto_lab.hw.kernels import simulate_vector

    chip = get_chip("Ascend910B1")
    direct = simulate_vector(op, numel, "fp16", chip, row_len=row_len).time_us
    spec = VectorKernel(op, (op,), numel, "fp16", "fp16", None, row_len)
    assert cost(spec, chip, "grid").time_us == pytest.approx(direct, rel=0.05)


def test_grouped_matmuls_interpolate_between_expert_counts():
    chip = get_chip("Ascend910B1")
    direct = simulate_matmul(32, 2048, 2816, "fp16", chip, batch=23).time_us
    assert _matmul(chip, 32, 2048, 2816, batch=23).time_us == pytest.approx(direct, rel=0.10)


def test_every_grid_point_is_its_own_neighbour():
    for per_octave, floor in ((4, 64), (2, 4), (2, 16)):
        for x in range(1, 5000):
            lo, hi = grid.grid_points(x, per_octave, floor)
            assert lo <= x <= hi
            if lo != hi:
                assert grid.grid_points(lo, per_octave, floor) == (lo, lo)
                assert grid.grid_points(hi, per_octave, floor) == (hi, hi)


def test_multi_head_latent_attention_caches_one_latent_and_absorbs_kv_b_in_decode():
    spec = spec_of("deepseek-v3")
    assert spec.is_mla and spec.moe_layers == 58
    r = simulate_generation(spec, batch=8, prompt_len=512, output_len=32, chip="Ascend910B3", cards=16,
                            precision="w8a8")
    # one latent (512) and one RoPE key (64) per token and layer, the same on every card
    assert r.kv_bytes_per_token == 61 * (512 + 64) * 2
    decode = {k.name for k in r.decode_kernels}
    assert {"BatchMatMul_q_absorb", "BatchMatMul_v_absorb", "IncreFlashAttention", "MatMul_kv_a"} <= decode
    assert "MatMul_kv_b" not in decode                                  # decode never expands the latent
    assert "MatMul_kv_b" in {k.name for k in r.prefill_kernels}        # prefill does
    assert r.hbm.weights_bytes < 0.07 * spec.weight_params()          # int8 over 16 cards
