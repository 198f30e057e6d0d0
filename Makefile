# Aliases for the README's commands. Each target creates .venv and installs first if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The documentation site's own environment (docs/requirements.txt), apart from the application's.
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed-stamp

.PHONY: up test lint format protos bench docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

up: $(STAMP)  ## the whole stack on this machine: web, worker, beat, simulated agents
	$(BIN)/gpuadmin up

# Test processes (pytest-xdist): most tests wait on PostgreSQL, a server or a browser, so three
# overlap well on 2 cores; 0 runs the suite in this process. Tests are handed out in
# pytest-django's order (transactional tests, which flush the migrations' rows, last), not
# grouped by file, except that the tests of one session-wide system (Ray, Slurm, Sentinel, the
# built docs: tests/conftest.py's SESSION_SYSTEMS) go to one process, which starts it once.
TEST_WORKERS ?= 3
TEST_DIST ?= --dist loadgroup --no-loadscope-reorder

# The tests of /docs/ build the site with the documentation's environment (tests/conftest.py).
test: $(STAMP) $(DOCS_STAMP)  ## the whole suite (browser and integration tests included)
	sh .ci/install-chromium
	sh .ci/install-prometheus
	sh .ci/install-slurm
	sh .ci/install-pgbouncer
	sh .ci/install-redis-sentinel
	PYTHON=$(BIN)/python sh .ci/install-ray
	DOCS_VENV=$(DOCS_VENV) $(BIN)/python -m pytest -n $(TEST_WORKERS) $(TEST_DIST) $(PYTEST_ARGS)

lint: $(STAMP)  ## ruff check + format check + import contracts + missing migrations + mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/gpuadmin manage makemigrations --check --dry-run
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The gRPC API's code in gpuadmin/v1/, from protos/gpuadmin/v1/*.proto
# (tests/gpuadmin/test_grpc_protos.py fails while the committed code is stale).
protos: $(STAMP)  ## regenerate the gRPC code from protos/
	$(BIN)/python protos/generate.py

$(DOCS_STAMP): docs/requirements.txt
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet -r docs/requirements.txt
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)  ## the documentation site in site/, built strictly (a broken link fails)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

bench: $(STAMP)  ## every benchmark script; each ends with its headline figures
	for script in bench/*.py; do [ $$script = bench/common.py ] || $(BIN)/python $$script || exit 1; done

clean:  ## stop the embedded servers and delete their data
	-$(BIN)/gpuadmin services stop
	rm -rf .gpuadmin
