"""Whole-model figures against published Ascend throughput: `pypto-lab validate`.

`validate(chip=None, level=3)` reads every row of ``datasets/published/*.csv`` (model, chip,
batch, sequence length or resolution, published throughput, source and caveats), builds the model
from its architecture (torchvision / transformers configs; weights do not matter to the
simulator), runs `optimize` at the row's batch on the row's chip in fp16, and compares the
simulated throughput (batch / latency) with the published one. `ValidationReport` holds the rows,
the error of each, the median and worst |error|, and the leave-one-model-out error.

The simulator has no constant fitted to these rows, so leaving a model out changes nothing: its
leave-one-model-out error is its error, and the report says so. (A whole-model constant fitted to
the rows would have to be refitted without each model in turn; see the issue's rules.)

`conflicting_rows` finds pairs of published rows for the same model, chip, batch and shape whose
figures are too far apart for any one simulated figure to lie within ±15 % of both (RoBERTa and
ALBERT at batch 1: ATC-compiled against TorchAIE-compiled): the band no simulator can meet on
them.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..compiler.optimize import LEVELS, optimize
from ..files.paths import DATASETS_DIR
from ..files.progress import progress as progress_bar
from ..hw.chip import list_chips
from ..llm.validation import hinted

DATA = DATASETS_DIR / "published"
TOLERANCE = 0.15   # issue 14's band: every row within ±15 %


class ValidationError(ValueError):
    """A published row the validator cannot run; the message names the row, the rule and a fix."""


def _resnet(name: str):
    def build(batch: int, res: int, seq: int | None):
        import torchvision

        return getattr(torchvision.models, name)(), (torch.randn(batch, 3, res, res),)
    return build


def _inception(batch: int, res: int, seq: int | None):
    import torchvision

    m = torchvision.models.inception_v3(aux_logits=False, init_weights=False)
    return m, (torch.randn(batch, 3, res, res),)


def _hf(kind: str):
    def build(batch: int, res: int | None, seq: int):
        import transformers as tf

        if kind == "bert":
            model = tf.BertForQuestionAnswering(tf.BertConfig())
            vocab = 30522
        elif kind == "roberta":
            model = tf.RobertaForSequenceClassification(tf.RobertaConfig(vocab_size=50265, max_position_embeddings=514,
                                                                          type_vocab_size=1, num_labels=2))
            vocab = 50265
        else:   # albert-base-v2's architecture (its config.json: embedding 128, hidden 768, 12 layers)
            model = tf.AlbertForSequenceClassification(tf.AlbertConfig(
                embedding_size=128, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                num_hidden_layers=12, vocab_size=30000, num_labels=2))
            vocab = 30000
        return model.eval(), (torch.randint(0, vocab, (batch, seq)),)
    return build


def _fairseq_roberta(layout: str):
    """fairseq's RoBERTa-base with its SST-2 head (`pypto_lab.models.fairseq_roberta`): the model the
    ModelZoo RoBERTa rows ran, not the Hugging Face encoder. ``layout="opt_onnx"``: the ONNX graph the
    ATC README compiles after its opt_onnx.py; ``"fairseq"``: fairseq's own module as TorchScript
    traces it (what torch_aie.compile takes; opt_onnx.py rewrites ONNX only)."""
    def build(batch: int, res: int | None, seq: int):
        from ..models.fairseq_roberta import build as fairseq_build

        return fairseq_build(batch, seq, layout)
    return build


# What each published model is, by the first word of its `model` column.
BUILDERS: dict[str, Callable] = {
    "resnet50": _resnet("resnet50"), "resnet18": _resnet("resnet18"), "resnet101": _resnet("resnet101"),
    "inception_v3": _inception, "vgg16": _resnet("vgg16"), "bert-base-uncased": _hf("bert"),
    "roberta-base": _fairseq_roberta("opt_onnx"), "albert-base-v2": _hf("albert"),
}


def _chip_of(text: str) -> str:
    t = text.replace(" ", "")
    for name in sorted(list_chips(), key=len, reverse=True):
        if name in t:
            return name
    if t.startswith("Ascend310P"):
        return "Ascend310P3"
    raise ValidationError(f"chip {text!r}: no chip preset matches it. Fix: name a preset (pypto-lab chips) in the row")


@dataclass
class Row:
    model: str
    key: str
    chip: str
    batch: int
    seq: int | None
    resolution: int | None
    published: float
    source: str
    notes: str
    simulated: float = 0.0
    fallbacks: tuple[str, ...] = ()
    held_back: bool = False

    @property
    def error(self) -> float:
        return (self.simulated - self.published) / self.published

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "key": self.key, "chip": self.chip, "batch": self.batch, "seq": self.seq,
                "resolution": self.resolution, "published_per_s": self.published, "simulated_per_s": self.simulated,
                "error": self.error, "source": self.source, "notes": self.notes, "cpu_fallbacks": list(self.fallbacks)}


@dataclass
class ValidationReport:
    rows: list[Row]
    level: int
    fitted_constants: tuple[str, ...] = field(default_factory=tuple)

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(r.error) for r in self.rows)

    @property
    def worst(self) -> Row:
        return max(self.rows, key=lambda r: abs(r.error))

    def leave_one_model_out(self) -> dict[str, float]:
        """Per model, its median |error| when nothing is fitted on it. No constant of the simulator
        is fitted to these rows, so this equals the model's own median |error|."""
        out: dict[str, list[float]] = {}
        for r in self.rows:
            out.setdefault(r.key, []).append(abs(r.error))
        return {k: statistics.median(v) for k, v in out.items()}

    def conflicts(self, tolerance: float = TOLERANCE) -> list[tuple[Row, Row]]:
        """Pairs of published rows for the same model, chip, batch and shape that no single figure
        can match within ``tolerance`` of both: published ``hi / lo > (1 + t) / (1 - t)``. Every
        simulator, however faithful, misses one row of such a pair by more than ``tolerance``."""
        return conflicting_rows(self.rows, tolerance)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "rows": [r.to_dict() for r in self.rows],
                "median_abs_error": self.median_abs_error, "worst_abs_error": abs(self.worst.error),
                "leave_one_model_out": self.leave_one_model_out(), "fitted_constants": list(self.fitted_constants),
                "conflicting_rows": [[a.to_dict(), b.to_dict()] for a, b in self.conflicts()]}

    def table(self) -> str:
        lines = [f"{'model':<16} {'chip':<12} {'batch':>5} {'seq/res':>7} {'published/s':>11} {'simulated/s':>11} "
                 f"{'error':>7}"]
        for r in self.rows:
            size = r.seq if r.seq else r.resolution
            lines.append(f"{r.key:<16} {r.chip:<12} {r.batch:>5} {size!s:>7} {r.published:>11,.1f} "
                         f"{r.simulated:>11,.1f} {r.error:>+7.0%}")
        w = self.worst
        lines.append(f"median |error| {self.median_abs_error:.1%}; worst {abs(w.error):.1%} ({w.key} batch {w.batch})")
        lines.append("leave-one-model-out median |error| (nothing is fitted to these rows, so it is each model's own): "
                     + ", ".join(f"{k} {v:.0%}" for k, v in self.leave_one_model_out().items()))
        for a, b in self.conflicts():
            size = a.seq if a.seq else a.resolution
            lines.append(f"published rows that disagree beyond ±{TOLERANCE:.0%} of any one figure: {a.key} batch "
                         f"{a.batch} ({size}): {a.published:,.1f}/s ({_tool(a)}) vs {b.published:,.1f}/s ({_tool(b)})")
        return "\n".join(lines)


def _tool(row: Row) -> str:
    """Which compiler produced a published row's model, from its source path."""
    return "TorchAIE" if "TorchAIE" in row.source else "ATC"


def conflicting_rows(rows: list[Row], tolerance: float = TOLERANCE) -> list[tuple[Row, Row]]:
    """Pairs of rows (same model, chip, batch, sequence and resolution) whose published figures are
    further apart than any one figure within ``tolerance`` of both allows."""
    if not 0 < tolerance < 1:
        raise ValidationError(f"tolerance {tolerance!r}: must lie strictly between 0 and 1 (0.15 is ±15 %)")
    limit = (1 + tolerance) / (1 - tolerance)
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            same = (a.key, a.chip, a.batch, a.seq, a.resolution) == (b.key, b.chip, b.batch, b.seq, b.resolution)
            if same and max(a.published, b.published) / min(a.published, b.published) > limit:
                out.append((a, b))
    return out


def _int(text: str) -> int | None:
    text = (text or "").strip()
    if not text:
        return None
    return int(text.split("x")[0])


def published_rows(paths: list[Path] | None = None, chip: str | None = None) -> list[Row]:
    """Every row of the published CSVs (``chip``: only that chip's rows)."""
    rows = []
    for path in paths or sorted(DATA.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                key = r["model"].split()[0]
                if key not in BUILDERS:
                    raise ValidationError(f"{path.name}: model {r['model']!r} has no builder. Rule: every row's first "
                                          f"word names one of {', '.join(BUILDERS)}. Fix: add a builder to "
                                          "pypto_lab/validate.py or correct the row")
                c = _chip_of(r["chip"])
                if chip and c != chip:
                    continue
                rows.append(Row(model=r["model"], key=key, chip=c, batch=int(r["batch"]), seq=_int(r["seq_len"]),
                                resolution=_int(r["resolution"]), published=float(r["throughput_per_s"]),
                                source=f"{r['source_repo']}/{r['source_path']}", notes=r["notes"],
                                held_back=(r.get("held_back") or "").strip().lower() in ("1", "true", "yes")))
    return rows


def validate(chip: str | None = None, level: int = 3, rows: list[Row] | None = None,
             progress: bool = False) -> ValidationReport:
    """Simulate every published row (optionally one chip's) at ``level`` in fp16."""
    if isinstance(level, bool) or level not in LEVELS:
        raise hinted(ValidationError, f"level {level!r}: the optimisation levels are {', '.join(map(str, LEVELS))}. "
                     "Fix: {level=3} (the default)")
    rows = published_rows(chip=chip) if rows is None else rows
    if not rows:
        raise ValidationError(f"no published rows for chip {chip!r}. Fix: omit --chip, or add rows for it to "
                              "datasets/published/")
    for r in progress_bar(rows, desc="validate", unit="row", disable=not progress):
        model, inputs = BUILDERS[r.key](r.batch, r.resolution, r.seq)
        rep = optimize(model, inputs, chip=r.chip, level=level, precision="fp16").report()
        r.simulated = r.batch * 1e6 / rep.latency_us
        r.fallbacks = tuple(rep.fallback_ops)
    return ValidationReport(rows, level)


__all__ = ["BUILDERS", "DATA", "TOLERANCE", "Row", "conflicting_rows", "ValidationError", "ValidationReport", "published_rows", "validate"]
