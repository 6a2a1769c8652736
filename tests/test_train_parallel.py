"""Training at scale (pypto_lab.train): the parallel layout, pipeline schedules, ZeRO and the
distributed optimizer, context parallelism, recomputation, memory advice, and the run read from a
Megatron argument list or a DeepSpeed configuration."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from pypto_lab.hw.chip import get_chip
from pypto_lab.train import HBMCapacityError, TrainConfigError, simulate_step
from pypto_lab.train.deepspeed_config import DeepSpeedConfigError, read_deepspeed_config
from pypto_lab.train.megatron_args import MegatronArgsError, read_megatron_args
from pypto_lab.train.parallel import cluster, group_topology
from pypto_lab.train.pipeline import in_flight, simulate


def _llama(layers=4, hidden=128, heads=4, kv=2, inter=256, vocab=1000):
    return transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab)


def _ids(b=2, s=64, vocab=1000):
    return {"input_ids": torch.randint(0, vocab, (b, s))}


# one config and one batch shape for most tests: the step is captured once (AOT autograd's trace is
# what a call costs the first time) and every layout is composed from that capture
CFG = _llama()


def test_1f1b_bubble_is_the_closed_form_and_interleaving_divides_it_by_the_chunks():
    pp, m, f, b = 4, 8, 1.0, 2.0
    plain = simulate([[f]] * pp, [[b]] * pp, m)
    # PipeDream-Flush: (m + pp - 1) passes of f + b; the idle share (pp - 1) / (m + pp - 1)
    assert plain.end_us == pytest.approx((m + pp - 1) * (f + b))
    assert plain.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
    inter = simulate([[f / 2] * 2] * pp, [[b / 2] * 2] * pp, m)   # the same work in 2 chunks per stage
    assert inter.end_us == pytest.approx(m * (f + b) + (pp - 1) * (f + b) / 2)
    # 1F1B keeps pp - s micro-batches in flight on stage s
    assert [in_flight(pp, 1, m, s)[0] for s in range(pp)] == [4, 3, 2, 1]


def test_a_config_costed_from_two_captured_layers_is_the_full_capture():
    cfg = _llama(layers=6)
    with torch.device("meta"):
        full = transformers.AutoModelForCausalLM.from_config(cfg)
    kw = dict(precision="bf16", cards=6, tp=2, pp=3, micro_batches=6, sequence_parallel=True)
    short = simulate_step(cfg, _ids(), **kw)
    whole = simulate_step(full, _ids(), stack="mindspeed", flash_attention=True, fuse_vector=True, **kw)
    assert any("6 layers costed from the 2 captured" in n for n in short.notes)
    assert short.step_ms == pytest.approx(whole.step_ms, rel=1e-9)
    assert short.memory == whole.memory


def test_pipeline_stages_split_the_layers_and_the_trace_shows_their_bubbles(tmp_path):
    rep = simulate_step(CFG, _ids(), precision="bf16", cards=2, pp=2, micro_batches=4)
    assert [s.layers for s in rep.stages] == [((0, 2),), ((2, 4),)]
    assert rep.bubble_ms > 0 and rep.layout.pp == 2 and rep.global_batch == 2 * 4
    trace = rep.chrome_trace(tmp_path / "t.json")["traceEvents"]
    stage_pids = {e["pid"] for e in trace if e.get("cat") in ("forward", "backward") and e["pid"] > 0}
    assert stage_pids == {1, 2}
    assert any(e.get("cat") == "bubble" for e in trace)
    inter = simulate_step(CFG, _ids(), precision="bf16", cards=2, pp=2, vpp=2, micro_batches=4)
    assert inter.bubble_ms < rep.bubble_ms   # interleaving shrinks the warm-up and drain


def test_zero_stages_shard_what_the_zero_paper_says():
    kw = dict(precision="fp16", amp="O2", cards=8)
    plain = simulate_step(CFG, _ids(), **kw)
    z = {k: simulate_step(CFG, _ids(), zero=k, **kw).memory for k in (1, 2, 3)}
    m0 = plain.memory
    assert z[1]["optimizer state"] == pytest.approx(m0["optimizer state"] / 8, rel=1e-3)
    assert z[1]["master weights"] == pytest.approx(m0["master weights"] / 8, rel=1e-3)
    assert z[1]["gradients"] == m0["gradients"]
    assert z[2]["gradients"] == pytest.approx(m0["gradients"] / 8, rel=1e-3)
    assert z[2]["weights"] == m0["weights"]
    assert z[3]["weights"] == pytest.approx(m0["weights"] / 8, rel=1e-3)
    z1 = simulate_step(CFG, _ids(), zero=1, **kw)
    assert {b.kind for b in z1.buckets} == {"reducescatter"} and {b.kind for b in plain.buckets} == {"allreduce"}
    assert z1.param_gather_ms > 0   # the updated shards gathered back


def test_the_distributed_optimizer_holds_6_plus_12_over_d_bytes_per_parameter():
    # Megatron-LM docs/source/distrib_optimizer.md: bf16 weights, fp32 gradients, 12 bytes of fp32
    # master weights and Adam state sharded over the d data-parallel ranks
    rep = simulate_step(CFG, _ids(), precision="bf16", cards=4, distributed_optimizer=True)
    m = rep.memory
    n = m["weights"] / 2
    assert m["gradients"] == pytest.approx(4 * n, rel=1e-6)
    assert m["master weights"] + m["optimizer state"] == pytest.approx(12 * n / 4, rel=1e-3)


def test_groups_use_the_links_their_ranks_sit_on():
    topo = cluster(get_chip("Ascend910B2"), 64)
    assert topo.servers == 8 and topo.cards_per_server == 8
    dp = group_topology(topo, 4, 8)       # one rank per server: RoCE only
    assert [lv.size for lv in dp.levels] == [1, 4]
    tp = group_topology(topo, 8, 1)       # one server's HCCS mesh
    assert [lv.size for lv in tp.levels] == [8, 1]


def test_context_parallelism_runs_ring_attention_on_a_share_of_the_sequence():
    half = simulate_step(CFG, _ids(s=64), precision="bf16", cards=1)
    two = simulate_step(CFG, _ids(s=128), precision="bf16", cards=2, cp=2)
    # each of the two ranks holds 64 of the 128 tokens: the activations of a 64-token sequence
    assert two.memory["activations"] == half.memory["activations"]
    assert two.tokens_per_sample == 128 and two.global_batch == 2
    # one attention kernel per ring step, forward and backward, in each of the 4 layers
    assert sum("ring attention step" in k.name for k in two.kernels) == 2 * 2 * 4
    assert two.cp_comm_ms >= 0
    assert any("context parallelism over 2" in n for n in two.notes)
    with pytest.raises(TrainConfigError, match="multiple of 4"):
        simulate_step(CFG, _ids(s=66), precision="bf16", cards=2, cp=2)


def test_full_recomputation_of_some_layers_costs_less_than_of_all():
    kw = dict(precision="bf16", cards=1)
    none = simulate_step(CFG, _ids(), **kw)
    every = simulate_step(CFG, _ids(), recompute="full", **kw)
    one = simulate_step(CFG, _ids(), recompute="full", recompute_layers=1, recompute_method="block", **kw)
    assert 0 < one.recompute_ms < every.recompute_ms and none.recompute_ms == 0
    assert every.memory["activations"] < one.memory["activations"] < none.memory["activations"]
    with pytest.raises(TrainConfigError, match="recompute"):
        simulate_step(CFG, _ids(), recompute="some", **kw)


def test_megatron_adds_each_micro_batchs_gradients_into_its_fp32_main_grad():
    mega = simulate_step(CFG, _ids(), precision="bf16", micro_batches=2)   # MindSpeed's stack
    fused = simulate_step(CFG, _ids(), precision="bf16", micro_batches=2, grad_accumulation_fusion=True)
    adds = [k for k in mega.kernels if getattr(k.spec, "op", "") == "AccumulateGrad"]
    assert adds and all(k.spec.dtype == "fp32" for k in adds)
    assert not any(getattr(k.spec, "op", "") == "AccumulateGrad" for k in fused.kernels)
    assert mega.backward_ms > fused.backward_ms


def test_a_step_that_does_not_fit_names_the_cheapest_changes_that_fit():
    cfg = _llama(layers=32, hidden=4096, heads=32, kv=32, inter=11008, vocab=32000)   # Llama-2-7B's shapes
    with pytest.raises(HBMCapacityError) as e:
        simulate_step(cfg, _ids(b=1, s=256, vocab=32000), precision="bf16", cards=8, chip="Ascend910B2")
    text = str(e.value)
    assert "distributed_optimizer=True fits with" in text and "GiB per card" in text
    assert "optimizer state" in text   # the breakdown
    # the weights, gradients and optimizer state alone exceed the card: no batch size is advice
    assert "batch <= 0" not in text and "no batch fits this layout" in text
    fits = simulate_step(cfg, _ids(b=1, s=256, vocab=32000), precision="bf16", cards=8, chip="Ascend910B2",
                         distributed_optimizer=True)
    assert fits.peak_hbm_bytes <= get_chip("Ascend910B2").hbm_bytes


LLAMA2_70B = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --use-mcore-models "
              "--use-mc2 --use-fused-swiglu --use-fused-rotary-pos-emb --num-layers 80 --hidden-size 8192 "
              "--ffn-hidden-size 28672 --num-attention-heads 64 --tokenizer-type Llama2Tokenizer --seq-length 4096 "
              "--micro-batch-size 1 --global-batch-size 1024 --make-vocab-size-divisible-by 1 "
              "--untie-embeddings-and-output-weights --position-embedding-type rope --normalization RMSNorm "
              "--use-fused-rmsnorm --swiglu --use-flash-attn --no-gradient-accumulation-fusion --disable-bias-linear "
              "--group-query-attention --num-query-groups 8 --bf16 --num-layers-per-virtual-pipeline-stage 5")


def test_a_megatron_argument_list_reads_as_the_script_writes_it():
    run = read_megatron_args(LLAMA2_70B)
    cfg = run.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads, cfg.vocab_size) == (80, 8192, 8, 32000)
    o = run.layout(32)
    assert (o["tp"], o["pp"], o["vpp"], o["micro_batches"]) == (8, 4, 4, 1024)
    assert o["sequence_parallel"] and o["mc2"] and o["fuse_vector"] and o["flash_attention"]
    assert o["precision"] == "bf16" and o["fp32_grads"] and o["grad_accumulation_fusion"] is False
    # one string of a shell script, line ends and all; recomputation as Megatron's arguments give it
    block = read_megatron_args("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \\\n"
                               " --tokenizer-type GPT2BPETokenizer --recompute-granularity full "
                               "--recompute-method block --recompute-num-layers 1 --fp16")
    assert block.config.model_type == "gpt2" and block.config.vocab_size == 50304   # padded to 128
    assert (block.options["recompute"], block.options["recompute_layers"]) == ("full", 1)
    with pytest.raises(MegatronArgsError, match="vocabulary"):
        read_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                           "--tokenizer-type PretrainedFromHF")
    with pytest.raises(MegatronArgsError, match="multiple"):
        run.layout(36)


def test_a_deepspeed_config_sets_the_zero_stage_precision_and_buckets(tmp_path):
    doc = {"train_micro_batch_size_per_gpu": "auto", "fp16": {"enabled": "auto"},
           "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(doc))
    o = read_deepspeed_config(path, trainer={"per_device_train_batch_size": 1, "fp16": True})
    assert o["zero"] == 2 and o["precision"] == "fp16" and o["overlap_grad_reduce"]
    assert o["bucket_mb"] == pytest.approx(5e8 * 2 / 2 ** 20)
    with pytest.raises(DeepSpeedConfigError, match="offload_optimizer"):
        read_deepspeed_config({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})
    with pytest.raises(DeepSpeedConfigError, match="auto"):
        read_deepspeed_config(doc)


def test_layout_arguments_name_their_rule():
    with pytest.raises(TrainConfigError, match="multiple of tp x pp x cp"):
        simulate_step(CFG, _ids(), cards=6, tp=2, pp=2)
    with pytest.raises(TrainConfigError, match="interleaved"):
        simulate_step(CFG, _ids(), cards=2, pp=2, vpp=2, micro_batches=3)
    with pytest.raises(TrainConfigError, match="distributed optimizer"):
        simulate_step(CFG, _ids(), cards=2, zero=1, distributed_optimizer=True)
    with pytest.raises(TrainConfigError, match="repeated blocks"):
        simulate_step(_llama(layers=2), _ids(), cards=4, pp=4)
