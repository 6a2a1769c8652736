"""The 0-day MoE model (`pypto_lab.llm.ling_like`) and its pto router (`pypto_lab.llm.ling_like_kernels`):
it captures, it routes only within the chosen groups, the pto custom op computes what the plain
router computes, and once plugged in no part of the router falls back to the CPU."""

import pytest
import torch

import pypto_lab
from pypto_lab.llm.ling_like import LingLikeConfig, LingLikeForCausalLM, group_limited_topk
from pypto_lab.llm.ling_like_kernels import (
    gating_kernel,
    gating_op_name,
    routes_with_pto,
    use_plain_gating,
    use_pto_gating,
)

CFG = LingLikeConfig()


@pytest.fixture(scope="module")
def input_ids():
    return torch.randint(0, CFG.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))


def _routing_by_loops(logits, bias, cfg):
    """The routing written token by token with Python sets: the groups kept, then the experts."""
    scores = torch.sigmoid(logits)
    biased = scores + bias
    gs = cfg.group_size
    all_ids, all_w, kept = [], [], []
    for t in range(logits.shape[0]):
        group_value = [max(biased[t, g * gs:(g + 1) * gs].tolist()) for g in range(cfg.expert_groups)]
        groups = sorted(range(cfg.expert_groups), key=lambda g: -group_value[g])[:cfg.topk_group]
        candidates = [e for e in range(cfg.experts) if e // gs in groups]
        chosen = sorted(candidates, key=lambda e: -float(biased[t, e]))[:cfg.top_k]
        s = scores[t, chosen]
        all_ids.append(sorted(chosen))
        all_w.append(dict(zip(chosen, (s / s.sum() * cfg.routed_scaling).tolist(), strict=True)))
        kept.append(set(groups))
    return all_ids, all_w, kept


def test_routing_picks_experts_only_from_the_selected_groups():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(48, CFG.experts, generator=gen)
    bias = 0.3 * torch.rand(CFG.experts, generator=gen)
    w, ids = group_limited_topk(logits, bias, CFG.expert_groups, CFG.topk_group, CFG.top_k, CFG.routed_scaling)
    want_ids, want_w, kept = _routing_by_loops(logits, bias, CFG)
    for t in range(logits.shape[0]):
        got = ids[t].tolist()
        assert {e // CFG.group_size for e in got} <= kept[t]
        assert sorted(got) == want_ids[t]
        for e, weight in zip(got, w[t].tolist(), strict=True):
            assert weight == pytest.approx(want_w[t][e], rel=1e-5)
    # the group limit matters for this input: an unrestricted top-k would choose differently
    free = torch.topk(torch.sigmoid(logits) + bias, CFG.top_k, dim=-1).indices.sort(-1).values
    assert not torch.equal(free, ids.sort(-1).values)


def test_bias_steers_the_choice_but_not_the_weight():
    logits = torch.zeros(1, CFG.experts)
    logits[0, :4] = 2.0                       # experts 0-3 (group 0) score highest
    bias = torch.zeros(CFG.experts)
    bias[13] = 1.0                            # expert 13 (group 3) is pushed into the choice
    w, ids = group_limited_topk(logits, bias, CFG.expert_groups, CFG.topk_group, CFG.top_k, CFG.routed_scaling)
    chosen = ids[0].tolist()
    assert 13 in chosen
    s = torch.sigmoid(logits[0, chosen])      # weights from the unbiased scores
    assert torch.allclose(w[0], s / s.sum() * CFG.routed_scaling)


def test_the_model_captures_and_is_deterministic(input_ids):
    a, b = LingLikeForCausalLM(CFG).eval(), LingLikeForCausalLM(CFG).eval()
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), n
    other = LingLikeForCausalLM(LingLikeConfig(seed=1))
    assert not torch.equal(other.lm_head.weight, a.lm_head.weight)
    ep = torch.export.export(a, (input_ids,))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.topk.default") == 2 * CFG.layers   # the groups' and the experts' top-k per layer
    with torch.no_grad():
        assert torch.equal(ep.module()(input_ids), a(input_ids))
    assert a(input_ids).shape == (1, 64, CFG.vocab_size)


def test_config_errors_name_the_rule_and_the_fix():
    with pytest.raises(ValueError, match=r"experts must split evenly into expert_groups; got experts=16, "
                       r"expert_groups=5\. Fix: choose expert_groups dividing experts"):
        LingLikeConfig(expert_groups=5)
    with pytest.raises(ValueError, match=r"top_k=9, eligible experts=8\. Fix: lower top_k to at most 8"):
        LingLikeConfig(top_k=9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_pto_kernel_chooses_the_references_experts(dtype):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(64, CFG.experts, generator=gen).to(dtype)
    bias = (0.05 * torch.rand(CFG.experts, generator=gen)).to(dtype)
    w = torch.empty(64, CFG.top_k, dtype=dtype)
    ids = torch.empty(64, CFG.top_k, dtype=torch.int32)
    kernel = gating_kernel(CFG, rows_per_tile=8)
    kernel(logits, bias, w, ids)
    rw, rids = group_limited_topk(logits.float(), bias.float(), CFG.expert_groups, CFG.topk_group, CFG.top_k,
                                  CFG.routed_scaling)
    order, rorder = ids.long().argsort(-1), rids.argsort(-1)
    assert torch.equal(ids.long().gather(1, order), rids.gather(1, rorder))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(w.float().gather(1, order), rw.gather(1, rorder), atol=tol, rtol=tol)
    assert kernel.last_run.cycles > 0


def test_plugged_in_gating_equals_the_plain_model(input_ids):
    model = LingLikeForCausalLM(CFG).eval()
    with torch.no_grad():
        plain = model(input_ids)
        use_pto_gating(model)
        assert all(routes_with_pto(g) for g in model.gates())
        assert torch.equal(model(input_ids), plain)   # outside optimize the op runs its torch reference
    # inside optimize, fp32: the pto kernel routes; the same experts, the same logits
    after = pypto_lab.optimize(model, input_ids, chip="Ascend910B1", level=2, precision="fp32")
    use_plain_gating(model)
    before = pypto_lab.optimize(model, input_ids, chip="Ascend910B1", level=2, precision="fp32")
    rec_a, rec_b = {}, {}
    out_a = after.runtime.run((input_ids,), record=rec_a)
    out_b = before.runtime.run((input_ids,), record=rec_b)
    assert after.runtime.last_stats.nodes.get("pto") == CFG.layers
    name = gating_op_name(CFG)
    for layer, (op_key, topk_key) in enumerate(((name, "topk_1"), (f"{name}_1", "topk_3"))):
        kernel_ids = rec_a[op_key][1].long().sort(-1).values
        plain_ids = rec_b[topk_key][1].sort(-1).values
        assert kernel_ids.shape == (input_ids.numel(), CFG.top_k), layer
        assert torch.equal(kernel_ids, plain_ids), layer
    out_a = out_a[0] if isinstance(out_a, (tuple, list)) else out_a
    out_b = out_b[0] if isinstance(out_b, (tuple, list)) else out_b
    assert torch.allclose(out_a, out_b, atol=1e-4, rtol=1e-4)


def test_the_router_becomes_one_pto_kernel_per_layer_once_the_gating_is_plugged_in(input_ids):
    model = LingLikeForCausalLM(CFG).eval()
    before = pypto_lab.optimize(model, input_ids, chip="Ascend910B1", level=2, precision="bf16").report()
    # as torch writes it, the router is a chain of small kernels on the NPU, its two top-k's CANN's TopKV2
    assert before.fallback_ops == []
    router = [k for k in before.kernels if k.name.endswith("layers.0.moe.gate")]
    assert [k.name.split(":")[0] for k in router].count("TopKV2") == 2 and len(router) > 6
    kernel = gating_kernel(CFG, rows_per_tile=8)
    after = pypto_lab.optimize(use_pto_gating(model, kernel), input_ids, chip="Ascend910B1", level=2,
                               precision="bf16").report()
    assert after.fallback_ops == []
    assert not [k for k in after.kernels if k.unit == "cpu"]
    gates = [k for k in after.kernels if k.name.startswith(gating_op_name(CFG))]
    assert len(gates) == CFG.layers and all(k.spec.kind == "pto" for k in gates)
    # the report's entry is the kernel's own simulated run at the model's shapes, in bf16
    kernel(torch.randn(64, CFG.experts).bfloat16(), torch.rand(CFG.experts).bfloat16(),
           torch.empty(64, CFG.top_k, dtype=torch.bfloat16), torch.empty(64, CFG.top_k, dtype=torch.int32))
    assert gates[0].cycles == pytest.approx(kernel.last_run.cycles)
    assert before.latency_us != pytest.approx(after.latency_us)
