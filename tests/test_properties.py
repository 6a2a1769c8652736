"""Properties, not examples: hypothesis draws model configs, batches, lengths, cards and chips (some
of them outside the rules on purpose) and checks what any user relies on. Each run either raises
a pypto_lab error that names what is wrong, or gives figures that are finite and positive and that
move the right way: more layers -> more time and more weights; a larger batch -> no less
throughput, until HBM runs out. For the LLM engine, serving, training steps and `optimize`.

Kept small (tiny widths, few layers, a handful of requests) so that the whole file runs in about a
minute on two cores; ``deadline=None`` because the first examples compile and memoise kernels."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from torch import nn

from pypto_lab.llm import HBMCapacityError, LLMConfigError, serve, simulate_generation
from pypto_lab.llm.validation import FieldError

CHIPS = ["Ascend910B1", "Ascend910B3", "Ascend910A"]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                derandomize=True)


def finite_positive(*values: float) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


@st.composite
def llama_configs(draw, valid_only: bool = False):
    """A small llama-family config; unless ``valid_only``, one key in five is out of its rule."""
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([64, 128]))
    cfg = {"model_type": "llama", "vocab_size": draw(st.sampled_from([256, 1000, 32000])),
           "hidden_size": heads * head_dim, "intermediate_size": draw(st.sampled_from([128, 512, 1024])),
           "num_hidden_layers": draw(st.integers(1, 4)), "num_attention_heads": heads,
           "num_key_value_heads": draw(st.sampled_from([d for d in (1, 2, 4, 8) if heads % d == 0])),
           "max_position_embeddings": draw(st.sampled_from([256, 4096])), "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "tie_word_embeddings": draw(st.booleans())}
    if draw(st.booleans()):   # a mixture of experts
        experts = draw(st.sampled_from([4, 8]))
        cfg.update(model_type="mixtral", num_local_experts=experts, num_experts_per_tok=draw(st.integers(1, 2)))
    if not valid_only and draw(st.integers(0, 4)) == 0:
        key = draw(st.sampled_from(["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads",
                                    "num_key_value_heads", "intermediate_size", "max_position_embeddings"]))
        cfg[key] = draw(st.sampled_from([0, -2, 3, 2.5, True, "8"]))
    return cfg


def _generate(cfg, **kw):
    return simulate_generation(cfg, **kw)


@settings(max_examples=200, **SETTINGS)
@given(cfg=llama_configs(), batch=st.integers(1, 48), prompt=st.sampled_from([16, 64, 128, 256]),
       output=st.integers(1, 24), chip=st.sampled_from(CHIPS), cards=st.sampled_from([1, 1, 2, 4]))
def test_the_llm_engine_names_what_is_wrong_or_gives_finite_positive_figures(cfg, batch, prompt, output, chip, cards):
    try:
        r = _generate(cfg, batch=batch, prompt_len=prompt, output_len=output, chip=chip, cards=cards)
    except LLMConfigError as e:
        event("refused: " + type(e).__name__)
        assert isinstance(e, FieldError) and ("Fix" in str(e)), str(e)
        bad = [k for k, v in cfg.items() if k in str(e)]
        assert bad or "tp = " in str(e) or "positions" in str(e), f"the error names nothing of the config: {e}"
        return
    except HBMCapacityError as e:
        event("refused: HBMCapacityError")
        assert "GiB" in str(e) and "Fix" in str(e)
        return
    event("costed")
    assert r.batch == batch and r.prompt_len == prompt and r.output_len == output
    assert finite_positive(r.ttft_ms, r.tpot_ms, r.e2e_ms, r.decode_tokens_per_s, r.output_tokens_per_s,
                           r.hbm.weights_bytes, r.hbm.kv_cache_bytes, r.kv_bytes_per_token, r.hbm.peak_bytes)
    assert r.hbm.peak_bytes <= r.hbm.capacity_bytes
    assert all(finite_positive(t) for _, t in r.step_vs_context)


@settings(max_examples=200, **SETTINGS)
@given(cfg=llama_configs(valid_only=True), more=st.integers(1, 3), batch=st.integers(1, 16),
       prompt=st.sampled_from([16, 64, 128]), output=st.integers(2, 16), chip=st.sampled_from(CHIPS))
def test_more_layers_cost_more_time_and_more_weights(cfg, more, batch, prompt, output, chip):
    kw = dict(batch=batch, prompt_len=prompt, output_len=output, chip=chip)
    try:
        a = _generate(cfg, **kw)
        b = _generate({**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + more}, **kw)
    except HBMCapacityError:
        event("HBM full")
        return
    assert b.hbm.weights_bytes > a.hbm.weights_bytes and b.kv_bytes_per_token > a.kv_bytes_per_token
    assert b.ttft_ms > a.ttft_ms and b.tpot_ms > a.tpot_ms


@settings(max_examples=200, **SETTINGS)
@given(cfg=llama_configs(valid_only=True), batch=st.integers(1, 32), factor=st.integers(2, 4),
       prompt=st.sampled_from([16, 64, 128]), output=st.integers(2, 16), chip=st.sampled_from(CHIPS))
def test_a_larger_batch_gives_no_less_throughput_until_hbm_runs_out(cfg, batch, factor, prompt, output, chip):
    kw = dict(prompt_len=prompt, output_len=output, chip=chip)
    try:
        small = _generate(cfg, batch=batch, **kw)
        big = _generate(cfg, batch=batch * factor, **kw)
    except HBMCapacityError:
        event("HBM full")
        return
    assert big.decode_tokens_per_s >= small.decode_tokens_per_s * (1 - 1e-9)
    assert big.output_tokens_per_s >= small.output_tokens_per_s * (1 - 1e-9)
    assert big.hbm.kv_cache_bytes > small.hbm.kv_cache_bytes


# ---- serving ----------------------------------------------------------------------------------------

@settings(max_examples=200, **SETTINGS)
@given(cfg=llama_configs(), requests=st.integers(1, 12), rate=st.sampled_from([2.0, 50.0, float("inf"), 0.0, -1.0]),
       scheduler=st.sampled_from(["continuous", "static"]), chip=st.sampled_from(CHIPS[:2]),
       block_size=st.sampled_from([16, 128, 0]), lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)),
                                                                  min_size=1, max_size=12),
       max_batched_tokens=st.sampled_from([256, 2048]))
def test_serving_names_what_is_wrong_or_serves_every_request(cfg, requests, rate, scheduler, chip, block_size, lengths,
                                                              max_batched_tokens):
    try:
        rep = serve(cfg, chip=chip, requests=requests, rate=rate, scheduler=scheduler, block_size=block_size,
                    lengths=lengths, max_batched_tokens=max_batched_tokens, progress=False)
    except FieldError as e:   # LLMConfigError, ContextLengthError, ServingConfigError
        event("refused: " + type(e).__name__)
        assert "Fix" in str(e)
        if e.field is not None:
            assert e.field in str(e)
        return
    except HBMCapacityError as e:
        event("refused: HBMCapacityError")
        assert "Fix" in str(e)
        return
    event("served")
    n = min(requests, len(lengths))
    assert rep.requests == n and len(rep.records) == n
    assert all(r.generated_tokens == r.output_tokens for r in rep.records)   # every request served whole
    assert all(finite_positive(r.ttft_ms, r.e2e_ms) and r.e2e_ms >= r.ttft_ms for r in rep.records)
    assert finite_positive(rep.output_tokens_per_s, rep.requests_per_s, rep.duration_s, rep.ttft_ms_p50)
    assert all(0.0 <= occ <= 1.0 for _, occ in rep.kv_occupancy)


@settings(max_examples=200, **SETTINGS)
@given(cfg=llama_configs(valid_only=True), more=st.integers(1, 3), scheduler=st.sampled_from(["continuous", "static"]),
       lengths=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 30)), min_size=1, max_size=10))
def test_serving_more_layers_takes_longer(cfg, more, scheduler, lengths):
    kw = dict(requests=len(lengths), rate=float("inf"), scheduler=scheduler, lengths=lengths, progress=False)
    try:
        a = serve(cfg, **kw)
        b = serve({**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + more}, **kw)
    except HBMCapacityError:
        event("HBM full")
        return
    assume(cfg["max_position_embeddings"] >= max(p + o for p, o in lengths))
    assert b.duration_s > a.duration_s
    assert b.e2e_ms_p50 > a.e2e_ms_p50


# ---- training steps ---------------------------------------------------------------------------------

def _mlp(width: int, layers: int) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 10))


@settings(max_examples=16, **SETTINGS)
@given(width=st.sampled_from([32, 64, 128]), layers=st.integers(1, 3), batch=st.sampled_from([4, 16, 32, 0]),
       optimizer=st.sampled_from(["sgd", "adamw", "adam", "lion"]), cards=st.sampled_from([1, 2, 8, 0]))
def test_a_training_step_names_what_is_wrong_or_costs_more_with_more_layers_and_keeps_throughput(
        width, layers, batch, optimizer, cards):
    from pypto_lab.train import simulate_step
    from pypto_lab.train.step import TrainConfigError

    def step(n_layers: int, b: int):
        torch.manual_seed(0)
        return simulate_step(_mlp(width, n_layers), (torch.randn(b, width), torch.randint(0, 10, (b,))),
                             nn.functional.cross_entropy, optimizer=optimizer, cards=cards)

    try:
        r = step(layers, batch)
    except TrainConfigError as e:
        event("refused")
        assert "Fix" in str(e) and any(w in str(e) for w in ("example_batch", "optimizer", "cards"))
        return
    event("costed")
    assert finite_positive(r.step_ms, r.forward_ms, r.backward_ms, r.optimizer_ms, r.samples_per_s, r.peak_hbm_bytes)
    deeper = step(layers + 1, batch)
    assert deeper.step_ms > r.step_ms and deeper.memory["weights"] > r.memory["weights"]
    bigger = step(layers, batch * 4)
    assert bigger.samples_per_s >= r.samples_per_s * (1 - 1e-9)


# ---- optimize -----------------------------------------------------------------------------------------

@settings(max_examples=16, **SETTINGS)
@given(width=st.sampled_from([32, 64, 256]), layers=st.integers(1, 3), batch=st.sampled_from([1, 8]),
       level=st.sampled_from([0, 1, 2, 3, 5]), precision=st.sampled_from(["fp16", "fp32", "bf16", "fp8"]))
def test_optimize_names_what_is_wrong_or_costs_more_with_more_layers_and_keeps_throughput(
        width, layers, batch, level, precision):
    import pypto_lab

    def report(n_layers: int, b: int):
        torch.manual_seed(0)
        return pypto_lab.optimize(_mlp(width, n_layers).eval(), (torch.randn(b, width),), chip="Ascend910B1",
                                  level=level, precision=precision).report()

    try:
        r = report(layers, batch)
    except ValueError as e:
        event("refused")
        assert any(w in str(e) for w in ("level", "precision")) and str(level if level > 3 else precision) in str(e)
        return
    event("optimized")
    assert finite_positive(r.latency_us, r.throughput_per_s, r.gm_bytes, r.energy_mj)
    deeper = report(layers + 1, batch)
    assert deeper.latency_us > r.latency_us and deeper.gm_bytes > r.gm_bytes
    bigger = report(layers, batch * 4)
    assert bigger.throughput_per_s >= r.throughput_per_s * (1 - 1e-9)


@pytest.mark.parametrize("bad", [dict(batch=True), dict(batch=0), dict(output_len=-3)])
def test_the_properties_see_bad_arguments_as_errors(bad):
    """The property tests above treat an error as a pass only if it names the field: check the
    engine's errors do (a guard against a property that cannot fail)."""
    with pytest.raises(LLMConfigError) as e:
        simulate_generation("gpt2", **(dict(batch=1, prompt_len=16, output_len=4) | bad))
    (field,) = bad
    assert e.value.field == field
