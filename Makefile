# The two set-up commands of the README: `make demo` and `make test`. Each works on a fresh
# machine with only python3: it creates .venv, installs the package and runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache
export NUMBA_NUM_THREADS ?= 2
export MPLBACKEND ?= Agg
export PYTHONDONTWRITEBYTECODE := 1
# tests/test_browser.py drives Debian's chromium: Playwright must never download a browser of its own
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: demo test lab trust install install-dev browser binder-url lint bench calibrate fit clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

# chromium for the real-browser test (tests/test_browser.py): apt-get as root; otherwise a clear
# message (the test skips without chromium, and fails when CI=true)
browser:
	@command -v chromium >/dev/null 2>&1 || [ -x "$${PYPTO_CHROMIUM:-}" ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing chromium with apt-get for tests/test_browser.py"; \
	    export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "make: chromium is missing and cannot be installed here (needs root and apt-get)."; \
	    echo "      Install it with 'sudo apt-get install -y chromium' (or set PYPTO_CHROMIUM to a chromium binary);"; \
	    echo "      until then tests/test_browser.py is skipped (and fails when CI=true)."; \
	  fi; }

demo: install
	$(BIN)/pypto-lab tour

# the course: JupyterLab on notebooks/ (00_quickstart first; notebooks/README.md is the guide).
# LAB_ARGS passes more options, e.g. make lab LAB_ARGS="--no-browser --port 8899"
LAB_ARGS ?=
lab: install trust
	cd notebooks && ../$(BIN)/jupyter lab --notebook-dir=. $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS) 00_quickstart.ipynb

# sign the shipped notebooks with this user's Jupyter secret, so JupyterLab shows their stored
# outputs (pictures, widgets' static views) as trusted: they were executed by this repository's
# generators, not written by a stranger (tests/test_first_hour.py checks the result)
NOTEBOOKS_TO_TRUST := $(wildcard notebooks/*.ipynb notebooks/exercises/*.ipynb notebooks/exercises/solutions/*.ipynb)
trust:
	@$(BIN)/jupyter trust $(NOTEBOOKS_TO_TRUST) >/dev/null && echo "make: $(words $(NOTEBOOKS_TO_TRUST)) notebooks signed as trusted"

# two pytest workers (pytest-xdist); --dist loadfile keeps each file, and so each notebook's cells,
# in order on one worker. TEST_WORKERS=0 runs in this process (e.g. for pdb).
TEST_WORKERS ?= 2
test: install-dev browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests --nbval-lax --nbval-sanitize-with notebooks/nbval_sanitize.cfg notebooks

lint: install-dev
	$(BIN)/ruff check pypto_lab tests benchmarks

bench: install
	$(BIN)/python benchmarks/bench_simulator.py

calibrate: install
	$(BIN)/pypto-lab calibrate --chip Ascend910B1
	$(BIN)/pypto-lab calibrate --chip Ascend910B3

fit: install
	$(BIN)/python -m pypto_lab.hw.fit

# the one-click Binder link (opens notebooks/00_quickstart.ipynb) for this clone's GitHub remote
binder-url:
	@url=$$(git remote get-url origin 2>/dev/null) || { echo "no git remote 'origin' yet: push the repository to GitHub first"; exit 1; }; \
	slug=$$(echo "$$url" | sed -E 's#^(https://github\.com/|git@github\.com:)##; s#\.git$$##'); \
	echo "https://mybinder.org/v2/gh/$$slug/HEAD?labpath=notebooks%2F00_quickstart.ipynb"

clean:
	rm -rf $(VENV) .numba_cache out .pytest_cache .hypothesis
