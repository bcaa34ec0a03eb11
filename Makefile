# idemops: `make run` serves the platform, `make test` runs the whole suite.
# Both start from nothing: they create .venv and install what they need
# (requirements.txt to run; requirements-dev.txt adds tests, linters, benchmarks; `make test`
# also installs the TypeScript MCP client of tests/interop with npm ci: Node and npm, see README.md's Quick start).

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
RUNTIME := $(VENV)/.installed-runtime
DEV     := $(VENV)/.installed-dev
# The third-party MCP clients the tests drive, pinned in tests/interop/package-lock.json: the TypeScript SDK,
# the official conformance suite (@modelcontextprotocol/conformance) and the Inspector CLI.
INTEROP := tests/interop/node_modules/.package-lock.json

.PHONY: run test bench bench-quick install install-dev install-interop db-stop clean lint settings-doc screenshots

$(RUNTIME): requirements.txt idemops_client/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	# The agent's side too (its one dependency, mcp, is in requirements.txt): .venv/bin/idemops-client, the proxy
	# for MCP hosts. Editable, so the command runs this tree's client.
	$(PY) -m pip install --quiet --no-deps --editable ./idemops_client
	@touch $(RUNTIME)

$(DEV): $(RUNTIME) requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $(DEV)

$(INTEROP): tests/interop/package-lock.json
	npm ci --prefix tests/interop --no-audit --no-fund

install: $(RUNTIME)

install-dev: $(DEV)

install-interop: $(INTEROP)

run: $(RUNTIME)
	$(PY) manage.py serve

# The suite runs on TEST_WORKERS pytest-xdist workers, a test file per worker at a time (--dist loadfile keeps
# a module's servers in one process); each worker has its own embedded PostgreSQL under var/xdist-<worker>/.
# Most of the suite waits on real processes, so three workers pay on two cores. TEST_WORKERS=0: one process.
# The files that take minutes go first (tests/conftest.py, LONG_FILES_FIRST), in place of xdist's own order.
TEST_WORKERS ?= 3

test: $(DEV) $(INTEROP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The console's browser tests, writing the pictures docs/operators-admin.md shows into docs/images/.
screenshots: $(DEV)
	DOC_SCREENSHOTS=1 $(PY) -m pytest tests/admin/test_console_browser.py -q

# Every benchmark, full sizes: writes docs/benchmarks.md and docs/benchmarks.json (P1 … P9 by name).
bench: $(DEV)
	$(PY) bench/run.py

# The same code at small sizes (about 5 minutes on 2 cores), into var/bench-quick/; tests/deploy/test_bench_quick.py runs it.
bench-quick: $(DEV)
	$(PY) bench/run.py --quick

# ruff, the import contracts of pyproject.toml ([tool.importlinter]: layers import only downwards) and mypy
# in strict mode ([tool.mypy]: the platform, the public tool API, the demo, the client, the conformance suite).
# mypy's Django plugin imports the settings: a DATABASE_URL it never connects to, so that no embedded
# server is started (and left running) to check types.
lint: $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	DATABASE_URL=postgresql://lint@127.0.0.1:1/never $(VENV)/bin/mypy

# docs/settings.md is generated from tools_app/conf/fields.py and the demo's idemops_demo/idemops_settings.py (tests/deploy/test_settings.py fails when it is stale).
settings-doc: $(RUNTIME)
	$(PY) -m idemops.conf idemops_demo > docs/settings.md

# Stop the embedded PostgreSQL servers (make run's, and the tests' or benchmarks' left by a killed run: a test
# session stops the servers it started, tests/conftest.py).
db-stop: $(RUNTIME)
	$(PY) -m idemops.embedded_pg stop --pgdata var/pg
	$(PY) -m idemops.embedded_pg stop --pgdata var/test-pg
	$(PY) -m idemops.embedded_pg stop --pgdata var/bench-pg

clean: db-stop
	rm -rf var/test-pg
