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
from datetime import datetime, timedelta, timezone
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
    total = GROUPS * PER_GROUP

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        conn = deployed.connect(autocommit=False)
        client = deployed.client("q", conn)
        try:
            # Until every message is committed (no idle exit: under load, with a few groups left,
            # eight consumers can each go seconds without winning one), within the deadline.
            while len(committed) < total and time.monotonic() < deadline:
                rows = client.dequeue(batch_size=rng.randint(1, 5))
                start = time.monotonic()
                if not rows:
                    conn.rollback()
                    time.sleep(0.005)
                    continue
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

    run_threads([lambda: produce(deployed, 0, True), lambda: produce(deployed, 1, False)]
                + [lambda seed=seed: consume(seed) for seed in range(CONSUMERS)])

    assert not ledger.errors
    missing = set((f"g{g:03d}", n) for g in range(GROUPS) for n in range(PER_GROUP)) - set(committed)
    assert not missing, (f"{len(missing)} not consumed by the deadline; a fresh dequeue now gets "
                         f"{call(deployed, lambda c: c.dequeue(batch_size=10))} (empty: a stuck head)")
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
    total = GROUPS * PER_GROUP
    deadline = time.monotonic() + DEADLINE_SECONDS

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        conn = deployed.connect()
        client = deployed.client("q", conn)
        worker = f"w{seed}"
        try:
            # Until every message is completed or dead (no idle exit, as in the fifo test).
            while len(finished) < total and time.monotonic() < deadline:
                rows = client.dequeue(batch_size=rng.randint(1, 5), worker=worker, lease_seconds=60)
                start = time.monotonic()
                if not rows:
                    time.sleep(0.005)
                    continue
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


# --- a held group ------------------------------------------------------------------------------------

def no_wait(conn: Any) -> None:
    conn.execute("SET lock_timeout = '500ms'")


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_a_held_group_lets_the_others_drain_and_producers_add_to_it_without_waiting(deploy_queues, kind) -> None:
    deployed = deploy_queues(grouped(kind))
    setup = deployed.connect()
    holder_conn = deployed.connect(autocommit=False)
    producer_conn = deployed.connect()
    try:
        admin = deployed.client("q", setup)
        held = [admin.enqueue({"g": "held", "n": n}, group_key="held")["id"] for n in range(20)]
        others = admin.enqueue_batch([{"payload": {"g": f"o{g}", "n": n}, "group_key": f"o{g}"}
                                      for n in range(5) for g in range(50)])
        holder = deployed.client("q", holder_conn)
        # fifo: the dequeuing transaction stays open; work: the head is leased for an hour, and the
        # complete that ends it waits in an open transaction too (it holds the group's row).
        got = holder.dequeue(worker="holder", lease_seconds=3600) if kind == "work" else holder.dequeue()
        assert [row["id"] for row in got] == [held[0]]
        if kind == "work":
            holder_conn.commit()

        drained: list[int] = []

        def drain(seed: int) -> None:
            conn = deployed.connect()
            no_wait(conn)
            client = deployed.client("q", conn)
            try:
                while True:
                    rows = client.dequeue(batch_size=3, worker=f"d{seed}") if kind == "work" else client.dequeue(batch_size=3)
                    if not rows:
                        return
                    for row in rows:
                        assert row["group_key"] != "held"
                        if kind == "work":
                            assert client.complete(row["id"], f"d{seed}", row["lease_token"])
                        drained.append(row["id"])
            finally:
                conn.close()

        no_wait(producer_conn)
        producer = deployed.client("q", producer_conn)
        added: list[int] = []

        def add() -> None:
            for n in range(20, 30):
                added.append(producer.enqueue({"g": "held", "n": n}, group_key="held")["id"])
            added.extend(row["id"] for row in producer.enqueue_batch(
                [{"payload": {"g": "held", "n": n}, "group_key": "held"} for n in range(30, 35)]))

        run_threads([add] + [lambda seed=seed: drain(seed) for seed in range(4)])
        assert sorted(drained) == sorted(row["id"] for row in others) and len(added) == 15

        if kind == "work":
            assert holder.complete(held[0], "holder", got[0]["lease_token"])   # holds the row until commit
            assert producer.enqueue({"g": "held", "n": 35}, group_key="held")["id"]
        holder_conn.commit()
        rest = []
        while True:
            rows = admin.dequeue(batch_size=10, worker="after") if kind == "work" else admin.dequeue(batch_size=10)
            if not rows:
                break
            assert len(rows) == 1
            rest.append(rows[0]["payload"]["n"])
            if kind == "work":
                assert admin.complete(rows[0]["id"], "after", rows[0]["lease_token"])
        assert rest == list(range(1, 36 if kind == "work" else 35))
    finally:
        for conn in (setup, holder_conn, producer_conn):
            conn.close()


# --- the races the design closes -----------------------------------------------------------------------

def test_a_message_enqueued_while_a_consumer_holds_its_group_is_not_stranded(deploy_queues) -> None:
    """The consumer settles its group without seeing the producer's uncommitted message; the producer,
    which could not take the group, made its message a head candidate itself. Both commit orders."""
    deployed = deploy_queues(grouped("fifo"))
    conns = [deployed.connect(autocommit=False) for _ in range(3)]
    try:
        consumer, producer, other = (deployed.client("q", conn) for conn in conns)
        for producer_first in (True, False):
            first = producer.enqueue({"n": 0}, group_key="g")["id"]
            conns[1].commit()
            assert [row["id"] for row in consumer.dequeue()] == [first]   # holds g, its last message
            late = producer.enqueue({"n": 1}, group_key="g")["id"]        # cannot take g: a candidate
            order = [conns[1], conns[0]] if producer_first else [conns[0], conns[1]]
            for conn in order:
                conn.commit()
            assert [row["id"] for row in other.dequeue(batch_size=10)] == [late]
            conns[2].commit()
    finally:
        for conn in conns:
            conn.close()


def test_stats_past_the_grouped_read_splits_the_unread_messages_as_among_those_read(deploy_queues) -> None:
    # 15,000 grouped messages, none due: stats reads 10,001 of them (all delayed) and gives the rest of
    # the row estimate to delayed too; before the split, all of it went to ready (the senior-PostgreSQL
    # review: a "ready > 0" alert fired on a queue that was only scheduled).
    deployed = deploy_queues(grouped("work"))
    conn = deployed.connect()
    try:
        client = deployed.client("q", conn)
        later = datetime.now(timezone.utc) + timedelta(hours=1)
        for start in range(0, 15_000, 1000):
            client.enqueue_batch([{"payload": {"n": n}, "group_key": f"g{n % 100}", "due_at": later}
                                  for n in range(start, start + 1000)])
        conn.execute(f'ANALYZE "{deployed.catalog.schema}"."q"')
        stats = client.stats()
        assert stats["estimated"] and stats["ready"] == 0 and 14_000 <= stats["delayed"] <= 16_000, stats
    finally:
        conn.close()


def test_purge_never_deletes_the_row_of_a_group_whose_producer_has_not_committed(deploy_queues) -> None:
    """A group looks empty to purge while a producer's message in it is uncommitted: the producer
    holds the group's row (it took it) or pins it (FOR KEY SHARE, when a consumer held it), and purge
    skips such rows. A purge that deleted the row first makes the producer wait for it, then the
    producer puts the row back."""
    deployed = deploy_queues(grouped("fifo"))
    conns = [deployed.connect(autocommit=False) for _ in range(3)]
    admin_conn = deployed.connect()
    try:
        consumer, producer, purger = (deployed.client("q", conn) for conn in conns)
        admin = deployed.client("q", admin_conn)
        no_wait(admin_conn)

        # Taken: the producer holds the row of a group with no message.
        taken = producer.enqueue({"n": 0}, group_key="taken")["id"]
        assert admin.purge() == 0
        conns[1].commit()
        assert [row["id"] for row in admin.dequeue()] == [taken]

        # Pinned: a consumer held the group, committed its last message away; the producer's message
        # is still uncommitted when purge looks.
        admin.enqueue({"n": 0}, group_key="pinned")
        assert consumer.dequeue()
        pinned = producer.enqueue({"n": 1}, group_key="pinned")["id"]
        conns[0].commit()
        assert admin.purge() == 0
        conns[1].commit()
        assert [row["id"] for row in admin.dequeue()] == [pinned]

        # Purge first: it deletes the empty row in its open transaction; the producer waits for it.
        assert purger.purge(max_rows=10) == 0
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(
            deployed.client("q", conns[1]).enqueue({"n": 2}, group_key="pinned")["id"]))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive(), "the producer did not wait for the purge that deleted its group's row"
        conns[2].commit()
        thread.join(10)
        conns[1].commit()
        assert [row["id"] for row in admin.dequeue()] == result
    finally:
        for conn in conns + [admin_conn]:
            conn.close()


def test_a_retrying_head_comes_before_a_lower_id_that_committed_late(deploy_queues) -> None:
    """work: the group's in-flight message is its head while it retries, even when a message with a
    lower id (its producer could not take the group, and committed after) becomes visible meanwhile."""
    deployed = deploy_queues(grouped("work"))
    holder_conn, late_conn, conn = (deployed.connect(autocommit=False), deployed.connect(autocommit=False),
                                    deployed.connect())
    try:
        holder, late_producer, client = (deployed.client("q", c) for c in (holder_conn, late_conn, conn))
        first = client.enqueue({"n": 0}, group_key="g")["id"]
        lease = client.dequeue(worker="w1")[0]["lease_token"]
        assert holder.complete(first, "w1", lease)                       # holds g until it commits
        low = late_producer.enqueue({"n": 1}, group_key="g")["id"]       # cannot take g: a candidate
        holder_conn.commit()
        high = client.enqueue({"n": 2}, group_key="g")["id"]             # takes g, sees no message
        assert low < high
        leased = client.dequeue(worker="w2")
        assert [row["id"] for row in leased] == [high]
        assert client.fail(high, "w2", "boom", retry_after_seconds=0, lease_token=leased[0]["lease_token"]) == "retrying"
        late_conn.commit()                                               # the lower id is visible now

        again = client.dequeue(batch_size=10, worker="w3")
        assert [row["id"] for row in again] == [high]
        assert client.complete(high, "w3", again[0]["lease_token"])
        assert [row["id"] for row in client.dequeue(batch_size=10, worker="w4")] == [low]
    finally:
        for c in (holder_conn, late_conn, conn):
            c.close()


def test_a_workers_dequeue_takes_back_its_own_message_without_waiting_for_a_producer_of_its_group(
        deploy_queues) -> None:
    """work: re-leasing its own messages changes no group, so a restarted worker's dequeue does not
    wait for a producer whose open transaction holds the group of one of them."""
    deployed = deploy_queues(grouped("work"))
    setup, producer_conn, restarted_conn = deployed.connect(), deployed.connect(autocommit=False), deployed.connect()
    try:
        admin = deployed.client("q", setup)
        own = admin.enqueue({"n": 0}, group_key="g")["id"]
        ungrouped = admin.enqueue({"n": 1})["id"]
        assert [row["id"] for row in admin.dequeue(worker="w1", lease_seconds=3600)] == [own]
        deployed.client("q", producer_conn).enqueue({"n": 2}, group_key="g")   # takes g, stays open
        no_wait(restarted_conn)
        again = deployed.client("q", restarted_conn).dequeue(batch_size=2, worker="w1", lease_seconds=3600)
        assert [row["id"] for row in again] == [own, ungrouped]
    finally:
        for conn in (setup, producer_conn, restarted_conn):
            conn.close()


def test_a_worker_whose_own_expired_lease_is_buried_moves_its_group_on_in_the_same_dequeue(
        deploy_queues) -> None:
    """work: the own-first step locks the group of an own message it buries, and settles it."""
    deployed = deploy_queues(grouped("work", max_attempts=1))
    conn = deployed.connect()
    try:
        client = deployed.client("q", conn)
        first, second = (client.enqueue({"n": n}, group_key="g")["id"] for n in range(2))
        assert [row["id"] for row in client.dequeue(worker="w1", lease_seconds=1)] == [first]
        time.sleep(1.2)   # the lease expires: its one attempt is spent

        assert [row["id"] for row in client.dequeue(batch_size=10, worker="w1")] == [second]
        assert [(row["id"], row["last_error"]) for row in client.dead_list()] == [(first, "lease expired")]
    finally:
        conn.close()


def test_a_dead_message_requeued_before_a_head_that_is_not_due_is_handed_out_now(deploy_queues) -> None:
    """work: dead_requeue keeps the message's id, so it may come before its group's head; that head
    (here due tomorrow) must not hold it back. Also when a consumer held the group meanwhile."""
    deployed = deploy_queues(grouped("work", max_attempts=1))
    conn, holder_conn = deployed.connect(), deployed.connect(autocommit=False)
    try:
        client = deployed.client("q", conn)
        for key, hold in (("free", False), ("held", True)):
            dead = client.enqueue({"n": 0}, group_key=key)["id"]
            leased = client.dequeue(worker="w")
            assert client.fail(dead, "w", "boom", retry_after_seconds=0, lease_token=leased[0]["lease_token"]) == "dead"
            client.enqueue({"n": 1}, group_key=key, due_at=datetime.now(timezone.utc) + timedelta(days=1))["id"]
            if hold:   # a consumer (finding nothing due) holds the group while the message comes back
                holder_conn.execute(f'SELECT FROM "{deployed.catalog.schema}"."q_groups" WHERE group_key = %s '
                                    "FOR NO KEY UPDATE", (key,))
            assert client.dead_requeue(dead)
            holder_conn.commit()
            got = client.dequeue(batch_size=10, worker="w2")
            assert [row["id"] for row in got] == [dead], key
            assert client.complete(dead, "w2", got[0]["lease_token"])
            assert client.dequeue(batch_size=10, worker="w2") == []   # the later one is still not due
    finally:
        for c in (conn, holder_conn):
            c.close()


# --- at depth ----------------------------------------------------------------------------------------

BACKLOG = 20_000


def plans_of(conn: Any, call: Callable[[], Any]) -> list[str]:
    """The plans of every statement the call runs inside the functions (auto_explain, with rows)."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    for setting, value in (("auto_explain.log_min_duration", "0"), ("auto_explain.log_analyze", "on"),
                           ("auto_explain.log_timing", "off"), ("auto_explain.log_nested_statements", "on"),
                           ("client_min_messages", "log")):
        conn.execute(f"SET {setting} = {value}")
    try:
        call()
    finally:
        conn.execute("RESET client_min_messages")
        conn.execute("SET auto_explain.log_min_duration = -1")
    return [n for n in notices if "Query Text:" in n]


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_at_depth_the_claim_reads_the_head_index_and_never_a_blocked_backlog(deploy_queues, kind) -> None:
    deployed = deploy_queues(grouped(kind))
    setup, holder_conn, consumer_conn = deployed.connect(), deployed.connect(autocommit=False), deployed.connect()
    try:
        admin = deployed.client("q", setup)
        for start in range(0, BACKLOG, 1000):
            admin.enqueue_batch([{"payload": {"n": n}, "group_key": "blocked"} for n in range(start, start + 1000)])
        admin.enqueue_batch([{"payload": {"n": n}, "group_key": f"g{g}"} for n in range(5) for g in range(100)]
                            + [{"payload": {"n": n}} for n in range(100)])
        setup.execute(f'ANALYZE "{deployed.catalog.schema}"."q"')
        holder = deployed.client("q", holder_conn)
        assert holder.dequeue(worker="holder", lease_seconds=3600) if kind == "work" else holder.dequeue()
        if kind == "work":
            holder_conn.commit()   # leased for an hour: the blocked group's head is in flight

        consumer_conn.execute("LOAD 'auto_explain'")
        consumer = deployed.client("q", consumer_conn)
        plans: list[str] = []
        for _ in range(20):
            got: list[dict] = []
            plans += plans_of(consumer_conn, lambda: got.extend(
                consumer.dequeue(batch_size=3, worker="c") if kind == "work" else consumer.dequeue(batch_size=3)))
            assert got and all(row["group_key"] != "blocked" for row in got)
            if kind == "work":
                for row in got:
                    assert consumer.complete(row["id"], "c", row["lease_token"])

        inner = [p for p in plans if "_dequeue" not in p.split("Query Text:", 1)[1][:120]]
        text = "\n".join(inner)
        assert "Seq Scan" not in text, text
        assert "ix_q_heads" in text and "ix_q_group" in text
        assert ("ix_q_ready" if kind == "work" else "ix_q_ungrouped") in text
        # No node of any statement reads the blocked group's backlog.
        rows = [int(n) for n in __import__("re").findall(r"(?:actual rows|Rows Removed by Filter)[=:] ?(\d+)", text)]
        assert rows and max(rows) < 1000, "\n".join([p for p in inner if "1003" in p][:1])
    finally:
        for conn in (setup, holder_conn, consumer_conn):
            conn.close()


# --- senior review (issue 21): lock waits, purge and the wait probe, session by session -----------------

def waiting_on_a_lock(conn: Any, pid: int) -> bool:
    row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "Lock"


def until_waiting(conn: Any, *pids: int) -> None:
    """Polls (no timing assertion: the thread either blocks on a lock or the test fails later)."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not all(waiting_on_a_lock(conn, pid) for pid in pids):
        assert time.monotonic() < deadline, "the sessions never waited on a lock"
        time.sleep(0.01)


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list]:
    """Runs target in a thread; its outcome (result or exception) lands in the returned list."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(target())
        except Exception as exc:  # noqa: BLE001 - asserted by the caller
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_handlers_that_enqueue_into_each_others_group_and_complete_their_own_deadlock_detected_and_retry(
        deploy_queues) -> None:
    """work, the known crosswise deadlock (docs/queue-kinds.md, "A crosswise deadlock"): handler A
    enqueues a follow-up into group B and completes its own message of group A in one transaction;
    handler B does the same crosswise. Each enqueue holds the other group's row and each complete
    waits for its own group's row: PostgreSQL detects the cycle, one side fails with 40P01 and the
    other commits; the loser's retry succeeds, and both follow-ups are handed out in order."""
    deployed = deploy_queues(grouped("work"))
    setup = deployed.connect()
    conns = [deployed.connect(autocommit=False) for _ in range(2)]
    try:
        admin = deployed.client("q", setup)
        handlers = [deployed.client("q", conn) for conn in conns]
        firsts = [admin.enqueue({"n": 0}, group_key=key)["id"] for key in ("A", "B")]
        workers = ["wa", "wb"]
        leases = []
        for handler, conn, worker in zip(handlers, conns, workers):
            leases.append(handler.dequeue(worker=worker, lease_seconds=3600)[0])
            conn.commit()
        assert [lease["id"] for lease in leases] == firsts
        other = {0: "B", 1: "A"}
        follow_ups = [handlers[i].enqueue({"n": 1}, group_key=other[i])["id"] for i in (0, 1)]
        runs = [in_thread(lambda i=i: handlers[i].complete(firsts[i], workers[i], leases[i]["lease_token"])) for i in (0, 1)]
        for thread, _ in runs:
            thread.join(DEADLINE_SECONDS)
            assert not thread.is_alive(), "neither side was chosen as the deadlock victim"
        outcomes = [outcome[0] for _, outcome in runs]
        losers = [i for i in (0, 1) if getattr(outcomes[i], "sqlstate", None) == "40P01"]
        assert len(losers) == 1, f"expected one 40P01, got {outcomes!r}"
        loser, = losers
        winner = 1 - loser
        assert outcomes[winner] is True
        conns[winner].commit()
        conns[loser].rollback()                        # its follow-up and complete are gone
        retried = handlers[loser].enqueue({"n": 1}, group_key=other[loser])["id"]
        assert handlers[loser].complete(firsts[loser], workers[loser], leases[loser]["lease_token"])
        conns[loser].commit()

        got = admin.dequeue(batch_size=10, worker="next")
        assert [row["id"] for row in got] == [follow_ups[winner], retried]
        assert {row["group_key"] for row in got} == {"A", "B"}
        assert admin.dequeue(batch_size=10, worker="another") == []
    finally:
        for conn in conns + [setup]:
            conn.close()


@pytest.mark.parametrize("verb", ["complete", "fail", "complete_batch", "fail_batch"])
def test_an_acknowledgement_waits_for_its_groups_holder_and_the_group_goes_on(deploy_queues, verb) -> None:
    """work: another transaction holds the group's row (a producer's, here taken by hand) when its
    in-flight message is completed or buried: the acknowledgement waits for the holder (a 500 ms
    lock_timeout fires), and once the holder commits it goes through and the group's next message
    is handed out."""
    deployed = deploy_queues(grouped("work", max_attempts=1))
    conn, holder_conn = deployed.connect(), deployed.connect(autocommit=False)
    try:
        client = deployed.client("q", conn)
        first, second = (client.enqueue({"n": n}, group_key="g")["id"] for n in range(2))
        leased = client.dequeue(worker="w")
        lease = leased[0]["lease_token"]

        def acknowledge() -> None:
            if verb == "complete":
                assert client.complete(first, "w", lease)
            elif verb == "fail":
                assert client.fail(first, "w", "boom", lease_token=lease) == "dead"
            elif verb == "complete_batch":
                assert [row["completed"] for row in client.complete_batch(leased, "w")] == [True]
            else:
                assert [row["outcome"] for row in client.fail_batch(leased, "w", "boom")] == ["dead"]

        holder_conn.execute(f'SELECT FROM "{deployed.catalog.schema}"."q_groups" WHERE group_key = %s '
                            "FOR NO KEY UPDATE", ("g",))
        no_wait(conn)
        with pytest.raises(psycopg.Error) as raised:
            acknowledge()
        assert raised.value.sqlstate == "55P03"                # lock_not_available: it waited
        holder_conn.commit()
        acknowledge()
        assert [row["id"] for row in client.dequeue(batch_size=10, worker="w2")] == [second]
    finally:
        for c in (conn, holder_conn):
            c.close()


def test_batches_creating_the_same_new_groups_in_opposite_orders_do_not_deadlock(deploy_queues) -> None:
    """enqueue_batch inserts a batch's new groups rows in key order. A third session's uncommitted row
    of key m stops both batches there: {a, m, z} and {z, m, a} would each hold their first key and
    then wait for the other's once m is free; in key order the second waits at a, holding nothing."""
    deployed = deploy_queues(grouped("fifo"))
    watch = deployed.connect()
    blocker, first_conn, second_conn = (deployed.connect(autocommit=False) for _ in range(3))
    try:
        blocker.execute(f'INSERT INTO "{deployed.catalog.schema}"."q_groups" (group_key) VALUES (%s)', ("m",))
        first, second = deployed.client("q", first_conn), deployed.client("q", second_conn)
        runs = []
        for client, conn, keys in ((first, first_conn, "amz"), (second, second_conn, "zma")):
            runs.append(in_thread(lambda client=client, keys=keys: client.enqueue_batch(
                [{"payload": {"k": k}, "group_key": k} for k in keys])))
            until_waiting(watch, conn.info.backend_pid)   # the first at m; the second at a, or (unsorted) at m
        blocker.rollback()
        # The first batch now goes on (it holds a, m, z); the second waits for its commit.
        runs[0][0].join(DEADLINE_SECONDS)
        assert len(runs[0][1]) == 1 and not isinstance(runs[0][1][0], Exception), runs[0][1]
        first_conn.commit()
        runs[1][0].join(DEADLINE_SECONDS)
        assert len(runs[1][1]) == 1 and not isinstance(runs[1][1][0], Exception), runs[1][1]
        second_conn.commit()
        got = call(deployed, lambda c: c.dequeue(batch_size=10))
        assert sorted(row["group_key"] for row in got) == ["a", "m", "z"]
    finally:
        for conn in (watch, blocker, first_conn, second_conn):
            conn.close()


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_purge_with_max_rows_steps_over_a_held_group_and_purges_the_others(deploy_queues, kind) -> None:
    deployed = deploy_queues(grouped(kind))
    setup, holder_conn = deployed.connect(), deployed.connect(autocommit=False)
    try:
        admin = deployed.client("q", setup)
        held = [admin.enqueue({"n": n}, group_key="held")["id"] for n in range(6)]
        others = [admin.enqueue({"n": n}, group_key=f"o{n}")["id"] for n in range(4)]
        ungrouped = [admin.enqueue({"n": n})["id"] for n in range(2)]
        holder_conn.execute(f'SELECT FROM "{deployed.catalog.schema}"."q_groups" WHERE group_key = %s '
                            "FOR NO KEY UPDATE", ("held",))
        assert admin.purge(max_rows=3) == 3
        assert admin.purge(max_rows=100) == 3
        assert admin.purge() == 0
        holder_conn.commit()
        left = admin.dequeue(batch_size=10, worker="w") if kind == "work" else admin.dequeue(batch_size=10)
        assert [row["id"] for row in left] == [held[0]]
        assert len(others + ungrouped) == 6
    finally:
        for conn in (setup, holder_conn):
            conn.close()


def test_a_wait_probe_does_not_leave_a_consumer_holding_a_group_without_its_message(deploy_queues) -> None:
    """fifo: the wait step's probe ran (its transaction still open) when a consumer's batch dequeue
    took the probed group: the consumer must not end up holding that group with no message of it
    for its whole transaction, so another consumer gets the group's head."""
    deployed = deploy_queues(grouped("fifo"))
    setup = deployed.connect()
    probe_conn, consumer_conn, other_conn = (deployed.connect(autocommit=False) for _ in range(3))
    try:
        admin = deployed.client("q", setup)
        head = admin.enqueue({"n": 0}, group_key="probed")["id"]
        admin.enqueue({"n": 1}, group_key="probed")
        other = admin.enqueue({"n": 0}, group_key="other")["id"]
        assert probe_conn.execute(f'SELECT "{deployed.catalog.schema}"."q_wait_step"(0, clock_timestamp())'
                                  ).fetchone()[0] is True
        consumer = deployed.client("q", consumer_conn)
        assert [row["id"] for row in consumer.dequeue(batch_size=2)] == [other]   # transaction stays open
        probe_conn.commit()
        assert [row["id"] for row in deployed.client("q", other_conn).dequeue(batch_size=2)] == [head]
    finally:
        for conn in (setup, probe_conn, consumer_conn, other_conn):
            conn.close()


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_wait_finds_a_free_groups_head_behind_150_candidates_of_a_held_group(deploy_queues, kind) -> None:
    """Review 19 S3's twin: SQL Server's wait probed only the first 100 head candidates, so 100
    candidates of held groups hid a free group's head (ready false while dequeue would deliver).
    Here the probe has no such bound: SKIP LOCKED passes over every held group's candidate, and the
    first step says ready. The 150 candidates are producers' enqueues into a group whose row another
    transaction holds (each flags its message, as it cannot take the group)."""
    deployed = deploy_queues(grouped(kind))
    setup, holder_conn, probe_conn = deployed.connect(), deployed.connect(autocommit=False), deployed.connect()
    schema = deployed.catalog.schema
    try:
        admin = deployed.client("q", setup)
        admin.enqueue({"n": -1}, group_key="held")
        holder_conn.execute(f'SELECT FROM "{schema}"."q_groups" WHERE group_key = %s FOR NO KEY UPDATE', ("held",))
        for n in range(150):
            admin.enqueue({"n": n}, group_key="held")
        free = admin.enqueue({"n": 0}, group_key="free")["id"]
        assert setup.execute(f'SELECT count(*) FROM "{schema}"."q" WHERE group_key = %s AND group_head',
                             ("held",)).fetchone()[0] == 151
        assert probe_conn.execute(f'SELECT "{schema}"."q_wait_step"(0, clock_timestamp())').fetchone()[0] is True
        assert deployed.client("q", probe_conn).wait(wait_ms=1000) is True
        got = admin.dequeue(worker="w") if kind == "work" else admin.dequeue()
        assert [row["id"] for row in got] == [free]
    finally:
        holder_conn.rollback()
        for conn in (setup, holder_conn, probe_conn):
            conn.close()
