"""Where the repository's shipped data lives: ``datasets/`` beside the package (the source tree an
editable install runs from). One constant, so a module that moves keeps finding it."""

from __future__ import annotations

from pathlib import Path

DATASETS_DIR = Path(__file__).resolve().parents[2] / "datasets"

__all__ = ["DATASETS_DIR"]
