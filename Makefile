# The two commands a new user runs on a fresh clone:
#   make demo   - local broker, example app, sidecar, poison records going to the DLQ
#   make test   - lint, type-check and the whole test suite against a real local broker
# Needs only Python 3.11+, Java 17+ and Maven (or KAFKA_BOOTSTRAP=host:port for an existing broker).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv demo test lint typecheck pytest broker-start broker-stop tools clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

tools: venv
	scripts/install-tools

DEMO_ARGS ?=

demo: venv
	$(BIN)/dlq-sidecar demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy --strict sidecar

# The suite waits on real outages far more than it computes: its files run side by side (one file per worker,
# so a module's fixtures stay together). PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 3

pytest: venv tools
	$(BIN)/pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=25

test: lint typecheck pytest

broker-start:
	scripts/kafka start

broker-stop:
	scripts/kafka stop

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
