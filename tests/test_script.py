"""The hand-run script (tablequeue script): what a DBA reviews and runs with sqlcmd or psql. It runs
a deploy plan as `tablequeue deploy` does: the same deploy lock, order, lock timeout and history."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


from tablequeue.catalog import load_catalog, parse_catalog
from tablequeue.deploy import make_plan
from tablequeue.gosplit import split_batches
from tablequeue.render import MigrationSource, render_catalog
from tablequeue.script import build_script

REPO = Path(__file__).resolve().parents[1]


def tablequeue(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tablequeue", *args], capture_output=True, text=True, timeout=300)


def _units(catalog, dialect: str = "mssql"):
    return [u for f in render_catalog(catalog, dialect) for u in f.units]


def test_a_fresh_install_script_holds_every_unit_in_its_own_transaction_under_the_deploy_lock() -> None:
    catalog = load_catalog(REPO / "database" / "queues.yml")
    units = _units(catalog)
    text = build_script("mssql", catalog.schema, make_plan(units, []), "database/queues.yml", fresh=True)
    lines = text.splitlines()
    assert lines[2] == ":on error exit"
    assert "SET QUOTED_IDENTIFIER ON;" in text and "SET ANSI_NULLS ON;" in text and "SET XACT_ABORT ON;" in text
    assert "SET LOCK_TIMEOUT 2000;" in text
    # The deploy lock first, released last; the plan at the top for review.
    assert text.index("sys.sp_getapplock @Resource = N'tablequeue:deploy:queue'") < text.index("BEGIN TRANSACTION;")
    assert lines[-2].startswith("EXEC sys.sp_releaseapplock @Resource = N'tablequeue:deploy:queue'")
    assert f"--   create    storage queue.emails  v1 (kind=work" in text
    for unit in units:
        assert f"-- create {unit.type} {unit.name}" in text
        assert f"'{unit.checksum}'" in text
    # The script's own transactions stand at column 0, procedures' are indented.
    assert lines.count("BEGIN TRANSACTION;") == len(units) == lines.count("COMMIT TRANSACTION;")
    queue_storage = [u for u in units if u.type == "storage" and u.queue]
    # One guard per queue storage unit, the deploy lock's and the 0.1.0 history's.
    assert text.count("THROW 51007") == len(queue_storage) + 2
    batches = split_batches(text.split(":on error exit", 1)[1])
    # Each unit: its batches, BEGIN, the history row, COMMIT (and a guard for queue storage); then the
    # SET batch, the deploy lock, the 0.1.0 guard and the release.
    assert len(batches) == sum(len(split_batches(u.body)) + 3 for u in units) + len(queue_storage) + 4


def test_script_command_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "deploy.sql"
    result = tablequeue("script", "--catalog", str(REPO / "database" / "queues.yml"), "--dialect", "mssql",
                        "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text().count("GO\n") > 50


def _history_row(unit, shape: str) -> dict:
    return {"unit_name": unit.name, "unit_checksum": unit.checksum, "tool_version": "0.2.0", "storage_version": 1,
            "storage_shape": shape, "migration": None}


def test_an_mssql_script_planned_against_a_database_holds_its_migrations_in_deploy_order() -> None:
    # What a SQL Server history records (no SQL Server here): queue q deployed with dedupe on and
    # priority off; the catalog now has dedupe off and priority on.
    was = parse_catalog({"schema": "s", "queues": [{"name": "q", "kind": "work", "options": {"dedupe": True}}]})
    now = parse_catalog({"schema": "s", "queues": [{"name": "q", "kind": "work", "options": {"priority": True}}]})
    history = [_history_row(unit, unit.storage.shape_text if unit.storage else None) if unit.storage else
               {**_history_row(unit, None), "storage_version": None} for unit in _units(was)]
    plan = make_plan(_units(now), history, migrations=MigrationSource("mssql"))
    assert not plan.refused
    text = build_script("mssql", "s", plan, "test", fresh=False)
    # The table's migrations: the addition before the code units, the removal after them.
    add = text.index("-- migrate storage s.q: work_table_add_priority")
    last_code = max(m.start() for m in re.finditer(r"^-- (create|update) code ", text, re.M))
    drop = text.index("-- migrate storage s.q: work_table_drop_dedupe (after the code units)")
    assert add < last_code < drop
    assert text.index("where this script''s migrations start") < add   # (quoted in its THROW)
    assert "CREATE NONCLUSTERED INDEX [ix_q_claim]" in text and "WITH (DROP_EXISTING = ON, ONLINE = ON);" in text
    # Every migration's history row names it, with the shape it leaves.
    assert "'work_table_add_priority'" in text and "'kind=work payload=json dedupe=on priority=on client_ids=off'" in text
    batches = split_batches(text.split(":on error exit", 1)[1])
    assert all(batch.text for batch in batches)
    assert text.splitlines().count("BEGIN TRANSACTION;") == text.splitlines().count("COMMIT TRANSACTION;")


