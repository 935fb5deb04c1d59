"""Concurrency of the destructive kinds on PostgreSQL: several processes, each with its own connection.

- heap, lax FIFO, LIFO: 2 producer and 4 consumer processes move 10,000 messages; consumers roll
  back now and then and record only what they committed. Every message is committed by exactly
  one consumer and none is lost. Then one consumer alone drains a queue filled by both producers
  and must see exact FIFO (LIFO: reverse) order.
- strict FIFO: 4 consumers, a random share of them rolling back, record each hand-out in a table
  inside the dequeue's own transaction; the committed hand-outs, in commit order, are exactly the
  enqueue order.
- dedupe: the same key from two open transactions (one waits for the other), from many
  processes at once, and in overlapping batches taken in opposite orders (no deadlock, for fifo
  and for work's dedupe keys and client ids): one message per key, and every caller but one told
  duplicate=true with the kept id.

Processes are spawned (a fresh interpreter each), so nothing of the parent's connections leaks in.
"""
from __future__ import annotations

import multiprocessing
import queue as queue_module
import random
import threading
import time
import uuid
from typing import Any, Callable

import pytest

from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.engines import connect

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)]

MESSAGES = 10_000
PRODUCERS = 2
CONSUMERS = 4
ROLLBACK_SHARE = 0.05
TIMEOUT_SECONDS = 90
BARRIER_SECONDS = 30
CTX = multiprocessing.get_context("spawn")


def _client(url: str, catalog_doc: dict, queue: str, autocommit: bool = True) -> QueueClient:
    catalog = parse_catalog(catalog_doc)
    conn = connect(url, autocommit=autocommit)
    conn.execute("SET lock_timeout = '30s'")
    if not autocommit:
        conn.commit()
    return QueueClient.for_catalog(conn, "postgres", catalog, queue)


# --- worker processes (module level: spawn imports them by name) ---------------------------------

def _produce(url: str, catalog_doc: dict, queue: str, worker: int, count: int, start: Any) -> None:
    client = _client(url, catalog_doc, queue)
    rng = random.Random(worker)
    start.wait()
    sent = 0
    while sent < count:
        size = min(rng.choice((1, 1, 10, 50, 100)), count - sent)
        items = [{"payload": {"p": worker, "n": sent + i}} for i in range(size)]
        if size == 1:
            client.enqueue(items[0]["payload"])
        else:
            client.enqueue_batch(items)
        sent += size
    client.conn.close()


def _consume(url: str, catalog_doc: dict, queue: str, worker: int, ready: Any, start: Any, producers_done: Any,
             results: Any) -> None:
    client = _client(url, catalog_doc, queue, autocommit=False)
    rng = random.Random(100 + worker)
    committed: list[int] = []
    ready.put(worker)  # connected: the test starts the producers only once every consumer can compete
    start.wait()
    while True:
        done = producers_done.is_set()  # read before the dequeue: whatever was sent is visible to it
        rows = client.dequeue(batch_size=rng.randint(1, 25))
        if rows and rng.random() < ROLLBACK_SHARE:
            client.conn.rollback()
            continue
        client.conn.commit()
        committed.extend(row["id"] for row in rows)
        if not rows:
            if done:
                break
            time.sleep(0.002)
    client.conn.close()
    results.put((worker, committed))


def _drain_alone(url: str, catalog_doc: dict, queue: str, results: Any) -> None:
    client = _client(url, catalog_doc, queue, autocommit=False)
    rng = random.Random(7)
    seen: list[int] = []
    while True:
        rows = client.dequeue(batch_size=rng.randint(1, 40))
        client.conn.commit()
        if not rows:
            break
        seen.extend(row["id"] for row in rows)
    client.conn.close()
    results.put(seen)


def _strict_consume(url: str, catalog_doc: dict, queue: str, handouts: str, worker: int, rollback_share: float,
                    ready: Any, start: Any, producers_done: Any, results: Any) -> None:
    client = _client(url, catalog_doc, queue, autocommit=False)
    rng = random.Random(200 + worker)
    rolled_back = 0
    ready.put(worker)
    start.wait()
    while True:
        done = producers_done.is_set()
        rows = client.dequeue(batch_size=rng.randint(1, 4))
        if rows:
            # Recorded in the dequeue's transaction: a rolled-back hand-out leaves no record, and
            # the identity column numbers the hand-outs in the order they were made.
            client.conn.execute(f"INSERT INTO {handouts} (message_id) SELECT unnest(%s::bigint[])",
                                ([row["id"] for row in rows],))
            if rng.random() < rollback_share:
                time.sleep(rng.random() * 0.003)
                client.conn.rollback()
                rolled_back += 1
                continue
        client.conn.commit()
        if not rows:
            if done:
                break
            time.sleep(0.002)
    client.conn.close()
    results.put((worker, rolled_back))


def _enqueue_key_at_once(url: str, catalog_doc: dict, queue: str, worker: int, keys: list[str], barrier: Any,
                         results: Any) -> None:
    client = _client(url, catalog_doc, queue)
    outcomes = []
    for key in keys:
        barrier.wait(timeout=BARRIER_SECONDS)
        row = client.enqueue({"worker": worker, "key": key}, dedupe_key=key)
        outcomes.append((key, row["id"], bool(row["duplicate"])))
    client.conn.close()
    results.put(outcomes)


def _enqueue_batches(url: str, catalog_doc: dict, queue: str, order: str, rounds: int, size: int, barrier: Any,
                     results: Any, by: str = "dedupe_key") -> None:
    """Batches of the same fresh keys each round, in this worker's order; `by` names the item field
    the key goes into: dedupe_key, or id (a client-supplied id made from the key)."""
    client = _client(url, catalog_doc, queue)
    outcomes = []
    for round_ in range(rounds):
        # Fresh keys every round, so every round races on keys nobody has committed yet.
        keys = [f"r{round_:02d}-k{n:03d}" for n in range(size)]
        keys = {"forward": keys, "backward": keys[::-1], "interleaved": keys[::2] + keys[1::2]}[order]
        barrier.wait(timeout=BARRIER_SECONDS)
        rows = client.enqueue_batch({"payload": {"key": key}, by: _item_key(by, key)} for key in keys)
        outcomes.extend((key, row["id"], bool(row["duplicate"])) for key, row in zip(keys, rows))
    client.conn.close()
    results.put(outcomes)


def _item_key(by: str, key: str) -> Any:
    return uuid.uuid5(uuid.NAMESPACE_URL, key) if by == "id" else key


# --- helpers -------------------------------------------------------------------------------------

class Workers:
    """Worker processes that never outlive the test: daemonic, and killed on the way out whatever
    happened (a worker that died, e.g. a deadlock victim, must not leave the others waiting)."""

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.deadline = time.monotonic() + TIMEOUT_SECONDS

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc: Any) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)

    def start(self, target: Callable[..., None], *args: Any) -> Any:
        process = CTX.Process(target=target, args=args, daemon=True)
        process.start()
        self.processes.append(process)
        return process

    def join(self, processes: list[Any] | None = None) -> None:
        processes = self.processes if processes is None else processes
        for process in processes:
            process.join(timeout=max(0.1, self.deadline - time.monotonic()))
        alive = [p for p in processes if p.is_alive()]
        assert not alive, f"{len(alive)} worker process(es) still running after {TIMEOUT_SECONDS}s"
        failed = [p.exitcode for p in processes if p.exitcode != 0]
        assert not failed, f"worker process(es) failed with exit codes {failed} (see the captured stderr)"

    def collect(self, results: Any, count: int) -> list[Any]:
        collected = []
        for _ in range(count):
            while True:
                try:
                    collected.append(results.get(timeout=0.5))
                    break
                except queue_module.Empty:
                    # A dead worker will never report: fail now, with its exit code.
                    if any(p.exitcode not in (None, 0) for p in self.processes) or time.monotonic() > self.deadline:
                        self.join()
                        raise AssertionError("a worker process reported nothing") from None
        return collected


def _setup(deploy_queues: Callable[..., Any], **queue: Any) -> tuple[Any, dict, str]:
    deployed = deploy_queues({"name": "q", "payload": "json", **queue})
    catalog_doc = {"schema": deployed.catalog.schema, "queues": [{"name": "q", "payload": "json", **queue}]}
    return deployed, catalog_doc, "q"


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["heap", "fifo", "lifo"])
def test_every_message_is_committed_by_exactly_one_consumer_and_none_is_lost(deploy_queues, kind) -> None:
    deployed, doc, name = _setup(deploy_queues, kind=kind)
    url = deployed.url
    ready, start, producers_done, results = CTX.Queue(), CTX.Event(), CTX.Event(), CTX.Queue()
    with Workers() as workers:
        producers = [workers.start(_produce, url, doc, name, w, MESSAGES // PRODUCERS, start)
                     for w in range(PRODUCERS)]
        for w in range(CONSUMERS):
            workers.start(_consume, url, doc, name, w, ready, start, producers_done, results)
        workers.collect(ready, CONSUMERS)
        start.set()
        workers.join(producers)
        producers_done.set()
        committed = [ids for _, ids in workers.collect(results, CONSUMERS)]
        workers.join()

    everything = [message_id for ids in committed for message_id in ids]
    assert len(everything) == MESSAGES, "a message was lost or committed twice"
    assert len(set(everything)) == MESSAGES, "a message was committed by two consumers"
    assert all(ids for ids in committed), "every consumer got work: the consumers really competed"
    observer = deployed.client(name, connect(url))
    assert observer.stats()["ready"] == 0
    observer.conn.close()


@pytest.mark.parametrize("kind", ["fifo", "lifo"])
def test_a_single_consumer_sees_exact_order(deploy_queues, kind) -> None:
    deployed, doc, name = _setup(deploy_queues, kind=kind)
    url = deployed.url
    start, results = CTX.Event(), CTX.Queue()
    with Workers() as workers:
        for w in range(PRODUCERS):
            workers.start(_produce, url, doc, name, w, 2_000, start)
        start.set()
        workers.join()
        workers.start(_drain_alone, url, doc, name, results)
        seen = workers.collect(results, 1)[0]
        workers.join()

    assert len(seen) == 2 * 2_000 and len(set(seen)) == len(seen)
    assert seen == sorted(seen, reverse=kind == "lifo")


def test_strict_fifo_commits_hand_outs_in_exact_enqueue_order_despite_rollbacks(deploy_queues) -> None:
    deployed, doc, name = _setup(deploy_queues, kind="fifo", options={"strict": True})
    url = deployed.url
    schema = deployed.catalog.schema
    handouts = f'"{schema}"."handouts"'
    setup = connect(url)
    setup.execute(f"CREATE TABLE {handouts} (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                  "message_id bigint NOT NULL)")
    producer = deployed.client(name, setup)
    # One producer, committing each message on its own: its enqueue order is the id order.
    sent = [producer.enqueue({"n": n})["id"] for n in range(600)]
    ready, start, producers_done, results = CTX.Queue(), CTX.Event(), CTX.Event(), CTX.Queue()
    shares = [0.0, 0.2, 0.3, 0.5]  # some consumers roll back a lot, one never does
    with Workers() as workers:
        for w in range(4):
            workers.start(_strict_consume, url, doc, name, handouts, w, shares[w], ready, start, producers_done,
                          results)
        # All four connected before any starts: a consumer that started alone could drain the queue
        # before the others (and their rollbacks) began.
        workers.collect(ready, 4)
        start.set()
        sent += [producer.enqueue({"n": n})["id"] for n in range(600, 1_000)]  # while they consume
        producers_done.set()
        rollbacks = sum(count for _, count in workers.collect(results, 4))
        workers.join()

    order = [row[0] for row in setup.execute(f"SELECT message_id FROM {handouts} ORDER BY seq").fetchall()]
    setup.close()
    assert rollbacks > 20, "the consumers rolled back often enough to matter"
    assert order == sent


def test_the_same_key_from_two_open_transactions_gives_one_message(deploy_queues) -> None:
    deployed, _, name = _setup(deploy_queues, kind="fifo", options={"dedupe": True})
    first = deployed.client(name, connect(deployed.url, autocommit=False))
    second = deployed.client(name, connect(deployed.url, autocommit=False))
    kept = first.enqueue({"from": "first"}, dedupe_key="invoice-7")
    assert not kept["duplicate"]

    outcome: dict[str, Any] = {}
    racer = threading.Thread(target=lambda: outcome.update(row=second.enqueue({"from": "second"},
                                                                              dedupe_key="invoice-7")))
    racer.start()
    racer.join(timeout=1.0)
    assert racer.is_alive(), "the second caller must wait for the first one's uncommitted key"
    first.conn.commit()
    racer.join(timeout=30)
    second.conn.commit()

    assert outcome["row"]["duplicate"] and outcome["row"]["id"] == kept["id"]
    observer = deployed.client(name, connect(deployed.url))
    messages = observer.dequeue(batch_size=10)
    assert [(m["id"], m["payload"]) for m in messages] == [(kept["id"], {"from": "first"})]
    for client in (first, second, observer):
        client.conn.close()


def test_a_key_whose_first_enqueue_rolls_back_is_taken_by_the_waiting_caller(deploy_queues) -> None:
    deployed, _, name = _setup(deploy_queues, kind="pending", options={"dedupe": True})
    first = deployed.client(name, connect(deployed.url, autocommit=False))
    second = deployed.client(name, connect(deployed.url, autocommit=False))
    first.enqueue({"from": "first"}, dedupe_key="k")
    outcome: dict[str, Any] = {}
    racer = threading.Thread(target=lambda: outcome.update(row=second.enqueue({"from": "second"}, dedupe_key="k")))
    racer.start()
    racer.join(timeout=1.0)
    assert racer.is_alive()
    first.conn.rollback()
    racer.join(timeout=30)
    second.conn.commit()

    assert not outcome["row"]["duplicate"]
    observer = deployed.client(name, connect(deployed.url))
    assert [(m["id"], m["payload"]) for m in observer.dequeue(batch_size=10)] == [
        (outcome["row"]["id"], {"from": "second"})]
    for client in (first, second, observer):
        client.conn.close()


def test_many_processes_enqueueing_the_same_keys_at_once_keep_one_message_per_key(deploy_queues) -> None:
    deployed, doc, name = _setup(deploy_queues, kind="heap", options={"dedupe": True})
    callers, keys = 6, [f"key-{n}" for n in range(40)]
    barrier, results = CTX.Barrier(callers), CTX.Queue()
    with Workers() as workers:
        for w in range(callers):
            workers.start(_enqueue_key_at_once, deployed.url, doc, name, w, keys, barrier, results)
        outcomes = [row for rows in workers.collect(results, callers) for row in rows]
        workers.join()

    for key in keys:
        calls = [(message_id, duplicate) for k, message_id, duplicate in outcomes if k == key]
        assert len(calls) == callers
        assert sum(1 for _, duplicate in calls if not duplicate) == 1, key
        assert len({message_id for message_id, _ in calls}) == 1, key
    observer = deployed.client(name, connect(deployed.url))
    messages = observer.dequeue(batch_size=1000)
    assert sorted(m["payload"]["key"] for m in messages) == sorted(keys)
    observer.conn.close()


@pytest.mark.parametrize(("kind", "option", "by"), [
    ("fifo", "dedupe", "dedupe_key"),
    ("work", "dedupe", "dedupe_key"),
    ("work", "client_ids", "id"),
], ids=["fifo-keys", "work-keys", "work-client-ids"])
def test_overlapping_dedupe_batches_in_opposite_orders_do_not_deadlock(deploy_queues, kind, option, by) -> None:
    # The work kind inserted its batches in item order until 0.2.0 and deadlocked here.
    deployed, doc, name = _setup(deploy_queues, kind=kind, options={option: True})
    rounds, size = 20, 200
    orders = ("forward", "backward", "interleaved")
    barrier, results = CTX.Barrier(len(orders)), CTX.Queue()
    with Workers() as workers:
        for order in orders:
            workers.start(_enqueue_batches, deployed.url, doc, name, order, rounds, size, barrier, results, by)
        # A deadlock victim (40P01) fails its process, and with it this test.
        outcomes = [row for rows in workers.collect(results, len(orders)) for row in rows]
        workers.join()

    kept: dict[str, set[int]] = {}
    for key, message_id, _ in outcomes:
        kept.setdefault(key, set()).add(message_id)
    assert len(kept) == rounds * size
    assert all(len(message_ids) == 1 for message_ids in kept.values()), "one id per key"
    assert sum(1 for _, _, duplicate in outcomes if not duplicate) == rounds * size
    observer = deployed.client(name, connect(deployed.url))
    assert observer.stats()["ready"] == rounds * size
    observer.conn.close()


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_a_batch_whose_duplicate_is_consumed_while_it_waits_does_not_deadlock_with_the_next(
        deploy_queues, kind) -> None:
    # The reviewer's schedule: T1 = [k2, k5, k7] finds k2 queued (R), inserts k5 and waits on an open
    # batch Z at k7; R is consumed; T2 = [k2, k5] inserts k2 and waits on T1 at k5; Z rolls back. 0.2.0's
    # first version looked k2 up again after the insert, missed R, offered k2 again and waited on T2:
    # a deadlock. T1 now reports k2 as its statement saw it (R's id).
    deployed, doc, name = _setup(deploy_queues, kind=kind, options={"dedupe": True})
    worker = {"worker": "w"} if kind == "work" else {}
    observer, blocker = _client(deployed.url, doc, name), _client(deployed.url, doc, name, autocommit=False)
    first, second = _client(deployed.url, doc, name, autocommit=False), _client(deployed.url, doc, name, autocommit=False)
    r_id = observer.enqueue({"k": 2}, dedupe_key="k2")["id"]
    blocker.enqueue_batch([{"payload": {"k": 7}, "dedupe_key": "k7"}])
    outcomes: dict[str, Any] = {}

    def batch(label: str, client: QueueClient, keys: list[str]) -> None:
        try:
            outcomes[label] = client.enqueue_batch([{"payload": {"k": key}, "dedupe_key": key} for key in keys])
            client.conn.commit()
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcomes[label] = exc

    t1 = threading.Thread(target=batch, args=("t1", first, ["k2", "k5", "k7"]))
    t1.start()
    time.sleep(0.5)
    consumed = observer.dequeue(**worker)
    assert [row["id"] for row in consumed] == [r_id]
    if kind == "work":
        assert observer.complete(r_id, "w")
    t2 = threading.Thread(target=batch, args=("t2", second, ["k2", "k5"]))
    t2.start()
    time.sleep(0.5)
    blocker.conn.rollback()
    t1.join(timeout=30)
    t2.join(timeout=30)
    assert not isinstance(outcomes.get("t1"), Exception), outcomes.get("t1")
    assert not isinstance(outcomes.get("t2"), Exception), outcomes.get("t2")
    t1_rows, t2_rows = outcomes["t1"], outcomes["t2"]
    assert [(row["id"] == r_id, bool(row["duplicate"])) for row in t1_rows] == [(True, True), (False, False), (False, False)]
    assert [bool(row["duplicate"]) for row in t2_rows] == [False, True]
    assert t2_rows[1]["id"] == t1_rows[1]["id"]
    for client in (observer, blocker, first, second):
        client.conn.close()


def _wait_until_blocked(observer: QueueClient, waiter: QueueClient, holder: QueueClient) -> None:
    """Until waiter's statement waits for a lock holder's transaction holds: the step of the schedule
    is then settled (pg_blocking_pids), without guessing how long it takes."""
    deadline = time.monotonic() + 30
    while holder.conn.info.backend_pid not in observer.conn.execute(
            "SELECT pg_blocking_pids(%s)", (waiter.conn.info.backend_pid,)).fetchone()[0]:
        assert time.monotonic() < deadline, "the waiting session never blocked on the holder"
        time.sleep(0.01)


@pytest.mark.parametrize(("kind", "option", "by"), [
    ("fifo", "dedupe", "dedupe_key"),
    ("pending", "dedupe", "dedupe_key"),
    ("work", "dedupe", "dedupe_key"),
    ("work", "client_ids", "id"),
], ids=["fifo-keys", "pending-keys", "work-keys", "work-client-ids"])
def test_a_batch_that_must_offer_a_key_again_never_holds_a_higher_key_while_it_waits(
        deploy_queues, kind, option, by) -> None:
    # The reviewer's schedule (round 2): the racing insert of k2 commits while T waits on it, and is
    # consumed before T looks it up, so T must offer k2 again. T then holds k5, and U, which took k2
    # meanwhile, waits on T for k5: offering k2 while holding k5 was a deadlock (40P01).
    deployed, doc, name = _setup(deploy_queues, kind=kind, options={option: True})
    worker = {"worker": "w"} if kind == "work" else {}
    observer = _client(deployed.url, doc, name)
    s, s2, t, u = (_client(deployed.url, doc, name, autocommit=False) for _ in range(4))
    outcomes: dict[str, Any] = {}

    def items(keys: list[str]) -> list[dict]:
        # Client ids that sort as their keys do (k2 < k5 < k9): the schedule follows the key order.
        return [{"payload": {"key": key}, by: uuid.UUID(int=int(key[1:])) if by == "id" else key} for key in keys]

    def batch(label: str, client: QueueClient, keys: list[str]) -> None:
        try:
            outcomes[label] = client.enqueue_batch(items(keys))
            client.conn.commit()
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcomes[label] = exc

    t_thread = threading.Thread(target=batch, args=("t", t, ["k2", "k5", "k9"]))
    u_thread = threading.Thread(target=batch, args=("u", u, ["k2", "k5"]))
    try:
        s_id = s.enqueue_batch(items(["k2"]))[0]["id"]
        s2.enqueue_batch(items(["k9"]))
        t_thread.start()
        _wait_until_blocked(observer, t, s)
        s.conn.commit()
        _wait_until_blocked(observer, t, s2)  # k2 taken by S, k5 inserted, k9 held by S2
        assert [row["id"] for row in observer.dequeue(**worker)] == [s_id]
        if kind == "work":
            assert observer.complete(s_id, "w")
        u_thread.start()
        _wait_until_blocked(observer, u, t)  # k2 inserted, k5 held by T
        s2.conn.rollback()
        t_thread.join(timeout=60)
        u_thread.join(timeout=60)
    finally:
        # Nothing may outlive a failure: a session left waiting or in a transaction would keep the
        # schema from being dropped.
        for client, thread in ((t, t_thread), (u, u_thread)):
            if thread.is_alive():
                client.conn.cancel_safe()
                thread.join(timeout=30)
        for client in (s, s2, t, u):
            client.conn.close()

    assert not isinstance(outcomes.get("t"), Exception), outcomes.get("t")
    assert not isinstance(outcomes.get("u"), Exception), outcomes.get("u")
    t_rows, u_rows = outcomes["t"], outcomes["u"]
    assert [bool(row["duplicate"]) for row in u_rows] == [False, False]
    # T gave k5 up to let U finish and then found both of U's messages: one message per key.
    assert [(row["id"], bool(row["duplicate"])) for row in t_rows[:2]] == [(row["id"], True) for row in u_rows]
    assert not t_rows[2]["duplicate"]
    observer.conn.close()
    # A new session: the observer's claim position may pass over what was uncommitted when it claimed.
    drain = _client(deployed.url, doc, name)
    queued = drain.dequeue(batch_size=10, **worker)
    drain.conn.close()
    assert sorted((str(row["id"]), row["payload"]["key"]) for row in queued) == sorted(
        [(str(u_rows[0]["id"]), "k2"), (str(u_rows[1]["id"]), "k5"), (str(t_rows[2]["id"]), "k9")])
