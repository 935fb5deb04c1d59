"""Chaos run of the work kind: nothing lost, nothing completed twice, whatever the consumers do.

8 consumer processes, each with its own connection, drain 10,000 messages in batches (`make test`;
`make bench` runs it again over 50,000, TABLEQUEUE_CHAOS_MESSAGES). Their handler
fails at random for 10% of attempts (fail, retried at once); two consumers are killed with SIGKILL
while they hold leased messages, and one of them is restarted under the same worker name. Leases
are 2 seconds, so the killed consumers' messages come back quickly.

At the end every message is either in the history exactly once, or in the dead-letter table after
exactly max_attempts attempts; the queue is empty; no complete() returned true twice for a message;
and the killed consumers really were mid-message (they held messages they never finished).
"""
from __future__ import annotations

import multiprocessing
import os
import random
import secrets
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.engines import connect

# make test keeps the run within minutes on a 2-core machine; make bench sets the heavier run.
MESSAGES = int(os.environ.get("TABLEQUEUE_CHAOS_MESSAGES", "10000"))
CONSUMERS = 8
BATCH = 25
FAIL_RATE = 0.10
MAX_ATTEMPTS = 3
LEASE_SECONDS = 2
WORK_SECONDS = 0.001        # the "handler": a little time per message, so kills land mid-batch
RUN_LIMIT_SECONDS = max(900, MESSAGES * 45 // 1000)


def consumer(url: str, schema: str, queue: dict[str, Any], name: str, seed: int, log_path: str,
             holding: Any, stop: Any) -> None:
    """One consumer process: dequeue a batch, handle each message, complete or fail it. Every
    event is appended to its log before and after the call, one line each."""
    catalog = parse_catalog({"schema": schema, "queues": [queue]})
    conn = connect(url, autocommit=True)
    client = QueueClient.for_catalog(conn, "postgres" if url.startswith("postgres") else "mssql",
                                     catalog, queue["name"])
    rng = random.Random(seed)
    with open(log_path, "a", buffering=1, encoding="utf-8") as log:
        log.write(f"S {os.getpid()}\n")
        idle_since = None
        while True:
            messages = client.dequeue(batch_size=BATCH, worker=name)
            if not messages:
                if stop.is_set():
                    break
                idle_since = idle_since or time.monotonic()
                time.sleep(0.1)
                continue
            idle_since = None
            holding.value = len(messages)
            for message in messages:
                log.write(f"D {message['id']} {message['attempts']}\n")
            for message in messages:
                time.sleep(WORK_SECONDS)
                if rng.random() < FAIL_RATE:
                    outcome = client.fail(message["id"], name, f"random failure of attempt {message['attempts']}")
                    log.write(f"F {message['id']} {outcome}\n")
                else:
                    done = client.complete(message["id"], name)
                    log.write(f"C {message['id']} {int(done)}\n")
                holding.value -= 1
    conn.close()


def read_log(path: Path) -> list[list[str]]:
    """Lines of a consumer's log; a killed consumer's last line may be cut short and is dropped."""
    events = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        parts = line.split()
        if len(parts) == 3 and parts[0] in "DFC" or len(parts) == 2 and parts[0] == "S":
            events.append(parts)
    return events


def table_ids(deployed: Any, suffix: str, columns: str) -> list[tuple]:
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    try:
        if deployed.dialect == "postgres":
            return conn.execute(f'SELECT {columns} FROM "{schema}"."chaos{suffix}"').fetchall()
        cursor = conn.cursor()
        cursor.execute(f"SELECT {columns} FROM [{schema}].[chaos{suffix}]")
        return [tuple(row) for row in cursor.fetchall()]
    finally:
        conn.close()


@pytest.mark.slow
def test_chaos_every_message_ends_in_history_once_or_dead_after_max_attempts(deploy_queues, tmp_path) -> None:
    queue = {"name": "chaos", "kind": "work", "payload": "json",
             "options": {"max_attempts": MAX_ATTEMPTS, "lease_seconds": LEASE_SECONDS, "history": True}}
    deployed = deploy_queues(queue)
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    client = deployed.client("chaos", conn)
    sent: list[Any] = []
    for start in range(0, MESSAGES, 1000):
        sent.extend(row["id"] for row in client.enqueue_batch(
            {"payload": {"n": n}} for n in range(start, start + 1000)))
    assert len(set(sent)) == MESSAGES
    stats = client.stats()
    if MESSAGES <= 10_000:   # counted exactly up to 10,000
        assert (stats["ready"], bool(stats["estimated"])) == (MESSAGES, False)
    else:                    # past that, the planner's estimate, never less than what was counted
        assert bool(stats["estimated"]) and stats["ready"] > 10_000

    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    rng = random.Random(secrets.randbits(32))
    workers: dict[str, dict[str, Any]] = {}

    def start(name: str, generation: int) -> None:
        holding = context.Value("i", 0)
        log = tmp_path / f"{name}.{generation}.log"
        process = context.Process(target=consumer, daemon=True, args=(
            deployed.url, schema, queue, name, rng.randrange(1 << 30), str(log), holding, stop))
        process.start()
        workers[f"{name}.{generation}"] = {"name": name, "process": process, "holding": holding, "log": log}

    names = [f"consumer-{i}" for i in range(CONSUMERS)]
    for name in names:
        start(name, 0)
    victims = rng.sample(names, 2)
    # A kill comes at a random time, or at the latest when the backlog falls below a random floor,
    # so that on a fast machine it still lands while there is work to be in the middle of.
    kill_at = sorted(rng.uniform(3, 12) for _ in victims)
    kill_floor = sorted((rng.randrange(MESSAGES * 3 // 20, MESSAGES * 9 // 20) for _ in victims),
                        reverse=True)
    started = time.monotonic()
    killed: list[str] = []
    kill_times: list[float] = []
    ready = MESSAGES

    try:
        while True:
            elapsed = time.monotonic() - started
            assert elapsed < RUN_LIMIT_SECONDS, "the chaos run did not finish"
            if len(killed) < len(victims):
                ready = client.stats()["ready"]
            due = len(killed) < len(victims) and (
                elapsed >= kill_at[len(killed)] or ready <= kill_floor[len(killed)])
            if due:
                victim = workers[f"{victims[len(killed)]}.0"]
                # Mid-message: only while it holds at least two leased messages it has not finished.
                if victim["holding"].value >= 2:
                    os.kill(victim["process"].pid, signal.SIGKILL)
                    victim["process"].join(10)
                    killed.append(victim["name"])
                    kill_times.append(round(elapsed, 1))
                    if len(killed) == 1:
                        start(victim["name"], 1)  # comes back under the same worker name
            if len(killed) == len(victims):
                stats = client.stats()
                if (stats["ready"], stats["delayed"], stats["in_flight"]) == (0, 0, 0):
                    break
            time.sleep(0.2)
    finally:
        stop.set()
        for worker in workers.values():
            worker["process"].join(30)
            if worker["process"].is_alive():
                worker["process"].kill()
    for key, worker in workers.items():
        if worker["name"] not in killed or key.endswith(".1"):
            assert worker["process"].exitcode == 0, f"{key} exited with {worker['process'].exitcode}"

    # The queue is empty and every message is in exactly one of history and dead.
    final = client.stats()
    assert (final["ready"], final["delayed"], final["in_flight"]) == (0, 0, 0)
    history = table_ids(deployed, "_history", "id, attempts")
    dead = table_ids(deployed, "_dead", "id, attempts, last_error")
    history_ids = Counter(row[0] for row in history)
    assert [i for i, n in history_ids.items() if n > 1] == [], "completed twice"
    dead_ids = {row[0] for row in dead}
    assert len(dead_ids) == len(dead)
    assert not (dead_ids & set(history_ids)), "both completed and dead"
    assert set(history_ids) | dead_ids == set(sent), "lost messages"
    assert all(row[1] == MAX_ATTEMPTS for row in dead), "dead before (or after) max_attempts"
    assert all(1 <= row[1] <= MAX_ATTEMPTS for row in history)
    assert dead, "with 10% failures some message should fail max_attempts times"
    assert final["dead"] == len(dead)

    # What the consumers saw: complete() returned true at most once per message, only for messages
    # in the history; an expired lease shows up as a later attempt of the same message.
    events = {key: read_log(worker["log"]) for key, worker in workers.items()}
    completions = Counter(e[1] for log in events.values() for e in log if e[0] == "C" and e[2] == "1")
    assert [i for i, n in completions.items() if n > 1] == []
    assert set(completions) <= {str(i) for i in history_ids}
    lost_leases = sum(1 for log in events.values() for e in log if e[0] == "C" and e[2] == "0")

    # The victims were killed mid-message: each held messages it never finished, and every one of
    # those ended in history or dead all the same (checked above for all ids).
    for name in killed:
        log = events[f"{name}.0"]
        leased = {e[1] for e in log if e[0] == "D"}
        finished = {e[1] for e in log if e[0] in "CF"}
        assert leased - finished, f"{name} was not holding unfinished messages when killed"
    assert any(row[1] > 1 for row in history), "no message was completed on a later attempt"
    print(f"\nchaos: {MESSAGES} messages, {len(history)} completed, {len(dead)} dead, "
          f"{lost_leases} late completes refused, killed {killed} at {kill_times}s, "
          f"{time.monotonic() - started:.0f}s")
    conn.close()
