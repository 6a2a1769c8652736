"""Training steps against published Ascend training throughput (``datasets/published_training/``).

Every row of ``published_training.csv`` is simulated with `pypto_lab.train.simulate_step` in the
configuration its source states, and compared per card: images or samples per second per card, or
tokens per second per card. The configuration comes from the row and the script it names:

* ModelZoo-PyTorch CNNs: torchvision's model, the script's batch per card, apex O2 fp16, SGD with
  momentum, torch DDP (25 MB buckets) on the row's cards; 224 x 224 crops;
* ModelZoo-PyTorch BERT (SQuAD fine-tuning): `BertForQuestionAnswering` at the script's batch and
  384 tokens, apex O2, Adam;
* ModelZoo-PyTorch GPT-2 345M (Megatron-DeepSpeed): the script's Megatron arguments, read by
  `pypto_lab.train.megatron_args` (``--checkpoint-activations``, ``--fp16``, DeepSpeed ZeRO stage 0);
* ModelZoo-PyTorch ChatGLM2-6B: the model's published config.json as a Llama-architecture config
  (same shapes), the script's DeepSpeed JSON read by `pypto_lab.train.deepspeed_config` (ZeRO-2,
  fp16), batch 1 of 8,192 tokens, HF's gradient checkpointing (full recomputation), torch's SDPA
  run fused by torch_npu;
* MindSpore model zoo: ResNet-50 / ResNet-101 and BERT-base pre-training as the README's tables
  give them; NEZHA-large as BERT-large with NEZHA's functional relative positions (two more
  batched matmuls per attention);
* ModelLink: each example script's Megatron arguments (`pypto_lab.train.megatron_args`), as
  quoted in `SCRIPTS` below with the script's TP and PP values filled in.

Published per-card figures: ModelZoo-PyTorch FPS is for the whole job (its scripts compute batch x
cards / step time), so an 8p figure is divided by 8; MindSpore publishes ms/step (per card: batch
per card / step time); ModelLink and ChatGLM2 publish tokens/s per card; Megatron's samples/s is the
whole job's.

Nothing in the simulator is fitted to any row: no constant is estimated from these figures, so
leaving a model's rows out changes no prediction and the leave-one-model-out errors are the errors.
The rows the dataset's README keeps back are marked held back. A row runs only if its step fits
the card's HBM in the stated configuration (`simulate_step` raises `HBMCapacityError` otherwise,
and the row is listed as not run with the message).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..files.paths import DATASETS_DIR
from ..stack import DEFAULT_LLM_TRAIN_STACK, DEFAULT_TRAIN_STACK
from ..train import simulate_step
from ..train.deepspeed_config import read_deepspeed_config
from ..train.host_input import ImagePipeline
from ..train.megatron_args import read_megatron_args
from .compare import Comparison

DATA = DATASETS_DIR / "published_training" / "published_training.csv"
HELD_OUT = {("resnet50", "PyTorch", 8), ("bert-large", "PyTorch", 8), ("resnet101", "MindSpore", 8),
            ("llama-2-13b", "ModelLink", 8)}
F = torch.nn.functional

# The cost-relevant arguments of each ModelLink example script (aeeeeeep/ModelLink, GitHub mirror of
# gitee ascend/ModelLink), with the script's TP and PP filled in; left out: learning rate, data,
# tokenizer paths, checkpoints, logging. Llama-3's tokenizer (PretrainedFromHF) gives no vocabulary
# size here: --vocab-size 128256 is Meta-Llama-3-8B's config.json vocab_size (the script's
# --make-vocab-size-divisible-by 16032 x TP 8 pads it to exactly that).
_LLAMA = ("--tokenizer-type Llama2Tokenizer --make-vocab-size-divisible-by 1 --untie-embeddings-and-output-weights "
          "--disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 --position-embedding-type rope "
          "--normalization RMSNorm --use-fused-rmsnorm --swiglu --use-flash-attn --no-masked-softmax-fusion "
          "--attention-softmax-in-fp32 --no-gradient-accumulation-fusion --bf16")
SCRIPTS = {
    ("llama-2-7b", "README.md"): (
        "examples/mcore/llama2/pretrain_llama2_7b_ptd.sh @ e79fc108 (TP=1 PP=2)",
        "--use-mcore-models --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --sequence-parallel "
        "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 --seq-length 4096 "
        "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 256 --use-distributed-optimizer "
        "--use-fused-swiglu --use-fused-rotary-pos-emb --overlap-grad-reduce " + _LLAMA),
    ("llama-2-13b", "README.md"): (
        "examples/mcore/llama2/pretrain_llama2_13b_ptd.sh @ e79fc108 (TP=8 PP=1)",
        "--use-mcore-models --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --sequence-parallel "
        "--num-layers 40 --hidden-size 5120 --ffn-hidden-size 13824 --num-attention-heads 40 --seq-length 4096 "
        "--max-position-embeddings 4096 --micro-batch-size 4 --global-batch-size 512 --use-fused-swiglu "
        "--use-fused-rotary-pos-emb --use-mc2 " + _LLAMA),
    ("llama-2-70b", "README.md"): (
        "examples/mcore/llama2/pretrain_llama2_70b_ptd.sh @ a2552c6a (TP=8 PP=4, 4 nodes)",
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --use-mcore-models "
        "--use-mc2 --use-fused-swiglu --use-fused-rotary-pos-emb --num-layers 80 --hidden-size 8192 "
        "--ffn-hidden-size 28672 --num-attention-heads 64 --seq-length 4096 --max-position-embeddings 4096 "
        "--micro-batch-size 1 --global-batch-size 1024 --group-query-attention --num-query-groups 8 "
        "--num-layers-per-virtual-pipeline-stage 5 " + _LLAMA),
    ("llama-3-8b", "README.md"): (
        "examples/mcore/llama3/pretrain_llama3_8b_ptd.sh @ ec8b3049 (TP=8 PP=1)",
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --use-mcore-models --micro-batch-size 2 "
        "--global-batch-size 64 --sequence-parallel --use-mc2 --use-flash-attn --use-fused-rotary-pos-emb "
        "--use-fused-rmsnorm --use-fused-swiglu --tokenizer-type PretrainedFromHF --vocab-size 128256 "
        "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
        "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
        "--make-vocab-size-divisible-by 16032 --untie-embeddings-and-output-weights --disable-bias-linear "
        "--attention-dropout 0.0 --hidden-dropout 0.0 --position-embedding-type rope --rotary-base 500000 "
        "--normalization RMSNorm --norm-epsilon 1e-5 --swiglu --no-masked-softmax-fusion "
        "--attention-softmax-in-fp32 --no-gradient-accumulation-fusion --bf16"),
    ("llama-2-7b", "examples/llama2/README.md"): (
        "examples/llama2/pretrain_llama2_7b_ptd.sh @ ce01706c (TP=8 PP=1; legacy ModelLink)",
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --sequence-parallel --num-layers 32 "
        "--hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 --seq-length 4096 "
        "--max-position-embeddings 4096 --micro-batch-size 4 --global-batch-size 16 " + _LLAMA),
}
# Ascend/ModelZoo-PyTorch PyTorch/built-in/nlp/GPT-2_for_PyTorch: the shared Megatron options of
# test/train_performance_8p.sh @ 34b76de8 (the case blocks give TP, PP, the batches; the CSV row's notes quote
# the 345M_without_mp case of the script @ 604bebc47), DeepSpeed with ZERO_STAGE=0
_GPT2 = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings "
         "1024 --tokenizer-type GPT2BPETokenizer --fp16 --attention-dropout 0.0 --hidden-dropout 0.0 "
         "--checkpoint-activations --deepspeed --zero-stage 0 --deepspeed-activation-checkpointing")
GPT2 = {"345M_without_mp": "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --micro-batch-size 8 "
                           "--global-batch-size 64 " + _GPT2,
        "345M": "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --micro-batch-size 4 "
                "--global-batch-size 16 " + _GPT2}
# Ascend/ModelZoo-PyTorch PyTorch/built-in/foundation/ChatGLM2-6B/ptuning/deepspeed.json @ 5fede699
CHATGLM2_DEEPSPEED = {
    "train_micro_batch_size_per_gpu": "auto", "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
             "hysteresis": 2, "min_loss_scale": 1},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                          "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                          "contiguous_gradients": True}}

# The ModelZoo-PyTorch CNN rows' image loaders as their scripts configure them (Ascend/ModelZoo-PyTorch
# @05360171, PyTorch/built-in/cv/classification/...): the training processes divide --workers by the
# cards ((workers + n - 1) // n), every loader is torchvision's ImageFolder with RandomResizedCrop(224) and
# RandomHorizontalFlip, on the 192-core Atlas 800 host (`pypto_lab.train.host_input`).
_R50 = "ResNet50_for_PyTorch/"
_MBV2 = "MobileNetV2_for_PyTorch/"
_DN = "Densenet121_for_PyTorch/"
IMAGE_PIPELINES = {
    # test/train_performance_1p.sh: workers=64 into pytorch_resnet50_apex.py: ToTensor + Normalize in the
    # workers, DataLoader(..., pin_memory=True), images.to(npu, non_blocking=True)
    ("resnet50", 1): ImagePipeline(workers=64, processes=1, normalize_on_device=False, pin_memory=True,
                                   source=_R50 + "test/train_performance_1p.sh, pytorch_resnet50_apex.py"),
    # test/train_performance_8p.sh: workers=128 into DistributedResnet50/main_apex_d76_npu.py: 8 processes
    # of 16 workers, NVIDIA's uint8 loader, images.to(npu).to(torch.float).sub(mean).div(std) on the NPU
    ("resnet50", 8): ImagePipeline(workers=16, processes=8, normalize_on_device=True, pin_memory=True,
                                   source=_R50 + "test/train_performance_8p.sh, DistributedResnet50/main_apex_d76_npu.py"),
    # test/train_performance_1p.sh and _8p.sh: --workers 128 into train/mobilenetv2_8p_main_anycard.py:
    # fast_collate (uint8), MultiEpochsDataLoader(pin_memory=True), normalised on the NPU
    ("mobilenet_v2", 1): ImagePipeline(workers=128, processes=1, normalize_on_device=True, pin_memory=True,
                                       source=_MBV2 + "test/train_performance_1p.sh, train/mobilenetv2_8p_main_anycard.py"),
    ("mobilenet_v2", 8): ImagePipeline(workers=16, processes=8, normalize_on_device=True, pin_memory=True,
                                       source=_MBV2 + "test/train_performance_8p.sh, train/mobilenetv2_8p_main_anycard.py"),
    # test/train_performance_1p.sh: --workers 40 into densenet121_1p_main.py: ToTensor + Normalize in the
    # workers, pin_memory=True
    ("densenet121", 1): ImagePipeline(workers=40, processes=1, normalize_on_device=False, pin_memory=True,
                                      source=_DN + "test/train_performance_1p.sh, densenet121_1p_main.py"),
    # test/train_performance_8p.sh: --workers 160, each process bound by taskset to 24 cores, into
    # densenet121_8p_main.py: 20 workers, ToTensor + Normalize in the workers, pin_memory=False
    ("densenet121", 8): ImagePipeline(workers=20, processes=8, cores_per_process=24, normalize_on_device=False,
                                      pin_memory=False,
                                      source=_DN + "test/train_performance_8p.sh, densenet121_8p_main.py"),
}


@dataclass
class Case:
    key: str
    framework: str
    chip: str
    cards: int
    batch: int
    seq: int | None
    published_per_card: float
    unit: str
    source: str
    source_path: str
    notes: str
    simulated_per_card: float = 0.0
    skipped: str = ""
    setup: str = ""
    peak_gib: float = 0.0
    detail: dict = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.simulated_per_card / self.published_per_card - 1

    @property
    def held_out(self) -> bool:
        return (self.key, self.framework, self.cards) in HELD_OUT


def _int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _framework(row) -> str:
    f = row["framework"]
    return "MindSpore" if "MindSpore" in f else ("ModelLink" if "ModelLink" in row["source_repo"]
                                                 else ("Megatron" if "Megatron" in f else "PyTorch"))


def _chip(row) -> str:
    # ModelZoo and MindSpore rows: "Ascend 910" of 2021-2023, the 910A; ModelLink's Atlas 900 A2 PODc is a
    # 910B cluster whose bin is not stated: the 910B2 preset (Atlas 800T A2's training bin) stands for it, as
    # for a row trained in bf16 (the 910A's Cube has no bf16: the legacy ModelLink table's "8 x Ascend NPUs").
    # ChatGLM2-6B's chip is not stated (torch 2.1, late 2023; its sibling README lists Atlas 800T A2 firmware)
    b = "A2" in row["chip"] or row["model"].startswith("chatglm2") or row["precision"].strip() == "bf16"
    return "Ascend910B2" if b else "Ascend910A"


def _per_card(row, cards: int, batch: int) -> tuple[float, str]:
    value, unit = float(row["throughput"]), row["unit"]
    if unit.startswith("ms/step"):
        return batch / (value / 1e3), "samples/s/card"
    if unit.startswith("tokens"):
        return value, "tokens/s/card"
    return value / cards, "samples/s/card"   # ModelZoo FPS and Megatron samples/s: the whole job's


def cases() -> list[Case]:
    out = []
    with open(DATA, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            key = row["model"].split()[0].split("(")[0].strip().rstrip(",")
            cards = _int(row["cards"]) or 1
            batch = _int(row["batch_per_card"]) or 1
            per_card, unit = _per_card(row, cards, batch)
            c = Case(key=key, framework=_framework(row), chip=_chip(row), cards=cards, batch=batch,
                     seq=_int(row["seq_len"]), published_per_card=per_card, unit=unit,
                     source=f"{row['source_repo']}/{row['source_path']}", source_path=row["source_path"],
                     notes=row["notes"])
            c.detail["model"] = row["model"]
            out.append(c)
    return out


def _nezha(hidden=1024, layers=24, heads=16, inter=4096, seq=128):
    """BERT-large with NEZHA's functional relative positions (Wei et al. 2019, section 3.2): each
    attention adds the query's dot product with a fixed sinusoidal embedding of the key's clipped
    relative position to the scores, and the probabilities' weighted sum of those embeddings to the
    context: two batched matmuls more per attention, against an s x s x head-size table."""
    import transformers
    from torch import nn

    cfg = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                  intermediate_size=inter, vocab_size=21128, max_position_embeddings=512)
    model = transformers.BertForPreTraining(cfg)
    d = hidden // heads

    class RelativeSelfAttention(nn.Module):
        def __init__(self, old):
            super().__init__()
            self.query, self.key, self.value = old.query, old.key, old.value
            pos = torch.arange(seq)
            rel = (pos[None, :] - pos[:, None]).clamp(-64, 64).float()
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
            ang = rel[..., None] * inv
            self.register_buffer("table", torch.cat([ang.sin(), ang.cos()], -1), persistent=False)   # s x s x d

        def forward(self, hidden_states, attention_mask=None, **kw):
            b, s, _ = hidden_states.shape
            q, k, v = (t(hidden_states).view(b, s, heads, d).transpose(1, 2) for t in (self.query, self.key,
                                                                                          self.value))
            scores = q @ k.transpose(-1, -2)
            scores = scores + torch.einsum("bhid,ijd->bhij", q, self.table)
            probs = torch.softmax(scores / math.sqrt(d), -1)
            ctx = probs @ v + torch.einsum("bhij,ijd->bhid", probs, self.table)
            return ctx.transpose(1, 2).reshape(b, s, hidden), None

    for layer in model.bert.encoder.layer:
        layer.attention.self = RelativeSelfAttention(layer.attention.self)
    return model, cfg


def _chatglm2():
    """ChatGLM2-6B's shapes (THUDM/chatglm2-6b config.json: 28 layers, hidden 4,096, 32 heads of 128 with 2
    key/value groups, SwiGLU of 13,696, RMSNorm, rotary positions, bias on q/k/v only, untied output of
    65,024) as a Llama-architecture config."""
    import transformers

    return transformers.LlamaConfig(hidden_size=4096, intermediate_size=13696, num_hidden_layers=28,
                                    num_attention_heads=32, num_key_value_heads=2, vocab_size=65024,
                                    tie_word_embeddings=False, attention_bias=True, max_position_embeddings=32768)


def simulate(c: Case):
    """The row's step (see the module docstring); returns (report, a one-line setup)."""
    import torchvision
    import transformers

    if c.key in ("resnet50", "resnet101", "mobilenet_v2", "densenet121"):
        model = getattr(torchvision.models, c.key)()
        batch = (torch.randn(c.batch, 3, 224, 224), torch.randint(0, 1000, (c.batch,)))
        pipe = IMAGE_PIPELINES.get((c.key, c.cards)) if c.framework == "PyTorch" else None
        rep = simulate_step(model, batch, F.cross_entropy, optimizer="sgd", chip=c.chip, cards=c.cards,
                            precision="fp16", amp="O2", image_pipeline=pipe)
        return rep, (f"torchvision {c.key}, batch {c.batch}/card, O2 fp16, SGD, DDP over {c.cards}"
                     + (f"; host input: {pipe.describe()}" if pipe else ""))
    if c.key in ("bert-base", "bert-large"):
        cfg = transformers.BertConfig() if c.key == "bert-base" else transformers.BertConfig(
            hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
        seq = c.seq or 128
        ids = torch.randint(0, cfg.vocab_size, (c.batch, seq))
        if c.framework == "MindSpore":   # pre-training: masked LM over the sequence + next sentence
            model = transformers.BertForPreTraining(cfg)
            batch = {"input_ids": ids, "labels": ids, "next_sentence_label": torch.zeros(c.batch, dtype=torch.long)}
        else:                            # SQuAD fine-tuning
            model = transformers.BertForQuestionAnswering(cfg)
            batch = {"input_ids": ids, "start_positions": torch.zeros(c.batch, dtype=torch.long),
                     "end_positions": torch.ones(c.batch, dtype=torch.long)}
        rep = simulate_step(model, batch, optimizer="adam", chip=c.chip, cards=c.cards, precision="fp16", amp="O2")
        return rep, f"{type(model).__name__} {c.key}, {c.batch} x {seq}/card, O2 fp16, Adam, DDP over {c.cards}"
    if c.key == "bert-nezha-large":
        model, cfg = _nezha(seq=c.seq or 128)
        ids = torch.randint(0, cfg.vocab_size, (c.batch, c.seq or 128))
        batch = {"input_ids": ids, "labels": ids, "next_sentence_label": torch.zeros(c.batch, dtype=torch.long)}
        rep = simulate_step(model, batch, optimizer="adam", chip=c.chip, cards=c.cards, precision="fp16", amp="O2")
        return rep, f"BERT-large + NEZHA relative positions, {c.batch} x {c.seq}/card, O2 fp16, Adam"
    if c.key == "gpt2-medium":
        case = "345M" if "PP=2" in c.detail["model"] else "345M_without_mp"
        run = read_megatron_args(GPT2[case])
        rep = run.simulate(c.cards, chip=c.chip)
        return rep, f"Megatron-DeepSpeed args of case {case}: {rep.layout.describe()}, fp16, recompute full"
    if c.key == "chatglm2-6b":
        ds = read_deepspeed_config(CHATGLM2_DEEPSPEED, dp=c.cards,
                                   trainer={"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
                                            "fp16": True})
        ds.pop("micro_batch_size")
        ids = torch.randint(0, 65024, (c.batch, c.seq))
        rep = simulate_step(_chatglm2(), {"input_ids": ids}, chip=c.chip, cards=c.cards, optimizer="adamw",
                            stack="torch_npu-eager", flash_attention=True, recompute="full", **ds)
        return rep, f"ChatGLM2-6B shapes, 1 x {c.seq}/card, DeepSpeed ZeRO-{ds['zero']} fp16, full recompute"
    script = SCRIPTS.get((c.key, c.source_path))
    if script is not None:
        where, argv = script
        rep = read_megatron_args(argv).simulate(c.cards, chip=c.chip)
        return rep, f"{where}: {rep.layout.describe()}"
    raise KeyError(c.key)


def _stack_of(c: Case) -> str:
    if c.framework == "ModelLink":
        return DEFAULT_LLM_TRAIN_STACK
    return DEFAULT_TRAIN_STACK


def training_set(tick: Callable[[], None] | None = None, only: set[str] | None = None) -> tuple[list[Comparison], list]:
    """Every training row as a `Comparison` (rows the workbench cannot set up carry the reason)."""
    out = []
    for c in cases():
        if only and c.key not in only:
            continue
        stack = _stack_of(c)
        mechanisms: tuple[str, ...] = ()
        if not c.skipped:
            try:
                rep, c.setup = simulate(c)
            except Exception as e:   # noqa: BLE001  (a row the workbench refuses is reported, not hidden)
                c.skipped = f"{type(e).__name__}: {str(e)[:300]}"
            else:
                c.peak_gib = rep.peak_hbm_bytes / 2 ** 30
                c.simulated_per_card = (rep.tokens_per_s / rep.cards if c.unit.startswith("tokens")
                                        else rep.global_batch / rep.cards * 1e3 / rep.step_ms)
                stack = rep.stack or stack
                mechanisms = (c.setup, f"peak HBM {c.peak_gib:.1f} GiB per card")
            if tick:
                tick()
        out.append(Comparison(set="training", regime="training throughput", model=c.key,
                              setup=f"{c.framework} {c.cards}x{c.chip} b{c.batch}" + (f" s{c.seq}" if c.seq else ""),
                              stack=stack, metric=c.unit, unit=c.unit, published=c.published_per_card,
                              source=c.source, row=f"{c.key} {c.framework} {c.cards}p",
                              simulated=c.simulated_per_card or None, held_back=c.held_out, skipped=c.skipped,
                              mechanisms=mechanisms))
    return out, []


__all__ = ["DATA", "GPT2", "HELD_OUT", "IMAGE_PIPELINES", "SCRIPTS", "Case", "cases", "simulate", "training_set"]
