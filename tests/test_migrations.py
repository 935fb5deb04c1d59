"""The `from N to N+1` machinery on PostgreSQL, with the test-only template roots of
tests/fixtures/template_roots/ (a kind at storage v1, v2 and v3 with the migrations between them):
migrations run in order and keep the rows, a type is dropped and created again with the routine
that uses it, each migration is recorded, and the result equals a fresh install."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from releases import describe_postgres_schema
from tablequeue.catalog import load_catalog, parse_catalog
from tablequeue.deploy import MIGRATE, UNCHANGED, UPDATE, DeployRefused, deploy
from tablequeue.engines import connect, dialect_for
from tablequeue.render import DIALECTS, MigrationSource, Storage, render_catalog, render_migrations

ROOTS = Path(__file__).resolve().parent / "fixtures" / "template_roots"
QUEUE = {"name": "q", "kind": "heap", "payload": "text"}


def fixture_units(dialect: str, root: str, schema: str):
    catalog = parse_catalog({"schema": schema, "queues": [QUEUE]}, f"<fixture root {root}>")
    return [u for f in render_catalog(catalog, dialect, extra_root=ROOTS / root) for u in f.units]


def deploy_root(url: str, schema: str, root: str, progress: list[str] | None = None, **kwargs: Any):
    conn = connect(url)
    try:
        return deploy(conn, dialect_for("postgres"), schema, fixture_units("postgres", root, schema),
                      migrations=MigrationSource("postgres", ROOTS / root),
                      progress=(progress.append if progress is not None else lambda line: None), **kwargs)
    finally:
        conn.close()



def test_a_v1_queue_is_migrated_to_v3_in_order_and_keeps_its_rows(pg_url: str, pg_schemas: list[str]) -> None:
    schema, fresh = pg_schemas
    deploy_root(pg_url, schema, "v1")
    conn = connect(pg_url)
    try:
        conn.execute(f'INSERT INTO "{schema}"."q" (payload) SELECT \'message \' || n FROM generate_series(1, 3) AS n')
        rows = conn.execute(f'SELECT id, payload FROM "{schema}"."q" ORDER BY id').fetchall()

        progress: list[str] = []
        result = deploy_root(pg_url, schema, "v3", progress)
        items = {item.unit.name: item for item in result.plan.items}
        table, note_type, notes = items[f"{schema}.q"], items[f"{schema}.q_note"], items[f"{schema}.q_notes"]
        assert table.action == MIGRATE and [m.name for m in table.migrations] == \
            ["heap_table_v1_to_v2", "heap_table_v2_to_v3"]
        assert [(m.before.version, m.after.version) for m in table.migrations] == [(1, 2), (2, 3)]
        assert [s.mode for s in table.migrations[1].steps] == ["concurrent"]
        assert note_type.action == MIGRATE and [u.name for u in note_type.recreates] == [f"{schema}.q_notes"]
        assert notes.action == UPDATE and notes.with_unit == f"{schema}.q_note"
        assert any("heap_table_v2_to_v3 1/1 build" in line for line in progress), progress

        assert conn.execute(f'SELECT id, payload FROM "{schema}"."q" ORDER BY id').fetchall() == rows
        assert conn.execute(f'SELECT count(*) FROM "{schema}"."q" WHERE note IS NULL').fetchone()[0] == 3
        # The routine was created again against the new type: it returns the new column.
        notes_row = conn.execute(f'SELECT * FROM "{schema}"."q_notes"()').fetchone()
        assert len(notes_row) == 3 and notes_row[0] == rows[0][0]

        history = [row for row in dialect_for("postgres").read_history(conn, schema)
                   if row["unit_name"] in (f"{schema}.q", f"{schema}.q_note")]
        assert [(row["unit_name"].split(".")[1], row["storage_version"], row["migration"]) for row in history] == [
            ("q", 1, None), ("q_note", 1, None),
            ("q", 2, "heap_table_v1_to_v2"), ("q", 3, "heap_table_v2_to_v3"), ("q_note", 2, "recreate_type")]
        assert all(row["storage_shape"] == "kind=heap payload=text dedupe=off"
                   for row in history if row["unit_name"].endswith(".q"))
        assert {item.action for item in deploy_root(pg_url, schema, "v3").plan.items} == {UNCHANGED}

        deploy_root(pg_url, fresh, "v3")
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
    finally:
        conn.close()


def test_a_type_used_by_a_routine_tablequeue_does_not_deploy_is_refused(pg_url: str, pg_schemas: list[str]) -> None:
    schema = pg_schemas[0]
    deploy_root(pg_url, schema, "v1")
    conn = connect(pg_url)
    try:
        conn.execute(f'CREATE FUNCTION "{schema}"."report"() RETURNS SETOF "{schema}"."q_note" LANGUAGE sql '
                     f'AS $$ SELECT * FROM "{schema}"."q_notes"() $$')
        with pytest.raises(DeployRefused, match=rf"type {schema}.q_note changes .* is used by {schema}.report"):
            deploy_root(pg_url, schema, "v2")
        # Nothing was applied: the table is still v1.
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'note'",
                            (f'"{schema}"."q"',)).fetchone()[0] == 0
    finally:
        conn.close()


def test_a_newer_storage_version_is_refused_not_downgraded(pg_url: str, pg_schemas: list[str]) -> None:
    schema = pg_schemas[0]
    deploy_root(pg_url, schema, "v2")
    with pytest.raises(DeployRefused, match=rf"{schema}.q is at storage v2 .* does not downgrade"):
        deploy_root(pg_url, schema, "v1")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_fixture_migrations_render_in_both_dialects(dialect: str) -> None:
    units = {u.name: u for u in fixture_units(dialect, "v3", "s")}
    source = MigrationSource(dialect, ROOTS / "v3")
    table = units["s.q"]
    names = [source.find(table, f"v{v}_to_v{v + 1}") for v in (1, 2)]
    assert names == ["heap_table_v1_to_v2", "heap_table_v2_to_v3"]
    recorded = Storage(1, table.storage.shape)
    for name in names:
        migration = source.render(name, table, recorded, table.storage)
        assert migration.steps and all(step.locks for step in migration.steps)
    assert source.find(table, "v3_to_v4") is None
    assert [u.storage.version for u in units.values() if u.storage] == [2, 3, 2]  # history table, q, q_note


def test_the_v4_migration_locks_only_a_table_that_had_a_check() -> None:
    """work_table_v3_to_v4 drops exactly the CHECKs the shape had (a JSON payload's, dedupe's, groups'),
    under ACCESS EXCLUSIVE; a shape that had none (binary or text payload, no dedupe, no groups) only
    records v4, so its queue never waits behind the step (a senior-PostgreSQL review's finding)."""
    catalog = load_catalog(Path(__file__).resolve().parent / "fixtures" / "option_matrix.yml")
    seen = {}
    for rendered in render_migrations(catalog, "postgres"):
        if rendered.name.endswith(".work_table_v3_to_v4.sql"):
            queue = catalog.queue(rendered.name.split(".")[1])
            expected = [f'"ck_{queue.name}_{check}"' for check, present in (
                ("payload_json", queue.payload == "json"), ("dedupe_key", queue.options.get("dedupe")),
                ("group_key", queue.options.get("groups"))) if present]
            dropped = re.findall(r"DROP CONSTRAINT IF EXISTS (\S+?)[,;]", rendered.text)
            assert dropped == expected, rendered.name
            assert ("ALTER TABLE" in rendered.text) == bool(expected), rendered.name
            seen[queue.name] = bool(expected)
    assert True in seen.values() and False in seen.values(), seen   # both branches rendered


@pytest.mark.parametrize("engine_url", ["postgres", pytest.param("mssql", marks=pytest.mark.mssql)], indirect=True)
def test_a_v3_work_table_takes_v4_with_its_lease_live_and_each_engine_keeps_what_it_should(
        engine_url: tuple[str, str], deploy_queues: Any) -> None:
    """A work table recorded at storage v3 (on PostgreSQL with v3's CHECK constraints put back) takes
    work_table_v3_to_v4 on the next deploy: PostgreSQL drops its CHECKs, SQL Server records v4 and keeps
    ck_q_payload_json enabled and trusted (its check costs an UPDATE nothing, a senior DBA's review);
    the message and its live lease are as they were."""
    dialect, url = engine_url
    deployed = deploy_queues({"name": "q", "kind": "work", "payload": "json", "options": {"dedupe": True}})
    schema = deployed.catalog.schema
    conn = connect(url, autocommit=True)
    try:
        client = deployed.client("q", conn)
        client.enqueue({"n": 1}, dedupe_key="k")
        lease = client.dequeue(worker="w", lease_seconds=600)[0]
        table = f'"{schema}"."q"' if dialect == "postgres" else f"[{schema}].[q]"
        history = f'"{schema}"."tablequeue_deploy_history"' if dialect == "postgres" else \
            f"[{schema}].[tablequeue_deploy_history]"
        if dialect == "postgres":
            conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT ck_q_dedupe_key CHECK (length(dedupe_key) <= 200), "
                         "ADD CONSTRAINT ck_q_payload_json CHECK (jsonb_typeof(payload) IN ('object', 'array'))")
        conn.execute(f"UPDATE {history} SET storage_version = 3 WHERE unit_name = '{schema}.q' AND history_id = "
                     f"(SELECT max(h.history_id) FROM {history} AS h WHERE h.unit_name = '{schema}.q')")
        units = [u for f in render_catalog(deployed.catalog, dialect) for u in f.units]
        deploy_conn = connect(url, autocommit=dialect == "postgres")
        try:
            result = deploy(deploy_conn, dialect_for(dialect), schema, units)
        finally:
            deploy_conn.close()
        item = next(i for i in result.plan.items if i.unit.name == f"{schema}.q")
        assert item.action == MIGRATE and [m.name for m in item.migrations] == ["work_table_v3_to_v4"]
        latest = [r for r in dialect_for(dialect).read_history(conn, schema) if r["unit_name"] == f"{schema}.q"][-1]
        assert (latest["storage_version"], latest["migration"]) == (4, "work_table_v3_to_v4")
        if dialect == "postgres":
            assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
                                (table,)).fetchone()[0] == 0
        else:
            cursor = conn.cursor()
            cursor.execute("SELECT is_disabled, is_not_trusted FROM sys.check_constraints "
                           "WHERE parent_object_id = OBJECT_ID(?) AND name = N'ck_q_payload_json'", table)
            assert [tuple(row) for row in cursor.fetchall()] == [(False, False)]
        assert client.complete(lease["id"], "w", lease_token=lease["lease_token"]) is True
    finally:
        conn.close()
