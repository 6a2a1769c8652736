"""pto kernels plugged into the LLM engine's decode step (`pypto_lab.llm.plug`): the workbench's own
kernels for DeepSeek-V3.2's sparse attention, Qwen3-Next's gated delta rule and GLM-4.5's fused MoE
compute what their torch references compute, each model decodes with its kernel in place of the
engine's, the report names the kernel and its simulated cost, and a kernel that does not fit is
refused with the rule."""

import warnings

import pytest
import torch

import pypto_lab.pto as pypto
from pypto_lab.llm import model_kernels as mk
from pypto_lab.llm import plug
from pypto_lab.llm.configs import spec_of
from pypto_lab.llm.engine import hardware, simulate_generation
from pypto_lab.llm.forward import forward_kernels, step_time_us
from pypto_lab.llm.memory import kv_bytes_per_token
from pypto_lab.pto import config as pto_config

# the three models on cards they fit (weights, KV and activations within a card's HBM)
SETUPS = {
    "deepseek-v3.2": (dict(cards=16, precision="w8a16"), "attention", plug.sparse_mla_attention, 61),
    "qwen3-next": (dict(cards=4), "linear_attention", plug.gated_delta_rule, 36),
    "glm-4.5": (dict(cards=16), "moe", plug.fused_moe, 89),
}


# ---- the kernels compute what the models compute -----------------------------------------------------

def test_dense_and_sparse_mla_decode_match_softmax_attention_over_the_latents():
    torch.manual_seed(0)
    b, h, rank, d, s, k = 2, 8, 64, 80, 2 * mk.BLOCK, mk.BLOCK
    q, kv = torch.randn(b, h, d).half(), torch.randn(b, s, d).half()
    out = torch.zeros(b, h, rank).half()
    mk.mla_decode_kernel(2)(q, kv, out)
    assert (out.float() - mk.mla_decode_reference(q, kv, rank)).abs().max() < 2e-3
    idx = torch.stack([torch.randperm(s)[:k] for _ in range(b)]).int()
    out2 = torch.zeros(b, h, rank).half()
    mk.sparse_mla_decode_kernel(1)(q, kv, idx, out2)
    sparse_ref = mk.mla_decode_reference(q, kv, rank, idx)
    assert (out2.float() - sparse_ref).abs().max() < 2e-3
    assert (sparse_ref - mk.mla_decode_reference(q, kv, rank)).abs().max() > 0.05     # the selection matters


def test_gated_delta_rule_step_matches_the_recurrent_formula():
    torch.manual_seed(0)
    n, dk, dv = 4, 32, 32
    q, k, v = torch.randn(n, dk).half(), torch.randn(n, dk).half(), torch.randn(n, dv).half()
    g, beta = -torch.rand(n, 1).half(), torch.rand(n, 1).half()
    state = torch.randn(n * dk, dv) * 0.1
    new_state, out = torch.zeros_like(state), torch.zeros(n, dv).half()
    mk.gated_delta_rule_decode_kernel()(q, k, v, g, beta, state, new_state, out)
    ref_out, ref_state = mk.gated_delta_rule_reference(q, k, v, g, beta, state)
    assert (out.float() - ref_out).abs().max() < 1e-3
    assert (new_state - ref_state).abs().max() < 1e-5
    assert (ref_state - state).abs().max() > 0.01                                     # the state moved


def test_fused_moe_matches_glm_routing_and_experts():
    torch.manual_seed(0)
    t, h, e, i, k = 2, 64, 16, 32, 4
    x, wr = torch.randn(t, h).half(), (torch.randn(e, h) / 8).half()
    bias = torch.rand(1, e) * 0.05
    wgu, wd = (torch.randn(e * h, 2 * i) / 8).half(), (torch.randn(e * i, h) / 6).half()
    out = torch.zeros(t, h).half()
    mk.fused_moe_decode_kernel(k, 2.5)(x, wr, bias, wgu, wd, out)
    ref = mk.fused_moe_reference(x, wr, bias, wgu, wd, k, 2.5)
    assert (out.float() - ref).abs().max() < 2e-2 * ref.abs().max()


# ---- the engine models the three models' layer kinds ---------------------------------------------------

def test_qwen3_next_has_gated_deltanet_layers_and_caches_kv_only_in_full_attention():
    spec = spec_of("qwen3-next")
    hw = hardware("Ascend910B1", cards=4)
    ks = {k.name: k for k in forward_kernels(spec, hw, decode=[4096])}
    assert ks["RecurrentGatedDeltaRule"].count == 36 and ks["IncreFlashAttention"].count == 12
    assert ks["MatMul_in_proj_qkvz"].count == 36 and ks["MatMul_qkv"].count == 12
    assert kv_bytes_per_token(spec, hw) == 2 * 12 * 1 * 256 * 2     # 12 full layers, 2 KV heads over 4 cards: 1


def test_deepseek_v32_runs_the_lightning_indexer_and_attends_to_index_topk_tokens():
    spec = spec_of("deepseek-v3.2")
    hw = hardware("Ascend910B1", cards=16, precision="w8a16")
    ks = {k.name: k for k in forward_kernels(spec, hw, decode=[65536])}
    assert {"BatchMatMul_indexer_scores", "ReluWeightedSum_indexer", "TopK_indexer"} <= set(ks)
    assert ks["IncreFlashAttention"].spec.context == 2048
    v3 = {k.name: k for k in forward_kernels(spec_of("deepseek-v3"), hw, decode=[65536])}
    assert v3["IncreFlashAttention"].spec.context == 65536 and "TopK_indexer" not in v3


# ---- each model decodes with its kernel plugged in ------------------------------------------------------

@pytest.mark.parametrize("name", list(SETUPS))
def test_each_model_decodes_with_its_kernel_and_the_report_names_it_and_its_cost(name):
    kw, kind, make, layers = SETUPS[name]
    base = simulate_generation(name, batch=1, prompt_len=4096, output_len=16, context_points=2, **kw)
    r = simulate_generation(name, batch=1, prompt_len=4096, output_len=16, context_points=2,
                            kernels={kind: make()}, **kw)
    (p,) = r.plugged
    print(name, f"TPOT default {base.tpot_ms:.3f} ms, plugged {r.tpot_ms:.3f} ms;", r.plugged_table())
    assert p["kind"] == kind and p["calls_per_step"] == layers and p["us_per_call"] > 0
    assert p["kernel"] in r.table() and p["kernel"] == make().label
    names = {k.name for k in r.decode_kernels}
    assert f"pto:{p['kernel']}" in names and not names & set(p["replaces"])
    assert r.ttft_ms == base.ttft_ms                         # prefill keeps the engine's kernels
    assert r.tpot_ms != base.tpot_ms
    # the cost is the kernel's own SIM run at the shapes the report gives
    shapes = p["shapes"]
    row = next(k for k in r.decode_kernels if k.name == f"pto:{p['kernel']}")
    kernel = row.spec.kernel
    args = [torch.zeros(s, dtype=torch.int32) if m.dtype == "int32" else torch.empty(s, dtype=getattr(torch, m.dtype))
            for s, m in zip(shapes, row.spec.args, strict=True)]
    args += [torch.empty(o.shape, dtype=getattr(torch, o.dtype)) for o in row.spec.out]
    with pto_config.cost_only(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel(*args)
    assert kernel.last_run.time_us == pytest.approx(p["us_per_call"], rel=1e-9)


def test_sparse_attention_beats_dense_mla_at_long_context_and_not_at_short():
    """DeepSeek-V3.2 on 16 cards, batch 1: the sparse kernel over the indexer's 2,048 tokens (with the
    indexer's own kernels) against dense MLA over the whole cache (no indexer)."""
    spec = spec_of("deepseek-v3.2")
    hw = hardware("Ascend910B1", cards=16, precision="w8a16")
    sparse = plug.resolve(spec, hw, {"attention": plug.sparse_mla_attention()})
    dense = plug.resolve(spec, hw, {"attention": plug.dense_mla_attention()})
    device = hw.stack.with_values(layer_host_us=0.0)   # the kernels' time, not the PIECEWISE host's
    step = {(c, n): step_time_us(forward_kernels(spec, hw, decode=[c], plugged=p), device) / 1000
            for c in (4096, 131072) for n, p in (("sparse", sparse), ("dense", dense))}
    print({k: round(v, 3) for k, v in step.items()})
    assert step[(131072, "sparse")] < 0.7 * step[(131072, "dense")]
    assert step[(4096, "dense")] < step[(4096, "sparse")]          # the indexer costs more than it saves there
    # the sparse kernel's own time does not grow with the context; the dense one's does
    t = {c: next(k.cost.time_us for k in forward_kernels(spec, hw, decode=[c], plugged=sparse)
                 if k.name.startswith("pto:")) for c in (65536, 131072)}
    assert t[65536] == t[131072]


# ---- a kernel that does not fit -------------------------------------------------------------------------

def test_a_kernel_annotated_with_the_wrong_shape_is_refused_naming_the_parameter():
    @pypto.jit
    def bad_gdr(q: pypto.Tensor([16, 128], pypto.DT_FP16), k: pypto.Tensor[...], v: pypto.Tensor[...],
                g: pypto.Tensor[...], beta: pypto.Tensor[...], state: pypto.Tensor[...],
                new_state: pypto.Tensor[...], out: pypto.Tensor[...]):
        out[:] = v

    with pytest.raises(plug.PluggedKernelError, match=r"input 'q' is annotated with shape \[16, 128\], the step "
                       r"passes \[8, 128\].*Fix: annotate \[8, 128\]"):
        simulate_generation("qwen3-next", batch=1, prompt_len=256, output_len=4, cards=4,
                            kernels={"linear_attention": bad_gdr})


def test_a_kernel_with_the_wrong_parameters_or_layer_is_refused():
    @pypto.jit
    def three(q: pypto.Tensor[...], kv: pypto.Tensor[...], out: pypto.Tensor[...]):
        out[:] = q

    with pytest.raises(plug.PluggedKernelError, match=r"takes 3 parameters; the step passes 6 input\(s\) and 2"):
        simulate_generation("qwen3-next", batch=1, prompt_len=256, output_len=4, cards=4,
                            kernels={"linear_attention": three})
    with pytest.raises(plug.PluggedKernelError, match="grouped-query"):
        simulate_generation("glm-4.5", batch=1, prompt_len=256, output_len=4, cards=16,
                            kernels={"attention": plug.dense_mla_attention()})
    with pytest.raises(plug.PluggedKernelError, match="index_topk"):
        simulate_generation("deepseek-v3", batch=1, prompt_len=256, output_len=4, cards=16, precision="w8a16",
                            kernels={"attention": plug.sparse_mla_attention()})
    with pytest.raises(plug.PluggedKernelError, match="int8.*Fix: precision='fp16'"):
        simulate_generation("glm-4.5", batch=1, prompt_len=256, output_len=4, cards=16, precision="w8a16",
                            kernels={"moe": plug.fused_moe()})
    with pytest.raises(plug.PluggedKernelError, match="not a layer kind"):
        simulate_generation("glm-4.5", batch=1, prompt_len=256, output_len=4, cards=16, kernels={"mlp": three})


# ---- the real framework's kernel (hicann/pypto, not vendored: PYPTO_SRC) -------------------------------

def _real():
    """(scripts/day0_real_kernels.py as a module, the checkout) or a skip without PYPTO_SRC."""
    import importlib.util
    import os
    import sys
    from pathlib import Path

    src = os.environ.get("PYPTO_SRC")
    if not src or not (Path(src) / "models").is_dir():
        pytest.skip("set PYPTO_SRC to a checkout of the real framework's repository (hicann/pypto): it is not vendored")
    path = Path(__file__).resolve().parents[1] / "scripts" / "day0_real_kernels.py"
    spec = importlib.util.spec_from_file_location("day0_real_kernels", path)
    real = importlib.util.module_from_spec(spec)
    sys.modules["day0_real_kernels"] = real
    spec.loader.exec_module(real)
    return real, Path(src)


def test_deepseek_v32_decodes_with_the_real_frameworks_sparse_flash_attention():
    """``sparse_flash_attention_quant_d`` from the real ``models/deepseek_v32_exp/`` in place of
    IncreFlashAttention; like the workbench's sparse kernel its time does not grow past index_topk."""
    real, src = _real()
    kernel = real.deepseek_sparse_attention(src)
    kw = dict(batch=1, prompt_len=4096, output_len=8, context_points=2, cards=16, precision="w8a16")
    r = simulate_generation("deepseek-v3.2", kernels={"attention": kernel}, **kw)
    (p,) = r.plugged
    print(r.plugged_table())
    assert p["kernel"].startswith("sparse_flash_attention_quant_d") and p["calls_per_step"] == 61
    assert p["replaces"] == ["IncreFlashAttention"] and "TopK_indexer" in {k.name for k in r.decode_kernels}
    spec, hw = spec_of("deepseek-v3.2"), hardware("Ascend910B1", cards=16, precision="w8a16")
    shapes = {c: plug.StepShape(spec, hw, 1, c) for c in (1024, 8192, 65536)}
    t = {c: plug.cost_plugged(kernel, s)[1].time_us for c, s in shapes.items()}
    assert t[8192] == pytest.approx(t[65536], rel=0.02)                # 2,048 tokens of any context
    assert t[1024] <= t[8192]                                          # (one 2,048-token tile, partly valid)


def test_glm45_decodes_with_the_real_frameworks_moe_fusion_kernel():
    """GLM-4.5's ``moe_fusion_kernel`` from the real ``models/glm_v4_5/glm_moe_fusion.py`` (router,
    top-k and the int8 shared expert in one kernel) in place of the engine's router, gating and
    shared-expert kernels."""
    real, src = _real()
    kw = dict(batch=1, prompt_len=1024, output_len=8, context_points=2, cards=16, tp=8, precision="w8a8")
    base = simulate_generation("glm-4.5", **kw)
    r = simulate_generation("glm-4.5", kernels={"moe": real.glm_moe_fusion(src)}, **kw)
    (p,) = r.plugged
    print(r.plugged_table())
    assert p["kernel"].startswith("moe_fusion_kernel") and p["us_per_call"] > 0 and p["calls_per_step"] == 89
    assert p["replaces"] == ["MatMul_router", "MoeGatingTopK", "MatMul_shared_gate_up", "SwiGlu_shared",
                             "MatMul_shared_down"]
    names = {k.name for k in r.decode_kernels}
    assert "GroupedMatmul_gate_up" in names and "MoeGatingTopK" not in names      # routed experts stay the engine's
    assert r.tpot_ms != base.tpot_ms


def test_qwen3_next_counts_its_deltanet_state_per_sequence_not_per_token():
    from pypto_lab.llm.engine import hbm_use
    from pypto_lab.llm.memory import state_bytes_per_sequence

    spec, hw = spec_of("qwen3-next"), hardware("Ascend910B1", cards=4)
    state = state_bytes_per_sequence(spec, hw)
    assert state == 36 * (8 * 128 * 128 * 4 + (2 * 4 * 128 + 8 * 128) * 3 * 2)   # 36 layers, 8 value heads a card
    short, long = (hbm_use(spec, hw, 2, n, 128).kv_cache_bytes for n in (1024, 2048))
    assert long - short == 2 * 1024 * kv_bytes_per_token(spec, hw)            # the state does not grow
    assert short == 2 * (1024 * kv_bytes_per_token(spec, hw) + state)
    assert state_bytes_per_sequence(spec_of("glm-4.5"), hw) == 0


def test_serving_steps_take_the_plugged_kernel_in_decode_only_steps():
    from pypto_lab.llm.engine import serve, step_model

    base = step_model("qwen3-next", "Ascend910B1", cards=4)
    sm = step_model("qwen3-next", "Ascend910B1", cards=4, kernels={"linear_attention": plug.gated_delta_rule()})
    hw = sm.hw
    ks = forward_kernels(sm.spec, hw, decode=[2048] * 4, plugged=sm.plugged)
    assert sm.step_ms([], [2048] * 4) == pytest.approx(step_time_us(ks, hw.stack) / 1000)
    assert sm.step_ms([], [2048] * 4) != base.step_ms([], [2048] * 4)
    assert sm.step_ms([(512, 0)], [2048]) == base.step_ms([(512, 0)], [2048])    # a step with prefill: the engine's
    kw = dict(requests=20, rate=2.0, cards=4, progress=False)
    plain = serve("qwen3-next", "Ascend910B1", **kw).to_dict()
    plugged = serve("qwen3-next", "Ascend910B1", kernels={"linear_attention": plug.gated_delta_rule()}, **kw).to_dict()
    print("TPOT p50", plain["tpot_ms_p50"], "->", plugged["tpot_ms_p50"])
    assert plugged["tpot_ms_p50"] != plain["tpot_ms_p50"]


# ---- kernels of the prefill phase ---------------------------------------------------------------------

@pypto.jit
def _double_v_prefill(q: pypto.Tensor[...], k: pypto.Tensor[...], v: pypto.Tensor[...], g: pypto.Tensor[...],
                      beta: pypto.Tensor[...], state: pypto.Tensor[...], new_state: pypto.Tensor[...],
                      out: pypto.Tensor[...]):
    """A small kernel over the standard prefill arguments of a linear-attention layer: each (sequence,
    value head)'s values doubled into the output, its state copied (its cost grows with the prompt)."""
    n, p, dv = v.shape
    dk = q.shape[2]
    for i in pypto.loop(n, name="LOOP_heads", idx_name="i"):
        pypto.set_vec_tile_shapes(1, 64, dv)
        vi = pypto.view(v, [1, p, dv], [i, 0, 0])
        pypto.assemble(vi + vi, [i, 0, 0], out)
        pypto.set_vec_tile_shapes(dk, dv)
        pypto.assemble(pypto.view(state, [dk, dv], [i * dk, 0]) + 0.0, [i * dk, 0], new_state)


QWEN = dict(batch=1, prompt_len=200, output_len=4, cards=4, context_points=2)


def test_a_prefill_kernel_runs_the_prefill_at_its_real_shapes_and_leaves_decode_alone():
    prefill_kernel = plug.LayerKernel("linear_attention", _double_v_prefill, phase="prefill", name="double_v")
    base = simulate_generation("qwen3-next", **QWEN)
    r = simulate_generation("qwen3-next", kernels={"linear_attention": prefill_kernel}, **QWEN)
    (p,) = r.plugged
    print(r.plugged_table())
    assert p["phase"] == "prefill" and p["kernel"] == "double_v" and p["calls_per_step"] == 36 and p["us_per_call"] > 0
    assert p["replaces"] == ["ChunkGatedDeltaRule_intra", "ChunkGatedDeltaRule_state"]
    assert p["shapes"][:3] == [[8, 200, 128]] * 3           # 8 value heads a card, the prompt's 200 tokens
    assert "prefill" in r.table() and "double_v" in r.table()
    names = {k.name for k in r.prefill_kernels}
    assert "pto:double_v" in names and "ChunkGatedDeltaRule_intra" not in names
    assert r.ttft_ms != base.ttft_ms and r.tpot_ms == base.tpot_ms
    assert {k.name for k in r.decode_kernels} == {k.name for k in base.decode_kernels}
    # the cost is the kernel's run at that step, memoised per shapes: a longer prompt costs more
    spec, hw = spec_of("qwen3-next"), hardware("Ascend910B1", cards=4)
    short = plug.cost_plugged(prefill_kernel, plug.prefill_shape(spec, hw, [(200, 0)]))[1]
    assert short.time_us == pytest.approx(p["us_per_call"], rel=1e-9)
    assert plug.cost_plugged(prefill_kernel, plug.prefill_shape(spec, hw, [(200, 0)]))[1] is short
    assert plug.cost_plugged(prefill_kernel, plug.prefill_shape(spec, hw, [(800, 0)]))[1].time_us > short.time_us


def test_a_decode_only_kernel_leaves_the_prefill_and_a_pair_serves_both_phases():
    base = simulate_generation("qwen3-next", **QWEN)
    dec = simulate_generation("qwen3-next", kernels={"linear_attention": plug.gated_delta_rule()}, **QWEN)
    assert [p["phase"] for p in dec.plugged] == ["decode"]
    assert dec.ttft_ms == base.ttft_ms
    assert [k.name for k in dec.prefill_kernels] == [k.name for k in base.prefill_kernels]
    both = (plug.LayerKernel("linear_attention", _double_v_prefill, phase="prefill", name="double_v"),
            plug.gated_delta_rule())
    r = simulate_generation("qwen3-next", kernels={"linear_attention": both}, **QWEN)
    assert [(p["phase"], p["kernel"]) for p in r.plugged] == [("prefill", "double_v"),
                                                              ("decode", "gated_delta_rule_decode")]
    assert r.ttft_ms != base.ttft_ms and r.tpot_ms == dec.tpot_ms
    # serving: a prefill-only step takes the prefill kernel; a step mixing both keeps the engine's
    from pypto_lab.llm.engine import step_model
    sm0 = step_model("qwen3-next", "Ascend910B1", cards=4)
    sm = step_model("qwen3-next", "Ascend910B1", cards=4, kernels={"linear_attention": both})
    assert sm.step_ms([(512, 0)], []) != sm0.step_ms([(512, 0)], [])
    assert sm.step_ms([(512, 0)], [2048]) == sm0.step_ms([(512, 0)], [2048])


def test_a_prefill_kernel_that_does_not_fit_the_prompt_is_refused_naming_the_step():
    @pypto.jit
    def fixed_prompt(q: pypto.Tensor([8, 128, 128], pypto.DT_FP16), k: pypto.Tensor[...], v: pypto.Tensor[...],
                     g: pypto.Tensor[...], beta: pypto.Tensor[...], state: pypto.Tensor[...],
                     new_state: pypto.Tensor[...], out: pypto.Tensor[...]):
        out[:] = v

    with pytest.raises(plug.PluggedKernelError, match=r"prefill step \(batch 1, prompt 256, tp 4\): input 'q' is "
                       r"annotated with shape \[8, 128, 128\], the step passes \[8, 256, 128\].*Fix: annotate "
                       r"\[8, 256, 128\]"):
        simulate_generation("qwen3-next", batch=1, prompt_len=256, output_len=4, cards=4,
                            kernels={"linear_attention": plug.LayerKernel("linear_attention", fixed_prompt,
                                                                          phase="prefill")})
    with pytest.raises(plug.PluggedKernelError, match=r"phase 'prompt'.*Fix: LayerKernel\(\.\.\., phase='prefill'\)"):
        plug.LayerKernel("linear_attention", fixed_prompt, phase="prompt")
    with pytest.raises(plug.PluggedKernelError, match="both serve the decode steps. Rule: one kernel per layer kind"):
        simulate_generation("qwen3-next", **QWEN, kernels={"linear_attention": (
            plug.gated_delta_rule(), plug.LayerKernel("linear_attention", fixed_prompt, phase="both"))})
    with pytest.raises(plug.PluggedKernelError, match="lightning indexer's selection, which the engine runs in "
                       "decode steps only"):
        simulate_generation("deepseek-v3.2", batch=1, prompt_len=256, output_len=4, cards=16, precision="w8a16",
                            kernels={"attention": plug.LayerKernel("attention", fixed_prompt, sparse=True,
                                                                   phase="both")})


def test_qwen3_next_prefills_with_the_real_frameworks_chunked_gated_delta_rule():
    """``chunk_gated_delta_rule`` from the real ``models/qwen3_next/`` (the chunked form: 128-token
    chunks, the state carried across them) in place of the engine's chunked gated delta rule in the
    prefill, the workbench's recurrent kernel in decode."""
    real, src = _real()
    kernel = real.qwen3_next_chunk_gated_delta_rule(src)
    kw = dict(batch=2, prompt_len=256, output_len=4, cards=4, context_points=2)
    dec = simulate_generation("qwen3-next", kernels={"linear_attention": plug.gated_delta_rule()}, **kw)
    r = simulate_generation("qwen3-next", kernels={"linear_attention": (kernel, plug.gated_delta_rule())}, **kw)
    print(r.plugged_table())
    pre, d = r.plugged
    assert pre["phase"] == "prefill" and pre["kernel"].startswith("chunk_gated_delta_rule") and pre["calls_per_step"] == 36
    assert pre["shapes"][:3] == [[512, 4, 128], [512, 4, 128], [512, 8, 128]]     # 2 x 256 tokens packed, 4 / 8 heads
    assert pre["replaces"] == ["ChunkGatedDeltaRule_intra", "ChunkGatedDeltaRule_state"]
    assert d["phase"] == "decode" and d["kernel"] == "gated_delta_rule_decode"
    assert r.ttft_ms != dec.ttft_ms and r.tpot_ms == dec.tpot_ms
    # the kernel runs each head's chunks one after another: twice the chunks, about twice the time
    spec, hw = spec_of("qwen3-next"), hardware("Ascend910B1", cards=4)
    t = {n: plug.cost_plugged(kernel, plug.prefill_shape(spec, hw, [(n, 0)]))[1].time_us for n in (200, 256, 512)}
    assert 1.6 < t[512] / t[256] < 2.4
    # a prompt that is not whole chunks runs the file's unaligned variant: 200 tokens are two chunks too
    assert 0.8 < t[200] / t[256] < 1.25
