# The two set-up commands of the README: `make demo` and `make test`. Each works on a fresh
# machine with only python3: it creates .venv, installs the package and runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache
export NUMBA_NUM_THREADS ?= 2
export MPLBACKEND ?= Agg
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test install install-dev lint bench calibrate fit clean

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

demo: install
	$(BIN)/pypto-lab tour

test: install-dev
	$(BIN)/python -m pytest -q tests --nbval-lax notebooks

lint: install-dev
	$(BIN)/ruff check pypto_lab tests benchmarks

bench: install
	$(BIN)/python benchmarks/bench_simulator.py

calibrate: install
	$(BIN)/pypto-lab calibrate --chip Ascend910B1
	$(BIN)/pypto-lab calibrate --chip Ascend910B3

fit: install
	$(BIN)/python -m pypto_lab.hw.fit

clean:
	rm -rf $(VENV) .numba_cache out .pytest_cache .hypothesis
