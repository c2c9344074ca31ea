# The two set-up commands of the README. Each creates .venv when it is missing and installs into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lifecycle-es demo

lint: $(STAMP)
	$(BIN)/ruff check lifecycle_es projections hosts tests benchmarks

test: lint
	$(BIN)/python -m pytest -m "not slow" -q

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m benchmarks --quick

clean:
	rm -rf $(VENV) build *.egg-info
