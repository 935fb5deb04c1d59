"""One measurement ("cell"): a queue, an operation, N processes, a batch size, a depth.

Throughput is messages per second of dequeue (or enqueue) time: for each process, messages it
handled divided by its run time minus the time it spent on the untimed refill, summed over the
processes (with no refill this is messages / wall time). Latency is per call: one enqueue or
enqueue_batch call; one dequeue + commit (destructive kinds); one dequeue + a complete per message
(work). Each cell checks that nothing was lost or handed out twice.
"""
from __future__ import annotations

import time
from typing import Any

from .env import Env, count, max_id, set_depth
from .workers import Spec, run_spec


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarise(results: list[dict], bin_seconds: float = 1.0) -> dict:
    lat = [x for r in results for x in r["latencies"]]
    rate = 0.0
    for r in results:
        busy = r["elapsed"] - r["refill_seconds"]
        if busy > 0:
            rate += r["messages"] / busy
    wall = max(r["elapsed"] for r in results)
    timeline: dict[int, int] = {}
    for r in results:
        for end, n in zip(r["ends"], r["counts"]):
            timeline[int(end // bin_seconds)] = timeline.get(int(end // bin_seconds), 0) + n
    return {
        "throughput": rate,
        "wall_throughput": sum(r["messages"] for r in results) / wall if wall > 0 else 0.0,
        "p50_ms": (percentile(lat, 0.50) or 0) * 1000,
        "p99_ms": (percentile(lat, 0.99) or 0) * 1000,
        "calls": len(lat),
        "messages": sum(r["messages"] for r in results),
        "warmup_messages": sum(r["warmup_messages"] for r in results),
        "seconds": wall,
        "refill_share": (sum(r["refill_seconds"] for r in results) / sum(r["elapsed"] for r in results)
                         if results else 0.0),
        # Whole bins only: a last partial second would read as a drop to zero.
        "timeline": [timeline.get(i, 0) / bin_seconds for i in range(max(1, int(wall // bin_seconds)))],
        "empty_polls": sum(r["empty_polls"] for r in results),
    }


def queue_entry(env: Env, name: str) -> dict:
    """The queue's catalog entry (options that differ from their defaults), for the workers."""
    from tablequeue.catalog import COMMON_OPTIONS, KIND_OPTIONS

    q = env.queue(name)
    specs = {**COMMON_OPTIONS, **KIND_OPTIONS[q.kind]}
    options = {k: v for k, v in q.options.items() if k in specs and v != specs[k].default}
    return {"name": q.name, "kind": q.kind, "payload": q.payload, "options": options}


def enqueue_cell(env: Env, name: str, processes: int, batch: int, depth: int, seconds: float,
                 prepare: bool = True) -> dict:
    """Producers enqueue for `seconds` into a queue holding `depth` messages; afterwards the new
    messages are counted (nothing lost) and removed again, so the depth is what it was."""
    if prepare:
        set_depth(env, name, depth)
    before_id = max_id(env, name)
    with env.conn() as conn:
        before = count(conn, env.table(name))
    spec = Spec(env.url, env.schema, queue_entry(env, name), "enqueue", batch, seconds)
    results = run_spec(spec, processes)
    produced = sum(r["messages"] + r["warmup_messages"] for r in results)
    ids = [i for r in results for i in r["ids"]]
    with env.conn() as conn:
        after = count(conn, env.table(name))
        removed = conn.execute(f"DELETE FROM {env.table(name)} WHERE id > %s", (before_id,)).rowcount
    out = summarise(results)
    out.update(check={"produced": produced, "rows_added": after - before, "rows_removed_after": removed,
                      "distinct_ids": len(set(ids)),
                      "ok": produced == after - before == removed == len(set(ids)) == len(ids)})
    return out


def dequeue_cell(env: Env, name: str, processes: int, batch: int, depth: int, seconds: float,
                 prepare: bool = True, refill: bool = True) -> dict:
    """Consumers dequeue for `seconds` from a queue held at `depth` (each cycle's messages are put
    back by an untimed raw insert). Checks: every message handed out once, counts add up."""
    if prepare:
        set_depth(env, name, depth)
    with env.conn() as conn:
        before = count(conn, env.table(name))
    spec = Spec(env.url, env.schema, queue_entry(env, name), "dequeue", batch, seconds, refill=refill)
    results = run_spec(spec, processes)
    with env.conn() as conn:
        after = count(conn, env.table(name))
    taken = sum(r["messages"] + r["warmup_messages"] for r in results)
    refilled = sum(r["refilled"] for r in results)
    ids = [i for r in results for i in r["ids"]]
    out = summarise(results)
    lost = sum(r["lost_leases"] for r in results)
    out.update(check={"before": before, "after": after, "dequeued": taken, "refilled": refilled,
                      "distinct_ids": len(set(ids)), "lost_leases": lost,
                      "ok": before + refilled - taken == after and len(set(ids)) == len(ids) == taken
                      and lost == 0})
    return out


def cell(env: Env, name: str, op: str, processes: int, batch: int, depth: int, seconds: float,
         **kwargs: Any) -> dict:
    started = time.monotonic()
    fn = enqueue_cell if op == "enqueue" else dequeue_cell
    out = fn(env, name, processes, batch, depth, seconds, **kwargs)
    out.update(queue=name, kind=env.queue(name).kind, op=op, processes=processes, batch=batch, depth=depth,
               cell_seconds=time.monotonic() - started)
    return out
