"""Mixture-of-experts training steps (pypto_lab.train.moe): a MoE causal LM built from a
transformers config captures, its experts run as CANN's MoE kernels, and expert parallelism divides
the experts' state per card and adds the all-to-all dispatch and combine of every MoE layer."""

from __future__ import annotations

import pytest
import torch
import transformers

from pypto_lab.hw.chip import DEFAULT_CHIP, get_chip
from pypto_lab.hw.collectives import collective
from pypto_lab.train import TrainConfigError, simulate_step
from pypto_lab.train.parallel import cluster, group_topology

HIDDEN, INTER, EXPERTS, TOP_K, LAYERS = 128, 256, 4, 2, 2
CFG = transformers.MixtralConfig(vocab_size=1000, hidden_size=HIDDEN, intermediate_size=INTER,
                                 num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                 num_local_experts=EXPERTS, num_experts_per_tok=TOP_K)
B, S = 2, 64
IDS = {"input_ids": torch.zeros(B, S, dtype=torch.long)}
# every expert's gate/up ([hidden, 2 x inter]) and down ([inter, hidden]) weights, every layer
EXPERT_PARAMS = LAYERS * EXPERTS * (HIDDEN * 2 * INTER + INTER * HIDDEN)


def _ops(report, phase):
    return {k.kernel.spec.op for k in report.kernels if k.phase == phase and hasattr(k.kernel.spec, "op")}


def _has(ops, name):
    return any(name in op.split("+") for op in ops)


def test_a_mixtral_config_captures_and_its_experts_run_as_canns_moe_kernels():
    r = simulate_step(CFG, IDS, precision="bf16")
    assert r.unmapped_ops == {}   # nothing falls back to the host
    fwd = _ops(r, "forward")
    for name in ("MoeGatingTopK", "MoeInitRouting", "MoeComputeExpertTokens", "GroupedMatmul", "MoeFinalizeRouting"):
        assert _has(fwd, name), (name, fwd)
    assert _has(_ops(r, "backward"), "GroupedMatmul")
    gmm_f = [k for k in r.kernels if k.phase == "forward" and getattr(k.kernel.spec, "op", "") == "GroupedMatmul"]
    gmm_b = [k for k in r.kernels if k.phase == "backward" and getattr(k.kernel.spec, "op", "") == "GroupedMatmul"]
    # two grouped matmuls per layer forward (gate/up, down); each backward is two (input and weight gradients)
    assert len(gmm_f) == 2 * LAYERS and len(gmm_b) == 2 * len(gmm_f)
    assert any("mixture of experts" in n for n in r.notes)


def _expert_bytes(r1, r2, key):
    """What ep=2 saves of one memory part (r1: ep 1, r2: ep 2)."""
    return r1.memory[key] - r2.memory[key]


def test_ep2_halves_the_experts_state_per_card_and_adds_the_collective_models_all_to_all():
    one = simulate_step(CFG, IDS, precision="bf16", cards=2, ep=1)
    two = simulate_step(CFG, IDS, precision="bf16", cards=2, ep=2)
    # bf16 weights; fp32 master weights and gradients; Adam's two fp32 moments: half the experts each
    for key, per_param in (("weights", 2), ("master weights", 4), ("gradients", 4), ("optimizer state", 8)):
        assert _expert_bytes(one, two, key) == EXPERT_PARAMS // 2 * per_param, key
    assert one.ep_comm_ms == 0.0
    # 2 all-to-alls forward and 2 backward per MoE layer, each card sending its tokens x top-k routed rows
    cards = 2
    topo = group_topology(cluster(get_chip(DEFAULT_CHIP), cards), 2, 1)
    nbytes = B * S * TOP_K * HIDDEN * 2
    one_a2a = collective("alltoall", nbytes, 2, topo).time_us
    assert two.ep_comm_ms * 1e3 == pytest.approx(4 * LAYERS * one_a2a, rel=1e-9)
    a2a = [k for k in two.kernels if getattr(k.kernel.spec, "op", "") == "alltoall"]
    assert sorted(k.phase for k in a2a) == ["backward"] * 2 * LAYERS + ["forward"] * 2 * LAYERS
    # on the critical path: the all-to-all time is inside the forward and backward passes
    assert two.forward_ms > sum(k.time_us for k in a2a if k.phase == "forward") / 1e3
    assert any("expert parallelism over 2 ranks" in n for n in two.notes)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group_only():
    # 4 cards, ep 2: the dense gradients all-reduced over the 4 data-parallel ranks, the experts' (half of
    # them on each card, fp32) in buckets of their own over the expert data-parallel group: dp / ep = 2
    # ranks, tp x ep = 2 apart
    r = simulate_step(CFG, IDS, precision="bf16", cards=4, ep=2)
    experts = EXPERT_PARAMS // 2 * 4
    dense = r.memory["gradients"] - experts
    assert sorted(b.nbytes for b in r.buckets) == sorted([dense, experts])
    topo = cluster(get_chip(DEFAULT_CHIP), 4)
    by_size = {b.nbytes: b.time_us for b in r.buckets}
    assert by_size[experts] == pytest.approx(collective("allreduce", experts, 2, group_topology(topo, 2, 2)).time_us)
    assert by_size[dense] == pytest.approx(collective("allreduce", dense, 4, group_topology(topo, 4, 1)).time_us)
    # ep = dp: no expert data parallelism left, the experts' gradients are not reduced at all
    r2 = simulate_step(CFG, IDS, precision="bf16", cards=2, ep=2)
    assert [b.nbytes for b in r2.buckets] == [r2.memory["gradients"] - experts]


@pytest.mark.parametrize("kw, words", [
    (dict(cards=6, ep=3), ["ep = 3", "divide 4", "Fix:"]),          # does not divide the experts
    (dict(cards=2, ep=4), ["ep = 4", "Fix:"]),                      # more expert ranks than cards
])
def test_a_bad_ep_names_the_rule_the_value_and_a_fix(kw, words):
    with pytest.raises(TrainConfigError) as e:
        simulate_step(CFG, IDS, precision="bf16", **kw)
    for w in words:
        assert w in str(e.value)


def test_ep_on_a_dense_model_is_refused():
    dense = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    with pytest.raises(TrainConfigError, match="no MoE layer"):
        simulate_step(dense, IDS, cards=2, ep=2)


def test_a_qwen3_moe_config_captures_with_its_experts_split_over_ep_ranks():
    cfg = transformers.Qwen3MoeConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                      num_experts_per_tok=2, head_dim=32)
    r = simulate_step(cfg, IDS, precision="bf16", cards=4, ep=4)
    assert r.unmapped_ops == {} and r.ep_comm_ms > 0
    assert any("each card holds 2 of the 8 experts" in n for n in r.notes)


def test_a_megatron_moe_argument_list_runs_expert_parallel_and_names_the_overlap_it_does_not_model():
    from pypto_lab.train.megatron_args import read_megatron_args

    run = read_megatron_args("--num-layers 2 --hidden-size 128 --ffn-hidden-size 256 --num-attention-heads 4 "
                             "--seq-length 64 --tokenizer-type Llama2Tokenizer --swiglu --bf16 "
                             "--num-experts 4 --moe-router-topk 2 --expert-model-parallel-size 2 --moe-grouped-gemm "
                             "--moe-alltoall-overlap-comm --micro-batch-size 1 --global-batch-size 2")
    assert run.ignored == ["--moe-alltoall-overlap-comm"]
    r = run.simulate(2)
    assert r.layout.ep == 2 and r.ep_comm_ms > 0 and r.unmapped_ops == {}


def test_zero3_shards_the_experts_over_the_expert_data_parallel_group_to_the_same_bytes_per_card():
    # ZeRO-3: the dense weights over the 4 data-parallel ranks, the experts' ep=2 share over the 2 expert
    # data-parallel ranks: a quarter of every weight on each card, as without expert parallelism
    one = simulate_step(CFG, IDS, precision="bf16", cards=4, zero=3)
    two = simulate_step(CFG, IDS, precision="bf16", cards=4, zero=3, ep=2)
    for key in ("weights", "master weights", "gradients", "optimizer state"):
        assert two.memory[key] == one.memory[key], key
    assert two.ep_comm_ms > 0
