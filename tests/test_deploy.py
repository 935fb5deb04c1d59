"""The migration tool against a real database: idempotence, only-what-changed, locking, refusal,
drift, the hand-run script and the roles. PostgreSQL always; SQL Server too when configured."""
from __future__ import annotations

import secrets
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import drop_schema
from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.deploy import DeployRefused, deploy, make_plan, status
from tablequeue.engines import connect, dialect_for
from tablequeue.render import Unit, render_catalog
from tablequeue.script import build_script

QUEUES = [{"name": "events", "kind": "heap"}, {"name": "orders", "kind": "fifo", "options": {"dedupe": True}}]


@pytest.fixture
def target(engine_url):
    dialect, url = engine_url
    schema = f"d_{secrets.token_hex(4)}"
    yield dialect, url, schema
    drop_schema(dialect, url, schema)


def units_for(dialect: str, schema: str, queues: list[dict]) -> list[Unit]:
    catalog = parse_catalog({"schema": schema, "queues": queues})
    return [u for f in render_catalog(catalog, dialect) for u in f.units]


def run_deploy(dialect: str, url: str, schema: str, units: list[Unit], **kwargs):
    conn = connect(url, autocommit=dialect == "postgres")
    try:
        return deploy(conn, dialect_for(dialect), schema, units, **kwargs)
    finally:
        conn.close()


def fresh_script(schema: str, units: list[Unit]) -> str:
    return build_script("postgres", schema, make_plan(units, []), "test", fresh=True,
                        concurrent_sql=dialect_for("postgres").concurrent_index_sql)


def history(dialect: str, url: str, schema: str) -> list[dict]:
    conn = connect(url, autocommit=True)
    try:
        return dialect_for(dialect).read_history(conn, schema)
    finally:
        conn.close()


def test_second_deploy_applies_nothing(target) -> None:
    dialect, url, schema = target
    units = units_for(dialect, schema, QUEUES)
    first = run_deploy(dialect, url, schema, units)
    assert [name for name, _ in first.applied] == [u.name for u in units]
    second = run_deploy(dialect, url, schema, units)
    assert second.applied == []
    assert len(history(dialect, url, schema)) == len(units)


def test_changed_unit_is_the_only_one_reapplied(target) -> None:
    dialect, url, schema = target
    units = units_for(dialect, schema, QUEUES)
    run_deploy(dialect, url, schema, units)
    changed_name = f"{schema}.orders_dequeue"
    edited = [replace(u, body=u.body.replace("batch_size must be", "batch_size has to be"))
              if u.name == changed_name else u for u in units]
    assert sum(a.body != b.body for a, b in zip(units, edited)) == 1
    result = run_deploy(dialect, url, schema, edited)
    assert [name for name, _ in result.applied] == [changed_name]
    rows = [r for r in history(dialect, url, schema) if r["unit_name"] == changed_name]
    assert len(rows) == 2 and rows[-1]["unit_checksum"] == next(u for u in edited if u.name == changed_name).checksum


def test_dry_run_prints_plan_and_applies_nothing(target) -> None:
    dialect, url, schema = target
    units = units_for(dialect, schema, QUEUES)
    result = run_deploy(dialect, url, schema, units, dry_run=True)
    assert result.applied == [] and len(result.plan.changes) == len(units)
    assert "create" in result.plan.describe()
    conn = connect(url, autocommit=True)
    try:
        assert not dialect_for(dialect).history_exists(conn, schema)
    finally:
        conn.close()


def test_two_deploys_at_once_serialise_and_history_is_consistent(target) -> None:
    dialect, url, schema = target
    units = units_for(dialect, schema, QUEUES)
    results, errors = [], []

    def worker() -> None:
        try:
            results.append(run_deploy(dialect, url, schema, units))
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    applied = sorted(len(r.applied) for r in results)
    assert applied == [0, len(units)]  # one did the work, the other found it done
    names = [row["unit_name"] for row in history(dialect, url, schema)]
    assert sorted(names) == sorted(u.name for u in units)  # every unit recorded exactly once


def test_kind_change_with_messages_is_refused_and_messages_stay(target) -> None:
    dialect, url, schema = target
    run_deploy(dialect, url, schema, units_for(dialect, schema, QUEUES))
    catalog = parse_catalog({"schema": schema, "queues": QUEUES})
    conn = connect(url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, dialect, catalog, "events")
        ids = [client.enqueue({"n": n})["id"] for n in range(3)]
    finally:
        conn.close()

    changed = [{"name": "events", "kind": "lifo"}, QUEUES[1]]
    with pytest.raises(DeployRefused) as refused:
        run_deploy(dialect, url, schema, units_for(dialect, schema, changed))
    message = str(refused.value)
    assert "queue 'events'" in message and "3 message(s)" in message and "never drops or rebuilds" in message

    conn = connect(url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, dialect, catalog, "events")
        assert sorted(row["id"] for row in client.dequeue(batch_size=10)) == sorted(ids)
    finally:
        conn.close()
    # Nothing of the refused deploy was applied, not even its unchanged-looking code units.
    assert all(row["unit_name"] != f"{schema}.events" or row["unit_checksum"]
               for row in history(dialect, url, schema))
    assert len(history(dialect, url, schema)) == len(units_for(dialect, schema, QUEUES))


def test_status_reports_drift_when_an_object_is_changed_by_hand(target) -> None:
    dialect, url, schema = target
    units = units_for(dialect, schema, QUEUES)
    run_deploy(dialect, url, schema, units)
    conn = connect(url, autocommit=True)
    try:
        rows = status(conn, dialect_for(dialect), schema, units)
        assert {row.state for row in rows} <= {"ok", "ok (no single object to check)"}, rows
        if dialect == "postgres":
            conn.execute(f'CREATE OR REPLACE FUNCTION "{schema}"."events_stats"() RETURNS TABLE (ready bigint, '
                         'delayed bigint, in_flight bigint, dead bigint, oldest_ready_age_seconds double precision, '
                         'estimated boolean) LANGUAGE sql AS $$ SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint, '
                         '0::double precision, false $$')
        else:
            cursor = conn.cursor()
            cursor.execute(f"CREATE OR ALTER PROCEDURE [{schema}].[events_stats] AS SELECT 0 AS ready;")
            cursor.close()
        rows = {row.unit_name: row.state for row in status(conn, dialect_for(dialect), schema, units)}
    finally:
        conn.close()
    assert rows[f"{schema}.events_stats"] == "drift"
    assert all(state.startswith("ok") for name, state in rows.items() if name != f"{schema}.events_stats")


def test_reserved_words_as_queue_names_are_quoted(target) -> None:
    dialect, url, schema = target
    queues = [{"name": "order", "kind": "fifo"}, {"name": "select", "kind": "heap", "payload": "text"}]
    run_deploy(dialect, url, schema, units_for(dialect, schema, queues))
    catalog = parse_catalog({"schema": schema, "queues": queues})
    conn = connect(url, autocommit=True)
    try:
        for name, payload in (("order", {"a": 1}), ("select", "plain text")):
            client = QueueClient.for_catalog(conn, dialect, catalog, name)
            new_id = client.enqueue(payload)["id"]
            assert [(row["id"], row["payload"]) for row in client.dequeue()] == [(new_id, payload)]
    finally:
        conn.close()


def test_postgres_signature_change_replaces_the_function(pg_url: str) -> None:
    schema = f"d_{secrets.token_hex(4)}"
    try:
        run_deploy("postgres", pg_url, schema, units_for("postgres", schema, [{"name": "q", "kind": "heap"}]))
        # Turning dedupe on adds a parameter: CREATE OR REPLACE alone would leave an overload behind.
        widened = [u for u in units_for("postgres", schema, [{"name": "q", "kind": "heap", "options": {"dedupe": True}}])
                   if u.type == "code"]
        run_deploy("postgres", pg_url, schema, widened)
        conn = connect(pg_url)
        try:
            signatures = conn.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = %s AND p.proname = 'q_enqueue'", (schema,)).fetchall()
        finally:
            conn.close()
        assert len(signatures) == 1 and "text" in signatures[0][0]
    finally:
        drop_schema("postgres", pg_url, schema)


def test_postgres_upgrade_creates_new_storage_units_next_to_queues_that_hold_messages(pg_url: str) -> None:
    # Releases before the claim position had no <queue>_rewinds sequence, and before the bounded
    # own-messages probe no ix_<queue>_lease_start index: upgrading deployed pending and work queues
    # must create them (new units), not refuse the queues or touch their tables.
    schema = f"d_{secrets.token_hex(4)}"
    queues = [{"name": "p", "kind": "pending"}, {"name": "w", "kind": "work"}]
    units = units_for("postgres", schema, queues)
    new_units = [u.name for u in units if u.name.endswith(("_rewinds", "_lease_start"))]
    assert new_units == [f"{schema}.p_rewinds", f"{schema}.w_rewinds", f"{schema}.ix_w_lease_start"]
    try:
        run_deploy("postgres", pg_url, schema, [u for u in units if u.name not in new_units])
        catalog = parse_catalog({"schema": schema, "queues": queues})
        conn = connect(pg_url, autocommit=True)
        try:
            for table, columns, values in (("p", "payload, due_at", "'{}'::jsonb, now()"),
                                           ("w", "payload, due_at, visible_at", "'{}'::jsonb, now(), now()")):
                conn.execute(f'INSERT INTO "{schema}"."{table}" ({columns}) '
                             f"SELECT {values} FROM generate_series(1, 5)")
            result = run_deploy("postgres", pg_url, schema, units)
            assert [name for name, _ in result.applied] == new_units
            assert all(item.action == "create" for item in result.plan.changes)
            # An index added to a table that exists is built CONCURRENTLY (issue 16), and valid.
            assert [item.unit.name for item in result.plan.changes if item.concurrent] == [f"{schema}.ix_w_lease_start"]
            assert conn.execute("SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = %s::regclass",
                                (f'"{schema}"."ix_w_lease_start"',)).fetchone()[0] is True
            for name in ("p", "w"):
                client = QueueClient.for_catalog(conn, "postgres", catalog, name)
                got = client.dequeue(batch_size=10, worker="a") if name == "w" else client.dequeue(batch_size=10)
                assert len(got) == 5
            states = {row.unit_name: row.state for row in status(conn, dialect_for("postgres"), schema, units)}
            assert {states[name] for name in new_units} == {"ok"}
            conn.execute(f'DROP SEQUENCE "{schema}"."w_rewinds"')
            conn.execute(f'DROP INDEX "{schema}"."ix_w_lease_start"')
            conn.execute(f'CREATE INDEX "ix_w_lease_start" ON "{schema}"."w" (leased_by)')
            states = {row.unit_name: row.state for row in status(conn, dialect_for("postgres"), schema, units)}
            assert states[f"{schema}.w_rewinds"] == "missing"
            assert states[f"{schema}.ix_w_lease_start"] == "drift"
            conn.execute(f'DROP INDEX "{schema}"."ix_w_lease_start"')
            states = {row.unit_name: row.state for row in status(conn, dialect_for("postgres"), schema, units)}
            assert states[f"{schema}.ix_w_lease_start"] == "missing"
            # A storage unit is its version and shape, not its text: an edit at the same version is not
            # applied (tests/test_storage_versions.py is what stops such an edit from being released).
            edited = [replace(u, body=u.body.replace("-- The own-messages probe", "-- The probe"))
                      if u.name.endswith("_lease_start") else u for u in units]
            assert edited != units and run_deploy("postgres", pg_url, schema, edited).applied == []
        finally:
            conn.close()
    finally:
        drop_schema("postgres", pg_url, schema)


def test_postgres_hand_run_script_deploys_and_is_recorded(pg_url: str, tmp_path: Path) -> None:
    schema = f"d_{secrets.token_hex(4)}"
    units = units_for("postgres", schema, QUEUES)
    script = tmp_path / "deploy.sql"
    script.write_text(fresh_script(schema, units))
    try:
        for _ in range(2):  # re-runnable
            result = subprocess.run(["psql", pg_url, "-q", "-f", str(script)], capture_output=True, text=True)
            assert result.returncode == 0, result.stderr
        assert run_deploy("postgres", pg_url, schema, units).applied == []  # the tool sees it as deployed
        conn = connect(pg_url)
        try:
            rows = status(conn, dialect_for("postgres"), schema, units)
        finally:
            conn.close()
        assert all(row.state.startswith("ok") for row in rows), rows
        changed = units_for("postgres", schema, [{"name": "events", "kind": "lifo"}, QUEUES[1]])
        script.write_text(fresh_script(schema, changed))
        result = subprocess.run(["psql", pg_url, "-q", "-f", str(script)], capture_output=True, text=True)
        assert result.returncode != 0 and f"{schema}.events: the deploy history records this storage unit" in result.stderr
        assert "tablequeue script --url" in result.stderr and "Nothing more was applied" in result.stderr
    finally:
        drop_schema("postgres", pg_url, schema)


def test_postgres_roles_grant_verbs_not_tables(pg_url: str) -> None:
    schema = f"d_{secrets.token_hex(4)}"
    login = f"app_{secrets.token_hex(4)}"
    run_deploy("postgres", pg_url, schema, units_for("postgres", schema, QUEUES))
    conn = connect(pg_url)
    try:
        conn.execute(f'CREATE ROLE "{login}" NOLOGIN IN ROLE "{schema}_producer"')
        conn.execute(f'SET ROLE "{login}"')
        catalog = parse_catalog({"schema": schema, "queues": QUEUES})
        client = QueueClient.for_catalog(conn, "postgres", catalog, "events")
        assert client.enqueue({"a": 1})["duplicate"] is False
        import psycopg

        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            client.dequeue()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'SELECT * FROM "{schema}"."events"')
        conn.execute("RESET ROLE")
    finally:
        conn.execute("RESET ROLE")
        conn.close()
        drop_schema("postgres", pg_url, schema)
        c2 = connect(pg_url)
        c2.execute(f'DROP ROLE IF EXISTS "{login}"')
        c2.close()


def test_upgrade_while_messages_wait_and_a_consumer_is_mid_transaction(target) -> None:
    dialect, url, schema = target
    units = units_for(dialect, schema, QUEUES)
    run_deploy(dialect, url, schema, units)
    catalog = parse_catalog({"schema": schema, "queues": QUEUES})
    producer = connect(url, autocommit=True)
    consumer = connect(url, autocommit=False)
    try:
        client = QueueClient.for_catalog(producer, dialect, catalog, "orders")
        ids = [row["id"] for row in client.enqueue_batch([{"payload": {"n": n}} for n in range(20)])]
        held = QueueClient.for_catalog(consumer, dialect, catalog, "orders").dequeue(batch_size=5)
        # The next release changes every code unit of the queue (storage stays as it is).
        upgraded = [replace(u, body=u.body.replace("must not be NULL", "must never be NULL")
                            .replace("must be between 1 and 1000", "must lie between 1 and 1000"))
                    if u.type == "code" else u for u in units]
        applied = run_deploy(dialect, url, schema, upgraded).applied
        assert applied and all(not name.endswith(("_deploy_history", ".orders", ".events")) for name, _ in applied)
        consumer.commit()
        rest = client.dequeue(batch_size=100)
        assert sorted([r["id"] for r in held] + [r["id"] for r in rest]) == sorted(ids)
        assert [r["id"] for r in rest] == sorted(ids)[5:]  # FIFO order survives the upgrade
    finally:
        producer.close()
        consumer.close()
