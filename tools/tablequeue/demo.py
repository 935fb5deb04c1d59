"""`make demo`: deploy the example catalog to a throwaway PostgreSQL and run every queue.

For each queue: producer processes enqueue (with a share of repeated dedupe keys where dedupe is on),
consumer processes drain it through the contract, and the summary checks what came out against what
went in: duplicates rejected, messages delivered twice, messages lost.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from .catalog import Catalog, Queue, load_catalog
from .client import QueueClient
from .deploy import deploy
from .distribution import data_root
from .embedded import postgres_url
from .engines import connect, dialect_for, parse_url
from .render import render_catalog
from .stats import catalog_queues, format_table, read_stats

PRODUCERS, CONSUMERS, BATCH = 2, 2, 50


def _produce(url: str, catalog: Catalog, queue: Queue, producer: int, count: int, out: Any) -> None:
    conn = connect(url, autocommit=True)
    client = QueueClient.for_catalog(conn, "postgres", catalog, queue.name)
    duplicates = 0
    now = datetime.now(timezone.utc)
    for start in range(0, count, BATCH):
        items = []
        for n in range(start, min(start + BATCH, count)):
            item: dict[str, Any] = {"payload": _payload(queue, producer, n)}
            if queue.options.get("dedupe"):
                # Every tenth message repeats the key of the one before: the queue must reject it.
                key_n = n - 1 if n % 10 == 9 else n
                item["dedupe_key"] = f"p{producer}-{key_n}"
            if queue.kind in ("pending", "work"):
                item["due_at"] = now + timedelta(milliseconds=(n % 5) * 100)
            if queue.options.get("client_ids"):
                import uuid

                item["id"] = uuid.uuid4()
                item["enqueued_at"] = now
            items.append(item)
        duplicates += sum(1 for row in client.enqueue_batch(items) if row["duplicate"])
    conn.close()
    out.put(("produced", count, duplicates))


def _payload(queue: Queue, producer: int, n: int) -> Any:
    body = {"producer": producer, "n": n}
    if queue.payload == "json":
        return body
    if queue.payload == "text":
        return f"producer {producer} message {n}"
    return f"{producer}:{n}".encode()


def _consume(url: str, catalog: Catalog, queue: Queue, consumer: int, deadline: float, out: Any) -> None:
    conn = connect(url, autocommit=False)
    client = QueueClient.for_catalog(conn, "postgres", catalog, queue.name)
    worker = f"demo-{os.getpid()}"
    seen: list[Any] = []
    idle_since = last_message = time.monotonic()
    while time.monotonic() < deadline:
        if queue.kind == "work":
            rows = client.dequeue(batch_size=BATCH, worker=worker, lease_seconds=30)
            conn.commit()
            for row in rows:
                if client.complete(row["id"], worker):
                    seen.append(row["id"])
                conn.commit()
        else:
            rows = client.dequeue(batch_size=BATCH)
            conn.commit()
            seen.extend(row["id"] for row in rows)
        if rows:
            idle_since = last_message = time.monotonic()
        elif time.monotonic() - idle_since > 2.0:
            break
        else:
            time.sleep(0.05)
    conn.close()
    out.put(("consumed", seen, last_message))


def _reset(url: str, catalog: Catalog, queue: Queue) -> None:
    conn = connect(url, autocommit=True)
    QueueClient.for_catalog(conn, "postgres", catalog, queue.name).purge()
    conn.close()


def run_queue(url: str, catalog: Catalog, queue: Queue, messages: int) -> dict:
    _reset(url, catalog, queue)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    started = time.monotonic()
    per_producer = messages // PRODUCERS
    processes = [ctx.Process(target=_produce, args=(url, catalog, queue, p, per_producer, out))
                 for p in range(PRODUCERS)]
    deadline = time.monotonic() + 120
    processes += [ctx.Process(target=_consume, args=(url, catalog, queue, c, deadline, out))
                  for c in range(CONSUMERS)]
    for process in processes:
        process.start()
    produced = duplicates = 0
    consumed: Counter = Counter()
    finished = started
    for _ in processes:
        message = out.get(timeout=180)
        if message[0] == "produced":
            produced += message[1]
            duplicates += message[2]
        else:
            consumed.update(message[1])
            finished = max(finished, message[2])
    for process in processes:
        process.join(timeout=30)
    seconds = finished - started  # to the last message handed out, not the consumers' idle wait
    accepted = produced - duplicates
    return {"queue": queue.name, "kind": queue.kind + (" strict" if queue.options.get("strict") else ""),
            "enqueued": accepted, "duplicates": duplicates, "dequeued": len(consumed),
            "twice": sum(1 for c in consumed.values() if c > 1), "lost": accepted - len(consumed),
            "seconds": seconds}


def run_handler(url: str, catalog: Catalog, queue: Queue, messages: int) -> str:
    """The in-database worker of a queue with a handler: deploy the catalog's example handler
    (database/examples/handlers/postgres/<name>.sql), enqueue `messages`, run S.Q_process once."""
    name = queue.options["handler"].split(".")[-1]
    path = data_root() / "database" / "examples" / "handlers" / "postgres" / f"{name}.sql"
    if not path.is_file():
        return f"{queue.name}: process not run: the handler {queue.options['handler']} is yours to write ({path} has no example)"
    conn = connect(url, autocommit=True)
    try:
        conn.execute(path.read_text(encoding="utf-8"))
        client = QueueClient.for_catalog(conn, "postgres", catalog, queue.name)
        client.enqueue_batch({"payload": {"image": f"photo-{n}.jpg"}} for n in range(messages))
        result = client.process(time_budget_seconds=120)
    finally:
        conn.close()
    return (f"{queue.name}: {queue.name}_process ran handler {queue.options['handler']} ({path.name}): "
            f"{result['processed']} processed, {result['completed']} completed, {result['failed']} failed")


def print_summary(rows: list[dict]) -> None:
    header = f"{'queue':<12} {'kind':<12} {'enqueued':>9} {'dupes':>6} {'dequeued':>9} {'twice':>6} {'lost':>5} {'time s':>7} {'msg/s':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        rate = r["dequeued"] / r["seconds"] if r["seconds"] else 0
        print(f"{r['queue']:<12} {r['kind']:<12} {r['enqueued']:>9} {r['duplicates']:>6} {r['dequeued']:>9} "
              f"{r['twice']:>6} {r['lost']:>5} {r['seconds']:>7.1f} {rate:>8.0f}")


def run_demo(catalog_path: str | Path, messages: int, spark: bool) -> int:
    catalog = load_catalog(catalog_path)
    with postgres_url() as url:
        where = "TABLEQUEUE_PG_URL" if os.environ.get("TABLEQUEUE_PG_URL") else "a throwaway PostgreSQL"
        print(f"deploying {catalog_path} to {where} ({parse_url(url).describe()})")
        units = [u for f in render_catalog(catalog, "postgres") for u in f.units]
        conn = connect(url, autocommit=True)
        try:
            result = deploy(conn, dialect_for("postgres"), catalog.schema, units)
        finally:
            conn.close()
        print(f"{len(result.applied)} unit(s) applied; running {PRODUCERS} producers and {CONSUMERS} consumers "
              f"with {messages} messages per queue")
        rows = []
        for queue in catalog.queues:
            rows.append(run_queue(url, catalog, queue, messages))
            print(f"  {queue.name}: done in {rows[-1]['seconds']:.1f}s")
        print()
        print_summary(rows)
        failed = [r for r in rows if r["lost"] or r["twice"]]
        handled = [q for q in catalog.queues if q.options.get("handler")]
        if handled:
            print()
            for queue in handled:
                print(run_handler(url, catalog, queue, min(messages, 500)))
        failed_spark = _spark_demo(url, catalog) if spark else False
        print()
        print(f"tablequeue stats --url ... --catalog {catalog_path}")
        print(show_stats(url, catalog))
        return 1 if failed or failed_spark else 0


def show_stats(url: str, catalog: Catalog) -> str:
    """What `tablequeue stats` prints for the catalog's queues."""
    conn = connect(url, autocommit=True)
    try:
        return format_table(read_stats(conn, "postgres", catalog_queues(conn, "postgres", catalog)))
    finally:
        conn.close()


def _spark_demo(url: str, catalog: Catalog) -> bool:
    try:
        from pipelines.demo import run_spark_demo
    except ImportError as exc:
        print(f"spark demo not run: {exc}")
        return True
    work = next((q for q in catalog.queues if q.kind == "work" and q.options.get("dedupe")), None)
    if work is None:
        print("spark demo not run: the catalog has no work queue with dedupe: true")
        return True
    print()
    print(f"PySpark: enqueue (format('tablequeue') writer) -> drain (its stream reader, ack=sink) -> report "
          f"on queue {work.name}")
    summary = run_spark_demo(url, catalog, work.name, 20000)
    for key, value in summary.items():
        print(f"  {key}: {value}")
    # Every message ends completed or dead (counted in the database: the history and dead-letter
    # tables), and each completed one has exactly one result row.
    unsettled = summary["enqueued"] - summary["completed"] - summary["dead"]
    if unsettled or summary["results"] != summary["completed"] or summary["results_doubled"]:
        print(f"spark demo FAILED: {unsettled} message(s) neither completed nor dead, {summary['results']} result "
              f"row(s) for {summary['completed']} completed message(s), {summary['results_doubled']} doubled")
        return True
    return False
