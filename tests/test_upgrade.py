"""Upgrading a deployed release to the current templates keeps every message (docs/upgrades.md).

The kept release 0.1.0 (tests/fixtures/releases/) is deployed to PostgreSQL as 0.1.0's own deploy
did, every queue of the option matrix gets messages in every state through 0.1.0's call shapes,
and the current tool deploys the same catalog over it. Then every row is what it was, the live
lease is still the worker's, every verb works with 0.1.0's call shapes, and the schema is what a
fresh install of the same catalog creates.
"""
from __future__ import annotations

import json
import secrets
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from conftest import drop_schema
from releases import deploy_v010, describe_postgres_schema, release_catalog, release_units
from tablequeue.catalog import Catalog, Queue
from tablequeue.deploy import CREATE, MIGRATE, RECORD, UNCHANGED, deploy
from tablequeue.engines import connect, dialect_for
from tablequeue.render import render_catalog

RELEASE = "0.1.0"
PAYLOAD_TYPES = {"binary": "bytea", "text": "text", "json": "jsonb"}
INTEGER_PARAMS = ("batch_size", "lease_seconds", "retry_after_seconds", "page_size", "priority",
                  "time_budget_seconds")
TIME_PARAMS = ("due_at", "enqueued_at", "older_than")


class V010:
    """A queue's verbs called as 0.1.0's callers called them: named arguments, each cast to its type."""

    def __init__(self, conn: Any, schema: str, queue: Queue):
        self.conn, self.schema, self.queue = conn, schema, queue
        self.payload_type = PAYLOAD_TYPES[queue.payload]
        self.id_type = "uuid" if queue.options.get("client_ids") else "bigint"

    def _cast(self, name: str) -> str:
        if name in ("payload", "payloads"):
            return self.payload_type + ("[]" if name == "payloads" else "")
        if name in ("id", "after_id"):
            return self.id_type
        if name in INTEGER_PARAMS:
            return "integer"
        if name in TIME_PARAMS:
            return "timestamptz"
        return {"due_ats": "timestamptz[]", "enqueued_ats": "timestamptz[]", "dedupe_keys": "text[]",
                "priorities": "integer[]", "ids": "uuid[]"}.get(name, "text")

    def payload(self, n: int) -> Any:
        return {"binary": f"bytes-{n}".encode(), "text": f"text {n}", "json": json.dumps({"n": n})}[self.queue.payload]

    def __call__(self, verb: str, **params: Any) -> list[dict]:
        params = {name: value for name, value in params.items() if value is not None}   # left to their defaults
        args = ", ".join(f"{name} => %({name})s::{self._cast(name)}" for name in params)
        cursor = self.conn.execute(f'SELECT * FROM "{self.schema}"."{self.queue.name}_{verb}"({args})', params)
        return [dict(zip([c.name for c in cursor.description], row)) for row in cursor.fetchall()]


NOW = datetime.now(timezone.utc)
LATER = NOW + timedelta(days=1)


def populate(call: V010) -> dict[str, Any]:
    """Messages in every state the queue's kind and options allow; returns what to look at after."""
    queue, seen = call.queue, {}
    options = queue.options
    key = (lambda n: f"key-{n}") if options.get("dedupe") else (lambda n: None)
    if queue.kind != "work":
        due = {"due_at": NOW - timedelta(seconds=5)} if queue.kind == "pending" else {}
        seen["ready"] = [call("enqueue", payload=call.payload(n), dedupe_key=key(n), **due)[0]["id"] for n in range(3)]
        if queue.kind == "pending":
            seen["not_due"] = call("enqueue", payload=call.payload(9), due_at=LATER)[0]["id"]
        if options.get("dedupe"):
            seen["key"] = ("key-1", seen["ready"][1])
        return seen
    client_id = (lambda: str(uuid.uuid4())) if options.get("client_ids") else (lambda: None)
    priority = (lambda n: n) if options.get("priority") else (lambda n: None)

    def enqueue(n: int, **extra: Any) -> Any:
        return call("enqueue", payload=call.payload(n), dedupe_key=key(n), priority=priority(n), id=client_id(),
                    enqueued_at=NOW - timedelta(minutes=n) if options.get("client_ids") else None, **extra)[0]["id"]

    # A dead letter: failed max_attempts times while alone in the queue.
    seen["dead"] = enqueue(1)
    for attempt in range(options["max_attempts"]):
        assert [row["id"] for row in call("dequeue", worker="w-dead")] == [seen["dead"]]
        outcome = call("fail", id=seen["dead"], worker="w-dead", error=f"failure {attempt}", retry_after_seconds=0)
    assert outcome == [{"outcome": "dead"}]
    # Retried: failed once, waiting an hour with its error.
    seen["retried"] = enqueue(2)
    assert [row["id"] for row in call("dequeue", worker="w-retry")] == [seen["retried"]]
    assert call("fail", id=seen["retried"], worker="w-retry", error="try later",
                retry_after_seconds=3600) == [{"outcome": "retrying"}]
    if options.get("history"):
        seen["completed"] = enqueue(3)
        assert [row["id"] for row in call("dequeue", worker="w-done")] == [seen["completed"]]
        assert call("complete", id=seen["completed"], worker="w-done") == [{"completed": True}]
    # Leased, live: the lease outlasts the test.
    seen["leased"] = enqueue(4)
    assert [row["id"] for row in call("dequeue", worker="w-live", lease_seconds=3600)] == [seen["leased"]]
    seen["ready"] = [enqueue(n) for n in (5, 6)]
    seen["delayed"] = enqueue(7, due_at=LATER)
    if options.get("dedupe"):
        seen["key"] = ("key-5", seen["ready"][0])
    return seen


def snapshot(conn: Any, schema: str) -> dict[str, Any]:
    """Every row of every queue table, keyed by column name, and every sequence's position."""
    tables = [row[0] for row in conn.execute(
        "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname <> 'tablequeue_deploy_history' ORDER BY 1",
        (schema,)).fetchall()]
    result: dict[str, Any] = {}
    for table in tables:
        cursor = conn.execute(f'SELECT * FROM "{schema}"."{table}"')
        columns = [c.name for c in cursor.description]
        result[table] = sorted((tuple(sorted(zip(columns, row))) for row in cursor.fetchall()), key=repr)
    for (sequence,) in conn.execute(
            "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'S' AND c.relname NOT LIKE 'tablequeue%%' ORDER BY 1",
            (schema,)).fetchall():
        result[sequence] = conn.execute(f'SELECT last_value, is_called FROM "{schema}"."{sequence}"').fetchone()
    return result


def run_deploy(url: str, schema: str, catalog: Catalog):
    units = [u for f in render_catalog(catalog, "postgres") for u in f.units]
    conn = connect(url)
    try:
        return deploy(conn, dialect_for("postgres"), schema, units)
    finally:
        conn.close()


@pytest.fixture
def schemas(pg_url: str):
    names = [f"u_{secrets.token_hex(4)}", f"f_{secrets.token_hex(4)}"]
    yield names
    for name in names:
        drop_schema("postgres", pg_url, name)


def check_verbs(call: V010, seen: dict[str, Any], conn: Any) -> None:
    """Every verb of the queue, called as 0.1.0 called it, on the messages 0.1.0 left."""
    queue = call.queue
    options = queue.options
    if options.get("dedupe"):
        existing_key, existing_id = seen["key"]
        again = call("enqueue", payload=call.payload(99), dedupe_key=existing_key)[0]
        assert (again["id"], again["duplicate"]) == (existing_id, True), queue.name
    new_id = call("enqueue", payload=call.payload(50))[0]["id"]
    batch = call("enqueue_batch", payloads=[call.payload(51), call.payload(52)])
    assert [row["duplicate"] for row in batch] == [False, False]
    stats = call("stats")[0]
    if queue.kind != "work":
        assert stats["ready"] >= len(seen["ready"]) + 3, (queue.name, stats)
        taken = [row["id"] for row in call("dequeue", batch_size=100)]
        expected = seen["ready"] + [new_id] + [row["id"] for row in batch]
        assert sorted(taken) == sorted(expected), queue.name
        if queue.kind == "fifo":
            assert taken == sorted(expected), queue.name  # oldest first, as before the upgrade
        if queue.kind == "lifo":
            assert taken == sorted(expected, reverse=True), queue.name
        if queue.kind == "pending":
            assert seen["not_due"] not in taken and call("purge", older_than=LATER + timedelta(days=1)) == [{"purged": 1}]
        return
    # The live lease is still the worker's: nobody else gets the message or may finish it.
    other = call("dequeue", batch_size=100, worker="w-other", lease_seconds=600)
    taken = [row["id"] for row in other]
    assert seen["leased"] not in taken and seen["retried"] not in taken and seen["delayed"] not in taken
    assert sorted(map(str, taken)) == sorted(map(str, seen["ready"] + [new_id] + [r["id"] for r in batch]))
    assert call("complete", id=seen["leased"], worker="w-other") == [{"completed": False}]
    assert call("extend_lease", id=seen["leased"], worker="w-live", lease_seconds=600) == [{"extended": True}]
    assert call("complete", id=seen["leased"], worker="w-live") == [{"completed": True}]
    assert call("fail", id=taken[0], worker="w-other", error="after the upgrade",
                retry_after_seconds=0) == [{"outcome": "retrying" if options["max_attempts"] > 1 else "dead"}]
    for message in taken[1:]:
        assert call("complete", id=message, worker="w-other") == [{"completed": True}]
    dead = call("dead_list")
    assert [row["id"] for row in dead] == [seen["dead"]] and dead[0]["attempts"] == options["max_attempts"]
    assert dead[0]["last_error"] == f"failure {options['max_attempts'] - 1}"
    assert call("dead_requeue", id=seen["dead"]) == [{"requeued": True}]
    assert call("dead_list") == []
    if options.get("history"):
        purged = call("history_purge", older_than=LATER)[0]["purged"]
        assert purged == 1 + 1 + len(taken) - 1, queue.name   # before the upgrade, the leased one, the rest
    assert call("stats")[0]["delayed"] >= 2   # the retried and the delayed messages wait as they did
    if options.get("handler") and "." not in options["handler"]:   # a handler in the queue's own schema
        conn.execute(f'CREATE PROCEDURE "{call.schema}"."{options["handler"]}"(id bigint, payload jsonb) '
                     "LANGUAGE plpgsql AS $$ BEGIN NULL; END $$")
        cursor = conn.execute(f'CALL "{call.schema}"."{queue.name}_process"(time_budget_seconds => 10)')
        assert dict(zip([c.name for c in cursor.description], cursor.fetchone()))["completed"] >= 1


def test_upgrade_from_0_1_0_keeps_every_message_and_every_verb_works(pg_url: str, schemas: list[str]) -> None:
    schema, fresh = schemas
    catalog = release_catalog(RELEASE, "option_matrix", schema)
    conn = connect(pg_url)
    try:
        deploy_v010(conn, "postgres", release_units(RELEASE, "postgres", "option_matrix", schema), schema)
        seen = {queue.name: populate(V010(conn, schema, queue)) for queue in catalog.queues}
        before = snapshot(conn, schema)
        assert sum(len(rows) for name, rows in before.items() if isinstance(rows, list)) > 60

        result = run_deploy(pg_url, schema, catalog)
        actions = {item.unit.name: item.action for item in result.plan.items}
        assert actions[f"{schema}.tablequeue_deploy_history"] == MIGRATE   # the history's own v1 -> v2
        storage = [item for item in result.plan.items if item.unit.type == "storage" and item.unit.queue]
        assert {item.action for item in storage if item.unit.object != "type"} == {RECORD}, \
            [(i.unit.name, i.action, i.reason) for i in storage]
        # enqueue's result type was part of the table's unit in 0.1.0: now a unit of its own, found in place.
        assert {item.action for item in storage if item.unit.object == "type"} == {CREATE}
        assert snapshot(conn, schema) == before

        history = dialect_for("postgres").read_history(conn, schema)
        recorded = [row for row in history if row["unit_type"] == "storage" and row["tool_version"] != "0.1.0"]
        assert all(row["storage_version"] >= 1 and (row["storage_shape"] or row["unit_name"].endswith("_history"))
                   for row in recorded)
        assert {item.action for item in run_deploy(pg_url, schema, catalog).plan.items} == {UNCHANGED}

        run_deploy(pg_url, fresh, release_catalog(RELEASE, "option_matrix", fresh))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)

        for queue in catalog.queues:
            check_verbs(V010(conn, schema, queue), seen[queue.name], conn)
    finally:
        conn.close()
