"""Rendering: golden files, headers, quoting, unit structure and the pure deploy planner."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tablequeue.catalog import load_catalog, parse_catalog
from tablequeue.deploy import CREATE, REFUSED, UNCHANGED, UPDATE, make_plan
from tablequeue.gosplit import split_batches
from tablequeue.render import DIALECTS, parse_units, render_catalog, render_tsqlt

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
            assert f"kind {queue.kind}" in storage[0].body


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
    text = ("-- header\n-- tablequeue:unit s.a storage\nCREATE TABLE a (x int);\n"
            "-- tablequeue:unit s.a_f code\nSELECT '-- tablequeue:unit s.fake code';\n")
    units = parse_units(text, "a")
    assert [(u.name, u.type) for u in units] == [("s.a", "storage"), ("s.a_f", "code")]
    assert "fake" in units[1].body


def test_checksum_ignores_line_endings_and_trailing_blanks_only() -> None:
    a = parse_units("-- tablequeue:unit s.a code\nSELECT 1;  \n", None)[0]
    b = parse_units("-- tablequeue:unit s.a code\r\nSELECT 1;\r\n", None)[0]
    c = parse_units("-- tablequeue:unit s.a code\nSELECT 2;\n", None)[0]
    assert a.checksum == b.checksum != c.checksum


def test_planner_creates_updates_keeps_and_refuses() -> None:
    units = parse_units("-- tablequeue:unit s.q storage\nCREATE TABLE q (x int);\n"
                        "-- tablequeue:unit s.q_f code\nSELECT 1;\n"
                        "-- tablequeue:unit s.q_g code\nSELECT 2;\n", "q")
    history = [{"unit_name": "s.q", "unit_checksum": units[0].checksum},
               {"unit_name": "s.q_f", "unit_checksum": "old"},
               {"unit_name": "s.q_f", "unit_checksum": units[1].checksum}]  # latest row wins
    plan = make_plan(units, history)
    assert [i.action for i in plan.items] == [UNCHANGED, UNCHANGED, CREATE]
    history[-1] = {"unit_name": "s.q_f", "unit_checksum": "older"}
    history[0] = {"unit_name": "s.q", "unit_checksum": "different"}
    plan = make_plan(units, history, lambda table: 7)
    assert [i.action for i in plan.items] == [REFUSED, UPDATE, CREATE]
    assert "holds 7 message(s)" in plan.refused[0].reason and "queue 'q'" in plan.refused[0].reason
