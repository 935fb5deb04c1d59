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
import time
import traceback
import uuid
from array import array
from datetime import timedelta
from typing import Any

import psycopg

from .cells import percentile, queue_entry
from .env import PAYLOAD, Env, count, set_depth
from .workers import Spec, run_processes, run_spec

ENTRYPOINT = "bench"


def pgq_database(admin_url: str) -> str:
    name = f"bench_pgqueuer_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = admin_url.rpartition("/")
    url = f"{base}/{name}"
    asyncio.run(_install(url))
    return url


def drop_pgq_database(admin_url: str, url: str) -> None:
    name = url.rpartition("/")[2]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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


def run(env: Env, pgq_url: str, queues: list[str], processes: int, batches: tuple[int, ...],
        messages_for: dict[int, int], log: callable) -> list[dict]:
    out = []
    for batch in batches:
        m = messages_for[batch]
        # Alternate who goes first so neither side always runs on a warmer or a busier machine.
        order = ["pgqueuer", *queues] if batch % 2 else [*queues, "pgqueuer"]
        row: dict[str, Any] = {"processes": processes, "batch": batch, "messages": m}
        for who in order:
            row[who] = pgqueuer_pair(pgq_url, processes, batch, m) if who == "pgqueuer" else \
                tablequeue_pair(env, who, processes, batch, m)
        for q in queues:
            row[f"{q}_ratio_enqueue"] = row[q]["enqueue"]["throughput"] / row["pgqueuer"]["enqueue"]["throughput"]
            row[f"{q}_ratio_dequeue_ack"] = (row[q]["dequeue_ack"]["throughput"]
                                             / row["pgqueuer"]["dequeue_ack"]["throughput"])
        log(f"  peer batch {batch}, {processes} processes, {m} messages: PgQueuer enqueue "
            f"{row['pgqueuer']['enqueue']['throughput']:.0f}/s, dequeue+ack "
            f"{row['pgqueuer']['dequeue_ack']['throughput']:.0f}/s; "
            + "; ".join(f"{q} enqueue {row[q]['enqueue']['throughput']:.0f}/s, cycle "
                        f"{row[q]['dequeue_ack']['throughput']:.0f}/s" for q in queues))
        out.append(row)
    return out
