"""Training steps against published Ascend training throughput (``datasets/published_training/``).

Every row of ``published_training.csv`` that the workbench can set up is simulated with
`pypto_lab.train.simulate_step` in the row's configuration (model, chip, cards, batch per card,
sequence length, precision, tensor parallelism and gradient accumulation from the row and its
notes) and compared per card: images or samples per second per card, or tokens per second per
card. Rows it cannot set up are listed with the reason. The rows the dataset's README keeps back
are marked held back; nothing in the simulator is fitted to any row.

Published per-card figures: ModelZoo-PyTorch FPS is for the whole job (its scripts compute
batch x cards / step time), so an 8p figure is divided by 8; MindSpore publishes ms/step (per
card: batch per card / step time); ModelLink publishes tokens/s per card.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..files.paths import DATASETS_DIR
from ..stack import DEFAULT_LLM_TRAIN_STACK, DEFAULT_TRAIN_STACK
from ..train import simulate_step
from .compare import Comparison

DATA = DATASETS_DIR / "published_training" / "published_training.csv"
HELD_OUT = {("resnet50", "PyTorch", 8), ("bert-large", "PyTorch", 8), ("resnet101", "MindSpore", 8),
            ("llama-2-13b", "ModelLink", 8)}
F = torch.nn.functional


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
    simulated_per_card: float = 0.0
    seconds: float = 0.0
    skipped: str = ""

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
    return "MindSpore" if "MindSpore" in f else ("ModelLink" if "Megatron" in f or "ModelLink" in row["source_repo"]
                                                 else "PyTorch")


def _chip(row) -> str:
    # ModelZoo and MindSpore rows: "Ascend 910" of 2021-2023, the 910A; ModelLink's Atlas 900 A2 PODc is a
    # 910B cluster whose bin is not stated: the 910B2 preset (Atlas 800T A2's training bin) stands for it
    return "Ascend910B2" if "A2" in row["chip"] else "Ascend910A"


def _per_card(row, cards: int, batch: int) -> tuple[float, str]:
    value, unit = float(row["throughput"]), row["unit"]
    if unit.startswith("ms/step"):
        return batch / (value / 1e3), "samples/s/card"
    if unit.startswith("tokens"):
        return value, "tokens/s/card"
    return value / cards, "samples/s/card"   # ModelZoo FPS: the whole job's


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
                     source=f"{row['source_repo']}/{row['source_path']}")
            notes = row["notes"] + " " + row["model"]
            if "PP=2" in row["model"] or "PP=2" in notes.split("Script defaults")[-1][:40] or "PP=4" in notes:
                c.skipped = "pipeline parallelism is not modelled"
            elif key in ("chatglm2-6b", "bert-nezha-large", "gpt2-medium"):
                c.skipped = "no architecture for it in torchvision / transformers configs here" \
                    if key != "gpt2-medium" else "Megatron-DeepSpeed GPT-2 is not set up"
            elif "older README" in notes or ("2730" in row["throughput"]):
                c.skipped = "superseded by the later README (and its own numbers do not add up)"
            out.append(c)
    return out


def _llama(name: str):
    import transformers

    shapes = {"llama-2-7b": (4096, 11008, 32, 32, 32, 32000), "llama-2-13b": (5120, 13824, 40, 40, 40, 32000),
              "llama-3-8b": (4096, 14336, 32, 32, 8, 128256)}
    h, inter, layers, heads, kv, vocab = shapes[name]
    return transformers.LlamaConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab)


# tensor parallelism and global batch of the ModelLink rows (their example scripts, see the CSV notes);
# both scripts (examples/mcore/llama2/pretrain_llama2_13b_ptd.sh, examples/mcore/llama3/pretrain_llama3_8b_ptd.sh at
# aeeeeeep/ModelLink d4feda79) pass --sequence-parallel, --use-flash-attn, --use-fused-rmsnorm, --use-fused-swiglu,
# --use-fused-rotary-pos-emb (fuse_vector) and --use-mc2 (mc2), and no recomputation; the README says its figures
# were measured with mc2 on
LLM_SETUP = {"llama-2-13b": (8, 512), "llama-3-8b": (8, 64)}


def simulate(c: Case):
    import torchvision
    import transformers

    if c.key in ("resnet50", "resnet101", "mobilenet_v2", "densenet121"):
        model = getattr(torchvision.models, c.key)()
        batch = (torch.randn(c.batch, 3, 224, 224), torch.randint(0, 1000, (c.batch,)))
        return simulate_step(model, batch, F.cross_entropy, optimizer="sgd", chip=c.chip, cards=c.cards,
                             precision="fp16", amp="O2")
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
        return simulate_step(model, batch, optimizer="adam", chip=c.chip, cards=c.cards, precision="fp16",
                             amp="O2")
    if c.key in LLM_SETUP:
        tp, global_batch = LLM_SETUP[c.key]
        ids = torch.randint(0, 1000, (c.batch, c.seq))
        accum = global_batch // (c.batch * (c.cards // tp))
        return simulate_step(_llama(c.key), {"input_ids": ids, "labels": ids}, optimizer="adamw", chip=c.chip,
                             cards=c.cards, tp=tp, precision="bf16", amp="O2", grad_accum=accum,
                             sequence_parallel=True, fuse_vector=True, mc2=True)
    raise KeyError(c.key)


def _stack_of(c: Case) -> str:
    return DEFAULT_LLM_TRAIN_STACK if c.key in LLM_SETUP else DEFAULT_TRAIN_STACK


def training_set(tick: Callable[[], None] | None = None, only: set[str] | None = None) -> tuple[list[Comparison], list]:
    """Every training row as a `Comparison` (rows the workbench cannot set up carry the reason)."""
    out = []
    for c in cases():
        if only and c.key not in only:
            continue
        if not c.skipped:
            try:
                rep = simulate(c)
            except Exception as e:   # noqa: BLE001  (a row the workbench refuses is reported, not hidden)
                c.skipped = f"{type(e).__name__}: {str(e)[:160]}"
            else:
                per_card_batch = rep.global_batch / rep.cards
                c.simulated_per_card = (rep.tokens_per_s / rep.cards if c.unit.startswith("tokens")
                                        else per_card_batch * 1e3 / rep.step_ms)
            if tick:
                tick()
        out.append(Comparison(set="training", regime="training throughput", model=c.key,
                              setup=f"{c.framework} {c.cards}x{c.chip} b{c.batch}" + (f" s{c.seq}" if c.seq else ""),
                              stack=_stack_of(c), metric=c.unit, unit=c.unit, published=c.published_per_card,
                              source=c.source, row=f"{c.key} {c.framework} {c.cards}p",
                              simulated=c.simulated_per_card or None, held_back=c.held_out, skipped=c.skipped))
    return out, []


__all__ = ["DATA", "HELD_OUT", "Case", "cases", "simulate", "training_set"]
