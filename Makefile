# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test faults lint format migrate seed worker clean mutants mutants-sqlite \
	mutants-postgres

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
# docs/RELIABILITY.md "Mutation score"); not in CI. Two legs: every guarantee module on SQLite
# (mutants/), then the audit chain on PostgreSQL (var/mutation-postgres/mutants/: its
# one-statement append runs only there); the score counts each mutant's best outcome. Results
# are kept and only changed functions are run again; `rm -rf mutants var/mutation-postgres`
# starts afresh. The known equivalents (devtools/mutation_equivalents.toml) are not run
# (devtools/mutation_run.py) unless named in MUTANTS. One module at a time:
# make mutants MUTANTS='approvals.execution.ledger.*'. MUTATION_CHILDREN: processes in parallel.
MUTATION_STAMP := $(VENV)/.mutation-stamp
MUTATION_CHILDREN ?= 2
MUTATION_POSTGRES := var/mutation-postgres
MUTATION_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/approvals_mutation
$(MUTATION_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,mutation]'
	touch $(MUTATION_STAMP)

mutants: mutants-sqlite mutants-postgres
	$(BIN)/python -m devtools.mutation_score mutants $(MUTATION_POSTGRES)/mutants

mutants-sqlite: $(MUTATION_STAMP)
	DATABASE_URL= REDIS_URL= $(BIN)/python -m devtools.mutation_run --max-children \
		$(MUTATION_CHILDREN) $(MUTANTS)

# The PostgreSQL leg runs the functions whose statements only PostgreSQL sends: the chain's
# one-statement append, and the writes that take the chain head's lock in their own statement
# (the rest of those modules is checked on SQLite); with MUTANTS set, only those of the modules
# it names (if any).
CHAIN_ON_POSTGRES := $(foreach f,append _guesses _released _holding _insert_sql _try_linked \
	_append_linked _held_back _write_held_back atomic update_holding_head \
	_update_holding_head_postgres update_pair_holding_head \
	_update_pair_holding_head_postgres,'approvals.audit.chain.x_$(f)__mutmut_*')
LEASE_ON_POSTGRES := $(foreach f,claim finish release,'approvals.runs.lease.x_$(f)__mutmut_*')
LEDGER_ON_POSTGRES := 'approvals.execution.ledger.x_perform__mutmut_*'
DECIDE_ON_POSTGRES := 'approvals.decisions.decide.x_compare_and_set__mutmut_*'
ON_POSTGRES := $(CHAIN_ON_POSTGRES) $(LEASE_ON_POSTGRES) $(LEDGER_ON_POSTGRES) $(DECIDE_ON_POSTGRES)
POSTGRES_MUTANTS = $(strip $(filter approvals.audit.chain.%,$(MUTANTS)) \
	$(if $(filter approvals.runs.lease.%,$(MUTANTS)),$(LEASE_ON_POSTGRES)) \
	$(if $(filter approvals.execution.ledger.%,$(MUTANTS)),$(LEDGER_ON_POSTGRES)) \
	$(if $(filter approvals.decisions.decide.%,$(MUTANTS)),$(DECIDE_ON_POSTGRES)))
mutants-postgres: $(MUTATION_STAMP)
ifeq ($(if $(MUTANTS),$(POSTGRES_MUTANTS),all),)
	@echo "PostgreSQL leg: no module in MUTANTS has functions it runs, nothing to run."
else
	$(BIN)/python -m devtools.mutation_leg $(MUTATION_POSTGRES) --leg postgres
	cd $(MUTATION_POSTGRES) && DATABASE_URL=$(MUTATION_DATABASE_URL) REDIS_URL= \
		$(CURDIR)/$(BIN)/python -m devtools.mutation_run --max-children $(MUTATION_CHILDREN) \
		$(or $(POSTGRES_MUTANTS),$(ON_POSTGRES))
endif

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
