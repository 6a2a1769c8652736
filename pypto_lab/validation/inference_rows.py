"""The published whole-model inference rows (``datasets/published/``) as `Comparison`s.

Each row is run as `validate.validate` runs it (the model from its architecture, `optimize` at
level 3 in fp16 on the row's chip at the row's batch) and filed under its regime: CNNs at small
batch (batch <= 8, where launch and offline-model costs weigh most) or large batch, and
transformer encoders. ATC-compiled rows run on the ``atc-om`` stack; rows compiled with TorchAIE
(``torch_aie.compile``) say so, and run on the ``torch_aie`` stack.
"""

from __future__ import annotations

from collections.abc import Callable

from ..compiler.optimize import optimize
from ..llm.validation import hinted
from ..stack import DEFAULT_STACK
from .compare import Comparison
from .validate import BUILDERS, LEVELS, Row, ValidationError, _fairseq_roberta, published_rows

TRANSFORMERS = ("bert-base-uncased", "roberta-base", "albert-base-v2")
SMALL_BATCH = 8
TORCHAIE_STACK = "torch_aie"


# A model whose stack compiles a different graph of it: TorchAIE compiles fairseq's RoBERTa as
# TorchScript traces it (AscendIE/TorchAIE/contrib/nlp/Roberta compile.py: torch_aie.compile of the
# traced module), without the ATC README's ONNX rewrite (opt_onnx.py works on ONNX only).
STACK_BUILDERS: dict[tuple[str, str], Callable] = {("roberta-base", TORCHAIE_STACK): _fairseq_roberta("fairseq")}


def builder_of(row: Row, stack: str) -> Callable:
    """The builder of the graph ``stack`` compiled for ``row``."""
    return STACK_BUILDERS.get((row.key, stack), BUILDERS[row.key])


def regime_of(row: Row) -> str:
    if row.key in TRANSFORMERS:
        return "transformer inference"
    return "CNN, batch <= 8" if row.batch <= SMALL_BATCH else "CNN, batch > 8"


def stack_of(row: Row) -> str:
    """The stack that produced a row's figure: its source path names TorchAIE, or ATC's offline model."""
    return TORCHAIE_STACK if "TorchAIE" in row.source else DEFAULT_STACK


def mechanisms_of(report) -> tuple[str, ...]:
    """The mechanisms a row's figure rests on, as the passes named them: Reshape + Transpose pairs
    left unfused and row-wise kernels moved row by row at lengths that are not 16- or 32-byte
    aligned (the layout pass), the batch split (its summary) and which layers' activations stay in
    L2 (of one slice when the batch is split)."""
    steps = {p.name: p for p in report.passes}
    split = steps.get("l2_batch_split")
    l2 = split or steps.get("l2_residency")
    layout = steps.get("layout")
    unaligned = tuple(n.reason for n in layout.notes if "16" in n.reason and "TransposeD" in n.reason
                      or "DataCopyPad" in n.reason) if layout else ()
    return unaligned + tuple(([split.summary] if split else []) + ([n.reason for n in l2.notes] if l2 else []))


def check_inference_arguments(chip: str | None, level: int) -> list[Row]:
    """The inference rows of ``chip`` (all when None), after checking ``level``."""
    if isinstance(level, bool) or level not in LEVELS:
        raise hinted(ValidationError, f"level {level!r}: the optimisation levels are {', '.join(map(str, LEVELS))}. "
                     "Fix: {level=3} (the default)")
    rows = published_rows(chip=chip)
    if not rows:
        raise ValidationError(f"no published rows for chip {chip!r}. Fix: omit --chip, or add rows for it to "
                              "datasets/published/")
    return rows


def inference_set(chip: str | None = None, level: int = 3,
                  tick: Callable[[], None] | None = None) -> tuple[list[Comparison], list]:
    rows = check_inference_arguments(chip, level)
    out = []
    for r in rows:
        stack = stack_of(r)
        model, inputs = builder_of(r, stack)(r.batch, r.resolution, r.seq)
        rep = optimize(model, inputs, chip=r.chip, level=level, precision="fp16", stack=stack).report()
        simulated = r.batch * 1e6 / rep.latency_us
        size = f"s{r.seq}" if r.seq else f"{r.resolution}px"
        out.append(Comparison(set="inference", regime=regime_of(r), model=r.key, setup=f"{r.chip} b{r.batch} {size}",
                              stack=stack, metric="throughput", unit="/s", published=r.published, source=r.source,
                              row=r.model[:40], simulated=simulated,
                              mechanisms=mechanisms_of(rep), held_back=r.held_back))
        if tick:
            tick()
    return out, []


__all__ = ["SMALL_BATCH", "STACK_BUILDERS", "TRANSFORMERS", "builder_of", "check_inference_arguments", "inference_set", "mechanisms_of", "regime_of",
           "stack_of"]
