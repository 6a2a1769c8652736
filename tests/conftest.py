"""Shared test set-up: a writable numba cache, a headless matplotlib, and the graph verifier
after every pass (``PYPTO_LAB_VERIFY=1``: `pypto_lab.passes.Verify`)."""

import os
from pathlib import Path

os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache"))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["PYPTO_LAB_VERIFY"] = "1"
