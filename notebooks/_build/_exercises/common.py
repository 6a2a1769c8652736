"""The shape every exercise notebook shares, and how one is turned into two notebooks.

An `Exercise` holds the text of one puzzle: what it teaches, how it is checked, the setup code,
the cell the student edits (``start``: unsolved, it raises NotImplementedError or holds a
deliberately poor answer), the reference answer (``solution``) and why it works. From it
`exercise_notebook` writes ``exercises/<slug>.ipynb`` and `solution_notebook`
``exercises/solutions/<slug>.ipynb``. The checkers live in `pypto_lab.course`; the notebooks
only call them, so the tests (tests/test_exercises.py) run the very ``start`` and ``solution``
text the notebooks hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from _notebook import Notebook

CHECKED = "# NBVAL_CHECK_OUTPUT\nprint(verdict.status)"


@dataclass(frozen=True)
class Exercise:
    slug: str                  # file name without .ipynb, e.g. "01_fit_the_tiles"
    title: str                 # e.g. "Fit the tiles"
    teaches: str               # one line: what the student learns (README and first cell)
    checked: str               # one line: what the checker tests (README and first cell)
    background: str            # where the course explains it, e.g. "`../02_tiling_a_matmul.ipynb` §1–5"
    goal: str                  # markdown: the problem, the rules, useful numbers
    setup: str                 # code: imports, the exercise object EX, constants
    start: str                 # code: the cell the student edits, unsolved
    solution: str              # code: the reference answer (same names as ``start``)
    check: str                 # code: runs the check into ``verdict`` and prints it
    why: str                   # markdown: why the reference answer works (no simulated figure in it)
    edit_hint: str = ""        # markdown under the "your answer" heading
    before: list = field(default_factory=list)   # (markdown, code) pairs shown before the answer cell
    after: list = field(default_factory=list)    # code cells after the check (plots)
    further: list = field(default_factory=list)  # (markdown, code) pairs at the end of the solution

    @property
    def number(self) -> int:
        return int(self.slug.split("_", 1)[0])

    @property
    def heading(self) -> str:
        return f"Exercise {self.number} · {self.title}"


def _intro(ex: Exercise) -> str:
    return (f"# {ex.heading}\n\n"
            f"**What it teaches.** {ex.teaches}\n\n"
            f"**How it is checked.** {ex.checked} The checker (`pypto_lab.course`) runs the simulator on your "
            f"answer and prints **PASS**, **FAIL** with the hardware reason computed from your attempt, or "
            f"**NOT ATTEMPTED**.\n\n"
            f"**Background.** {ex.background}\n\n"
            f"{ex.goal.strip()}")


def exercise_notebook(ex: Exercise) -> Notebook:
    nb = Notebook()
    nb.md(_intro(ex))
    nb.code(ex.setup)
    nb.md("### The checker\n\n`EX.check(answer)` returns a verdict and prints why. To read exactly what "
          "it tests, run `EX.check??` in a cell.")
    for text, source in ex.before:
        nb.md(text)
        nb.code(source)
    nb.md("## ✏️ Your answer — edit this cell\n\n" + (ex.edit_hint or "Replace the body, then run this cell "
          "and the check below it. Run it as often as you like: every FAIL says what to change."))
    nb.code(ex.start)
    nb.md("### Check")
    nb.code(ex.check)
    nb.code(CHECKED)
    for source in ex.after:
        nb.code(source)
    nb.md(f"---\n\nStuck after a few tries? The reference answer and why it works are in "
          f"[`solutions/{ex.slug}.ipynb`](solutions/{ex.slug}.ipynb). **Open it only after trying**: the "
          f"checker's FAIL messages are the hints.")
    return nb


def solution_notebook(ex: Exercise) -> Notebook:
    nb = Notebook()
    nb.md(f"# Solution · {ex.heading}\n\n> **Open this only after trying** "
          f"[the exercise](../{ex.slug}.ipynb): the reference answer is below.\n\n"
          f"**What it teaches.** {ex.teaches}")
    nb.code(ex.setup)
    nb.md("## The reference answer")
    nb.code(ex.solution)
    nb.code(ex.check)
    nb.code(CHECKED)
    for source in ex.after:
        nb.code(source)
    nb.md("## Why the reference answer works\n\n" + ex.why.strip())
    for text, source in ex.further:
        nb.md(text)
        nb.code(source)
    return nb
