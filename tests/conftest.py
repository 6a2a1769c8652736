"""Shared test set-up: a writable numba cache and a headless matplotlib."""

import os
from pathlib import Path

os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache"))
os.environ.setdefault("MPLBACKEND", "Agg")
