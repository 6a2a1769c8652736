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


def test_binder_torch_pin_is_inside_the_pyproject_range():
    from packaging.requirements import Requirement
    from packaging.version import Version

    deps = {Requirement(d).name: Requirement(d) for d in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    for line in (ROOT / "binder/requirements.txt").read_text().splitlines():
        m = re.match(r"(torch|torchvision)==([\w.]+)\+cpu$", line.strip())
        if m:
            assert deps[m.group(1)].specifier.contains(Version(m.group(2))), line


def test_binder_installs_the_package_and_warms_the_numba_cache_it_runs_with():
    post, start = (ROOT / "binder/postBuild").read_text(), (ROOT / "binder/start").read_text()
    assert "pip install --no-deps -e ." in post and "simulate_matmul" in post
    cache = re.search(r'NUMBA_CACHE_DIR="([^"]+)"', post).group(1)
    assert f'NUMBA_CACHE_DIR="{cache}"' in start
    assert all((ROOT / "binder" / f).stat().st_mode & 0o111 for f in ("postBuild", "start"))


def test_readme_binder_badge_opens_the_quickstart():
    readme = (ROOT / "README.md").read_text()
    assert "https://mybinder.org/badge_logo.svg" in readme and "notebooks/00_quickstart.ipynb" in readme
    assert (ROOT / "notebooks/00_quickstart.ipynb").exists()
    assert "labpath=notebooks%2F00_quickstart.ipynb" in (ROOT / "Makefile").read_text()  # make binder-url


def test_browser_test_set_up():
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert {"playwright", "voila"} <= _names(dev)
    makefile = (ROOT / "Makefile").read_text()
    assert "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1" in makefile and "apt-get install -y -qq chromium" in makefile
    assert re.search(r"^test: .*\bbrowser\b", makefile, re.M)
    assert "out/" in (ROOT / ".gitignore").read_text().split()


def test_make_test_keeps_each_notebook_on_one_worker():
    """Two pytest-xdist workers: nbval's cells of one notebook share a kernel, so a notebook (a
    file) must never be split between workers; --dist loadfile guarantees that."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert "pytest-xdist" in _names(dev)
    recipe = re.search(r"^test: .*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "-n $(TEST_WORKERS)" in recipe and "--dist loadfile" in recipe and "notebooks" in recipe
