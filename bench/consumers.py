"""Consumers v2, measured (docs/work-queue.md, Consumers v2): what option notify costs producers; how
soon a waiting consumer has a message committed while it waits, woken by LISTEN or by the wait verb;
and four consumers under a paced producer, each way of waiting against plain polling: delivery
latency, and what four idle consumers cost the server. Notify rounds alternate the two sides so
drift on a shared host hits both alike."""
from __future__ import annotations

import os
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.engines import connect

from .cells import enqueue_cell, percentile
from .env import PAYLOAD, Env, deploy_env
from .workers import run_processes

PLAIN, NOTIFY = "q_consumers_plain", "q_consumers_notify"
# How a paced consumer waits when nothing is ready: seconds between polls, or None to wait in
# dequeue(wait=...) (LISTEN on the notifying queue, the wait verb on the other).
MODES: dict[str, float | None] = {"LISTEN": None, "wait verb": None, "polling 100 ms": 0.1, "polling 1 s": 1.0}
PACED_CONSUMERS = 4
# After the producer's last message, how long the consumers go on: a 1 s poller must get to it.
DRAIN_SECONDS = 2.0


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


def wake_latency(env: Env, pooled: bool, wakes: int, log: Callable[[str], None]) -> dict:
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
        for _ in range(wakes):
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


class CountingClient(QueueClient):
    """Counts the statements it sends (each a round trip): every procedure call and every CALL of
    the wait verb (dequeue(wait=...) issues both)."""
    statements = 0

    def call(self, verb: str, params: Mapping[str, Any], required: tuple[str, ...] = ()) -> list[dict]:
        self.statements += 1
        return super().call(verb, params, required)

    def wait(self, wait_ms: int = 20_000) -> bool:
        self.statements += 1
        return super().wait(wait_ms)


def _backend_cpu_seconds(pid: int) -> float | None:
    """CPU time a server process has run, when the server runs on this machine (embedded)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def paced_process(url: str, schema: str, role: str, queue: str, mode: str, rate: float, seconds: float,
                  index: int, barrier: Any, results: Any) -> None:
    """One process of a paced run (bench.workers.run_processes): the producer or a consumer."""
    try:
        conn = connect(url, autocommit=True)
        catalog = parse_catalog({"schema": schema, "queues": entries()}, f"<bench catalog {schema}>")
        client = CountingClient.for_catalog(conn, "postgres", catalog, queue)
        act = _produce if role == "producer" else _consume
        out = act(client, conn.info.backend_pid, mode, rate, seconds, index, barrier)
        conn.close()
        results.put((index, out))
    except Exception:  # noqa: BLE001 - reported to the parent, which raises
        import traceback

        results.put((index, {"error": traceback.format_exc()}))
        barrier.abort()


def _produce(client: CountingClient, backend: int, mode: str, rate: float, seconds: float,
             index: int, barrier: Any) -> dict:
    """Message k at k / rate seconds after the barrier (at once when behind), one per call; records
    when each enqueue returned, i.e. committed (autocommit)."""
    barrier.wait(timeout=120)
    start, behind = time.monotonic(), 0.0
    sent: dict[Any, float] = {}
    for k in range(int(rate * seconds)):
        delay = start + k / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            behind = max(behind, -delay)
        sent[client.enqueue(PAYLOAD)["id"]] = time.monotonic()
    return {"sent": sent, "seconds": time.monotonic() - start, "max_behind_ms": behind * 1000, "backend_pid": backend}


def _consume(client: CountingClient, backend: int, mode: str, rate: float, seconds: float,
             index: int, barrier: Any) -> dict:
    """For `seconds` after the barrier, one message at a time (dequeue, then complete with its
    lease token), waiting as `mode` says when nothing is ready."""
    worker, poll = f"bench-paced-{index}", MODES[mode]
    if rate:  # a paced run (not the idle one): prepare the dequeue's plan first (the queue is empty)
        client.dequeue(worker=worker)
    barrier.wait(timeout=120)
    start = time.monotonic()
    end, cpu_start, statements_start = start + seconds, _backend_cpu_seconds(backend), client.statements
    received: dict[Any, float] = {}
    while (now := time.monotonic()) < end:
        rows = client.dequeue(worker=worker) if poll else client.dequeue(worker=worker, wait=end - now)
        if rows:
            received[rows[0]["id"]] = time.monotonic()
            client.complete(rows[0]["id"], worker, lease_token=rows[0]["lease_token"])
        elif poll:
            time.sleep(min(poll, max(0.0, end - time.monotonic())))
    cpu_end = _backend_cpu_seconds(backend)
    return {"received": received, "statements": client.statements - statements_start,
            "seconds": time.monotonic() - start, "backend_pid": backend,
            "server_cpu_seconds": None if cpu_start is None or cpu_end is None else cpu_end - cpu_start}


def _server_transactions(url: str, gone: list[int]) -> int:
    """xact_commit of the benchmark's database once the backends `gone` have exited: a backend
    reports its counts when idle at most once a second, and inside a CALL not at all, but always as
    it exits; so the consumers' counts are complete once their backends are gone."""
    with connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while gone and time.monotonic() < deadline and conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (gone,)).fetchone()[0]:
            time.sleep(0.05)
        return conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]


def paced(env: Env, mode: str, rate: float, seconds: float, idle_seconds: float, log: Callable[[str], None]) -> dict:
    """Four consumers waiting as `mode` says while one producer enqueues `rate` messages a second for
    `seconds`: the delay from each enqueue's commit to its dequeue, and that each message reached
    exactly one consumer. Then four consumers, freshly connected, idle for `idle_seconds`: the
    statements they send and the transactions the server commits for them."""
    load_start = os.getloadavg()
    queue = NOTIFY if mode == "LISTEN" else PLAIN
    busy = run_processes(paced_process, [(env.url, env.schema, "producer", queue, mode, rate, seconds)]
                         + [(env.url, env.schema, "consumer", queue, mode, rate, seconds + DRAIN_SECONDS)]
                         * PACED_CONSUMERS, timeout=seconds + 180)
    sent, consumers = busy[0]["sent"], busy[1:]
    received = [(i, t) for c in consumers for i, t in c["received"].items()]
    got = dict(received)
    if len(received) != len(got) or set(got) != set(sent):
        raise RuntimeError(f"consumers bench ({mode}): {len(sent)} sent, {len(received)} received, "
                           f"{len(got)} distinct, {len(set(sent) - set(got))} never received")
    latencies = [(got[i] - t) * 1000 for i, t in sent.items()]

    before = _server_transactions(env.url, [p["backend_pid"] for p in busy])
    idle = run_processes(paced_process, [(env.url, env.schema, "consumer", queue, mode, 0.0, idle_seconds)]
                         * PACED_CONSUMERS, timeout=idle_seconds + 180)
    transactions = _server_transactions(env.url, [c["backend_pid"] for c in idle]) - before
    cpu = [c["server_cpu_seconds"] for c in idle]
    out = {"mode": mode, "queue": queue, "rate": rate, "seconds": seconds, "messages": len(sent),
           "producer_max_behind_ms": busy[0]["max_behind_ms"],
           "p50_ms": percentile(latencies, 0.5), "p95_ms": percentile(latencies, 0.95),
           "p99_ms": percentile(latencies, 0.99), "max_ms": max(latencies),
           "busy_statements_per_s": sum(c["statements"] for c in consumers) / (seconds + DRAIN_SECONDS),
           "idle_seconds": idle_seconds,
           "idle_statements_per_s": sum(c["statements"] for c in idle) / idle_seconds,
           "idle_server_transactions_per_s": transactions / idle_seconds,
           "idle_server_cpu_percent": None if None in cpu else sum(cpu) / idle_seconds * 100,
           "load_start": load_start, "load_end": os.getloadavg()}
    log(f"  {PACED_CONSUMERS} consumers, {mode}, {rate:.0f} msg/s: p50 {out['p50_ms']:.1f} ms, "
        f"p95 {out['p95_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms; idle: {out['idle_statements_per_s']:.1f} "
        f"statements/s sent, {out['idle_server_transactions_per_s']:.1f} transactions/s committed")
    return out


def run(url: str, producers: int, seconds: float, rounds: int, wakes: int, rate: float, paced_seconds: float,
        idle_seconds: float, log: Callable[[str], None]) -> dict:
    env = deploy_env(url, entries())
    try:
        log(f"consumers: notify cost at {producers} producers, {rounds} round(s) of {seconds:.0f} s")
        cost = notify_cost(env, producers, seconds, rounds, log)
        log("consumers: wake latency")
        woken = [wake_latency(env, pooled, wakes, log) for pooled in (False, True)]
        log(f"consumers: {PACED_CONSUMERS} consumers at {rate:.0f} msg/s for {paced_seconds:.0f} s, then idle "
            f"for {idle_seconds:.0f} s, per mode")
        runs = [paced(env, mode, rate, paced_seconds, idle_seconds, log) for mode in MODES]
    finally:
        env.drop()
    return {"notify_cost": cost, "wake_latency": woken,
            "paced": {"consumers": PACED_CONSUMERS, "rate": rate, "seconds": paced_seconds,
                      "drain_seconds": DRAIN_SECONDS, "idle_seconds": idle_seconds, "runs": runs}}
