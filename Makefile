# `make demo` and `make test` set everything up: they create .venv and install the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python examples/two_layer_net.py

test: $(BIN)/.installed
	$(BIN)/python -m pytest

test-slow: $(BIN)/.installed
	$(BIN)/python -m pytest -m slow

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV)
