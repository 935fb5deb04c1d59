"""Depths and ages of every queue of a database, read through each queue's `stats` verb.

`tablequeue stats` prints them, `tablequeue metrics` serves them to Prometheus, the demo ends with
them. Nothing here reads a queue's tables: finding the queues reads the system catalog (the
routines the login may execute), the numbers come from S.Q_stats, so the admin role suffices.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog, Queue
from .client import QueueClient

# The stats verb's result columns (DESIGN.md §3): what `stats` prints and `metrics` exposes.
COUNTS = ("ready", "delayed", "in_flight", "dead")
AGE = "oldest_ready_age_seconds"
# What discovery calls a queue whose routines do not tell its kind (heap, fifo and lifo queues have
# the same verbs with the same parameters): pass the catalog for the exact kind.
DESTRUCTIVE_UNKNOWN = "heap|fifo|lifo"

# Every routine the login may execute whose name ends in one of the verbs discovery looks at, with
# whether it takes a due_at parameter (enqueue of pending and work queues).
POSTGRES_ROUTINES = r"""SELECT n.nspname, p.proname, coalesce('due_at' = ANY(p.proargnames), false)
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
  AND (p.proname LIKE '%\_stats' OR p.proname LIKE '%\_enqueue' OR p.proname LIKE '%\_dequeue'
       OR p.proname LIKE '%\_complete')
  AND has_function_privilege(p.oid, 'EXECUTE')"""
MSSQL_ROUTINES = """SELECT SCHEMA_NAME(p.schema_id) AS schema_name, p.name,
    CASE WHEN EXISTS (
        SELECT 1 FROM sys.parameters AS a WHERE a.object_id = p.object_id AND a.name = N'@due_at'
    ) THEN 1 ELSE 0 END AS has_due_at
FROM sys.procedures AS p
WHERE (p.name LIKE N'%[_]stats' OR p.name LIKE N'%[_]enqueue' OR p.name LIKE N'%[_]dequeue'
       OR p.name LIKE N'%[_]complete')
  AND HAS_PERMS_BY_NAME(QUOTENAME(SCHEMA_NAME(p.schema_id)) + N'.' + QUOTENAME(p.name), N'OBJECT', N'EXECUTE') = 1"""


class StatsError(RuntimeError):
    pass


@dataclass(frozen=True)
class QueueRef:
    schema: str
    name: str
    kind: str    # a catalog kind, or DESTRUCTIVE_UNKNOWN where discovery cannot tell


def discover_queues(conn: Any, dialect: str) -> list[QueueRef]:
    """Every queue of the database whose stats the login may call: a schema's <q>_stats beside its
    <q>_enqueue and <q>_dequeue. work: it has <q>_complete; pending: its enqueue takes due_at."""
    if dialect == "postgres":
        rows = conn.execute(POSTGRES_ROUTINES).fetchall()
    else:
        cursor = conn.cursor()
        try:
            cursor.execute(MSSQL_ROUTINES)
            rows = cursor.fetchall()
        finally:
            cursor.close()
    routines = {(schema, name) for schema, name, _ in rows}
    due_at = {(schema, name) for schema, name, has_due_at in rows if has_due_at}
    found = []
    for schema, name in sorted(routines):
        if not name.endswith("_stats"):
            continue
        queue = name[: -len("_stats")]
        if (schema, f"{queue}_enqueue") not in routines or (schema, f"{queue}_dequeue") not in routines:
            continue
        if (schema, f"{queue}_complete") in routines:
            kind = "work"
        elif (schema, f"{queue}_enqueue") in due_at:
            kind = "pending"
        else:
            kind = DESTRUCTIVE_UNKNOWN
        found.append(QueueRef(schema, queue, kind))
    return found


def catalog_queues(conn: Any, dialect: str, catalog: Catalog) -> list[QueueRef]:
    """The catalog's queues with their exact kinds; a queue the database does not have (or whose
    stats the login may not call) is an error naming the catalog file and the queue."""
    deployed = {(ref.schema, ref.name) for ref in discover_queues(conn, dialect)}
    missing = [q.name for q in catalog.queues if (catalog.schema, q.name) not in deployed]
    if missing:
        raise StatsError(f"{catalog.path}: queue '{missing[0]}': {catalog.schema}.{missing[0]}_stats is not deployed "
                         f"in this database, or the login may not execute it"
                         + (f" ({len(missing) - 1} more queue(s) likewise)" if len(missing) > 1 else ""))
    return [QueueRef(catalog.schema, q.name, q.kind) for q in catalog.queues]


def find_queues(conn: Any, dialect: str, catalog: Catalog | None) -> list[QueueRef]:
    return catalog_queues(conn, dialect, catalog) if catalog is not None else discover_queues(conn, dialect)


def read_stats(conn: Any, dialect: str, queues: list[QueueRef]) -> list[dict]:
    """One row per queue: schema, queue, kind, the stats verb's counts, oldest_ready_age_seconds
    (None when nothing is ready) and estimated (counts past 10,000 are estimates)."""
    rows = []
    for ref in queues:
        # The stats verb takes no argument: neither the kind nor the payload type (the client needs
        # them only to pass arguments) plays a part in the call.
        client = QueueClient(conn, dialect, ref.schema, Queue(ref.name, "work", "binary"))
        stats = client.stats()
        age = stats[AGE]
        rows.append({"schema": ref.schema, "queue": ref.name, "kind": ref.kind,
                     **{count: int(stats[count]) for count in COUNTS},
                     AGE: None if age is None else float(age), "estimated": bool(stats["estimated"])})
    return rows


def set_statement_timeout(conn: Any, dialect: str, seconds: float) -> None:
    """Every later statement of the connection is cancelled after `seconds`."""
    if dialect == "postgres":
        conn.execute(f"SET statement_timeout = {max(1, int(seconds * 1000))}")
    else:
        conn.timeout = max(1, int(seconds))


def format_table(rows: list[dict]) -> str:
    """The rows as `tablequeue stats` prints them; a count that is an estimate is marked with '~'."""
    header = ("schema", "queue", "kind", "ready", "delayed", "in_flight", "dead", "oldest_ready_age")
    lines = [header]
    for row in rows:
        mark = "~" if row["estimated"] else ""
        age = row[AGE]
        lines.append((row["schema"], row["queue"], row["kind"], *(f"{mark}{row[c]}" for c in COUNTS),
                      "-" if age is None else f"{age:.1f}s"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = range(3, len(header))
    return "\n".join("  ".join(cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
                               for i, cell in enumerate(line)).rstrip() for line in lines)


def to_json(rows: list[dict], at: str) -> str:
    """One line: {"at": ISO time, "queues": rows}."""
    return json.dumps({"at": at, "queues": rows})
