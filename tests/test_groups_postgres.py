"""Message groups on PostgreSQL under concurrency (docs/queue-kinds.md, "Message groups").

- Many consumers and two producers over 200 groups of 20 messages: each group's messages are handed
  out in enqueue order and never two at once (fifo: within one open transaction; work: leased),
  fifo exactly once with rolled-back dequeues, work completed once or dead with failures and a
  consumer killed with SIGKILL.
- A group whose head is held: the other groups drain, and producers add to it without waiting.
- The three races the design closes, each replayed step by step over several sessions.
- At depth, the claim reads the head index and one group's index range, never a blocked backlog.

"Never two at once" is checked from the clients' own clocks, and only in the direction causality
makes safe: a consumer notes the time after its dequeue returned and the time before it ends the
message (commit, rollback, complete, fail); the next consumer of the group can only be handed a
message after that end, so its start must come later. No assertion depends on speed.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import psycopg
import pytest

from tablequeue.client import QueueClient

pytestmark = pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)

GROUPS = 200
PER_GROUP = 20
CONSUMERS = 8
DEADLINE_SECONDS = 120
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def grouped(kind: str, **options: Any) -> dict[str, Any]:
    return {"name": "q", "kind": kind, "payload": "json", "options": {"groups": True, **options}}


@dataclass
class Ledger:
    """What the consumers saw, in their own clock: every hand-out as (start, end, outcome)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    handouts: dict[str, list[tuple[float, float, int, str]]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)

    def record(self, group: str, start: float, end: float, n: int, outcome: str) -> None:
        with self.lock:
            self.handouts[group].append((start, end, n, outcome))

    def check_one_at_a_time(self) -> None:
        for group, handouts in self.handouts.items():
            ordered = sorted(handouts)
            for before, after in zip(ordered, ordered[1:]):
                assert after[0] > before[1], f"group {group}: {after} handed out before {before} ended"


def produce(deployed: Any, producer: int, batches: bool) -> None:
    """Producer p enqueues the groups g with g % 2 == p, message n of every group before n + 1."""
    conn = deployed.connect()
    client = deployed.client("q", conn)
    mine = [f"g{g:03d}" for g in range(GROUPS) if g % 2 == producer]
    try:
        for n in range(PER_GROUP):
            if batches:
                client.enqueue_batch([{"payload": {"g": g, "n": n}, "group_key": g} for g in mine])
            else:
                for g in mine:
                    client.enqueue({"g": g, "n": n}, group_key=g)
    finally:
        conn.close()


def call(deployed: Any, verb: Callable[[QueueClient], Any]) -> Any:
    conn = deployed.connect()
    try:
        return verb(deployed.client("q", conn))
    finally:
        conn.close()


def stats(deployed: Any) -> dict:
    return call(deployed, lambda client: client.stats())


def run_threads(targets: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_SECONDS)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish in time"


def test_fifo_many_consumers_exactly_once_in_group_order_with_rollbacks(deploy_queues) -> None:
    deployed = deploy_queues(grouped("fifo"))
    ledger = Ledger()
    committed: list[tuple[str, int]] = []
    producers_done = threading.Event()
    total = GROUPS * PER_GROUP

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        conn = deployed.connect(autocommit=False)
        client = deployed.client("q", conn)
        idle_since = None
        try:
            while len(committed) < total and time.monotonic() < deadline:
                rows = client.dequeue(batch_size=rng.randint(1, 5))
                start = time.monotonic()
                if not rows:
                    conn.rollback()
                    if producers_done.is_set():
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > 2:
                            return
                    time.sleep(0.005)
                    continue
                idle_since = None
                back = rng.random() < 0.05
                end = time.monotonic()
                (conn.rollback if back else conn.commit)()
                for row in rows:
                    ledger.record(row["group_key"], start, end, row["payload"]["n"], "rollback" if back else "commit")
                    if not back:
                        with ledger.lock:
                            committed.append((row["group_key"], row["payload"]["n"]))
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            ledger.errors.append(repr(exc))
        finally:
            conn.close()

    deadline = time.monotonic() + DEADLINE_SECONDS

    def producers() -> None:
        run_threads([lambda: produce(deployed, 0, True), lambda: produce(deployed, 1, False)])
        producers_done.set()

    run_threads([producers] + [lambda seed=seed: consume(seed) for seed in range(CONSUMERS)])

    assert not ledger.errors
    assert sorted(committed) == sorted((f"g{g:03d}", n) for g in range(GROUPS) for n in range(PER_GROUP))
    ledger.check_one_at_a_time()
    for group, handouts in ledger.handouts.items():
        assert [n for _, _, n, outcome in sorted(handouts) if outcome == "commit"] == list(range(PER_GROUP)), group
    assert any(outcome == "rollback" for handouts in ledger.handouts.values() for *_, outcome in handouts)


DOOMED = """
import json, sys
from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.engines import connect
url, schema, queue = sys.argv[1:4]
catalog = parse_catalog(json.loads(queue))
conn = connect(url, autocommit=True)
client = QueueClient(conn, "postgres", schema, catalog.queues[0])
rows = client.dequeue(batch_size=5, worker="doomed", lease_seconds=2)
print(json.dumps([[r["group_key"], r["payload"]["n"]] for r in rows]), flush=True)
sys.stdin.read()
"""


def test_work_many_consumers_complete_once_or_dead_in_group_order_with_failures_and_a_killed_consumer(
        deploy_queues) -> None:
    queue = grouped("work", max_attempts=3)
    deployed = deploy_queues(queue)
    ledger = Ledger()
    finished: list[tuple[str, int]] = []
    producers_done = threading.Event()
    total = GROUPS * PER_GROUP
    deadline = time.monotonic() + DEADLINE_SECONDS

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        conn = deployed.connect()
        client = deployed.client("q", conn)
        worker = f"w{seed}"
        idle_since = None
        try:
            while len(finished) < total and time.monotonic() < deadline:
                rows = client.dequeue(batch_size=rng.randint(1, 5), worker=worker, lease_seconds=60)
                start = time.monotonic()
                if not rows:
                    if producers_done.is_set():
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > 4:
                            return
                    time.sleep(0.005)
                    continue
                idle_since = None
                for row in rows:
                    group, n = row["group_key"], row["payload"]["n"]
                    end = time.monotonic()
                    if rng.random() < 0.10:
                        outcome = client.fail(row["id"], worker, "chaos", retry_after_seconds=0,
                                              lease_token=row["lease_token"])
                    else:
                        outcome = "completed" if client.complete(row["id"], worker, row["lease_token"]) else "lost"
                    ledger.record(group, start, end, n, outcome)
                    if outcome in ("completed", "dead"):
                        with ledger.lock:
                            finished.append((group, n))
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            ledger.errors.append(repr(exc))
        finally:
            conn.close()

    def producers() -> None:
        run_threads([lambda: produce(deployed, 0, True), lambda: produce(deployed, 1, False)])
        producers_done.set()

    # The doomed consumer leases a first batch (2 s leases) and is killed holding it: its groups
    # wait for the leases to expire, then go on.
    produce_first = threading.Thread(target=producers)
    produce_first.start()
    while not stats(deployed)["ready"]:
        time.sleep(0.01)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "tools"), REPO])}
    doomed = subprocess.Popen(
        [sys.executable, "-c", DOOMED, deployed.url, deployed.catalog.schema,
         json.dumps({"schema": deployed.catalog.schema, "queues": [queue]})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    held = json.loads(doomed.stdout.readline())
    start = time.monotonic()
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    end = time.monotonic()
    assert held, "the doomed consumer leased nothing"
    for group, n in held:
        ledger.record(group, start, end, n, "killed")

    run_threads([lambda seed=seed: consume(seed) for seed in range(CONSUMERS)])
    produce_first.join(DEADLINE_SECONDS)

    assert not ledger.errors
    assert sorted(finished) == sorted((f"g{g:03d}", n) for g in range(GROUPS) for n in range(PER_GROUP))
    ledger.check_one_at_a_time()
    dead = {(row["payload"]["g"], row["payload"]["n"]) for row in call(deployed, lambda c: c.dead_list(limit=1000))}
    for group, handouts in ledger.handouts.items():
        sequence = [(n, outcome) for _, _, n, outcome in sorted(handouts)]
        # A group moves to its next message only once the one before is completed or dead.
        expected = 0
        for n, outcome in sequence:
            assert n == expected, f"group {group}: {sequence}"
            if outcome in ("completed", "dead"):
                expected += 1
        assert expected == PER_GROUP, f"group {group}: {sequence}"
        assert all((group, n) in dead for n, outcome in sequence if outcome == "dead")
    assert {outcome for handouts in ledger.handouts.values() for *_, outcome in handouts} >= {"completed", "retrying"}
