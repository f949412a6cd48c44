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

# Two phases: the tests that do not time anything spread over the cores (one process
# each, up to 8: each holds torch and TVM), then the `serial` ones alone, since their
# time-outs and measured costs assume idle cores.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 8 ? n : 8 )))
test: $(STAMP)
	$(PY) -m pytest -q -x --timeout=900 -n $(TEST_WORKERS) --dist loadfile -m "not serial" tests
	$(PY) -m pytest -q -x --timeout=900 -m serial tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/e2e_cpu.py

clean:
	rm -rf $(VENV) build *.egg-info
