"""The project's set-up files agree with each other."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _names(reqs):
    return {re.split(r"[<>=!~\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in reqs if r.strip()}


def test_binder_requirements_match_pyproject_dependencies():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = [ln for ln in (ROOT / "binder/requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith(("#", "-"))]
    assert _names(lines) == _names(deps)


def test_torch_range_admits_the_local_wheels():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(d for d in deps if d.startswith("torch>") or d.startswith("torch="))
    assert "<=2.14.1" in torch or "==2.14.1" in torch


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert "NUMBA_CACHE_DIR" in makefile and "pypto-lab tour" in makefile


def test_calibration_data_ships_with_the_repo():
    csv = ROOT / "datasets/calibration/ascend_mskpp_microbench.csv"
    assert sum(1 for _ in csv.open()) == 3665  # header + 3,664 rows
    assert (ROOT / "datasets/calibration/README.md").exists()
