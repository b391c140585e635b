# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test faults lint format migrate seed worker clean

CLIENT := clients/python
EXAMPLE_AGENT := examples/release-agent

# The console with its test tools, the API client package (editable) its tests import, and the
# example agent package that registers itself through the approvals.agents entry point.
$(STAMP): pyproject.toml $(CLIENT)/pyproject.toml $(EXAMPLE_AGENT)/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]' -e ./$(CLIENT) \
		-e ./$(EXAMPLE_AGENT)
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

seed: migrate
	$(BIN)/python manage.py seed_demo

# The web server (ASGI, daphne) and the worker (resume tasks + reaper), on SQLite by default.
run: seed
	bin/run-dev

worker: install
	$(BIN)/python manage.py worker

test: install
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/pytest $(PYTEST_ARGS)

# The long fault runs (crashes, load, lost connections, Redis down): PostgreSQL, minutes.
faults: install
	APPROVALS_FAULTS=1 $(BIN)/pytest tests/faults $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) db.sqlite3 .test-db.sqlite3 var

# `make bench`: the benchmark harness (PostgreSQL, real server and workers).
-include bench.mk
