"""`pypto-lab validate`: every published figure in ``datasets/``, run the way it was measured.

Sets (``--set``):

* ``inference`` — whole-model throughput of ``datasets/published/`` (Ascend310P3, ATC or TorchAIE);
* ``llm`` — the fixed-batch prefill and decode step latencies of ``datasets/llm_published/``
  (torchair graph and eager modes) and its matmul micro-figures;
* ``serving`` — that file's serving runs (vLLM-Ascend, MindIE), with their arrivals and lengths;
* ``training`` — ``datasets/published_training/``'s training throughput per card;
* ``all`` — every set.

Each row runs on its chip, cards and stack; ``stack`` keeps only the rows measured on that stack
(the bands hold per stack). The `Summary` says, per regime and stack, the median and worst
|error|, the share within ±15 % and ±25 %, the leave-one-model-out error and the held-back rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..files.progress import progress as progress_bar
from .compare import Comparison, FittedConstant, Summary
from .validate import ValidationError

SETS = ("inference", "llm", "serving", "training")
# how many simulations each set makes (for the progress bar; the bar is a guide, not a contract)
_ROUGH_RUNS = {"inference": 37, "llm": 40, "serving": 4, "training": 12}


def _runner(name: str) -> Callable:
    if name == "inference":
        from .inference_rows import inference_set
        return inference_set
    if name == "llm":
        from .llm_rows import llm_set
        return llm_set
    if name == "serving":
        from .llm_rows import serving_set
        return serving_set
    from .training_rows import training_set
    return training_set


def check_sets(sets: str | Sequence[str]) -> tuple[str, ...]:
    """``sets`` as a tuple of set names (``"all"`` is every set)."""
    names = [sets] if isinstance(sets, str) else list(sets)
    if names == ["all"]:
        return SETS
    bad = [n for n in names if n not in SETS]
    if bad or not names:
        raise ValidationError(f"validate set {bad[0] if bad else names!r}: the sets are {', '.join(SETS)} or all. "
                              "Fix: --set llm (or --set all)")
    return tuple(dict.fromkeys(names))


def validate_sets(sets: str | Sequence[str] = "all", stack: str | None = None, progress: bool = False) -> Summary:
    """Run every row of ``sets``; ``stack``: only the rows measured on that stack."""
    names = check_sets(sets)
    if stack is not None:
        from ..stack import get_stack
        stack = get_stack(stack).name
    rows: list[Comparison] = []
    fitted: list[FittedConstant] = []
    bar = progress_bar(total=sum(_ROUGH_RUNS[n] for n in names), desc="validate", unit="run", disable=not progress)
    try:
        for name in names:
            got, fit = _runner(name)(tick=lambda: bar.update(1))
            rows += got
            fitted += fit
    finally:
        bar.close()
    if stack is not None:
        rows = [r for r in rows if r.stack == stack]
        fitted = [f for f in fitted if f.stack == stack]
        if not rows:
            raise ValidationError(f"no published row of the sets {', '.join(names)} was measured on stack {stack!r}. "
                                  "Fix: omit --stack, or pick a stack the rows name (pypto-lab validate --set all "
                                  "lists them)")
    return Summary(rows, fitted)


__all__ = ["SETS", "check_sets", "validate_sets"]
