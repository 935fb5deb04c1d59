"""Message groups on PostgreSQL: the senior review's interleavings of branch groupspg (issue 21),
session by session (from the review's tests/test_review_groups_pg.py, adapted to the lock protocol
that stayed: acknowledgements wait for their group's holder; producers, claims and purge do not).

- MUST 1 and MUST 2: a claim or a purge settling a group while the in-flight message's complete runs
  must not leave the group with messages no claim reaches.
- SHOULD 3 and SHOULD 4: a grouped verb at REPEATABLE READ is refused (`isolation_level`, TQ008).
- The settle's demote guard: a producer's candidate committed while a holder settles an empty group
  survives the holder's demotion.

Every thread is joined with a bound; no assertion depends on speed.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable

import psycopg
import pytest
from test_groups_postgres import in_thread

pytestmark = pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)

BOUND_SECONDS = 30


def grouped(kind: str, **options: Any) -> dict[str, Any]:
    return {"name": "q", "kind": kind, "payload": "json", "options": {"groups": True, **options}}


def flags(deployed: Any, conn: Any) -> list[tuple]:
    schema = deployed.catalog.schema
    return conn.execute(f'SELECT id, group_head FROM "{schema}"."q" ORDER BY id').fetchall()


def in_flight(deployed: Any, conn: Any, key: str) -> Any:
    schema = deployed.catalog.schema
    return conn.execute(f'SELECT in_flight FROM "{schema}"."q_groups" WHERE group_key = %s', (key,)).fetchone()[0]


def drain_ids(client: Any, kind: str, worker: str = "drain") -> list[int]:
    got = []
    while True:
        rows = client.dequeue(batch_size=10, worker=worker) if kind == "work" else client.dequeue(batch_size=10)
        if not rows:
            return got
        for row in rows:
            got.append(row["id"])
            if kind == "work":
                assert client.complete(row["id"], worker, row["lease_token"])


def until_done_or_waiting(watch: Any, conn: Any, thread: threading.Thread) -> bool:
    """Polls until thread ended or conn's backend waits on a lock (bounded); True if it waits."""
    pid = conn.info.backend_pid
    deadline = time.monotonic() + BOUND_SECONDS
    while thread.is_alive():
        row = watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            return True
        assert time.monotonic() < deadline, "the session neither returned nor waited on a lock"
        time.sleep(0.01)
    return False


def joined(thread: threading.Thread, outcome: list) -> Any:
    thread.join(BOUND_SECONDS)
    assert not thread.is_alive(), "the thread is still waiting"
    assert len(outcome) == 1
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


def complete_until_released(deployed: Any, watch: Any, ack_conn: Any, x: int, lease: Any,
                            release: Callable[[], Any]) -> bool:
    """The complete of X (worker w1) on ack_conn in a thread, until it returned or waits on a lock;
    then release() (ends what holds g, or the pause) and the complete returns True. Whether it
    waited."""
    thread, outcome = in_thread(lambda: deployed.client("q", ack_conn).complete(x, "w1", lease))
    waited = until_done_or_waiting(watch, ack_conn, thread)
    release()
    assert joined(thread, outcome) is True
    return waited


def one_in_flight(admin: Any, behind: int) -> tuple[int, list[dict], list[int]]:
    """X enqueued into g and leased by w1 for an hour, then `behind` messages enqueued after it:
    (X, the lease rows, their ids)."""
    x = admin.enqueue({"n": 0}, group_key="g")["id"]
    leased = admin.dequeue(worker="w1", lease_seconds=3600)
    assert [r["id"] for r in leased] == [x]
    return x, leased, [admin.enqueue({"n": n}, group_key="g")["id"] for n in range(1, behind + 1)]


def stranded(deployed: Any, conn: Any) -> str:
    return f"group g stranded: flags={flags(deployed, conn)} in_flight={in_flight(deployed, conn, 'g')}"


# --- MUST 1 and MUST 2 ----------------------------------------------------------------------------------

def test_must1_a_claim_settling_the_group_while_its_in_flight_message_is_completed(deploy_queues) -> None:
    """X in flight; Y enqueued meanwhile waits behind X (a producer that takes the group does not
    flag it: X's complete will hold the group). A claim in an open transaction finds no candidate of
    g; the complete of X then settles g (waiting for any holder), and Y is handed out."""
    deployed = deploy_queues(grouped("work"))
    setup, ack_conn = deployed.connect(), deployed.connect()
    claim_conn = deployed.connect(autocommit=False)
    try:
        admin = deployed.client("q", setup)
        x, leased, [y] = one_in_flight(admin, 1)
        assert dict(flags(deployed, setup))[y] is False          # behind X, not a candidate

        assert deployed.client("q", claim_conn).dequeue(worker="w2") == []
        complete_until_released(deployed, setup, ack_conn, x, leased[0]["lease_token"], claim_conn.commit)
        assert drain_ids(admin, "work") == [y], stranded(deployed, setup)
    finally:
        for conn in (setup, ack_conn, claim_conn):
            conn.close()


def test_must1_with_the_claim_stopped_inside_its_settle(deploy_queues) -> None:
    """The same race with the claim in autocommit, stopped by a third session's row lock on Y (FOR
    SHARE, by hand) if the claim reaches Y: the complete of X waits for whatever holds g, and once the
    blocker ends, Y is handed out."""
    deployed = deploy_queues(grouped("work"))
    setup, blocker = deployed.connect(), deployed.connect(autocommit=False)
    claim_conn, ack_conn = deployed.connect(), deployed.connect()
    try:
        admin = deployed.client("q", setup)
        x, leased, [y] = one_in_flight(admin, 1)
        blocker.execute(f'SELECT FROM "{deployed.catalog.schema}"."q" WHERE id = %s FOR SHARE', (y,))
        claim, claimed = in_thread(lambda: deployed.client("q", claim_conn).dequeue(worker="w2"))
        until_done_or_waiting(setup, claim_conn, claim)
        ack, acked = in_thread(lambda: deployed.client("q", ack_conn).complete(x, "w1", leased[0]["lease_token"]))
        until_done_or_waiting(setup, ack_conn, ack)
        blocker.commit()
        assert joined(claim, claimed) == []
        assert joined(ack, acked) is True
        assert drain_ids(admin, "work") == [y], stranded(deployed, setup)
    finally:
        for conn in (setup, blocker, claim_conn, ack_conn):
            conn.close()


def test_must2_a_purge_holding_the_group_while_its_in_flight_message_is_completed(deploy_queues) -> None:
    """X in flight, Y and Z waiting behind it; the worker's open transaction extended X's lease (X's
    row locked); purge(max_rows=2) in an open transaction holds g, steps over X and deletes Y. The
    complete of X waits for purge's hold of g, then settles g: Z is handed out."""
    deployed = deploy_queues(grouped("work"))
    setup = deployed.connect()
    ack_conn, purge_conn = deployed.connect(autocommit=False), deployed.connect(autocommit=False)
    try:
        admin = deployed.client("q", setup)
        x, leased, [_, z] = one_in_flight(admin, 2)               # Y, Z behind X
        assert admin.dequeue(worker="w2") == []
        worker = deployed.client("q", ack_conn)
        assert worker.extend_lease(x, "w1", 3600, lease_token=leased[0]["lease_token"])
        assert deployed.client("q", purge_conn).purge(max_rows=2) == 1
        assert complete_until_released(deployed, setup, ack_conn, x, leased[0]["lease_token"], purge_conn.commit), (
            "complete did not wait for purge's hold of g")
        ack_conn.commit()
        assert drain_ids(admin, "work") == [z], stranded(deployed, setup)
    finally:
        for conn in (setup, ack_conn, purge_conn):
            conn.close()


# --- SHOULD 3 and SHOULD 4: READ COMMITTED only ---------------------------------------------------------

def refused_at_repeatable_read(conn: Any, call: Callable[[], Any]) -> None:
    with pytest.raises(psycopg.Error) as raised:
        call()
    assert raised.value.sqlstate == "TQ008"
    assert "runs only at READ COMMITTED" in str(raised.value)
    conn.rollback()


def test_should4_a_fifo_enqueue_at_repeatable_read_is_refused(deploy_queues) -> None:
    """Its check for an empty group would read the transaction's first snapshot, which still shows a
    head dequeued since: the message would wait, unflagged, in an empty group."""
    deployed = deploy_queues(grouped("fifo"))
    setup = deployed.connect()
    producer_conn = deployed.connect(autocommit=False)
    try:
        admin = deployed.client("q", setup)
        admin.enqueue({"n": 0}, group_key="g")
        producer_conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        producer_conn.execute("SELECT 1")                         # the snapshot: X is there
        assert len(admin.dequeue()) == 1                          # X consumed, committed
        producer = deployed.client("q", producer_conn)
        refused_at_repeatable_read(producer_conn, lambda: producer.enqueue({"n": 1}, group_key="g"))
        z = producer.enqueue({"n": 1}, group_key="g")["id"]      # READ COMMITTED again
        producer_conn.commit()
        assert drain_ids(admin, "fifo") == [z], f"stranded: flags={flags(deployed, setup)}"
    finally:
        for conn in (setup, producer_conn):
            conn.close()


def test_should3_a_work_complete_at_repeatable_read_is_refused(deploy_queues) -> None:
    """Its settle would read the transaction's first snapshot, older than a claim's committed
    demotion of Y, and flag nothing: refused, and the complete at READ COMMITTED moves g on."""
    deployed = deploy_queues(grouped("work"))
    setup = deployed.connect()
    ack_conn, claim_conn = deployed.connect(autocommit=False), deployed.connect(autocommit=False)
    try:
        admin = deployed.client("q", setup)
        x, leased, [y] = one_in_flight(admin, 1)
        ack_conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        ack_conn.execute("SELECT 1")
        assert deployed.client("q", claim_conn).dequeue(worker="w2") == []
        claim_conn.commit()
        worker = deployed.client("q", ack_conn)
        refused_at_repeatable_read(ack_conn, lambda: worker.complete(x, "w1", leased[0]["lease_token"]))
        assert worker.complete(x, "w1", leased[0]["lease_token"])
        ack_conn.commit()
        assert drain_ids(admin, "work") == [y], stranded(deployed, setup)
    finally:
        for conn in (setup, ack_conn, claim_conn):
            conn.close()


@pytest.mark.parametrize("kind", ["fifo", "work"])
def test_every_verb_that_joins_or_settles_a_group_is_refused_at_repeatable_read(deploy_queues, kind) -> None:
    """enqueue, enqueue_batch and purge (both kinds); complete, fail, complete_next and dead_requeue
    (work). Nothing changed: the group is handed out whole afterwards."""
    deployed = deploy_queues(grouped(kind, max_attempts=1) if kind == "work" else grouped(kind))
    setup = deployed.connect()
    conn = deployed.connect(autocommit=False)
    try:
        admin = deployed.client("q", setup)
        ids = [admin.enqueue({"n": n}, group_key="g")["id"] for n in range(3)]
        client = deployed.client("q", conn)
        calls: list[Callable[[], Any]] = [
            lambda: client.enqueue({"n": 9}, group_key="g"),
            lambda: client.enqueue_batch([{"payload": {"n": 9}, "group_key": "g"}]),
            lambda: client.purge(max_rows=1),
        ]
        if kind == "work":
            leased = admin.dequeue(worker="w", lease_seconds=3600)
            assert [r["id"] for r in leased] == ids[:1]
            token = leased[0]["lease_token"]
            calls += [
                lambda: client.complete(ids[0], "w", token),
                lambda: client.fail(ids[0], "w", "boom", lease_token=token),
                lambda: client.complete_next(ids[0], "w", token),
            ]
        for call in calls:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            refused_at_repeatable_read(conn, call)
        if kind == "work":
            assert admin.fail(ids[0], "w", "boom", lease_token=token) == "dead"
            dead_id = admin.dead_list()[0]["id"]
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            refused_at_repeatable_read(conn, lambda: client.dead_requeue(dead_id))
            assert drain_ids(admin, kind) == ids[1:]
        else:
            assert drain_ids(admin, kind) == ids
    finally:
        for c in (setup, conn):
            c.close()


# --- the settle's demote guard ---------------------------------------------------------------------------

PAUSE = 424242


def pause_settle_of_complete(conn: Any, schema: str, remove_guard: bool) -> None:
    """Test-only instrumentation: complete's settle waits for the advisory lock PAUSE (shared)
    between find_heads and its demoting UPDATE; remove_guard also drops the demote guard."""
    oid = conn.execute("SELECT p.oid FROM pg_proc AS p INNER JOIN pg_namespace AS n ON p.pronamespace = n.oid "
                       "WHERE n.nspname = %s AND p.proname = 'q_complete'", (schema,)).fetchone()[0]
    definition = conn.execute("SELECT pg_get_functiondef(%s)", (oid,)).fetchone()[0]
    marker = "-- Only in a group whose head this statement still sees"
    assert marker in definition
    definition = definition.replace(
        marker, f"PERFORM pg_advisory_lock_shared({PAUSE}); PERFORM pg_advisory_unlock_shared({PAUSE});\n" + marker)
    if remove_guard:
        definition, n = re.subn(r"AND EXISTS \(SELECT FROM \S+ AS h WHERE h\.id = ANY\(head_ids\) AND "
                                r"h\.group_key = m\.group_key\)", "", definition)
        assert n == 1
    conn.execute(definition)


@pytest.mark.parametrize("remove_guard", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="without the demote guard the complete demotes the producer's only candidate"))])
def test_settle_guard_keeps_a_producers_candidate_committed_while_the_holder_settles_an_empty_group(
        deploy_queues, remove_guard) -> None:
    """The complete of a group's last message X holds g and finds no head (g is empty); a producer,
    which cannot take g, flags its message Y a candidate and commits before the complete's demoting
    statement, which sees Y but no head of g: Y stays flagged and is handed out."""
    deployed = deploy_queues(grouped("work"))
    setup, pauser = deployed.connect(), deployed.connect(autocommit=False)
    ack_conn = deployed.connect()
    try:
        admin = deployed.client("q", setup)
        x, leased, _ = one_in_flight(admin, 0)
        pause_settle_of_complete(setup, deployed.catalog.schema, remove_guard)
        pauser.execute("SELECT pg_advisory_xact_lock(%s)", (PAUSE,))
        added: list[int] = []

        def produce_then_unpause() -> None:
            added.append(admin.enqueue({"n": 1}, group_key="g")["id"])   # g held by the complete
            assert dict(flags(deployed, setup))[added[0]] is True
            pauser.commit()

        assert complete_until_released(deployed, setup, ack_conn, x, leased[0]["lease_token"], produce_then_unpause), (
            "complete did not reach the pause")
        assert drain_ids(admin, "work") == added, stranded(deployed, setup)
    finally:
        for conn in (setup, pauser, ack_conn):
            conn.close()


# --- what waits, what does not ---------------------------------------------------------------------------

def test_producers_claims_and_purge_never_wait_for_a_held_group_and_acknowledgements_do(deploy_queues) -> None:
    """While a wait step's probe (FOR SHARE of g, transaction open) holds g, producers (enqueue,
    enqueue_batch), a claim and purge(max_rows) return under a 500 ms lock_timeout; while a
    producer's open transaction holds g, the complete of its in-flight message waits (the timeout
    fires) and goes through once the producer commits; the group goes on in order."""
    deployed = deploy_queues(grouped("work"))
    schema = deployed.catalog.schema
    setup = deployed.connect()
    probe_conn, producer_conn = deployed.connect(autocommit=False), deployed.connect(autocommit=False)
    try:
        setup.execute("SET lock_timeout = '500ms'")
        admin = deployed.client("q", setup)
        ids = [admin.enqueue({"n": n}, group_key="g")["id"] for n in range(3)]
        assert probe_conn.execute(f'SELECT "{schema}"."q_wait_step"(0, clock_timestamp())').fetchone()[0] is True
        added = [admin.enqueue({"n": 3}, group_key="g")["id"]]
        added += [r["id"] for r in admin.enqueue_batch([{"payload": {"n": 4}, "group_key": "g"}])]
        assert admin.dequeue(worker="w2") == []                    # g stepped over
        assert admin.purge(max_rows=1) == 0                        # g stepped over
        probe_conn.commit()
        leased = admin.dequeue(worker="w1", lease_seconds=3600)
        assert [r["id"] for r in leased] == ids[:1]
        added.append(deployed.client("q", producer_conn).enqueue({"n": 5}, group_key="g")["id"])   # holds g
        with pytest.raises(psycopg.Error) as raised:
            admin.complete(ids[0], "w1", leased[0]["lease_token"])
        assert raised.value.sqlstate == "55P03"
        producer_conn.commit()
        assert admin.complete(ids[0], "w1", leased[0]["lease_token"])
        got = []
        while True:
            rows = admin.dequeue(batch_size=5, worker="w4")
            if not rows:
                break
            assert len(rows) == 1
            got.append(rows[0]["id"])
            assert admin.complete(rows[0]["id"], "w4", rows[0]["lease_token"])
        assert got == ids[1:] + added
    finally:
        for conn in (setup, probe_conn, producer_conn):
            conn.close()
