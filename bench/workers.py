"""Producer and consumer processes. Each process has its own connection and talks to the queue only
through the public contract (tablequeue.client.QueueClient); the only raw SQL is the untimed refill
that keeps a queue at a constant depth (a set-based INSERT ... SELECT generate_series).

A cell forks N processes, lets each warm up (prepared statements), releases them together through
a barrier, and lets each run for `seconds` (time-bound) or until the queue is empty (drain).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from array import array
from dataclasses import dataclass
from typing import Any

from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.engines import connect

from .env import LEASE_SECONDS, PAYLOAD, insert_sql

WARMUP_CYCLES = 5


@dataclass(frozen=True)
class Spec:
    url: str
    schema: str
    queue: dict             # catalog entry: name, kind, payload (, options)
    op: str                 # enqueue | dequeue
    batch: int
    seconds: float          # time-bound run; ignored when drain is set
    refill: bool = False    # dequeue: put back (untimed, raw SQL) what each cycle took
    drain: bool = False     # dequeue until the queue is empty (count-bound runs)
    quota: int = 0          # enqueue: stop after this many messages (count-bound runs; 0 = time)
    warmup: bool = True


def _client(spec: Spec, conn: Any) -> QueueClient:
    catalog = parse_catalog({"schema": spec.schema, "queues": [spec.queue]})
    return QueueClient.for_catalog(conn, "postgres", catalog, spec.queue["name"])


def worker(spec: Spec, index: int, barrier: Any, results: Any) -> None:
    try:
        results.put((index, _work(spec, index, barrier)))
    except Exception:  # noqa: BLE001 - reported to the parent, which raises
        results.put((index, {"error": traceback.format_exc()}))
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass


def _work(spec: Spec, index: int, barrier: Any) -> dict:
    kind = spec.queue["kind"]
    is_work = kind == "work"
    worker_name = f"bench-{os.getpid()}"
    # Destructive dequeues run in the caller's transaction (commit ends the cycle); everything else
    # is one statement per call in autocommit.
    autocommit = not (spec.op == "dequeue" and not is_work)
    conn = connect(spec.url, autocommit=autocommit)
    client = _client(spec, conn)
    refill_conn = connect(spec.url, autocommit=True) if spec.refill else None
    refill_sql = insert_sql(refill_conn, spec.schema, spec.queue["name"]) if refill_conn else None
    ids: list[int] = []
    lost_leases = 0
    empty_polls = 0

    def enqueue_cycle() -> int:
        if spec.batch == 1:
            row = client.enqueue(PAYLOAD)
            ids.append(row["id"])
            return 1
        rows = client.enqueue_batch([{"payload": PAYLOAD}] * spec.batch)
        ids.extend(r["id"] for r in rows)
        return len(rows)

    def dequeue_cycle() -> int:
        nonlocal lost_leases
        if is_work:
            rows = client.dequeue(spec.batch, worker=worker_name, lease_seconds=LEASE_SECONDS)
            for row in rows:
                if not client.complete(row["id"], worker_name):
                    lost_leases += 1
        else:
            rows = client.dequeue(spec.batch)
            conn.commit()
        ids.extend(r["id"] for r in rows)
        return len(rows)

    cycle = enqueue_cycle if spec.op == "enqueue" else dequeue_cycle
    refilled = 0
    refill_seconds = 0.0

    def refill(n: int) -> None:
        nonlocal refilled, refill_seconds
        if n and refill_conn is not None:
            r0 = time.perf_counter()
            refill_conn.execute(refill_sql, {"n": n, "payload": PAYLOAD})
            refill_seconds += time.perf_counter() - r0
            refilled += n

    warm = 0
    if spec.warmup:
        for _ in range(WARMUP_CYCLES):
            n = cycle()
            warm += n
            refill(n)
    refill_seconds = 0.0
    barrier.wait(timeout=120)

    latencies = array("d")
    ends = array("d")
    counts = array("I")
    done = 0
    start = time.perf_counter()
    deadline = start + spec.seconds
    while True:
        t0 = time.perf_counter()
        if spec.drain is False and spec.quota == 0 and t0 >= deadline:
            break
        if spec.quota and done >= spec.quota:
            break
        n = cycle()
        t1 = time.perf_counter()
        if n == 0 and spec.op == "dequeue":
            empty_polls += 1
            if spec.drain and empty_polls >= 3:
                break
            time.sleep(0.001)
            continue
        latencies.append(t1 - t0)
        ends.append(t1 - start)
        counts.append(n)
        done += n
        refill(n)
    elapsed = time.perf_counter() - start
    conn.close()
    if refill_conn is not None:
        refill_conn.close()
    return {"messages": done, "warmup_messages": warm, "elapsed": elapsed, "refill_seconds": refill_seconds,
            "refilled": refilled, "latencies": latencies, "ends": ends, "counts": counts, "ids": ids,
            "lost_leases": lost_leases, "empty_polls": empty_polls, "cycles": len(latencies)}


def run_processes(target: Any, args_for: list[tuple], timeout: float) -> list[dict]:
    """Fork one process per args tuple: target(*args, index, barrier, results). Returns results in
    index order; raises if any process failed."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(args_for))
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, i, barrier, results), daemon=True)
             for i, args in enumerate(args_for)]
    for p in procs:
        p.start()
    out: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < len(procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"bench: {len(procs) - len(out)} worker(s) did not report in {timeout:.0f}s")
            index, result = results.get(timeout=remaining)
            out[index] = result
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in out.values() if "error" in r]
    if errors:
        raise RuntimeError("bench worker failed:\n" + errors[0])
    return [out[i] for i in range(len(procs))]


def run_spec(spec: Spec, processes: int) -> list[dict]:
    timeout = (spec.seconds if not spec.drain and not spec.quota else 600) + 180
    return run_processes(worker, [(spec,)] * processes, timeout)
