"""The benchmark environment: one PostgreSQL server, queues deployed into a fresh schema, helpers
to load and reset queue tables, and the machine facts the report records."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import subprocess
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psycopg

from tablequeue.catalog import Catalog, Queue, parse_catalog
from tablequeue.deploy import deploy
from tablequeue.engines import connect, dialect_for
from tablequeue.distribution import template_root
from tablequeue.render import render_catalog

REPO = Path(__file__).resolve().parents[1]
KINDS = ("heap", "fifo", "lifo", "pending", "work")
# The payload every benchmark message carries (~64 bytes of JSON); PgQueuer gets the same bytes.
PAYLOAD = json.dumps({"order": 12345, "customer": "c-000042", "note": "x" * 24}, separators=(",", ":"))
LEASE_SECONDS = 300


def available_kinds() -> list[str]:
    """Kinds whose PostgreSQL template exists (work is written concurrently by another engineer)."""
    return [k for k in KINDS if (template_root() / "postgres" / f"{k}.sql").exists()]


def queue_entries(kinds: list[str], extra_work_history: bool = False, deep: bool = False) -> list[dict]:
    """One queue per kind (q_<kind>); q_work_with_history (history: true) for the peer comparison;
    q_<kind>_deep, a twin held at the deepest depth so the depth target can alternate shallow and
    deep cells."""
    entries = [{"name": f"q_{kind}", "kind": kind, "payload": "json"} for kind in kinds]
    if deep:
        entries += [{"name": f"q_{kind}_deep", "kind": kind, "payload": "json"} for kind in kinds]
    if "work" in kinds and extra_work_history:
        entries.append({"name": "q_work_with_history", "kind": "work", "payload": "json",
                        "options": {"history": True}})
    return entries


@contextlib.contextmanager
def server(settings: dict[str, str] | None = None) -> Iterator[dict]:
    """{'url', 'embedded', 'bindir'}: TABLEQUEUE_PG_URL when set, else a throwaway cluster started
    with `settings` added to the embedded defaults."""
    configured = os.environ.get("TABLEQUEUE_PG_URL")
    if configured:
        yield {"url": configured, "embedded": False, "bindir": None}
        return
    from tablequeue.embedded import start_embedded

    pg = start_embedded(settings)
    try:
        yield {"url": pg.url, "embedded": True, "bindir": str(pg.bindir), "server": pg}
    finally:
        pg.stop()


def create_database(admin_url: str, prefix: str) -> str:
    """A new database on the same server; returns its URL (the admin URL with only the database
    name changed, so credentials and query parameters carry over)."""
    name = f"{prefix}_{secrets.token_hex(3)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return urllib.parse.urlsplit(admin_url)._replace(path=f"/{name}").geturl()


def drop_database(admin_url: str, url: str) -> None:
    name = urllib.parse.urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Env:
    url: str
    schema: str
    catalog: Catalog
    facts: dict = field(default_factory=dict)

    def conn(self, autocommit: bool = True) -> psycopg.Connection:
        return connect(self.url, autocommit=autocommit)

    def queue(self, name: str) -> Queue:
        return self.catalog.queue(name)

    def table(self, name: str) -> str:
        return f'"{self.schema}"."{name}"'

    def drop(self) -> None:
        with self.conn() as conn:
            dialect_for("postgres").drop_schema(conn, self.schema)


def deploy_env(url: str, entries: list[dict]) -> Env:
    schema = f"bench_{secrets.token_hex(3)}"
    catalog = parse_catalog({"schema": schema, "queues": entries}, f"<bench catalog {schema}>")
    units = [u for f in render_catalog(catalog, "postgres") for u in f.units]
    with connect(url, autocommit=True) as conn:
        deploy(conn, dialect_for("postgres"), schema, units)
        for ext in ("pgstattuple",):
            try:
                conn.execute(f"CREATE EXTENSION IF NOT EXISTS {ext}")
            except psycopg.Error:
                pass
    return Env(url, schema, catalog)


# -- queue tables -----------------------------------------------------------------------------
def fill_columns(conn: psycopg.Connection, schema: str, table: str) -> list[tuple[str, str]]:
    """(column, SQL expression) for every NOT NULL column without a default: what a raw INSERT must
    supply. The payload gets the benchmark payload, timestamps now(); anything else is an error."""
    rows = conn.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod)
           FROM pg_attribute AS a
           JOIN pg_class AS c ON c.oid = a.attrelid
           JOIN pg_namespace AS n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
             AND a.attnotnull AND NOT a.atthasdef AND a.attidentity = ''
           ORDER BY a.attnum""", (schema, table)).fetchall()
    out = []
    for name, type_ in rows:
        if name == "payload":
            out.append((name, "%(payload)s::" + type_))
        elif type_.startswith("timestamp"):
            out.append((name, "now()"))
        elif type_ in ("integer", "bigint", "smallint"):
            out.append((name, "0"))
        else:
            raise RuntimeError(f"bench: cannot fill NOT NULL column {table}.{name} ({type_})")
    return out


def insert_sql(conn: psycopg.Connection, schema: str, table: str) -> str:
    """A set-based raw INSERT ... SELECT generate_series(1, %(n)s): preloading and refilling."""
    cols = fill_columns(conn, schema, table)
    names = ", ".join(f'"{c}"' for c, _ in cols)
    values = ", ".join(expr for _, expr in cols)
    return (f'INSERT INTO "{schema}"."{table}" ({names}) '
            f"SELECT {values} FROM generate_series(1, %(n)s)")


def count(conn: psycopg.Connection, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def set_depth(env: Env, name: str, depth: int, vacuum: bool = True) -> int:
    """Make the queue table hold exactly `depth` waiting messages (raw SQL), then VACUUM it so each
    measurement starts from the same physical state. Returns the depth."""
    table = env.table(name)
    with env.conn() as conn:
        have = count(conn, table)
        if have < depth:
            sql = insert_sql(conn, env.schema, name)
            remaining = depth - have
            while remaining > 0:  # chunks keep one statement's memory and WAL modest
                step = min(remaining, 250_000)
                conn.execute(sql, {"n": step, "payload": PAYLOAD})
                remaining -= step
        elif have > depth:
            conn.execute(f"DELETE FROM {table} WHERE id IN "
                         f"(SELECT id FROM {table} ORDER BY id DESC LIMIT %s)", (have - depth,))
        if vacuum:
            conn.execute(f"VACUUM (ANALYZE) {table}")
        got = count(conn, table)
    if got != depth:
        raise RuntimeError(f"bench: {name} holds {got} messages, wanted {depth}")
    return got


def max_id(env: Env, name: str) -> int:
    with env.conn() as conn:
        return conn.execute(f"SELECT coalesce(max(id), 0) FROM {env.table(name)}").fetchone()[0]


def dead_tuples(env: Env, name: str, exact: bool = False) -> dict:
    with env.conn() as conn:
        row = conn.execute(
            "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
            (env.schema, name)).fetchone()
        out = {"n_live_tup": row[0], "n_dead_tup": row[1]} if row else {}
        if exact:
            try:
                t = conn.execute("SELECT tuple_count, dead_tuple_count, table_len, free_space "
                                 "FROM pgstattuple(%s::regclass)", (env.table(name),)).fetchone()
                out.update(pgstattuple_live=t[0], pgstattuple_dead=t[1], table_bytes=t[2], free_bytes=t[3])
            except psycopg.Error:
                pass
    return out


# -- machine facts ------------------------------------------------------------------------------
SETTINGS = ("server_version", "shared_buffers", "work_mem", "max_connections", "fsync", "synchronous_commit",
            "full_page_writes", "wal_level", "autovacuum", "autovacuum_naptime",
            "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold", "checkpoint_timeout",
            "max_wal_size", "effective_cache_size", "random_page_cost", "jit", "max_locks_per_transaction",
            "default_transaction_isolation", "track_io_timing")


def host_stall_probe(seconds: float = 5.0) -> dict:
    """How much of `seconds` a busy pure-Python loop loses to gaps of over 20 ms, when the machine
    does not run it. A quiet machine loses next to nothing; a starved virtual machine loses most of
    it, and every throughput figure measured on it then measures the host."""
    lost, longest, gaps = 0.0, 0.0, 0
    start = last = time.perf_counter()
    while last - start < seconds:
        now = time.perf_counter()
        if now - last > 0.02:
            lost, gaps, longest = lost + (now - last), gaps + 1, max(longest, now - last)
        last = now
    return {"seconds": seconds, "lost_seconds": round(lost, 3), "gaps": gaps, "longest_gap_seconds": round(longest, 3)}


def cpu_accounting() -> tuple[float, int] | None:
    """(monotonic seconds, clock ticks the CPUs ran for this machine, idle included and steal not),
    from /proc/stat. Over an interval, ticks / (seconds * CPUs * ticks per second) is the share of wall
    time the CPUs were this machine's: below 1 when a hypervisor took them, whether it reports that
    as steal or the ticks go missing."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    return time.monotonic(), sum(int(f) for f in fields[:7])


def cpu_share(start: tuple[float, int] | None, end: tuple[float, int] | None) -> float | None:
    if not start or not end or end[0] <= start[0]:
        return None
    return (end[1] - start[1]) / ((end[0] - start[0]) * (os.cpu_count() or 1) * os.sysconf("SC_CLK_TCK"))


def machine_facts(url: str) -> dict:
    facts: dict[str, Any] = {"nproc": os.cpu_count(), "platform": platform.platform(),
                             "python": platform.python_version()}
    try:
        facts["cpu_model"] = next(line.split(":", 1)[1].strip() for line in
                                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        facts["mem_total"] = next(line.split(":", 1)[1].strip() for line in
                                  Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    facts["loadavg_start"] = os.getloadavg()
    with connect(url, autocommit=True) as conn:
        facts["postgres_version"] = conn.execute("SELECT version()").fetchone()[0]
        rows = conn.execute("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                            (list(SETTINGS),)).fetchall()
        facts["settings"] = dict(rows)
        nondefault = conn.execute("SELECT name, current_setting(name) FROM pg_settings WHERE source NOT IN "
                                  "('default', 'override', 'client', 'session') ORDER BY name").fetchall()
        facts["settings_non_default"] = dict(nondefault)
    try:
        facts["git_head"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=REPO).stdout.strip()
        facts["templates_dirty"] = bool(subprocess.run(
            ["git", "status", "--porcelain", "database/templates/postgres"], capture_output=True, text=True,
            cwd=REPO).stdout.strip())
    except OSError:
        pass
    try:
        facts["pgbench"] = subprocess.run(["pgbench", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        facts["pgbench"] = None
    try:
        from importlib.metadata import version
        facts["pgqueuer"] = version("pgqueuer")
        facts["psycopg"] = version("psycopg")
    except Exception:  # noqa: BLE001
        pass
    return facts
