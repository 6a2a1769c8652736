"""A graph cut at each attention layer (vLLM's PIECEWISE cudagraph mode, `Stack.layer_host_us`): the
host spends its time per layer outside the graph while the device runs the layers it was given, so
a host slower than the device per layer bounds the step, and a faster one changes nothing."""

from __future__ import annotations

import pytest

from pypto_lab.llm import step_model
from pypto_lab.stack import Launch, StackConfigError, get_stack, load_stack, run_in_order

LAYERS = 10


def _layers(per_layer_us: float) -> list[Launch]:
    # embedding, then per layer: a matmul, the attention (the graph break), a matmul; then the LM head
    return [Launch(5.0), Launch(per_layer_us / 4, LAYERS), Launch(per_layer_us / 2, LAYERS, graph_break=True),
            Launch(per_layer_us / 4, LAYERS), Launch(20.0)]


def _graph(layer_host_us: float):
    return get_stack("vllm-ascend-aclgraph").with_values(layer_host_us=layer_host_us, launch_us=0.0, step_host_us=0.0)


def test_a_host_slower_than_a_layer_bounds_the_step():
    h = 500.0
    tl = run_in_order(_layers(100.0), _graph(h))
    # the host's h per layer, the last layer's device time and the kernels outside the layers
    assert tl.step_us == pytest.approx(LAYERS * h + 100.0 + 25.0)
    assert tl.host_us == pytest.approx(LAYERS * h)
    assert tl.host_bound


def test_a_host_faster_than_a_layer_changes_nothing():
    without = run_in_order(_layers(400.0), _graph(0.0))
    with_host = run_in_order(_layers(400.0), _graph(100.0))
    assert with_host.step_us == pytest.approx(without.step_us) == pytest.approx(LAYERS * 400.0 + 25.0)


def test_no_graph_break_no_charge():
    kernels = [Launch(k.device_us, k.count) for k in _layers(100.0)]
    assert run_in_order(kernels, _graph(500.0)).step_us == pytest.approx(LAYERS * 100.0 + 25.0)


def test_an_llm_decode_step_pays_it_once_per_attention_layer():
    stack = get_stack("vllm-ascend-aclgraph")
    fast, slow = (step_model("qwen2-0.5b", "Ascend910B1", stack=stack.with_values(layer_host_us=h)) for h in (0.0, 5000.0))
    layers = fast.spec.layers
    t_fast, t_slow = fast.step_ms([], [300] * 4), slow.step_ms([], [300] * 4)
    assert t_fast < layers * 5.0
    # host-bound: layers x 5 ms, plus one layer's device time and the LM head at most
    assert layers * 5.0 < t_slow < layers * 5.0 + t_fast


# the calls AscendAttentionBackendImpl.forward dispatches to the NPU in a decode-only step
# (vllm_ascend/attention/attention_v1.py@a5f33590, 2025-07-03, bf16 cache, not 310P)
DECODE_ATTENTION_CALLS = ("value.contiguous()", "torch_npu._npu_reshape_and_cache", "torch_npu._npu_paged_attention",
                          "ori_output[:, :, :] = output[:num_tokens]")


def test_the_default_piecewise_host_time_is_derived_from_the_mechanism():
    # one piece replay (PR #15471's replay host time) + the eager attention's calls at torch_npu eager's dispatch
    stack = get_stack("vllm-ascend-aclgraph")
    replay = stack.step_host_us
    assert "15471" in stack.sources["stack.step_host_us"] and replay == 100.0
    expected = replay + len(DECODE_ATTENTION_CALLS) * get_stack("torch_npu-eager").dispatch_us
    assert stack.layer_host_us == pytest.approx(expected) == pytest.approx(167.2)
    src = stack.sources["stack.layer_host_us"]
    assert "a5f33590" in src and "15471" in src and all(c in src for c in DECODE_ATTENTION_CALLS)
    assert "9404" not in src   # no release's measurement in the default


def test_the_v0_18_preset_carries_its_measured_layer():
    v18, default = get_stack("vllm-ascend-aclgraph-0.18"), get_stack("vllm-ascend-aclgraph")
    assert v18.layer_host_us == 832.0 and "9404" in v18.sources["stack.layer_host_us"]
    # the same stack otherwise
    assert v18.with_values(layer_host_us=default.layer_host_us, name="x").fingerprint == default.fingerprint
    assert get_stack("torchair-graph").layer_host_us == 0.0


def test_an_eager_stack_has_no_graph_to_cut(tmp_path):
    with pytest.raises(StackConfigError, match="layer_host_us.*graph"):
        get_stack("vllm-ascend-eager").with_values(layer_host_us=100.0)
    text = (get_stack("vllm-ascend-eager").path and open(get_stack("vllm-ascend-eager").path).read())
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("[stack]\n", "[stack]\nlayer_host_us = 100.0\n"))
    with pytest.raises(StackConfigError, match=r"layer_host_us' = 100\.0.*fix: set layer_host_us = 0"):
        load_stack(bad)


def test_kernels_in_program_order_pay_it_before_each_attention():
    # optimize's order: per layer a matmul then the attention (graph break), each run once
    kernels = [Launch(100.0), *[k for _ in range(LAYERS) for k in (Launch(50.0), Launch(50.0, graph_break=True))]]
    tl = run_in_order(kernels, _graph(500.0))
    assert tl.step_us == pytest.approx(LAYERS * 500.0 + 50.0)   # host-bound: the last attention after the host
    assert tl.host_us == pytest.approx(LAYERS * 500.0)
    assert run_in_order(kernels, _graph(20.0)).step_us == pytest.approx(100.0 + LAYERS * 100.0)


def test_optimize_on_the_piecewise_stack_runs_the_attention_from_the_host():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import pypto_lab
    from pypto_lab.kernels.ir import AttentionKernel

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=500, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.zeros(1, 32, dtype=torch.long)
    stack = get_stack("vllm-ascend-aclgraph")
    reps = [pypto_lab.optimize(model, ids, chip="Ascend910B1", level=1, stack=stack.with_values(layer_host_us=h)).report()
            for h in (0.0, 20000.0)]
    attn = sum(isinstance(k.spec, AttentionKernel) for k in reps[0].kernels)
    assert attn == cfg.num_hidden_layers
    assert reps[1].latency_us > attn * 20000.0 > reps[0].latency_us
