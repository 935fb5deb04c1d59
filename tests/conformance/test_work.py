"""Conformance: the work kind (lease-based, at-least-once) through the public contract.

Engine-agnostic: every test runs once per configured engine (PostgreSQL always, SQL Server when
TABLEQUEUE_MSSQL_URL is set) and talks to the queue through tablequeue.client, i.e. the procedures
and functions of DESIGN.md §3 and docs/work-queue.md. The only direct table reads are of the
history table, which no verb lists (an operator reads it), and they are marked as such.

Times: leases of 1-2 seconds and short sleeps; "now" comes from the server (a message's due_at
when enqueued without one), never from the client's clock.
"""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

import pytest

from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.errors import QUEUE_ERRORS

UTC = timezone.utc
LOCK_TIMEOUT_SECONDS = 20
SAMPLES: dict[str, Any] = {
    "json": {"n": 1, "text": "grüße ✓", "list": [1, 2, {"x": None}]},
    "text": "grüße ✓ – text",
    "binary": bytes(range(256)),
}


def work(name: str = "q", payload: str = "json", **options: Any) -> dict[str, Any]:
    return {"name": name, "kind": "work", "payload": payload, "options": options}


CLOCK_QUEUE = parse_catalog({"queues": [work("clock")]}).queue("clock")


# --- engine-neutral helpers (as in test_destructive.py) ------------------------------------------

def error_code(exc: BaseException) -> str | None:
    """psycopg's SQLSTATE, or the SQL Server error number pyodbc puts in the message."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return str(sqlstate)
    text = " ".join(str(arg) for arg in getattr(exc, "args", ())) or str(exc)
    numbers = re.findall(r"\((\d{3,6})\)\s*\(SQL\w+\)", text) or re.findall(r"\((\d{3,6})\)", text)
    return numbers[-1] if numbers else None


def expected_error(dialect: str, key: str) -> str:
    return QUEUE_ERRORS[key].postgres if dialect == "postgres" else str(QUEUE_ERRORS[key].mssql)


@contextmanager
def raises_queue_error(client: QueueClient, key: str) -> Iterator[None]:
    expected = expected_error(client.dialect, key)
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any driver's error class
        assert error_code(exc) == expected, f"expected {key} ({expected}), got {error_code(exc)}: {exc}"
        if not getattr(client.conn, "autocommit", True):
            client.conn.rollback()
    else:
        pytest.fail(f"expected {key} ({expected}); the call succeeded")


def as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def payload_of(client: QueueClient, value: Any) -> Any:
    if client.queue.payload == "json" and isinstance(value, str):
        return json.loads(value)
    if client.queue.payload == "binary" and value is not None:
        return bytes(value)
    return value


def ids(rows: list[dict]) -> list[Any]:
    return [row["id"] for row in rows]


def counts(client: QueueClient) -> tuple[int, int, int, int]:
    stats = client.stats()
    assert not stats["estimated"]
    return stats["ready"], stats["delayed"], stats["in_flight"], stats["dead"]


@dataclass
class Env:
    deployed: Any
    connections: list[Any] = field(default_factory=list)

    @property
    def dialect(self) -> str:
        return self.deployed.dialect

    def client(self, name: str = "q", autocommit: bool = True) -> QueueClient:
        conn = self.deployed.connect(autocommit=autocommit)
        self.connections.append(conn)
        if self.dialect == "postgres":
            conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_SECONDS}s'")
        else:
            conn.execute(f"SET LOCK_TIMEOUT {LOCK_TIMEOUT_SECONDS * 1000}")
        if not autocommit:
            conn.commit()
        return self.deployed.client(name, conn)

    def table_rows(self, table_suffix: str, columns: str, queue: str = "q") -> list[dict]:
        """Direct read of one of the queue's tables (an operator's view; no verb lists history)."""
        schema = self.deployed.catalog.schema
        name = f"{queue}{table_suffix}"
        conn = self.connections[0] if self.connections else self.client(queue).conn
        if self.dialect == "postgres":
            cursor = conn.execute(f'SELECT {columns} FROM "{schema}"."{name}"')
            names = [c.name for c in cursor.description]
        else:
            cursor = conn.cursor()
            cursor.execute(f"SELECT {columns} FROM [{schema}].[{name}]")
            names = [c[0] for c in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def close(self) -> None:
        for conn in self.connections:
            try:
                if not getattr(conn, "autocommit", True):
                    conn.rollback()
                conn.close()
            except Exception:  # noqa: BLE001 - best effort: the schema is emptied before its next use, or dropped
                pass


@pytest.fixture
def deploy(deploy_queues: Callable[..., Any]) -> Iterator[Callable[..., Env]]:
    envs: list[Env] = []

    def _deploy(*queues: dict[str, Any]) -> Env:
        env = Env(deploy_queues(*queues, CLOCK, reuse=True))
        envs.append(env)
        return env

    yield _deploy
    for env in envs:
        env.close()


CLOCK = work("clock")


def server_now(client: QueueClient) -> datetime:
    """The server's UTC clock: a message enqueued without due_at is due at the server's now. Read
    through a queue of its own ("clock", deployed with every test queue), so it takes nothing."""
    clock = QueueClient(client.conn, client.dialect, client.schema, CLOCK_QUEUE)
    probe = clock.enqueue({"probe": True})
    got = clock.dequeue(worker="clock")
    assert ids(got) == [probe["id"]] and clock.complete(probe["id"], "clock")
    return as_utc(got[0]["due_at"])


# --- enqueue, dequeue, complete ------------------------------------------------------------------

@pytest.mark.parametrize("payload", ["json", "text", "binary"])
def test_a_message_is_leased_once_with_its_payload_attempts_and_times(deploy, payload) -> None:
    client = deploy(work(payload=payload)).client()
    sent = client.enqueue(SAMPLES[payload])
    assert sent["duplicate"] in (False, 0)

    got = client.dequeue(worker="a")
    assert ids(got) == [sent["id"]]
    message = got[0]
    assert payload_of(client, message["payload"]) == SAMPLES[payload]
    assert message["attempts"] == 1
    # Enqueued without due_at: due when enqueued.
    assert abs(as_utc(message["due_at"]) - as_utc(message["enqueued_at"])) < timedelta(seconds=1)
    assert client.dequeue(worker="b") == []
    assert client.complete(sent["id"], "a") is True
    assert client.dequeue(worker="b") == []
    assert counts(client) == (0, 0, 0, 0)


def test_dequeue_hands_out_messages_in_visible_order_up_to_batch_size(deploy) -> None:
    client = deploy(work()).client()
    now = server_now(client)
    dues = [now - timedelta(minutes=m) for m in (1, 5, 3, 4, 2)]
    sent = ids([client.enqueue({"i": i}, due_at=due) for i, due in enumerate(dues)])
    expected = [i for _, i in sorted(zip(dues, sent))]

    first = client.dequeue(batch_size=2, worker="a")
    rest = client.dequeue(batch_size=10, worker="b")

    assert ids(first) == expected[:2]
    assert ids(rest) == expected[2:]
    assert client.dequeue(batch_size=10, worker="c") == []


@pytest.mark.parametrize("arguments", [
    {"batch_size": 0, "worker": "w"}, {"batch_size": 1001, "worker": "w"},
    {"worker": None}, {"worker": ""}, {"worker": "w" * 201},
    {"worker": "w", "lease_seconds": 0}, {"worker": "w", "lease_seconds": 604801},
], ids=["batch0", "batch1001", "no-worker", "empty-worker", "long-worker", "lease0", "lease-too-long"])
def test_dequeue_arguments_out_of_range_are_invalid_argument(deploy, arguments) -> None:
    client = deploy(work()).client()
    client.enqueue({"x": 1})
    with raises_queue_error(client, "invalid_argument"):
        client.call("dequeue", arguments, required=("worker",))
    assert counts(client) == (1, 0, 0, 0)


@pytest.mark.parametrize(("items", "expected"), [
    # (key, client id) per item -> (the item each one reports, duplicate)
    ([("k", 1), ("k", 2)], [(1, False), (1, True)]),
    ([("b", 1), ("a", 1)], [(1, False), (1, True)]),
    ([("z", 1), ("a", 1), ("z", 2)], [(1, False), (1, True), (1, True)]),
    ([("a", 1), ("a", 2), ("b", 2)], [(1, False), (1, True), (1, True)]),
], ids=["same-key", "same-id", "key-then-id", "chain"])
def test_enqueue_batch_with_keys_and_client_ids_keeps_the_first_item_of_a_chain(deploy, items, expected) -> None:
    # An item that shares its key or its client id with an earlier one duplicates the first of that
    # chain, whatever order the rows go in (0.2.0 inserts in key order; a random client id once won).
    client = deploy(work(dedupe=True, client_ids=True)).client()
    given = {n: uuid.UUID(int=n) for n in {i for _, i in items}}
    rows = client.enqueue_batch([{"payload": {"item": position}, "dedupe_key": key, "id": given[n]}
                                 for position, (key, n) in enumerate(items, start=1)])
    first_id = given[items[0][1]]
    assert [(row["id"], bool(row["duplicate"])) for row in rows] == [
        (given[items[first - 1][1]], duplicate) for first, duplicate in expected]
    got = client.dequeue(batch_size=10, worker="a")
    assert ids(got) == [first_id] and payload_of(client, got[0]["payload"]) == {"item": 1}


@pytest.mark.parametrize("options", [{}, {"dedupe": True}, {"client_ids": True}], ids=["plain", "dedupe", "client-ids"])
def test_a_batch_of_more_than_1000_items_is_invalid_argument(deploy, options) -> None:
    # Past ~5,000 rows SQL Server escalates to a table lock that READPAST cannot skip; every batch
    # of every verb is capped at 1,000 in both dialects.
    client = deploy(work(**options)).client()
    assert len(client.enqueue_batch([{"payload": {"i": i}} for i in range(1000)])) == 1000
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue_batch([{"payload": {"i": i}} for i in range(1001)])
    assert counts(client)[0] == 1000


def test_a_null_payload_and_json_that_is_not_an_object_are_invalid_payload(deploy) -> None:
    client = deploy(work()).client()
    with raises_queue_error(client, "invalid_payload"):
        client.enqueue(None)
    with raises_queue_error(client, "invalid_payload"):
        client.enqueue("42")
    with raises_queue_error(client, "invalid_payload"):
        client.enqueue_batch([{"payload": {"a": 1}}, {"payload": None}])
    assert counts(client) == (0, 0, 0, 0)


@pytest.mark.parametrize("client_ids", [False, True], ids=["bigint", "client_ids"])
def test_enqueue_refuses_a_scalar_payload_and_a_long_dedupe_key_alone_and_in_a_batch(deploy, client_ids) -> None:
    # PostgreSQL's work table has no CHECK constraint since storage v4 (it evaluated them on every
    # lease): the functions' own checks are what keeps such a message out, on both engines.
    client = deploy(work(dedupe=True, client_ids=client_ids)).client()
    given = (lambda n: {"id": uuid.UUID(int=n)}) if client_ids else (lambda n: {})
    for scalar in ("42", '"text"', "null", "true"):
        with raises_queue_error(client, "invalid_payload"):
            client.enqueue(scalar, **given(1))
        with raises_queue_error(client, "invalid_payload"):
            client.enqueue_batch([{"payload": {"ok": 1}, **given(2)}, {"payload": scalar, **given(3)}])
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue({"too": "long"}, dedupe_key="k" * 201, **given(4))
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue_batch([{"payload": {"i": 1}, "dedupe_key": "a", **given(5)},
                              {"payload": {"i": 2}, "dedupe_key": "k" * 201, **given(6)}])
    assert counts(client) == (0, 0, 0, 0)
    assert not client.enqueue({"ok": 1}, dedupe_key="k" * 200, **given(7))["duplicate"]
    assert counts(client) == (1, 0, 0, 0)


@pytest.mark.parametrize("history", [False, True], ids=["plain", "history"])
def test_complete_by_anyone_but_the_holder_changes_nothing(deploy, history) -> None:
    client = deploy(work(history=history)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a")

    assert client.complete(sent["id"], "b") is False
    assert client.fail(sent["id"], "b", "not mine") == "lost"
    assert client.extend_lease(sent["id"], "b", 60) is False
    assert counts(client) == (0, 0, 1, 0)
    assert client.complete(sent["id"], "a") is True
    assert client.complete(sent["id"], "a") is False  # completed once
    assert counts(client) == (0, 0, 0, 0)


def test_a_null_worker_or_dead_letter_id_is_refused_and_a_null_id_completes_nothing(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a")
    for act in (lambda: client.complete(sent["id"], None), lambda: client.fail(sent["id"], None, "e"),
                lambda: client.extend_lease(sent["id"], None)):
        with raises_queue_error(client, "invalid_argument"):
            act()
    assert client.complete(None, "a") is False   # no message has a NULL id
    assert client.fail(sent["id"], "a", "boom") == "dead"
    for act in (lambda: client.dead_requeue(None), lambda: client.dead_delete(None)):
        with raises_queue_error(client, "invalid_argument"):
            act()
    assert client.dead_delete(sent["id"]) is True


# --- scheduled start -----------------------------------------------------------------------------

@pytest.mark.parametrize("options", [{}, {"priority": True}, {"dedupe": True}], ids=["plain", "priority", "dedupe"])
def test_enqueue_batch_returns_one_row_per_item_with_ids_in_item_order(deploy, options) -> None:
    client = deploy(work(**options)).client()
    items = [{"payload": {"i": i}} for i in range(1, 6)]

    rows = client.enqueue_batch(items)

    assert [row["ordinal"] for row in rows] == [1, 2, 3, 4, 5]
    assert not any(row["duplicate"] for row in rows)
    assert ids(rows) == sorted(ids(rows)) and len(set(ids(rows))) == 5
    got = client.dequeue(batch_size=10, worker="a")
    assert ids(got) == ids(rows)  # same visible time: ties are broken by id, i.e. item order
    assert [payload_of(client, m["payload"]) for m in got] == [{"i": row["ordinal"]} for row in rows]


def test_nothing_is_handed_out_before_its_due_at(deploy) -> None:
    client = deploy(work()).client()
    now = server_now(client)
    due = now + timedelta(seconds=5)
    later = client.enqueue({"when": "later"}, due_at=due)
    batch = client.enqueue_batch([{"payload": {"when": "batch"}, "due_at": due},
                                  {"payload": {"when": "now"}}])

    got = client.dequeue(batch_size=10, worker="a")
    assert ids(got) == [batch[1]["id"]]
    assert client.complete(batch[1]["id"], "a")
    assert counts(client) == (0, 2, 0, 0)
    stats = client.stats()
    assert stats["oldest_ready_age_seconds"] is None

    while True:
        got = client.dequeue(batch_size=10, worker="a")
        if server_now(client) < due:   # read after the dequeue: it ran before due_at
            assert got == []
        elif got:
            break
        time.sleep(0.2)
    assert sorted(ids(got), key=str) == sorted([later["id"], batch[0]["id"]], key=str)
    for message in got:
        assert abs(as_utc(message["due_at"]) - due) < timedelta(milliseconds=1)
    assert counts(client) == (0, 0, 2, 0)


# --- leases --------------------------------------------------------------------------------------

def test_an_expired_lease_makes_the_message_visible_again_as_a_new_attempt(deploy) -> None:
    client = deploy(work()).client()
    sent = client.enqueue({"x": 1})
    assert client.dequeue(worker="a", lease_seconds=3)[0]["attempts"] == 1
    assert counts(client) == (0, 0, 1, 0)

    time.sleep(3.2)
    assert counts(client) == (1, 0, 0, 0)
    assert client.stats()["oldest_ready_age_seconds"] > 0
    again = client.dequeue(worker="b", lease_seconds=30)
    assert ids(again) == [sent["id"]] and again[0]["attempts"] == 2
    assert counts(client) == (0, 0, 1, 0)


@pytest.mark.parametrize("history", [False, True], ids=["plain", "history"])
def test_a_stale_complete_after_the_lease_moved_on_returns_false_and_keeps_the_message(deploy, history) -> None:
    client = deploy(work(history=history)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a", lease_seconds=1)
    time.sleep(1.2)
    assert ids(client.dequeue(worker="b", lease_seconds=30)) == [sent["id"]]

    # a comes back late: nothing it does counts.
    assert client.complete(sent["id"], "a") is False
    assert client.fail(sent["id"], "a", "late") == "lost"
    assert client.extend_lease(sent["id"], "a", 60) is False
    assert counts(client) == (0, 0, 1, 0)
    assert client.complete(sent["id"], "b") is True
    assert counts(client) == (0, 0, 0, 0)


@pytest.mark.parametrize("history", [False, True], ids=["plain", "history"])
def test_an_expired_lease_cannot_be_completed_even_before_anyone_else_took_it(deploy, history) -> None:
    client = deploy(work(history=history)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a", lease_seconds=1)
    time.sleep(1.2)
    assert client.complete(sent["id"], "a") is False
    assert client.extend_lease(sent["id"], "a", 30) is False
    assert counts(client) == (1, 0, 0, 0)


def test_extend_lease_keeps_the_message_from_other_workers(deploy) -> None:
    client = deploy(work()).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a", lease_seconds=3)
    assert client.extend_lease(sent["id"], "a", 10) is True
    time.sleep(3.3)
    assert client.dequeue(worker="b") == []
    assert counts(client) == (0, 0, 1, 0)
    assert client.complete(sent["id"], "a") is True


@pytest.mark.parametrize("holder_ends", ["commit", "rollback"])
def test_extend_of_a_lease_that_ran_out_waits_for_its_complete_in_flight(deploy, holder_ends) -> None:
    # The Spark drain's sweep relies on this (docs/pipelines.md, Zombie tasks): a false from
    # extend_lease means that no complete of that lease is still in flight. The complete's
    # transaction stays open past the lease's expiry; the extend must wait for it, then answer false
    # (completed; or, rolled back, still expired) and leave no lock behind.
    env = deploy(work(lease_seconds=30))
    holder = env.client(autocommit=False)
    sent = holder.enqueue({"n": 1})["id"]
    holder.conn.commit()
    [lease] = holder.dequeue(1, worker="w", lease_seconds=1)
    holder.conn.commit()
    assert holder.complete(sent, "w", lease_token=lease["lease_token"]) is True     # not committed
    time.sleep(1.3)                                                              # the lease runs out
    extender = env.client()
    thread, answers = started(lambda: extender.extend_lease(sent, "w", 30, lease_token=lease["lease_token"]))
    thread.join(1.5)
    waited = thread.is_alive()
    getattr(holder.conn, holder_ends)()
    thread.join(LOCK_TIMEOUT_SECONDS + 5)
    assert waited, f"extend_lease answered {answers} while the complete of its lease was in flight"
    assert answers == [False]
    assert len(env.client().dequeue(worker="w2")) == (0 if holder_ends == "commit" else 1)


def started(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """`call` on a thread of its own, started: the thread, and the list that gets its answer (or the
    error it raised) when it returns. A test joins the thread for a while to see whether it waits."""
    answers: list[Any] = []

    def run() -> None:
        try:
            answers.append(call())
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            answers.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answers


def statuses(client: QueueClient, leases: list[dict]) -> dict[str, str]:
    answer = client.lease_status(leases)
    assert sorted(str(i) for i in ids(answer)) == sorted(str(lease["id"]) for lease in leases)
    return {str(row["id"]): row["status"] for row in answer}


@pytest.mark.parametrize("options", [{}, {"history": True}, {"client_ids": True}],
                         ids=["plain", "history", "client-ids"])
def test_lease_status_tells_held_expired_lost_dead_and_gone_apart(deploy, options) -> None:
    client = deploy(work(max_attempts=2, **options)).client()
    sent = [client.enqueue({"i": i}, **({"id": uuid.uuid4()} if options.get("client_ids") else {}))["id"]
            for i in range(6)]
    leases = {str(lease["id"]): lease for lease in client.dequeue(batch_size=6, worker="w", lease_seconds=60)}
    held, completed, released, dead, retried, expired = (leases[str(i)] for i in sent)
    assert client.complete(completed["id"], "w", lease_token=completed["lease_token"])
    assert client.release(released["id"], "w", lease_token=released["lease_token"])
    assert client.fail(dead["id"], "w", "boom", lease_token=dead["lease_token"]) == "retrying"
    [again] = [m for m in client.dequeue(batch_size=6, worker="v") if m["id"] == dead["id"]]
    assert client.fail(again["id"], "v", "boom again", lease_token=again["lease_token"]) == "dead"
    assert client.fail(retried["id"], "w", "later", lease_token=retried["lease_token"],
                       retry_after_seconds=600) == "retrying"
    assert client.extend_lease(expired["id"], "w", 1, lease_token=expired["lease_token"])
    time.sleep(1.2)
    assert statuses(client, [held, completed, released, dead, retried, expired]) == {
        str(held["id"]): "held", str(completed["id"]): "gone", str(released["id"]): "lost",
        str(dead["id"]): "dead", str(retried["id"]): "lost", str(expired["id"]): "expired"}
    # Leased again: the old lease is lost, the new one is held.
    [taken] = [m for m in client.dequeue(batch_size=6, worker="x") if m["id"] == expired["id"]]
    assert statuses(client, [taken]) == {str(taken["id"]): "held"}
    assert statuses(client, [expired]) == {str(expired["id"]): "lost"}
    # An id no message ever had, with any token: gone. Asking changed nothing.
    unknown = {"id": uuid.uuid4() if options.get("client_ids") else 10 ** 12, "lease_token": uuid.uuid4()}
    assert statuses(client, [unknown]) == {str(unknown["id"]): "gone"}
    assert client.lease_status([]) == []
    assert client.complete(held["id"], "w", lease_token=held["lease_token"])
    assert client.complete(taken["id"], "x", lease_token=taken["lease_token"])


def test_lease_status_refuses_a_null_token_a_repeated_id_and_too_many(deploy) -> None:
    client = deploy(work()).client()
    sent = client.enqueue({"x": 1})["id"]
    [lease] = client.dequeue(worker="w")
    for leases in ([{"id": sent, "lease_token": None}],
                   [lease, lease],
                   [{"id": n, "lease_token": uuid.uuid4()} for n in range(1, 1002)]):
        with raises_queue_error(client, "invalid_argument"):
            client.lease_status(leases)
    assert statuses(client, [lease]) == {str(sent): "held"}


@pytest.mark.parametrize("options", [{}, {"client_ids": True}], ids=["plain", "client-ids"])
@pytest.mark.parametrize("holder_ends", ["commit", "rollback"])
@pytest.mark.parametrize("verb", ["complete", "fail"])
def test_lease_status_waits_for_a_transaction_holding_the_message(deploy, verb, holder_ends, options) -> None:
    # A consumer whose complete's answer was lost asks on another connection: while that
    # transaction is open any answer would be a guess; it waits, then tells what the end left.
    # With client ids SQL Server reads the primary key's entry, then the row by seq (DBA review M1).
    env = deploy(work(max_attempts=1, **options))
    holder = env.client(autocommit=False)
    sent = holder.enqueue({"n": 1}, **({"id": uuid.uuid4()} if options else {}))["id"]
    holder.conn.commit()
    [lease] = holder.dequeue(1, worker="w", lease_seconds=60)
    holder.conn.commit()
    if verb == "complete":
        assert holder.complete(sent, "w", lease_token=lease["lease_token"]) is True
    else:
        assert holder.fail(sent, "w", "boom", lease_token=lease["lease_token"]) == "dead"
    asker = env.client()
    thread, answers = started(lambda: statuses(asker, [lease]))
    thread.join(1.5)
    waited = thread.is_alive()
    getattr(holder.conn, holder_ends)()
    thread.join(LOCK_TIMEOUT_SECONDS + 5)
    assert waited, f"lease_status answered {answers} while a transaction held the message"
    after = {"commit": "gone" if verb == "complete" else "dead", "rollback": "held"}[holder_ends]
    assert answers == [{str(sent): after}]
    # It left no lock behind: the holder's next statement on the message does not wait.
    assert holder.complete(sent, "w", lease_token=lease["lease_token"]) is (holder_ends == "rollback")
    holder.conn.commit()


def test_lease_status_waiting_for_one_message_holds_no_other(deploy) -> None:
    # Senior-PostgreSQL review of lease_status (S3, e1): it waited in id order holding the shares of
    # the lower ids, so a complete of one of those waited behind it for as long as the transaction it
    # waited for (and a consumer locking them the other way round deadlocked). It waits for each
    # held row alone: the complete of a row it passed does not wait.
    env = deploy(work())
    client = env.client()
    first, second = (client.enqueue({"n": n})["id"] for n in range(2))
    leases = {lease["id"]: lease for lease in client.dequeue(2, worker="w", lease_seconds=60)}
    holder = env.client(autocommit=False)
    assert holder.extend_lease(second, "w", 60, lease_token=leases[second]["lease_token"])   # holds the second
    asker = env.client()
    thread, answers = started(lambda: statuses(asker, [leases[first], leases[second]]))
    time.sleep(0.5)
    assert thread.is_alive(), f"lease_status answered {answers} while a transaction held a message"
    completer = env.client()
    completer.conn.execute("SET lock_timeout = '2s'" if env.dialect == "postgres" else "SET LOCK_TIMEOUT 2000")
    assert completer.complete(first, "w", lease_token=leases[first]["lease_token"]) is True
    holder.conn.commit()
    thread.join(LOCK_TIMEOUT_SECONDS + 5)
    assert answers == [{str(first): "gone", str(second): "held"}]


@pytest.mark.parametrize("change", ["release", "fail"])
@pytest.mark.parametrize("verb", ["complete", "fail"])
def test_an_acknowledgement_waiting_while_its_token_changes_is_refused_and_the_lease_is_lost(deploy, verb,
                                                                                              change) -> None:
    # lost is final (docs/work-queue.md): an acknowledgement of the old token that was already waiting
    # for the row when the token changed must not land. Senior-PostgreSQL review, round 2.
    env = deploy(work())
    client = env.client()
    sent = client.enqueue({"n": 1})["id"]
    [lease] = client.dequeue(1, worker="w", lease_seconds=60)
    token = lease["lease_token"]
    holder = env.client(autocommit=False)
    assert holder.extend_lease(sent, "w", 60, lease_token=token)          # holds the row
    acker = env.client()
    thread, answers = started(lambda: acker.complete(sent, "w", lease_token=token) if verb == "complete"
                              else acker.fail(sent, "w", "late", lease_token=token))
    thread.join(1.0)
    waited = thread.is_alive()
    if change == "release":
        assert holder.release(sent, "w", lease_token=token)
    else:
        assert holder.fail(sent, "w", "boom", lease_token=token) == "retrying"
    holder.conn.commit()
    thread.join(LOCK_TIMEOUT_SECONDS + 5)
    assert waited, f"{verb} answered {answers} while a transaction held its message"
    assert answers == [False if verb == "complete" else "lost"]
    assert statuses(client, [lease]) == {str(sent): "lost"}


def test_lease_status_that_times_out_leaves_the_callers_transaction_as_its_engine_does(deploy) -> None:
    # lease_status changes nothing: on SQL Server its lock timeout (1222) ends the call and leaves the
    # caller's transaction open, with what it did before (XACT_ABORT stays off; DBA review S1). On
    # PostgreSQL any error aborts the transaction; the caller rolls back (docs/work-queue.md).
    env = deploy(work())
    holder = env.client(autocommit=False)
    sent = holder.enqueue({"n": 1})["id"]
    holder.conn.commit()
    [lease] = holder.dequeue(1, worker="w", lease_seconds=60)
    holder.conn.commit()
    assert holder.complete(sent, "w", lease_token=lease["lease_token"]) is True     # not committed
    asker = env.client(autocommit=False)
    earlier = asker.enqueue({"n": 2})["id"]                                          # the asker's own work
    asker.conn.execute("SET lock_timeout = '300ms'" if env.dialect == "postgres" else "SET LOCK_TIMEOUT 300")
    with pytest.raises(Exception) as raised:
        asker.lease_status([lease])
    assert error_code(raised.value) == ("55P03" if env.dialect == "postgres" else "1222")
    if env.dialect == "postgres":
        asker.conn.rollback()
    else:
        asker.conn.commit()
    holder.conn.rollback()
    after = env.client()
    assert after.lease_status([lease]) == [{"id": sent, "status": "held"}]
    assert ids(after.dequeue(batch_size=10, worker="v")) == ([earlier] if env.dialect == "mssql" else [])


def test_a_restarted_worker_gets_its_own_leased_messages_back_before_anyone_elses(deploy) -> None:
    client = deploy(work()).client()
    now = server_now(client)
    # Visible long ago: anyone's claim would take these first.
    old = ids([client.enqueue({"i": i}, due_at=now - timedelta(hours=1)) for i in range(2)])
    mine = ids([client.enqueue({"i": i}) for i in range(2, 4)])
    # Worker a takes the two oldest, then c takes the other two ...
    assert ids(client.dequeue(batch_size=2, worker="a", lease_seconds=60)) == old
    assert ids(client.dequeue(batch_size=2, worker="c", lease_seconds=1)) == mine
    time.sleep(1.2)
    # ... c's lease expired (those two are visible, and older than anything a holds would be),
    # yet a, restarting under its name, gets its own unexpired messages first, as they were: the
    # same attempt (asking again is no new delivery).
    assert counts(client) == (2, 0, 2, 0)
    again = client.dequeue(batch_size=3, worker="a", lease_seconds=60)
    assert ids(again)[:2] == old
    assert [m["attempts"] for m in again[:2]] == [1, 1]
    assert ids(again)[2:] == mine[:1]
    # Another worker never gets a's leased messages.
    assert ids(client.dequeue(batch_size=10, worker="b")) == mine[1:]
    assert counts(client) == (0, 0, 4, 0)


def test_batches_of_one_take_own_messages_first_then_visible_order(deploy) -> None:
    # Batch size 1 (and a batch whose last place is filled after the worker's own messages) runs
    # the claim with a literal LIMIT 1 on PostgreSQL; the own-messages claim runs only after a probe.
    client = deploy(work()).client()
    now = server_now(client)
    dues = [now - timedelta(minutes=m) for m in (1, 5, 3, 4, 2)]
    sent = ids([client.enqueue({"i": i}, due_at=due) for i, due in enumerate(dues)])
    expected = [i for _, i in sorted(zip(dues, sent))]

    first = client.dequeue(batch_size=1, worker="a", lease_seconds=60)
    assert ids(first) == expected[:1]
    # a restarts: batch 1 gives its own message back (the same attempt), not the next visible one.
    again = client.dequeue(batch_size=1, worker="a", lease_seconds=60)
    assert ids(again) == expected[:1] and again[0]["attempts"] == 1
    # Batch 2: the own message, then one place left for the oldest visible message.
    both = client.dequeue(batch_size=2, worker="a", lease_seconds=60)
    assert ids(both) == expected[:2]
    assert [m["attempts"] for m in both] == [1, 1]
    for position in range(2, 5):
        assert ids(client.dequeue(batch_size=1, worker=f"w{position}")) == [expected[position]]
    assert client.dequeue(batch_size=1, worker="z") == []
    assert counts(client) == (0, 0, 5, 0)


def test_a_batch_of_one_buries_an_exhausted_message_and_still_hands_out_one(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    now = server_now(client)
    doomed = client.enqueue({"doomed": True}, due_at=now - timedelta(minutes=2))
    assert ids(client.dequeue(batch_size=1, worker="a", lease_seconds=1)) == [doomed["id"]]
    # Visible just after the lease expires: the claim meets the exhausted message first.
    nxt = client.enqueue({"next": True}, due_at=server_now(client) + timedelta(seconds=1.1))
    time.sleep(1.3)

    got = client.dequeue(batch_size=1, worker="b")
    assert ids(got) == [nxt["id"]]
    assert ids(client.dead_list()) == [doomed["id"]]
    assert counts(client) == (0, 0, 1, 1)


def test_a_rolled_back_dequeue_leases_nothing_and_counts_no_attempt(deploy) -> None:
    env = deploy(work())
    producer = env.client()
    sent = producer.enqueue({"x": 1})
    consumer = env.client(autocommit=False)
    assert ids(consumer.dequeue(worker="a")) == [sent["id"]]
    consumer.conn.rollback()
    again = producer.dequeue(worker="b")
    assert ids(again) == [sent["id"]] and again[0]["attempts"] == 1


def test_a_lease_another_worker_rolls_back_is_next_for_a_worker_that_went_on(deploy) -> None:
    # PostgreSQL claims from a position each session keeps (docs/queue-kinds.md): a message leased
    # in someone's open transaction while this worker went past it must lie at or after it.
    env = deploy(work())
    producer = env.client()
    now = server_now(producer)
    sent = ids([producer.enqueue({"i": i}, due_at=now - timedelta(minutes=10 - i)) for i in range(4)])
    holder, consumer = env.client(autocommit=False), env.client()
    assert ids(holder.dequeue(worker="a")) == sent[:1]
    assert ids(consumer.dequeue(worker="b")) == sent[1:2]
    holder.conn.rollback()

    again = consumer.dequeue(worker="c")
    assert ids(again) == sent[:1] and again[0]["attempts"] == 1
    assert ids(consumer.dequeue(batch_size=10, worker="d")) == sent[2:]


def test_an_enqueue_committed_after_later_ones_were_leased_is_not_left_behind(deploy) -> None:
    env = deploy(work())
    slow, producer, consumer = env.client(autocommit=False), env.client(), env.client()
    late = slow.enqueue({"i": "late"})["id"]
    early = ids([producer.enqueue({"i": i}) for i in range(3)])
    first = ids(consumer.dequeue(batch_size=2, worker="a"))
    assert first == early[:2]
    slow.conn.commit()

    got: list[Any] = []
    deadline = time.monotonic() + 30
    polls = 0
    while len(got) < 2 and time.monotonic() < deadline:
        polls += 1   # a new worker each time: a worker's own leased messages would come back first
        got += ids(consumer.dequeue(batch_size=10, worker=f"poller-{polls}"))
        time.sleep(0.1)
    assert sorted(got, key=str) == sorted([late, early[2]], key=str)


@pytest.mark.parametrize("how", ["enqueue", "enqueue_batch"])
def test_a_message_due_in_the_past_is_leased_before_later_ones_after_a_dequeue(deploy, how) -> None:
    # The session has dequeued before, so on PostgreSQL it claims from a position past the first
    # message; a message enqueued with a due time before that position must still come first.
    client = deploy(work()).client()
    now = server_now(client)
    first, second = ids([client.enqueue({"i": i}, due_at=now - timedelta(minutes=m)) for i, m in ((0, 2), (1, 1))])
    client.enqueue({"i": "tomorrow"}, due_at=now + timedelta(days=1))
    assert ids(client.dequeue(worker="a")) == [first]
    assert client.complete(first, "a")

    if how == "enqueue":
        overdue = client.enqueue({"i": "overdue"}, due_at=now - timedelta(hours=1))["id"]
    else:
        overdue = client.enqueue_batch([{"payload": {"i": "overdue"}, "due_at": now - timedelta(hours=1)}])[0]["id"]
    assert ids(client.dequeue(worker="a")) == [overdue]
    assert ids(client.dequeue(batch_size=10, worker="b")) == [second]


def test_a_worker_restarted_on_a_session_it_used_before_gets_its_own_message_first(deploy) -> None:
    # A pooled connection: the session knows when it last saw worker a hold nothing, and must still
    # find the lease a took meanwhile on another connection (which then died).
    env = deploy(work())
    pooled = env.client()
    now = server_now(pooled)
    sent = ids([pooled.enqueue({"i": i}, due_at=now - timedelta(minutes=10 - i)) for i in range(3)])
    assert ids(pooled.dequeue(worker="a")) == sent[:1]
    assert pooled.complete(sent[0], "a")

    other = env.client()
    assert ids(other.dequeue(worker="a", lease_seconds=600)) == sent[1:2]
    other.conn.close()

    again = pooled.dequeue(worker="a")
    assert ids(again) == sent[1:2] and again[0]["attempts"] == 1
    assert ids(pooled.dequeue(batch_size=10, worker="b")) == sent[2:]


def test_asking_again_returns_a_live_lease_as_it_is_without_spending_an_attempt(deploy) -> None:
    # 0.1.0 re-leased a worker's live leases on every dequeue and counted an attempt each time: four
    # dequeues by one name buried a message 'lease expired' milliseconds after it was enqueued.
    client = deploy(work(max_attempts=3)).client()
    sent = client.enqueue({"x": 1})
    for _ in range(5):
        again = client.dequeue(worker="a", lease_seconds=2)
        assert ids(again) == [sent["id"]] and again[0]["attempts"] == 1
    assert client.dead_list() == []
    assert counts(client) == (0, 0, 1, 0)
    # Asking again buys no time either: the lease still ends 2 s after the first dequeue.
    time.sleep(0.5)
    client.dequeue(worker="a", lease_seconds=600)
    time.sleep(1.8)
    taken = client.dequeue(worker="b")
    assert ids(taken) == [sent["id"]] and taken[0]["attempts"] == 2
    assert client.complete(sent["id"], "a") is False
    assert client.complete(sent["id"], "b") is True


def test_a_dequeue_in_a_repeatable_read_transaction_is_refused_or_reads_committed(deploy) -> None:
    # PostgreSQL cannot change the level inside a function: it refuses (a claim position found in
    # an old snapshot could hide messages committed since). SQL Server's procedure switches to READ
    # COMMITTED for its own statements (reset on return) and claims.
    env = deploy(work())
    producer = env.client()
    sent = producer.enqueue({"x": 1})
    consumer = env.client(autocommit=False)
    if env.dialect == "postgres":
        consumer.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with raises_queue_error(consumer, "isolation_level"):
            consumer.dequeue(worker="a")
    else:
        consumer.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert ids(consumer.dequeue(worker="a")) == [sent["id"]]
        consumer.conn.commit()
        assert producer.complete(sent["id"], "a") is True
        return
    assert ids(producer.dequeue(worker="b")) == [sent["id"]]


def test_a_lease_extended_elsewhere_is_not_reported_lost_to_an_older_snapshot(deploy) -> None:
    # A business transaction at REPEATABLE READ takes its snapshot, a heartbeat extends the lease on
    # another connection, the first lease's expiry passes, and the transaction completes. PostgreSQL:
    # the guarded delete judges the lease by the old snapshot, so complete fails with 40001 (retry
    # the transaction) instead of answering a wrong false; SQL Server's procedure reads committed.
    env = deploy(work())
    sent = env.client().enqueue({"x": 1})["id"]
    worker = env.client()
    assert ids(worker.dequeue(worker="w", lease_seconds=2)) == [sent]
    business = env.client(autocommit=False)
    business.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    business.stats()                                   # the snapshot is taken now
    assert worker.extend_lease(sent, "w", 60) is True
    time.sleep(2.2)
    if env.dialect == "postgres":
        with pytest.raises(Exception) as refused:
            business.complete(sent, "w")
        assert error_code(refused.value) == "40001"
        business.conn.rollback()
        assert worker.complete(sent, "w") is True
    else:
        assert business.complete(sent, "w") is True
        business.conn.commit()


def test_two_bounded_purges_at_once_each_take_rows_the_other_left(deploy) -> None:
    env = deploy(work(history=True))
    client = env.client()
    for i in range(6):
        done = client.enqueue({"i": i})["id"]
        client.dequeue(worker="a")
        assert client.complete(done, "a")
    cutoff = server_now(client) + timedelta(seconds=1)
    first, second = env.client(autocommit=False), env.client(autocommit=False)
    assert first.history_purge(older_than=cutoff, max_rows=2) == 2      # left open
    assert second.history_purge(older_than=cutoff, max_rows=2) == 2     # skips the first one's rows
    first.conn.commit()
    second.conn.commit()
    assert client.history_purge(older_than=cutoff, max_rows=10) == 2


def test_a_manual_commit_caller_runs_every_verb_in_its_own_transaction(deploy) -> None:
    # ODBC/JDBC with autocommit off run SQL Server sessions in IMPLICIT_TRANSACTIONS mode: there a
    # procedure's BEGIN TRANSACTION at @@TRANCOUNT = 0 would open a second level and end in error 266
    # (0.1.0). The caller's transaction holds everything until it commits.
    env = deploy(work(max_attempts=1, dedupe=True))
    caller, observer = env.client(autocommit=False), env.client()
    keyed = caller.enqueue({"x": 1}, dedupe_key="k1")["id"]
    batch = ids(caller.enqueue_batch([{"payload": {"x": 2}, "dedupe_key": "k2"}, {"payload": {"x": 3}}]))
    caller.conn.commit()
    assert counts(observer) == (3, 0, 0, 0)

    leased = ids(caller.dequeue(batch_size=3, worker="a"))
    assert sorted(leased, key=str) == sorted([keyed, *batch], key=str)
    assert caller.fail(keyed, "a", "boom") == "dead"
    assert caller.complete(batch[0], "a") is True
    caller.conn.commit()
    assert counts(observer) == (0, 0, 1, 1)

    assert caller.dead_requeue(keyed) is True
    caller.conn.rollback()                  # the caller's decision, not the procedure's
    assert counts(observer) == (0, 0, 1, 1)
    assert caller.dead_requeue(keyed) is True
    caller.conn.commit()
    assert counts(observer) == (1, 0, 1, 0)


def test_a_refused_argument_leaves_the_callers_transaction_to_the_caller(deploy) -> None:
    # SQL Server: argument checks throw before XACT_ABORT ON, so the caller's transaction survives
    # and can still commit what it did. PostgreSQL aborts a transaction on any error (a caller that
    # wants to go on uses a savepoint): the engines differ here, and both are stated.
    env = deploy(work())
    caller, observer = env.client(autocommit=False), env.client()
    sent = caller.enqueue({"x": 1})["id"]
    with pytest.raises(Exception) as refused:
        caller.dequeue(batch_size=0, worker="a")
    assert error_code(refused.value) == expected_error(env.dialect, "invalid_argument")
    if env.dialect == "postgres":
        caller.conn.rollback()
        assert counts(observer) == (0, 0, 0, 0)
        return
    caller.conn.commit()
    assert ids(observer.dequeue(worker="b")) == [sent]


@pytest.mark.parametrize("options", [{}, {"dedupe": True, "priority": True}, {"client_ids": True}],
                         ids=["plain", "dedupe-priority", "client-ids"])
def test_enqueue_batch_takes_items_whose_first_row_holds_nulls(deploy, options) -> None:
    # pyodbc once took each column's SQL type from the first row of a table-valued parameter.
    client = deploy(work(**options)).client()
    now = server_now(client)
    later = {"payload": {"i": 2}, "due_at": now - timedelta(minutes=1)}
    if options.get("dedupe"):
        later.update(dedupe_key="k", priority=3)
    if options.get("client_ids"):
        later.update(id=uuid.uuid4(), enqueued_at=now - timedelta(hours=1))
    rows = client.enqueue_batch([{"payload": {"i": 1}}, later])
    assert [row["ordinal"] for row in rows] == [1, 2] and not any(row["duplicate"] for row in rows)
    got = client.dequeue(batch_size=10, worker="a")
    assert sorted(payload_of(client, m["payload"])["i"] for m in got) == [1, 2]


# --- fail, max_attempts and the dead-letter table ------------------------------------------------

def test_fail_retries_after_the_delay_and_the_last_attempt_goes_to_dead(deploy) -> None:
    client = deploy(work(max_attempts=2)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a")

    assert client.fail(sent["id"], "a", "first error", retry_after_seconds=1) == "retrying"
    assert counts(client) == (0, 1, 0, 0)
    assert client.dequeue(worker="a") == []
    time.sleep(1.2)
    assert counts(client) == (1, 0, 0, 0)
    second = client.dequeue(worker="b")
    assert ids(second) == [sent["id"]] and second[0]["attempts"] == 2

    assert client.fail(sent["id"], "b", "second error") == "dead"
    assert counts(client) == (0, 0, 0, 1)
    assert client.dequeue(worker="a") == []
    dead = client.dead_list()
    assert len(dead) == 1
    row = dead[0]
    assert row["id"] == sent["id"]
    assert row["attempts"] == 2
    assert row["last_error"] == "second error"
    assert row["last_worker"] == "b"
    assert payload_of(client, row["payload"]) == {"x": 1}


def test_fail_without_a_delay_makes_the_message_visible_at_once(deploy) -> None:
    client = deploy(work(max_attempts=3)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a")
    assert client.fail(sent["id"], "a", "boom") == "retrying"
    # fail releases the lease: not the worker's "own" message any more, anyone may take it.
    assert ids(client.dequeue(worker="b")) == [sent["id"]]


def test_retry_after_seconds_out_of_range_is_invalid_argument(deploy) -> None:
    client = deploy(work()).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a")
    with raises_queue_error(client, "invalid_argument"):
        client.fail(sent["id"], "a", "e", retry_after_seconds=-1)
    assert counts(client) == (0, 0, 1, 0)


@pytest.mark.parametrize("options", [{}, {"client_ids": True, "priority": True}], ids=["plain", "client-ids-priority"])
def test_a_lease_that_expires_max_attempts_times_ends_dead_and_frees_its_place_in_the_batch(deploy, options) -> None:
    client = deploy(work(max_attempts=2, **options)).client()
    now = server_now(client)
    doomed = client.enqueue({"doomed": True}, due_at=now - timedelta(minutes=1))
    client.dequeue(worker="a", lease_seconds=1)
    time.sleep(1.2)
    assert client.dequeue(worker="b", lease_seconds=1)[0]["attempts"] == 2
    # Visible just after the second lease expires: the claim meets the doomed message first.
    other = client.enqueue({"other": True}, due_at=server_now(client) + timedelta(seconds=1.1))
    time.sleep(1.3)

    # The claim that would be a third attempt moves it to dead, and the batch of one is still
    # filled with the next visible message.
    got = client.dequeue(batch_size=1, worker="c")
    assert ids(got) == [other["id"]]
    dead = client.dead_list()
    assert ids(dead) == [doomed["id"]]
    assert dead[0]["attempts"] == 2
    assert dead[0]["last_error"] == "lease expired"
    assert dead[0]["last_worker"] == "b"
    assert counts(client) == (0, 0, 1, 1)


def test_a_restarted_worker_whose_own_expired_lease_used_every_attempt_sends_it_to_dead(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a", lease_seconds=1)
    time.sleep(1.2)
    assert client.dequeue(worker="a") == []  # a restarts after its lease expired: no attempt left
    assert ids(client.dead_list()) == [sent["id"]]
    assert client.dead_list()[0]["last_error"] == "lease expired"


def test_dead_requeue_puts_the_message_back_with_attempts_reset(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a")
    assert client.fail(sent["id"], "a", "boom") == "dead"

    assert client.dead_requeue(sent["id"]) is True
    assert client.dead_list() == []
    assert counts(client) == (1, 0, 0, 0)
    again = client.dequeue(worker="b")
    assert ids(again) == [sent["id"]] and again[0]["attempts"] == 1
    assert payload_of(client, again[0]["payload"]) == {"x": 1}
    assert client.complete(sent["id"], "b") is True


@pytest.mark.parametrize("options", [{}, {"dedupe": True}, {"client_ids": True}], ids=["plain", "dedupe", "client-ids"])
def test_two_concurrent_requeues_of_one_dead_message_requeue_it_once(deploy, options) -> None:
    env = deploy(work(max_attempts=1, **options))
    client = env.client()
    sent = client.enqueue({"x": 1}, dedupe_key="k" if options.get("dedupe") else None)
    client.dequeue(worker="a")
    assert client.fail(sent["id"], "a", "boom") == "dead"

    first, second = env.client(autocommit=False), env.client(autocommit=False)
    assert first.dead_requeue(sent["id"]) is True      # its transaction stays open
    outcome: dict[str, Any] = {}

    def requeue_again() -> None:
        try:
            outcome["result"] = second.dead_requeue(sent["id"])
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    waiter = threading.Thread(target=requeue_again)
    waiter.start()
    time.sleep(0.5)    # the second requeue waits on the first one's lock
    first.conn.commit()
    waiter.join(timeout=LOCK_TIMEOUT_SECONDS + 5)
    assert "error" in outcome, outcome
    assert error_code(outcome["error"]) == expected_error(env.dialect, "not_found"), outcome["error"]
    second.conn.rollback()
    assert counts(client) == (1, 0, 0, 0)
    assert ids(client.dequeue(worker="b")) == [sent["id"]]


def test_dead_delete_removes_the_message_and_unknown_ids_are_not_found(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    sent = client.enqueue({"x": 1})
    client.dequeue(worker="a")
    client.fail(sent["id"], "a", "boom")

    assert client.dead_delete(sent["id"]) is True
    assert counts(client) == (0, 0, 0, 0)
    with raises_queue_error(client, "not_found"):
        client.dead_delete(sent["id"])
    with raises_queue_error(client, "not_found"):
        client.dead_requeue(sent["id"])


def test_dead_list_pages_in_id_order(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    sent = ids(client.enqueue_batch({"payload": {"i": i}} for i in range(5)))
    for message in client.dequeue(batch_size=5, worker="a"):
        assert client.fail(message["id"], "a", f"error {message['id']}") == "dead"

    pages, after = [], None
    while True:
        page = client.dead_list(after_id=after, limit=2)
        if not page:
            break
        assert len(page) <= 2
        pages.append(ids(page))
        after = page[-1]["id"]
    assert pages == [sent[0:2], sent[2:4], sent[4:5]]
    with raises_queue_error(client, "invalid_argument"):
        client.dead_list(limit=0)


# --- options -------------------------------------------------------------------------------------

def test_dedupe_reports_the_queued_message_until_it_is_completed(deploy) -> None:
    client = deploy(work(dedupe=True)).client()
    first = client.enqueue({"n": 1}, dedupe_key="k")
    again = client.enqueue({"n": 2}, dedupe_key="k")
    assert again == {"id": first["id"], "duplicate": again["duplicate"]} and again["duplicate"]

    batch = client.enqueue_batch([{"payload": {"n": 3}, "dedupe_key": "k"},
                                  {"payload": {"n": 4}, "dedupe_key": "new"},
                                  {"payload": {"n": 5}, "dedupe_key": "new"},
                                  {"payload": {"n": 6}}])
    assert [bool(r["duplicate"]) for r in batch] == [True, False, True, False]
    assert batch[0]["id"] == first["id"] and batch[2]["id"] == batch[1]["id"]

    # Leased is still queued: still a duplicate.
    client.dequeue(batch_size=10, worker="a")
    assert client.enqueue({"n": 7}, dedupe_key="k")["duplicate"]
    assert client.complete(first["id"], "a")
    fresh = client.enqueue({"n": 8}, dedupe_key="k")
    assert not fresh["duplicate"] and fresh["id"] != first["id"]


def test_a_dedupe_key_needs_option_dedupe(deploy) -> None:
    client = deploy(work()).client()
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue({"x": 1}, dedupe_key="k")
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue_batch([{"payload": {"x": 1}, "dedupe_key": "k"}])
    assert counts(client) == (0, 0, 0, 0)


def test_priority_hands_out_higher_levels_first_then_visible_order(deploy) -> None:
    client = deploy(work(priority=True)).client()
    now = server_now(client)
    low_old = client.enqueue({"p": 0}, due_at=now - timedelta(minutes=5))
    high = client.enqueue({"p": 5}, priority=5)
    mid = client.enqueue_batch([{"payload": {"p": 1}, "priority": 1},
                                {"payload": {"p": 1}, "priority": 1, "due_at": now - timedelta(minutes=1)}])
    # A delayed message at the top level must not hide the ready ones below it.
    client.enqueue({"p": 9}, priority=9, due_at=now + timedelta(hours=1))

    got = client.dequeue(batch_size=10, worker="a")
    assert ids(got) == [high["id"], mid[1]["id"], mid[0]["id"], low_old["id"]]
    assert counts(client) == (0, 1, 4, 0)


def test_batches_of_one_walk_the_priority_levels_in_order(deploy) -> None:
    client = deploy(work(priority=True)).client()
    now = server_now(client)
    low_old = client.enqueue({"p": 0}, due_at=now - timedelta(minutes=5))
    high = client.enqueue({"p": 5}, priority=5)
    mid = client.enqueue_batch([{"payload": {"p": 1}, "priority": 1},
                                {"payload": {"p": 1}, "priority": 1, "due_at": now - timedelta(minutes=1)}])
    client.enqueue({"p": 9}, priority=9, due_at=now + timedelta(hours=1))

    got = [row for n in range(5) for row in client.dequeue(batch_size=1, worker=f"w{n}")]
    assert ids(got) == [high["id"], mid[1]["id"], mid[0]["id"], low_old["id"]]
    assert counts(client) == (0, 1, 4, 0)


def test_priorities_and_client_ids_need_their_options(deploy) -> None:
    client = deploy(work()).client()
    for item in ({"priority": 1}, {"id": uuid.uuid4()}, {"enqueued_at": datetime.now(UTC)}):
        with raises_queue_error(client, "invalid_argument"):
            client.enqueue_batch([{"payload": {"x": 1}, **item}])
    assert counts(client) == (0, 0, 0, 0)


def as_uuid(value: Any) -> uuid.UUID:
    """uuid from psycopg; pyodbc returns uniqueidentifier as text unless pyodbc.native_uuid is set."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def test_client_ids_and_times_are_kept_and_an_id_enqueued_twice_is_a_duplicate(deploy) -> None:
    client = deploy(work(client_ids=True)).client()
    given = uuid.uuid4()
    created = datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
    first = client.enqueue({"n": 1}, id=given, enqueued_at=created)
    assert as_uuid(first["id"]) == given and not first["duplicate"]
    again = client.enqueue({"n": 2}, id=given)
    assert as_uuid(again["id"]) == given and again["duplicate"]
    generated = as_uuid(client.enqueue({"n": 3})["id"])
    assert generated != given

    other = uuid.uuid4()
    batch = client.enqueue_batch([{"payload": {"n": 4}, "id": other},
                                  {"payload": {"n": 5}, "id": given},
                                  {"payload": {"n": 6}, "id": other},
                                  {"payload": {"n": 7}}])
    assert [as_uuid(r["id"]) for r in batch[:3]] == [other, given, other]
    assert [bool(r["duplicate"]) for r in batch] == [False, True, True, False]

    got = {as_uuid(m["id"]): m for m in client.dequeue(batch_size=10, worker="a")}
    assert set(got) == {given, generated, other, as_uuid(batch[3]["id"])}
    assert as_utc(got[given]["enqueued_at"]) == created
    assert payload_of(client, got[given]["payload"]) == {"n": 1}


def test_history_keeps_completed_messages_and_history_purge_removes_old_ones(deploy) -> None:
    env = deploy(work(history=True, history_retention_days=7))
    client = env.client()
    sent = client.enqueue({"x": 1})
    failed_once = client.enqueue({"x": 2})
    client.dequeue(batch_size=2, worker="a")
    assert client.fail(failed_once["id"], "a", "boom") == "retrying"
    client.dequeue(worker="b")
    time.sleep(0.05)
    assert client.complete(sent["id"], "a") and client.complete(failed_once["id"], "b")
    assert client.complete(sent["id"], "a") is False

    # No verb lists the history: read the table as an operator would.
    rows = {r["id"]: r for r in env.table_rows(
        "_history", "id, enqueued_at, started_at, finished_at, duration_ms, worker, attempts")}
    assert set(rows) == {sent["id"], failed_once["id"]}
    assert rows[sent["id"]]["worker"] == "a" and rows[sent["id"]]["attempts"] == 1
    assert rows[failed_once["id"]]["worker"] == "b" and rows[failed_once["id"]]["attempts"] == 2
    for row in rows.values():
        assert as_utc(row["enqueued_at"]) <= as_utc(row["started_at"]) <= as_utc(row["finished_at"])
        assert row["duration_ms"] >= 0
    assert rows[sent["id"]]["duration_ms"] >= 40

    assert client.history_purge() == 0  # default retention: 7 days
    assert client.history_purge(older_than=server_now(client) + timedelta(seconds=1)) == 2
    assert env.table_rows("_history", "id") == []


def test_purges_take_at_most_max_rows_oldest_first(deploy) -> None:
    env = deploy(work(history=True))
    client = env.client()
    sent = ids(client.enqueue_batch([{"payload": {"i": i}} for i in range(5)]))
    assert client.purge(max_rows=2) == 2
    assert client.purge(max_rows=2) == 2
    assert ids(client.dequeue(batch_size=10, worker="a")) == sent[4:]
    assert client.complete(sent[4], "a")
    for i in range(3):
        done = client.enqueue({"i": i})["id"]
        client.dequeue(worker="a")
        assert client.complete(done, "a")
    cutoff = server_now(client) + timedelta(seconds=1)
    assert client.history_purge(older_than=cutoff, max_rows=3) == 3
    assert client.history_purge(older_than=cutoff, max_rows=3) == 1
    for verb in ("purge", "history_purge"):
        with raises_queue_error(client, "invalid_argument"):
            client.call(verb, {"max_rows": 0})


def test_purges_need_max_rows_inside_a_callers_transaction(deploy) -> None:
    """Every purged row would stay locked until the caller's transaction ends (SQL Server: every
    chunk's locks), so there a purge must be bounded. (PostgreSQL tells a caller's transaction
    once it has written: here the enqueue.)"""
    env = deploy(work(history=True))
    caller = env.client(autocommit=False)
    for verb in ("purge", "history_purge"):
        caller.enqueue({"verb": verb})
        with raises_queue_error(caller, "invalid_argument"):
            caller.call(verb, {})
    caller.enqueue({"kept": False})
    assert caller.purge(max_rows=10) == 1 and caller.history_purge(max_rows=10) == 0
    caller.conn.commit()
    assert counts(env.client()) == (0, 0, 0, 0)


def test_purge_removes_queued_messages_older_than_the_cutoff(deploy) -> None:
    client = deploy(work()).client()
    client.enqueue({"x": 1})
    cutoff = server_now(client)
    time.sleep(0.05)
    newer = client.enqueue({"x": 2})
    assert client.purge(older_than=cutoff) == 1
    assert ids(client.dequeue(batch_size=10, worker="a")) == [newer["id"]]
    assert client.purge() == 1
    assert counts(client) == (0, 0, 0, 0)


def test_stats_counts_each_state_once(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    now = server_now(client)
    client.enqueue_batch([{"payload": {"i": i}} for i in range(3)])
    client.enqueue_batch([{"payload": {"i": i}, "due_at": now + timedelta(hours=1)} for i in range(2)])
    assert counts(client) == (3, 2, 0, 0)
    leased = client.dequeue(batch_size=2, worker="a")
    assert counts(client) == (1, 2, 2, 0)
    client.fail(leased[0]["id"], "a", "boom")
    assert counts(client) == (1, 2, 1, 1)
    assert client.stats()["oldest_ready_age_seconds"] >= 0


def test_stats_counts_expired_leases_over_every_holder_up_to_the_limit_and_estimates_past_it(deploy) -> None:
    # Each count stops at 10,001 rows: expired leases of eleven holders pass it together (SQL Server
    # walks the holders one at a time, with what is left of the limit), and 10,000 are exact. One
    # batch per holder: a worker asking again gets its own messages back.
    # Leases of 3 seconds, all taken within them (or a later dequeue's look would take an earlier
    # holder's expired ones back instead of new messages).
    client = deploy(work(max_attempts=5)).client()
    for start in range(0, 10_001, 1000):
        client.enqueue_batch([{"payload": {"i": i}} for i in range(start, min(start + 1000, 10_001))])
    started = time.monotonic()
    batches = [client.dequeue(batch_size=1000 if n < 10 else 1, worker=f"w{n}", lease_seconds=3) for n in range(11)]
    assert time.monotonic() - started < 3 and sum(map(len, batches)) == 10_001
    time.sleep(3.3)
    past = client.stats()
    assert past["estimated"] and past["ready"] >= 10_001
    assert (past["delayed"], past["in_flight"], past["dead"]) == (0, 0, 0)
    [taken] = client.dequeue(worker="w11", lease_seconds=60)   # an expired lease, leased anew
    assert taken["attempts"] == 2
    assert counts(client) == (10_000, 0, 1, 0)



def test_stats_of_a_priority_queue_counts_lower_levels_past_a_count_over_the_limit(deploy) -> None:
    # 10,001 delayed messages at the top level pass the delayed count's limit there; the walk down
    # the levels still counts the ready ones below (it stopped, and reported ready 0 with no oldest).
    client = deploy(work(priority=True)).client()
    later = server_now(client) + timedelta(hours=1)
    for start in range(0, 10_001, 1000):
        client.enqueue_batch([{"payload": {"i": i}, "due_at": later, "priority": 5}
                              for i in range(start, min(start + 1000, 10_001))])
    client.enqueue_batch([{"payload": {"low": i}, "priority": 1} for i in range(3)])
    stats = client.stats()
    assert stats["estimated"] and stats["ready"] == 3 and stats["delayed"] >= 10_001, stats
    assert stats["oldest_ready_age_seconds"] is not None and stats["in_flight"] == 0

# --- consumers v2: lease tokens, release, batch acknowledgement, complete_next, wait ----------------

def test_every_lease_has_a_token_and_a_worker_asking_again_gets_the_same_one(deploy) -> None:
    client = deploy(work()).client()
    sent = ids([client.enqueue({"i": i}) for i in range(2)])
    first = client.dequeue(batch_size=2, worker="a")
    again = client.dequeue(batch_size=2, worker="a")
    tokens = [m["lease_token"] for m in first]
    assert ids(first) == sent and all(isinstance(t, uuid.UUID) for t in tokens) and len(set(tokens)) == 2
    assert [(m["id"], m["lease_token"], m["attempts"]) for m in again] == [(m["id"], m["lease_token"], 1) for m in first]


def test_a_stale_token_changes_nothing_even_when_the_same_worker_leased_the_message_again(deploy) -> None:
    client = deploy(work(lease_seconds=1, max_attempts=5)).client()
    sent = client.enqueue({"x": 1})["id"]
    stale = client.dequeue(worker="a")[0]["lease_token"]
    time.sleep(1.3)
    fresh = client.dequeue(worker="a")[0]
    assert fresh["id"] == sent and fresh["attempts"] == 2 and fresh["lease_token"] != stale

    assert client.complete(sent, "a", lease_token=stale) is False
    assert client.fail(sent, "a", "late", lease_token=stale) == "lost"
    assert client.extend_lease(sent, "a", 60, lease_token=stale) is False
    assert client.release(sent, "a", lease_token=stale) is False
    assert client.complete_batch([{"id": sent, "lease_token": stale}], "a") == [{"id": sent, "completed": False}]
    assert client.fail_batch([{"id": sent, "lease_token": stale}], "a", "late") == [{"id": sent, "outcome": "lost"}]
    assert counts(client) == (0, 0, 1, 0)
    assert client.extend_lease(sent, "a", 60, lease_token=fresh["lease_token"]) is True
    assert client.complete(sent, "a", lease_token=fresh["lease_token"]) is True
    assert counts(client) == (0, 0, 0, 0)


def test_without_a_token_the_worker_name_decides_as_in_0_1_0(deploy) -> None:
    client = deploy(work()).client()
    first, second = (client.enqueue({"i": i})["id"] for i in range(2))
    client.dequeue(batch_size=2, worker="a")
    assert client.complete(first, "b") is False
    assert client.complete(first, "a") is True
    assert client.complete_batch([{"id": second}], "b") == [{"id": second, "completed": False}]
    assert client.complete_batch([{"id": second}], "a") == [{"id": second, "completed": True}]


def test_release_gives_the_message_back_at_once_with_its_attempt(deploy) -> None:
    client = deploy(work(max_attempts=1)).client()
    sent = client.enqueue({"x": 1})["id"]
    leased = client.dequeue(worker="a")[0]
    assert client.release(sent, "b", lease_token=leased["lease_token"]) is False
    assert client.release(sent, "a", lease_token=uuid.uuid4()) is False
    assert counts(client) == (0, 0, 1, 0)

    assert client.release(sent, "a", lease_token=leased["lease_token"]) is True
    assert counts(client) == (1, 0, 0, 0)
    assert client.release(sent, "a", lease_token=leased["lease_token"]) is False
    # max_attempts 1: had the attempt been spent, this lease would be one too many (dead).
    again = client.dequeue(worker="b")
    assert ids(again) == [sent] and again[0]["attempts"] == 1 and again[0]["lease_token"] != leased["lease_token"]
    assert client.complete(sent, "b", lease_token=again[0]["lease_token"]) is True


def test_complete_batch_answers_every_item_in_id_order(deploy) -> None:
    env = deploy(work(history=True))
    client = env.client()
    sent = ids([client.enqueue({"i": i}) for i in range(5)])
    leased = client.dequeue(batch_size=4, worker="a")          # sent[4] is never leased
    token = {m["id"]: m["lease_token"] for m in leased}
    unknown = max(sent) + 1000 if not isinstance(sent[0], uuid.UUID) else uuid.uuid4()
    acks = [{"id": sent[3], "lease_token": token[sent[3]]}, {"id": sent[4], "lease_token": None},
            {"id": sent[0], "lease_token": token[sent[0]]}, {"id": unknown, "lease_token": None},
            {"id": sent[2], "lease_token": uuid.uuid4()}, {"id": sent[1], "lease_token": None}]

    answer = client.complete_batch(acks, "a")

    expected = {sent[0]: True, sent[1]: True, sent[2]: False, sent[3]: True, sent[4]: False, unknown: False}
    assert answer == [{"id": i, "completed": expected[i]} for i in sorted(expected)]
    assert sorted(r["id"] for r in env.table_rows("_history", "id")) == sorted([sent[0], sent[1], sent[3]])
    assert counts(client) == (1, 0, 1, 0)
    assert client.complete_batch([], "a") == []


def test_fail_batch_retries_buries_or_reports_lost_per_item(deploy) -> None:
    client = deploy(work(max_attempts=2)).client()
    sent = ids([client.enqueue({"i": i}) for i in range(3)])
    assert ids(client.dequeue(worker="a")) == [sent[0]]
    assert client.fail(sent[0], "a", "first", retry_after_seconds=0) == "retrying"
    leased = {m["id"]: m for m in client.dequeue(batch_size=3, worker="a")}
    assert {i: m["attempts"] for i, m in leased.items()} == {sent[0]: 2, sent[1]: 1, sent[2]: 1}  # sent[0]: its last

    answer = client.fail_batch([{"id": sent[2], "lease_token": uuid.uuid4()},
                                {"id": sent[0], "lease_token": leased[sent[0]]["lease_token"]},
                                {"id": sent[1], "lease_token": leased[sent[1]]["lease_token"]}],
                               "a", "boom", retry_after_seconds=3600)

    assert answer == [{"id": sent[0], "outcome": "dead"}, {"id": sent[1], "outcome": "retrying"},
                      {"id": sent[2], "outcome": "lost"}]
    dead = client.dead_list()
    assert [(d["id"], d["attempts"], d["last_error"]) for d in dead] == [(sent[0], 2, "boom")]
    assert counts(client) == (0, 1, 1, 1)


@pytest.mark.parametrize("verb", ["complete_batch", "fail_batch"])
def test_batch_acks_refuse_more_than_1000_items_and_an_id_twice(deploy, verb) -> None:
    client = deploy(work()).client()
    sent = client.enqueue({"x": 1})["id"]
    leased = client.dequeue(worker="a")[0]
    extra = {"error": "e"} if verb == "fail_batch" else {}
    too_many = [{"id": i + 1_000_000, "lease_token": None} for i in range(1001)]
    if client.queue.options.get("client_ids"):
        too_many = [{"id": uuid.uuid4(), "lease_token": None} for _ in range(1001)]
    for acks in (too_many, [{"id": sent, "lease_token": leased["lease_token"]}] * 2):
        with raises_queue_error(client, "invalid_argument"):
            getattr(client, verb)(acks, "a", **extra)
    assert counts(client) == (0, 0, 1, 0)


def test_complete_next_completes_and_leases_the_next_in_one_call(deploy) -> None:
    client = deploy(work()).client()
    first, second = (client.enqueue({"i": i})["id"] for i in range(2))
    leased = client.dequeue(worker="a")[0]

    completed, following = client.complete_next(first, "a", leased["lease_token"])
    assert completed is True and ids(following) == [second] and following[0]["attempts"] == 1
    completed, again = client.complete_next(first, "a", leased["lease_token"])   # a holds `second`: its own, as is
    assert completed is False and [(m["id"], m["lease_token"]) for m in again] == [(second, following[0]["lease_token"])]
    completed, nothing = client.complete_next(second, "a", following[0]["lease_token"], batch_size=5)
    assert completed is True and nothing == []
    assert counts(client) == (0, 0, 0, 0)


def test_wait_is_true_only_for_a_message_dequeue_would_hand_out(deploy) -> None:
    env = deploy(work(lease_seconds=1))
    client, producer = env.client(), env.client(autocommit=False)
    assert client.wait(0) is False
    assert client.wait(200) is False
    producer.enqueue({"x": 1})                                  # not committed: not ready
    assert client.wait(200) is False
    producer.conn.commit()
    assert client.wait(200) is True and client.wait(0) is True
    leased = client.dequeue(worker="a")[0]                      # leased: not ready until it expires
    assert client.wait(200) is False
    assert client.wait(5000) is True                            # the 1 s lease expired
    assert client.complete(leased["id"], "a") is False


def test_wait_wakes_for_a_commit_made_while_it_waits(deploy) -> None:
    env = deploy(work())
    client, producer = env.client(), env.client()
    committed_at: list[float] = []

    def produce() -> None:
        time.sleep(0.5)
        producer.enqueue({"x": 1})
        committed_at.append(time.monotonic())

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        ready = client.wait(15_000)
        returned_at = time.monotonic()
    finally:
        thread.join()
    assert ready is True and committed_at and returned_at >= committed_at[0]
    assert len(client.dequeue(worker="a")) == 1


@pytest.mark.parametrize("wait_ms", [-1, 20_001, None])
def test_wait_refuses_a_wait_out_of_range(deploy, wait_ms) -> None:
    client = deploy(work()).client()
    with raises_queue_error(client, "invalid_argument"):
        client.call("wait", {"wait_ms": wait_ms}, required=("wait_ms",)) if client.dialect == "mssql" else \
            client.conn.execute(f"CALL {client._routine('wait')}(wait_ms => %s, ready => NULL)", (wait_ms,))


def test_dequeue_with_wait_returns_the_message_committed_while_it_waits(deploy) -> None:
    env = deploy(work())
    client, producer = env.client(), env.client()
    timer = threading.Timer(0.4, lambda: producer.enqueue({"late": True}))
    timer.start()
    try:
        got = client.dequeue(worker="a", wait=15)
    finally:
        timer.join()
    assert [payload_of(client, m["payload"]) for m in got] == [{"late": True}]
    assert client.dequeue(worker="b", wait=0.2) == []
