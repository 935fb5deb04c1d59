"""Kept releases (tests/fixtures/releases/) deployed as their own tool did, 0.1.0's call shapes, queues
with messages in every state, and a schema's description for comparing an upgraded schema with a
fresh install of the same catalog."""
from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from tablequeue.catalog import Catalog, Queue, parse_catalog
from tablequeue.deploy import DeployResult, deploy
from tablequeue.engines import connect, dialect_for
from tablequeue.render import render_catalog
from tablequeue.gosplit import split_batches

RELEASES = Path(__file__).resolve().parent / "fixtures" / "releases"
# 0.1.0's own marker: no storage version, no shape.
V010_MARKER = re.compile(r"^-- tablequeue:unit (?P<name>\S+) (?P<type>storage|code)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ReleasedUnit:
    name: str
    type: str
    queue: str | None
    body: str


def v010_checksum(body: str) -> str:
    """0.1.0's unit checksum (render.checksum as it was): blind to line endings and trailing blanks."""
    normalised = "\n".join(line.rstrip() for line in body.replace("\r\n", "\n").strip().split("\n"))
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def _renamed(text: str, old: str, new: str) -> str:
    """The kept SQL with its schema renamed: every use of the schema name is the schema itself or one
    of its roles (<schema>_producer...), never part of another word (checked for 'matrix')."""
    return re.sub(rf"(?<![\w]){re.escape(old)}(?=(?:_producer|_consumer|_admin)?(?![\w]))", new, text)


def release_catalog(release: str, catalog: str, schema: str) -> Catalog:
    document = yaml.safe_load((RELEASES / release / f"{catalog}.yml").read_text())
    document["schema"] = schema
    return parse_catalog(document, f"<release {release} {catalog}.yml as schema {schema}>")


def release_units(release: str, dialect: str, catalog: str, schema: str) -> list[ReleasedUnit]:
    """The release's units in the order its deploy applied them: the framework, then each queue."""
    original = yaml.safe_load((RELEASES / release / f"{catalog}.yml").read_text())
    folder = RELEASES / release / dialect / catalog
    units = []
    for queue in [None] + [q["name"] for q in original["queues"]]:
        text = _renamed((folder / f"{queue or '_framework'}.sql").read_text(), original["schema"], schema)
        matches = list(V010_MARKER.finditer(text))
        for index, match in enumerate(matches):
            end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
            units.append(ReleasedUnit(match["name"], match["type"], queue,
                                      text[match.end():end].strip("\n") + "\n"))
    return units


def deploy_v010(conn: Any, dialect: str, units: list[ReleasedUnit], schema: str) -> None:
    """Apply the units as 0.1.0's deploy did: each body in its own transaction with the history row
    0.1.0 wrote (no storage version: its history table had no such column)."""
    engine = dialect_for(dialect)
    history = f'"{schema}"."tablequeue_deploy_history"' if dialect == "postgres" else \
        f"[{schema}].[tablequeue_deploy_history]"
    insert = (f"INSERT INTO {history} (unit_name, unit_type, queue_name, tool_version, unit_checksum, "
              "object_checksum, duration_ms) VALUES ")
    for unit in units:
        started = time.monotonic()
        if dialect == "postgres":
            with conn.transaction():
                conn.execute(unit.body)
                conn.execute(insert + "(%s, %s, %s, %s, %s, %s, %s)",
                             (unit.name, unit.type, unit.queue, "0.1.0", v010_checksum(unit.body),
                              engine.object_checksum(conn, unit.name), int((time.monotonic() - started) * 1000)))
            continue
        cursor = conn.cursor()
        for batch in split_batches(unit.body):
            for _ in range(batch.repeat):
                cursor.execute(batch.text)
                while cursor.nextset():
                    pass
        cursor.execute(insert + "(?, ?, ?, ?, ?, ?, ?)", unit.name, unit.type, unit.queue, "0.1.0",
                       v010_checksum(unit.body), engine.object_checksum(conn, unit.name),
                       int((time.monotonic() - started) * 1000))
        conn.commit()
        cursor.close()


def _normalised(text: Any, schema: str) -> Any:
    if not isinstance(text, str):
        return text
    return re.sub(rf"(?<![\w]){re.escape(schema)}(?=(?:_producer|_consumer|_admin|_owner)?(?![\w]))", "S", text)


def describe_postgres_schema(conn: Any, schema: str) -> dict[str, Any]:
    """Everything of a schema a fresh install decides, with the schema's name replaced by S: columns
    (type, nullability, default, identity), storage parameters, indexes, constraints, sequences,
    types, routines, owners and grants. Columns are keyed by name: an added column comes last in
    the table where a fresh install has it in the middle, and nothing tablequeue runs depends on
    the order (docs/upgrades.md)."""
    def rows(sql: str) -> list[tuple]:
        return [tuple(_normalised(value, schema) for value in row)
                for row in conn.execute(sql, {"schema": schema}).fetchall()]

    return {
        "columns": sorted(rows(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attcollation::regcollation::text "
            "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "LEFT JOIN pg_attrdef AS d ON d.adrelid = c.oid AND d.adnum = a.attnum "
            "WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'c')")),
        "relations": sorted(rows(
            "SELECT c.relname, c.relkind, c.reloptions::text, pg_get_userbyid(c.relowner), c.relacl::text "
            "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S', 'i', 'v')")),
        "indexes": sorted(rows(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisready "
            "FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %(schema)s")),
        "constraints": sorted(rows(
            "SELECT r.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.convalidated "
            "FROM pg_constraint AS k JOIN pg_class AS r ON r.oid = k.conrelid "
            "JOIN pg_namespace AS n ON n.oid = r.relnamespace WHERE n.nspname = %(schema)s")),
        "sequences": sorted(rows(
            "SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax, "
            "s.seqcycle, (SELECT d.refobjid::regclass::text FROM pg_depend AS d WHERE d.objid = c.oid "
            "AND d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) "
            "FROM pg_sequence AS s JOIN pg_class AS c ON c.oid = s.seqrelid "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %(schema)s")),
        "types": sorted(rows(
            "SELECT t.typname, t.typtype, pg_get_userbyid(t.typowner) FROM pg_type AS t "
            "JOIN pg_namespace AS n ON n.oid = t.typnamespace WHERE n.nspname = %(schema)s "
            "AND t.typtype IN ('c', 'd', 'e') AND NOT EXISTS (SELECT FROM pg_class AS c "
            "WHERE c.oid = t.typrelid AND c.relkind <> 'c')")),
        "routines": sorted((signature, hashlib.sha256(definition.encode()).hexdigest(), *rest) for signature, definition, *rest
                           in rows("SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), "
                                   "pg_get_userbyid(p.proowner), p.proacl::text, p.prosecdef, p.proconfig::text "
                                   "FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
                                   "WHERE n.nspname = %(schema)s")),
        "schema": rows("SELECT pg_get_userbyid(n.nspowner), n.nspacl::text FROM pg_namespace AS n "
                       "WHERE n.nspname = %(schema)s"),
    }


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


def deploy_catalog(url: str, schema: str, catalog: Catalog, **kwargs: Any) -> DeployResult:
    """Deploy a catalog to PostgreSQL with the current tool (kwargs: deploy()'s options)."""
    units = [u for f in render_catalog(catalog, "postgres") for u in f.units]
    conn = connect(url)
    try:
        return deploy(conn, dialect_for("postgres"), schema, units, **kwargs)
    finally:
        conn.close()
