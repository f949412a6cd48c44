# Set-up and entry points. `make demo` and `make test` create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first: a looser requirement would pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) benchmarks/demo.py

test: $(STAMP)
	$(PY) -m pytest -q -x --timeout=900 tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/e2e_cpu.py

clean:
	rm -rf $(VENV) build *.egg-info
