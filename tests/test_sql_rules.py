"""Static checks of DESIGN.md's rules on every rendered object of every kind and option.

No SQL Server runs here, so what a reviewer would check by eye is checked by machine: session
options, lock hints on every claim, transactions only where the procedure opened them, no dynamic
SQL built from strings, quoting, grants, and the PostgreSQL twin's security settings.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tablequeue.catalog import load_catalog
from tablequeue.gosplit import mask_comments_and_strings, split_batches
from tablequeue.render import render_catalog, render_migrations

REPO = Path(__file__).resolve().parents[1]
CATALOGS = [REPO / "database" / "queues.yml", REPO / "tests" / "fixtures" / "option_matrix.yml"]


def _procedures(catalog_path: Path):
    catalog = load_catalog(catalog_path)
    for rendered in render_catalog(catalog, "mssql"):
        for unit in rendered.units:
            for batch in split_batches(unit.body):
                code = mask_comments_and_strings(batch.text)
                if re.search(r"^\s*CREATE\s+(OR\s+ALTER\s+)?PROC", code, re.I | re.M):
                    yield catalog, rendered, unit, batch.text, code


DATA_ACCESS = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+\[|\bBEGIN\s+TRAN", re.I)


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_every_procedure_sets_nocount_then_xact_abort_after_its_argument_checks(catalog_path: Path) -> None:
    # An argument check that throws under XACT_ABORT ON dooms the caller's open transaction: the
    # checks come first, then XACT_ABORT, then the first table access or transaction.
    for _, _, unit, _, code in _procedures(catalog_path):
        body = code.split("BEGIN", 1)[1]
        assert body.strip().split(";")[0].strip() == "SET NOCOUNT ON", unit.name
        xact_abort = body.find("SET XACT_ABORT ON")
        first_access = DATA_ACCESS.search(body)
        assert xact_abort > 0, unit.name
        assert first_access is None or xact_abort < first_access.start(), unit.name
        checks = body[:first_access.start()] if first_access else body
        last_check = max((m.end() for m in re.finditer(r"\bTHROW\s+5\d{4}", checks)), default=-1)
        assert last_check < xact_abort, unit.name


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_every_claim_carries_the_lock_hints(catalog_path: Path) -> None:
    for catalog, rendered, unit, _, code in _procedures(catalog_path):
        if not unit.name.endswith("_dequeue"):
            continue
        queue = catalog.queue(rendered.queue)
        table = f"[{catalog.schema}].[{queue.name}]"
        hints = re.findall(re.escape(table) + r"\s+(?:AS\s+\w+\s+)?WITH\s*\(([^)]*)\)", code)
        claims = [h for h in hints if "UPDLOCK" in h.upper()]
        assert claims, f"{unit.name}: no claim of {table}"
        for hint in hints:
            names = {h.strip().upper() for h in hint.split(",")}
            if "UPDLOCK" in names:
                assert {"ROWLOCK", "READCOMMITTEDLOCK"} <= names, (unit.name, hint)
                assert ("READPAST" in names) != bool(queue.options.get("strict")), (unit.name, hint)
            else:   # a probe (the next priority level): it keeps no lock and waits for none
                assert names == {"READPAST", "READCOMMITTEDLOCK"}, (unit.name, hint)
        assert "NOLOCK" not in code.upper() and "SELECT *" not in code.upper()


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_transactions_are_only_ended_where_the_procedure_began_them(catalog_path: Path) -> None:
    for _, _, unit, _, code in _procedures(catalog_path):
        if "_process" in unit.name:
            # The in-database worker owns its transactions by contract: it refuses to run inside a
            # caller's transaction or in implicit-transaction mode.
            assert "IF @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0" in code, unit.name
            continue
        begins = len(re.findall(r"\bBEGIN\s+TRAN(SACTION)?\b", code, re.I))
        for statement in re.findall(r"^.*\b(?:COMMIT|ROLLBACK)\b.*$", code, re.I | re.M):
            assert "@started_transaction = 1" in statement, (unit.name, statement)
        # Under IMPLICIT_TRANSACTIONS (ODBC/JDBC autocommit off) the caller owns the transaction.
        guards = re.findall(r"IF\s+(.*?)\s+BEGIN\s+BEGIN\s+TRANSACTION", code, re.I | re.S)
        assert len(guards) == begins, unit.name
        for guard in guards:
            assert "@@TRANCOUNT = 0" in guard and "(@@OPTIONS & 2) = 0" in guard, (unit.name, guard)


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_no_dynamic_sql_is_built_from_values(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    for rendered in render_catalog(catalog, "mssql"):
        for unit in rendered.units:
            code = mask_comments_and_strings(unit.body)
            for match in re.finditer(r"\bEXEC(?:UTE)?\s*\(", code, re.I):
                # Only a single literal may be executed (CREATE SCHEMA needs its own batch).
                literal = unit.body[match.end():].lstrip()
                assert re.match(r"N'[^']*'\s*\)", literal), (unit.name, literal[:80])
            assert "sp_executesql" not in code.lower() or "@handler" in code, unit.name


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_every_file_sets_its_options_and_every_procedure_is_granted(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    for rendered in render_catalog(catalog, "mssql"):
        code = mask_comments_and_strings(rendered.text)
        first_create = code.upper().find("CREATE ")
        assert 0 <= code.find("SET ANSI_NULLS ON") < first_create, rendered.name
        assert 0 <= code.find("SET QUOTED_IDENTIFIER ON") < first_create, rendered.name
        for name in re.findall(r"CREATE\s+OR\s+ALTER\s+PROCEDURE\s+(\S+)", code):
            grants = re.findall(r"GRANT\s+EXECUTE\s+ON\s+OBJECT::" + re.escape(name) + r"\s+TO\s+(\S+);", code)
            assert len(grants) == 1, (rendered.name, name, grants)
            assert re.fullmatch(rf"\[{catalog.schema}_(producer|consumer|admin)\]", grants[0])


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_objects_are_referenced_quoted_in_both_dialects(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    bare = re.compile(rf"(?<![\[\"'.\w]){re.escape(catalog.schema)}\.(?=[a-z])")
    for dialect in ("mssql", "postgres"):
        for rendered in render_catalog(catalog, dialect):
            code = mask_comments_and_strings(rendered.text) if dialect == "mssql" else _mask_pg(rendered.text)
            offenders = [line for line in code.splitlines() if bare.search(line)]
            assert offenders == [], (dialect, rendered.name, offenders[:3])


def _mask_pg(text: str) -> str:
    """Comments and single-quoted strings blanked (function bodies are dollar-quoted and kept)."""
    text = re.sub(r"--[^\n]*", "", text)
    return re.sub(r"'(?:[^']|'')*'", "''", text)


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_postgres_functions_are_pinned_definers_revoked_from_public(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    for rendered in render_catalog(catalog, "postgres"):
        for unit in rendered.units:
            if unit.type != "code" or unit.name.endswith(("tablequeue_roles", "_ownership")):
                continue
            if unit.name.endswith("_process"):
                # The in-database worker COMMITs, which PostgreSQL refuses in a procedure with
                # SECURITY DEFINER or a SET clause (2D000): it runs as its caller and reaches the
                # tables only through the definer functions (docs/work-queue.md).
                code = _mask_pg(unit.body)
                assert "SECURITY DEFINER" not in code and "SET search_path" not in code, unit.name
                assert re.search(r"REVOKE ALL ON PROCEDURE .* FROM public;", unit.body), unit.name
                continue
            assert "SECURITY DEFINER" in unit.body, unit.name
            assert "SET search_path = pg_catalog, pg_temp" in unit.body, unit.name
            assert re.search(r"REVOKE ALL ON (FUNCTION|PROCEDURE) .* FROM public;", unit.body), unit.name
            # Owned by the schema's owner role, never by whoever deployed (a superuser, often).
            assert re.search(rf'ALTER (FUNCTION|PROCEDURE) .* OWNER TO "{catalog.schema}_owner";', unit.body), unit.name


# -- migrations (database/templates/<dialect>/migrations/, docs/upgrades.md) ---------------------

@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_migrations_quote_every_object_and_build_no_sql_from_values(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    bare = re.compile(rf"(?<![\[\"'.\w]){re.escape(catalog.schema)}\.(?=[a-z])")
    for dialect in ("mssql", "postgres"):
        migrations = render_migrations(catalog, dialect)
        assert migrations, dialect
        for rendered in migrations:
            code = mask_comments_and_strings(rendered.text) if dialect == "mssql" else _mask_pg(rendered.text)
            assert [line for line in code.splitlines() if bare.search(line)] == [], (dialect, rendered.name)
            if dialect == "mssql":   # as in the units: only a single literal may be executed
                for match in re.finditer(r"\bEXEC(?:UTE)?\s*\(", code, re.I):
                    assert re.match(r"N'[^']*'\s*\)", rendered.text[match.end():].lstrip()), rendered.name
                assert "sp_executesql" not in code.lower(), rendered.name
            else:
                assert not re.search(r"\bEXECUTE\b|\bformat\s*\(", code, re.I), rendered.name


# A schema change a step makes, and how it shows that running it again is harmless.
_MSSQL_CHANGE = re.compile(r"\b(ALTER\s+TABLE|CREATE\s+(?:UNIQUE\s+)?(?:NONCLUSTERED\s+)?INDEX|DROP\s+(?:INDEX|TABLE))\b",
                           re.I)
_PG_CHANGES = {r"\bADD\s+COLUMN\b(?!\s+IF\s+NOT\s+EXISTS)": "ADD COLUMN without IF NOT EXISTS",
               r"\bDROP\s+COLUMN\b(?!\s+IF\s+EXISTS)": "DROP COLUMN without IF EXISTS",
               r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\b(?!\s+(?:CONCURRENTLY\s+)?IF\s+NOT\s+EXISTS)": "CREATE INDEX without IF NOT EXISTS",
               r"\bDROP\s+INDEX\b(?!\s+(?:CONCURRENTLY\s+)?IF\s+EXISTS)": "DROP INDEX without IF EXISTS"}


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_migration_steps_can_run_again(catalog_path: Path) -> None:
    """A step interrupted by a lock timeout or an error runs again at the next deploy: each change it
    makes first checks that it is still to be made (an IF around it, or IF [NOT] EXISTS in it). The
    empty-table rebuild is the exception: its drop follows the emptiness check in the same batch's
    transaction, and its create is the unit's own re-runnable CREATE."""
    catalog = load_catalog(catalog_path)
    for rendered in render_migrations(catalog, "mssql"):
        if ".drop_empty_table." in rendered.name:
            continue
        for batch in split_batches(rendered.text):
            code = mask_comments_and_strings(batch.text)
            for change in _MSSQL_CHANGE.finditer(code):
                statement = code[change.start():change.start() + 200]
                line_start = code.rfind("\n", 0, change.start()) + 1
                if line_start == change.start():   # a statement of its own: it must say IF [NOT] EXISTS
                    guarded = re.match(r"DROP\s+\w+\s+IF\s+EXISTS", statement, re.I)
                else:   # inside a block: the top-level statement that holds it is an IF
                    top = [line for line in code[:line_start].splitlines() if line[:1].strip()]
                    guarded = top and re.match(r"IF\b", top[-1])
                assert guarded, (rendered.name, statement.splitlines()[0])
    for rendered in render_migrations(catalog, "postgres"):
        code = _mask_pg(rendered.text)
        for pattern, problem in _PG_CHANGES.items():
            for match in re.finditer(pattern, code, re.I):
                in_do_if = code.rfind("THEN", 0, match.start()) > code.rfind("DO $", 0, match.start()) >= 0
                assert in_do_if, (rendered.name, problem)
