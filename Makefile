# The two commands a new user runs on a fresh clone:
#   make demo   - local broker, example app, sidecar, poison records going to the DLQ
#   make test   - lint, type-check and the whole test suite against a real local broker
# make demo needs Python 3.11+, Java 17+ and Maven (or KAFKA_BOOTSTRAP=host:port for an existing broker); make test
# also Go 1.26+, Node.js, openssl and Chromium (docs/development.md, "Two commands").

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv demo test lint typecheck pytest unit-pure compiled pure wheel broker-start broker-stop tools clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	@# The build backend's notes (setuptools' editable-install warning box) go to a log, shown on failure only.
	DLQ_SIDECAR_MYPYC=0 $(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]' \
		> $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
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

# The pure core (sidecar/core) compiled by mypyc, in place (setup.py, DLQ_SIDECAR_MYPYC=1): extension modules
# beside the sources, which Python then imports instead of them, so every run of the checkout (tests included)
# uses them until `make pure` removes them. Needs a C compiler; mypy comes with the dev extra. A source edited
# after the build stops the test run (tests/conftest.py): run `make compiled` again.
compiled: venv
	DLQ_SIDECAR_MYPYC=1 $(BIN)/python setup.py -q build_ext --inplace

pure:
	find sidecar -name '*.so' -delete

# The unit tests against the core's sources though a build sits beside them (DLQ_SIDECAR_PURE=1): with
# `make compiled` and `make pytest`, both variants.
unit-pure: venv
	DLQ_SIDECAR_PURE=1 $(BIN)/pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) tests/unit

# Both wheels into dist/: the compiled one for this platform and Python, and the universal pure-Python one
# that pip falls back to where the compiled one does not fit.
# build/lib* first: setuptools packs what an earlier build left there (the C objects in build/temp* are reused).
wheel: venv
	rm -rf build/lib build/lib.*
	DLQ_SIDECAR_MYPYC=1 $(BIN)/python -m pip wheel -q --no-deps -w dist .
	DLQ_SIDECAR_MYPYC=0 $(BIN)/python -m pip wheel -q --no-deps -w dist .

broker-start:
	scripts/kafka start

broker-stop:
	scripts/kafka stop

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist
	find sidecar -name '*.so' -delete
