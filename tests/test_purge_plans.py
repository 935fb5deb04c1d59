"""Purge under a generic plan (PostgreSQL): a purge reads the rows it removes, not the whole table.

PL/pgSQL switches a statement to a generic plan after a few calls (and at once under
plan_cache_mode = force_generic_plan). The generic plan of `LIMIT max_rows` is costed for a tenth of
the table, and 0.2.0's `DELETE ... USING doomed` then became a hash join over a sequential scan of the
whole queue (the reviewer measured 140 ms against 3 ms at 200,000 rows). These tests run each purge
with the generic plan forced and read its statements' plans (auto_explain, nested statements): the
table it deletes from is never read by a sequential scan, and the purge removes what it must.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest

pytestmark = pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)

DEPTH = 1_000
PURGED = 5
KINDS = {
    "heap": {"kind": "heap"},
    "fifo": {"kind": "fifo"},
    "lifo": {"kind": "lifo"},
    "pending": {"kind": "pending"},
    "work": {"kind": "work", "options": {"history": True}},
}


def plans_of(conn: Any, sql: str, params: tuple = ()) -> tuple[list[tuple], list[str]]:
    """Run sql with the generic plan forced; its rows and the plans of the statements it ran."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    for setting, value in (("plan_cache_mode", "force_generic_plan"), ("auto_explain.log_min_duration", "0"),
                           ("auto_explain.log_nested_statements", "on"), ("client_min_messages", "log")):
        conn.execute(f"SET {setting} = {value}")
    try:
        rows = conn.execute(sql, params).fetchall()
    finally:
        for setting in ("client_min_messages", "auto_explain.log_min_duration", "plan_cache_mode"):
            conn.execute(f"RESET {setting}")
    return rows, [n for n in notices if "Query Text:" in n]


def assert_no_sequential_scan(plans: list[str], table: str) -> None:
    assert any(f" on {table} " in plan for plan in plans), f"no plan reads {table}: auto_explain saw nothing"
    scans = [plan for plan in plans if f"Seq Scan on {table} " in plan]
    assert not scans, f"a sequential scan of {table}:\n" + "\n".join(scans)


@pytest.mark.parametrize("variant", KINDS)
def test_purge_under_a_generic_plan_reads_only_what_it_removes(deploy_queues: Callable[..., Any], variant: str) -> None:
    deployed = deploy_queues({"name": "q", "payload": "json", **KINDS[variant]})
    schema = deployed.catalog.schema
    conn = deployed.connect()
    try:
        client = deployed.client("q", conn)
        client.enqueue_batch({"payload": {"i": i}} for i in range(DEPTH))
        conn.execute(f'ANALYZE "{schema}"."q"')
        conn.execute("LOAD 'auto_explain'")
        for older_than in (None, "infinity"):
            rows, plans = plans_of(conn, f'SELECT purged FROM "{schema}"."q_purge"(older_than => %s, max_rows => %s)',
                                   (older_than, PURGED))
            assert rows == [(PURGED,)]
            assert_no_sequential_scan(plans, "q")
        assert client.stats()["ready"] + client.stats()["delayed"] == DEPTH - 2 * PURGED
    finally:
        conn.close()


def test_history_purge_under_a_generic_plan_reads_only_what_it_removes(deploy_queues: Callable[..., Any]) -> None:
    deployed = deploy_queues({"name": "q", "payload": "json", **KINDS["work"]})
    schema = deployed.catalog.schema
    conn = deployed.connect()
    try:
        client = deployed.client("q", conn)
        client.enqueue_batch({"payload": {"i": i}} for i in range(DEPTH))
        ids = [row["id"] for row in client.dequeue(batch_size=DEPTH, worker="w")]
        completed = conn.execute(f'SELECT count(*) FILTER (WHERE c.completed) FROM unnest(%s::bigint[]) AS u (id) '
                                 f'CROSS JOIN LATERAL "{schema}"."q_complete"(id => u.id, worker => %s) AS c',
                                 (ids, "w")).fetchone()[0]
        assert completed == DEPTH
        conn.execute(f'ANALYZE "{schema}"."q_history"')
        conn.execute("LOAD 'auto_explain'")
        rows, plans = plans_of(conn, f'SELECT purged FROM "{schema}"."q_history_purge"(older_than => %s, max_rows => %s)',
                               ("infinity", PURGED))
        assert rows == [(PURGED,)]
        assert_no_sequential_scan(plans, "q_history")
        left = conn.execute(f'SELECT count(*) FROM "{schema}"."q_history"').fetchone()[0]
        assert left == DEPTH - PURGED
    finally:
        conn.close()
