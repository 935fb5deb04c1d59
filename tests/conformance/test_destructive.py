"""Conformance: the destructive kinds (heap, fifo, strict fifo, lifo, pending) through the public contract.

Engine-agnostic: every test runs once per configured engine (PostgreSQL always, SQL Server when
TABLEQUEUE_MSSQL_URL is set), talks to the queue only through tablequeue.client (the procedures and
functions of DESIGN.md §3), and checks what a caller observes: ids, order, payloads, times, counts,
and the fixed error numbers / SQLSTATEs of tools/tablequeue/errors.py.

Known engine differences the tests spell out (docs/errors.md, docs/queue-kinds.md):
- Invalid JSON text never reaches the PostgreSQL function: the jsonb parameter rejects it with
  SQLSTATE 22P02 (invalid_text_representation). SQL Server's procedure raises 51002. Valid JSON that
  is not an object or array (42, "x", null) is invalid_payload on both (ISJSON's rule on 2017-2019).
- SQL Server has no session time zone; the PostgreSQL time-zone test sets one that is far from UTC.
"""
from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

import pytest

from tablequeue.client import QueueClient
from tablequeue.errors import QUEUE_ERRORS

# kind variant -> catalog entry (without name/payload); "fifo_strict" is fifo with strict: true.
VARIANTS: dict[str, dict[str, Any]] = {
    "heap": {"kind": "heap"},
    "fifo": {"kind": "fifo"},
    "fifo_strict": {"kind": "fifo", "options": {"strict": True}},
    "lifo": {"kind": "lifo"},
    "pending": {"kind": "pending"},
}
ALL = list(VARIANTS)
ORDERED = ["fifo", "fifo_strict", "lifo", "pending"]
PAYLOADS = ("json", "text", "binary")
UTC = timezone.utc
LOCK_TIMEOUT_SECONDS = 20

SAMPLES: dict[str, list[Any]] = {
    "json": [{"n": 1, "text": "grüße ✓", "list": [1, 2, {"x": None}]}, [1, "two", 3.5], {"n": 3}],
    "text": ["grüße ✓ – text", "", "x" * 20_000],
    "binary": [bytes(range(256)), b"", b"\x00" * 50_000],
}


def queue(variant: str, payload: str = "json", dedupe: bool = False, name: str = "q") -> dict[str, Any]:
    entry = {"name": name, "payload": payload, **VARIANTS[variant]}
    options = dict(entry.get("options", {}))
    if dedupe:
        options["dedupe"] = True
    entry["options"] = options
    return entry


# --- engine-neutral helpers ----------------------------------------------------------------------

def error_code(exc: BaseException) -> str | None:
    """The error a driver reports, as a string: psycopg's SQLSTATE (``exc.sqlstate``), or the SQL
    Server error number pyodbc puts in the message, e.g. ``... got 0. (51001) (SQLExecDirectW)``."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return str(sqlstate)
    text = " ".join(str(arg) for arg in getattr(exc, "args", ())) or str(exc)
    numbers = re.findall(r"\((\d{3,6})\)\s*\(SQL\w+\)", text) or re.findall(r"\((\d{3,6})\)", text)
    return numbers[-1] if numbers else None


def expected_code(dialect: str, key: str, postgres_sqlstate: str | None = None) -> str:
    if dialect == "postgres":
        return postgres_sqlstate or QUEUE_ERRORS[key].postgres
    return str(QUEUE_ERRORS[key].mssql)


@contextmanager
def raises_queue_error(client: QueueClient, key: str, postgres_sqlstate: str | None = None) -> Iterator[None]:
    """Assert that the block fails with the contract error `key` (errors.py) on this engine.
    `postgres_sqlstate` names the documented exception where PostgreSQL itself rejects the value
    before the function runs (invalid JSON: 22P02). A failed transaction is rolled back."""
    expected = expected_code(client.dialect, key, postgres_sqlstate)
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any driver's error class
        code = error_code(exc)
        assert code == expected, f"expected {key} ({expected}), got {code}: {exc}"
        if not _autocommit(client.conn):
            client.conn.rollback()
    else:
        pytest.fail(f"expected {key} ({expected}); the call succeeded")


def _autocommit(conn: Any) -> bool:
    return bool(getattr(conn, "autocommit", True))


def as_utc(value: datetime | None) -> datetime | None:
    """timestamptz arrives aware (PostgreSQL), datetime2 naive UTC (SQL Server)."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def payload_of(client: QueueClient, value: Any) -> Any:
    if client.queue.payload == "json" and isinstance(value, str):
        return json.loads(value)
    if client.queue.payload == "binary" and value is not None:
        return bytes(value)
    return value


def ids(rows: list[dict]) -> list[int]:
    return [row["id"] for row in rows]


@dataclass
class Env:
    """One deployed catalog and the connections a test opened on it (closed before the schema is dropped)."""

    deployed: Any
    connections: list[Any] = field(default_factory=list)

    @property
    def dialect(self) -> str:
        return self.deployed.dialect

    def client(self, name: str = "q", autocommit: bool = True) -> QueueClient:
        conn = self.deployed.connect(autocommit=autocommit)
        self.connections.append(conn)
        # A claim that wrongly waits on another consumer fails the test instead of hanging it.
        if self.dialect == "postgres":
            conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_SECONDS}s'")
        else:
            conn.execute(f"SET LOCK_TIMEOUT {LOCK_TIMEOUT_SECONDS * 1000}")
        if not autocommit:
            conn.commit()
        return self.deployed.client(name, conn)

    def close(self) -> None:
        for conn in self.connections:
            try:
                if not _autocommit(conn):
                    conn.rollback()
                conn.close()
            except Exception:  # noqa: BLE001 - best effort: the schema is emptied before its next use, or dropped
                pass


@pytest.fixture
def deploy(deploy_queues: Callable[..., Any]) -> Iterator[Callable[..., Env]]:
    envs: list[Env] = []

    def _deploy(*queues: dict[str, Any]) -> Env:
        env = Env(deploy_queues(*queues, reuse=True))
        envs.append(env)
        return env

    yield _deploy
    for env in envs:
        env.close()


def server_now(env: Env) -> datetime:
    """The database's UTC clock, read through the contract (a pending enqueue without due_at is due
    at the server's now): tests that need a time relative to the server do not trust the client's
    clock, which may be skewed against a remote SQL Server."""
    probe = env.client("clock")
    probe.enqueue({"probe": True} if probe.queue.payload == "json" else "probe")
    return as_utc(probe.dequeue()[0]["due_at"])


CLOCK = {"name": "clock", "kind": "pending", "payload": "json"}


# --- enqueue and dequeue -------------------------------------------------------------------------

@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("variant", ALL)
def test_a_message_is_handed_out_once_with_its_payload_and_utc_times(deploy, variant, payload) -> None:
    env = deploy(queue(variant, payload))
    client = env.client()
    before = datetime.now(UTC)
    sent = [client.enqueue(sample) for sample in SAMPLES[payload]]
    after = datetime.now(UTC)

    assert not any(row["duplicate"] for row in sent)
    assert len({row["id"] for row in sent}) == len(sent)
    got = client.dequeue(batch_size=10)
    assert sorted(ids(got)) == sorted(row["id"] for row in sent)
    by_id = {row["id"]: row for row in got}
    for row, sample in zip(sent, SAMPLES[payload]):
        message = by_id[row["id"]]
        assert payload_of(client, message["payload"]) == sample
        # The server's clock and the client's are the same machine for PostgreSQL; allow skew.
        enqueued_at = as_utc(message["enqueued_at"])
        assert before - timedelta(minutes=2) <= enqueued_at <= after + timedelta(minutes=2)
        if variant == "pending":
            assert as_utc(message["due_at"]) >= enqueued_at - timedelta(seconds=1)
        else:
            assert "due_at" not in message
    assert client.dequeue(batch_size=10) == []


@pytest.mark.parametrize("variant", ALL)
def test_dequeue_on_an_empty_queue_returns_no_rows(deploy, variant) -> None:
    client = deploy(queue(variant)).client()
    assert client.dequeue() == []
    assert client.dequeue(batch_size=1000) == []


@pytest.mark.parametrize("variant", ALL)
def test_dequeue_hands_out_batch_size_messages_in_the_kind_order(deploy, variant) -> None:
    env = deploy(queue(variant), CLOCK)
    client = env.client()
    if variant == "pending":
        # Due times run backwards against enqueue order: the earliest due must come first.
        now = server_now(env)
        dues = [now - timedelta(minutes=m) for m in (1, 5, 3, 4, 2)]
        sent = ids([client.enqueue({"i": i}, due_at=due) for i, due in enumerate(dues)])
        expected = [i for _, i in sorted(zip(dues, sent))]
    else:
        sent = ids([client.enqueue({"i": i}) for i in range(5)])
        expected = list(reversed(sent)) if variant == "lifo" else sent

    first = client.dequeue(batch_size=2)
    rest = client.dequeue(batch_size=10)

    assert len(first) == 2 and len(rest) == 3
    if variant == "heap":
        assert sorted(ids(first) + ids(rest)) == sorted(sent)  # no order promised, exactly once
    else:
        assert ids(first) == expected[:2]
        assert ids(rest) == expected[2:]
    assert client.dequeue(batch_size=10) == []


@pytest.mark.parametrize("variant", ALL)
def test_batches_of_one_hand_out_every_message_once_in_the_kind_order(deploy, variant) -> None:
    # Batch size 1 runs its own claim statement (a literal LIMIT 1 on PostgreSQL): the same order,
    # the same due filter, the same skip of held rows as any other batch size.
    env = deploy(queue(variant), CLOCK)
    client = env.client()
    if variant == "pending":
        now = server_now(env)
        dues = [now - timedelta(minutes=m) for m in (1, 5, 3, 4, 2)]
        sent = ids([client.enqueue({"i": i}, due_at=due) for i, due in enumerate(dues)])
        expected = [i for _, i in sorted(zip(dues, sent))]
        client.enqueue({"i": "tomorrow"}, due_at=now + timedelta(days=1))
    else:
        sent = ids([client.enqueue({"i": i}) for i in range(5)])
        expected = list(reversed(sent)) if variant == "lifo" else sent

    holder = env.client(autocommit=False)
    held = holder.dequeue(batch_size=1)
    got = list(held)
    if variant != "fifo_strict":  # strict FIFO would wait for the holder: its own test covers that
        while (one := client.dequeue(batch_size=1)):
            assert len(one) == 1
            got.extend(one)
    holder.conn.commit()
    got.extend(row for _ in range(len(sent)) for row in client.dequeue(batch_size=1))

    assert len(held) == 1
    if variant == "heap":
        assert sorted(ids(got)) == sorted(sent)
    else:
        assert ids(got) == expected
    assert client.dequeue(batch_size=1) == []


@pytest.mark.parametrize("variant", ALL)
def test_batch_size_1000_is_the_largest_batch(deploy, variant) -> None:
    client = deploy(queue(variant)).client()
    sent = client.enqueue_batch({"payload": {"i": i}} for i in range(1000))
    sent += client.enqueue_batch([{"payload": {"i": 1000}}])
    assert len(client.dequeue(batch_size=1000)) == 1000
    remaining = client.dequeue(batch_size=1000)
    assert len(remaining) == 1 and remaining[0]["id"] in {row["id"] for row in sent}


# --- enqueue_batch -------------------------------------------------------------------------------

@pytest.mark.parametrize("dedupe", [False, True], ids=["plain", "dedupe"])
@pytest.mark.parametrize("variant", ALL)
def test_enqueue_batch_returns_one_row_per_item_and_keeps_item_order(deploy, variant, dedupe) -> None:
    client = deploy(queue(variant, dedupe=dedupe)).client()
    items = [{"payload": {"i": i}} for i in range(1, 6)]
    if dedupe:
        for i, item in enumerate(items):
            item["dedupe_key"] = f"key-{i}"

    rows = client.enqueue_batch(items)

    assert [row["ordinal"] for row in rows] == [1, 2, 3, 4, 5]
    assert not any(row["duplicate"] for row in rows)
    assert ids(rows) == sorted(ids(rows)) and len(set(ids(rows))) == 5  # ids follow the item order
    got = client.dequeue(batch_size=10)
    by_id = {row["id"]: payload_of(client, row["payload"]) for row in got}
    assert by_id == {row["id"]: {"i": row["ordinal"]} for row in rows}
    if variant in ("fifo", "fifo_strict", "pending"):  # pending: all due now, ties broken by id
        assert ids(got) == ids(rows)
    elif variant == "lifo":
        assert ids(got) == list(reversed(ids(rows)))


@pytest.mark.parametrize("variant", ALL)
def test_an_empty_batch_inserts_nothing(deploy, variant) -> None:
    client = deploy(queue(variant)).client()
    assert client.enqueue_batch([]) == []
    assert client.stats()["ready"] == 0


def test_pending_batch_items_are_handed_out_by_their_own_due_at(deploy) -> None:
    env = deploy(queue("pending"), CLOCK)
    client = env.client()
    now = server_now(env)
    rows = client.enqueue_batch([
        {"payload": {"i": 1}, "due_at": now - timedelta(minutes=1)},
        {"payload": {"i": 2}, "due_at": now + timedelta(hours=1)},
        {"payload": {"i": 3}, "due_at": now - timedelta(minutes=5)},
        {"payload": {"i": 4}},  # no due_at: due at once
    ])
    got = client.dequeue(batch_size=10)
    assert ids(got) == [rows[2]["id"], rows[0]["id"], rows[3]["id"]]
    assert as_utc(got[0]["due_at"]) == now - timedelta(minutes=5)
    stats = client.stats()
    assert (stats["ready"], stats["delayed"]) == (0, 1)


@pytest.mark.parametrize("variant", ALL)
def test_batch_dedupe_reports_existing_and_in_batch_duplicates_with_the_kept_id(deploy, variant) -> None:
    client = deploy(queue(variant, dedupe=True)).client()
    existing = client.enqueue({"first": "a"}, dedupe_key="a")["id"]

    rows = client.enqueue_batch([
        {"payload": {"i": 1}, "dedupe_key": "a"},   # already queued
        {"payload": {"i": 2}, "dedupe_key": "b"},   # new
        {"payload": {"i": 3}, "dedupe_key": "b"},   # same key earlier in this batch
        {"payload": {"i": 4}},                      # no key: never a duplicate
        {"payload": {"i": 5}, "dedupe_key": "c"},   # new
        {"payload": {"i": 6}, "dedupe_key": "a"},   # already queued, again
        {"payload": {"i": 7}},                      # no key
    ])

    assert [row["ordinal"] for row in rows] == list(range(1, 8))
    assert [bool(row["duplicate"]) for row in rows] == [True, False, True, False, False, True, False]
    assert rows[0]["id"] == rows[5]["id"] == existing
    assert rows[2]["id"] == rows[1]["id"]
    assert len({existing, rows[1]["id"], rows[3]["id"], rows[4]["id"], rows[6]["id"]}) == 5
    got = client.dequeue(batch_size=20)
    payloads = sorted(json.dumps(payload_of(client, row["payload"]), sort_keys=True) for row in got)
    assert payloads == sorted(json.dumps(p, sort_keys=True) for p in
                              [{"first": "a"}, {"i": 2}, {"i": 4}, {"i": 5}, {"i": 7}])


# --- dedupe --------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ALL)
def test_enqueue_with_a_queued_dedupe_key_reports_the_existing_id(deploy, variant) -> None:
    client = deploy(queue(variant, "text", dedupe=True)).client()
    first = client.enqueue("one", dedupe_key="order-42")
    again = client.enqueue("two", dedupe_key="order-42")
    other_case = client.enqueue("three", dedupe_key="ORDER-42")   # keys compare exactly, as text
    no_key = [client.enqueue("four"), client.enqueue("five")]

    assert not first["duplicate"] and again["duplicate"]
    assert again["id"] == first["id"]
    assert not other_case["duplicate"] and other_case["id"] != first["id"]
    assert not any(row["duplicate"] for row in no_key) and no_key[0]["id"] != no_key[1]["id"]
    got = client.dequeue(batch_size=10)
    assert sorted(payload_of(client, row["payload"]) for row in got) == ["five", "four", "one", "three"]

    # Once the message is gone, the key is free again.
    fresh = client.enqueue("six", dedupe_key="order-42")
    assert not fresh["duplicate"] and fresh["id"] not in ids(got)


@pytest.mark.parametrize("variant", ["fifo", "pending"])
def test_a_dedupe_key_of_200_characters_is_accepted_and_201_is_invalid(deploy, variant) -> None:
    client = deploy(queue(variant, dedupe=True)).client()
    assert not client.enqueue({"ok": 1}, dedupe_key="k" * 200)["duplicate"]
    assert client.enqueue({"ok": 2}, dedupe_key="k" * 200)["duplicate"]
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue({"too": "long"}, dedupe_key="k" * 201)
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue_batch([{"payload": {"i": 1}, "dedupe_key": "a"},
                              {"payload": {"i": 2}, "dedupe_key": "x" * 201}])
    assert client.stats()["ready"] == 1  # the failed batch left nothing behind


@pytest.mark.parametrize("variant", ALL)
def test_a_dedupe_key_for_a_queue_without_dedupe_is_invalid(deploy, variant) -> None:
    client = deploy(queue(variant)).client()
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue({"i": 1}, dedupe_key="k")
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue_batch([{"payload": {"i": 1}}, {"payload": {"i": 2}, "dedupe_key": "k"}])
    assert client.stats()["ready"] == 0


# --- argument errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [0, -1, 1001, None], ids=["0", "-1", "1001", "NULL"])
@pytest.mark.parametrize("variant", ALL)
def test_batch_size_outside_1_to_1000_is_invalid_argument(deploy, variant, batch_size) -> None:
    client = deploy(queue(variant)).client()
    client.enqueue({"keep": True})
    with raises_queue_error(client, "invalid_argument"):
        # required=: pass NULL itself, not "leave the parameter out" (which means the default, 1).
        client.call("dequeue", {"batch_size": batch_size}, required=("batch_size",))
    assert len(client.dequeue()) == 1  # the message was not touched


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("variant", ALL)
def test_a_null_payload_is_invalid_payload_and_a_batch_with_one_inserts_nothing(deploy, variant, payload) -> None:
    client = deploy(queue(variant, payload)).client()
    with raises_queue_error(client, "invalid_payload"):
        client.enqueue(None)
    good = SAMPLES[payload][0]
    with raises_queue_error(client, "invalid_payload"):
        client.enqueue_batch([{"payload": good}, {"payload": None}, {"payload": good}])
    assert client.stats()["ready"] == 0
    assert client.dequeue(batch_size=10) == []


@pytest.mark.parametrize("variant", ALL)
def test_invalid_json_is_rejected(deploy, variant) -> None:
    client = deploy(queue(variant, "json")).client()
    # PostgreSQL: the jsonb argument itself refuses the text (22P02) before the function runs.
    for bad in ('{"unterminated": ', "not json", ""):
        with raises_queue_error(client, "invalid_payload", postgres_sqlstate="22P02"):
            client.enqueue(bad)
        with raises_queue_error(client, "invalid_payload", postgres_sqlstate="22P02"):
            client.enqueue_batch([{"payload": {"ok": 1}}, {"payload": bad}])
    # Valid JSON that is not an object or array: refused by the procedure on both engines.
    for scalar in ("42", '"text"', "null", "true"):
        with raises_queue_error(client, "invalid_payload"):
            client.enqueue(scalar)
        with raises_queue_error(client, "invalid_payload"):
            client.enqueue_batch([{"payload": {"ok": 1}}, {"payload": scalar}])
    assert client.stats()["ready"] == 0


# --- transactions --------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ALL)
def test_a_rolled_back_dequeue_puts_the_message_back(deploy, variant) -> None:
    env = deploy(queue(variant))
    producer = env.client()
    sent = ids([producer.enqueue({"i": i}) for i in range(3)])
    consumer = env.client(autocommit=False)

    taken = consumer.dequeue(batch_size=2)
    assert len(taken) == 2
    consumer.conn.rollback()

    again = consumer.dequeue(batch_size=10)
    consumer.conn.commit()
    assert sorted(ids(again)) == sorted(sent)
    if variant != "heap":
        assert ids(taken) == ids(again)[:2]  # back in its place, handed out first again
    assert producer.dequeue() == []


@pytest.mark.parametrize("dedupe", [False, True], ids=["plain", "dedupe"])
@pytest.mark.parametrize("variant", ALL)
def test_an_enqueue_in_a_rolled_back_caller_transaction_leaves_nothing(deploy, variant, dedupe) -> None:
    env = deploy(queue(variant, dedupe=dedupe))
    caller = env.client(autocommit=False)
    key = "k" if dedupe else None
    caller.enqueue({"i": 1}, dedupe_key=key)
    caller.enqueue_batch([{"payload": {"i": 2}, "dedupe_key": "k2" if dedupe else None}, {"payload": {"i": 3}}])
    caller.conn.rollback()

    observer = env.client()
    assert observer.dequeue(batch_size=10) == []
    assert observer.stats()["ready"] == 0
    if dedupe:  # the rolled-back key is free
        assert not observer.enqueue({"i": 4}, dedupe_key="k")["duplicate"]


@pytest.mark.parametrize("variant", ALL)
def test_an_enqueue_becomes_visible_when_the_caller_commits(deploy, variant) -> None:
    env = deploy(queue(variant))
    caller = env.client(autocommit=False)
    sent = caller.enqueue({"i": 1})["id"]
    caller.conn.commit()
    assert ids(env.client().dequeue()) == [sent]


@pytest.mark.parametrize("variant", ["heap", "fifo", "lifo", "pending"])
def test_a_message_held_by_one_consumer_is_skipped_by_the_others(deploy, variant) -> None:
    env = deploy(queue(variant))
    producer = env.client()
    sent = ids([producer.enqueue({"i": i}) for i in range(3)])
    first, second = env.client(autocommit=False), env.client(autocommit=False)

    held = first.dequeue()
    other = second.dequeue(batch_size=10)   # must not wait for `first`, must not see its message

    assert len(held) == 1 and len(other) == 2
    assert sorted(ids(held) + ids(other)) == sorted(sent)
    second.conn.commit()
    first.conn.rollback()
    assert ids(producer.dequeue(batch_size=10)) == ids(held)


@pytest.mark.parametrize("variant", ["heap", "fifo", "pending"])
def test_a_message_another_consumer_rolls_back_is_next_for_a_consumer_that_went_on(deploy, variant) -> None:
    # PostgreSQL claims from a position each session keeps (docs/queue-kinds.md): a message held by
    # someone else while this consumer went past it must still lie at or after that position.
    env = deploy(queue(variant))
    producer = env.client()
    sent = ids([producer.enqueue({"i": i}) for i in range(4)])
    holder, consumer = env.client(autocommit=False), env.client()

    held = holder.dequeue()
    assert len(held) == 1
    first = consumer.dequeue()
    holder.conn.rollback()

    second = consumer.dequeue()
    if variant == "heap":
        rest = consumer.dequeue(batch_size=10)
        assert sorted(ids(first) + ids(second) + ids(rest)) == sorted(sent)
    else:
        assert ids(held) == sent[:1] and ids(first) == sent[1:2]
        assert ids(second) == sent[:1]          # the oldest again, before anything after it
        assert ids(consumer.dequeue(batch_size=10)) == sent[2:]
    assert consumer.dequeue() == []


@pytest.mark.parametrize("variant", ["heap", "fifo", "lifo", "pending"])
def test_an_enqueue_committed_after_later_ones_were_handed_out_is_not_left_behind(deploy, variant) -> None:
    # Its id (and due time) were drawn before those of messages a consumer has already taken: it
    # sorts before that consumer's claim position on PostgreSQL, which is found again within a
    # second. Lax order under concurrency, but never a lost message. (Strict FIFO on SQL Server
    # waits for the uncommitted enqueue instead: not a single-threaded test.)
    env = deploy(queue(variant))
    slow, producer, consumer = env.client(autocommit=False), env.client(), env.client()
    late = slow.enqueue({"i": "late"})["id"]
    early = ids([producer.enqueue({"i": i}) for i in range(3)])
    first = ids(consumer.dequeue(batch_size=2))
    assert len(first) == 2 and late not in first
    slow.conn.commit()

    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(first) + len(got) < 4 and time.monotonic() < deadline:
        got += ids(consumer.dequeue(batch_size=10))
        time.sleep(0.1)
    assert sorted(first + got) == sorted(early + [late])
    assert consumer.dequeue(batch_size=10) == []


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_strict_fifo_consumer_waits_for_the_holder_then_continues_in_order(deploy, outcome) -> None:
    env = deploy(queue("fifo_strict"))
    producer = env.client()
    sent = ids([producer.enqueue({"i": i}) for i in range(3)])
    first, second = env.client(autocommit=False), env.client(autocommit=False)
    held = first.dequeue()
    assert ids(held) == sent[:1]

    result: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: result.update(rows=second.dequeue()), daemon=True)
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive(), "a strict FIFO consumer must wait while an earlier message is held"

    getattr(first.conn, outcome)()
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    second.conn.commit()
    expected = sent[1] if outcome == "commit" else sent[0]
    assert ids(result["rows"]) == [expected]


def test_strict_fifo_hands_out_an_id_committed_late_before_higher_ids(deploy) -> None:
    # 0.1.0 on PostgreSQL: a strict consumer that found nothing while id 1 was uncommitted stored a
    # claim position past it, then handed out id 2 first and id 1 only a second later.
    # PostgreSQL does not see the uncommitted id 1 (the first dequeue returns nothing); SQL Server's
    # strict claim waits for it (the dequeue returns id 1 once the producer commits).
    env = deploy(queue("fifo_strict"))
    slow, producer, consumer = env.client(autocommit=False), env.client(), env.client()
    first_id = slow.enqueue({"i": 1})["id"]
    handed_out: list[Any] = []
    waiter = threading.Thread(target=lambda: handed_out.extend(ids(consumer.dequeue())), daemon=True)
    waiter.start()
    waiter.join(timeout=0.5)
    slow.conn.commit()
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    second_id = producer.enqueue({"i": 2})["id"]
    assert first_id < second_id
    handed_out += ids(consumer.dequeue()) + ids(consumer.dequeue())
    assert handed_out == [first_id, second_id]


@pytest.mark.parametrize("variant", ALL)
def test_a_manual_commit_caller_enqueues_with_keys_and_dequeues_in_its_own_transaction(deploy, variant) -> None:
    # ODBC/JDBC with autocommit off run SQL Server sessions in IMPLICIT_TRANSACTIONS mode: a keyed
    # enqueue's BEGIN TRANSACTION at @@TRANCOUNT = 0 opened a second level there (error 266, 0.1.0).
    env = deploy(queue(variant, dedupe=True))
    caller, observer = env.client(autocommit=False), env.client()
    first = caller.enqueue({"i": 1}, dedupe_key="k1")["id"]
    rest = ids(caller.enqueue_batch([{"payload": {"i": 2}, "dedupe_key": "k2"}, {"payload": {"i": 3}}]))
    assert observer.stats()["ready"] == 0    # uncommitted: invisible (PostgreSQL), skipped by READPAST (SQL Server)
    caller.conn.commit()
    assert observer.stats()["ready"] == 3
    assert sorted(ids(caller.dequeue(batch_size=10))) == sorted([first, *rest])
    caller.conn.rollback()                   # the caller's decision: the messages are back
    assert observer.stats()["ready"] == 3


@pytest.mark.parametrize("variant", ALL)
def test_a_batch_of_more_than_1000_items_is_invalid_argument(deploy, variant) -> None:
    # Past ~5,000 rows SQL Server escalates to a table lock that READPAST cannot skip; every batch
    # of every verb is capped at 1,000 in both dialects.
    client = deploy(queue(variant, dedupe=True)).client()
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue_batch({"payload": {"i": i}, "dedupe_key": f"k{i}"} for i in range(1001))
    assert client.stats()["ready"] == 0


@pytest.mark.parametrize("variant", ALL)
def test_a_dequeue_in_a_repeatable_read_transaction_is_refused_or_reads_committed(deploy, variant) -> None:
    # PostgreSQL cannot change the level inside a function: it refuses (a claim position found in an
    # old snapshot could hide messages committed since). SQL Server's procedure switches to READ
    # COMMITTED for its own statements (reset on return) and claims.
    env = deploy(queue(variant))
    producer, consumer = env.client(), env.client(autocommit=False)
    sent = producer.enqueue({"i": 1})["id"]
    consumer.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    if env.dialect == "postgres":
        with raises_queue_error(consumer, "isolation_level"):
            consumer.dequeue()
        assert ids(producer.dequeue()) == [sent]
    else:
        assert ids(consumer.dequeue()) == [sent]
        consumer.conn.commit()


# --- stats ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ALL)
def test_stats_of_an_empty_queue(deploy, variant) -> None:
    stats = deploy(queue(variant)).client().stats()
    assert (stats["ready"], stats["delayed"], stats["in_flight"], stats["dead"]) == (0, 0, 0, 0)
    assert stats["oldest_ready_age_seconds"] is None
    assert not stats["estimated"]


@pytest.mark.parametrize("variant", ALL)
def test_stats_count_ready_messages_and_the_age_of_the_oldest(deploy, variant) -> None:
    env = deploy(queue(variant), CLOCK)
    client = env.client()
    for i in range(3):
        client.enqueue({"i": i})
    time.sleep(0.2)

    stats = client.stats()

    assert (stats["ready"], stats["delayed"], stats["in_flight"], stats["dead"]) == (3, 0, 0, 0)
    assert 0.2 <= stats["oldest_ready_age_seconds"] < 60
    assert not stats["estimated"]
    client.dequeue()
    assert client.stats()["ready"] == 2


def test_stats_of_a_pending_queue_split_due_and_delayed_and_age_counts_from_due_at(deploy) -> None:
    env = deploy(queue("pending"), CLOCK)
    client = env.client()
    now = server_now(env)
    client.enqueue({"due": "an hour ago"}, due_at=now - timedelta(hours=1))
    client.enqueue({"due": "now"})
    for hours in (1, 2, 3):
        client.enqueue({"due": f"in {hours} h"}, due_at=now + timedelta(hours=hours))

    stats = client.stats()

    assert (stats["ready"], stats["delayed"]) == (2, 3)
    assert 3600 <= stats["oldest_ready_age_seconds"] < 3600 + 60
    assert (stats["in_flight"], stats["dead"]) == (0, 0)


# --- purge ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ALL)
def test_purge_without_older_than_removes_every_message(deploy, variant) -> None:
    client = deploy(queue(variant)).client()
    client.enqueue_batch({"payload": {"i": i}} for i in range(25))
    assert client.purge() == 25
    assert client.stats()["ready"] == 0
    assert client.dequeue(batch_size=100) == []
    assert client.purge() == 0


@pytest.mark.parametrize("variant", ALL)
def test_purge_takes_at_most_max_rows_oldest_first(deploy, variant) -> None:
    client = deploy(queue(variant)).client()
    sent = ids(client.enqueue_batch({"payload": {"i": i}} for i in range(5)))
    assert client.purge(max_rows=2) == 2
    assert client.purge(max_rows=2) == 2
    assert ids(client.dequeue(batch_size=10)) == sent[4:]
    with raises_queue_error(client, "invalid_argument"):
        client.purge(max_rows=0)


@pytest.mark.parametrize("variant", ALL)
def test_purge_needs_max_rows_inside_a_callers_transaction(deploy, variant) -> None:
    env = deploy(queue(variant))
    caller = env.client(autocommit=False)
    caller.enqueue({"i": 1})   # a transaction that has written (all PostgreSQL can tell)
    with raises_queue_error(caller, "invalid_argument"):
        caller.purge()
    caller.enqueue({"i": 2})
    assert caller.purge(max_rows=10) == 1
    caller.conn.commit()
    assert env.client().purge() == 0


@pytest.mark.parametrize("variant", ALL)
def test_purge_older_than_removes_only_messages_enqueued_before_it(deploy, variant) -> None:
    env = deploy(queue(variant))
    client = env.client()
    old = ids([client.enqueue({"age": "old"}) for _ in range(2)])
    # The cut-off is read from the server (enqueued_at of the old messages, by a dequeue that is
    # rolled back), so client/server clock skew cannot move it.
    reader = env.client(autocommit=False)
    cutoff = max(as_utc(row["enqueued_at"]) for row in reader.dequeue(batch_size=10)) + timedelta(microseconds=1)
    reader.conn.rollback()
    time.sleep(0.05)
    new = client.enqueue({"age": "new"})["id"]

    assert client.purge(older_than=cutoff) == 2
    remaining = client.dequeue(batch_size=10)
    assert ids(remaining) == [new] and new not in old


@pytest.mark.parametrize("variant", ALL)
def test_purge_leaves_a_message_a_consumer_holds(deploy, variant) -> None:
    env = deploy(queue(variant))
    producer = env.client()
    producer.enqueue_batch({"payload": {"i": i}} for i in range(4))
    consumer = env.client(autocommit=False)
    held = ids(consumer.dequeue())

    assert producer.purge() == 3      # does not wait for, nor count, the held message
    consumer.conn.rollback()
    assert ids(producer.dequeue(batch_size=10)) == held


# --- pending and time ----------------------------------------------------------------------------

def test_pending_hands_out_nothing_before_its_due_at(deploy) -> None:
    env = deploy(queue("pending"), CLOCK)
    client = env.client()
    now = server_now(env)
    later = client.enqueue({"due": "soon"}, due_at=now + timedelta(seconds=2))["id"]
    client.enqueue({"due": "tomorrow"}, due_at=now + timedelta(days=1))

    assert client.dequeue(batch_size=10) == []
    deadline = time.monotonic() + 30
    got: list[dict] = []
    while not got and time.monotonic() < deadline:
        time.sleep(0.2)
        got = client.dequeue(batch_size=10)
    assert ids(got) == [later]
    assert as_utc(got[0]["due_at"]) == now + timedelta(seconds=2)
    assert server_now(env) >= now + timedelta(seconds=2)
    assert client.dequeue(batch_size=10) == []


@pytest.mark.parametrize("how", ["enqueue", "enqueue_batch"])
def test_pending_hands_out_a_message_due_in_the_past_before_later_ones_after_a_dequeue(deploy, how) -> None:
    # The consumer has dequeued before, so on PostgreSQL it claims from a position past the first
    # message; a message enqueued with a due time before that position must still come first.
    env = deploy(queue("pending"), CLOCK)
    client = env.client()
    now = server_now(env)
    first, second = ids([client.enqueue({"i": i}, due_at=now - timedelta(minutes=m)) for i, m in ((0, 2), (1, 1))])
    tomorrow = client.enqueue({"i": "tomorrow"}, due_at=now + timedelta(days=1))["id"]
    assert ids(client.dequeue()) == [first]

    if how == "enqueue":
        overdue = client.enqueue({"i": "overdue"}, due_at=now - timedelta(hours=1))["id"]
    else:
        overdue = client.enqueue_batch([{"payload": {"i": "overdue"}, "due_at": now - timedelta(hours=1)}])[0]["id"]
    assert ids(client.dequeue()) == [overdue]
    assert ids(client.dequeue(batch_size=10)) == [second]
    assert tomorrow not in ids(client.dequeue(batch_size=10))


def test_pending_position_is_kept_exactly_for_messages_sharing_a_due_time(deploy) -> None:
    # Many messages due at the same instant (a bulk schedule): the claim position is a (due_at, id)
    # pair, so a consumer moving through them neither skips nor repeats one.
    env = deploy(queue("pending"), CLOCK)
    client, other = env.client(), env.client()
    due = server_now(env) - timedelta(seconds=30)
    sent = [row["id"] for row in client.enqueue_batch([{"payload": {"i": i}, "due_at": due} for i in range(40)])]
    got: list[Any] = []
    for round_ in range(10):
        got += ids(client.dequeue(batch_size=3))
        got += ids(other.dequeue(batch_size=1))
    got += ids(client.dequeue(batch_size=10))
    assert sorted(got) == sorted(sent) and len(got) == len(set(got))


@pytest.mark.parametrize("variant", ["fifo", "pending"])
def test_times_are_utc_whatever_the_session_time_zone(deploy, variant) -> None:
    env = deploy(queue(variant), CLOCK)
    client = env.client()
    if env.dialect == "postgres":
        # +13:45 in November: a value read or written as local time would be off by hours.
        client.conn.execute("SET TIME ZONE 'Pacific/Chatham'")
        assert client.conn.execute("SHOW TimeZone").fetchone()[0] == "Pacific/Chatham"
    before = datetime.now(UTC)
    if variant == "pending":
        due = before.replace(microsecond=0) - timedelta(minutes=10)
        client.enqueue({"i": 1}, due_at=due)
        future = client.enqueue({"i": 2}, due_at=before + timedelta(hours=3))["id"]
    else:
        client.enqueue({"i": 1})
    got = client.dequeue(batch_size=10)
    after = datetime.now(UTC)

    assert len(got) == 1
    enqueued_at = as_utc(got[0]["enqueued_at"])
    assert before - timedelta(minutes=2) <= enqueued_at <= after + timedelta(minutes=2)
    if variant == "pending":
        assert as_utc(got[0]["due_at"]) == due
        assert future not in ids(got) and client.stats()["delayed"] == 1


# --- wait (DESIGN.md §3b) -------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ALL)
def test_wait_is_true_only_while_a_message_nobody_holds_is_ready(deploy, variant) -> None:
    env = deploy(queue(variant))
    waiter, producer, consumer = env.client(), env.client(autocommit=False), env.client(autocommit=False)
    assert waiter.wait(0) is False and waiter.wait(200) is False
    producer.enqueue({"i": 1})                          # not committed yet
    assert waiter.wait(200) is False
    producer.conn.commit()
    assert waiter.wait(200) is True

    held = consumer.dequeue()                           # consumed by an open transaction
    assert len(held) == 1 and waiter.wait(200) is False
    consumer.conn.rollback()                            # back in the queue
    assert waiter.wait(200) is True and waiter.wait(0) is True


def test_wait_is_false_for_a_pending_message_not_due_and_true_once_it_is(deploy) -> None:
    env = deploy(queue("pending"), CLOCK)
    waiter = env.client()
    waiter.enqueue({"i": 1}, due_at=server_now(env) + timedelta(seconds=1))
    assert waiter.wait(0) is False
    assert waiter.wait(10_000) is True
    assert len(waiter.dequeue()) == 1


@pytest.mark.parametrize("variant", ALL)
def test_wait_with_the_first_message_held_is_ready_for_the_next_one(deploy, variant) -> None:
    # Strict FIFO too: ready means a message nobody holds is there. Its dequeue then waits for the
    # held head, as a strict dequeue always does (SQL Server cannot see a held head without waiting
    # for it, so neither engine's wait tries).
    env = deploy(queue(variant))
    waiter, consumer = env.client(), env.client(autocommit=False)
    for i in range(2):
        waiter.enqueue({"i": i})
    held = consumer.dequeue()
    assert len(held) == 1
    assert waiter.wait(200) is True
    consumer.conn.rollback()
