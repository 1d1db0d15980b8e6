# `make install` sets up .venv with every extra, once; `make demo` and `make test` rest on it.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.phasescope-installed
PYTHON ?= python3

.PHONY: install demo test lint check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of PyTorch comes from the local wheel this pin selects (see README).
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[torch,web,tui,verify,otel,dev]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/phasescope demo

test: install
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo --no-cache

check: lint test

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
