# Quickstart: `make demo` runs the word-count demo with a crash and recovery;
# `make test` runs the whole test suite. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: system-packages bytecode demo test test-fast lint typecheck docs docs-serve bench bench-all clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "need Python 3.11+ (python3.11 on PATH)"; exit 1; }
	@command -v java >/dev/null 2>&1 || { echo "need Java 17 (java on PATH) for Spark"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Slot processes import the package afresh for every job; bytecode kept current here
# spares each of them compiling it again where PYTHONDONTWRITEBYTECODE is set.
bytecode: $(STAMP)
	@$(PY) -m compileall -q src

demo: bytecode
	SPARK_LOCAL_IP=127.0.0.1 $(PY) examples/wordcount_demo.py

# Java, PostgreSQL, nats-server, chromium and chromedriver for the suite's real components:
# installed with apt-get as root, otherwise named with the tests that will be skipped.
system-packages:
	@scripts/system-packages.sh

test: system-packages bytecode
	SPARK_LOCAL_IP=127.0.0.1 $(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

lint: $(STAMP)
	$(PY) -m ruff check src tests bench examples
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or a
# docstring the API reference cannot render fails the build. Its Python examples run in
# the test suite (tests/test_docs_examples.py). `make docs-serve` serves it while you edit.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

bench: bytecode
	$(PY) bench/run.py

bench-all: $(STAMP)  # bench/all.py compiles the bytecode itself
	SPARK_LOCAL_IP=127.0.0.1 $(PY) bench/all.py

clean:
	rm -rf $(VENV) build site *.egg-info src/*.egg-info
