"""Consumers v2 where PostgreSQL shows it (DESIGN.md §3b): wait holds no snapshot, NOTIFY and
LISTEN, a lost lease under an old snapshot leaves no lock behind, and batch acknowledgements that
never deadlock. What every engine must do is in tests/conformance."""
from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any, Callable

import psycopg
import pytest

from tablequeue.client import QueueClient

pytestmark = pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)


def work(name: str = "q", **options: Any) -> dict[str, Any]:
    return {"name": name, "kind": "work", "payload": "json", "options": options}


@pytest.fixture
def clients(deploy_queues: Callable[..., Any]):
    opened: list[Any] = []

    def _clients(spec: dict[str, Any], count: int = 1, autocommit: bool = True, pooled: bool = False) -> list[QueueClient]:
        deployed = deploy_queues(spec)
        made = []
        for _ in range(count):
            conn = deployed.connect(autocommit=autocommit)
            opened.append(conn)
            made.append(QueueClient.for_catalog(conn, "postgres", deployed.catalog, spec["name"], pooled=pooled))
        return made

    yield _clients
    for conn in opened:
        conn.close()


def test_wait_inside_a_transaction_is_refused(clients) -> None:
    client, = clients(work(), autocommit=False)
    client.conn.execute("SELECT txid_current()")
    with pytest.raises(psycopg.Error) as raised:
        client.conn.execute(f"CALL {client._routine('wait')}(wait_ms => 100, ready => NULL)")
    assert raised.value.sqlstate == "TQ003"
    client.conn.rollback()
    with pytest.raises(ValueError, match="autocommit"):
        client.wait(100)


def test_a_waiting_session_does_not_hold_back_the_xmin_horizon(clients) -> None:
    waiter, other = clients(work(), count=2)
    pid = waiter.conn.info.backend_pid
    thread = threading.Thread(target=waiter.wait, args=(3000,))
    thread.start()
    try:
        time.sleep(0.3)
        committed = other.conn.execute("SELECT txid_current() % 4294967296").fetchone()[0]
        time.sleep(0.3)
        xmin, state = other.conn.execute(
            "SELECT backend_xmin::text::bigint, state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    finally:
        thread.join()
    # Still waiting, and its snapshot is younger than a transaction that committed while it waited.
    assert state == "active" and xmin is not None and xmin > committed


def test_an_enqueue_notifies_the_queues_channel_when_it_commits(clients) -> None:
    listener, producer = clients(work(notify=True), count=2)
    producer.conn.autocommit = False
    listener.conn.execute('LISTEN "%s"' % f"{listener.schema}.q")

    producer.enqueue({"i": 1})
    assert list(listener.conn.notifies(timeout=0.3, stop_after=1)) == []     # not committed yet
    producer.conn.commit()
    heard = list(listener.conn.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in heard] == [f"{listener.schema}.q"]

    producer.enqueue_batch([{"payload": {"i": 2}}, {"payload": {"i": 3}}])
    producer.conn.commit()
    assert len(list(listener.conn.notifies(timeout=5, stop_after=1))) == 1


def test_without_the_option_nothing_is_notified(clients) -> None:
    listener, producer = clients(work(), count=2)
    listener.conn.execute('LISTEN "%s"' % f"{listener.schema}.q")
    producer.enqueue({"i": 1})
    assert list(listener.conn.notifies(timeout=0.5, stop_after=1)) == []


@pytest.mark.parametrize("pooled", [False, True], ids=["listen", "pooled"])
def test_dequeue_with_wait_listens_unless_pooled_and_gets_the_message(clients, pooled) -> None:
    consumer, producer = clients(work(notify=True), count=2, pooled=pooled)
    timer = threading.Timer(0.4, lambda: producer.enqueue({"late": True}))
    timer.start()
    try:
        got = consumer.dequeue(worker="a", wait=15)
    finally:
        timer.join()
    assert [m["payload"] for m in got] == [{"late": True}]
    channels = [r[0] for r in consumer.conn.execute("SELECT pg_listening_channels()").fetchall()]
    assert channels == ([] if pooled else [f"{consumer.schema}.q"])


def test_a_listening_consumer_still_finds_a_retry_that_comes_due(clients) -> None:
    consumer, = clients(work(notify=True))
    sent = consumer.enqueue({"x": 1})["id"]
    leased = consumer.dequeue(worker="a")[0]
    assert consumer.fail(sent, "a", "later", retry_after_seconds=1, lease_token=leased["lease_token"]) == "retrying"
    got = consumer.dequeue(worker="b", wait=10)           # no NOTIFY for a retry: found by the re-check
    assert [m["id"] for m in got] == [sent] and got[0]["attempts"] == 2


def test_a_lease_lost_under_a_repeatable_read_snapshot_leaves_no_row_lock(clients) -> None:
    caller, other = clients(work(), count=2)
    sent = caller.enqueue({"x": 1})["id"]
    other.dequeue(worker="b")                              # b holds it: a's complete finds it lost
    caller.conn.autocommit = False
    caller.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    assert caller.complete(sent, "a") is False
    # a's transaction is still open: b must be able to complete without waiting for it.
    other.conn.execute("SET lock_timeout = '2s'")
    assert other.complete(sent, "b") is True
    caller.conn.rollback()


def test_overlapping_batch_acks_in_shuffled_order_never_deadlock_and_complete_each_once(clients) -> None:
    """Four sessions acknowledge shuffled, overlapping id sets under one worker name (no tokens, the
    0.1.0 check) while a fifth claims and releases other messages of the same table: every message
    is completed by exactly one call, and no session meets a deadlock."""
    sessions = clients(work(history=True, lease_seconds=600), count=6)
    producer, claimer, ackers = sessions[0], sessions[1], sessions[2:]
    total = 1_000     # one dequeue's worth: a worker name asking again gets its own leases back
    producer.enqueue_batch([{"payload": {"n": n}} for n in range(total)])
    leased = [m["id"] for m in producer.dequeue(batch_size=total, worker="shared")]
    producer.enqueue_batch([{"payload": {"churn": n}} for n in range(200)])
    completed: dict[Any, int] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def ack(client: QueueClient, seed: int) -> None:
        chooser = random.Random(seed)
        try:
            for _ in range(40):
                chosen = chooser.sample(leased, 50)
                for row in client.complete_batch([{"id": i} for i in chosen], "shared"):
                    if row["completed"]:
                        with lock:
                            completed[row["id"]] = completed.get(row["id"], 0) + 1
            remaining = [i for i in leased if i not in completed]
            chooser.shuffle(remaining)
            for start in range(0, len(remaining), 1000):
                for row in client.complete_batch([{"id": i} for i in remaining[start:start + 1000]], "shared"):
                    if row["completed"]:
                        with lock:
                            completed[row["id"]] = completed.get(row["id"], 0) + 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def churn() -> None:
        try:
            while not stop.is_set():
                for row in claimer.dequeue(batch_size=10, worker="other"):
                    assert claimer.release(row["id"], "other", row["lease_token"])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=ack, args=(c, i)) for i, c in enumerate(ackers)]
    churner = threading.Thread(target=churn)
    churner.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    churner.join()
    assert errors == []
    assert len(completed) == total and set(completed.values()) == {1}
    history = producer.conn.execute(f'SELECT count(*), count(DISTINCT id) FROM "{producer.schema}"."q_history"').fetchone()
    assert history == (total, total)


@pytest.mark.parametrize("verb", ["complete_batch", "fail_batch"])
def test_batch_acks_run_only_at_read_committed(clients, verb) -> None:
    client, = clients(work())
    sent = client.enqueue({"x": 1})["id"]
    leased = client.dequeue(worker="a")
    client.conn.autocommit = False
    client.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    extra = {"error": "e"} if verb == "fail_batch" else {}
    with pytest.raises(psycopg.Error) as raised:
        getattr(client, verb)(leased, "a", **extra)
    assert raised.value.sqlstate == "TQ008"
    client.conn.rollback()
    client.conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    client.conn.autocommit = True
    assert [row["id"] for row in getattr(client, verb)(leased, "a", **extra)] == [sent]


def test_an_all_duplicate_batch_notifies_nothing(clients) -> None:
    listener, producer = clients(work(notify=True, dedupe=True), count=2)
    producer.enqueue({"i": 1}, dedupe_key="k")
    listener.conn.execute('LISTEN "%s"' % f"{listener.schema}.q")
    rows = producer.enqueue_batch([{"payload": {"i": 2}, "dedupe_key": "k"}])
    assert [r["duplicate"] for r in rows] == [True]
    assert list(listener.conn.notifies(timeout=0.5, stop_after=1)) == []


def test_wait_evaluates_no_operator_a_callers_search_path_could_supply(clients) -> None:
    """wait runs with the caller's rights and search_path (it commits, so it cannot pin its own): an
    operator planted in a schema on that path must not run inside it."""
    client, = clients(work())
    conn = client.conn
    conn.execute("CREATE SCHEMA IF NOT EXISTS planted")
    for signature in ("integer, numeric", "integer, integer", "boolean, boolean", "timestamptz, timestamptz"):
        left, right = (part.strip() for part in signature.split(","))
        name = "planted_" + left.replace(" ", "_") + "_" + right.replace(" ", "_")
        conn.execute(f"CREATE OR REPLACE FUNCTION planted.{name}(a {left}, b {right}) RETURNS boolean "
                     f"LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'planted operator ran'; END $$")
        for operator in ("/", ">=", "=", "<", "+"):
            conn.execute(f"DROP OPERATOR IF EXISTS planted.{operator} ({left}, {right})")
            conn.execute(f"CREATE OPERATOR planted.{operator} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = planted.{name})")
    try:
        conn.execute("SET search_path = pg_catalog, planted")
        assert client.wait(120) is False
        client.enqueue({"x": 1})
        assert client.wait(120) is True
    finally:
        conn.execute("RESET search_path")
        conn.execute("DROP SCHEMA planted CASCADE")


def test_four_consumers_acking_in_batches_complete_20000_messages_exactly_once(clients) -> None:
    sessions = clients(work(history=True), count=5)
    producer, consumers = sessions[0], sessions[1:]
    total = 20_000
    for start in range(0, total, 1000):
        producer.enqueue_batch([{"payload": {"n": n}} for n in range(start, start + 1000)])
    completed: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def consume(client: QueueClient, name: str) -> None:
        try:
            while True:
                leased = client.dequeue(batch_size=100, worker=name)
                if not leased:
                    return
                answer = client.complete_batch(list(reversed(leased)), name)
                assert all(row["completed"] for row in answer), answer
                with lock:
                    completed.extend(row["id"] for row in answer)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(c, f"c{i}")) for i, c in enumerate(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(completed) == total == len(set(completed))
    history = producer.conn.execute(f'SELECT count(*), count(DISTINCT id) FROM "{producer.schema}"."q_history"').fetchone()
    assert history == (total, total) and producer.stats()["ready"] == 0


@pytest.mark.parametrize("holder_ends", ["commit", "rollback"])
def test_extend_of_a_lease_that_ran_out_waits_for_a_complete_in_flight(clients, holder_ends) -> None:
    """A complete of a message holds its row (its transaction still open) past the lease's expiry.
    extend_lease judged the row version it could see, expired, and answered false at once; it now
    waits for that transaction, as SQL Server's UPDATE does, then answers false (completed, or still
    expired), leaving no lock behind: the message can be taken again after a rollback."""
    holder, extender, observer = clients(work(lease_seconds=30), count=3)
    holder.conn.autocommit = False
    holder.enqueue({"n": 1})
    holder.conn.commit()
    [lease] = holder.dequeue(1, worker="w", lease_seconds=1)
    holder.conn.commit()
    assert holder.complete(lease["id"], "w", lease_token=lease["lease_token"])      # open transaction
    time.sleep(1.2)                                                # the lease runs out meanwhile
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.append(
        extender.extend_lease(lease["id"], "w", 30, lease_token=lease["lease_token"])))
    thread.start()
    extender_pid = extender.conn.info.backend_pid
    deadline = time.monotonic() + 10
    waited = False
    while time.monotonic() < deadline and not waited:
        waited = bool(observer.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            (extender_pid,)).fetchone()[0])
        time.sleep(0.05)
    assert waited and not answers, "extend_lease answered without waiting for the complete in flight"
    getattr(holder.conn, holder_ends)()
    thread.join(10)
    assert answers == [False]
    again = observer.dequeue(1, worker="w2")
    assert len(again) == (0 if holder_ends == "commit" else 1)


def test_extend_of_a_lost_lease_does_not_wait_for_the_new_holders_complete(clients) -> None:
    """The wait is for the caller's own lease only: a worker whose lease ran out and was taken by
    another (whose complete runs in a long business transaction) is told false at once."""
    first, second, observer = clients(work(lease_seconds=30), count=3)
    first.enqueue({"n": 1})
    [lost] = first.dequeue(1, worker="w1", lease_seconds=1)
    time.sleep(1.2)
    second.conn.autocommit = False
    [taken] = second.dequeue(1, worker="w2")
    second.conn.commit()
    assert taken["id"] == lost["id"]
    assert second.complete(taken["id"], "w2", lease_token=taken["lease_token"])    # open transaction
    first.conn.execute("SET lock_timeout = '3s'")      # a wait fails the call (55P03) instead of hanging
    try:
        assert not first.extend_lease(lost["id"], "w1", 30, lease_token=lost["lease_token"])
    finally:
        second.conn.rollback()


def test_complete_batch_deletes_in_id_order_where_the_heap_order_differs(clients) -> None:
    """Senior-PostgreSQL review of the one-DELETE complete_batch (MUST): its generic plan chose a
    bitmap heap scan on a table whose ids and rows' places disagree (client ids), deleting in heap
    order; against fail_batch, which locks in id order, that deadlocked. Three leased messages
    x < z < y stored as y, z, x; z held by a heartbeat's open transaction; complete_batch of all three
    waits on z, fail_batch of x and y starts meanwhile: both must finish, no deadlock."""
    admin, holder, completer, failer = clients(work(client_ids=True, lease_seconds=600), count=4)
    x, z, y = (uuid.UUID(f"{digit * 8}-0000-0000-0000-000000000000") for digit in "18f")
    for message_id in (y, z, x):
        admin.enqueue({"n": str(message_id)}, id=message_id)
    leases = {lease["id"]: lease for lease in admin.dequeue(3, worker="w")}
    for _ in range(20):      # enough rows that the generic plan's 10-id estimate reads them by bitmap
        admin.enqueue_batch([{"payload": {"filler": n}, "id": uuid.uuid4()} for n in range(1000)])
    admin.conn.execute(f'ANALYZE "{admin.schema}"."{admin.queue.name}"')
    holder.conn.autocommit = False
    assert holder.extend_lease(z, "w", 600, lease_token=leases[z]["lease_token"])
    results: dict[str, Any] = {}

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            results[name] = call()
        except Exception as exc:  # noqa: BLE001 - asserted below
            results[name] = exc

    completing = threading.Thread(target=run, args=("complete", lambda: completer.complete_batch(
        [leases[i] for i in (x, z, y)], "w")))
    completing.start()
    time.sleep(0.5)
    failing = threading.Thread(target=run, args=("fail", lambda: failer.fail_batch(
        [leases[i] for i in (x, y)], "w", "boom")))
    failing.start()
    time.sleep(0.5)
    holder.conn.commit()
    completing.join(30)
    failing.join(30)
    assert not isinstance(results["complete"], Exception), results["complete"]
    assert not isinstance(results["fail"], Exception), results["fail"]
    assert {row["id"]: row["completed"] for row in results["complete"]} == {x: True, z: True, y: True}
    assert {row["id"]: row["outcome"] for row in results["fail"]} == {x: "lost", y: "lost"}
