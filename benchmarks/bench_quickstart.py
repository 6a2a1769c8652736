"""A student's first hour, timed: `make demo`, then a notebook run top to bottom, cell by cell.

Run:  .venv/bin/python benchmarks/bench_quickstart.py [--demo] [--cache DIR] [--repeats N] [NOTEBOOK ...]

* ``--demo``: start from an empty numba cache (a fresh clone; the design-sweep and tuning caches
  are empty scratch folders too) and run what ``make demo`` runs after installing,
  ``pypto-lab tour``, timing it; the notebooks then run with the caches the demo left. Without it, ``--cache`` (default: the repository's .numba_cache, as
  ``make lab`` uses it).
* Each notebook (default ``notebooks/00_quickstart.ipynb``) is executed ``--repeats`` times with
  nbclient as JupyterLab runs it (a fresh kernel, kernel start included in the total), with
  ``NUMBA_NUM_THREADS=2`` as the Makefile sets it. Prints the median total and, per cell, the
  median time; cells slower than 10 s are marked, with whether they showed progress while they ran
  (a tqdm bar or a line printed before the wait).

The numbers for the README table (`benchmarks/README.md`) come from this script; the machine is
shared and noisy, so read medians of several runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOW_S = 10.0


def _env(cache: Path, scratch: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NUMBA_CACHE_DIR=str(cache), NUMBA_NUM_THREADS="2", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    if scratch is not None:   # a fresh clone's user has no design-sweep or tuning cache either
        env.update(PYPTO_LAB_SWEEP_CACHE=str(scratch / "sweep"), PYPTO_LAB_TUNING_CACHE=str(scratch / "tuning.json"))
    return env


def run_demo(cache: Path, out: Path) -> float:
    """``make demo``'s command on an empty cache; seconds."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pypto_lab.cli", "tour", "--html", str(out / "tour.html")], cwd=ROOT,
                   env=_env(cache, out), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def _seconds(cell) -> float | None:
    ex = cell.get("metadata", {}).get("execution", {})
    a, b = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (a and b):
        return None
    return (datetime.fromisoformat(b.replace("Z", "+00:00")) - datetime.fromisoformat(a.replace("Z", "+00:00"))).total_seconds()


def _progress(cell) -> bool:
    """Whether a cell said something while it ran: a progress bar (tqdm's widget or text) or a
    printed line."""
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        text = o.get("text", "") if o.get("output_type") == "stream" else data.get("text/plain", "")
        if o.get("output_type") == "stream" or any(mark in text for mark in ("%|", "it/s", "s/it")):
            return True
        if data == {"text/plain": ""}:   # a passing bar of pypto_lab.files.progress (leave=False), cleared when done
            return True
    return False


def run_notebook(path: Path, cache: Path, scratch: Path | None) -> tuple[float, list[tuple[int, str, float, bool]]]:
    """(seconds from kernel start to the last cell, [(cell index, first line, seconds, showed progress)])."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.update(_env(cache, scratch))
    try:
        t = time.perf_counter()
        NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                       record_timing=True).execute()
        total = time.perf_counter() - t
    finally:
        os.environ.clear()
        os.environ.update(saved)
    cells = []
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            first = next((line for line in c.source.splitlines() if line.strip() and not line.startswith("#")), "")
            cells.append((i, first[:70], _seconds(c) or 0.0, _progress(c)))
    return total, cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", default=["notebooks/00_quickstart.ipynb"])
    ap.add_argument("--demo", action="store_true", help="an empty cache, then make demo's tour, timed")
    ap.add_argument("--cache", default=str(ROOT / ".numba_cache"), help="numba cache (without --demo)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores, python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    scratch = Path(tempfile.mkdtemp(prefix="pypto_lab_bench_quickstart_"))
    try:
        if args.demo:
            cache = scratch / "numba_cache"
            cache.mkdir()
            print(f"make demo (pypto-lab tour) on an empty numba cache: {run_demo(cache, scratch):,.0f} s")
        else:
            cache = Path(args.cache)
        for nb in args.notebooks:
            path = (ROOT / nb).resolve()
            runs = [run_notebook(path, cache, scratch if args.demo else None) for _ in range(args.repeats)]
            totals = [t for t, _ in runs]
            print(f"\n{path.name}: {args.repeats} runs, total (kernel start to last cell) median "
                  f"{statistics.median(totals):.1f} s, runs " + ", ".join(f"{t:.1f}" for t in totals))
            print("| cell | first line | median s | max s | showed progress |")
            print("|---:|---|---:|---:|---|")
            for k, (i, first, _, shown) in enumerate(runs[0][1]):
                ts = [r[1][k][2] for r in runs]
                mark = " **> 10 s**" if max(ts) > SLOW_S else ""
                print(f"| {i} | `{first}` | {statistics.median(ts):.2f} | {max(ts):.2f}{mark} | {'yes' if shown else 'no'} |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
