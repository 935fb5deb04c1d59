# tablequeue: `make demo` runs the main job, `make test` runs every test. Both set everything up first.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CATALOG := database/queues.yml
GOLDEN_SQL := database/rendered
GOLDEN_TSQLT := tests_tsql/rendered

.PHONY: help setup system venv demo test lint golden bench clean

help:
	@echo "make demo    deploy the example catalog to a throwaway PostgreSQL and run every queue"
	@echo "make test    golden files, sqlfluff lint, pytest (PostgreSQL; SQL Server when configured), tSQLt"
	@echo "make lint    sqlfluff on the rendered T-SQL and PostgreSQL, then check-tsql (references, static rules)"
	@echo "make golden  re-render the golden files after a template change (review the diff)"
	@echo "make bench   benchmarks (results in docs/BENCHMARKS.md), the chaos run over 50,000 messages and"
	@echo "             the model-based interleaving tests with 500 random examples per queue;"
	@echo "             BENCH_ARGS=... passes options to python -m bench.run (--help lists them)"

setup: system $(STAMP)

system:
	@bash tools/setup-system.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

demo: setup
	$(BIN)/tablequeue demo --catalog $(CATALOG) --spark

golden: setup
	rm -rf $(GOLDEN_SQL) $(GOLDEN_TSQLT)
	$(BIN)/tablequeue render --catalog $(CATALOG) --dialect mssql --out $(GOLDEN_SQL)/mssql >/dev/null
	$(BIN)/tablequeue render --catalog $(CATALOG) --dialect postgres --out $(GOLDEN_SQL)/postgres >/dev/null
	$(BIN)/tablequeue render --catalog $(CATALOG) --tsqlt --out $(GOLDEN_TSQLT) >/dev/null

# The golden files (test_render.py proves they are what the templates render), the option matrix
# (every kind with every option on at least once) and every migration its storage can take: zero
# unparsable sections, zero violations; then every reference resolves and the readiness rules hold
# (check-tsql, also over the SQL strings of the tool and the pipelines).
MATRIX := tests/fixtures/option_matrix.yml
lint: setup
	rm -rf build/lint
	$(BIN)/tablequeue render --catalog $(MATRIX) --dialect mssql --out build/lint/mssql >/dev/null
	$(BIN)/tablequeue render --catalog $(MATRIX) --dialect postgres --out build/lint/postgres >/dev/null
	$(BIN)/tablequeue render --catalog $(MATRIX) --tsqlt --out build/lint/tsqlt >/dev/null
	$(BIN)/tablequeue render --catalog $(MATRIX) --dialect mssql --migrations --out build/lint/mssql-migrations >/dev/null
	$(BIN)/tablequeue render --catalog $(MATRIX) --dialect postgres --migrations --out build/lint/postgres-migrations >/dev/null
	$(BIN)/sqlfluff lint --processes 2 --dialect tsql $(GOLDEN_SQL)/mssql $(GOLDEN_TSQLT) build/lint/mssql build/lint/tsqlt \
		build/lint/mssql-migrations database/examples/handlers/mssql
	$(BIN)/sqlfluff lint --processes 2 --dialect postgres $(GOLDEN_SQL)/postgres build/lint/postgres \
		build/lint/postgres-migrations database/examples/handlers/postgres
	$(BIN)/tablequeue check-tsql $(GOLDEN_SQL)/mssql $(GOLDEN_TSQLT) build/lint/mssql build/lint/tsqlt \
		build/lint/mssql-migrations database/examples/handlers/mssql tools/tablequeue pipelines

# tSQLt first (it runs only when SQL Server is configured and says so otherwise), pytest last so
# its summary closes the run.
test: setup lint
	$(BIN)/tablequeue test-tsql --if-configured --catalog $(CATALOG) --junit build/tsqlt-junit.xml
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/pip install --quiet -e '.[test,spark,bench]'
	$(BIN)/python -m bench.run $(BENCH_ARGS)
	# The chaos run at full size (make test runs it over 10,000 messages to keep within its budget).
	TABLEQUEUE_CHAOS_MESSAGES=50000 $(BIN)/python -m pytest tests/test_work_chaos.py -o timeout=3600
	# The interleaving model with a fresh random seed and 500 examples per queue (make test runs
	# 20-30 derandomized ones).
	TABLEQUEUE_MODEL_EXAMPLES=500 $(BIN)/python -m pytest tests/test_model_interleavings.py -k in_every_interleaving -o timeout=7200

clean:
	rm -rf build $(VENV) .pytest_cache
