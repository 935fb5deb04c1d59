"""A peer: PgQueuer (pip pgqueuer==1.6.0) on the same server in the same run.

PgQueuer gets its own database on the server, installed with its own Queries.install(). Both sides
are driven the same simple way from N processes with psycopg 3 (PgQueuer through its async psycopg
driver, tablequeue through QueueClient):
  enqueue:      M messages in total, M/N per process, `batch` per call (PgQueuer: Queries.enqueue
                with lists; tablequeue: enqueue / enqueue_batch)
  dequeue+ack:  the same M messages drained by N processes, `batch` per dequeue (PgQueuer:
                Queries.dequeue, then one Queries.log_jobs(..., 'successful') for the batch;
                tablequeue work kind: dequeue(batch_size, worker, lease_seconds), then complete per
                message, since the contract has no batch complete)
Throughput is M / wall time from the common start (a barrier) to the last process finishing.
"""
from __future__ import annotations

import asyncio
import re
import time
import traceback
import uuid
from array import array
from datetime import timedelta
from typing import Any

import psycopg

from .cells import percentile, queue_entry
from .env import PAYLOAD, Env, count, create_database, set_depth
from .workers import Spec, run_processes, run_spec

ENTRYPOINT = "bench"


def pgq_database(admin_url: str) -> str:
    url = create_database(admin_url, "bench_pgqueuer")
    asyncio.run(_install(url))
    return url


async def _install(url: str) -> None:
    from pgqueuer.queries import Queries

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        await Queries.from_psycopg_connection(conn).install()
    finally:
        await conn.close()


def _pgq_worker(url: str, op: str, batch: int, quota: int, index: int, barrier: Any, results: Any) -> None:
    try:
        results.put((index, asyncio.run(_pgq_work(url, op, batch, quota, barrier))))
    except Exception:  # noqa: BLE001
        results.put((index, {"error": traceback.format_exc()}))
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass


async def _pgq_work(url: str, op: str, batch: int, quota: int, barrier: Any) -> dict:
    from pgqueuer.queries import EntrypointExecutionParameter, Queries

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    queries = Queries.from_psycopg_connection(conn)
    payload = PAYLOAD.encode()
    entrypoints = {ENTRYPOINT: EntrypointExecutionParameter(concurrency_limit=0)}
    manager = uuid.uuid4()
    heartbeat = timedelta(seconds=300)
    latencies = array("d")
    done = 0
    empty = 0
    await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 120)
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        if op == "enqueue":
            if done >= quota:
                break
            n = min(batch, quota - done)
            if n == 1:
                await queries.enqueue(ENTRYPOINT, payload, 0)
            else:
                await queries.enqueue([ENTRYPOINT] * n, [payload] * n, [0] * n)
        else:
            jobs = await queries.dequeue(batch, entrypoints, manager, None, heartbeat)
            n = len(jobs)
            if n == 0:
                empty += 1
                if empty >= 3:
                    break
                await asyncio.sleep(0.001)
                continue
            await queries.log_jobs([(job, "successful", None) for job in jobs])
        latencies.append(time.perf_counter() - t0)
        done += n
    elapsed = time.perf_counter() - start
    await conn.close()
    return {"messages": done, "elapsed": elapsed, "latencies": latencies}


def _pgq_queued(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')").fetchone()[0]


def _summ(results: list[dict], total: int) -> dict:
    lat = [x for r in results for x in r["latencies"]]
    wall = max(r["elapsed"] for r in results)
    done = sum(r["messages"] for r in results)
    return {"messages": done, "seconds": wall, "throughput": done / wall if wall else 0.0,
            "p50_ms": (percentile(lat, 0.5) or 0) * 1000, "p99_ms": (percentile(lat, 0.99) or 0) * 1000,
            "expected": total}


def pgqueuer_pair(url: str, processes: int, batch: int, messages: int) -> dict:
    per = messages // processes
    total = per * processes
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
        conn.execute("VACUUM ANALYZE pgqueuer")
    enq = run_processes(_pgq_worker, [(url, "enqueue", batch, per)] * processes, 900)
    queued = _pgq_queued(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgqueuer")
    deq = run_processes(_pgq_worker, [(url, "dequeue", batch, 0)] * processes, 900)
    left = _pgq_queued(url)
    e, d = _summ(enq, total), _summ(deq, total)
    return {"enqueue": e, "dequeue_ack": d,
            "check": {"enqueued": e["messages"], "queued_after_enqueue": queued, "dequeued": d["messages"],
                      "left": left, "ok": e["messages"] == queued == d["messages"] == total and left == 0}}


def tablequeue_pair(env: Env, name: str, processes: int, batch: int, messages: int) -> dict:
    per = messages // processes
    total = per * processes
    set_depth(env, name, 0)
    entry = queue_entry(env, name)
    enq = run_spec(Spec(env.url, env.schema, entry, "enqueue", batch, 0, quota=per, warmup=False), processes)
    with env.conn() as conn:
        queued = count(conn, env.table(name))
        conn.execute(f"VACUUM ANALYZE {env.table(name)}")
    deq = run_spec(Spec(env.url, env.schema, entry, "dequeue", batch, 0, drain=True, warmup=False), processes)
    with env.conn() as conn:
        left = count(conn, env.table(name))
    ids = [i for r in deq for i in r["ids"]]
    lost = sum(r["lost_leases"] for r in deq)
    e, d = _summ(enq, total), _summ(deq, total)
    return {"enqueue": e, "dequeue_ack": d,
            "check": {"enqueued": e["messages"], "queued_after_enqueue": queued, "dequeued": d["messages"],
                      "distinct": len(set(ids)), "lost_leases": lost, "left": left,
                      "ok": e["messages"] == queued == d["messages"] == len(set(ids)) == total
                      and left == 0 and lost == 0}}


def _mean_pair(pairs: list[dict]) -> dict:
    """Average of repeated pairs: throughputs and latencies averaged, checks all kept."""
    out = {"runs": pairs, "check": {"ok": all(p["check"]["ok"] for p in pairs),
                                    "runs": [p["check"] for p in pairs]}}
    for metric in ("enqueue", "dequeue_ack"):
        out[metric] = {k: sum(p[metric][k] for p in pairs) / len(pairs)
                       for k in ("throughput", "p50_ms", "p99_ms", "seconds", "messages")}
    return out


def run(env: Env, pgq_url: str, queues: list[str], processes: int, batches: tuple[int, ...],
        messages_for: dict[int, int], log: callable, rounds_for: dict | None = None) -> list[dict]:
    out = []
    for batch in batches:
        m = messages_for[batch]
        rounds = (rounds_for or {}).get(batch, 1)
        row: dict[str, Any] = {"processes": processes, "batch": batch, "messages": m, "rounds": rounds}
        pairs: dict[str, list] = {who: [] for who in ["pgqueuer", *queues]}
        for r in range(rounds):
            # Alternate who goes first so neither side always runs on a warmer or a busier machine.
            order = ["pgqueuer", *queues] if (batch + r) % 2 else [*queues, "pgqueuer"]
            for who in order:
                pairs[who].append(pgqueuer_pair(pgq_url, processes, batch, m) if who == "pgqueuer" else
                                  tablequeue_pair(env, who, processes, batch, m))
        for who, ps in pairs.items():
            row[who] = _mean_pair(ps)
        for q in queues:
            row[f"{q}_ratio_enqueue"] = row[q]["enqueue"]["throughput"] / row["pgqueuer"]["enqueue"]["throughput"]
            row[f"{q}_ratio_dequeue_ack"] = (row[q]["dequeue_ack"]["throughput"]
                                             / row["pgqueuer"]["dequeue_ack"]["throughput"])
        log(f"  peer batch {batch}, {processes} processes, {m} messages, {rounds} round(s): PgQueuer enqueue "
            f"{row['pgqueuer']['enqueue']['throughput']:.0f}/s, dequeue+ack "
            f"{row['pgqueuer']['dequeue_ack']['throughput']:.0f}/s; "
            + "; ".join(f"{q} enqueue {row[q]['enqueue']['throughput']:.0f}/s, cycle "
                        f"{row[q]['dequeue_ack']['throughput']:.0f}/s" for q in queues))
        out.append(row)
    return out


# -- the same comparison without the Python clients: both sides' SQL driven by pgbench ----------------
def _pgbench_sql(sql: str, params: dict[int, str]) -> str:
    lines = []
    for line in sql.splitlines():
        line = line.split("--", 1)[0].strip()
        if line:
            lines.append(line)
    flat = " ".join(lines)
    return re.sub(r"\$(\d+)\b", lambda m: params[int(m.group(1))], flat)


def pgqueuer_cycle_script() -> str:
    """PgQueuer's own dequeue and log_jobs statements (from its query builder), batch 1."""
    from pgqueuer.adapters.persistence import qb

    builder = qb.QueryQueueBuilder()
    query = builder.build_dequeue_query(batch_size=1, entrypoints=[ENTRYPOINT], concurrency_limits=[0],
                                        queue_manager_id=uuid.UUID(int=0), global_concurrency_limit=None,
                                        heartbeat_timeout=timedelta(seconds=300))
    dequeue = _pgbench_sql(query.sql, {1: ":batch", 2: "'{" + ENTRYPOINT + "}'",
                                       3: "'00000000-0000-0000-0000-000000000000'::uuid", 4: "'300 seconds'"})
    log = _pgbench_sql(builder.build_log_job_query(), {1: "ARRAY[:p_id]", 2: "'{successful}'", 3: "'{NULL}'"})
    return "\\set batch 1\n" + dequeue.rstrip().rstrip(";") + " \\gset p_\n" + log.rstrip().rstrip(";") + ";\n"


def load_pgqueuer(pgq_url: str, depth: int) -> None:
    """PgQueuer's queue emptied, its log too, then `depth` jobs waiting, vacuumed."""
    with psycopg.connect(pgq_url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
        conn.execute("INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
                     "SELECT 0, %s, %s, 'queued' FROM generate_series(1, %s)", (ENTRYPOINT, PAYLOAD.encode(), depth))
        conn.execute("VACUUM ANALYZE pgqueuer")


def pgbench_cycle(env: Env, pgq_url: str, queues: list[str], clients: int, seconds: float, rounds: int,
                  log: callable) -> dict:
    """Batch-1 dequeue + ack through pgbench: PgQueuer's SQL vs tablequeue's work functions."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from .ceiling import Shape, measure, run_pgbench
    from .work_raw import work_fn_cycle

    workdir = Path(tempfile.mkdtemp(prefix="tq-peer-"))
    os.chmod(workdir, 0o755)
    depth = int(25_000 * seconds)
    script = pgqueuer_cycle_script()
    runs: dict[str, list] = {"pgqueuer": [], **{q: [] for q in queues}}
    try:
        for r in range(rounds):
            order = ["pgqueuer", *queues] if r % 2 == 0 else [*reversed(queues), "pgqueuer"]
            for who in order:
                if who == "pgqueuer":
                    load_pgqueuer(pgq_url, depth)
                    before = _pgq_queued(pgq_url)
                    result = run_pgbench(pgq_url, script, clients, seconds, workdir)
                    done = before - _pgq_queued(pgq_url)
                    runs[who].append({"messages_per_s": done / max(1, round(seconds)), "p50_ms": result["p50_ms"],
                                      "p99_ms": result["p99_ms"], "failed": result["failed"]})
                else:
                    s = work_fn_cycle(env, who)
                    m = measure(env, Shape(who, who, "cycle", 1, s, s), "fn", clients, seconds, depth, workdir)
                    runs[who].append({k: m[k] for k in ("messages_per_s", "p50_ms", "p99_ms", "failed")})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    mean = {who: sum(x["messages_per_s"] for x in rs) / len(rs) for who, rs in runs.items()}
    out = {"clients": clients, "seconds": seconds, "rounds": rounds, "script_pgqueuer": script, "runs": runs,
           "throughput": mean, "ratios": {q: mean[q] / mean["pgqueuer"] for q in queues if mean["pgqueuer"]}}
    log("  peer via pgbench, batch 1: PgQueuer SQL " + f"{mean['pgqueuer']:.0f}/s; "
        + "; ".join(f"{q} {mean[q]:.0f}/s ({out['ratios'][q]:.2f}x)" for q in queues))
    return out
