"""Rendering: golden files, headers, quoting, unit structure and the pure deploy planner."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tablequeue.catalog import load_catalog, parse_catalog
from tablequeue.deploy import CREATE, REFUSED, UNCHANGED, UPDATE, make_plan
from tablequeue.gosplit import split_batches
from tablequeue.render import DIALECTS, GROUPS_RENDERED, RenderError, Storage, parse_units, render_catalog, render_tsqlt

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "database" / "queues.yml"
GOLDEN = {"mssql": REPO / "database" / "rendered" / "mssql", "postgres": REPO / "database" / "rendered" / "postgres"}
GOLDEN_TSQLT = REPO / "tests_tsql" / "rendered"


def _compare(rendered: dict[str, str], folder: Path) -> None:
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.sql")}
    assert sorted(rendered) == sorted(on_disk), f"{folder}: files differ from a fresh render: run `make golden`"
    stale = [name for name in rendered if rendered[name] != on_disk[name]]
    assert not stale, f"{folder}: {stale} differ from a fresh render of the templates: run `make golden` and review"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_golden_files_match_a_fresh_render(dialect: str) -> None:
    catalog = load_catalog(CATALOG)
    _compare({f.name: f.text for f in render_catalog(catalog, dialect)}, GOLDEN[dialect])


def test_golden_tsqlt_classes_match_a_fresh_render() -> None:
    catalog = load_catalog(CATALOG)
    files = render_tsqlt(catalog)
    assert {f.queue for f in files} == {q.name for q in catalog.queues}, "every queue has a tSQLt class"
    _compare({f.name: f.text for f in files}, GOLDEN_TSQLT)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_file_has_a_header_and_every_object_is_a_unit(dialect: str) -> None:
    catalog = load_catalog(CATALOG)
    for rendered in render_catalog(catalog, dialect):
        first, second = rendered.text.splitlines()[:2]
        assert first.startswith("-- tablequeue ") and "generated: do not edit" in first
        assert f"dialect: {dialect}" in second and "template: " in second
        units = rendered.units
        assert units, rendered.name
        storage = [u for u in units if u.type == "storage"]
        assert len(storage) >= 1 and units[0].type == "storage"  # tables before the code using them
        if rendered.queue:
            queue = catalog.queue(rendered.queue)
            assert any(u.name == f"{catalog.schema}.{queue.name}_dequeue" for u in units)
            assert all(u.storage.kind == queue.kind and u.storage.version >= 1 for u in storage), rendered.name


def test_every_mssql_unit_sets_nothing_it_does_not_need_and_splits_cleanly() -> None:
    catalog = load_catalog(CATALOG)
    for rendered in render_catalog(catalog, "mssql"):
        assert "SET QUOTED_IDENTIFIER ON;" in rendered.text and "SET ANSI_NULLS ON;" in rendered.text
        for unit in rendered.units:
            batches = split_batches(unit.body)
            assert batches, unit.name
            for batch in batches:
                text = batch.text.strip()
                if text.upper().startswith(("CREATE OR ALTER PROCEDURE", "CREATE PROCEDURE")):
                    assert "SET NOCOUNT ON;" in text and "SET XACT_ABORT ON;" in text, unit.name


@pytest.mark.parametrize("dialect", DIALECTS)
def test_identifiers_are_always_quoted(dialect: str) -> None:
    catalog = parse_catalog({"schema": "app", "queues": [{"name": "user", "kind": "fifo"}]})
    text = "\n".join(f.text for f in render_catalog(catalog, dialect))
    quoted = "[app].[user]" if dialect == "mssql" else '"app"."user"'
    assert quoted in text
    code = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    # Outside comments the name only ever appears quoted (or inside a string naming the object).
    bare = [line for line in code if re.search(r"(?<![\[\"'.:])\bapp\.user", line)]
    assert bare == []


def test_claims_use_the_documented_hints_and_postgres_functions_are_definers() -> None:
    catalog = load_catalog(CATALOG)
    for rendered in render_catalog(catalog, "mssql"):
        for unit in rendered.units:
            if unit.name.endswith("_dequeue"):
                assert "READCOMMITTEDLOCK" in unit.body and "UPDLOCK" in unit.body and "ROWLOCK" in unit.body
                strict = rendered.queue and catalog.queue(rendered.queue).options.get("strict")
                assert ("READPAST" in unit.body) != bool(strict), unit.name
    for rendered in render_catalog(catalog, "postgres"):
        for unit in rendered.units:
            if unit.type == "code" and "CREATE OR REPLACE FUNCTION" in unit.body:
                assert "SECURITY DEFINER" in unit.body and "SET search_path = pg_catalog, pg_temp" in unit.body
                assert "REVOKE ALL ON FUNCTION" in unit.body and "GRANT EXECUTE ON FUNCTION" in unit.body


def test_parse_units_splits_on_markers_only() -> None:
    text = ("-- header\n-- tablequeue:unit s.a storage v2 table\n-- tablequeue:shape kind=heap dedupe=on\n"
            "CREATE TABLE a (x int);\n"
            "-- tablequeue:unit s.a_f code\nSELECT '-- tablequeue:unit s.fake code';\n")
    units = parse_units(text, "a")
    assert [(u.name, u.type) for u in units] == [("s.a", "storage"), ("s.a_f", "code")]
    assert units[0].storage == Storage(2, (("kind", "heap"), ("dedupe", "on"))) and units[0].object == "table"
    assert units[0].body == "CREATE TABLE a (x int);\n" and units[1].storage is None
    assert "fake" in units[1].body


def test_a_storage_marker_without_a_version_is_an_error() -> None:
    with pytest.raises(RenderError, match="must declare its version and object"):
        parse_units("-- tablequeue:unit s.a storage\nCREATE TABLE a (x int);\n", "a")


def test_checksum_ignores_line_endings_and_trailing_blanks_only() -> None:
    a = parse_units("-- tablequeue:unit s.a code\nSELECT 1;  \n", None)[0]
    b = parse_units("-- tablequeue:unit s.a code\r\nSELECT 1;\r\n", None)[0]
    c = parse_units("-- tablequeue:unit s.a code\nSELECT 2;\n", None)[0]
    assert a.checksum == b.checksum != c.checksum


def _row(unit, **storage) -> dict:
    return {"unit_name": unit.name, "unit_checksum": unit.checksum, "tool_version": "0.2.0",
            "storage_version": storage.get("version"), "storage_shape": storage.get("shape")}


def test_planner_creates_updates_keeps_and_refuses() -> None:
    units = parse_units("-- tablequeue:unit s.q storage v1 table\n-- tablequeue:shape kind=heap payload=json\n"
                        "CREATE TABLE q (x int);\n"
                        "-- tablequeue:unit s.q_f code\nSELECT 1;\n"
                        "-- tablequeue:unit s.q_g code\nSELECT 2;\n", "q")
    history = [_row(units[0], version=1, shape="kind=heap payload=json"),
               {**_row(units[1]), "unit_checksum": "old"},
               _row(units[1])]  # latest row wins
    plan = make_plan(units, history)
    assert [i.action for i in plan.items] == [UNCHANGED, UNCHANGED, CREATE]
    history[-1] = {**_row(units[1]), "unit_checksum": "older"}
    history[0] = _row(units[0], version=1, shape="kind=fifo payload=json")

    class Probe:
        def count_messages(self, table):
            return 7

    plan = make_plan(units, history, Probe())
    assert [i.action for i in plan.items] == [REFUSED, UPDATE, CREATE]
    reason = plan.refused[0].reason
    assert "holds 7 message(s)" in reason and "queue 'q'" in reason and "kind change from fifo to heap" in reason


def test_a_storage_unit_is_identified_by_version_and_shape_not_by_its_text() -> None:
    unit = parse_units("-- tablequeue:unit s.q storage v1 table\n-- tablequeue:shape kind=heap payload=json\n"
                       "-- a comment that was edited\nCREATE TABLE q (x int);\n", "q")[0]
    recorded = {**_row(unit, version=1, shape="kind=heap payload=json"), "unit_checksum": "of other text"}
    assert [i.action for i in make_plan([unit], [recorded]).items] == [UNCHANGED]
    newer = _row(unit, version=2, shape="kind=heap payload=json")
    refused = make_plan([unit], [newer]).refused
    assert refused and "newer than the v1" in refused[0].reason and "does not downgrade" in refused[0].reason


def test_every_dialect_renders_groups_of_fifo_and_work() -> None:
    assert {(d, k) for d in DIALECTS for k in ("fifo", "work")} <= GROUPS_RENDERED


@pytest.mark.parametrize("dialect,kind", sorted({(d, k) for d in DIALECTS for k in ("fifo", "work")}))
def test_groups_are_refused_by_templates_that_do_not_render_them(dialect: str, kind: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A kind's templates that do not implement message groups (issue 21) must fail naming the queue
    # and the field rather than deploy a queue without the ordering its catalog asks for. Every pair
    # renders them now: the guard is checked with the pair taken out.
    monkeypatch.setattr("tablequeue.render.GROUPS_RENDERED", GROUPS_RENDERED - {(dialect, kind)})
    catalog = parse_catalog({"queues": [{"name": "orders", "kind": kind, "options": {"groups": True}}]})
    with pytest.raises(RenderError, match=r"queue 'orders': field 'options.groups': .* do not render message groups"):
        render_catalog(catalog, dialect)


_EXPECTED_KEY_ROW = re.compile(r"\(N'(?P<table>\w+)', N'(?P<name>\w+)', (?P<type>[12]), (?P<unique>[01]), "
                               r"(?P<primary>[01]), 0, (?P<filter>NULL|N'[^']*'), N'(?P<column>\w+)', "
                               r"(?P<descending>[01]), (?P<ordinal>\d+)\)")


def _pinned_keys_expected(tsqlt_text: str) -> dict[str, tuple[str, str, str]]:
    """The pinned-index test's #Expected rows per index: (type, key as the DDL writes it, filter)."""
    return {name: row[:3] for name, row in _pinned_indexes_expected(tsqlt_text).items()}


def _pinned_indexes_expected(tsqlt_text: str) -> dict[str, tuple[str, str, str, str, str, str]]:
    """The same, with (table, unique, primary key) after them."""
    body = tsqlt_text.split("[test the pinned indexes have the key and filter the claims seek on]", 1)[1]
    body = body.split("\nEND;", 1)[0]
    rows: dict[str, list[re.Match]] = {}
    for row in _EXPECTED_KEY_ROW.finditer(body):
        rows.setdefault(row["name"], []).append(row)
    out = {}
    for name, found in rows.items():
        assert [int(r["ordinal"]) for r in found] == list(range(1, len(found) + 1)), name
        key = ", ".join(r["column"] + (" DESC" if r["descending"] == "1" else "") for r in found)
        assert len({(r["table"], r["unique"], r["primary"], r["type"], r["filter"]) for r in found}) == 1, name
        out[name] = ({"1": "CLUSTERED", "2": "NONCLUSTERED"}[found[0]["type"]], key, found[0]["filter"],
                     found[0]["table"], found[0]["unique"], found[0]["primary"])
    return out


def test_tsqlt_pinned_index_test_expects_the_keys_the_tables_are_built_with() -> None:
    """The tSQLt real-object test reads the deployed indexes; what it expects must be what the queue's
    DDL creates (both come from _pinned_indexes.sql), for every kind and option of the matrix."""
    catalog = load_catalog(REPO / "tests" / "fixtures" / "option_matrix.yml")
    ddl = {f.queue: f.text for f in render_catalog(catalog, "mssql")}
    checked = 0
    for tsqlt in render_tsqlt(catalog):
        expected = _pinned_indexes_expected(tsqlt.text)
        assert expected, f"{tsqlt.name}: no pinned index expected"
        for name, (type_desc, key, filter_, table, unique, primary) in expected.items():
            text = ddl[tsqlt.queue]
            created = re.search(rf"CREATE (UNIQUE )?{type_desc} INDEX \[{name}\]\s+ON (\S+) \(([^)]*)\)(\s+WHERE ([^;]*))?;", text)
            constraint = re.search(rf"CONSTRAINT \[{name}\] PRIMARY KEY {type_desc} \(([^)]*)\)", text)
            assert created or constraint, f"{tsqlt.name}: {name} ({type_desc}) is not created by the queue's DDL"
            if created:
                built = (created.group(3), created.group(2), "1" if created.group(1) else "0", "0")
            else:
                on = re.findall(r"CREATE TABLE (\S+)", text[:constraint.start()])[-1]
                built = (constraint.group(1), on, "1", "1")
            assert built[0] == key, f"{tsqlt.name}: {name} expects key ({key}), the DDL builds ({built[0]})"
            assert built[1].split(".")[-1] == f"[{table}]", f"{tsqlt.name}: {name} expected on {table}, built on {built[1]}"
            assert built[2:] == (unique, primary), f"{tsqlt.name}: {name} expects unique, primary key {unique, primary}"
            ddl_filter = created.group(5) if created and created.group(5) else None
            if filter_ == "NULL":
                assert ddl_filter is None, f"{tsqlt.name}: {name} is filtered in the DDL"
            else:
                # Compared without spaces and parentheses: the catalog keeps SQL Server's own form.
                compared = "AND".join(f"[{column}]{rest.replace(' ', '')}"
                                      for column, rest in (c.split(" ", 1) for c in ddl_filter.split(" AND ")))
                assert filter_ == f"N'{compared}'", f"{tsqlt.name}: {name} filter {filter_} vs {ddl_filter}"
            checked += 1
    assert checked


def _sql_server_stored_filter(filter_: str) -> str:
    """A filter of one-column conditions joined by AND as sys.indexes.filter_definition keeps it: SQL
    Server brackets each column, puts a comparison's constant in parentheses and drops the spaces around
    its operator ('group_head = 1' -> '([group_head]=(1))'), keeps IS [NOT] NULL as written, and wraps
    the whole in one pair of parentheses ('([group_key] IS NULL AND [leased_by] IS NULL)')."""
    def condition(text: str) -> str:
        column, rest = text.split(" ", 1)
        comparison = re.fullmatch(r"(=|<>|<|>|<=|>=) (\S+)", rest)
        return f"[{column}]{comparison[1]}({comparison[2]})" if comparison else f"[{column}] {rest}"
    return "(" + " AND ".join(condition(part) for part in filter_.split(" AND ")) + ")"


def test_tsqlt_pinned_index_test_compares_filters_in_the_form_sql_server_stores() -> None:
    """The test's #Actual strips spaces and parentheses from the stored filter; its #Expected must equal
    that for every pinned filter (a '= 1' filter is stored '([col]=(1))': compared as written, it failed)."""
    catalog = load_catalog(REPO / "tests" / "fixtures" / "option_matrix.yml")
    strip = re.compile(r"[ ()]")
    checked = 0
    for tsqlt in render_tsqlt(catalog):
        body = tsqlt.text.split("[test the pinned indexes have the key and filter the claims seek on]", 1)[1]
        body = body.split("\nEND;", 1)[0]
        assert "REPLACE(REPLACE(REPLACE(i.filter_definition, N' ', N''), N'(', N''), N')', N'') AS filter_definition" in body
        ddl = next(f.text for f in render_catalog(catalog, "mssql") if f.queue == tsqlt.queue)
        for name, (_, _, filter_) in _pinned_keys_expected(tsqlt.text).items():
            created = re.search(rf"CREATE \w+ INDEX \[{name}\]\s+ON \S+ \([^)]*\)(\s+WHERE ([^;]*))?;", ddl)
            if filter_ == "NULL":
                continue
            stored = _sql_server_stored_filter(created.group(2).strip())
            assert filter_ == f"N'{strip.sub('', stored)}'", f"{tsqlt.name}: {name}: {filter_} vs stored {stored}"
            checked += 1
    assert checked
