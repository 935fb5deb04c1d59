"""The work table's storage v3 and v4 (PostgreSQL; docs/queue-kinds.md, What a lease writes): a lease
takes a message out of the claim index ix_<q>_ready, so a leased row version lies in the primary key
and ix_<q>_lease_start only, and expired leases are found by a look of their own, at most once a
second per session (docs/work-queue.md, Expired leases).

These tests check what a caller and an operator can observe of that design: which indexes hold a
leased message, that a consumer busy with a backlog still gets a crashed worker's message back within
about a second (not after the backlog), that a look which filled its batch looks again at once, and
that the setting a session keeps for it cannot be forged into an error or a longer wait; and (v4)
that the table has no CHECK constraint for a lease to evaluate.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import pytest

pytestmark = pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)


def index_entries(conn: Any, schema: str, index: str) -> int:
    """Live entries of a one-page B-tree (its root is its only leaf), read with pageinspect."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    return conn.execute(f"SELECT count(*) FROM bt_page_items('\"{schema}\".\"{index}\"', 1)").fetchone()[0]


def test_a_leased_message_is_in_the_primary_key_and_lease_start_only(deploy_queues: Callable[..., Any]) -> None:
    deployed = deploy_queues({"name": "q", "payload": "json", "kind": "work"})
    schema = deployed.catalog.schema
    conn = deployed.connect()
    try:
        client = deployed.client("q", conn)
        sent = [client.enqueue({"i": i})["id"] for i in range(20)]
        leased = client.dequeue(batch_size=8, worker="w", lease_seconds=60)
        assert [row["id"] for row in leased] == sent[:8]
        assert client.extend_lease(leased[0]["id"], "w", 120, lease_token=leased[0]["lease_token"]) is True
        conn.execute(f'VACUUM "{schema}"."q"')   # the dead entries of the versions before the leases go
        indexes = [name for (name,) in conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass ORDER BY 1",
            (f'"{schema}"."q"',))]
        assert sorted(name.split(".")[-1].strip('"') for name in indexes) == ["ix_q_lease_start", "ix_q_ready", "pk_q"]
        entries = {name: index_entries(conn, schema, name) for name in ("pk_q", "ix_q_ready", "ix_q_lease_start")}
        assert entries == {"pk_q": 20, "ix_q_ready": 12, "ix_q_lease_start": 8}
        # A fail gives the message back to the claim index: out of ix_q_lease_start again.
        assert client.fail(leased[1]["id"], "w", "boom", retry_after_seconds=0, lease_token=leased[1]["lease_token"]) == "retrying"
        conn.execute(f'VACUUM "{schema}"."q"')
        assert index_entries(conn, schema, "ix_q_ready") == 13
        assert index_entries(conn, schema, "ix_q_lease_start") == 7
    finally:
        conn.close()


def test_the_work_table_has_no_check_constraint_and_a_destructive_one_keeps_its(
        deploy_queues: Callable[..., Any]) -> None:
    """Storage v4: PostgreSQL evaluates (and for each statement parses and plans) every CHECK of a table
    on every UPDATE of it, so a lease paid for the payload's and the keys' checks (docs/BENCHMARKS.md);
    enqueue checks them before it inserts (the conformance tests refuse each). A fifo table, whose
    claims delete, keeps them."""
    deployed = deploy_queues(
        {"name": "w", "payload": "json", "kind": "work", "options": {"dedupe": True, "groups": True}},
        {"name": "f", "payload": "json", "kind": "fifo", "options": {"dedupe": True, "groups": True}})
    schema = deployed.catalog.schema
    conn = deployed.connect()
    try:
        checks = dict(conn.execute(
            "SELECT c.relname, array_agg(k.conname::text ORDER BY k.conname) FROM pg_constraint AS k "
            "JOIN pg_class AS c ON c.oid = k.conrelid JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND k.contype = 'c' GROUP BY c.relname", (schema,)).fetchall())
        assert checks == {"f": ["ck_f_dedupe_key", "ck_f_group_key", "ck_f_payload_json"]}
    finally:
        conn.close()


def test_a_consumer_busy_with_a_backlog_gets_an_expired_lease_back_within_a_second(
        deploy_queues: Callable[..., Any]) -> None:
    # A crashed worker's message (its lease expired) is no longer in the claim's order: the busy
    # consumer's once-a-second look must hand it out while the backlog still lasts, not after it.
    deployed = deploy_queues({"name": "q", "payload": "json", "kind": "work"})
    crashed_conn, busy_conn = deployed.connect(), deployed.connect()
    try:
        crashed, busy = deployed.client("q", crashed_conn), deployed.client("q", busy_conn)
        lost = crashed.enqueue({"lost": True})["id"]
        assert [row["id"] for row in crashed.dequeue(worker="crashed", lease_seconds=1)] == [lost]
        backlog = 200
        crashed.enqueue_batch({"payload": {"i": i}} for i in range(backlog))
        # The busy consumer starts before the lease expires, so that its first look finds nothing.
        handed: list[int] = []
        while lost not in handed:
            [message] = busy.dequeue(worker="busy", lease_seconds=60)
            handed.append(message["id"])
            assert busy.complete(message["id"], "busy", lease_token=message["lease_token"]) is True
            time.sleep(0.02)                   # 200 messages take at least 4 s: the backlog outlasts the look
            assert len(handed) <= backlog, "the expired lease came back only after the backlog"
        assert handed.count(lost) == 1
        # Two seconds after the expiry (the look is due a second after the last one) the consumer has
        # handed out at most about 100 (it sleeps 20 ms a message); a slower host hands out fewer.
        assert len(handed) < backlog - 50, f"the expired lease came back after {len(handed)} messages"
        assert busy.stats()["ready"] == backlog - (len(handed) - 1)
    finally:
        crashed_conn.close()
        busy_conn.close()


def test_a_look_that_filled_its_batch_looks_again_on_the_next_call(deploy_queues: Callable[..., Any]) -> None:
    # A worker that crashed holding five messages: a consumer taking one at a time gets all five
    # back first, on five calls in a row, not one a second.
    deployed = deploy_queues({"name": "q", "payload": "json", "kind": "work"})
    conn = deployed.connect()
    try:
        client = deployed.client("q", conn)
        held = [client.enqueue({"held": i})["id"] for i in range(5)]
        assert [row["id"] for row in client.dequeue(batch_size=5, worker="crashed", lease_seconds=1)] == held
        waiting = [client.enqueue({"waiting": i})["id"] for i in range(5)]
        time.sleep(1.2)
        started = time.monotonic()
        order = []
        for _ in range(10):
            [message] = client.dequeue(worker="next", lease_seconds=60)
            order.append((message["id"], message["attempts"]))
            assert client.complete(message["id"], "next", lease_token=message["lease_token"]) is True
        assert time.monotonic() - started < 1.0    # within the second after the first look
        assert order == [(i, 2) for i in held] + [(i, 1) for i in waiting]
    finally:
        conn.close()


@pytest.mark.parametrize("forged", ["", "soon", "9999999999999999", "0000000000000000", "1" * 17, "x" * 16,
                                    "-999999999999999", "1e15000000000000", "now + 0.9 s"])
def test_a_forged_look_setting_never_raises_and_never_hides_an_expired_lease_for_long(
        deploy_queues: Callable[..., Any], forged: str) -> None:
    deployed = deploy_queues({"name": "q", "payload": "json", "kind": "work"}, reuse=True)
    schema = deployed.catalog.schema
    conn = deployed.connect()
    try:
        client = deployed.client("q", conn)
        sent = client.enqueue({"x": 1})["id"]
        [leased] = client.dequeue(worker="crashed", lease_seconds=1)
        time.sleep(1.1)
        if forged == "now + 0.9 s":          # a value the function could have written: trusted, for under a second
            forged = conn.execute("SELECT ((extract(EPOCH FROM clock_timestamp()) * 1000000)::bigint + 900000)::text"
                                  ).fetchone()[0]
        conn.execute("SELECT set_config(%s, %s, false)", (f"tablequeue.{schema}.q.expired", forged))
        assert client.wait(0) in (True, False)
        deadline = time.monotonic() + 2.5
        while not (got := client.dequeue(worker="next")):
            assert time.monotonic() < deadline, f"{forged!r} hid the expired lease for over a second"
            time.sleep(0.05)
        assert [(row["id"], row["attempts"]) for row in got] == [(sent, 2)]
        assert leased["lease_token"] != got[0]["lease_token"]
    finally:
        conn.close()


def test_an_idle_wait_reads_the_leases_about_once_a_second_and_still_wakes_for_an_expired_one(
        deploy_queues: Callable[..., Any]) -> None:
    # The senior-PostgreSQL review of storage v3 (M1): wait_step's probe for expired leases reads every
    # lease the queue holds; it ran on every 50 ms step while the session's look was due (60 reads of
    # the index in a 3 s wait). A probe that finds none now counts as the session's look.
    deployed = deploy_queues({"name": "q", "payload": "json", "kind": "work"})
    schema = deployed.catalog.schema
    admin, waiter = deployed.connect(), deployed.connect()
    leases = 2_000
    try:
        busy = deployed.client("q", admin)
        for b in range(2):                      # live leases of busy workers, nothing ready
            busy.enqueue_batch({"payload": {"i": i}} for i in range(leases // 2))
            assert len(busy.dequeue(batch_size=leases // 2, worker=f"busy{b}", lease_seconds=600)) == leases // 2
        idle = deployed.client("q", waiter)
        assert idle.dequeue(worker="idle") == []    # its look: nothing expired

        def entries_read() -> int:
            admin.execute("SELECT pg_stat_force_next_flush()")
            return admin.execute("SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
                                 "WHERE schemaname = %s AND indexrelname = 'ix_q_lease_start'", (schema,)).fetchone()[0]

        time.sleep(1.1)                         # the look is due again
        waiter.execute("SELECT pg_stat_force_next_flush()")
        before = entries_read()
        assert idle.wait(3000) is False
        waiter.execute("SELECT pg_stat_force_next_flush()")
        read = entries_read() - before
        # About one look a second over a 3 s wait; the fault read the index on all ~60 steps.
        assert read <= 6 * leases, f"an idle 3 s wait read ix_q_lease_start {read / leases:.0f} times"
        # ... and a lease that expires still wakes the waiter, which then dequeues it.
        crashed = busy.enqueue({"x": 1})["id"]
        assert [m["id"] for m in busy.dequeue(worker="crashed", lease_seconds=1)] == [crashed]
        assert idle.wait(5000) is True
        assert [(m["id"], m["attempts"]) for m in idle.dequeue(worker="idle")] == [(crashed, 2)]
    finally:
        admin.close()
        waiter.close()

