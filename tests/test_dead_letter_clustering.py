"""The dead-letter table of a work queue with client ids (issue 19): storage v2 and work_dead_v1_to_v2.

SQL Server (no SQL Server runs here: the steps run on a model of the table's columns and indexes that
follows the T-SQL as SQL Server would, as tests/test_pinned_index_migrations.py does for the claim
indexes): v1 clustered the table on the random GUID; v2 clusters it on dead_seq (bigint IDENTITY) and
keeps the primary key on id NONCLUSTERED. The migration, planned from a history that records v1, ends
where a fresh install starts, also when run again or after a failure midway; without client ids it
changes nothing. PostgreSQL: the same version step is a recorded no-op, run for real.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace

import pytest

from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.deploy import MIGRATE, UNCHANGED, deploy, make_plan
from tablequeue.engines import connect, dialect_for
from tablequeue.gosplit import split_batches
from tablequeue.render import MigrationSource, render_catalog
from tablequeue.tsqltree import child, children, code, conjuncts, kind, parse_batch


class StepError(AssertionError):
    """What SQL Server would refuse at this step."""


@dataclass(frozen=True)
class Index:
    name: str
    key: str
    clustered: bool
    primary_key: bool


@dataclass(frozen=True)
class Table:
    columns: frozenset[str]
    indexes: tuple[Index, ...]

    def find(self, name: str) -> Index | None:
        return next((i for i in self.indexes if i.name == name), None)


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", text)


_COL_LENGTH = re.compile(r"COL_LENGTH\(N'[^']+',N'(?P<column>\w+)'\)IS(?P<not>NOT)?NULL")
_INDEX_ID = re.compile(r"INDEXPROPERTY\(OBJECT_ID\(N'[^']+'\),N'(?P<name>\w+)','IndexID'\)IS(?P<not>NOT)?NULL")
_CLUSTERED = re.compile(r"INDEXPROPERTY\(OBJECT_ID\(N'[^']+'\),N'(?P<name>\w+)','IsClustered'\)=1")
_HAS_KEY = re.compile(r"(?P<not>NOT)?COALESCE\(\(SELECTSTRING_AGG\(.*?WHEREi\.object_id=OBJECT_ID\(N'[^']+'\)"
                      r"ANDi\.name=N'(?P<name>\w+)'ANDi\.type=(?P<type>[12])ANDi\.is_disabled=0ANDi\.has_filter=0"
                      r"ANDic\.key_ordinal>0\),N''\)=N'(?P<key>[^']*)'")
_ADD_COLUMN = re.compile(r"ALTERTABLE\[\w+\]\.\[\w+\]ADD(?P<column>\w+)bigintIDENTITY\(1,1\)NOTNULL;?")
_DROP_CONSTRAINT = re.compile(r"ALTERTABLE\[\w+\]\.\[\w+\]DROPCONSTRAINT\[(?P<name>\w+)\];?")
_ADD_PK = re.compile(r"ALTERTABLE\[\w+\]\.\[\w+\]ADDCONSTRAINT\[(?P<name>\w+)\]PRIMARYKEY"
                     r"(?P<type>CLUSTERED|NONCLUSTERED)\((?P<key>[\w,]+)\);?")
_CREATE_INDEX = re.compile(r"CREATE(?P<unique>UNIQUE)?(?P<type>CLUSTERED|NONCLUSTERED)INDEX\[(?P<name>\w+)\]"
                           r"ON\[\w+\]\.\[\w+\]\((?P<key>[\w,]+)\);?")


def _atom(text: str, table: Table) -> bool:
    for pattern, verdict in (
            (_COL_LENGTH, lambda m: (m["column"] in table.columns) == bool(m["not"])),
            (_INDEX_ID, lambda m: (table.find(m["name"]) is not None) == bool(m["not"])),
            (_CLUSTERED, lambda m: table.find(m["name"]) is not None and table.find(m["name"]).clustered),
            (_HAS_KEY, lambda m: (table.find(m["name"]) is not None
                                  and table.find(m["name"]).clustered == (m["type"] == "1")
                                  and table.find(m["name"]).key == m["key"]) != bool(m["not"]))):
        match = pattern.fullmatch(text)
        if match:
            return verdict(match)
    raise AssertionError(f"a migration guard the model does not know: {text}")


def _statement(text: str, table: Table) -> Table:
    if match := _ADD_COLUMN.fullmatch(text):
        if match["column"] in table.columns:
            raise StepError(f"column {match['column']} already exists (Msg 2705)")
        return replace(table, columns=table.columns | {match["column"]})
    if match := _DROP_CONSTRAINT.fullmatch(text):
        found = table.find(match["name"])
        if found is None or not found.primary_key:
            raise StepError(f"no constraint {match['name']} (Msg 3728)")
        return replace(table, indexes=tuple(i for i in table.indexes if i is not found))
    if (match := _ADD_PK.fullmatch(text)) or (match := _CREATE_INDEX.fullmatch(text)):
        primary_key = "unique" not in match.groupdict()
        index = Index(match["name"], match["key"].replace(",", ", "), match["type"] == "CLUSTERED", primary_key)
        if table.find(index.name):
            raise StepError(f"{index.name}: the name is in use (Msg 1913 / 2714)")
        if index.clustered and any(i.clustered for i in table.indexes):
            raise StepError(f"{index.name}: the table has a clustered index already (Msg 1902)")
        if primary_key and any(i.primary_key for i in table.indexes):
            raise StepError(f"{index.name}: the table has a primary key already (Msg 1779)")
        if any(column not in table.columns for column in index.key.split(", ")):
            raise StepError(f"{index.name}: a key column does not exist (Msg 1911)")
        return replace(table, indexes=table.indexes + (index,))
    raise AssertionError(f"a statement the model does not know: {text}")


def _run(statement, table: Table) -> Table:
    body = code(statement)[0]
    k = kind(body)
    if k == "begin_end_block":
        for inner in children(body, "statement"):
            table = _run(inner, table)
        return table
    if k == "if_then_statement":
        condition = next(child(c, "expression") for c in code(body) if kind(c) == "if_clause")
        branches = [c for c in code(body) if kind(c) == "statement"]
        assert len(branches) == 1, _flat(body.raw)
        parts = conjuncts(condition)
        assert parts is not None, f"an OR in a migration guard: {_flat(condition.raw)}"
        if all(_atom(_flat("".join(s.raw for s in part.segments)), table) for part in parts):
            return _run(branches[0], table)
        return table
    return _statement(_flat(body.raw), table)


def run_step(sql: str, table: Table) -> Table:
    """The table after one step; a StepError rolls the step back (each step is one transaction)."""
    for batch in split_batches(sql):
        tree = parse_batch(batch.text)
        for statement in (s for b in [tree, *children(tree, "batch")] for s in children(b, "statement")):
            table = _run(statement, table)
    return table


COLUMNS = frozenset({"id", "enqueued_at", "due_at", "attempts", "last_error", "last_worker", "dead_at", "payload"})
V1 = Table(COLUMNS, (Index("pk_q_dead", "id", True, True),))


def _catalog(client_ids: bool, schema: str = "s"):
    return parse_catalog({"schema": schema, "queues": [{"name": "q", "kind": "work",
                                                        "options": {"client_ids": client_ids, "max_attempts": 1}}]},
                         "<t>")


def _units(catalog, dialect: str):
    return [u for f in render_catalog(catalog, dialect) for u in f.units]


def _dead_unit(catalog, dialect: str = "mssql"):
    return next(u for u in _units(catalog, dialect) if u.name == f"{catalog.schema}.q_dead")


def _fresh(catalog) -> Table:
    """What a fresh install's CREATE TABLE and CREATE INDEX of the dead-letter table make."""
    body = _flat(_dead_unit(catalog).body)
    columns = set(COLUMNS) | ({"dead_seq"} if "dead_seqbigintIDENTITY(1,1)NOTNULL" in body else set())
    pk = re.search(r"CONSTRAINT\[(\w+)\]PRIMARYKEY(CLUSTERED|NONCLUSTERED)\((\w+)\)", body)
    indexes = [Index(pk[1], pk[3], pk[2] == "CLUSTERED", True)]
    indexes += [Index(m["name"], m["key"], m["type"] == "CLUSTERED", False) for m in _CREATE_INDEX.finditer(body)]
    return Table(frozenset(columns), tuple(indexes))


def _planned(client_ids: bool):
    """The dead-letter unit's plan from a history that records it at v1 (as deployed before v2)."""
    catalog = _catalog(client_ids)
    unit = _dead_unit(catalog)
    history = [{"unit_name": unit.name, "unit_checksum": "v1", "tool_version": "0.2.0", "storage_version": 1,
                "storage_shape": unit.storage.shape_text, "migration": None}]
    return make_plan([unit], history, migrations=MigrationSource("mssql")).items[0]


def _as_index_set(table: Table) -> tuple[frozenset[str], frozenset[Index]]:
    return table.columns, frozenset(table.indexes)


def test_a_fresh_install_with_client_ids_clusters_the_dead_letters_on_dead_seq() -> None:
    fresh = _fresh(_catalog(True))
    assert "dead_seq" in fresh.columns
    assert set(fresh.indexes) == {Index("ux_q_dead_seq", "dead_seq", True, False), Index("pk_q_dead", "id", False, True)}
    # Without client ids the bigint IDENTITY id is sequential: clustered on it, as v1 was.
    assert _fresh(_catalog(False)) == V1


def test_the_v1_dead_letters_of_a_client_id_queue_migrate_to_what_a_fresh_install_has() -> None:
    item = _planned(True)
    assert item.action == MIGRATE and [m.name for m in item.migrations] == ["work_dead_v1_to_v2"]
    steps = item.migrations[0].steps
    assert all(step.mode == "transaction" and not step.after_code for step in steps)
    assert all("size of data" in step.locks for step in steps)
    table = V1
    for step in steps:
        table = run_step(step.sql, table)
    assert _as_index_set(table) == _as_index_set(_fresh(_catalog(True)))


def test_the_migration_runs_again_after_a_failure_midway_and_after_it_finished() -> None:
    steps = _planned(True).migrations[0].steps
    done = V1
    for step in steps:
        done = run_step(step.sql, done)
    for stopped_after in range(len(steps) + 1):
        # A step that fails is rolled back whole: the table is as the steps before it left it.
        table = V1
        for step in steps[:stopped_after]:
            table = run_step(step.sql, table)
        for step in steps:   # the deploy run again: every step from the first
            table = run_step(step.sql, table)
        assert _as_index_set(table) == _as_index_set(done), stopped_after


def test_without_client_ids_the_migration_only_records_v2() -> None:
    item = _planned(False)
    assert [m.name for m in item.migrations] == ["work_dead_v1_to_v2"] and item.migrations[0].after.version == 2
    sql = "".join(step.sql for step in item.migrations[0].steps)
    assert all(line.lstrip().startswith("--") for batch in split_batches(sql) for line in batch.text.splitlines()
               if line.strip())   # comments only: nothing runs
    table = V1
    for step in item.migrations[0].steps:
        table = run_step(step.sql, table)
    assert table == V1


def test_the_model_refuses_what_sql_server_refuses() -> None:
    """The model's errors, each once: a test that passes above cannot pass by accident."""
    with pytest.raises(StepError, match="1902"):
        run_step("CREATE UNIQUE CLUSTERED INDEX [ux_q_dead_seq] ON [s].[q_dead] (dead_seq);\n",
                 replace(V1, columns=V1.columns | {"dead_seq"}))
    with pytest.raises(StepError, match="1911"):
        run_step("ALTER TABLE [s].[q_dead] DROP CONSTRAINT [pk_q_dead];\n"
                 "CREATE UNIQUE CLUSTERED INDEX [ux_q_dead_seq] ON [s].[q_dead] (dead_seq);\n", V1)
    with pytest.raises(StepError, match="1779"):
        run_step("ALTER TABLE [s].[q_dead] ADD CONSTRAINT [pk_q_other] PRIMARY KEY NONCLUSTERED (id);\n", V1)
    with pytest.raises(StepError, match="2705"):
        run_step("ALTER TABLE [s].[q_dead] ADD id bigint IDENTITY (1, 1) NOT NULL;\n", V1)
    with pytest.raises(StepError, match="3728"):
        run_step("ALTER TABLE [s].[q_dead] DROP CONSTRAINT [pk_q_other];\n", V1)
    with pytest.raises(AssertionError, match="does not know"):
        run_step("IF @@TRANCOUNT = 0\n    BEGIN\n        ALTER TABLE [s].[q_dead] DROP CONSTRAINT [pk_q_dead];\n"
                 "    END;\n", V1)


def test_postgres_dead_letters_of_a_client_id_queue_survive_the_v1_to_v2_step(pg_url: str,
                                                                               pg_schemas: list[str]) -> None:
    """Deployed as before v2 (the same table: PostgreSQL's v2 changes nothing; the history records
    v1), a message dead, then the current tool deploys: the step is recorded and dead_list still
    returns the message, which dead_requeue can put back."""
    schema = pg_schemas[0]
    catalog = _catalog(True, schema)
    units = _units(catalog, "postgres")
    dialect = dialect_for("postgres")
    dead_unit = f"{schema}.q_dead"
    with connect(pg_url, autocommit=True) as conn:
        deploy(conn, dialect, schema, units)
        conn.execute(f'UPDATE "{schema}".tablequeue_deploy_history SET storage_version = 1 '
                     "WHERE unit_name = %s", (dead_unit,))
        client = QueueClient.for_catalog(conn, "postgres", catalog, "q")
        message = client.enqueue({"n": 1}, id=uuid.uuid4())["id"]
        leased = client.dequeue(worker="w", lease_seconds=60)
        assert [row["id"] for row in leased] == [message]
        assert client.fail(message, "w", "broken", lease_token=leased[0]["lease_token"]) == "dead"
        before = client.dead_list()

        result = deploy(conn, dialect, schema, units)
        plan = {item.unit.name: item for item in result.plan.items}
        assert plan[dead_unit].action == MIGRATE
        assert [m.name for m in plan[dead_unit].migrations] == ["work_dead_v1_to_v2"]
        history = [row for row in dialect.read_history(conn, schema) if row["unit_name"] == dead_unit]
        assert (history[-1]["storage_version"], history[-1]["migration"]) == (2, "work_dead_v1_to_v2")

        after = client.dead_list()
        assert [row["id"] for row in after] == [message] and after == before
        assert {item.action for item in deploy(conn, dialect, schema, units).plan.items} == {UNCHANGED}
        assert client.dead_requeue(message) is True
        assert client.dead_list() == []
