"""Migrations against the pins (SQL Server, checked statically: no SQL Server runs here).

While a deploy runs, the old code units run until they are replaced and the new ones from then on:
every index the old code pins must exist, with its key, after each step before the code units, and
every index the new code pins before each step after them and at the end. The steps are run on a
model of the queue table's indexes that follows the T-SQL as SQL Server would: each IF guard is
evaluated against the model (a guard it cannot evaluate, such as the edition, runs both branches),
CREATE INDEX on a name in use, DROP INDEX of a missing one, a rename onto a name in use and a column
dropped under an index are errors. A guard or index statement the model does not know fails the test.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from releases import release_units
from tablequeue.catalog import parse_catalog
from tablequeue.deploy import make_plan
from tablequeue.gosplit import split_batches
from tablequeue.render import MigrationSource, render_catalog
from tablequeue.tsqlcheck import analyse
from tablequeue.tsqlrules import IndexKey, check_pins, index_keys
from tablequeue.tsqltree import child, children, code, conjuncts, kind, parse_batch

State = tuple[IndexKey, ...]     # the table's indexes, in creation order


class StepError(AssertionError):
    """What SQL Server would refuse at this step."""


def _flat(text: str) -> str:
    """The text without whitespace: what the patterns below match."""
    return re.sub(r"\s+", "", text)


_INDEX_ID = re.compile(r"INDEXPROPERTY\(OBJECT_ID\(N'(?P<table>[^']+)'\),N'(?P<name>\w+)','IndexID'\)"
                       r"IS(?P<not>NOT)?NULL")
# The key of a usable (not disabled) nonclustered index, without a filter or with exactly the one the
# guard names (compared without spaces, brackets and parentheses, as the guard compares SQL Server's
# filter_definition): the model's indexes are never disabled, every one it builds here is nonclustered.
_HAS_KEY = re.compile(r"(?P<not>NOT)?COALESCE\(\(SELECTSTRING_AGG\(CONCAT\(c\.name,CASEWHEN"
                      r"ic\.is_descending_key=1THENN'DESC'END\),N','\)WITHINGROUP\(ORDERBY"
                      r"ic\.key_ordinal\)FROMsys\.indexesASiINNERJOINsys\.index_columnsASicON"
                      r"i\.object_id=ic\.object_idANDi\.index_id=ic\.index_idINNERJOINsys\.columnsAScON"
                      r"ic\.object_id=c\.object_idANDic\.column_id=c\.column_idWHEREi\.object_id="
                      r"OBJECT_ID\(N'(?P<table>[^']+)'\)ANDi\.name=N'(?P<name>\w+)'ANDi\.type=(?P<type>[12])AND"
                      r"i\.is_disabled=0ANDi\.has_filter=(?:0|1ANDREPLACE\(TRANSLATE\(i\.filter_definition,N'\[\]\(\)',"
                      r"N''\),N'',N''\)=N'(?P<filter>[^']*)')ANDic\.key_ordinal>0\),N''\)=N'(?P<key>[^']*)'")
# Guards about other things than the table's indexes: either outcome is possible here.
_UNKNOWN = re.compile(r"SERVERPROPERTY\('EngineEdition'\)IN\([\d,]+\)|COL_LENGTH\(N'[^']+',N'\w+'\)IS(NOT)?NULL"
                      r"|OBJECT_ID\(N'[^']+',N'D'\)ISNULL")
_DROP_INDEX = re.compile(r"DROPINDEX(?P<exists>IFEXISTS)?\[(?P<name>\w+)\]ON(?P<table>\[\w+\]\.\[\w+\]);?")
_RENAME = re.compile(r"EXECsys\.sp_rename@objname=N'(?P<table>\[\w+\]\.\[\w+\])\.\[(?P<name>\w+)\]',"
                     r"@newname=N'(?P<new>\w+)',@objtype=N'INDEX';?")
_DROP_COLUMN = re.compile(r"DROPCOLUMN(?P<column>\w+)")


def _fold(table: str) -> str:
    return table.replace("[", "").replace("]", "").lower()


def _key(index: IndexKey) -> str:
    return ",".join(f"{c}{'DESC' if d else ''}" for c, d in index.columns)


def _filter(index: IndexKey) -> str:
    """The index's filter as the guard compares it: its conditions without spaces, joined by AND."""
    return "and".join(c.replace(" ", "").lower() for c in index.filter)


def _find(state: State, table: str, name: str) -> IndexKey | None:
    return next((i for i in state if i.table == table and i.name == name.lower()), None)


def _atom(text: str, state: State) -> bool | None:
    match = _INDEX_ID.fullmatch(text)
    if match:
        return (_find(state, _fold(match["table"]), match["name"]) is not None) == bool(match["not"])
    match = _HAS_KEY.fullmatch(text)
    if match:
        found = _find(state, _fold(match["table"]), match["name"])
        wanted = (match["filter"] or "").lower()
        # Every index this model builds is nonclustered: a guard asking for a clustered key never holds.
        return ((found is not None and _filter(found) == wanted and match["type"] == "2" and _key(found) == match["key"])
                != bool(match["not"]))
    if _UNKNOWN.fullmatch(text):
        return None
    raise AssertionError(f"a migration guard the model does not know: {text}")


def _guard(condition, state: State) -> bool | None:
    """True, False, or None when it depends on what the model does not know."""
    parts = conjuncts(condition)
    assert parts is not None, f"an OR in a migration guard: {_flat(condition.raw)}"
    verdicts = [_atom(_flat("".join(s.raw for s in part.segments)), state) for part in parts]
    if False in verdicts:
        return False
    return True if all(verdicts) else None


def _create(statement, state: State) -> State:
    created = index_keys(statement, "migration")
    assert len(created) == 1, _flat(statement.raw)
    index = created[0]
    existing = _find(state, index.table, index.name)
    if "DROP_EXISTING=ON" in _flat(statement.raw):
        if existing is None:
            raise StepError(f"DROP_EXISTING of {index.name}, which does not exist (Msg 7999)")
        return tuple(index if i is existing else i for i in state)
    if existing is not None:
        raise StepError(f"CREATE INDEX {index.name}: the name is in use (Msg 1913)")
    return state + (index,)


def _simple(text: str, state: State) -> State:
    match = _DROP_INDEX.fullmatch(text)
    if match:
        found = _find(state, _fold(match["table"]), match["name"])
        if found is None and not match["exists"]:
            raise StepError(f"DROP INDEX {match['name']}: no such index (Msg 3701)")
        return tuple(i for i in state if i is not found)
    match = _RENAME.fullmatch(text)
    if match:
        table = _fold(match["table"])
        found = _find(state, table, match["name"])
        if found is None or _find(state, table, match["new"]) is not None:
            raise StepError(f"sp_rename {match['name']} to {match['new']} (Msg 15248 / 15335)")
        return tuple(replace(i, name=match["new"].lower()) if i is found else i for i in state)
    for column in _DROP_COLUMN.findall(text):
        users = [i.name for i in state if column.lower() in {c for c, _ in i.columns}]
        if users:
            raise StepError(f"DROP COLUMN {column}: index {', '.join(users)} depends on it (Msg 5074)")
    assert "INDEX" not in text.upper().replace("INDEXPROPERTY", ""), f"an index statement the model does not know: {text}"
    return state


def _run(statement, states: list[State]) -> list[State]:
    body = code(statement)[0]
    k = kind(body)
    if k == "begin_end_block":
        for inner in children(body, "statement"):
            states = _run(inner, states)
        return states
    if k == "if_then_statement":
        condition, branches = None, []
        for c in code(body):
            if kind(c) == "if_clause":
                condition = child(c, "expression")
            elif kind(c) == "statement":
                branches.append(c)
        assert condition is not None and 1 <= len(branches) <= 2, _flat(body.raw)
        out: list[State] = []
        for state in states:
            verdict = _guard(condition, state)
            if verdict is not False:
                out += _run(branches[0], [state])
            if verdict is not True:
                out += _run(branches[1], [state]) if len(branches) == 2 else [state]
        return list(dict.fromkeys(out))
    if k == "create_index_statement":
        return [_create(statement, state) for state in states]
    return [_simple(_flat(body.raw), state) for state in states]


def run_step(sql: str, states: list[State]) -> list[State]:
    """The states the table's indexes can be in after one migration step."""
    for batch in split_batches(sql):
        tree = parse_batch(batch.text)
        for statement in (s for b in [tree, *children(tree, "batch")] for s in children(b, "statement")):
            states = _run(statement, states)
    return states


def _pins_and_indexes(sources: list[tuple[str, str]]) -> tuple[list, list]:
    batches, _ = analyse(sources)
    return [r for b in batches for r in b.reads], [i for b in batches for i in b.indexes]


def _rendered(catalog) -> list[tuple[str, str]]:
    """The queues' files (the framework's pins nothing of theirs)."""
    return [(f.name, f.text) for f in render_catalog(catalog, "mssql") if f.queue is not None]


def _table_unit(catalog, name: str):
    return next(u for f in render_catalog(catalog, "mssql") for u in f.units if u.type == "storage" and u.name == name)


def check_deploy(migrations, table: str, indexes: list[IndexKey], old_reads: list, new_reads: list) -> None:
    """Run a storage unit's migrations as deploy does (every before-code step in order, the code
    units, every after-code step in order) on the table's indexes and check the pins at each step
    (the pins on that table: the model holds its indexes only)."""
    old_reads, new_reads = ([r for r in reads if r.table == table] for reads in (old_reads, new_reads))
    states: list[State] = [tuple(i for i in indexes if i.table == table)]
    before = [s for mig in migrations for s in mig.steps if not s.after_code]
    after = [s for mig in migrations for s in mig.steps if s.after_code]
    for step in before:
        states = run_step(step.sql, states)
        for state in states:
            assert check_pins(old_reads, state) == [], f"old code after '{step.what}'"
    for state in states:
        assert check_pins(new_reads, state) == [], "new code at the code units"
    for step in after:
        states = run_step(step.sql, states)
        for state in states:
            assert check_pins(new_reads, state) == [], f"new code after '{step.what}'"


def check_reruns(migrations, table: str, indexes: list[IndexKey], old_reads: list, new_reads: list) -> None:
    """A deploy that stopped after its first k steps (the next one failed: every step here is one
    transaction, so it left nothing) and is then run again whole, for every k: no step fails, the
    pins of the code running at each step (the new code once the first run passed the code units)
    find their index, and the table ends with the indexes a single run gives it."""
    old_reads, new_reads = ([r for r in reads if r.table == table] for reads in (old_reads, new_reads))
    code_units = None
    sequence = ([s for mig in migrations for s in mig.steps if not s.after_code] + [code_units]
                + [s for mig in migrations for s in mig.steps if s.after_code])
    assert all(s.mode == "transaction" for s in sequence if s is not code_units)
    start: list[State] = [tuple(i for i in indexes if i.table == table)]

    def run(steps: list, states: list[State], new_code: bool) -> tuple[list[State], bool]:
        for step in steps:
            if step is code_units:
                new_code = True
            else:
                states = run_step(step.sql, states)
            for state in states:
                assert check_pins(new_reads if new_code else old_reads, state) == [], \
                    f"{'new' if new_code else 'old'} code after '{step.what if step else 'the code units'}'"
        return states, new_code

    once, _ = run(sequence, start, False)
    for k in range(len(sequence) + 1):
        states, new_code = run(sequence[:k], start, False)
        states, _ = run(sequence, states, new_code)
        assert {frozenset(s) for s in states} == {frozenset(s) for s in once}, f"a re-run after {k} steps"


@pytest.mark.parametrize("before, after", [({}, {"priority": True}), ({"priority": True}, {})],
                         ids=["priority on", "priority off"])
@pytest.mark.parametrize("client_ids", [False, True], ids=["bigint ids", "client ids"])
def test_every_pinned_index_exists_with_its_key_at_each_step_of_a_priority_migration(
        before: dict, after: dict, client_ids: bool) -> None:
    def catalog(options: dict):
        return parse_catalog({"schema": "s", "queues": [{"name": "q", "kind": "work",
                                                         "options": {**options, "client_ids": client_ids}}]}, "<t>")

    old_reads, indexes = _pins_and_indexes(_rendered(catalog(before)))
    new_reads, _ = _pins_and_indexes(_rendered(catalog(after)))
    unit = _table_unit(catalog(after), "s.q")
    migration = MigrationSource("mssql").render(
        "work_table_add_priority" if after else "work_table_drop_priority",
        unit, _table_unit(catalog(before), "s.q").storage, unit.storage)
    check_deploy([migration], "s.q", indexes, old_reads, new_reads)
    check_reruns([migration], "s.q", indexes, old_reads, new_reads)


V010_WORK = [q for q in yaml.safe_load((Path(__file__).parent / "fixtures" / "releases" / "0.1.0" /
                                         "option_matrix.yml").read_text())["queues"] if q["kind"] == "work"]


@pytest.mark.parametrize("priority", [True, False], ids=["priority on after", "priority off after"])
@pytest.mark.parametrize("queue", V010_WORK, ids=lambda q: q["name"])
def test_every_pinned_index_exists_with_its_key_at_each_step_of_an_upgrade_from_0_1_0(queue, priority: bool) -> None:
    """A 0.1.0 work queue upgraded (v1_to_v2), with priority kept, turned on or turned off in the
    same deploy: the plan the deploy makes from a 0.1.0 history row, run on 0.1.0's indexes."""
    schema = "matrix"
    name, options = queue["name"], queue.get("options", {})
    released = [u for u in release_units("0.1.0", "mssql", "option_matrix", schema) if u.queue == name]
    old_reads, indexes = _pins_and_indexes([(f"0.1.0/{u.name}", u.body) for u in released])
    old_reads = [r for r in old_reads if r.indexes]
    assert old_reads == []      # 0.1.0 named no index in a hint: its code runs on any index
    now = parse_catalog({"schema": schema, "queues": [{**queue,
                                                       "options": {**options, "priority": priority}}]}, "<t>")
    new_reads, _ = _pins_and_indexes(_rendered(now))
    was = parse_catalog({"schema": schema, "queues": [{**queue,
                                                       "options": options}]}, "<t>")
    table = f"{schema}.{name}"
    history = [{"unit_name": table, "unit_checksum": "0.1.0", "tool_version": "0.1.0", "storage_version": 1,
                "storage_shape": _table_unit(was, table).storage.shape_text, "migration": None}]
    units = [u for f in render_catalog(now, "mssql") for u in f.units if u.name == table]
    item = make_plan(units, history, migrations=MigrationSource("mssql")).items[0]
    assert [m.name for m in item.migrations][0] == "work_table_v1_to_v2"
    assert any(i.name == f"ix_{name}_claim" for i in indexes)      # 0.1.0's name, whatever the key
    check_deploy(item.migrations, table, indexes, old_reads, new_reads)
    check_reruns(item.migrations, table, indexes, old_reads, new_reads)


def test_the_model_refuses_what_sql_server_refuses() -> None:
    """The model's errors and guards, each once: a test that fails here cannot pass by accident."""
    key = IndexKey("t", "s.q", "ix_q_claim", (("visible_at", False), ("id", False)), ())
    with pytest.raises(StepError, match="1913"):
        run_step("CREATE NONCLUSTERED INDEX [ix_q_claim] ON [s].[q] (visible_at, id);\n", [(key,)])
    with pytest.raises(StepError, match="3701"):
        run_step("DROP INDEX [ix_q_other] ON [s].[q];\n", [(key,)])
    with pytest.raises(StepError, match="5074"):
        run_step("ALTER TABLE [s].[q] DROP COLUMN visible_at;\n", [(key,)])
    guarded = ("IF INDEXPROPERTY(OBJECT_ID(N'[s].[q]'), N'ix_q_claim', 'IndexID') IS NULL\n"
               "    BEGIN\n        CREATE NONCLUSTERED INDEX [ix_q_claim] ON [s].[q] (visible_at, id);\n    END;\n")
    assert run_step(guarded, [(key,)]) == [(key,)]
    assert [[(i.name, i.columns) for i in state] for state in run_step(guarded, [()])] == [[(key.name, key.columns)]]
    with pytest.raises(AssertionError, match="does not know"):
        run_step("IF @@TRANCOUNT = 0\n    BEGIN\n        DROP INDEX [ix_q_claim] ON [s].[q];\n    END;\n", [(key,)])


def _build_step(after: dict):
    """The claim index build step of a priority migration to `after` (queue s.q, bigint ids)."""
    def catalog(options: dict):
        return parse_catalog({"schema": "s", "queues": [{"name": "q", "kind": "work", "options": options}]}, "<t>")
    before = {} if after else {"priority": True}
    unit = _table_unit(catalog(after), "s.q")
    migration = MigrationSource("mssql").render(
        "work_table_add_priority" if after else "work_table_drop_priority",
        unit, _table_unit(catalog(before), "s.q").storage, unit.storage)
    return next(s for s in migration.steps if s.what.startswith("build "))


@pytest.mark.parametrize("found", ["priority key", "a filter"])
def test_a_claim_name_holding_another_index_is_rebuilt_under_a_temporary_name_then_renamed(found: str) -> None:
    """The name the new code pins holds another index: a key led by priority, or the right key under
    another filter (has_key counts only a usable nonclustered index with the claim index's filter,
    WHERE leased_by IS NULL). The build step builds ix_q_ready_new, drops the old one and renames the
    new one in its transaction, not DROP_EXISTING (offline: Sch-M on the table for the whole build);
    its locks line says so."""
    step = _build_step({})
    other = IndexKey("t", "s.q", "ix_q_ready",
                     (("priority", True), ("visible_at", False), ("id", False)) if found == "priority key"
                     else (("visible_at", False), ("id", False)),
                     ("LEASED_BY IS NULL",) if found == "priority key" else ("LEASED_BY IS NOT NULL",))
    states = run_step(step.sql, [(other,)])
    assert [[(i.name, i.columns, i.filter) for i in state] for state in states] == \
        [[("ix_q_ready", (("visible_at", False), ("id", False)), ("LEASED_BY IS NULL",))]]
    assert "DROP_EXISTING" not in step.sql and "ix_q_ready_new" in step.sql
    assert "Sch-M briefly to drop the old index and rename the new one" in " ".join(step.locks.split())
    # The right index already there: nothing is built.
    assert run_step(step.sql, states) == states
