"""The command line as a CI pipeline or a DBA uses it: exit codes and what it prints."""
from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import drop_schema


def tablequeue(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tablequeue", *args], capture_output=True, text=True, timeout=300)


def write_catalog(path: Path, schema: str, kind: str) -> Path:
    path.write_text(yaml.safe_dump({"schema": schema, "queues": [
        {"name": "events", "kind": kind}, {"name": "orders", "kind": "fifo", "options": {"dedupe": True}}]}))
    return path


def test_deploy_dry_run_status_and_refusal(pg_url: str, tmp_path: Path) -> None:
    schema = f"c_{secrets.token_hex(4)}"
    catalog = str(write_catalog(tmp_path / "catalog.yml", schema, "heap"))
    try:
        dry = tablequeue("deploy", "--catalog", catalog, "--url", pg_url, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "dry run, nothing applied" in dry.stdout and f"create    storage {schema}.events" in dry.stdout
        assert "***" in dry.stdout and pg_url.split(":")[2].split("@")[0] not in dry.stdout  # password masked

        first = tablequeue("deploy", "--catalog", catalog, "--url", pg_url)
        assert first.returncode == 0, first.stderr
        assert "[1/" in first.stdout and "0 unchanged" in first.stdout
        second = tablequeue("deploy", "--catalog", catalog, "--url", pg_url)
        assert second.returncode == 0 and "0 unit(s) applied" in second.stdout

        state = tablequeue("status", "--url", pg_url, "--catalog", catalog)
        assert state.returncode == 0, state.stdout + state.stderr
        assert f"{schema}.events_dequeue" in state.stdout and "drift" not in state.stdout

        changed = str(write_catalog(tmp_path / "changed.yml", schema, "pending"))
        refused = tablequeue("deploy", "--catalog", changed, "--url", pg_url)
        assert refused.returncode == 3
        assert "refused, nothing was applied" in refused.stderr and "queue 'events'" in refused.stderr
        pending = tablequeue("status", "--url", pg_url, "--catalog", changed)
        assert "catalog differs (deploy pending)" in pending.stdout
    finally:
        drop_schema("postgres", pg_url, schema)


def test_unreachable_database_is_one_line_exit_1(tmp_path: Path) -> None:
    catalog = str(write_catalog(tmp_path / "catalog.yml", "queue", "heap"))
    result = tablequeue("deploy", "--catalog", catalog, "--url", "postgresql://nobody:pw@127.0.0.1:1/none")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "pw@" not in result.stderr


def test_tsqlt_without_sql_server_reports_what_did_not_run() -> None:
    result = tablequeue("test-tsql", "--if-configured")
    assert result.returncode == 0
    assert "did NOT run" in result.stdout and "TABLEQUEUE_MSSQL_URL" in result.stdout


def test_dry_run_shows_each_migration_step_with_what_it_locks(pg_url: str, tmp_path: Path) -> None:
    schema = f"c_{secrets.token_hex(4)}"
    catalog = tmp_path / "catalog.yml"
    catalog.write_text(yaml.safe_dump({"schema": schema, "queues": [{"name": "jobs", "kind": "work"}]}))
    try:
        assert tablequeue("deploy", "--catalog", str(catalog), "--url", pg_url).returncode == 0
        catalog.write_text(yaml.safe_dump({"schema": schema, "queues": [
            {"name": "jobs", "kind": "work", "options": {"priority": True}}]}))
        dry = tablequeue("deploy", "--catalog", str(catalog), "--url", pg_url, "--dry-run", "--ddl-lock-timeout", "3")
        assert dry.returncode == 0, dry.stderr
        assert f"migrate   storage {schema}.jobs  v4 (kind=work payload=json dedupe=off priority=off client_ids=off)" \
               f" -> v4 (kind=work payload=json dedupe=off priority=on client_ids=off)" in dry.stdout
        assert "work_table_add_priority 2/3 [concurrent] build ix_jobs_ready_new (priority leading) CONCURRENTLY; " \
               "locks: nothing that blocks reads or writes" in dry.stdout
        assert "a 3 s lock timeout and is retried for up to 600 s" in dry.stdout
        bad = tablequeue("deploy", "--catalog", str(catalog), "--url", pg_url, "--ddl-lock-timeout", "0")
        assert bad.returncode == 2 and "must be a number of seconds above 0" in bad.stderr
    finally:
        drop_schema("postgres", pg_url, schema)


CLEAN_TSQL = """\
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO
CREATE TABLE [dbo].[jobs] (id bigint NOT NULL, payload nvarchar(MAX) NOT NULL);
GO
CREATE ROLE [jobs_admin] AUTHORIZATION [dbo];
GO
CREATE OR ALTER PROCEDURE [dbo].[jobs_count]
    @minimum bigint = 0
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    SELECT COUNT_BIG(*) AS jobs FROM [dbo].[jobs] AS j WHERE j.id >= @minimum;
END;
GO
GRANT EXECUTE ON OBJECT::[dbo].[jobs_count] TO [jobs_admin];
GO
"""


def test_check_tsql_exit_codes_and_what_it_prints(tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "jobs.sql").write_text(CLEAN_TSQL)
    result = tablequeue("check-tsql", str(clean))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 unresolved reference(s), 0 rule violation(s)" in result.stdout

    broken = tmp_path / "broken.sql"
    broken.write_text(CLEAN_TSQL.replace("j.id >= @minimum", "j.ident >= @minimum").replace(
        "SET NOCOUNT ON;\n    SET XACT_ABORT ON;", "SET XACT_ABORT ON;\n    SET NOCOUNT ON;"))
    result = tablequeue("check-tsql", str(broken))
    assert result.returncode == 1
    assert result.stdout.splitlines()[:2] == [
        f"{broken}:14: unresolved column 'j.ident'",
        f"{broken}:12: xact-abort: the first statement is not SET NOCOUNT ON (procedure [dbo].[jobs_count])"]

    result = tablequeue("check-tsql", str(tmp_path / "missing"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "missing" in result.stderr
