"""Catalog option changes on deployed queues (PostgreSQL): the options that add storage are migrations
that keep every message; client ids change only an empty queue; kind and payload type changes are
refused with the message count; every step takes its locks with a timeout and retries, so a
migration queued behind a long transaction does not stall the queue's traffic (docs/upgrades.md)."""
from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from releases import V010, deploy_catalog, describe_postgres_schema, populate, snapshot
from tablequeue.catalog import Catalog, parse_catalog
from tablequeue.client import QueueClient
from tablequeue.deploy import CREATE, MIGRATE, UNCHANGED, DeployRefused, LockPolicy, deploy
from tablequeue.engines import EngineError, connect, dialect_for
from tablequeue.render import MigrationSource, render_catalog

ROOTS = Path(__file__).resolve().parent / "fixtures" / "template_roots"
BEFORE = [{"name": "h", "kind": "heap", "payload": "text"},
          {"name": "f", "kind": "fifo", "payload": "json"},
          {"name": "p", "kind": "pending", "payload": "binary"},
          {"name": "w", "kind": "work", "payload": "json", "options": {"max_attempts": 2}},
          {"name": "c", "kind": "work", "payload": "json", "options": {"max_attempts": 2, "history": True}}]
AFTER = [{**BEFORE[0], "options": {"dedupe": True}},
         {**BEFORE[1], "options": {"dedupe": True}},
         {**BEFORE[2], "options": {"dedupe": True}},
         {**BEFORE[3], "options": {"max_attempts": 2, "dedupe": True, "priority": True, "history": True}},
         {**BEFORE[4], "options": {"max_attempts": 2, "history": True, "priority": True}}]


def catalog(schema: str, queues: list[dict]) -> Catalog:
    return parse_catalog({"schema": schema, "queues": queues}, f"<test catalog {schema}>")


def without_options(queues: list[dict], *names: str) -> list[dict]:
    return [{**queue, "options": {k: v for k, v in queue.get("options", {}).items() if k not in names}}
            for queue in queues]



def without(rows: list[tuple], columns: set[str]) -> list[tuple]:
    return sorted((tuple(pair for pair in row if pair[0] not in columns) for row in rows), key=repr)


def test_options_that_add_storage_migrate_and_keep_every_message(pg_url: str, pg_schemas: list[str]) -> None:
    schema, fresh = pg_schemas
    before_catalog, after_catalog = catalog(schema, BEFORE), catalog(schema, AFTER)
    deploy_catalog(pg_url, schema, before_catalog)
    conn = connect(pg_url)
    try:
        seen = {queue.name: populate(V010(conn, schema, queue)) for queue in before_catalog.queues}
        before = snapshot(conn, schema)

        result = deploy_catalog(pg_url, schema, after_catalog)
        plan = {item.unit.name: item for item in result.plan.items}
        assert [m.name for m in plan[f"{schema}.h"].migrations] == ["destructive_table_add_dedupe"]
        assert [m.name for m in plan[f"{schema}.w"].migrations] == ["work_table_add_dedupe", "work_table_add_priority"]
        assert [m.name for m in plan[f"{schema}.w_dead"].migrations] == ["work_dead_add_dedupe", "work_dead_add_priority"]
        assert [m.name for m in plan[f"{schema}.c_history"].migrations] == ["work_history_add_priority"]
        assert plan[f"{schema}.w_history"].action == CREATE   # history is a table of its own: created
        assert {item.action for item in result.plan.items if item.unit.type == "storage"} <= {MIGRATE, CREATE,
                                                                                               UNCHANGED}

        after = snapshot(conn, schema)
        added = {"dedupe_key", "priority"}
        assert set(before) <= set(after) and set(after) - set(before) == {"w_history", "w_history_history_id_seq"}
        for table, rows in before.items():
            if not isinstance(rows, list):
                assert after[table] == rows, table   # sequences where they were
                continue
            assert without(after[table], added) == without(rows, added), table
            for row in after[table]:   # what the new columns hold for the messages already there
                values = dict(row)
                assert values.get("dedupe_key") is None and values.get("priority", 0) == 0, (table, values)

        deploy_catalog(pg_url, fresh, catalog(fresh, AFTER))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
        assert {item.action for item in deploy_catalog(pg_url, schema, after_catalog).plan.items} == {UNCHANGED}

        # The options work on the migrated queues, next to the messages that were there.
        for name in ("h", "f", "p"):
            call = V010(conn, schema, after_catalog.queue(name))
            first = call("enqueue", payload=call.payload(1), dedupe_key="k")[0]
            assert call("enqueue", payload=call.payload(2), dedupe_key="k")[0] == {"id": first["id"], "duplicate": True}
        work = V010(conn, schema, after_catalog.queue("w"))
        urgent = work("enqueue", payload=work.payload(1), priority=9, dedupe_key="urgent")[0]["id"]
        assert [row["id"] for row in work("dequeue", worker="w-1")] == [urgent]
        assert work("complete", id=urgent, worker="w-1") == [{"completed": True}]
        assert [row["id"] for row in work("dequeue", batch_size=10, worker="w-1")] == seen["w"]["ready"]
        assert work("complete", id=seen["w"]["leased"], worker="w-live") == [{"completed": True}]
        assert [row["id"] for row in work("dead_list")] == [seen["w"]["dead"]]
    finally:
        conn.close()


def test_options_turned_off_drop_their_storage_after_the_code_units(pg_url: str, pg_schemas: list[str]) -> None:
    schema, fresh = pg_schemas
    on, off = catalog(schema, AFTER), catalog(schema, without_options(AFTER, "dedupe", "priority"))
    deploy_catalog(pg_url, schema, on)
    conn = connect(pg_url)
    try:
        seen = {queue.name: populate(V010(conn, schema, queue)) for queue in on.queues}
        before = snapshot(conn, schema)
        progress: list[str] = []
        result = deploy_catalog(pg_url, schema, off, progress=progress.append)
        plan = {item.unit.name: item for item in result.plan.items}
        assert [m.name for m in plan[f"{schema}.w"].migrations] == ["work_table_drop_dedupe", "work_table_drop_priority"]
        assert [m.name for m in plan[f"{schema}.w_history"].migrations] == ["work_history_drop_priority"]
        # What the old procedures still use goes only once the new ones are in place.
        code_done = max(i for i, line in enumerate(progress) if re.match(r"\[\d+/\d+\] (create|update) code ", line))
        drops = [i for i, line in enumerate(progress) if "drop column" in line]
        defaults = [i for i, line in enumerate(progress) if "give column priority a default" in line]
        assert drops and min(drops) > code_done and defaults and max(defaults) < code_done, progress

        after = snapshot(conn, schema)
        assert set(after) == set(before)
        for table, rows in before.items():
            if isinstance(rows, list):
                assert without(after[table], set()) == without(rows, {"dedupe_key", "priority"}), table
        deploy_catalog(pg_url, fresh, catalog(fresh, without_options(AFTER, "dedupe", "priority")))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
        work = V010(conn, schema, off.queue("w"))
        assert [row["id"] for row in work("dequeue", batch_size=10, worker="w-1")] == seen["w"]["ready"]
        assert [row["id"] for row in work("dead_list")] == [seen["w"]["dead"]]
        assert work("dead_requeue", id=seen["w"]["dead"]) == [{"requeued": True}]
    finally:
        conn.close()


def test_old_procedures_keep_writing_history_and_dead_letters_while_priority_is_turned_on(
        pg_url: str, pg_schemas: list[str]) -> None:
    """Between the storage migrations and the new code units, the old complete and fail still write
    history and dead-letter rows without naming priority: the new column's default stays until the
    new procedures are in place, and goes after them (a fresh install has none)."""
    schema, fresh = pg_schemas
    before = [{"name": "c", "kind": "work", "payload": "json", "options": {"max_attempts": 1, "history": True}}]
    after = [{**before[0], "options": {**before[0]["options"], "priority": True}}]
    deploy_catalog(pg_url, schema, catalog(schema, before))
    conn, traffic = connect(pg_url), connect(pg_url)
    try:
        old = V010(traffic, schema, catalog(schema, before).queue("c"))
        done, doomed = (old("enqueue", payload=old.payload(n))[0]["id"] for n in (1, 2))
        assert [row["id"] for row in old("dequeue", batch_size=2, worker="w")] == [done, doomed]
        migrated: set[str] = set()
        calls: dict[str, Any] = {}
        progress: list[str] = []

        def old_procedures_write(line: str) -> None:
            progress.append(line)
            step = re.search(r"work_(dead|history)_add_priority \d+/\d+ add column priority", line)
            if step:
                migrated.add(step.group(1))
            if migrated == {"dead", "history"} and not calls:
                assert not any(re.match(r"\[\d+/\d+\] (create|update) code ", seen) for seen in progress), progress
                for verb, params in (("complete", {"id": done, "worker": "w"}),
                                     ("fail", {"id": doomed, "worker": "w", "error": "boom"})):
                    try:
                        calls[verb] = old(verb, **params)
                    except psycopg.Error as exc:
                        calls[verb] = exc

        deploy_catalog(pg_url, schema, catalog(schema, after), progress=old_procedures_write)
        assert calls == {"complete": [{"completed": True}], "fail": [{"outcome": "dead"}]}
        assert conn.execute(f'SELECT id, priority FROM "{schema}"."c_history"').fetchall() == [(done, 0)]
        assert conn.execute(f'SELECT id, priority FROM "{schema}"."c_dead"').fetchall() == [(doomed, 0)]
        deploy_catalog(pg_url, fresh, catalog(fresh, after))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
    finally:
        conn.close()
        traffic.close()


def test_client_ids_change_an_empty_queue_and_refuse_one_with_messages(pg_url: str, pg_schemas: list[str]) -> None:
    schema = pg_schemas[0]
    queues = [{"name": "e", "kind": "work", "payload": "json"}, {"name": "m", "kind": "work", "payload": "json"}]
    deploy_catalog(pg_url, schema, catalog(schema, queues))
    conn = connect(pg_url)
    try:
        V010(conn, schema, catalog(schema, queues).queue("m"))("enqueue", payload='{"n": 1}')
        with_ids = [{**queue, "options": {"client_ids": True}} for queue in queues]
        with pytest.raises(DeployRefused) as refused:
            deploy_catalog(pg_url, schema, catalog(schema, with_ids))
        message = str(refused.value)
        assert "queue 'm': client_ids off -> on changes the id type" in message and "holds 1 message(s)" in message
        assert "queue 'e'" not in message   # the empty one would have been fine

        result = deploy_catalog(pg_url, schema, catalog(schema, [with_ids[0], queues[1]]))
        plan = {item.unit.name: item for item in result.plan.items}
        assert [m.name for m in plan[f"{schema}.e"].migrations] == ["drop_empty_table"]
        assert plan[f"{schema}.ix_e_lease_start"].action == CREATE   # went with the table, built again
        assert plan[f"{schema}.e_enqueue_result"].action == CREATE
        call = V010(conn, schema, catalog(schema, [with_ids[0]]).queue("e"))
        given = "6f1c1f5e-8a43-4f7e-9d3c-2b1a0c9e8d7f"
        assert str(call("enqueue", payload='{"n": 1}', id=given)[0]["id"]) == given
        assert str(call("dequeue", worker="w")[0]["id"]) == given
        fresh = pg_schemas[1]
        deploy_catalog(pg_url, fresh, catalog(fresh, [with_ids[0], queues[1]]))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
    finally:
        conn.close()


def test_kind_and_payload_type_changes_are_refused_with_the_message_count(pg_url: str, pg_schemas: list[str]) -> None:
    schema = pg_schemas[0]
    queues = [{"name": "a", "kind": "heap", "payload": "text"}, {"name": "b", "kind": "fifo", "payload": "json"}]
    deploy_catalog(pg_url, schema, catalog(schema, queues))
    conn = connect(pg_url)
    try:
        for name in ("a", "b"):
            call = V010(conn, schema, catalog(schema, queues).queue(name))
            for n in range(2):
                call("enqueue", payload=call.payload(n))
        changed = [{**queues[0], "kind": "lifo"}, {**queues[1], "payload": "text"}]
        with pytest.raises(DeployRefused) as refused:
            deploy_catalog(pg_url, schema, catalog(schema, changed))
        message = str(refused.value)
        assert "queue 'a': a kind change from heap to lifo" in message and f"{schema}.a holds 2 message(s)" in message
        assert "queue 'b': a payload type change from json to text" in message and f"{schema}.b holds 2 message(s)" in message
    finally:
        conn.close()


def _fixture_deploy(url: str, schema: str, root: str, **kwargs: Any):
    cat = parse_catalog({"schema": schema, "queues": [{"name": "q", "kind": "heap", "payload": "text"}]})
    units = [u for f in render_catalog(cat, "postgres", extra_root=ROOTS / root) for u in f.units]
    conn = connect(url)
    try:
        return deploy(conn, dialect_for("postgres"), schema, units,
                      migrations=MigrationSource("postgres", ROOTS / root), **kwargs)
    finally:
        conn.close()


def _index_valid(conn: Any, schema: str, index: str) -> bool | None:
    row = conn.execute("SELECT i.indisvalid FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
                       "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                       (schema, index)).fetchone()
    return None if row is None else row[0]


def test_a_failed_concurrent_build_leaves_an_invalid_index_that_the_next_deploy_builds_again(
        pg_url: str, pg_schemas: list[str]) -> None:
    schema = pg_schemas[0]
    _fixture_deploy(pg_url, schema, "v2")
    writer = connect(pg_url, autocommit=False)
    conn = connect(pg_url)
    try:
        # An open transaction that wrote to the table: CREATE INDEX CONCURRENTLY waits for it.
        writer.execute(f'INSERT INTO "{schema}"."q" (payload) VALUES (\'waiting\')')
        with pytest.raises(EngineError, match="concurrent index build waited"):
            _fixture_deploy(pg_url, schema, "v3", lock_policy=LockPolicy(timeout_seconds=0.2, retry_for_seconds=1))
        assert _index_valid(conn, schema, "ix_q_note") is False
        writer.commit()
        result = _fixture_deploy(pg_url, schema, "v3")
        table = next(item for item in result.plan.items if item.unit.name == f"{schema}.q")
        assert [m.name for m in table.migrations] == ["heap_table_v2_to_v3"]
        assert _index_valid(conn, schema, "ix_q_note") is True
        assert conn.execute(f'SELECT count(*) FROM "{schema}"."q"').fetchone()[0] == 1
    finally:
        writer.close()
        conn.close()


def test_a_migration_behind_a_long_transaction_retries_without_stalling_the_queue(
        pg_url: str, pg_schemas: list[str]) -> None:
    schema = pg_schemas[0]
    queues = [{"name": "w", "kind": "work", "payload": "json"}]
    deploy_catalog(pg_url, schema, catalog(schema, queues))
    holder = connect(pg_url, autocommit=False)
    traffic = connect(pg_url)
    progress: list[str] = []
    waiting, finished = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def report(line: str) -> None:
        progress.append(line)
        if "waiting:" in line:
            waiting.set()

    def run() -> None:
        try:
            outcome["result"] = deploy_catalog(pg_url, schema, catalog(schema, [{**queues[0], "options": {"dedupe": True}}]),
                                               lock_policy=LockPolicy(timeout_seconds=0.5, retry_for_seconds=300),
                                               progress=report)
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc
        finally:
            finished.set()

    try:
        queue = catalog(schema, queues).queue("w")
        V010(traffic, schema, queue)("enqueue", payload='{"n": 1}')
        # A long transaction holds the message (and so a lock on the table) the whole time.
        held = V010(holder, schema, queue)("dequeue", worker="long")
        assert len(held) == 1
        deployer = threading.Thread(target=run)
        deployer.start()
        assert waiting.wait(120), progress
        # The queue's traffic goes on while the migration waits: each attempt gives way after 0.5 s.
        traffic.execute("SET statement_timeout = '60s'")
        call = V010(traffic, schema, queue)
        new_id = call("enqueue", payload='{"n": 2}')[0]["id"]
        assert [row["id"] for row in call("dequeue", worker="other")] == [new_id]
        assert call("complete", id=new_id, worker="other") == [{"completed": True}]
        assert not finished.is_set() and "error" not in outcome   # still retrying
        holder.commit()
        deployer.join(300)
        assert finished.is_set() and "error" not in outcome, outcome.get("error")
        migrated = {item.unit.name: item for item in outcome["result"].plan.items}[f"{schema}.w"]
        assert [m.name for m in migrated.migrations] == ["work_table_add_dedupe"]
        assert sum("waiting:" in line for line in progress) >= 1
        assert traffic.execute(f'SELECT count(*) FROM "{schema}"."w" WHERE dedupe_key IS NULL').fetchone()[0] == 1
    finally:
        try:
            holder.rollback()
        except psycopg.Error:
            pass
        holder.close()
        traffic.close()


GROUPED = [{"name": "f", "kind": "fifo", "payload": "json"},
           {"name": "w", "kind": "work", "payload": "json", "options": {"max_attempts": 2, "history": True}}]


def test_groups_turned_on_keep_every_message_first_and_turned_off_keep_them_in_order(
        pg_url: str, pg_schemas: list[str]) -> None:
    """groups: true on deployed fifo and work queues: the messages waiting become messages without a
    group, in their order, ahead of grouped ones enqueued later; the schema is a fresh install's.
    Turned off again, grouped messages waiting become plain ones, in enqueue order."""
    schema, fresh = pg_schemas
    plain = catalog(schema, GROUPED)
    grouped_queues = [{**queue, "options": {**queue.get("options", {}), "groups": True}} for queue in GROUPED]
    grouped = catalog(schema, grouped_queues)
    deploy_catalog(pg_url, schema, plain)
    conn = connect(pg_url)
    try:
        seen = {queue.name: populate(V010(conn, schema, queue)) for queue in plain.queues}
        before = snapshot(conn, schema)

        result = deploy_catalog(pg_url, schema, grouped)
        plan = {item.unit.name: item for item in result.plan.items}
        assert [m.name for m in plan[f"{schema}.f"].migrations] == ["fifo_table_add_groups"]
        assert [m.name for m in plan[f"{schema}.w"].migrations] == ["work_table_add_groups"]
        assert [m.name for m in plan[f"{schema}.w_dead"].migrations] == ["work_dead_add_groups"]
        assert [m.name for m in plan[f"{schema}.w_history"].migrations] == ["work_history_add_groups"]
        assert plan[f"{schema}.f_groups"].action == CREATE and plan[f"{schema}.w_groups"].action == CREATE
        after = snapshot(conn, schema)
        added = {"group_key", "group_head"}
        assert set(after) - set(before) == {"f_groups", "w_groups"} and not after["f_groups"] and not after["w_groups"]
        for table, rows in before.items():
            if isinstance(rows, list):
                assert without(after[table], added) == without(rows, added), table
                assert all(dict(row).get("group_key") is None for row in after[table]), table
        deploy_catalog(pg_url, fresh, catalog(fresh, grouped_queues))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
        assert {item.action for item in deploy_catalog(pg_url, schema, grouped).plan.items} == {UNCHANGED}

        # The messages that were waiting come first (older), then a group's messages one at a time.
        fifo = QueueClient.for_catalog(conn, "postgres", grouped, "f")
        fifo_late = [fifo.enqueue({"n": n}, group_key="g")["id"] for n in range(2)]
        assert [row["id"] for row in fifo.dequeue(batch_size=10)] == seen["f"]["ready"] + fifo_late[:1]
        work = QueueClient.for_catalog(conn, "postgres", grouped, "w")
        work_late = [work.enqueue({"n": n}, group_key="g")["id"] for n in range(2)]
        assert [row["id"] for row in work.dequeue(batch_size=10, worker="w-1")] == seen["w"]["ready"] + work_late[:1]

        # Off again: the grouped messages waiting are plain ones, in enqueue order.
        waiting = fifo_late[1:] + [fifo.enqueue({"n": n}, group_key=f"g{n % 2}")["id"] for n in range(4)]
        result = deploy_catalog(pg_url, schema, plain)
        plan = {item.unit.name: item for item in result.plan.items}
        assert [m.name for m in plan[f"{schema}.f"].migrations] == ["fifo_table_drop_groups"]
        assert [m.name for m in plan[f"{schema}.w"].migrations] == ["work_table_drop_groups"]
        # Recorded as rendered (a shape without groups): the next deploy changes nothing.
        assert {item.action for item in deploy_catalog(pg_url, schema, plain).plan.items} == {UNCHANGED}
        fifo = QueueClient.for_catalog(conn, "postgres", plain, "f")
        assert [row["id"] for row in fifo.dequeue(batch_size=10)] == waiting
        deploy_catalog(pg_url, fresh, catalog(fresh, GROUPED))
        # The groups tables stay, emptied (tablequeue leaves a table it no longer renders).
        conn.execute(f'DROP TABLE "{schema}"."f_groups", "{schema}"."w_groups"')
        conn.execute(f'DROP TABLE "{fresh}"."f_groups", "{fresh}"."w_groups"')
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)
    finally:
        conn.close()
