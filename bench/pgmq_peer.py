"""A second peer: pgmq, side by side with the work kind, in both commit regimes (issue 22).

pgmq is the SQL that PyPI's `pgmq==1.1.4` ships (pgmq 1.13.0), installed as plain SQL by the
package's own installer (`pgmq.install.install_pgmq_from_sql`, no extension build) into a database
of its own on the same server, with one queue, `bench`. Both sides run as pgbench scripts (a C
client, `-M prepared`), so no client library is measured, and alternate run by run:

  batch 1      pgmq read + delete       vs dequeue + complete, and complete_next (one call, one commit)
  history      pgmq read + archive      vs dequeue + complete on a queue with history
  batch 10/100 pgmq read + delete(array) vs dequeue + complete_batch, and pgmq's two statements by
               hand on the work table (the floor, no target)
  enqueue      pgmq send / send_batch   vs enqueue / enqueue_batch, and the bare INSERT for scale

Commit regimes: `synchronous_commit` on (commits wait for the WAL flush) and off, set in every
pgbench session. That difference exists only where fsync is on, so a full run starts its own
embedded cluster with fsync, full_page_writes and synchronous_commit at PostgreSQL's defaults (the
other parts run with all three off); with TABLEQUEUE_PG_URL it is that server, whose fsync the
results record.

Per run: messages per second (pgbench's transactions per second times the messages a transaction
moved, counted from the tables), and WAL bytes per message (`pg_current_wal_insert_lsn()` before and
after, over the messages moved: full-page images after checkpoints and autovacuum included, as a
production server pays them). The load-independent figures, server instructions and WAL bytes per
message with one client on a server under callgrind (full_page_writes off there, so WAL is the
records alone), come from `count`, which also counts the lease designs of bench/work_raw.py.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psycopg

from .ceiling import _literal, fn_call, payload_array, raw_enqueue, raw_enqueue_batch, run_pgbench
from .env import LEASE_SECONDS, PAYLOAD, Env, count, create_database, deploy_env, drop_database, set_depth
from .work_raw import (WORKER, create_design_table, design_script, index_entries, lease_designs, wal_written,
                       work_fn_cycle)

QUEUE = "bench"
TABLE = 'pgmq."q_bench"'
# The durable server: what PostgreSQL does by default (the embedded cluster turns all three off).
DURABLE = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}
REGIMES = ("on", "off")
QUEUES = ("q_work", "q_work_with_history")
# Messages waiting at the start of a dequeue run, per second of run, per batch size: more than the
# run can take (checked: `drained`).
DEPTH_PER_SECOND = {1: 20_000, 10: 80_000, 100: 150_000}


@dataclass(frozen=True)
class Side:
    who: str          # pgmq | tablequeue | complete_next | bare INSERT | raw SQL
    label: str
    database: str     # pgmq | tablequeue: where the script runs
    table: str        # qualified: the table whose rows the script moves
    op: str           # enqueue | dequeue
    script: str
    defines: tuple[tuple[str, str], ...] = ()   # the script's variables' first values


@dataclass(frozen=True)
class Shape:
    key: str
    name: str
    batch: int
    sides: tuple[Side, ...]     # the first is pgmq's: every ratio is over it


def pgmq_database(admin_url: str) -> str:
    """A new database on the server with pgmq's SQL installed and the queue created."""
    from pgmq.install import install_pgmq_from_sql

    url = create_database(admin_url, "bench_pgmq")
    install_pgmq_from_sql(dsn=url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create(%s)", (QUEUE,))
    return url


def load_pgmq(conn: psycopg.Connection, depth: int) -> None:
    """pgmq's queue holding exactly `depth` visible messages, vacuumed: what set_depth does for ours
    (`conn`: autocommit, to pgmq's database)."""
    have = count(conn, TABLE)
    remaining = depth - have
    while remaining > 0:
        step = min(remaining, 250_000)
        conn.execute(f"INSERT INTO {TABLE} (vt, message) SELECT clock_timestamp(), %s::jsonb "
                     "FROM generate_series(1, %s)", (PAYLOAD, step))
        remaining -= step
    if have > depth:
        conn.execute(f"DELETE FROM {TABLE} WHERE msg_id IN (SELECT msg_id FROM {TABLE} ORDER BY msg_id DESC "
                     "LIMIT %s)", (have - depth,))
    conn.execute(f"VACUUM (ANALYZE) {TABLE}")


def _fn(env: Env, queue: str, verb: str) -> str:
    return f'"{env.schema}"."{queue}_{verb}"'


def _lease(env: Env, queue: str, batch: str) -> str:
    return f"{_fn(env, queue, 'dequeue')}(batch_size => {batch}, worker => {WORKER}, lease_seconds => {LEASE_SECONDS})"


def shapes(env: Env, batches: tuple[int, ...] = (10, 100), enqueue_batches: tuple[int, ...] = (1, 10, 100)
           ) -> list[Shape]:
    q, h = QUEUES
    tq = env.table(q)
    read = f"SELECT msg_id FROM pgmq.read('{QUEUE}', {LEASE_SECONDS}, 1) \\gset\n"
    out = [
        Shape("cycle", "batch 1, no history", 1, (
            Side("pgmq", "read + delete", "pgmq", TABLE, "dequeue",
                 read + f"SELECT pgmq.delete('{QUEUE}', :msg_id::bigint);\n"),
            Side("tablequeue", "dequeue + complete", "tablequeue", tq, "dequeue", work_fn_cycle(env, q, fenced=True)),
            Side("complete_next", "complete_next (one call, one commit per message)", "tablequeue", tq, "dequeue",
                 complete_next_script(env, q), NOTHING_HELD))),
        Shape("history", "batch 1, with history", 1, (
            Side("pgmq", "read + archive", "pgmq", TABLE, "dequeue",
                 read + f"SELECT pgmq.archive('{QUEUE}', :msg_id::bigint);\n"),
            Side("tablequeue", "dequeue + complete (history: true)", "tablequeue", env.table(h), "dequeue",
                 work_fn_cycle(env, h, fenced=True)))),
    ]
    for b in batches:
        out.append(Shape(f"batch_{b}", f"batch {b}", b, (
            Side("pgmq", f"read({b}) + delete(array)", "pgmq", TABLE, "dequeue",
                 f"SELECT array_agg(msg_id) AS ids FROM pgmq.read('{QUEUE}', {LEASE_SECONDS}, {b}) \\gset\n"
                 f"SELECT count(*) FROM pgmq.delete('{QUEUE}', :ids::bigint[]);\n"),
            Side("tablequeue", f"dequeue({b}) + complete_batch", "tablequeue", tq, "dequeue",
                 f"SELECT array_agg(id) AS ids, array_agg(lease_token) AS tokens FROM {_lease(env, q, str(b))} \\gset\n"
                 f"SELECT count(*) FROM {_fn(env, q, 'complete_batch')}(ids => :ids::bigint[], "
                 f"lease_tokens => :tokens::uuid[], worker => {WORKER});\n"),
            Side(RAW, f"pgmq's two statements by hand on the work table ({b})", "tablequeue", tq, "dequeue",
                 raw_batch_script(tq, b)))))
    for b in enqueue_batches:
        one = b == 1
        out.append(Shape(f"enqueue_{b}", "enqueue, one message" if one else f"enqueue, batch {b}", b, (
            Side("pgmq", "send" if one else f"send_batch({b})", "pgmq", TABLE, "enqueue",
                 f"SELECT * FROM pgmq.send('{QUEUE}', {_literal(PAYLOAD)}::jsonb);\n" if one else
                 f"SELECT * FROM pgmq.send_batch('{QUEUE}', {payload_array(b)});\n"),
            Side("tablequeue", "enqueue" if one else f"enqueue_batch({b})", "tablequeue", tq, "enqueue",
                 fn_call(env, q, "enqueue", f"payload => {_literal(PAYLOAD)}::jsonb") if one else
                 fn_call(env, q, "enqueue_batch", f"payloads => {payload_array(b)}")),
            Side("bare INSERT", "INSERT into the queue table" if one else f"INSERT ... SELECT of {b}", "tablequeue",
                 tq, "enqueue", raw_enqueue(env, q) if one else raw_enqueue_batch(env, q, b)))))
    return out


# The floor of a batch: the statements pgmq's read and delete(array) run, written by hand against
# the work table (the claim index's order, a lease written as dequeue writes one), no function. Not a
# target: what no design that writes each message's lease and deletes each message can undercut.
RAW = "raw SQL"


def raw_batch_script(table: str, batch: int) -> str:
    return (f"WITH c AS (SELECT m.id FROM {table} AS m WHERE m.leased_by IS NULL AND m.visible_at <= clock_timestamp() "
            f"ORDER BY m.visible_at, m.id LIMIT {batch} FOR UPDATE SKIP LOCKED), "
            f"u AS (UPDATE {table} AS m SET attempts = m.attempts + 1, "
            f"visible_at = clock_timestamp() + interval '{LEASE_SECONDS} seconds', leased_by = {WORKER}, "
            f"leased_at = clock_timestamp(), lease_token = gen_random_uuid() FROM c WHERE m.id = c.id "
            f"RETURNING m.id, m.payload, m.lease_token) SELECT array_agg(u.id) AS ids FROM u \\gset\n"
            f"DELETE FROM {table} WHERE id = ANY(:ids::bigint[]);\n")


# complete_next's first call in each client holds nothing yet: an id no message has, no token.
NOTHING_HELD = (("id", "0"), ("lease_token", "00000000-0000-0000-0000-000000000000"))


def complete_next_script(env: Env, queue: str) -> str:
    """A consumer that acknowledges and takes the next in one call: every call completes the
    message the call before leased (the first, NOTHING_HELD: nothing) and leases the next."""
    return (f"SELECT id, lease_token FROM {_fn(env, queue, 'complete_next')}(id => :id, worker => {WORKER}, "
            f"lease_token => :lease_token, batch_size => 1, lease_seconds => {LEASE_SECONDS}) \\gset\n")


def _load(env: Env, pgmq_conn: psycopg.Connection, side: Side, depth: int) -> None:
    if side.database == "pgmq":
        load_pgmq(pgmq_conn, depth)
    else:
        set_depth(env, side.table.split(".")[1].strip('"'), depth)


def _wal(conn: psycopg.Connection) -> tuple[int, int]:
    """(WAL inserted so far in bytes, full-page images written so far). The insert position, not
    pg_current_wal_lsn(): with synchronous_commit off the WAL written lags what was inserted."""
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, "
                       "(SELECT wal_fpi FROM pg_stat_wal)").fetchone()
    return int(row[0]), int(row[1])


def timed_run(env: Env, pgmq_url: str, pgmq_conn: psycopg.Connection, side: Side, batch: int, regime: str,
              clients: int, seconds: float, transactions: int, workdir: Path) -> dict:
    """One pgbench run of `side` from a freshly loaded (dequeue) or emptied (enqueue) queue."""
    depth = 0 if side.op == "enqueue" else (
        int(clients * transactions * batch * 1.2) + 100 if transactions
        else int(DEPTH_PER_SECOND[batch] * max(1, round(seconds))))
    _load(env, pgmq_conn, side, depth)
    url = pgmq_url if side.database == "pgmq" else env.url
    with psycopg.connect(url, autocommit=True) as conn:
        before, (lsn, fpi) = count(conn, side.table), _wal(conn)
        result = run_pgbench(url, side.script, clients, seconds, workdir, {"synchronous_commit": regime},
                             transactions, dict(side.defines))
        after, (lsn_end, fpi_end) = count(conn, side.table), _wal(conn)
    moved = after - before if side.op == "enqueue" else before - after
    return {"messages": moved, "transactions": result["processed"], "tps": result["tps"],
            "messages_per_s": result["tps"] * moved / result["processed"] if result["processed"] else 0.0,
            "wal_bytes_per_message": (lsn_end - lsn) / moved if moved > 0 else None,
            "fpi_per_message": (fpi_end - fpi) / moved if moved > 0 else None,
            "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"], "failed": result["failed"],
            "drained": side.op == "dequeue" and after == 0, "depth": depth}


def _mean(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return sum(values) / len(values) if values else None


def throughput(env: Env, pgmq_url: str, plan_shapes: list[Shape], clients: int, seconds: float, rounds: int,
               transactions: int, log: Callable) -> dict:
    """Every shape in both regimes, `rounds` times, the sides' order alternating by round and shape."""
    workdir = Path(tempfile.mkdtemp(prefix="tq-pgmq-"))
    os.chmod(workdir, 0o755)
    out: dict[str, list] = {}
    pgmq_conn = psycopg.connect(pgmq_url, autocommit=True)
    try:
        for regime in REGIMES:
            rows = []
            for index, shape in enumerate(plan_shapes):
                runs: dict[str, list] = {s.who: [] for s in shape.sides}
                for r in range(rounds):
                    order = shape.sides if (r + index) % 2 == 0 else tuple(reversed(shape.sides))
                    for side in order:
                        runs[side.who].append(timed_run(env, pgmq_url, pgmq_conn, side, shape.batch, regime,
                                                        clients, seconds, transactions, workdir))
                sides = {}
                for side in shape.sides:
                    rs = runs[side.who]
                    sides[side.who] = {"label": side.label, "op": side.op, "script": side.script, "runs": rs,
                                       **{k: _mean(rs, k) for k in ("messages_per_s", "wal_bytes_per_message",
                                                                    "fpi_per_message", "p50_ms", "p99_ms")},
                                       "failed": sum(r["failed"] for r in rs),
                                       "drained": any(r["drained"] for r in rs)}
                reference = sides["pgmq"]["messages_per_s"]
                ratios = {who: s["messages_per_s"] / reference for who, s in sides.items()
                          if who != "pgmq" and reference}
                rows.append({"key": shape.key, "shape": shape.name, "batch": shape.batch, "sides": sides,
                             "ratios": ratios})
                log(f"  pgmq synchronous_commit={regime} {shape.name}: " + "; ".join(
                    f"{who} {s['messages_per_s']:.0f}/s, {s['wal_bytes_per_message'] or 0:.0f} WAL B/msg"
                    for who, s in sides.items()) + " (" + ", ".join(f"{w} {x:.2f}x" for w, x in ratios.items()) + ")")
            out[regime] = rows
    finally:
        pgmq_conn.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def lease_wal(env: Env, pgmq_url: str) -> list[dict]:
    """What one lease and one complete write, per relation (pg_walinspect): each lease design of
    bench/work_raw.py on a queue of 1,000, and pgmq's read and delete. The second lease of each
    is the one recorded: the first also writes what happens once (the root page of an empty
    partial index, catalog pruning)."""
    out = []
    worker = "'wal-probe'"
    with env.conn() as conn:
        for design in lease_designs(QUEUES[0]):
            create_design_table(conn, env.schema, QUEUES[0], design)
    for design in lease_designs(QUEUES[0]):
        set_depth(env, design.table, 1_000)
        t = env.table(design.table)
        with env.conn() as conn:
            for _ in range(2):
                lease = wal_written(conn, [design.probe.format(t=t, w=worker)]
                                    + [c.format(t=t, w=worker) for c in design.claims])
            leased = conn.execute(f"SELECT max(id) FROM {t} WHERE leased_by = {worker}").fetchone()[0]
            done = wal_written(conn, [design.done.format(t=t, w=worker, id=leased)])
        out.append({"design": design.name, "lease": lease, "complete": done, "lease_index_entries": index_entries(lease),
                    "hot": _hot(lease)})
    with psycopg.connect(pgmq_url, autocommit=True) as conn:
        load_pgmq(conn, 1_000)
        for _ in range(2):
            lease = wal_written(conn, [f"SELECT * FROM pgmq.read('{QUEUE}', {LEASE_SECONDS}, 1)"])
        leased = conn.execute(f"SELECT max(msg_id) FROM {TABLE} WHERE read_ct > 0").fetchone()[0]
        done = wal_written(conn, [f"SELECT pgmq.delete('{QUEUE}', {leased}::bigint)"])
    out.append({"design": "pgmq: pk (msg_id), vt", "lease": lease, "complete": done,
                "lease_index_entries": index_entries(lease), "hot": _hot(lease)})
    return out


def _hot(records: list[dict]) -> bool | None:
    kinds = {r["record"].split()[0] for r in records if r["rmgr"] == "Heap"}
    return True if "HOT_UPDATE" in kinds else False if "UPDATE" in kinds else None


def settings_of(url: str) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                                 (["fsync", "full_page_writes", "synchronous_commit", "wal_level",
                                   "checkpoint_timeout", "max_wal_size", "server_version"],)).fetchall())


def run(clients: int, seconds: float, rounds: int, transactions: int, batches: tuple[int, ...],
        enqueue_batches: tuple[int, ...], counted: bool, log: Callable) -> dict:
    """The throughput runs on a durable server, the lease's WAL records, then (`counted`) the
    instruction counts on a server under callgrind."""
    from importlib.metadata import version

    from pgmq.install import get_embedded_sql_version

    from .env import queue_entries, server

    started = time.time()
    out: dict[str, Any] = {"pgmq_package": version("pgmq"), "pgmq_sql": get_embedded_sql_version(),
                           "clients": clients, "seconds": seconds, "rounds": rounds, "transactions": transactions,
                           "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_start": os.getloadavg()}
    with server(DURABLE) as srv:
        env = deploy_env(srv["url"], queue_entries(["work"], extra_work_history=True))
        pgmq_url = pgmq_database(srv["url"])
        try:
            out["server"] = {**settings_of(srv["url"]), "embedded": srv["embedded"]}
            log(f"  pgmq {out['pgmq_sql']} (PyPI pgmq {out['pgmq_package']}) on a server with fsync="
                f"{out['server']['fsync']}, full_page_writes={out['server']['full_page_writes']}")
            out["lease_wal"] = lease_wal(env, pgmq_url)
            for entry in out["lease_wal"]:
                log(f"  lease writes, {entry['design']}: index entries {entry['lease_index_entries']}, "
                    f"HOT {entry['hot']}")
            out["regimes"] = throughput(env, pgmq_url, shapes(env, batches, enqueue_batches), clients, seconds, rounds,
                                        transactions, log)
        finally:
            drop_database(srv["url"], pgmq_url)
            env.drop()
    out["loadavg_end"] = os.getloadavg()
    if counted:
        out["counted"] = count_work(batches, enqueue_batches, log)
    out["seconds_taken"] = time.time() - started
    return out


# -- server instructions and WAL per message, one client, under callgrind ---------------------------
def count_work(batches: tuple[int, ...], enqueue_batches: tuple[int, ...], log: Callable) -> dict:
    """Every shape's sides and every lease design, counted: instructions and WAL bytes per message
    (bench/instructions.py's method: a SHORT and a LONG run, the difference over the messages the
    extra transactions moved). The commit regime does not enter: the flush is the kernel's work
    (callgrind counts user space) and the WAL written is the same."""
    from . import instructions
    from .env import queue_entries

    with instructions.throwaway_server() as pg:
        deployed = deploy_env(pg.url, queue_entries(["work"], extra_work_history=True))
        pgmq_url = pgmq_database(pg.url)
        with deployed.conn() as conn:
            for design in lease_designs(QUEUES[0]):
                create_design_table(conn, deployed.schema, QUEUES[0], design)
        counter = instructions.count_from_now_on(pg)
        log("  pgmq counts: the server now runs under callgrind")
        env = instructions.OneConnectionEnv(deployed.url, deployed.schema, deployed.catalog)
        pgmq_conn = psycopg.connect(pgmq_url, autocommit=True)
        try:
            with env.conn() as tq_conn:
                rows = []
                for shape in shapes(env, batches, enqueue_batches):
                    sides = {}
                    for side in shape.sides:
                        ours = side.database == "tablequeue"
                        depth = 0 if side.op == "enqueue" else instructions.DEPTHS[0]
                        sides[side.who] = counted_side(
                            counter, tq_conn if ours else pgmq_conn, env.url if ours else pgmq_url, side.script,
                            side.table, side.op, shape.batch,
                            lambda side=side, depth=depth: _load(env, pgmq_conn, side, depth), dict(side.defines))
                    ref = sides["pgmq"]
                    rows.append({"key": shape.key, "shape": shape.name, "batch": shape.batch, "sides": sides,
                                 "instruction_ratios": {w: s["per_message"] / ref["per_message"] for w, s in sides.items()
                                                        if w != "pgmq" and ref["per_message"] and s["per_message"]},
                                 "wal_ratios": {w: s["wal_per_message"] / ref["wal_per_message"] for w, s in sides.items()
                                                if w != "pgmq" and ref["wal_per_message"] and s["wal_per_message"]}})
                    log(f"  pgmq counts {shape.name}: " + "; ".join(
                        f"{w} {s['per_message'] or 0:,.0f} instructions, {s['wal_per_message'] or 0:.0f} WAL B/msg"
                        for w, s in sides.items()))
                designs = []
                for design in lease_designs(QUEUES[0]):
                    script = design_script(env.schema, design)
                    got = counted_side(counter, tq_conn, env.url, script, env.table(design.table), "dequeue", 1,
                                       lambda design=design: set_depth(env, design.table, instructions.DEPTHS[0]))
                    designs.append({"design": design.name, "script": script, **got})
                    log(f"  lease design {design.name}: {got['per_message'] or 0:,.0f} instructions, "
                        f"{got['wal_per_message'] or 0:.0f} WAL B/msg")
                return {"short": instructions.SHORT, "long": instructions.LONG, "depth": instructions.DEPTHS[0],
                        "shapes": rows, "designs": designs}
        finally:
            counter.close()
            pgmq_conn.close()
            if env.shared is not None:
                env.shared.close()


# Where a cycle's server instructions go (inclusive, per message; groups overlap: WAL records are
# assembled inside the heap and index changes, and everything runs inside the executor).
PROFILE = {
    "parse and analyse": ("pg_parse_query", "pg_analyze_and_rewrite_fixedparams", "pg_analyze_and_rewrite_withcb",
                          "pg_analyze_and_rewrite_varparams"),
    "plan": ("pg_plan_queries",),
    "executor start and end": ("standard_ExecutorStart", "standard_ExecutorEnd"),
    "index scans": ("index_getnext_slot",),
    "index entries written": ("btinsert",),
    "heap insert, update, delete, lock": ("heap_insert", "heap_update", "heap_delete", "heap_lock_tuple",
                                          "heap_multi_insert"),
    "WAL records": ("XLogInsert",),
    # CommitTransaction itself is static: its exported caller.
    "commit": ("CommitTransactionCommand",),
}


def counted_side(counter, conn: psycopg.Connection, url: str, script: str, table: str, op: str, batch: int,
                 load: Callable[[], None], defines: dict[str, str] | None = None) -> dict:  # noqa: ANN001
    """Instructions and WAL bytes per message of `script`, and where the instructions went
    (PROFILE); a batch of b runs SHORT/b and LONG/b transactions, so every shape moves about as
    many messages."""
    from .instructions import LONG, SHORT, marginal

    schema, name = (part.strip('"') for part in table.split("."))
    column = "n_tup_ins" if op == "enqueue" else "n_tup_del"
    runs = []
    for transactions in (max(1, SHORT // batch), max(2, LONG // batch)):
        load()
        moved_before = _stat(conn, schema, name, column)
        wal_before = _wal(conn)[0]
        instructions = counter.pgbench(url, script, transactions, defines)
        wal = _wal(conn)[0] - wal_before
        runs.append({"transactions": transactions, "instructions": instructions, "wal_bytes": wal,
                     "functions": counter.functions(PROFILE),
                     "messages": _stat(conn, schema, name, column) - moved_before})
    out = marginal(runs)
    moved = runs[1]["messages"] - runs[0]["messages"]
    out["profile"] = {group: (runs[1]["functions"][group] - runs[0]["functions"][group]) / moved if moved > 0 else None
                      for group in PROFILE}
    return out


def _stat(conn: psycopg.Connection, schema: str, table: str, column: str) -> int:
    """Rows the table has had inserted or deleted: complete once the run's server processes ended
    (a server process reports its counts as it ends), and no count(*) under callgrind."""
    return conn.execute(f"SELECT {column} FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
                        (schema, table)).fetchone()[0]
