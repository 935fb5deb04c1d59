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
    recorded = history(dialect, url, schema)
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
    # Nothing of the refused deploy was applied, not even its unchanged-looking code units: the
    # history is row for row what it was.
    assert history(dialect, url, schema) == recorded


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
    new_units = [u.name for u in units if u.name.endswith(("_rewinds", "_lease_start", "_ownership"))]
    assert new_units == [f"{schema}.p_rewinds", f"{schema}.p_ownership", f"{schema}.w_rewinds",
                         f"{schema}.ix_w_lease_start", f"{schema}.w_ownership"]
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
            # The sequences created after the queue tables belong to the owner role too (the
            # ownership unit comes after every storage unit of its queue).
            owners = dict(conn.execute(
                "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class AS c JOIN pg_namespace AS n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'S')", (schema,)).fetchall())
            assert {owners[name] for name in ("p", "p_rewinds", "w", "w_rewinds")} == {f"{schema}_owner"}
            # An index added to a table that exists is built CONCURRENTLY (issue 16), and valid.
            assert [item.unit.name for item in result.plan.changes if item.concurrent] == [f"{schema}.ix_w_lease_start"]
            assert conn.execute("SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = %s::regclass",
                                (f'"{schema}"."ix_w_lease_start"',)).fetchone()[0] is True
            for name in ("p", "w"):
                client = QueueClient.for_catalog(conn, "postgres", catalog, name)
                got = client.dequeue(batch_size=10, worker="a") if name == "w" else client.dequeue(batch_size=10)
                assert len(got) == 5
            states = {row.unit_name: row.state for row in status(conn, dialect_for("postgres"), schema, units)}
            assert {states[name] for name in new_units} == {"ok", "ok (no single object to check)"}
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
            edited = [replace(u, body=u.body.replace("-- Leased messages: the own-messages probe", "-- Leases: the probe"))
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


ROLE_QUEUES = [{"name": "jobs", "kind": "work", "options": {"max_attempts": 1, "history": True}}]
# Each role's verbs (DESIGN.md §3), called on a work queue with arguments that succeed.
ROLE_VERBS = {
    "producer": {"enqueue": {"payload": {"a": 1}}, "enqueue_batch": {"items": [{"payload": {"a": 2}}]}},
    "consumer": {"dequeue": {"worker": "w"}, "complete": {"id": 0, "worker": "w"},
                 "fail": {"id": 0, "worker": "w", "error": "e"}, "extend_lease": {"id": 0, "worker": "w"}},
    "admin": {"stats": {}, "purge": {"max_rows": 1}, "dead_list": {}, "history_purge": {}},
}


def call_verb(client: QueueClient, verb: str, arguments: dict) -> None:
    if verb == "enqueue_batch":
        client.enqueue_batch(arguments["items"])
    elif verb == "enqueue":
        client.enqueue(**arguments)
    else:
        client.call(verb, arguments)


@pytest.mark.parametrize("role", list(ROLE_VERBS))
def test_postgres_each_role_runs_its_verbs_and_nothing_else(pg_url: str, role: str) -> None:
    import psycopg

    schema = f"d_{secrets.token_hex(4)}"
    login = f"app_{secrets.token_hex(4)}"
    run_deploy("postgres", pg_url, schema, units_for("postgres", schema, ROLE_QUEUES))
    catalog = parse_catalog({"schema": schema, "queues": ROLE_QUEUES})
    conn = connect(pg_url)
    try:
        conn.execute(f'CREATE ROLE "{login}" NOLOGIN IN ROLE "{schema}_{role}"')
        conn.execute(f'SET ROLE "{login}"')
        client = QueueClient.for_catalog(conn, "postgres", catalog, "jobs")
        for other, verbs in ROLE_VERBS.items():
            for verb, arguments in verbs.items():
                if other == role:
                    call_verb(client, verb, arguments)
                else:
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        call_verb(client, verb, arguments)
        for table in ("jobs", "jobs_dead", "jobs_history"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f'SELECT * FROM "{schema}"."{table}"')
    finally:
        conn.execute("RESET ROLE")
        conn.close()
        drop_schema("postgres", pg_url, schema)
        c2 = connect(pg_url)
        c2.execute(f'DROP ROLE IF EXISTS "{login}"')
        c2.close()


def test_postgres_the_owner_role_owns_every_queue_object_and_cannot_log_in(pg_url: str) -> None:
    # SECURITY DEFINER functions run with their owner's rights: 0.1.0 left them (and the tables) to
    # whoever deployed, a superuser as often as not.
    schema = f"d_{secrets.token_hex(4)}"
    queues = QUEUES + [{"name": "jobs", "kind": "work", "options": {"history": True, "client_ids": True}},
                       {"name": "later", "kind": "pending"}]
    run_deploy("postgres", pg_url, schema, units_for("postgres", schema, queues))
    conn = connect(pg_url)
    try:
        owners = conn.execute(
            "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class AS c "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %s "
            "AND c.relname <> 'tablequeue_deploy_history' AND c.relname NOT LIKE '%%deploy_history%%' "
            "AND c.relkind IN ('r', 'S', 'c', 'i')", (schema,)).fetchall()
        routines = conn.execute(
            "SELECT p.proname, pg_get_userbyid(p.proowner) FROM pg_proc AS p "
            "JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = %s", (schema,)).fetchall()
        owner = conn.execute("SELECT rolcanlogin, rolsuper, rolcreaterole FROM pg_roles WHERE rolname = %s",
                             (f"{schema}_owner",)).fetchone()
    finally:
        conn.close()
        drop_schema("postgres", pg_url, schema)
    assert {"events", "jobs", "jobs_dead", "jobs_history", "jobs_enqueue_result", "later_rewinds",
            "jobs_id_seq"} <= {name for name, _ in owners}
    assert {name: who for name, who in owners if who != f"{schema}_owner"} == {}
    assert len(routines) > 20
    assert {name: who for name, who in routines if who != f"{schema}_owner"} == {}
    assert owner == (False, False, False)


def test_postgres_roles_are_not_shared_with_another_database_unless_asked(pg_url: str) -> None:
    # Roles belong to the cluster: the same schema name in a second database would hand its queues
    # to the first one's role members. The deploy refuses (exit 3) before it applies anything.
    import psycopg

    schema = f"d_{secrets.token_hex(4)}"
    other_db = f"tq_other_{secrets.token_hex(3)}"
    other_url = pg_url.rsplit("/", 1)[0] + "/" + other_db
    run_deploy("postgres", pg_url, schema, units_for("postgres", schema, QUEUES))
    admin = connect(pg_url)
    admin.execute(f'CREATE DATABASE "{other_db}"')
    try:
        with pytest.raises(DeployRefused, match=rf"role {schema}_admin already serves schema {schema} of database"):
            run_deploy("postgres", other_url, schema, units_for("postgres", schema, QUEUES))
        with psycopg.connect(other_url) as other:
            assert other.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()[0] is None
        # The hand-run script has no deploy tool in front of it: the role unit refuses by itself.
        script_units = units_for("postgres", schema, QUEUES)
        with psycopg.connect(other_url, autocommit=True) as other:
            with pytest.raises(psycopg.Error) as refused:
                other.execute(script_units[0].body)
                other.execute(script_units[1].body)
            assert refused.value.sqlstate == "TQ007"
        run_deploy("postgres", other_url, schema, units_for("postgres", schema, QUEUES), share_roles=True)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{other_db}" WITH (FORCE)')
        admin.close()
        drop_schema("postgres", pg_url, schema)


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
