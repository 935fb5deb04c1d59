"""Depths and ages of every queue of a database, read through each queue's `stats` verb.

`tablequeue stats` prints them, `tablequeue metrics` serves them to Prometheus, the demo ends with
them. Nothing here reads a queue's tables: finding the queues reads the system catalog (the
routines of the queue verbs, and which <q>_stats the login may execute), the numbers come from
S.Q_stats, so the admin role suffices.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from .catalog import Catalog, Queue
from .client import QueueClient

# The stats verb's result columns (DESIGN.md §3): what `stats` prints and `metrics` exposes.
COUNTS = ("ready", "delayed", "in_flight", "dead")
AGE = "oldest_ready_age_seconds"
# What discovery calls a queue whose routines do not tell its kind (heap, fifo and lifo queues have
# the same verbs with the same parameters): pass the catalog for the exact kind.
DESTRUCTIVE_UNKNOWN = "heap|fifo|lifo"
# The same, when the login cannot see the queue's enqueue either (SQL Server shows a login only the
# procedures it may execute: an admin-only login sees stats and purge, which pending shares too).
NOT_WORK_UNKNOWN = "heap|fifo|lifo|pending"

# The routines discovery looks at, with whether the login may execute each and whether it takes a
# due_at parameter (enqueue of pending and work queues). Only <q>_stats must be executable, so the
# admin role (stats, purge, the dead letters) suffices. PostgreSQL shows every routine in pg_proc;
# SQL Server's sys.procedures shows only those the login holds a permission on, so an admin-only
# login tells a work queue by its <q>_dead_list, an admin verb of work queues only. On PostgreSQL only
# schemas tablequeue deployed to count, and no extension's function: pg_walinspect's
# pg_get_wal_stats() in public is no queue.
POSTGRES_ROUTINES = r"""SELECT n.nspname, p.proname, coalesce('due_at' = ANY(p.proargnames), false),
    has_function_privilege(p.oid, 'EXECUTE')
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
  AND EXISTS (SELECT FROM pg_catalog.pg_class AS h
              WHERE h.relnamespace = n.oid AND h.relname = 'tablequeue_deploy_history')
  AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                  WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
  AND (p.proname LIKE '%\_stats' OR p.proname LIKE '%\_enqueue' OR p.proname LIKE '%\_complete'
       OR p.proname LIKE '%\_dead\_list')"""
MSSQL_ROUTINES = """SELECT SCHEMA_NAME(p.schema_id) AS schema_name, p.name,
    CASE WHEN EXISTS (
        SELECT 1 FROM sys.parameters AS a WHERE a.object_id = p.object_id AND a.name = N'@due_at'
    ) THEN 1 ELSE 0 END AS has_due_at,
    HAS_PERMS_BY_NAME(QUOTENAME(SCHEMA_NAME(p.schema_id)) + N'.' + QUOTENAME(p.name), N'OBJECT', N'EXECUTE')
        AS executable
FROM sys.procedures AS p
WHERE p.name LIKE N'%[_]stats' OR p.name LIKE N'%[_]enqueue' OR p.name LIKE N'%[_]complete'
   OR p.name LIKE N'%[_]dead[_]list'"""


class StatsError(RuntimeError):
    pass


@dataclass(frozen=True)
class QueueRef:
    schema: str
    name: str
    kind: str    # a catalog kind, or DESTRUCTIVE_UNKNOWN where discovery cannot tell


def _routines(conn: Any, dialect: str) -> list[tuple]:
    """(schema, name, takes due_at, the login may execute it) of the routines discovery looks at."""
    if dialect == "postgres":
        return conn.execute(POSTGRES_ROUTINES).fetchall()
    cursor = conn.cursor()
    try:
        cursor.execute(MSSQL_ROUTINES)
        return cursor.fetchall()
    finally:
        cursor.close()


def discover_queues(conn: Any, dialect: str) -> list[QueueRef]:
    """Every queue of the database whose stats the login may call (<q>_stats). work: it has
    <q>_complete or <q>_dead_list; pending: its enqueue takes due_at."""
    rows = _routines(conn, dialect)
    routines = {(schema, name) for schema, name, _, _ in rows}
    due_at = {(schema, name) for schema, name, has_due_at, _ in rows if has_due_at}
    found = []
    for schema, name in sorted((schema, name) for schema, name, _, executable in rows
                               if executable and name.endswith("_stats")):
        queue = name[: -len("_stats")]
        if {(schema, f"{queue}_complete"), (schema, f"{queue}_dead_list")} & routines:
            kind = "work"
        elif (schema, f"{queue}_enqueue") in due_at:
            kind = "pending"
        elif (schema, f"{queue}_enqueue") in routines:
            kind = DESTRUCTIVE_UNKNOWN
        else:
            kind = NOT_WORK_UNKNOWN
        found.append(QueueRef(schema, queue, kind))
    return found


def catalog_queues(conn: Any, dialect: str, catalog: Catalog) -> list[QueueRef]:
    """The catalog's queues with their exact kinds; a queue whose stats the database does not have
    (or the login may not call) is an error naming the catalog file and the queue."""
    callable_stats = {(schema, name) for schema, name, _, executable in _routines(conn, dialect)
                      if executable}
    missing = [q.name for q in catalog.queues if (catalog.schema, f"{q.name}_stats") not in callable_stats]
    if missing:
        raise StatsError(f"{catalog.path}: queue '{missing[0]}': {catalog.schema}.{missing[0]}_stats is not deployed "
                         f"in this database, or the login may not execute it"
                         + (f" ({len(missing) - 1} more queue(s) likewise)" if len(missing) > 1 else ""))
    return [QueueRef(catalog.schema, q.name, q.kind) for q in catalog.queues]


def find_queues(conn: Any, dialect: str, catalog: Catalog | None) -> list[QueueRef]:
    return catalog_queues(conn, dialect, catalog) if catalog is not None else discover_queues(conn, dialect)


def read_stats(conn: Any, dialect: str, queues: list[QueueRef],
               before_each: Callable[[], None] | None = None) -> list[dict]:
    """One row per queue: schema, queue, kind, the stats verb's counts, oldest_ready_age_seconds
    (None when nothing is ready) and estimated (counts past 10,000 are estimates). before_each runs
    before each queue's call (metrics sets the statement timeout to what is left of its deadline)."""
    rows = []
    for ref in queues:
        if before_each is not None:
            before_each()
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
    """Every later statement of the connection is cancelled after `seconds` (SQL Server: whole
    seconds, at least 1)."""
    if dialect == "postgres":
        conn.execute(f"SET statement_timeout = {max(1, int(seconds * 1000))}")
    else:
        conn.timeout = max(1, math.ceil(seconds))


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
