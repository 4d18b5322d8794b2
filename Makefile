# celery-grousset developer tasks. GNU make. `make` alone lists the targets.
#
#   make test                      lint + the whole pytest suite
#   make demo DATABASE_URL=postgres://postgres@127.0.0.1:5432/test
#   make test PYTEST_ARGS="-x -k claim"

PYTHON      ?= python3
VENV        ?= .venv
PYTEST_ARGS ?= -q
BENCH_ARGS  ?=
CHAOS_ARGS  ?=
CHAOS_RUNS  ?= 5

export CHAOS_RUNS
# Pass these through to the demo (and everything else) only when given,
# so an unset variable never reaches the environment as an empty string.
ifdef DATABASE_URL
export DATABASE_URL
endif
ifdef CELERY_BROKER_URL
export CELERY_BROKER_URL
endif

BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.DEFAULT_GOAL := help

.PHONY: help venv lint test test-fast compat demo docs snippets bench chaos services clean

help: ## list the targets
	@echo "celery-grousset — make targets:"
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) \
		| sed -E 's/^([a-zA-Z_-]+):.*## (.*)$$/  \1\t\2/' \
		| expand -t 14
	@echo
	@echo "variables: PYTHON=$(PYTHON) VENV=$(VENV) PYTEST_ARGS='$(PYTEST_ARGS)' TEST_PROCS=$(TEST_PROCS)" \
		"BENCH_ARGS CHAOS_ARGS CHAOS_RUNS=$(CHAOS_RUNS) DATABASE_URL CELERY_BROKER_URL"

venv: $(STAMP) ## create the venv and install the package with its [dev] extra

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip

# pip -qq: errors only (plain -q still prints this machine's index-location warnings).
# Re-install only when pyproject.toml changed since the last successful install.
$(STAMP): pyproject.toml | $(BIN)/python
	@# mysqlclient builds from source against Debian's headers: fetch them if we can.
	@if ! pkg-config --exists mysqlclient 2>/dev/null && [ "$$(id -u)" = 0 ]; then \
		scripts/apt-deps.sh; \
	fi
	$(BIN)/python -m pip install -qq -e ".[dev]"
	@touch $@

# The [bench] extra (matplotlib, celery-once, Powertools, py-spy): `make bench`, and the
# test that runs every benchmark scenario at --quick size (tests/test_bench.py).
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -qq -e ".[bench]"
	@touch $@

lint: venv ## ruff + mypy (strict, django plugin)
	$(BIN)/ruff check .
	$(BIN)/mypy celery_grousset

# The suite is mostly waiting (worker processes, brokers, lock timeouts): TEST_PROCS
# pytest processes share it, one test file per process at a time, each on databases of its
# own (tests/settings.py). The few tests marked `serial` change a whole server (stop
# PostgreSQL, a global MariaDB setting) or time pages tightly, and run after, alone.
TEST_PROCS ?= 3

test: lint $(BENCH_STAMP) ## lint, then the whole pytest suite (PYTEST_ARGS='-q', TEST_PROCS=3)
	$(BIN)/pytest -n $(TEST_PROCS) --dist loadfile -m "not serial" $(PYTEST_ARGS)
	$(BIN)/pytest -m serial $(PYTEST_ARGS)

test-fast: venv ## pytest without slow, browser and chaos tests
	$(BIN)/pytest -m "not slow and not browser and not chaos" $(PYTEST_ARGS)

compat: ## core tests on Django 4.2 + Celery 5.3, Django 6.0 and 6.1 (Python 3.12), psycopg2 only
	scripts/compat.sh dj42 dj60 dj61 pg2

demo: venv ## run the example project's demo (honours DATABASE_URL, CELERY_BROKER_URL)
	$(BIN)/python -m example_project.demo

docs: venv ## build the mkdocs site into site/ (strict)
	$(BIN)/mkdocs build --strict -d site

snippets: venv ## write the docs' code samples out in their pages from the files tests run
	$(BIN)/python scripts/inline_snippets.py

bench: $(BENCH_STAMP) ## run the benchmarks (BENCH_ARGS=...; installs the [bench] extra)
	$(BIN)/python -m bench $(BENCH_ARGS)

chaos: venv ## run the chaos scenarios (CHAOS_RUNS=5, CHAOS_ARGS=...)
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

services: ## start PostgreSQL, MariaDB, Redis, RabbitMQ if they are down
	scripts/services.sh start

clean: ## remove the venv, caches, site/ and .demo/
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis \
		site .demo build dist tests/artifacts bench/.work .venv-compat-*
	find . -path ./.git -prune -o \( -name __pycache__ -o -name '*.egg-info' \) \
		-prune -exec rm -rf {} +

# -- the package as users get it ---------------------------------------------------------

# --all: every python3.10 ... 3.13 on this machine (the classifiers' versions).
WHEEL_SMOKE_ARGS ?= --all

.PHONY: wheel-smoke
wheel-smoke: venv ## build sdist+wheel, twine check, smoke-test the wheel in clean venvs
	BUILD_PYTHON=$(BIN)/python scripts/wheel-smoke.sh $(WHEEL_SMOKE_ARGS)
