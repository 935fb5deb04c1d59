"""Upgrading a deployed release to the current templates keeps every message (docs/upgrades.md).

The kept release 0.1.0 (tests/fixtures/releases/) is deployed to PostgreSQL as 0.1.0's own deploy
did, every queue of the option matrix gets messages in every state through 0.1.0's call shapes,
and the current tool deploys the same catalog over it. Then every row is what it was, the live
lease is still the worker's, every verb works with 0.1.0's call shapes, and the schema is what a
fresh install of the same catalog creates.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import yaml

from releases import (LATER, RELEASES, V010, deploy_catalog, deploy_v010, describe_postgres_schema, populate,
                      release_catalog, release_units, snapshot)
from tablequeue.catalog import parse_catalog
from tablequeue.deploy import CREATE, MIGRATE, RECORD, UNCHANGED
from tablequeue.engines import connect, dialect_for

RELEASE = "0.1.0"



def check_verbs(call: V010, seen: dict[str, Any], conn: Any) -> None:
    """Every verb of the queue, called as 0.1.0 called it, on the messages 0.1.0 left."""
    queue = call.queue
    options = queue.options
    if options.get("dedupe"):
        existing_key, existing_id = seen["key"]
        again = call("enqueue", payload=call.payload(99), dedupe_key=existing_key)[0]
        assert (again["id"], again["duplicate"]) == (existing_id, True), queue.name
    new_id = call("enqueue", payload=call.payload(50))[0]["id"]
    batch = call("enqueue_batch", payloads=[call.payload(51), call.payload(52)])
    assert [row["duplicate"] for row in batch] == [False, False]
    stats = call("stats")[0]
    if queue.kind != "work":
        assert stats["ready"] >= len(seen["ready"]) + 3, (queue.name, stats)
        taken = [row["id"] for row in call("dequeue", batch_size=100)]
        expected = seen["ready"] + [new_id] + [row["id"] for row in batch]
        assert sorted(taken) == sorted(expected), queue.name
        if queue.kind == "fifo":
            assert taken == sorted(expected), queue.name  # oldest first, as before the upgrade
        if queue.kind == "lifo":
            assert taken == sorted(expected, reverse=True), queue.name
        if queue.kind == "pending":
            assert seen["not_due"] not in taken and call("purge", older_than=LATER + timedelta(days=1)) == [{"purged": 1}]
        return
    # The live lease is still the worker's: nobody else gets the message or may finish it.
    other = call("dequeue", batch_size=100, worker="w-other", lease_seconds=600)
    taken = [row["id"] for row in other]
    assert seen["leased"] not in taken and seen["retried"] not in taken and seen["delayed"] not in taken
    assert sorted(map(str, taken)) == sorted(map(str, seen["ready"] + [new_id] + [r["id"] for r in batch]))
    assert call("complete", id=seen["leased"], worker="w-other") == [{"completed": False}]
    assert call("extend_lease", id=seen["leased"], worker="w-live", lease_seconds=600) == [{"extended": True}]
    assert call("complete", id=seen["leased"], worker="w-live") == [{"completed": True}]
    assert call("fail", id=taken[0], worker="w-other", error="after the upgrade",
                retry_after_seconds=0) == [{"outcome": "retrying" if options["max_attempts"] > 1 else "dead"}]
    for message in taken[1:]:
        assert call("complete", id=message, worker="w-other") == [{"completed": True}]
    dead = call("dead_list")
    assert [row["id"] for row in dead] == [seen["dead"]] and dead[0]["attempts"] == options["max_attempts"]
    assert dead[0]["last_error"] == f"failure {options['max_attempts'] - 1}"
    assert call("dead_requeue", id=seen["dead"]) == [{"requeued": True}]
    assert call("dead_list") == []
    if options.get("history"):
        purged = call("history_purge", older_than=LATER)[0]["purged"]
        assert purged == 1 + 1 + len(taken) - 1, queue.name   # before the upgrade, the leased one, the rest
    assert call("stats")[0]["delayed"] >= 2   # the retried and the delayed messages wait as they did
    if options.get("handler") and "." not in options["handler"]:   # a handler in the queue's own schema
        conn.execute(f'CREATE PROCEDURE "{call.schema}"."{options["handler"]}"(id bigint, payload jsonb) '
                     "LANGUAGE plpgsql AS $$ BEGIN NULL; END $$")
        cursor = conn.execute(f'CALL "{call.schema}"."{queue.name}_process"(time_budget_seconds => 10)')
        assert dict(zip([c.name for c in cursor.description], cursor.fetchone()))["completed"] >= 1


def without_column(tables: dict[str, Any], column: str, value: Any) -> dict[str, Any]:
    """The snapshot with one column removed from every row, after checking it holds value."""
    stripped: dict[str, Any] = {}
    for table, rows in tables.items():
        if not isinstance(rows, list):
            stripped[table] = rows
            continue
        stripped[table] = []
        for row in rows:
            assert dict(row).get(column, value) == value, (table, row)
            stripped[table].append(tuple(pair for pair in row if pair[0] != column))
    return stripped


def test_upgrade_from_0_1_0_keeps_every_message_and_every_verb_works(pg_url: str, pg_schemas: list[str]) -> None:
    schema, fresh = pg_schemas
    catalog = release_catalog(RELEASE, "option_matrix", schema)
    conn = connect(pg_url)
    try:
        deploy_v010(conn, "postgres", release_units(RELEASE, "postgres", "option_matrix", schema), schema)
        seen = {queue.name: populate(V010(conn, schema, queue)) for queue in catalog.queues}
        before = snapshot(conn, schema)
        assert sum(len(rows) for name, rows in before.items() if isinstance(rows, list)) > 60

        result = deploy_catalog(pg_url, schema, catalog)
        actions = {item.unit.name: item.action for item in result.plan.items}
        assert actions[f"{schema}.tablequeue_deploy_history"] == MIGRATE   # the history's own v1 -> v2
        storage = [item for item in result.plan.items if item.unit.type == "storage" and item.unit.queue]
        # The work tables take storage version 2 (the lease token), 3 (ix_<q>_ready for the claim and
        # ix_<q>_lease dropped) and 4 (no CHECK constraints), their dead-letter tables version 2 (SQL Server's clustering with client
        # ids: here a recorded no-op, their dead letters kept and listed by check_verbs); everything else
        # is recorded as it is.
        work_tables = {f"{schema}.{queue.name}" for queue in catalog.queues if queue.kind == "work"}
        dead_tables = {f"{name}_dead" for name in work_tables}
        migrated = {item.unit.name: [m.name for m in item.migrations] for item in storage if item.action == MIGRATE}
        assert migrated == {**{name: ["work_table_v1_to_v2", "work_table_v2_to_v3", "work_table_v3_to_v4"] for name in work_tables},
                            **{name: ["work_dead_v1_to_v2"] for name in dead_tables}}
        assert {item.action for item in storage if item.unit.object != "type"
                and item.unit.name not in work_tables | dead_tables} == {RECORD}, \
            [(i.unit.name, i.action, i.reason) for i in storage]
        # enqueue's result type was part of the table's unit in 0.1.0: now a unit of its own, found in
        # place; complete_next's is new.
        assert {item.action for item in storage if item.unit.object == "type"} == {CREATE}
        # Every row as it was; the work tables' new lease_token is NULL (0.1.0's leases go by name).
        assert without_column(snapshot(conn, schema), "lease_token", None) == before

        history = dialect_for("postgres").read_history(conn, schema)
        recorded = [row for row in history if row["unit_type"] == "storage" and row["tool_version"] != "0.1.0"]
        assert all(row["storage_version"] >= 1 and (row["storage_shape"] or row["unit_name"].endswith("_history"))
                   for row in recorded)
        assert {item.action for item in deploy_catalog(pg_url, schema, catalog).plan.items} == {UNCHANGED}

        deploy_catalog(pg_url, fresh, release_catalog(RELEASE, "option_matrix", fresh))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)

        for queue in catalog.queues:
            check_verbs(V010(conn, schema, queue), seen[queue.name], conn)
    finally:
        conn.close()


def test_upgrade_from_0_1_0_with_options_turned_on_in_the_same_deploy(pg_url: str, pg_schemas: list[str]) -> None:
    # 0.1.0 recorded no shapes: what its tables show decides which migrations the new options need.
    schema, fresh = pg_schemas
    conn = connect(pg_url)
    try:
        deploy_v010(conn, "postgres", release_units(RELEASE, "postgres", "option_matrix", schema), schema)
        catalog = release_catalog(RELEASE, "option_matrix", schema)
        seen = {name: populate(V010(conn, schema, catalog.queue(name))) for name in ("heap_plain", "work_plain")}
        document = yaml.safe_load((RELEASES / RELEASE / "option_matrix.yml").read_text())
        turned_on = {"heap_plain": {"dedupe": True}, "work_plain": {"dedupe": True, "priority": True}}
        for queue in document["queues"]:
            queue["options"] = {**queue.get("options", {}), **turned_on.get(queue["name"], {})}
        document["schema"] = schema
        changed = parse_catalog(document)
        result = deploy_catalog(pg_url, schema, changed)
        plan = {item.unit.name: item for item in result.plan.items}
        assert plan[f"{schema}.heap_plain"].recorded.shape_text == "kind=heap payload=binary dedupe=off"
        assert [m.name for m in plan[f"{schema}.heap_plain"].migrations] == ["destructive_table_add_dedupe"]
        assert [m.name for m in plan[f"{schema}.work_plain"].migrations] == ["work_table_v1_to_v2", "work_table_v2_to_v3",
                                                                              "work_table_v3_to_v4", "work_table_add_dedupe", "work_table_add_priority"]
        assert [m.name for m in plan[f"{schema}.work_all"].migrations] == ["work_table_v1_to_v2", "work_table_v2_to_v3", "work_table_v3_to_v4"]
        heap = V010(conn, schema, changed.queue("heap_plain"))
        assert sorted(row["id"] for row in heap("dequeue", batch_size=10)) == sorted(seen["heap_plain"]["ready"])
        work = V010(conn, schema, changed.queue("work_plain"))
        assert work("complete", id=seen["work_plain"]["leased"], worker="w-live") == [{"completed": True}]
        document["schema"] = fresh
        deploy_catalog(pg_url, fresh, parse_catalog(document))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
    finally:
        conn.close()
