"""The hand-run script (tablequeue script): what a DBA reviews and runs with sqlcmd or psql. It runs
a deploy plan as `tablequeue deploy` does: the same deploy lock, order, lock timeout and history."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


from releases import V010, deploy_catalog, deploy_v010, describe_postgres_schema, populate, release_catalog, release_units
from tablequeue.catalog import load_catalog, parse_catalog
from tablequeue.deploy import UNCHANGED, make_plan
from tablequeue.engines import connect
from tablequeue.gosplit import split_batches
from tablequeue.render import MigrationSource, render_catalog
from tablequeue.script import build_script

REPO = Path(__file__).resolve().parents[1]


def tablequeue(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tablequeue", *args], capture_output=True, text=True, timeout=300)


def _units(catalog, dialect: str = "mssql"):
    return [u for f in render_catalog(catalog, dialect) for u in f.units]


def _each_transaction_sets_xact_abort(text: str) -> None:
    """Every transaction of the script opens in a batch that first sets XACT_ABORT ON: a compile error
    in SSMS's SQLCMD mode (where `:on error exit` does not end the session) then rolls the unit back
    instead of leaving its transaction open."""
    lines = text.splitlines()
    begins = [index for index, line in enumerate(lines) if line == "BEGIN TRANSACTION;"]
    assert begins
    assert [lines[index - 1] for index in begins] == ["SET XACT_ABORT ON;"] * len(begins)
    for batch in split_batches(text.split(":on error exit", 1)[1]):
        statements = [line for line in batch.text.splitlines() if line.strip() and not line.startswith("--")]
        if "BEGIN TRANSACTION;" in statements:
            assert statements == ["SET XACT_ABORT ON;", "BEGIN TRANSACTION;"]


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
    assert "--   create    storage queue.emails  v4 (kind=work" in text
    for unit in units:
        assert f"-- create {unit.type} {unit.name}" in text
        assert f"'{unit.checksum}'" in text
    # The script's own transactions stand at column 0, procedures' are indented.
    assert lines.count("BEGIN TRANSACTION;") == len(units) == lines.count("COMMIT TRANSACTION;")
    _each_transaction_sets_xact_abort(text)
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
    # The claim index with priority under its own name, before the code units; the old one dropped after.
    assert text.index("CREATE NONCLUSTERED INDEX [ix_q_ready_priority]") < last_code
    assert last_code < text.index("DROP INDEX IF EXISTS [ix_q_ready] ON [s].[q];")
    # Every migration's history row names it, with the shape it leaves.
    assert "'work_table_add_priority'" in text and "'kind=work payload=json dedupe=on priority=on client_ids=off'" in text
    batches = split_batches(text.split(":on error exit", 1)[1])
    assert all(batch.text for batch in batches)
    assert text.splitlines().count("BEGIN TRANSACTION;") == text.splitlines().count("COMMIT TRANSACTION;")
    _each_transaction_sets_xact_abort(text)



def _psql(url: str, script: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["psql", url, "-q", "-f", str(script)], capture_output=True, text=True, timeout=300)


def test_a_postgres_script_planned_against_the_database_migrates_as_deploy_would(
        pg_url: str, pg_schemas: list[str], tmp_path: Path) -> None:
    schema, fresh = pg_schemas
    before = [{"name": "w", "kind": "work", "payload": "json", "options": {"max_attempts": 2}}]
    after = [{**before[0], "options": {"max_attempts": 2, "dedupe": True, "priority": True, "history": True}}]
    deploy_catalog(pg_url, schema, parse_catalog({"schema": schema, "queues": before}))
    conn = connect(pg_url)
    try:
        seen = populate(V010(conn, schema, parse_catalog({"schema": schema, "queues": before}).queue("w")))
        catalog_file = tmp_path / "catalog.yml"
        catalog_file.write_text(f"schema: {schema}\nqueues: {after!r}\n".replace("'", '"'))
        script = tmp_path / "upgrade.sql"
        result = tablequeue("script", "--catalog", str(catalog_file), "--url", pg_url, "--out", str(script))
        assert result.returncode == 0, result.stderr
        text = script.read_text()
        assert "planned against postgresql://" in text and "work_table_add_dedupe" in text
        assert "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS" in text and "\\if :tablequeue_invalid_index" in text
        run = _psql(pg_url, script)
        assert run.returncode == 0, run.stderr

        migrated = parse_catalog({"schema": schema, "queues": after})
        assert {item.action for item in deploy_catalog(pg_url, schema, migrated).plan.items} == {UNCHANGED}
        work = V010(conn, schema, migrated.queue("w"))
        assert work("complete", id=seen["leased"], worker="w-live") == [{"completed": True}]
        assert [row["id"] for row in work("dead_list")] == [seen["dead"]]
        deploy_catalog(pg_url, fresh, parse_catalog({"schema": fresh, "queues": after}))
        assert describe_postgres_schema(conn, schema) == describe_postgres_schema(conn, fresh)

        again = _psql(pg_url, script)   # planned from a state the database has left
        assert again.returncode != 0 and "where this script's migrations start" in again.stderr
    finally:
        conn.close()


def test_a_postgres_script_planned_against_a_0_1_0_database_records_it(
        pg_url: str, pg_schemas: list[str], tmp_path: Path) -> None:
    schema = pg_schemas[0]
    conn = connect(pg_url)
    try:
        deploy_v010(conn, "postgres", release_units("0.1.0", "postgres", "option_matrix", schema), schema)
        catalog_file = tmp_path / "catalog.yml"
        text = (REPO / "tests" / "fixtures" / "releases" / "0.1.0" / "option_matrix.yml").read_text()
        catalog_file.write_text(text.replace("schema: matrix", f"schema: {schema}"))
        static = tmp_path / "static.sql"
        assert tablequeue("script", "--catalog", str(catalog_file), "--dialect", "postgres",
                          "--out", str(static)).returncode == 0
        refused = _psql(pg_url, static)
        assert refused.returncode != 0 and "created by tablequeue 0.1.0" in refused.stderr

        script = tmp_path / "upgrade.sql"
        result = tablequeue("script", "--catalog", str(catalog_file), "--url", pg_url, "--out", str(script))
        assert result.returncode == 0, result.stderr
        assert "framework_tablequeue_deploy_history_v1_to_v2" in script.read_text()
        run = _psql(pg_url, script)
        assert run.returncode == 0, run.stderr
        catalog = release_catalog("0.1.0", "option_matrix", schema)
        plan = deploy_catalog(pg_url, schema, catalog, dry_run=True).plan.items
        assert [(i.unit.name, i.action, [m.name for m in i.migrations]) for i in plan if i.action != UNCHANGED] == []
    finally:
        conn.close()


def test_script_against_a_database_refuses_what_deploy_refuses(pg_url: str, pg_schemas: list[str], tmp_path: Path) -> None:
    schema = pg_schemas[0]
    deploy_catalog(pg_url, schema, parse_catalog({"schema": schema, "queues": [{"name": "a", "kind": "heap"}]}))
    catalog_file = tmp_path / "catalog.yml"
    catalog_file.write_text(f"schema: {schema}\nqueues:\n  - {{name: a, kind: lifo}}\n")
    result = tablequeue("script", "--catalog", str(catalog_file), "--url", pg_url, "--out", str(tmp_path / "x.sql"))
    assert result.returncode == 3 and "queue 'a': a kind change from heap to lifo" in result.stderr
    assert not (tmp_path / "x.sql").exists()
