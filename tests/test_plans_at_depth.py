"""Plans at depth (PostgreSQL): a plan cached while the queue was empty still seeks at 10^6 rows.

PL/pgSQL caches each statement's plan for the session; a consumer that starts on an empty queue (a
fresh deploy, a drained backlog) keeps the plans it made then. Each session here calls the verbs on
the empty queue first (plan_cache_mode auto, which settles on the generic plan after five calls, and
force_generic_plan), the queue is then filled to 10^6 rows by one INSERT ... SELECT, and the next
dequeues of those same sessions are measured: auto_explain shows the plans they actually ran and the
shared buffers each statement read. Autovacuum is off for the table so that no ANALYZE replaces the
cached plans half way (it would invalidate them: the test would then measure fresh plans). The
negative control drops the claim's index: the plans are made again, without it, and the same
measure reads the whole table. SQL Server pins its claims instead (docs/queue-kinds.md, "Plans at
depth"; check-tsql's claim-pin rule).
"""
from __future__ import annotations

import re
from typing import Any, Callable

import pytest

from pg_buffers import buffers_of, buffers_of_dequeues, start_explaining, stop_explaining

pytestmark = pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)

DEPTH = 1_000_000
# A claim that seeks reads a few index and heap pages, plus the work kind's bookkeeping statements;
# the whole table is some 10,000 pages.
HANDFUL = 60

# variant: (catalog entry, the columns the fill gives, the claim's index)
VARIANTS = {
    "heap": ({"kind": "heap"}, {}, "pk_q"),
    "fifo": ({"kind": "fifo"}, {}, "pk_q"),
    "lifo": ({"kind": "lifo"}, {}, "pk_q"),
    "pending": ({"kind": "pending"}, {"due_at": "now()"}, "ix_q_due"),
    "work": ({"kind": "work"}, {"due_at": "now()", "visible_at": "now()"}, "ix_q_ready"),
    "work_priority": ({"kind": "work", "options": {"priority": True}},
                      {"due_at": "now()", "visible_at": "now()", "priority": "n % 3"}, "ix_q_ready"),
}


def warm_up_on_empty(client: Any) -> None:
    """Every verb a consumer's loop runs, on the empty queue, more than five times (plan_cache_mode
    auto makes five custom plans before it settles on the generic one)."""
    work = client.queue.kind == "work"

    def dequeue() -> list[dict]:
        return client.dequeue(worker="w") if work else client.dequeue()

    for _ in range(7):
        assert dequeue() == []
        assert client.wait(0) is False
        sent = client.enqueue({"warm": True})["id"]
        assert [row["id"] for row in dequeue()] == [sent]
        if work:
            assert client.complete(sent, "w")


def drop_index(conn: Any, schema: str, index: str) -> None:
    if index.startswith("pk_"):
        conn.execute(f'ALTER TABLE "{schema}"."q" DROP CONSTRAINT "{index}"')
    else:
        conn.execute(f'DROP INDEX "{schema}"."{index}"')


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_plan_cached_on_an_empty_queue_reads_a_handful_of_pages_at_depth(
        deploy_queues: Callable[..., Any], variant: str) -> None:
    entry, columns, claim_index = VARIANTS[variant]
    deployed = deploy_queues({"name": "q", "payload": "json", **entry})
    schema = deployed.catalog.schema
    admin = deployed.connect()
    sessions = {mode: deployed.connect() for mode in ("auto", "force_generic_plan")}
    try:
        admin.execute(f'ALTER TABLE "{schema}"."q" SET (autovacuum_enabled = false)')
        clients = {}
        for mode, conn in sessions.items():
            conn.execute(f"SET plan_cache_mode = {mode}")
            conn.execute("LOAD 'auto_explain'")
            clients[mode] = deployed.client("q", conn)
            warm_up_on_empty(clients[mode])

        names = ", ".join(["payload", *columns])
        values = ", ".join(["'{}'::jsonb", *columns.values()])
        admin.execute(f'INSERT INTO "{schema}"."q" ({names}) SELECT {values} FROM generate_series(1, {DEPTH}) AS n')

        at_depth = {mode: min(buffers_of_dequeues(client, 3)) for mode, client in clients.items()}
        drop_index(admin, schema, claim_index)
        [without_index] = buffers_of_dequeues(clients["force_generic_plan"], 1)
    finally:
        for conn in (admin, *sessions.values()):
            conn.close()

    for mode, (buffers, plans) in at_depth.items():
        assert buffers < HANDFUL, f"{mode}: a dequeue at depth read {buffers} buffers:\n" + "\n\n".join(plans)
    # The control: the same measure, the plans made again without the claim's index, reads the table.
    buffers, plans = without_index
    assert buffers > DEPTH / 1_000, f"without {claim_index} a dequeue read only {buffers} buffers:\n" + "\n\n".join(plans)


# A batch claim's generic plan made over a queue already this deep: the join of the claimed ids
# with the table, costed at a tenth of the claim index's rows (the estimate of `LIMIT batch_size`),
# was a hash join over a sequential scan of the whole table on every call (67 messages/s at batch 10).
BATCH_DEPTH = 40_000
BATCH = 10


@pytest.mark.parametrize("variant", ["fifo", "pending", "work"])
def test_a_batch_claim_planned_on_a_deep_queue_reads_a_handful_of_pages_per_message(
        deploy_queues: Callable[..., Any], variant: str) -> None:
    entry, columns, _ = VARIANTS[variant]
    deployed = deploy_queues({"name": "q", "payload": "json", **entry})
    schema = deployed.catalog.schema
    conn = deployed.connect()
    try:
        names = ", ".join(["payload", *columns])
        values = ", ".join(["'{}'::jsonb", *columns.values()])
        conn.execute(f'INSERT INTO "{schema}"."q" ({names}) SELECT {values} FROM generate_series(1, {BATCH_DEPTH}) AS n')
        conn.execute(f'ANALYZE "{schema}"."q"')
        table_pages = conn.execute(f"SELECT pg_relation_size('\"{schema}\".\"q\"') / 8192").fetchone()[0]
        conn.execute("LOAD 'auto_explain'")
        client = deployed.client("q", conn)
        work = variant == "work"

        def batch() -> list[dict]:
            rows = client.dequeue(batch_size=BATCH, worker="w") if work else client.dequeue(batch_size=BATCH)
            assert len(rows) == BATCH
            if work:
                assert all(done["completed"] for done in client.complete_batch(rows, "w"))
            return rows

        for _ in range(7):  # the generic plan, made at this depth
            batch()
        notices = start_explaining(conn)
        try:
            measured = []
            for _ in range(3):
                notices.clear()
                rows = client.dequeue(batch_size=BATCH, worker="w") if work else client.dequeue(batch_size=BATCH)
                assert len(rows) == BATCH
                measured.append(buffers_of(notices, "dequeue"))
                if work:
                    conn.execute("SET auto_explain.log_min_duration = -1")
                    assert all(done["completed"] for done in client.complete_batch(rows, "w"))
                    conn.execute("SET auto_explain.log_min_duration = 0")
        finally:
            stop_explaining(conn)
    finally:
        conn.close()
    buffers, plans = min(measured)
    # A seek reads a few pages per message (work: its four index entries per lease and the read-back);
    # the sequential scan read the whole table.
    assert not any(re.search(r"Seq Scan on q\b", plan) for plan in plans), "\n\n".join(plans)
    assert buffers < table_pages / 2, f"a batch of {BATCH} read {buffers} of {table_pages} pages:\n" + "\n\n".join(plans)


def test_a_batch_dequeue_first_run_by_idle_polls_on_a_vacuumed_empty_queue_seeks_at_depth(
        deploy_queues: Callable[..., Any]) -> None:
    # The senior-PostgreSQL review of the one-statement read-back (M1, S1): a drained queue that
    # VACUUM cut to no pages (reltuples 0) makes the planner cost a table scan at nothing. The plans
    # idle polls cache then (the own-messages probe, the claim; the read-back, which now runs only
    # when something was claimed) scanned the whole table after the queue filled again: 1,670 of
    # 520 pages for a batch of 10, 6,840 with the read-back. The functions run with enable_seqscan off.
    entry, columns, _ = VARIANTS["work"]
    deployed = deploy_queues({"name": "q", "payload": "json", **entry})
    schema = deployed.catalog.schema
    admin, conn = deployed.connect(), deployed.connect()
    try:
        admin.execute(f'ALTER TABLE "{schema}"."q" SET (autovacuum_enabled = false)')
        client = deployed.client("q", conn)
        warm = deployed.client("q", admin)
        warm.enqueue_batch([{"payload": {"n": n}} for n in range(BATCH)])
        assert all(done["completed"] for done in warm.complete_batch(warm.dequeue(BATCH, worker="v"), "v"))
        admin.execute(f'VACUUM "{schema}"."q"')
        assert admin.execute(f"SELECT relpages FROM pg_class WHERE oid = '\"{schema}\".\"q\"'::regclass").fetchone()[0] == 0
        for _ in range(7):                          # idle polls: every plan they make, made now
            assert client.dequeue(batch_size=BATCH, worker="w") == []
        names = ", ".join(["payload", *columns])
        values = ", ".join(["'{}'::jsonb", *columns.values()])
        admin.execute(f'INSERT INTO "{schema}"."q" ({names}) SELECT {values} FROM generate_series(1, {BATCH_DEPTH}) AS n')
        table_pages = admin.execute(f"SELECT pg_relation_size('\"{schema}\".\"q\"') / 8192").fetchone()[0]
        conn.execute("LOAD 'auto_explain'")
        notices = start_explaining(conn)
        try:
            rows = client.dequeue(batch_size=BATCH, worker="w")
            assert len(rows) == BATCH
            buffers, plans = buffers_of(notices, "dequeue")
        finally:
            stop_explaining(conn)
    finally:
        admin.close()
        conn.close()
    assert buffers < table_pages / 2, f"a batch of {BATCH} read {buffers} of {table_pages} pages:\n" + "\n\n".join(plans)


LOOK_DEPTH = 200_000


@pytest.mark.parametrize("mode", ["auto", "force_generic_plan"])
def test_the_look_for_expired_leases_planned_on_an_empty_queue_reads_the_leases_not_the_queue(
        deploy_queues: Callable[..., Any], mode: str) -> None:
    # Storage v3: expired leases are not in ix_q_ready; the look reads ix_q_lease_start (every lease,
    # expired or not) and must stay on it at depth, whatever plan it cached on the empty queue.
    deployed = deploy_queues({"name": "q", "payload": "json", "kind": "work"})
    schema = deployed.catalog.schema
    admin, conn = deployed.connect(), deployed.connect()
    setting = f"tablequeue.{schema}.q.expired"
    try:
        admin.execute(f'ALTER TABLE "{schema}"."q" SET (autovacuum_enabled = false)')
        conn.execute(f"SET plan_cache_mode = {mode}")
        conn.execute("LOAD 'auto_explain'")
        client = deployed.client("q", conn)
        for _ in range(7):                      # every dequeue looks: the look's plan is the cached one
            conn.execute("SELECT set_config(%s, '', false)", (setting,))
            warm_up_on_empty(client)
        admin.execute(f"""INSERT INTO "{schema}"."q" (payload, due_at, visible_at, leased_by, leased_at, attempts)
                          SELECT '{{}}'::jsonb, now(), CASE WHEN n <= 50 THEN now() + interval '1 hour'
                                                            WHEN n <= 100 THEN now() - interval '1 minute' ELSE now() END,
                                 CASE WHEN n <= 100 THEN 'other' END, CASE WHEN n <= 100 THEN now() END,
                                 CASE WHEN n <= 100 THEN 1 ELSE 0 END
                          FROM generate_series(1, {LOOK_DEPTH}) AS n""")
        table_pages = admin.execute(f"SELECT pg_relation_size('\"{schema}\".\"q\"') / 8192").fetchone()[0]

        def measured_look(worker: str) -> tuple[int, list[str]]:
            notices = start_explaining(conn)
            try:
                conn.execute("SELECT set_config(%s, '', false)", (setting,))
                rows = client.dequeue(worker=worker, batch_size=3)
                assert [row["attempts"] for row in rows] == [2, 2, 2]   # three of the fifty expired leases
                return buffers_of([n for n in notices if "m.leased_by IS NOT NULL AND m.visible_at" in n], "dequeue")
            finally:
                stop_explaining(conn)

        buffers, plans = measured_look("w1")
        admin.execute(f'DROP INDEX "{schema}"."ix_q_lease_start"')
        without_index, control_plans = measured_look("w2")
    finally:
        admin.close()
        conn.close()
    assert plans, "auto_explain saw no look"
    assert not any(re.search(r"Seq Scan on q\b", plan) for plan in plans), "\n\n".join(plans)
    assert buffers < table_pages / 20, f"the look read {buffers} of {table_pages} pages:\n" + "\n\n".join(plans)
    # The control: without the index it reads the table.
    assert without_index > table_pages / 2, f"without ix_q_lease_start the look read only {without_index}:\n" + \
        "\n\n".join(control_plans)


STATEMENT_DEPTH = 150_000
LIVE_LEASES, EXPIRED_LEASES = 250, 50
GROUPED = 400
V3_VARIANTS = {"plain": {}, "priority": {"priority": True}, "groups": {"groups": True}, "client_ids": {"client_ids": True}}


@pytest.mark.parametrize("variant", V3_VARIANTS)
def test_every_statement_of_the_work_verbs_stays_on_an_index_at_depth(deploy_queues: Callable[..., Any],
                                                                      variant: str) -> None:
    # The senior-PostgreSQL review of storage v3: with plans cached on the empty queue, the look of a
    # grouped queue (M2) and the purge of a client-id queue (M3) read the whole table at depth. Each
    # statement that dequeue (the look due, a batch, the worker's own), wait_step (the look due),
    # stats and purge run must stay on an index, and read no more than the leases they walk (the look,
    # the in-flight count: about a buffer per lease) or a handful: the table has some 2,000 pages. A
    # grouped queue also has grouped messages (in groups of their own, so that none waits behind a
    # leased head): stats reads those along ix_q_group, at most 10,001 (the review's S3: its ready and
    # delayed counts read the whole table).
    deployed = deploy_queues({"name": "q", "payload": "json", "kind": "work", "options": V3_VARIANTS[variant]})
    schema = deployed.catalog.schema
    admin, conn = deployed.connect(), deployed.connect()
    setting = f"tablequeue.{schema}.q.expired"
    try:
        admin.execute(f'ALTER TABLE "{schema}"."q" SET (autovacuum_enabled = false)')
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("LOAD 'auto_explain'")
        client = deployed.client("q", conn)
        for _ in range(7):                      # the plans, cached on the empty queue
            conn.execute("SELECT set_config(%s, '', false)", (setting,))
            assert client.dequeue(worker="w") == []
            assert client.wait(0) is False
            client.enqueue({"warm": True})
            [got] = client.dequeue(worker="w", batch_size=2)
            assert client.complete(got["id"], "w", lease_token=got["lease_token"])
            client.stats()
            client.purge(max_rows=10)
        ids = ("id, ", "gen_random_uuid(), ") if variant == "client_ids" else ("", "")
        priority = (", priority", ", n % 3") if variant == "priority" else ("", "")
        # Live leases of 20 workers, some expired ones, the rest ready.
        live, expired = LIVE_LEASES, LIVE_LEASES + EXPIRED_LEASES
        admin.execute(f"""INSERT INTO "{schema}"."q" ({ids[0]}payload, due_at, visible_at, leased_by, leased_at, attempts{priority[0]})
            SELECT {ids[1]}'{{}}'::jsonb, now(),
                   CASE WHEN n <= {live} THEN now() + interval '1 hour' WHEN n <= {expired} THEN now() - interval '5 minute'
                        ELSE now() - interval '1 minute' END,
                   CASE WHEN n <= {expired} THEN 'other' || (n % 20) END,
                   CASE WHEN n <= {expired} THEN now() - interval '10 minute' END,
                   CASE WHEN n <= {expired} THEN 1 ELSE 0 END{priority[1]}
            FROM generate_series(1, {STATEMENT_DEPTH}) AS n""")
        if variant == "groups":
            client.enqueue_batch([{"payload": {"n": n}, "group_key": f"g{n % 50}"} for n in range(GROUPED)])
        table_pages = admin.execute(f"SELECT pg_relation_size('\"{schema}\".\"q\"') / 8192").fetchone()[0]
        def calls_on(conn: Any) -> dict[str, Callable[[], Any]]:
            client = deployed.client("q", conn)
            return {
                "dequeue, the look due": lambda: (conn.execute("SELECT set_config(%s, '', false)", (setting,)),
                                                  client.dequeue(worker="w2")),
                "dequeue, a batch": lambda: client.dequeue(worker="w3", batch_size=10),
                "dequeue, own messages": lambda: client.dequeue(worker="w3", batch_size=10),
                "wait_step, the look due": lambda: (conn.execute("SELECT set_config(%s, '', false)", (setting,)),
                                                    conn.execute(f'SELECT "{schema}"."q_wait_step"(0, clock_timestamp())')),
                "stats": lambda: client.stats(),
                "purge": lambda: client.purge(max_rows=10),
            }

        def problems_of(conn: Any, when: str) -> list[str]:
            problems = []
            notices = start_explaining(conn)
            try:
                for name, call in calls_on(conn).items():
                    notices.clear()
                    call()
                    _, plans = buffers_of(notices, name.split(",")[0])   # the statements inside the verb
                    for plan in plans:
                        top = re.search(r"Buffers: shared((?: \w+=\d+)+)", plan)
                        read = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top.group(1))) if top else 0
                        if re.search(r"Seq Scan on q\b", plan) or read > 3 * (LIVE_LEASES + EXPIRED_LEASES):
                            problems.append(f"{name}, {when}: {read} of {table_pages} pages:\n{plan}")
            finally:
                stop_explaining(conn)
            return problems

        problems = problems_of(conn, "planned on the empty queue")
        # And planned with the statistics of the deep queue, in a new session (the senior-PostgreSQL
        # review of the grouped counts: a count planned so took a sequential scan when few rows matched).
        admin.execute(f'ANALYZE "{schema}"."q"')
        fresh = deployed.connect()
        try:
            fresh.execute("SET plan_cache_mode = force_generic_plan")
            fresh.execute("LOAD 'auto_explain'")
            problems += problems_of(fresh, "planned at depth")
        finally:
            fresh.close()
    finally:
        admin.close()
        conn.close()
    assert not problems, "\n\n".join(problems)
