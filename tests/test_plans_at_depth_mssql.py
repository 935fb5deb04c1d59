"""Plans at depth (SQL Server): the plan a claim cached on an empty queue still seeks on its pinned
index once the queue holds more than 10^4 messages (docs/queue-kinds.md, "Plans at depth").

Each verb a consumer runs is called on the empty queue first, so its plan is compiled and cached
there; the table is then filled past 10^4 rows by one INSERT ... SELECT, the claims run again, and
the plans in the cache (sys.dm_exec_procedure_stats, sys.dm_exec_query_plan) are read: every read of
the queue table in dequeue and wait is on the index its hint names, a seek where the claim compares
the index's first key column, an ordered scan under TOP where it only orders by the key (heap, fifo,
lifo: the claim is one end of the clustered key). The work kind's fill also leases messages to
HOLDERS workers, most live and a few expired, so that the look for expired leases walks the lease
index at depth: its only scans are the probes for the first lease holder and the first priority level
(TOP (1) in the index's order); every other read is a seek, and the expired leases come back. Runs
only with TABLEQUEUE_MSSQL_URL.
"""
from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("engine_url", ["mssql"], indirect=True)

DEPTH = 20_000
HOLDERS = 50           # workers holding live leases in the work kind's fill; 'h07' also expired ones
LIVE_PER_HOLDER = 200
EXPIRED = 5
SHOWPLAN = "{http://schemas.microsoft.com/sqlserver/2004/07/showplan}"

# variant: (catalog entry, the columns the fill gives, the pinned index, a seek or an ordered scan)
VARIANTS = {
    "heap": ({"kind": "heap"}, {}, "pk_q", "scan"),
    "fifo": ({"kind": "fifo"}, {}, "pk_q", "scan"),
    "lifo": ({"kind": "lifo"}, {}, "pk_q", "scan"),
    "pending": ({"kind": "pending"}, {"due_at": "SYSUTCDATETIME()"}, "pk_q", "seek"),
    "work": ({"kind": "work"}, {"due_at": "SYSUTCDATETIME()", "visible_at": "SYSUTCDATETIME()"}, "ix_q_ready", "seek"),
    "work_priority": ({"kind": "work", "options": {"priority": True}},
                      {"due_at": "SYSUTCDATETIME()", "visible_at": "SYSUTCDATETIME()", "priority": "n % 3"},
                      "ix_q_ready_priority", "seek"),
}


def cached_reads(conn: Any, schema: str, procedure: str) -> list[tuple[str, str, bool]]:
    """(physical operator, index, ordered) of every read of table q in the procedure's cached plan."""
    rows = conn.execute(
        "SELECT CONVERT(nvarchar(max), p.query_plan) FROM sys.dm_exec_procedure_stats AS s "
        "CROSS APPLY sys.dm_exec_query_plan(s.plan_handle) AS p "
        "WHERE s.database_id = DB_ID() AND s.object_id = OBJECT_ID(?)", f"[{schema}].[{procedure}]").fetchall()
    assert rows, f"{procedure}: no cached plan"
    reads = []
    for (plan,) in rows:
        for relop in ElementTree.fromstring(plan).iter(f"{SHOWPLAN}RelOp"):
            for child in relop:
                target = child.find(f"{SHOWPLAN}Object")
                if child.tag.endswith("IndexScan") and target is not None and target.get("Table") == "[q]":
                    reads.append((relop.get("PhysicalOp"), (target.get("Index") or "").strip("[]"),
                                  child.get("Ordered") in ("1", "true")))
    return reads


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_plan_cached_on_an_empty_queue_seeks_on_its_pinned_index_at_depth(
        deploy_queues: Any, variant: str) -> None:
    entry, columns, index, access = VARIANTS[variant]
    deployed = deploy_queues({"name": "q", "payload": "json", **entry})
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    try:
        client = deployed.client("q", conn)
        work = entry["kind"] == "work"

        def dequeue() -> list[dict]:
            return client.dequeue(worker="w") if work else client.dequeue()

        assert dequeue() == [] and client.wait(0) is False       # compiled and cached on the empty queue
        names = ", ".join(["payload", *columns])
        values = ", ".join(["N'{}'", *columns.values()])
        conn.execute(f"INSERT INTO [{schema}].[q] ({names}) SELECT {values} FROM (SELECT TOP ({DEPTH}) "
                     "ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS n FROM sys.all_columns AS a "
                     "CROSS JOIN sys.all_columns AS b) AS numbers")
        if work:
            lease(conn, schema)
            # A session of its own: its look is due on its first call; the expired leases first.
            fresh = deployed.connect(autocommit=True)
            try:
                taken = deployed.client("q", fresh).dequeue(batch_size=EXPIRED + 1, worker="w2")
            finally:
                fresh.close()
            assert sorted(m["attempts"] for m in taken) == [1] + [2] * EXPIRED, taken
        assert len(dequeue()) == 1 and client.wait(0) is True
        for verb in ("dequeue", "wait"):
            reads = cached_reads(conn, schema, f"q_{verb}")
            assert reads, f"{verb}: no read of the queue table in its plan"
            on_pin = [read for read in reads if read[1] == index]
            assert on_pin, f"{verb}: no read on {index}: {reads}"
            if access == "seek":      # every read of the table a seek, but the probes for the first
                # lease holder and the first priority level: one end of their index, under TOP (1)
                first_probes = {"ix_q_lease", "ix_q_ready_priority"}
                assert all(operator.endswith("Index Seek") or (name in first_probes and ordered)
                           for operator, name, ordered in reads), (verb, reads)
                assert not work or any(name == "ix_q_lease" and operator.endswith("Index Seek")
                                       for operator, name, _ in reads), (verb, reads)
            else:                     # one end of the clustered key: its first rows under TOP
                assert {name for _, name, _ in reads} == {index}, (verb, reads)
                assert verb == "wait" or any(ordered for _, _, ordered in on_pin), (verb, reads)
    finally:
        conn.close()


def lease(conn: Any, schema: str) -> None:
    """HOLDERS workers' live leases (an hour left), and EXPIRED of 'h07''s expired a minute ago, on
    the oldest ready messages: what a fleet at work and one crashed worker leave in the lease index."""
    conn.execute(
        f"WITH oldest AS (SELECT TOP ({HOLDERS * LIVE_PER_HOLDER + EXPIRED}) m.*, "
        "ROW_NUMBER() OVER (ORDER BY m.id) AS n "
        f"FROM [{schema}].[q] AS m WHERE m.leased_by IS NULL ORDER BY m.id) "
        "UPDATE oldest SET attempts = 1, leased_at = DATEADD(MINUTE, -2, SYSUTCDATETIME()), lease_token = NEWID(), "
        f"leased_by = IIF(n <= {EXPIRED}, N'h07', CONCAT(N'h', FORMAT(n % {HOLDERS}, '00'))), "
        f"visible_at = IIF(n <= {EXPIRED}, DATEADD(MINUTE, -1, SYSUTCDATETIME()), "
        "DATEADD(HOUR, 1, SYSUTCDATETIME()))")
