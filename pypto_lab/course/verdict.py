"""What every exercise checker returns, and the helpers they share to run a student's attempt.

A `Verdict` is PASS, FAIL or NOT ATTEMPTED with the lines that explain it. A checker never
raises on a student's mistake: an answer that still raises ``NotImplementedError`` is "not
attempted yet", any other exception in the student's code is a FAIL that quotes it, and the
simulator's own teaching errors (`TilingError`, the pto errors) are a FAIL that names the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, NOT_ATTEMPTED = "PASS", "FAIL", "NOT ATTEMPTED"

# what each pipe does, for messages that name the pipe bounding a kernel
PIPE_ROLES = {
    "MTE2": "GM -> L1/UB loads",
    "MTE1": "L1 -> L0A/L0B copies",
    "CUBE": "the Cube's matrix multiplies",
    "FIXP": "FixPipe: L0C -> GM write-out",
    "MTE3": "UB -> GM stores",
    "VECTOR": "the Vector unit's arithmetic",
    "SCALAR": "scalar instructions",
}


@dataclass
class Verdict:
    """The outcome of one check: ``status`` (PASS, FAIL or NOT ATTEMPTED), the explanation, and
    the figures it was computed from (``facts``: the tests and the plots read them)."""

    exercise: str
    status: str
    lines: list[str] = field(default_factory=list)
    report: Any = None               # the simulator's report of the attempt (or the TilingError)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        return f"Verdict({self.exercise!r}, {self.status})"


class Attempt:
    """Collects the lines of a verdict as a checker goes: ``say`` a fact, then ``fail``, ``ok``
    or ``not_attempted`` once."""

    def __init__(self, exercise: str):
        self.exercise = exercise
        self.lines: list[str] = []
        self.facts: dict[str, Any] = {}
        self.report: Any = None

    def say(self, line: str) -> None:
        self.lines.append(line)

    def fail(self, rule: str, headline: str, why: list[str] = ()) -> Verdict:
        """FAIL naming the rule broken, the value, and the hardware reason lines ``why``."""
        self.lines.append(f"FAIL ({rule}): {headline}")
        self.lines.extend(f"  {w}" for w in why)
        return Verdict(self.exercise, FAIL, self.lines, self.report, self.facts)

    def ok(self, headline: str, why: list[str] = ()) -> Verdict:
        self.lines.append(f"PASS: {headline}")
        self.lines.extend(f"  {w}" for w in why)
        return Verdict(self.exercise, PASS, self.lines, self.report, self.facts)

    def not_attempted(self, err: NotImplementedError, where: str) -> Verdict:
        said = f" ({err})" if str(err) else ""
        self.lines.append(f"NOT ATTEMPTED yet: {where} still raises NotImplementedError{said}. "
                          f"Replace it with your answer and run the cell again.")
        return Verdict(self.exercise, NOT_ATTEMPTED, self.lines, self.report, self.facts)

    def broken(self, err: BaseException, where: str) -> Verdict:
        """The student's own code raised: quote it, as a FAIL."""
        self.lines.append(f"FAIL (your code raised): {where} raised {type(err).__name__}: {err}")
        return Verdict(self.exercise, FAIL, self.lines, self.report, self.facts)


def call_answer(answer):
    """The student's answer: ``answer()`` when it is a plain function, else the value itself."""
    if callable(answer) and not isinstance(answer, type):
        return answer()
    return answer


def mb(nbytes: float) -> str:
    """Bytes as MB with one decimal below 10 MB (so small kernels do not all read '1 MB')."""
    v = nbytes / 1e6
    return f"{v:,.1f} MB" if v < 10 else f"{v:,.0f} MB"


def kb(nbytes: float) -> str:
    return f"{nbytes / 1024:,.0f} KB" if nbytes >= 10 * 1024 else f"{nbytes / 1024:,.1f} KB"


def busy_fractions(pipe_busy: dict[str, float], cycles: float) -> dict[str, float]:
    """Busy cycles per pipe as a fraction of the kernel's cycles (pipes that never ran left out)."""
    return {p: v / cycles for p, v in pipe_busy.items() if v and cycles}


def busy_line(fractions: dict[str, float]) -> str:
    return ", ".join(f"{p} {v:.0%}" for p, v in sorted(fractions.items(), key=lambda kv: -kv[1]))


def bound_line(fractions: dict[str, float], saturated: float = 0.9) -> str:
    """Which pipe bounds the kernel, in words, from the busy fractions of its busiest core."""
    if not fractions:
        return "no pipe ran"
    pipe = max(fractions, key=fractions.get)
    share = fractions[pipe]
    if share >= saturated:
        return (f"{pipe} ({PIPE_ROLES.get(pipe, pipe)}) is busy {share:.0%} of the time on the busiest core: "
                f"it bounds the kernel")
    total = sum(fractions.values())
    head = (f"no pipe is saturated: the busiest, {pipe} ({PIPE_ROLES.get(pipe, pipe)}), is busy {share:.0%} of the "
            f"time, all pipes together {total:.0%}")
    if total < 0.9:
        return head + (": most of the time every pipe waits, on GM round trips and fixed start-ups rather than "
                       "on work")
    if total <= 1.1:
        return head + ": the pipes take turns instead of overlapping"
    return head + ": the pipes overlap only partly, and each transfer and instruction pays its fixed start-up"


__all__ = ["FAIL", "NOT_ATTEMPTED", "PASS", "PIPE_ROLES", "Attempt", "Verdict", "bound_line", "busy_fractions",
           "busy_line", "call_answer", "kb", "mb"]
