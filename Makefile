# onceflow — `make help` lists the targets. Every target bootstraps .venv when it is missing.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python
export NO_GCE_CHECK := true
export PYTHONDONTWRITEBYTECODE := 1

# The first Python 3.11 or newer found (3.11 first: the functions' runtime is python311). Each
# candidate is run, not only looked up: a pyenv shim exists for versions it can't start.
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3.14 python3; do \
  $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; done)

.venv/.installed: requirements.txt requirements-dev.txt pyproject.toml
	@test -x $(PY) || { test -n "$(PYTHON)" || { echo "no Python 3.11 or newer found: install one (or make PYTHON=/path/to/python3)"; exit 1; }; $(PYTHON) -m venv .venv; }
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@# The `onceflow` command (a script running shared.ops.cli from this checkout; not an editable
	@# install, which would make the checkout importable everywhere: devstack/install_command.py).
	@$(PY) -m devstack.install_command .venv >/dev/null
	@touch $@

venv: .venv/.installed ## Create .venv and install every dependency (quick when up to date)

.PHONY: help venv browser test lint typecheck unit dev dev-down dev-status demo migrate schema fmt \
        bench-ingest bench-admit bench-steps bench-latency bench-e2e bench-poll bench-concurrency \
        bench-retention bench-debounce config-reference scenarios

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

browser: ## Install Debian's chromium for the ops page test when it is missing (needs root)
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian chromium for the page test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing and not root: the page test will be skipped (apt-get install chromium)"; fi; }

test: .venv/.installed browser ## Lint, type-check and run the whole test suite (real Postgres, emulator)
	$(PY) -m ruff check shared functions tests devstack main.py
	$(PY) -m mypy
	terraform fmt -check -recursive infra
	$(PY) -m pytest $(PYTEST_ARGS)

lint: .venv/.installed ## ruff only
	$(PY) -m ruff check shared functions tests devstack main.py

typecheck: .venv/.installed ## mypy --strict on shared/ and functions/
	$(PY) -m mypy

fmt: .venv/.installed ## Format Python and Terraform
	$(PY) -m ruff format shared functions tests devstack main.py
	terraform fmt -recursive infra

dev: .venv/.installed ## Start the local stack (Postgres, Pub/Sub emulator, functions, scheduler, fake CRM)
	$(PY) -m devstack.stack up

dev-down: .venv/.installed ## Stop exactly what `make dev` started
	$(PY) -m devstack.stack down

dev-status: .venv/.installed ## Health table of the running local stack
	$(PY) -m devstack.stack status

demo: .venv/.installed ## Start the stack, run the demo scenario, explain it, stop
	$(PY) -m devstack.demo

migrate: .venv/.installed ## Apply pending migrations to DATABASE_URL (or the local stack's)
	$(PY) -m devstack.stack migrate

schema: .venv/.installed ## Export the workflow JSON Schema to schema/workflow.schema.json
	$(PY) -m shared.ops.cli schema --out schema/workflow.schema.json

config-reference: .venv/.installed ## Write the README's configuration reference from shared/core/settings.py
	$(PY) -m devstack.config_reference

scenarios: .venv/.installed ## Play the examples' scenarios on a virtual clock (`onceflow test`, a throwaway cluster)
	$(PY) -m shared.ops.cli test examples/workflows/scenarios/*.yaml

floorplan: .venv/.installed ## The floor plan of shared/: loose modules, largest file, long functions, import circles, upward arrows
	$(PY) -m devstack.floorplan

bench-ingest: .venv/.installed ## Benchmark webhooks, drain and publish against pgbench
	$(PY) -m devstack.bench.ingest

bench-admit: .venv/.installed ## Benchmark admission against pgbench
	$(PY) -m devstack.bench.admit

bench-steps: .venv/.installed ## Benchmark step execution against pgbench
	$(PY) -m devstack.bench.steps

bench-latency: .venv/.installed ## Webhook → admission decision → first step latency (p50/p99) through the local stack
	$(PY) -m devstack.bench.latency

bench-e2e: .venv/.installed ## Signed HubSpot batches → 3-step runs finished: events/s and p50/p99 latency vs pgbench
	$(PY) -m devstack.bench.e2e

bench-poll: .venv/.installed ## Time a poll pass over 10k and 1M rows (1,000 pending): flat?
	$(PY) -m devstack.bench.poll

bench-concurrency: .venv/.installed ## One advance_step process at 1..16 requests at once: steps/s, CPU share, connections
	$(PY) -m devstack.bench.concurrency

bench-retention: .venv/.installed ## Retention over ~1M expired rows: rows/s, and bench-steps with it vs without
	$(PY) -m devstack.bench.retention

bench-debounce: .venv/.installed ## 1,000 changes on 100 records in 10 s, debounce 5s: 100 runs, 900 superseded, last event → run p50/p99
	$(PY) -m devstack.bench.debounce
