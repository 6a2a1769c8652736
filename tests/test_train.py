"""Training steps on the simulated NPU (pypto_lab.train): the joint graph's kernels, data parallel,
checkpointing, mixed precision, memory and the step's numerics."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pypto_lab.train import HBMCapacityError, TrainCaptureError, TrainConfigError, distributed, simulate_step
from pypto_lab.train.numerics import step_gradients

F = nn.functional


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def _batch(b=8, hw=16):
    return torch.randn(b, 3, hw, hw), torch.randint(0, 10, (b,))


def _ops(report, phase):
    return [k.spec.op for k in report.kernels if k.phase == phase and hasattr(k.spec, "op")]


def test_a_convolution_gets_its_two_gradient_convolutions_and_the_first_layer_only_one():
    rep = simulate_step(_cnn(), _batch(), F.cross_entropy, optimizer="sgd")
    back = [k.spec for k in rep.kernels if k.phase == "backward"]
    dgrad = [s for s in back if s.op == "Conv2DBackpropInput"]
    wgrad = [s for s in back if s.op == "Conv2DBackpropFilter"]
    # the first convolution's input is the batch, which needs no gradient: one dgrad for two convolutions
    assert len(wgrad) == 2 and len(dgrad) == 1
    # the weight gradient of conv 2 as CANN runs it: the input's im2col rows (load3d) against the
    # output gradient, M = C_in*kh*kw, N = C_out, the reduction over N*H*W split over the cores by
    # whole samples (`filter_batch_split`: the batch of 8 in 8 parts, each adding into the fp32 output)
    assert (wgrad[0].batch, wgrad[0].m, wgrad[0].k, wgrad[0].n) == (8, 16 * 9, 16 * 16, 16)
    assert wgrad[0].im2col.along_k and wgrad[0].out_dtype == "fp32"
    # the input gradient of conv 2: M = N*H*W, K = C_out*kh*kw, N = C_in
    assert (dgrad[0].m, dgrad[0].k, dgrad[0].n) == (8 * 16 * 16, 16 * 9, 16)
    # training BatchNorm is CANN's reduce + update pair, and its backward the two gradient kernels
    assert _ops(rep, "forward").count("BNTrainingReduce") == 2
    assert {"BNTrainingUpdateGrad", "BNTrainingReduceGrad"} <= set(_ops(rep, "backward"))
    assert rep.backward_ms > rep.forward_ms > 0 and rep.optimizer_ms > 0


def test_a_linear_layer_costs_one_matmul_forward_and_two_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    rep = simulate_step(model, (torch.randn(64, 256), torch.randint(0, 10, (64,))), F.cross_entropy)
    assert _ops(rep, "forward").count("MatMulV2") == 2
    # dX and dW for the second layer, only dW for the first (its input is the batch)
    assert _ops(rep, "backward").count("MatMulV2") == 3


def test_data_parallel_buckets_overlap_the_backward_and_accumulation_skips_inner_all_reduces():
    model, batch = _cnn(), _batch()
    one = simulate_step(model, batch, F.cross_entropy, cards=1)
    eight = simulate_step(model, batch, F.cross_entropy, cards=8, bucket_mb=0.001)
    assert one.comm_ms == 0 and not one.buckets
    assert eight.comm_ms > 0 and 0 <= eight.exposed_comm_ms <= eight.comm_ms
    assert len(eight.buckets) > 1
    for b in eight.buckets:   # a bucket starts once its gradients exist and the previous one is done
        assert b.start_us >= b.ready_us
    assert all(a.end_us <= b.start_us + 1e-9 for a, b in zip(eight.buckets, eight.buckets[1:]))
    assert eight.samples_per_s > one.samples_per_s
    acc = simulate_step(model, batch, F.cross_entropy, cards=8, bucket_mb=0.001, grad_accum=4)
    micro = acc.forward_ms + acc.backward_ms
    assert acc.step_ms == pytest.approx(4 * micro + acc.exposed_comm_ms + acc.optimizer_ms)
    assert acc.global_batch == 8 * 8 * 4


def test_checkpointing_trades_recomputation_for_activation_memory():
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
                             for _ in range(4)])
    model = nn.Sequential(nn.Linear(64, 512), blocks, nn.Linear(512, 10))
    batch = (torch.randn(256, 64), torch.randint(0, 10, (256,)))
    plain = simulate_step(model, batch, F.cross_entropy)
    ckpt = simulate_step(model, batch, F.cross_entropy, checkpoint=True)
    assert ckpt.memory["activations"] < plain.memory["activations"]
    assert ckpt.recompute_ms > 0 and ckpt.backward_ms > plain.backward_ms
    assert any("checkpointing" in n for n in ckpt.notes)


def test_mixed_precision_levels_change_the_kernels():
    model, batch = _cnn(), _batch()
    o1 = simulate_step(model, batch, F.cross_entropy, amp="O1")
    o2 = simulate_step(model, batch, F.cross_entropy, amp="O2")
    bf = simulate_step(model, batch, F.cross_entropy, precision="bf16", amp="O2")
    fp32 = simulate_step(model, batch, F.cross_entropy, precision="fp32")
    names = {r.amp: [k.name for k in r.kernels] for r in (o1, o2)}
    assert any(n.startswith("Cast(to half)") for n in names["O1"])          # O1 casts around the Cube
    assert not any(n.startswith("Cast(to half)") for n in names["O2"])
    assert "CastMasterToHalf" in names["O2"] and "master weights" in o2.memory
    assert "CheckOverflow" in names["O2"]                                   # fp16 scales the loss
    assert "CheckOverflow" not in [k.name for k in bf.kernels]               # bf16 does not
    assert fp32.amp == "O0" and all(getattr(k.spec, "dtype", "fp32") == "fp32" for k in fp32.kernels)


def test_a_step_that_does_not_fit_names_the_largest_batch():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
        batch = (torch.randn(4_000_000, 4096), torch.zeros(4_000_000, dtype=torch.long))
    with pytest.raises(HBMCapacityError, match=r"Fix: batch <= \d+"):   # shapes only: the meta device holds no data
        simulate_step(model, batch, lambda out, t: -out.log_softmax(-1).gather(1, t[:, None]).mean())


def test_bad_arguments_name_the_rule():
    model, batch = _cnn(), _batch()
    with pytest.raises(TrainConfigError, match="optimizer"):
        simulate_step(model, batch, F.cross_entropy, optimizer="lamb")
    with pytest.raises(TrainConfigError, match="opt level"):
        simulate_step(model, batch, F.cross_entropy, amp="O3")
    with pytest.raises(TrainConfigError, match="bucket"):
        simulate_step(model, batch, F.cross_entropy, bucket_mb=0)
    with pytest.raises(TrainCaptureError, match="needs loss_fn"):
        simulate_step(model, batch)
    with pytest.raises(TrainCaptureError, match="labels"):
        simulate_step(model, {"x": batch[0]})


def test_ddp_as_the_seed_writes_it_sets_cards_and_bucket_size():
    torch_init = nn.parallel.DistributedDataParallel.__init__
    distributed.init_process_group(backend="hccl", world_size=8)
    try:
        local_rank = distributed.local_rank()
        ddp = nn.parallel.DistributedDataParallel(_cnn(), device_ids=[local_rank], broadcast_buffers=False,
                                                  bucket_cap_mb=10)
        assert ddp.simulated_device_ids == [0]
        rep = simulate_step(ddp, _batch(), F.cross_entropy)
        assert rep.cards == 8 and rep.bucket_mb == pytest.approx(10)
    finally:
        distributed.destroy_process_group()
    assert distributed.get_world_size() == 1
    assert nn.parallel.DistributedDataParallel.__init__ is torch_init   # torch's own constructor is back
    with pytest.raises(distributed.DistributedConfigError, match="backend"):
        distributed.init_process_group(backend="nccl")


def test_the_chrome_trace_has_a_compute_and_a_communication_lane(tmp_path):
    rep = simulate_step(_cnn(), _batch(), F.cross_entropy, cards=8, bucket_mb=0.001)
    path = tmp_path / "step.json"
    rep.chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["tid"] for e in events if e["ph"] == "X"}
    assert lanes == {0, 1}
    cats = {e["cat"] for e in events if e["ph"] == "X"}
    assert {"forward", "backward", "optimizer", "comm"} <= cats
    d = rep.to_dict()
    assert d["topology"] and d["topology"] in " ".join(rep.notes)    # the server preset the 8 cards sit in
    assert simulate_step(_cnn(), _batch(), F.cross_entropy).topology == ""
    for key in ("step_ms", "samples_per_s", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms",
                "exposed_comm_ms", "peak_hbm_bytes"):
        assert d[key] >= 0


def test_mixed_precision_gradients_match_autograd_within_half_precision_error():
    model, (x, y) = _cnn(), _batch()
    loss = F.cross_entropy(model(x), y)
    model.zero_grad()
    loss.backward()
    ref = {k: p.grad.clone() for k, p in model.named_parameters()}
    scale = max(g.abs().max() for g in ref.values())
    for precision, amp, tol in (("fp32", "O0", 1e-6), ("fp16", "O1", 2e-2), ("fp16", "O2", 2e-2)):
        got_loss, grads = step_gradients(model, (x, y), F.cross_entropy, precision=precision, amp=amp)
        assert float(got_loss) == pytest.approx(float(loss), rel=1e-2)
        worst = max(float((grads[k] - ref[k]).abs().max()) for k in ref) / float(scale)
        assert worst < tol, (amp, worst)
    _, o2 = step_gradients(model, (x, y), F.cross_entropy, precision="fp16", amp="O2")
    assert any(not torch.equal(o2[k], ref[k]) for k in ref)   # half precision does change the numbers


def test_a_causal_lm_config_trains_on_the_meta_device_and_reports_tokens():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)
    ids = torch.randint(0, 1000, (2, 64))
    rep = simulate_step(cfg, {"input_ids": ids, "labels": ids})
    assert rep.tokens_per_s == pytest.approx(rep.samples_per_s * 64)
    assert rep.largest_batch >= 2


def test_tensor_parallelism_splits_the_blocks_and_adds_their_all_reduces():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=8, vocab_size=1000)
    ids = torch.randint(0, 1000, (2, 128))
    batch = {"input_ids": ids, "labels": ids}
    dp = simulate_step(cfg, batch, cards=4, tp=1)
    tp = simulate_step(cfg, batch, cards=4, tp=4)
    assert tp.tp_comm_ms > 0 and dp.tp_comm_ms == 0
    assert tp.memory["weights"] < dp.memory["weights"]            # block weights are split over the group
    assert tp.global_batch == 2 and dp.global_batch == 8         # one replica of 4 cards against 4 replicas
    gemms = lambda r: sum(k.spec.m * k.spec.k * k.spec.n * k.spec.batch for k in r.kernels  # noqa: E731
                          if k.phase == "forward" and k.spec.__class__.__name__ == "CubeKernel")
    assert gemms(tp) < gemms(dp)
    with pytest.raises(TrainConfigError, match="divide"):
        simulate_step(cfg, batch, cards=4, tp=3)
    with pytest.raises(TrainConfigError, match="transformers config"):
        simulate_step(_cnn(), _batch(), F.cross_entropy, cards=2, tp=2)


def test_a_slow_loader_starves_the_npu_and_the_report_says_so():
    from pypto_lab.train.data import NPUDataLoader

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            import time
            time.sleep(0.01)   # 10 ms of host work per sample: far longer than the tiny model's step
            return torch.randn(3, 16, 16), i % 10

    rep = simulate_step(_cnn(), _batch(), F.cross_entropy, loader=NPUDataLoader(Slow(), batch_size=8))
    assert rep.data_wait_ms > 0 and "data not ready" in " ".join(rep.notes)
    assert rep.step_ms == pytest.approx(rep.loader.feed_ms)


def test_quantisation_aware_training_costs_its_fake_quantisation():
    from pypto_lab.precision.quantization import prepare_qat

    model, batch = _cnn(), _batch()
    qat = prepare_qat(model)
    qat.train()
    qat(batch[0])   # the observers see one batch, as the first training step would
    plain = simulate_step(model, batch, F.cross_entropy)
    rep = simulate_step(qat, batch, F.cross_entropy)
    fq = [k for k in rep.kernels if k.spec.op.startswith("FakeQuant")]
    n_layers = sum(1 for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert len([k for k in fq if k.phase == "forward"]) == 2 * n_layers      # input and weight of each layer
    assert len([k for k in fq if k.phase == "backward"]) == 2 * n_layers
    assert rep.step_ms > plain.step_ms and any("quantisation-aware" in n for n in rep.notes)
    # the model the user holds keeps its fake-quantising layers after the capture
    assert sum(type(m).__name__ == "ObservedModule" for m in qat.modules()) == n_layers


def test_flash_attention_keeps_the_scores_off_hbm_and_fuses_the_attention():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)
    ids = torch.randint(0, 1000, (2, 512))
    batch = {"input_ids": ids, "labels": ids}
    plain = simulate_step(cfg, batch, flash_attention=False, fuse_vector=False)
    flash = simulate_step(cfg, batch, flash_attention=True, fuse_vector=False)
    fused = [k for k in flash.kernels if k.spec.__class__.__name__ == "AttentionKernel"]
    assert len([k for k in fused if k.phase == "forward"]) == 2                 # one per layer
    back = [k for k in fused if k.phase == "backward"]
    assert len(back) == 2 and all(k.spec.backward for k in back)               # FlashAttentionScoreGrad, one per layer
    assert not any(k.spec.op == "SoftmaxV2" for k in flash.kernels if hasattr(k.spec, "op"))
    assert flash.memory["activations"] < plain.memory["activations"]
    assert flash.step_ms < plain.step_ms


def _llama_batch(seq=128):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=8, vocab_size=1000)
    ids = torch.randint(0, 1000, (2, seq))
    return cfg, {"input_ids": ids, "labels": ids}


def test_a_causal_lm_takes_its_batch_as_its_forward_does():
    """input_ids alone, a tuple bound to forward's parameters, or a dict: the labels are the inputs
    (transformers shifts them inside the model), and anything else is refused with the rule."""
    transformers = pytest.importorskip("transformers")
    cfg, batch = _llama_batch(seq=64)
    ids = batch["input_ids"]
    ref = simulate_step(cfg, {"input_ids": ids, "labels": ids}).step_ms
    assert simulate_step(cfg, ids).step_ms == ref
    assert simulate_step(cfg, (ids, torch.ones_like(ids))).step_ms == ref
    assert simulate_step(cfg, {"input_ids": ids}).step_ms == ref
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)   # a module, not a config: the same batch forms
    assert simulate_step(model, ids).step_ms == simulate_step(model, {"input_ids": ids, "labels": ids}).step_ms
    with pytest.raises(TrainCaptureError, match=r"input_ids is a \(2, 64\) torch.float32 tensor.*Rule: a causal LM"):
        simulate_step(cfg, ids.float())
    with pytest.raises(TrainCaptureError, match="example_batch of type str.*Fix: torch.randint"):
        simulate_step(cfg, "the cat sat")
    with pytest.raises(TrainCaptureError, match="input_ids is missing"):
        simulate_step(model, {"attention_mask": ids})


def test_vector_fusion_runs_an_rmsnorm_as_one_kernel_and_writes_what_the_backward_reads():
    cfg, batch = _llama_batch()
    eager = simulate_step(cfg, batch, fuse_vector=False)
    fused = simulate_step(cfg, batch)   # a config-built causal LM trains fused, as MindSpeed does
    assert fused.fuse_vector and not eager.fuse_vector and fused.to_dict()["fuse_vector"]
    vec = lambda r, phase: [k for k in r.kernels if k.phase == phase and type(k.spec).__name__ == "VectorKernel"]  # noqa: E731
    for phase in ("forward", "backward"):
        assert len(vec(fused, phase)) < len(vec(eager, phase)) / 2
        assert sum(k.time_us for k in vec(fused, phase)) < sum(k.time_us for k in vec(eager, phase))
    # RMSNorm's pow, mean, add eps, rsqrt and the two multiplies: one forward kernel
    norms = [k.spec for k in vec(fused, "forward") if {"ReduceMean", "Rsqrt"} <= set(k.spec.op.split("+"))]
    assert norms and all(s.row_len == 256 for s in norms)
    # the backward reads the norm's rsqrt and normalised input: the fused kernel writes them too, so
    # it moves more than one read and one write
    assert all(s.inputs >= 2 for s in norms)
    # matmuls and attention are untouched
    cube = lambda r: [(k.phase, k.spec) for k in r.kernels if type(k.spec).__name__ != "VectorKernel"]  # noqa: E731
    assert cube(fused) == cube(eager)
    assert any("Vector fusion" in n for n in fused.notes)


def test_mc2_hides_tensor_parallel_collectives_under_their_matmuls():
    cfg, batch = _llama_batch()
    from pypto_lab import get_stack

    device_bound = get_stack("mindspeed").with_values(dispatch_us=0.0)   # the collectives on the critical path
    plain = simulate_step(cfg, batch, cards=4, tp=4, sequence_parallel=True, stack=device_bound)
    mc2 = simulate_step(cfg, batch, cards=4, tp=4, sequence_parallel=True, mc2=True, stack=device_bound)
    assert 0 < mc2.tp_comm_ms < plain.tp_comm_ms
    # every collective still costs at least its own time over tp chunks beyond its matmul
    assert mc2.tp_comm_ms >= plain.tp_comm_ms / 4 - 1e-9
    # only the collectives change
    assert mc2.step_ms == pytest.approx(plain.step_ms - (plain.tp_comm_ms - mc2.tp_comm_ms))
    with pytest.raises(TrainConfigError, match="mc2 = True: MC2 fuses tensor-parallel collectives"):
        simulate_step(cfg, batch, cards=4, tp=1, mc2=True)


def test_fused_chains_keep_every_kernel_after_the_kernels_it_reads():
    """Fusion may hold a chain open past a matmul it does not feed, never past a reader."""
    from pypto_lab.hw import get_chip
    from pypto_lab.lowering.fusion import VECTOR_CHAINS, fuse_vector_chains
    from pypto_lab.train import capture_step, policy_of
    from pypto_lab.train.capture import JointChains
    from pypto_lab.train.step import lower_node

    class Block(nn.Module):
        def __init__(self, d=64):
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))
            self.gate, self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w   # RMSNorm
            return x + self.down(F.silu(self.gate(h)) * self.up(h))                  # SwiGLU + residual

    model = nn.Sequential(Block(), Block(), nn.Linear(64, 10))
    step = capture_step(model, (torch.randn(32, 64), torch.randint(0, 10, (32,))), F.cross_entropy)
    policy, chip = policy_of("fp16", None), get_chip("Ascend910B1")
    chains = JointChains(step)
    for nodes in (step.forward, step.backward):
        items = [(n, lower_node(n, chip, policy)[0], False) for n in nodes]
        units = fuse_vector_chains(items, chains, VECTOR_CHAINS)
        assert sorted(n.name for u in units for n in u[0]) == sorted(n.name for n in nodes)   # nothing lost
        done: set = set()
        for covered, _ in units:
            for n in covered:
                for a in n.all_input_nodes:
                    a = step.base.get(a, a)
                    assert a not in nodes or a in done or a in covered, f"{n.name} runs before {a.name}"
            done |= set(covered)
    fused = [u for u in fuse_vector_chains([(n, lower_node(n, chip, policy)[0], False) for n in step.forward],
                                           chains, VECTOR_CHAINS) if len(u[0]) > 1]
    assert any("Swish" in s.op and "Mul" in s.op for _, specs in fused for s in specs)   # SwiGLU is one kernel


def test_sequence_parallel_splits_the_blocks_backward_vector_work_like_their_forward():
    cfg, batch = _llama_batch()
    rep = simulate_step(cfg, batch, cards=4, tp=4, sequence_parallel=True)
    swiglu = next(k.spec for k in rep.kernels if k.phase == "forward" and k.spec.op == "Swish+Mul")
    silu_grad = next(k.spec for k in rep.kernels if k.phase == "backward" and "Sub" in k.spec.op.split("+"))
    assert silu_grad.numel == swiglu.numel == 2 * 128 * 688 // 4


def test_tied_embeddings_train_and_count_once():
    """BERT pre-training ties the decoder to the word embeddings (and its bias to predictions.bias):
    AOT autograd refuses tied names on its own (pytorch#101192); the step traces, every use's
    gradient is computed, and the weights count once."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
    model = transformers.BertForPreTraining(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    rep = simulate_step(model, {"input_ids": ids, "labels": ids, "next_sentence_label": torch.zeros(2, dtype=torch.long)},
                        precision="fp32")
    unique = sum(p.numel() for p in model.parameters())          # named_parameters drops the tied duplicates
    assert rep.memory["weights"] == unique * 4
    assert any("tied parameters counted once" in n for n in rep.notes)
    # the model the user holds is still tied and trainable
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert all(p.requires_grad for p in model.parameters())
    # the output projection's two gradient GEMMs (its input's and its tied weight's) are in the graph,
    # and the embedding's scatter-add of the same tied weight
    vocab_grads = [k for k in rep.kernels if k.phase == "backward" and type(k.spec).__name__ == "CubeKernel"
                   and cfg.vocab_size in (k.spec.m, k.spec.k, k.spec.n)]
    assert len(vocab_grads) == 2
    assert any(k.spec.op == "UnsortedSegmentSum" for k in rep.kernels if k.phase == "backward")
