"""Conformance: message groups (option groups on fifo and work; DESIGN.md §3b, docs/queue-kinds.md).

Engine-agnostic: every test runs once per configured engine and talks to the queue through
tablequeue.client only. A group's messages are handed out one at a time in enqueue order; different
groups and messages without a group are served beside them; a dead message unblocks its group.
An engine whose templates do not render groups yet (tablequeue.render.GROUPS_RENDERED) is skipped,
by name, so that the count of what did not run says so.
"""
from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

from tablequeue.client import QueueClient
from tablequeue.render import GROUPS_RENDERED

from test_work import (LOCK_TIMEOUT_SECONDS, Env, deploy, ids, raises_queue_error,  # noqa: F401 - deploy is a fixture
                       server_now, started)

# The time a call that must not wait gets: far below LOCK_TIMEOUT_SECONDS, far above a call's cost.
NO_WAIT_MS = 2000


def grouped(kind: str, **options: Any) -> dict[str, Any]:
    return {"name": "q", "kind": kind, "payload": "json", "options": {"groups": True, **options}}


@pytest.fixture
def grouped_deploy(deploy: Callable[..., Env]) -> Callable[..., Env]:
    def _deploy(kind: str, **options: Any) -> Env:
        env = deploy(grouped(kind, **options))
        if (env.dialect, kind) not in GROUPS_RENDERED:
            pytest.skip(f"the {env.dialect} templates of kind {kind} do not render message groups yet")
        return env
    return _deploy


def no_wait(client: QueueClient) -> None:
    """Make the client's next calls fail fast instead of waiting on a lock (they must not wait)."""
    if client.dialect == "postgres":
        client.conn.execute(f"SET lock_timeout = '{NO_WAIT_MS}ms'")
    else:
        client.conn.execute(f"SET LOCK_TIMEOUT {NO_WAIT_MS}")


def keys(rows: list[dict]) -> list[Any]:
    return [row["group_key"] for row in rows]


# --- both kinds ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_dequeue_returns_the_group_key_and_a_batch_holds_one_message_per_group(grouped_deploy, kind) -> None:
    client = grouped_deploy(kind).client()
    sent = [client.enqueue({"n": n}, group_key=group) for n, group in
            enumerate(["a", "a", None, "b", "a", None, "b"])]

    batch = client.dequeue(batch_size=10, worker="w") if kind == "work" else client.dequeue(batch_size=10)

    # The oldest message of each group, and every message without a group.
    assert sorted(ids(batch)) == sorted(ids([sent[0], sent[2], sent[3], sent[5]]))
    assert sorted(keys(batch), key=str) == sorted(["a", None, "b", None], key=str)


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_a_batch_hands_out_a_later_group_with_one_message_after_a_group_with_two(grouped_deploy, kind) -> None:
    """Review of SQL Server work groups, M1: the head search kept the previous group's tie when a probe
    found nothing, so b (one message, nothing waiting behind it) after a (two) got no head."""
    client = grouped_deploy(kind).client()
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(2)])
    b = client.enqueue({"n": 0}, group_key="b")["id"]

    batch = client.dequeue(batch_size=10, worker="w") if kind == "work" else client.dequeue(batch_size=10)

    assert sorted(map(str, ids(batch))) == sorted(map(str, [a[0], b]))


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_a_group_is_handed_out_in_enqueue_order_one_message_at_a_time(grouped_deploy, kind) -> None:
    client = grouped_deploy(kind).client()
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(4)])
    b = ids(client.enqueue_batch([{"payload": {"n": n}, "group_key": "b"} for n in range(4)]))

    order: dict[str, list[Any]] = {"a": [], "b": []}
    for _ in range(4):
        batch = client.dequeue(batch_size=10, worker="w") if kind == "work" else client.dequeue(batch_size=10)
        assert sorted(keys(batch)) == ["a", "b"]
        for row in batch:
            order[row["group_key"]].append(row["id"])
            if kind == "work":
                assert client.complete(row["id"], "w", row["lease_token"])
    assert order == {"a": a, "b": b}


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_a_group_key_over_200_characters_is_refused(grouped_deploy, kind) -> None:
    client = grouped_deploy(kind).client()
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue({"n": 1}, group_key="k" * 201)
    with raises_queue_error(client, "invalid_argument"):
        client.enqueue_batch([{"payload": {"n": 1}, "group_key": "k"}, {"payload": {"n": 2}, "group_key": "k" * 201}])
    assert client.enqueue({"n": 3}, group_key="k" * 200)["id"] is not None


# --- fifo: the consumer's transaction holds the group ----------------------------------------------

def test_fifo_a_group_is_held_until_the_dequeuing_transaction_ends_and_a_rollback_gives_it_back(
        grouped_deploy) -> None:
    env = grouped_deploy("fifo")
    producer, other = env.client(), env.client()
    holder = env.client(autocommit=False)
    a = ids([producer.enqueue({"n": n}, group_key="a") for n in range(3)])
    b = producer.enqueue({"n": 0}, group_key="b")["id"]

    assert ids(holder.dequeue()) == [a[0]]
    # Another consumer steps over the held group without waiting, to the other group.
    no_wait(other)
    assert ids(other.dequeue(batch_size=10)) == [b]
    assert other.dequeue(batch_size=10) == []
    # A producer adds to the held group without waiting.
    no_wait(producer)
    a.append(producer.enqueue({"n": 3}, group_key="a")["id"])

    holder.conn.rollback()
    # Each autocommitted dequeue held the group until it returned: one message of it each time.
    assert [ids(other.dequeue(batch_size=10)) for _ in range(5)] == [[a[0]], [a[1]], [a[2]], [a[3]], []]


def test_fifo_a_producer_creating_a_new_key_below_a_held_group_does_not_wait_for_its_holder(
        grouped_deploy) -> None:
    """A new group's row takes no key-range lock: on SQL Server a range-locked uniqueness check of
    key "a" would take RangeS-U on the next key, "b", and wait for the consumer holding b."""
    env = grouped_deploy("fifo")
    producer = env.client()
    holder = env.client(autocommit=False)
    b = producer.enqueue({"n": 0}, group_key="b")["id"]
    assert ids(holder.dequeue()) == [b]

    no_wait(producer)
    a = producer.enqueue({"n": 1}, group_key="a")["id"]
    a_batch = ids(producer.enqueue_batch([{"payload": {"n": 2}, "group_key": "a0"}]))
    holder.conn.commit()
    assert sorted(ids(producer.dequeue(batch_size=10))) == sorted([a] + a_batch)


def test_fifo_purge_leaves_a_held_group_and_the_group_goes_on_after_it(grouped_deploy) -> None:
    env = grouped_deploy("fifo")
    admin = env.client()
    holder = env.client(autocommit=False)
    a = ids([admin.enqueue({"n": n}, group_key="a") for n in range(3)])
    b = ids([admin.enqueue({"n": n}, group_key="b") for n in range(2)])
    loose = admin.enqueue({"n": 9})["id"]

    assert ids(holder.dequeue()) == [a[0]]
    no_wait(admin)
    assert admin.purge() == len(b) + 1   # b's messages and the one without a group
    holder.conn.commit()
    assert ids(admin.dequeue(batch_size=10)) == [a[1]]
    assert ids(admin.dequeue(batch_size=10)) == [a[2]]
    assert admin.dequeue(batch_size=10) == [] and loose not in a


# --- work: leased, retrying and not-yet-due heads hold their group ---------------------------------

def test_work_a_head_waiting_for_its_retry_holds_its_group(grouped_deploy) -> None:
    client = grouped_deploy("work").client()
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(3)])
    b = client.enqueue({"n": 0}, group_key="b")["id"]

    first = client.dequeue(worker="w")
    assert ids(first) == [a[0]]
    assert client.fail(a[0], "w", "boom", retry_after_seconds=3600, lease_token=first[0]["lease_token"]) == "retrying"
    assert ids(client.dequeue(batch_size=10, worker="w")) == [b]
    assert client.dequeue(batch_size=10, worker="w2") == []


def test_work_a_head_not_yet_due_holds_its_group(grouped_deploy) -> None:
    client = grouped_deploy("work").client()
    later = server_now(client) + timedelta(hours=1)
    delayed = client.enqueue({"n": 0}, group_key="a", due_at=later)["id"]
    client.enqueue({"n": 1}, group_key="a")
    assert client.dequeue(batch_size=10, worker="w") == []
    assert delayed is not None


def test_work_the_head_comes_back_after_a_release_and_the_group_moves_on_when_it_is_dead(grouped_deploy) -> None:
    client = grouped_deploy("work", max_attempts=2).client()
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(3)])
    b = client.enqueue({"n": 0}, group_key="b")["id"]

    first = client.dequeue(batch_size=10, worker="w")
    assert sorted(ids(first)) == sorted([a[0], b])
    lease = {row["id"]: row["lease_token"] for row in first}
    assert client.release(a[0], "w", lease[a[0]]) is True
    again = client.dequeue(batch_size=10, worker="w2")
    assert ids(again) == [a[0]]   # released: the same message, not the next one of its group
    assert client.fail(a[0], "w2", "boom", retry_after_seconds=0, lease_token=again[0]["lease_token"]) == "retrying"
    last = client.dequeue(batch_size=10, worker="w3")
    assert ids(last) == [a[0]] and last[0]["attempts"] == 2
    assert client.fail(a[0], "w3", "boom", lease_token=last[0]["lease_token"]) == "dead"

    # Dead: its group goes on with the next message.
    assert ids(client.dequeue(batch_size=10, worker="w4")) == [a[1]]
    assert [row["id"] for row in client.dead_list()] == [a[0]]


def test_work_a_dead_message_requeued_rejoins_its_group_in_id_order(grouped_deploy) -> None:
    client = grouped_deploy("work", max_attempts=1).client()
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(3)])
    first = client.dequeue(worker="w")
    assert client.fail(a[0], "w", "boom", lease_token=first[0]["lease_token"]) == "dead"
    second = client.dequeue(worker="w2")
    assert ids(second) == [a[1]]

    assert client.dead_requeue(a[0]) is True
    # a[1] is in flight: the group waits for it, then serves a[0] (the lower id) before a[2].
    assert client.dequeue(batch_size=10, worker="w3") == []
    assert client.complete(a[1], "w2", second[0]["lease_token"])
    order = []
    for worker in ("w4", "w5"):
        row = client.dequeue(batch_size=10, worker=worker)
        assert len(row) == 1 and row[0]["group_key"] == "a"
        order.append(row[0]["id"])
        assert client.complete(row[0]["id"], worker, row[0]["lease_token"])
    assert order == [a[0], a[2]]


def test_work_complete_batch_moves_every_group_on(grouped_deploy) -> None:
    client = grouped_deploy("work").client()
    sent = {group: ids([client.enqueue({"n": n}, group_key=group) for n in range(2)]) for group in "abc"}
    first = client.dequeue(batch_size=10, worker="w")
    assert sorted(ids(first)) == sorted(sent[g][0] for g in "abc")

    done = client.complete_batch([{"id": r["id"], "lease_token": r["lease_token"]} for r in first], "w")
    assert all(row["completed"] for row in done)
    assert sorted(ids(client.dequeue(batch_size=10, worker="w2"))) == sorted(sent[g][1] for g in "abc")


def test_work_complete_next_hands_out_the_next_message_of_the_same_group(grouped_deploy) -> None:
    client = grouped_deploy("work").client()
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(2)])
    first = client.dequeue(worker="w")
    completed, rows = client.complete_next(a[0], "w", first[0]["lease_token"])
    assert completed and ids(rows) == [a[1]] and rows[0]["group_key"] == "a"


def test_work_a_producer_does_not_wait_for_a_consumer_completing_in_the_same_group(grouped_deploy) -> None:
    env = grouped_deploy("work")
    producer, consumer = env.client(), env.client(autocommit=False)
    a = producer.enqueue({"n": 0}, group_key="a")["id"]
    leased = consumer.dequeue(worker="w")
    consumer.conn.commit()
    assert consumer.complete(a, "w", leased[0]["lease_token"])   # its open transaction holds the group

    no_wait(producer)
    later = producer.enqueue({"n": 1}, group_key="a")["id"]
    consumer.conn.commit()
    assert ids(consumer.dequeue(batch_size=10, worker="w2")) == [later]
    consumer.conn.commit()


@pytest.mark.parametrize("verb", ["complete", "complete_batch", "fail", "complete_next"])
def test_work_an_acknowledgement_that_waited_for_its_group_judges_the_lease_after_the_wait(grouped_deploy,
                                                                                           verb) -> None:
    """Review of lease_status (PostgreSQL M1): an acknowledgement waits for its group before it touches
    the message row, so lease_status, which waits only for a message row, answers expired once the
    lease has run out meanwhile. The acknowledgement must then refuse: it had judged the lease by the
    time it started and completed it after the wait."""
    env = grouped_deploy("work")
    client, producer = env.client(), env.client(autocommit=False)
    sent = client.enqueue({"n": 0}, group_key="a")["id"]
    [lease] = client.dequeue(worker="w", lease_seconds=2)
    producer.enqueue({"n": 1}, group_key="a")                  # open: the producer has group a
    acker = env.client()
    token = lease["lease_token"]
    thread, answers = started({"complete": lambda: acker.complete(sent, "w", lease_token=token),
                               "complete_batch": lambda: acker.complete_batch([lease], "w")[0]["completed"],
                               "fail": lambda: acker.fail(sent, "w", "boom", lease_token=token),
                               "complete_next": lambda: acker.complete_next(sent, "w", token)}[verb])
    thread.join(2.5)                                           # the lease runs out meanwhile
    waited = thread.is_alive()
    assert client.lease_status([lease]) == [{"id": sent, "status": "expired"}]
    producer.conn.commit()
    thread.join(LOCK_TIMEOUT_SECONDS + 5)
    assert waited, f"{verb} answered {answers} while a producer held its group"
    if verb == "complete_next":
        # Refused, then its dequeue leases the message again: the old lease is lost.
        [(completed, rows)] = answers
        assert completed is False and ids(rows) == [sent] and rows[0]["lease_token"] != lease["lease_token"]
    else:
        assert answers == [{"fail": "lost"}.get(verb, False)]
        assert client.lease_status([lease]) == [{"id": sent, "status": "expired"}]
        assert sent in ids(client.dequeue(batch_size=10, worker="w2"))
    assert client.lease_status([lease]) == [{"id": sent, "status": "lost"}]


@pytest.mark.parametrize("kind,option", [("fifo", "dedupe"), ("work", "dedupe"), ("work", "client_ids")])
def test_a_batch_whose_first_item_of_a_group_is_a_duplicate_still_leads_to_that_group(grouped_deploy, kind,
                                                                                       option) -> None:
    client = grouped_deploy(kind, **{option: True}).client()
    same = {"dedupe_key": "k"} if option == "dedupe" else {"id": str(uuid.uuid4())}
    queued = client.enqueue({"n": 0}, group_key="a", **same)["id"]
    rows = client.enqueue_batch([{"payload": {"n": 1}, "group_key": "b", **same},
                                 {"payload": {"n": 2}, "group_key": "b"},
                                 {"payload": {"n": 3}, "group_key": "b"}])
    assert rows[0]["id"] == queued and rows[0]["duplicate"]

    batch = client.dequeue(batch_size=10, worker="w") if kind == "work" else client.dequeue(batch_size=10)
    assert sorted(map(str, ids(batch))) == sorted(map(str, [queued, rows[1]["id"]]))


def test_work_an_own_exhausted_lease_in_a_group_a_producer_holds_does_not_stall_the_dequeue(grouped_deploy) -> None:
    """Review of SQL Server work groups, S1: a worker's own expired lease with its attempts spent is
    buried by its next dequeue, which must hold the group first; with the group held by a producer's
    open transaction the dequeue does not wait for it: it serves the other groups, and the message
    is buried once the group is free."""
    env = grouped_deploy("work", max_attempts=1)
    client, producer = env.client(), env.client(autocommit=False)
    spent = client.enqueue({"n": 0}, group_key="a")["id"]
    assert ids(client.dequeue(worker="w", lease_seconds=1)) == [spent]
    b = client.enqueue({"n": 0}, group_key="b")["id"]
    time.sleep(1.2)   # the lease expires: its one attempt is spent
    queued = producer.enqueue({"n": 1}, group_key="a")["id"]   # open: the producer has group a

    no_wait(client)
    served = client.dequeue(batch_size=10, worker="w")
    assert ids(served) == [b]
    assert client.complete(b, "w", served[0]["lease_token"])

    producer.conn.commit()
    assert ids(client.dequeue(batch_size=10, worker="w")) == [queued]
    assert [row["id"] for row in client.dead_list()] == [spent]


def test_work_an_own_exhausted_lease_left_out_is_buried_by_the_next_worker_that_takes_its_group(
        grouped_deploy) -> None:
    """The message the owner's claim left out (its group was held) is not stranded: another worker's
    grouped claim of that group buries it (last worker: the owner) and hands out the group's next."""
    env = grouped_deploy("work", max_attempts=1)
    client, producer = env.client(), env.client(autocommit=False)
    spent = client.enqueue({"n": 0}, group_key="a")["id"]
    assert ids(client.dequeue(worker="w", lease_seconds=1)) == [spent]
    time.sleep(1.2)
    queued = producer.enqueue({"n": 1}, group_key="a")["id"]
    no_wait(client)
    assert client.dequeue(batch_size=10, worker="w") == []
    producer.conn.commit()

    assert ids(client.dequeue(batch_size=10, worker="w2")) == [queued]
    dead = client.dead_list()
    assert [row["id"] for row in dead] == [spent] and dead[0]["last_worker"] == "w"


def test_work_an_own_exhausted_lease_in_a_group_an_acknowledgement_holds_does_not_stall_the_dequeue(
        grouped_deploy) -> None:
    """An acknowledgement holds the groups of what it acknowledges until its transaction ends (even an
    item it cannot complete): the owner's dequeue serves the other groups meanwhile."""
    env = grouped_deploy("work", max_attempts=1)
    client, acker = env.client(), env.client(autocommit=False)
    spent = client.enqueue({"n": 0}, group_key="a")["id"]
    assert ids(client.dequeue(worker="w", lease_seconds=1)) == [spent]
    c = client.enqueue({"n": 0}, group_key="c")["id"]
    leased_c = client.dequeue(worker="x")
    assert ids(leased_c) == [c]
    b = client.enqueue({"n": 0}, group_key="b")["id"]
    time.sleep(1.2)
    acked = acker.complete_batch([{"id": c, "lease_token": leased_c[0]["lease_token"]},
                                  {"id": spent, "lease_token": str(uuid.uuid4())}], "x")
    assert sorted((str(row["id"]), row["completed"]) for row in acked) == sorted([(str(c), True), (str(spent), False)])

    no_wait(client)
    served = client.dequeue(batch_size=10, worker="w")
    assert ids(served) == [b]
    acker.conn.commit()
    assert client.complete(b, "w", served[0]["lease_token"])
    assert client.dequeue(batch_size=10, worker="w") == []
    assert [row["id"] for row in client.dead_list()] == [spent]


def test_work_purge_keeps_the_group_of_a_message_in_flight_that_another_session_has_locked(grouped_deploy) -> None:
    """Re-review of SQL Server work groups, S3: purge's emptiness probes read past a message row that
    extend_lease holds in an open transaction; the group's row was deleted and put back without its
    in-flight message, and a dead message requeued into the group then went out beside it."""
    env = grouped_deploy("work", max_attempts=1)
    client, extender = env.client(), env.client(autocommit=False)
    older = client.enqueue({"n": 0}, group_key="a")["id"]
    first = client.dequeue(worker="w0")
    assert client.fail(older, "w0", "boom", lease_token=first[0]["lease_token"]) == "dead"
    x = client.enqueue({"n": 1}, group_key="a")["id"]
    leased = client.dequeue(worker="w")
    assert ids(leased) == [x]
    assert extender.extend_lease(x, "w", 600, lease_token=leased[0]["lease_token"])   # open: x's row is locked

    no_wait(client)
    assert client.purge(older_than=datetime(1900, 1, 1, tzinfo=timezone.utc)) == 0
    extender.conn.commit()

    assert client.dead_requeue(older) is True
    assert client.dequeue(batch_size=10, worker="w2") == []   # x is still in flight: the group waits
    assert client.complete(x, "w", leased[0]["lease_token"])
    assert ids(client.dequeue(batch_size=10, worker="w2")) == [older]


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_purge_deletes_the_rows_of_emptied_groups_even_when_it_purges_no_message(grouped_deploy, kind) -> None:
    """docs/operations.md: a verb that empties a group leaves its row; purge sweeps them whatever
    older_than selects, and keeps the row of a group that still has messages."""
    env = grouped_deploy(kind)
    client = env.client()
    for group in ("done", "kept"):
        client.enqueue({"n": 0}, group_key=group)
    taken = client.dequeue(worker="w") if kind == "work" else client.dequeue()
    assert [row["group_key"] for row in taken] == ["done"]
    if kind == "work":
        assert client.complete(taken[0]["id"], "w", taken[0]["lease_token"])
    assert sorted(row["group_key"] for row in env.table_rows("_groups", "group_key")) == ["done", "kept"]

    assert client.purge(older_than=datetime(1900, 1, 1, tzinfo=timezone.utc)) == 0

    assert [row["group_key"] for row in env.table_rows("_groups", "group_key")] == ["kept"]


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_wait_finds_a_free_group_behind_a_hundred_candidates_of_a_held_group(grouped_deploy, kind) -> None:
    """Final review of SQL Server work groups, S1: wait read the first 100 due head candidates on every
    step; a hundred spurious candidates of a group a producer holds (each enqueued while it was held
    is a candidate) hid a free group's head for the whole hold. The window now slides."""
    env = grouped_deploy(kind)
    client, holder, producer = env.client(), env.client(autocommit=False), env.client()
    client.enqueue({"n": 0}, group_key="g")          # the group's row exists: the producers below never wait
    holder.enqueue({"n": 1}, group_key="g")          # open: the holder has group g
    no_wait(producer)
    for n in range(100):
        producer.enqueue({"n": 2 + n}, group_key="g")
    free = producer.enqueue({"n": 0}, group_key="f")["id"]

    assert client.wait(wait_ms=2000) is True
    holder.conn.rollback()
    batch = client.dequeue(batch_size=10, worker="w") if kind == "work" else client.dequeue(batch_size=10)
    assert free in ids(batch)


def test_work_a_head_whose_last_lease_expired_goes_dead_and_the_same_dequeue_moves_its_group_on(
        grouped_deploy) -> None:
    client = grouped_deploy("work", max_attempts=1).client()
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(2)])
    assert ids(client.dequeue(worker="w1", lease_seconds=1)) == [a[0]]
    time.sleep(1.2)   # the lease expires: its one attempt is spent

    assert ids(client.dequeue(batch_size=10, worker="w2")) == [a[1]]
    dead = client.dead_list()
    assert [row["id"] for row in dead] == [a[0]] and dead[0]["last_error"] == "lease expired"


def test_work_stats_counts_grouped_and_ungrouped_messages_in_every_state_once(grouped_deploy) -> None:
    client = grouped_deploy("work", max_attempts=1).client()
    later = server_now(client) + timedelta(hours=1)
    a = ids([client.enqueue({"n": n}, group_key="a") for n in range(3)])
    client.enqueue({"n": 0}, group_key="b", due_at=later)     # a head not yet due, and one behind it
    client.enqueue({"n": 1}, group_key="b")
    loose = ids([client.enqueue({"n": n}) for n in range(2)])
    client.enqueue({"n": 2}, due_at=later)

    def figures() -> tuple[int, int, int, int]:
        stats = client.stats()
        assert not stats["estimated"]
        return stats["ready"], stats["delayed"], stats["in_flight"], stats["dead"]

    # ready counts due messages whether or not they wait behind their group's head; only what a
    # dequeue could take ages it.
    assert figures() == (6, 2, 0, 0) and client.stats()["oldest_ready_age_seconds"] >= 0
    taken = client.dequeue(batch_size=10, worker="w")
    assert sorted(ids(taken)) == sorted([a[0], *loose])
    assert figures() == (3, 2, 3, 0) and client.stats()["oldest_ready_age_seconds"] is None
    head = next(m for m in taken if m["id"] == a[0])
    assert client.fail(a[0], "w", "boom", lease_token=head["lease_token"]) == "dead"
    assert figures() == (3, 2, 2, 1)


@pytest.mark.parametrize("grouped, tail", [(10_000, "ungrouped"), (10_001, "grouped")])
def test_work_stats_reads_a_bounded_number_of_grouped_messages_and_says_past_it_that_it_estimates(
        grouped_deploy, grouped: int, tail: str) -> None:
    # Grouped messages are counted among the first 10,001 along the group index (by group key): a
    # delayed message in group z, after them, is not read (delayed is a lower bound) and the figures
    # say they are an estimate. 10,000 of them and one without a group are two exact counts, whose
    # sum past the limit is no estimate.
    client = grouped_deploy("work").client()
    for start in range(0, grouped, 1000):
        client.enqueue_batch([{"payload": {"n": n}, "group_key": f"g{n % 100}"}
                              for n in range(start, min(start + 1000, grouped))])
    if tail == "ungrouped":
        client.enqueue({"n": -1})
        assert client.stats() | {"oldest_ready_age_seconds": None} == {
            "ready": 10_001, "delayed": 0, "in_flight": 0, "dead": 0, "oldest_ready_age_seconds": None,
            "estimated": False}
    else:
        client.enqueue({"n": -1}, group_key="z", due_at=server_now(client) + timedelta(hours=1))
        stats = client.stats()
        assert stats["estimated"] and stats["ready"] >= 10_001
        assert (stats["delayed"], stats["in_flight"]) == (0, 0)
