# The README's commands. `make demo` and `make test` set everything up from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint format bench bench-columnar clean java

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "extagg needs Python >= 3.10")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	@touch $(STAMP)

setup: $(STAMP)

## java: make sure Java 17 is there for the PySpark tests (installs Debian's JDK when it can)
java:
	@bash scripts/ensure-java.sh

## demo: the main job on built-in sample data (spills under a small budget, prints metrics)
demo: $(STAMP)
	$(PY) -m extagg demo

## test: lint, type check and every test, slow and PySpark ones included
test: $(STAMP) java
	$(VENV)/bin/ruff check extagg tests benchmarks
	$(VENV)/bin/ruff format --check extagg tests benchmarks
	$(PY) -m mypy
	$(PY) -m pytest -q

lint:
	$(VENV)/bin/ruff check extagg tests benchmarks
	$(PY) -m mypy
format:
	$(VENV)/bin/ruff format extagg tests benchmarks
	$(VENV)/bin/ruff check --fix extagg tests benchmarks

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_generic.py

bench-columnar: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_columnar.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
