"""Consumers v2, measured (docs/work-queue.md, Consumers v2): what option notify costs producers, and
how soon a waiting consumer has a message committed while it waits, woken by LISTEN or by the wait
verb. Rounds alternate the two sides so drift on a shared host hits both alike."""
from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any, Callable

from tablequeue.client import QueueClient

from .cells import enqueue_cell, percentile
from .env import Env, deploy_env

PLAIN, NOTIFY = "q_consumers_plain", "q_consumers_notify"
WAKES = 40


def entries() -> list[dict]:
    return [{"name": PLAIN, "kind": "work", "payload": "json"},
            {"name": NOTIFY, "kind": "work", "payload": "json", "options": {"notify": True}}]


def notify_cost(env: Env, producers: int, seconds: float, rounds: int, log: Callable[[str], None]) -> dict:
    rates: dict[str, list[float]] = {PLAIN: [], NOTIFY: []}
    for r in range(rounds):
        for name in ((PLAIN, NOTIFY) if r % 2 == 0 else (NOTIFY, PLAIN)):
            cell = enqueue_cell(env, name, producers, 1, 0, seconds)
            if not cell["check"]["ok"]:
                raise RuntimeError(f"consumers bench: enqueue check failed for {name}: {cell['check']}")
            rates[name].append(cell["throughput"])
            log(f"  notify cost: {name} round {r + 1}: {cell['throughput']:.0f} enqueues/s")
    plain, notify = statistics.median(rates[PLAIN]), statistics.median(rates[NOTIFY])
    return {"producers": producers, "batch": 1, "plain_per_s": plain, "notify_per_s": notify,
            "cost_percent": (plain - notify) / plain * 100 if plain else None, "rounds": rates}


def wake_latency(env: Env, pooled: bool, log: Callable[[str], None]) -> dict:
    """A consumer waits (dequeue(wait=...)) while a producer commits one message at a random moment;
    the latency is from the producer's enqueue returning (committed) to the consumer's dequeue
    returning the message. Negative: the consumer had it before the producer's call returned."""
    consumer_conn, producer_conn = env.conn(), env.conn()
    consumer = QueueClient.for_catalog(consumer_conn, "postgres", env.catalog, NOTIFY, pooled=pooled)
    producer = QueueClient.for_catalog(producer_conn, "postgres", env.catalog, NOTIFY)
    received: dict[Any, float] = {}
    sent: dict[Any, float] = {}
    done = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            while not done.is_set() or len(received) < len(sent):
                for row in consumer.dequeue(worker="bench-wait", wait=2):
                    received[row["id"]] = time.monotonic()
                    consumer.complete(row["id"], "bench-wait", lease_token=row["lease_token"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    chooser = random.Random(7)
    try:
        for _ in range(WAKES):
            time.sleep(chooser.uniform(0.05, 0.25))
            row = producer.enqueue({"wake": True})
            sent[row["id"]] = time.monotonic()
    finally:
        done.set()
        thread.join(30)
        consumer_conn.close()
        producer_conn.close()
    if errors:
        raise errors[0]
    latencies = [(received[i] - t) * 1000 for i, t in sent.items() if i in received]
    if len(latencies) != len(sent):
        raise RuntimeError(f"consumers bench: {len(sent) - len(latencies)} messages never reached the waiting consumer")
    mode = "wait verb" if pooled else "LISTEN"
    out = {"mode": mode, "messages": len(latencies), "p50_ms": percentile(latencies, 0.5),
           "p95_ms": percentile(latencies, 0.95), "max_ms": max(latencies)}
    log(f"  wake latency ({mode}): p50 {out['p50_ms']:.1f} ms, p95 {out['p95_ms']:.1f} ms, max {out['max_ms']:.1f} ms")
    return out


def run(url: str, producers: int, seconds: float, rounds: int, log: Callable[[str], None]) -> dict:
    env = deploy_env(url, entries())
    try:
        log(f"consumers: notify cost at {producers} producers, {rounds} round(s) of {seconds:.0f} s")
        cost = notify_cost(env, producers, seconds, rounds, log)
        log("consumers: wake latency")
        wakes = [wake_latency(env, pooled, log) for pooled in (False, True)]
    finally:
        env.drop()
    return {"notify_cost": cost, "wake_latency": wakes}
