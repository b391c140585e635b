# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test faults lint format migrate seed worker clean mutants

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

# The mutation run over the modules that hold the guarantees ([tool.mutmut] in pyproject.toml,
# docs/RELIABILITY.md "Mutation score"), on SQLite; not in CI. Results are kept in mutants/ and
# only changed functions are run again; `rm -rf mutants` starts afresh. One module at a time:
# make mutants MUTANTS='approvals.execution.ledger.*'. MUTATION_CHILDREN: processes in parallel.
MUTATION_STAMP := $(VENV)/.mutation-stamp
MUTATION_CHILDREN ?= 2
$(MUTATION_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,mutation]'
	touch $(MUTATION_STAMP)

mutants: $(MUTATION_STAMP)
	DATABASE_URL= REDIS_URL= $(BIN)/mutmut run --max-children $(MUTATION_CHILDREN) $(MUTANTS)
	$(BIN)/python -m devtools.mutation_score mutants

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) db.sqlite3 .test-db.sqlite3 var mutants

# `make bench`: the benchmark harness (PostgreSQL, real server and workers).
-include bench.mk
