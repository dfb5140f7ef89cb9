# Two commands on a fresh machine with Python 3.11: `make demo` and `make test`
# (`make docs` builds the documentation site into site/).
# Both build .venv first, and rebuild it only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo needs jobrun's runtime dependencies only; the development tools
# (the STAMP above) come with `make test`.
RUNTIME_STAMP := $(VENV)/.runtime-installed
# Material's banner about its successor is not a warning about these docs.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

.PHONY: venv demo test docs mutation chaos clean

venv: $(STAMP)

# The stamp records "installed from this pyproject.toml"; an existing .venv is
# reused as is (never recreated over another interpreter).
$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) \
		and "jobrun needs Python 3.11 or newer: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# DEMO passes options, e.g. make demo DEMO='--latency-ms 200' to watch it go.
DEMO ?=
demo: $(RUNTIME_STAMP)
	$(BIN)/python examples/walk_demo.py $(DEMO)

# Postgres tests run when JOBRUN_TEST_POSTGRES_URL is set and skip otherwise.
test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest
	$(MKDOCS) build --strict --quiet

# The documentation site, into site/ (warnings are errors, as in `make test`).
docs: venv
	$(MKDOCS) build --strict

# Mutation testing on demand, never in CI (see tests/README.md). MUTANTS narrows
# it, e.g. make mutation MUTANTS='jobrun._core.lease*'.
# One child by default: the machine is shared (MUTATION_CHILDREN=2 on a free one).
# CI and the Postgres URL are unset: the Postgres tests then skip instead of failing.
MUTANTS ?=
MUTATION_CHILDREN ?= 1
mutation: venv
	$(BIN)/python -m pip install --quiet -e '.[mutation]'
	env -u CI -u JOBRUN_TEST_POSTGRES_URL $(BIN)/mutmut run --max-children $(MUTATION_CHILDREN) $(MUTANTS)
	$(BIN)/mutmut results

# Faults injected into real drivers, judged from the step bodies' own log (issue 21);
# the table goes to chaos-results.md/.json. Root (tmpfs mounts, a throwaway Postgres
# cluster) for the full set; CHAOS='--quick' for the bounded set, CHAOS="--only 'kill -9'".
CHAOS ?=
chaos: venv
	$(BIN)/python -m tests.chaos $(CHAOS)

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache \
		.import_linter_cache .hypothesis mutants
	rm -f demo.db demo.db-wal demo.db-shm chaos-results.md chaos-results.json
