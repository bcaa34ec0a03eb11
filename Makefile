# idemops: `make run` serves the platform, `make test` runs the whole suite.
# Both start from nothing: they create .venv and install requirements.txt.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench install db-stop clean lint

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) manage.py serve

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Stop the embedded PostgreSQL servers (make run's and the tests').
db-stop: $(STAMP)
	$(PY) -m idemops.embedded_pg stop --pgdata var/pg
	$(PY) -m idemops.embedded_pg stop --pgdata var/test-pg

clean: db-stop
	rm -rf var/test-pg
