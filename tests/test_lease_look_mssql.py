"""The look for expired leases when the session context refuses its record (SQL Server; docs/work-queue.md,
"Expired leases"). dequeue, complete_next and wait record the session's look with
sys.sp_set_session_context, which refuses a key the session made read-only (15664): the verb then
looks on every call, and the caller's transaction, opened by itself or by IMPLICIT_TRANSACTIONS
(pyodbc with autocommit off), stays open and committable, under the session's XACT_ABORT ON that the
connection sets. A claim that fails after the record takes it back, also in a caller's doomed
transaction. tSQLt cannot run this: a read-only key lasts as long as the session, and a lock timeout
needs a second session. Runs only with TABLEQUEUE_MSSQL_URL.
"""
from __future__ import annotations

from typing import Any

import pyodbc
import pytest

pytestmark = pytest.mark.parametrize("engine_url", ["mssql"], indirect=True)


@pytest.mark.parametrize("mode", ["begin_transaction", "implicit_transactions"])
def test_a_read_only_look_key_leaves_the_callers_transaction_committable(deploy_queues: Any, mode: str) -> None:
    deployed = deploy_queues({"name": "q", "kind": "work", "payload": "json"})
    schema = deployed.catalog.schema
    setup = deployed.connect(autocommit=True)
    conn = deployed.connect(autocommit=mode == "begin_transaction")
    try:
        producer = deployed.client("q", setup)
        for n in range(2):
            producer.enqueue(payload={"n": n})
        # A value of another type is never trusted: the look is due on every call, and every record refused.
        conn.execute("EXEC sys.sp_set_session_context @key = ?, @value = 0, @read_only = 1",
                     f"tablequeue.{schema}.q.expired")
        if mode == "begin_transaction":
            conn.execute("BEGIN TRANSACTION")
        client = deployed.client("q", conn)
        first = client.dequeue(worker="w")
        assert len(first) == 1
        assert tuple(conn.execute("SELECT XACT_STATE(), @@TRANCOUNT").fetchone()) == (1, 1)
        completed, taken = client.complete_next(first[0]["id"], worker="w", lease_token=first[0]["lease_token"])
        assert completed and len(taken) == 1
        # Nothing ready: wait's probe for expired leases runs, and its record is refused too.
        assert client.wait(0) is False
        assert tuple(conn.execute("SELECT XACT_STATE(), @@TRANCOUNT").fetchone()) == (1, 1)
        if mode == "begin_transaction":
            conn.execute("COMMIT TRANSACTION")
        else:
            conn.commit()
        assert tuple(conn.execute("SELECT @@TRANCOUNT").fetchone()) == (0,)
        # Committed: the first message gone, the second leased to w.
        rows = setup.execute(f"SELECT leased_by FROM [{schema}].[q] ORDER BY id").fetchall()
        assert [r[0] for r in rows] == ["w"]
    finally:
        conn.close()
        setup.close()


def test_a_claim_that_fails_in_a_callers_doomed_transaction_takes_its_look_record_back(deploy_queues: Any) -> None:
    # The look's record is written before the claim; a claim that then fails (here a lock timeout on a
    # table another session holds) clears it, also when the caller's transaction is doomed, so the
    # caller's retry looks again. The error the caller gets is the claim's own.
    deployed = deploy_queues({"name": "q", "kind": "work", "payload": "json"})
    schema = deployed.catalog.schema
    setup = deployed.connect(autocommit=True)
    holder = deployed.connect(autocommit=False)
    conn = deployed.connect(autocommit=True)
    try:
        deployed.client("q", setup).enqueue(payload={"n": 1})
        holder.execute(f"SELECT TOP (1) 1 FROM [{schema}].[q] WITH (TABLOCKX, HOLDLOCK)").fetchall()
        conn.execute("SET LOCK_TIMEOUT 200")
        conn.execute("BEGIN TRANSACTION")
        with pytest.raises(pyodbc.Error) as failed:
            deployed.client("q", conn).dequeue(worker="w")
        assert "(1222)" in str(failed.value), failed.value
        # Doomed in the claim's CATCH (where the clear ran), then rolled back when the batch ended
        # (XACT_ABORT ON); the session context outlives both.
        recorded = conn.execute("SELECT XACT_STATE(), @@TRANCOUNT, IIF(SESSION_CONTEXT(?) IS NULL, 0, 1)",
                                f"tablequeue.{schema}.q.expired").fetchone()
        assert tuple(recorded) == (0, 0, 0)
    finally:
        holder.rollback()
        for c in (conn, holder, setup):
            c.close()
