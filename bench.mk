# Included from the Makefile: `make bench` runs the benchmark against its own PostgreSQL
# database (dropped and recreated at each run; its name must contain "bench") and Redis.
BIN ?= .venv/bin
BENCH_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/approvals_bench
BENCH_REDIS_URL ?= redis://127.0.0.1:6379/9

.PHONY: bench

bench: install
	DATABASE_URL=$${DATABASE_URL:-$(BENCH_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(BENCH_REDIS_URL)} \
		$(BIN)/python manage.py bench --json var/bench.json
