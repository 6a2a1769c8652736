"""Shared test set-up: a writable numba cache, a headless matplotlib, the graph verifier after
every pass (``PYPTO_LAB_VERIFY=1``: `pypto_lab.passes.Verify`), and the output folder that every
SIM-mode pto run writes (``TILE_FWK_OUTPUT_DIR``, as the real framework reads it; `pto.sim_output`)
in a temporary directory instead of ./output under the checkout."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache"))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["PYPTO_LAB_VERIFY"] = "1"
if "TILE_FWK_OUTPUT_DIR" not in os.environ:
    _SIM_OUTPUT = tempfile.mkdtemp(prefix="pypto_lab_sim_output_")
    os.environ["TILE_FWK_OUTPUT_DIR"] = _SIM_OUTPUT
    atexit.register(shutil.rmtree, _SIM_OUTPUT, ignore_errors=True)  # the session leaves no folder behind
