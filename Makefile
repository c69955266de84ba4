# `make demo` and `make test` set everything up: they create .venv and install the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow lint bench clean

# A regular (not editable) install, so that only the name `tracer` is importable from the venv
# (ir/, codegen/ and runtime/ install as its subpackages); it is redone whenever a source changes.
SOURCES := $(shell find tracer ir codegen runtime -name '*.py' -o -name '*.j2')

$(BIN)/.installed: pyproject.toml $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python examples/two_layer_net.py

# Two processes (pytest-xdist): the suite's tests are independent, and CI's machine has 2 cores.
# A test still running after 15 minutes prints every thread's stack (a hang shows where it waits).
test: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 -o faulthandler_timeout=900

# ruff's rules (pyproject.toml) and the size budget of production code (.ci/size_budget.py).
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/python .ci/size_budget.py

test-slow: $(BIN)/.installed
	$(BIN)/python -m pytest -m slow

bench: $(BIN)/.installed
	$(BIN)/pip install --quiet '.[bench]'
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV)
