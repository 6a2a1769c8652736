"""One published figure against the simulated one, and the summary `pypto-lab validate` prints.

A `Comparison` is one row of a published dataset as the workbench ran it: which set and regime it
belongs to (LLM decode, CNN at small batch, serving TTFT, ...), the model and its setup, the
software stack the row was measured on, the published and simulated figures, the mechanisms of the
model that applied, whether the row is held back (never seen by any fit), and its
leave-one-model-out error (the error when every fitted constant is refitted without the row's
model; for a row no fitted constant touches, its own error).

`Summary` groups the comparisons by regime and stack: median and worst |error|, the share within
±15 % and ±25 %, the leave-one-model-out median, held-back rows apart, rows that could not be run
with the reason, and published rows that disagree with each other beyond what any one figure can
match (`conflicts`), each with its stack.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

BAND = 0.15          # the tighter band
WIDE_BAND = 0.25


@dataclass
class Comparison:
    set: str                     # "inference", "llm", "serving", "training"
    regime: str                  # e.g. "LLM decode (TPOT)", "CNN, batch <= 8"
    model: str
    setup: str                   # chip, cards, batch, lengths, precision: as the row states them
    stack: str
    metric: str
    unit: str
    published: float
    source: str
    row: str = ""                # the row's id or its place in the dataset
    simulated: float | None = None
    held_back: bool = False
    skipped: str = ""            # why the workbench could not run the row ("" when it did)
    mechanisms: tuple[str, ...] = ()
    lomo_simulated: float | None = None   # with every fitted constant refitted without this model
    ifa_runs: int = 0            # kernel runs per step a stack's ifa_overhead_us is charged on (its fit)

    @property
    def error(self) -> float | None:
        if self.simulated is None or self.skipped:
            return None
        return (self.simulated - self.published) / self.published

    @property
    def lomo_error(self) -> float | None:
        if self.error is None:
            return None
        s = self.simulated if self.lomo_simulated is None else self.lomo_simulated
        return (s - self.published) / self.published

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mechanisms"] = list(self.mechanisms)
        d["error"], d["lomo_error"] = self.error, self.lomo_error
        return d


@dataclass(frozen=True)
class RegimeStats:
    regime: str
    stack: str
    rows: int
    median: float
    worst: float
    within_band: float
    within_wide: float
    lomo_median: float
    held_back_rows: int
    held_back_median: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stats(regime: str, stack: str, rows: list[Comparison]) -> RegimeStats | None:
    seen = [r for r in rows if not r.held_back]
    held = [r for r in rows if r.held_back]
    if not seen and not held:
        return None
    base = seen or held
    errs = [abs(r.error) for r in base]
    return RegimeStats(
        regime=regime, stack=stack, rows=len(base), median=statistics.median(errs), worst=max(errs),
        within_band=sum(e <= BAND for e in errs) / len(errs), within_wide=sum(e <= WIDE_BAND for e in errs) / len(errs),
        lomo_median=statistics.median(abs(r.lomo_error) for r in base), held_back_rows=len(held),
        held_back_median=statistics.median(abs(r.error) for r in held) if held and seen else None)


@dataclass(frozen=True)
class FittedConstant:
    """A constant of a stack fitted to published rows: where it lives, its value, the script that
    fits it and the rows it was fitted on."""

    stack: str
    name: str
    value: float
    script: str
    fitted_on: tuple[str, ...]


@dataclass
class Summary:
    rows: list[Comparison]
    fitted: list[FittedConstant] = field(default_factory=list)

    @property
    def ran(self) -> list[Comparison]:
        return [r for r in self.rows if r.error is not None]

    @property
    def skipped(self) -> list[Comparison]:
        return [r for r in self.rows if r.error is None]

    def regimes(self) -> list[RegimeStats]:
        """Per (regime, stack): the figures the issue's bands are judged on (held-back rows apart)."""
        groups: dict[tuple[str, str], list[Comparison]] = {}
        for r in self.ran:
            groups.setdefault((r.regime, r.stack), []).append(r)
        out = [_stats(reg, st, rows) for (reg, st), rows in groups.items()]
        return [s for s in out if s is not None]

    def conflicts(self, band: float = BAND) -> list[tuple[Comparison, Comparison]]:
        """Pairs of published rows of the same model, setup and metric whose figures are further
        apart than any one simulated figure within ``band`` of both allows: ``hi / lo > (1 + band) /
        (1 - band)``. Each pair is listed with both rows' stacks (the same stack: a conflict the
        note must explain; two stacks: two configurations, not one)."""
        limit = (1 + band) / (1 - band)
        out = []
        for i, a in enumerate(self.rows):
            for b in self.rows[i + 1:]:
                if (a.set, a.model, a.setup, a.metric) == (b.set, b.model, b.setup, b.metric) and \
                        max(a.published, b.published) / min(a.published, b.published) > limit:
                    out.append((a, b))
        return out

    def table(self) -> str:
        lines = [f"{'set':<9} {'regime':<26} {'model':<18} {'setup':<34} {'stack':<25} {'published':>10} "
                 f"{'simulated':>10} {'error':>7}"]
        for r in self.ran:
            mark = "  (held back)" if r.held_back else ""
            lines.append(f"{r.set:<9} {r.regime[:26]:<26} {r.model[:18]:<18} {r.setup[:34]:<34} {r.stack[:25]:<25} "
                         f"{r.published:>10,.2f} {r.simulated:>10,.2f} {r.error:>+7.0%}{mark}")
        lines.append("")
        lines.append(f"{'regime':<28} {'stack':<25} {'rows':>4} {'median':>7} {'worst':>7} {'±15%':>6} {'±25%':>6} "
                     f"{'LOMO':>7}  held back")
        for s in self.regimes():
            held = (f"{s.held_back_rows} rows, median {s.held_back_median:.1%}" if s.held_back_median is not None
                    else (f"{s.held_back_rows} rows" if s.held_back_rows else "-"))
            lines.append(f"{s.regime[:28]:<28} {s.stack[:25]:<25} {s.rows:>4} {s.median:>7.1%} {s.worst:>7.1%} "
                         f"{s.within_band:>6.0%} {s.within_wide:>6.0%} {s.lomo_median:>7.1%}  {held}")
        for f in self.fitted:
            lines.append(f"fitted: {f.stack}.{f.name} = {f.value:.4g} ({f.script}; on {len(f.fitted_on)} rows)")
        for r in self.skipped:
            lines.append(f"not run: {r.set} {r.model} {r.setup} {r.metric}: {r.skipped}")
        for a, b in self.conflicts():
            same = "same stack" if a.stack == b.stack else "two stacks"
            lines.append(f"published rows that disagree beyond ±{BAND:.0%} of any one figure ({same}): {a.model} "
                         f"{a.setup} {a.metric}: {a.published:,.2f} ({a.stack}, {a.row}) vs {b.published:,.2f} "
                         f"({b.stack}, {b.row})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows],
                "regimes": [s.to_dict() for s in self.regimes()],
                "fitted_constants": [asdict(f) for f in self.fitted],
                "conflicting_rows": [[a.to_dict(), b.to_dict()] for a, b in self.conflicts()]}


def median_abs(rows: Iterable[Comparison]) -> float:
    return statistics.median(abs(r.error) for r in rows if r.error is not None)


__all__ = ["BAND", "WIDE_BAND", "Comparison", "FittedConstant", "RegimeStats", "Summary", "median_abs"]
