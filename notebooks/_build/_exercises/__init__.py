"""The exercises of notebooks/exercises/, in course order. Each module defines one `Exercise`
(common.py); notebooks/_build/exercises.py writes them, and tests/test_exercises.py runs their
``start`` and ``solution`` cells against the checkers of `pypto_lab.course`."""

from . import (
    ex01_fit_the_tiles,
    ex02_beat_the_default,
    ex03_vector_tiles,
    ex04_fuse_and_predict,
    ex05_avoid_the_transdata,
    ex06_fast_vector_kernel,
)
from .common import Exercise, exercise_notebook, solution_notebook

EXERCISES: list[Exercise] = [m.EXERCISE for m in (
    ex01_fit_the_tiles, ex02_beat_the_default, ex03_vector_tiles, ex04_fuse_and_predict,
    ex05_avoid_the_transdata, ex06_fast_vector_kernel)]

__all__ = ["EXERCISES", "Exercise", "exercise_notebook", "solution_notebook"]
