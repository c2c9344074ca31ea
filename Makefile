# The two set-up commands of the README. Each creates .venv when it is missing and installs into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench dist clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# setuptools warns, on every editable install, that a folder named like the package may shadow it:
# here that folder is the package, so the warning says nothing to a user of this Makefile.
QUIET := PYTHONWARNINGS=ignore::UserWarning

$(STAMP): $(BIN)/python pyproject.toml
	$(QUIET) $(BIN)/python -m pip install --quiet --upgrade pip
	$(QUIET) $(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lifecycle-es demo
	$(BIN)/lifecycle-es timeline demo-run/runners.db -o demo-run/timeline.svg
	@echo "The runner's life as a picture: demo-run/timeline.svg (open it in a browser; hover a shape for its seq)"

lint: $(STAMP)
	$(BIN)/ruff check lifecycle_es projections hosts tests benchmarks
	$(BIN)/mypy --strict lifecycle_es projections hosts

test: lint
	$(BIN)/python -m pytest -m "not slow" -q

bench: $(STAMP)
	$(QUIET) $(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m benchmarks --quick

# Build the wheel and sdist, install the wheel into a fresh venv, and import the three packages there.
dist: $(STAMP)
	rm -rf dist build/dist-venv
	$(QUIET) $(BIN)/python -m build --quiet --outdir dist . >/dev/null
	$(PYTHON) -m venv build/dist-venv
	$(QUIET) build/dist-venv/bin/python -m pip install --quiet dist/*.whl
	cd build && dist-venv/bin/python -c "import lifecycle_es, projections, hosts, importlib.resources as r; \
	  assert all(r.files(p).joinpath('py.typed').is_file() for p in ('lifecycle_es', 'projections', 'hosts')); \
	  print('wheel ok:', lifecycle_es.__version__)"
	build/dist-venv/bin/lifecycle-es --version

clean:
	rm -rf $(VENV) build dist *.egg-info
