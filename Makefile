# seam: `make demo` to see it score a live stream, `make test` to run every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
KAFKA_PORT ?= 9092
export KAFKA_PORT

.DEFAULT_GOAL := help
.PHONY: help install kafka-jars kafka-up kafka-down kafka-status kafka-tool registry registry-up registry-down system-tools demo test unit integration lint model bench-model bench bench-ingest bench-models bench-formats images compose-test compose-secrets clean

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

install: $(VENV)/.installed  ## Create .venv and install seam with its dev and bench dependencies.

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "seam needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $@

kafka-jars:  ## Fetch Apache Kafka's jars and command-line tools from Maven Central (once) into .cache/kafka.
	@$(PYTHON) scripts/kafka_local.py fetch

kafka-up: kafka-jars  ## Start a local single-node broker on 127.0.0.1:$KAFKA_PORT (idempotent); SECURE=1 USERS="name=password ...": SASL_SSL with ACLs.
	@$(PYTHON) scripts/kafka_local.py up $(if $(SECURE),--secure $(foreach user,$(USERS),--user $(user)))

kafka-down:  ## Stop the local broker started by kafka-up.
	@$(PYTHON) scripts/kafka_local.py down

kafka-status:  ## Say whether the local broker runs (SECURE=1: the secured one).
	@$(PYTHON) scripts/kafka_local.py status $(if $(SECURE),--secure)

kafka-tool: kafka-jars  ## Kafka's own tools: make kafka-tool ARGS="kafka-consumer-groups --describe --group seam"
	@$(PYTHON) scripts/kafka_local.py tool $(ARGS)

registry:  ## Build the local schema registry (Apicurio Registry, from Maven Central) into .cache/registry (once).
	@$(PYTHON) scripts/registry_local.py build

registry-up: registry  ## Start the schema registry on 127.0.0.1:$REGISTRY_PORT (default 8081; Confluent API at /apis/ccompat/v6).
	@$(PYTHON) scripts/registry_local.py up

registry-down:  ## Stop the schema registry started by registry-up.
	@$(PYTHON) scripts/registry_local.py down

system-tools:  ## Install Chromium, chromedriver, Prometheus, Docker, docker-compose and mmdebstrap (Debian packages) for the tests, where possible.
	@bash scripts/system_tools.sh

demo: install kafka-jars  ## Start a broker and a worker, score ~30 s of a live stream, stop both (SPEC=specs/sensors.toml, DEMO_ARGS="--duration 5").
	$(PY) scripts/demo.py $(if $(SPEC),--spec $(SPEC)) $(DEMO_ARGS)

test: install kafka-jars registry system-tools  ## Run unit and integration tests (starts and stops its own broker and registry), then compose-test.
	$(PY) -m pytest
	$(PY) scripts/compose_test.py

images: install kafka-jars  ## Build the container images here (a Debian base, a wheelhouse; see docker-compose.local.yml).
	$(PY) scripts/images.py

compose-test: install kafka-jars  ## Kafka and 3 workers in docker compose: kill one, scale to 2 and 4, every input answered (skips without Docker; fails instead when CI is set); SECURE=1: the secured variant.
	$(PY) scripts/compose_test.py $(if $(SECURE),--secured)

compose-secrets: install  ## Make the secured compose variant's CA, broker keystore, passwords and ACLs in .secrets/compose (once).
	$(PY) scripts/compose_secrets.py

unit: install  ## Run the unit tests only (no broker).
	$(PY) -m pytest tests/unit

integration: install kafka-jars registry system-tools  ## Run the integration tests only.
	$(PY) -m pytest tests/integration

lint: install  ## ruff, mypy, the layers (import-linter), and the docs' relative links and #anchors (lychee, offline).
	$(PY) -m ruff check app agents tables bench scripts tests
	$(PY) -m mypy app agents tables bench
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/lychee --offline --include-fragments --no-progress README.md docs/*.md

model: install  ## Retrain models/fraud-mlp.onnx (deterministic); SPEC=specs/sensors.toml: models/sensors-mlp.onnx.
	$(PY) scripts/train_model.py $(if $(SPEC),--spec $(SPEC))

bench-model: install  ## Rebuild models/fraud-mlp-bench.onnx, the heavier benchmark model (deterministic).
	$(PY) scripts/train_model.py --bench-depth 2000 --name fraud-mlp-bench --out models/fraud-mlp-bench.onnx

bench: install kafka-jars  ## End-to-end benchmark, all modes, both models (~10 min); writes docs/BENCHMARKS.md and plots.
	$(PY) -m bench --out docs --write docs/BENCHMARKS.md

bench-ingest: install kafka-jars  ## Ingestion benchmark: batch ingestion vs Faust take() vs raw aiokafka.
	$(PY) scripts/bench_ingest.py --pipeline --write docs/BENCHMARKS.md

bench-models: install kafka-jars  ## Model deployments: p99 around a swap vs before it, and what a shadow costs (~6 min).
	$(PY) scripts/bench_models.py --pairs 2 --swaps 2 --write docs/BENCHMARKS.md

bench-formats: install kafka-jars registry  ## Avro input vs JSON: saturation pairs and per-record decode/encode cost (~8 min).
	$(PY) scripts/bench_formats.py --pairs 3 --write docs/BENCHMARKS.md

clean:  ## Remove local data: workers' state, stopped local brokers' data (not the venv or the Kafka jars).
	rm -rf .data .pytest_cache
	@$(PYTHON) scripts/kafka_local.py purge
