# The README's commands. `make demo` and `make test` set everything up from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo demo-generic test lint format docs plots trace bench bench-columnar bench-files bench-scaling clean java faults

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

## demo: the main job — `extagg aggregate` on a generated lineitem-like Parquet sample
##       (4 M rows, cached in .cache/): a Q1-like query and a 1 M-group query that spills
##       under 32 MiB, with progress, first rows and summaries, both checked against NumPy
demo: $(STAMP)
	$(PY) -m extagg demo-files

## demo-generic: the generic engine on generated (key, value) records under a 32 MiB budget
demo-generic: $(STAMP)
	$(PY) -m extagg demo

## test: lint, type check and every test, slow and PySpark ones included, on every core the
##       process may use (pytest-xdist workers, at most 4: each PySpark worker starts a JVM)
TEST_JOBS ?= $(shell $(PYTHON) -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')
test: $(STAMP) java
	$(VENV)/bin/ruff check extagg tests benchmarks
	$(VENV)/bin/ruff format --check extagg tests benchmarks
	$(PY) -m mypy
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	$(PY) -m pytest -q -n $(TEST_JOBS)

## faults: the fault-injection suites, larger than in CI: every write/fsync/rename of bigger
## workloads failed in turn, and FAULTS SIGKILLs per workload (counts in faults-report.json)
FAULTS ?= 100
FAULT_SCALE ?= 3
faults: $(STAMP)
	EXTAGG_FAULTS=$(FAULTS) EXTAGG_FAULT_SCALE=$(FAULT_SCALE) EXTAGG_FAULT_REPORT=faults-report.json \
		$(PY) -m pytest tests/faults -q

lint:
	$(VENV)/bin/ruff check extagg tests benchmarks
	$(PY) -m mypy
format:
	$(VENV)/bin/ruff format extagg tests benchmarks
	$(VENV)/bin/ruff check --fix extagg tests benchmarks

## docs: the documentation site into site/ (--strict: a broken link or an undocumented public name fails)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

## plots: docs/img/*.png from the latest benchmarks/results/*.json (and the RSS trace)
plots: $(STAMP)
	$(PY) benchmarks/plots.py

## trace: record a new RSS-over-time trace of one spilling run (benchmarks/results/rss-trace.json)
trace: $(STAMP)
	$(PY) benchmarks/rss_trace.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_generic.py

bench-columnar: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_columnar.py

bench-files: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_files.py

## bench-scaling: time and peak RSS against rows, groups, the budget and threads (docs/img/scaling-*.png)
bench-scaling: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_scaling.py

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .ruff_cache
