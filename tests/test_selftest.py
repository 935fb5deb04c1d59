"""`tablequeue selftest`: against the embedded PostgreSQL for everything that is not SQL Server
specific, and its SQL Server path against a fake server (tests/fake_mssql.py: no SQL Server here).

The conformance half runs as a real pytest subprocess in every test: against the real conformance
suite on PostgreSQL, and against a small stand-in suite (written per test) that records which engine
URL it was given, so the SQL Server tests can check the subprocess ran against the scratch database.
"""
from __future__ import annotations

import re
import secrets
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from fake_mssql import FakeConnection, ResultSet, db_error
from tablequeue import selftest, tsqlt
from tablequeue.catalog import load_catalog
from tablequeue.engines import MSSQL_DROP_SCHEMA, SCHEMA_ROLES, _odbc_fields, mssql_connection_string
from tablequeue.selftest import SelftestError, SelftestInvalid, SelftestOptions, run_selftest

MSSQL_URL = "mssql+pyodbc://sa:pw@sql.example:1433/app?driver=ODBC+Driver+18+for+SQL+Server"
VERSION = "Microsoft SQL Server 2022 (RTM-CU12) (KB5033663) - 16.0.4125.3 (X64) \n\tJan 12 2024 \n\tCopyright"
INSTALL = "CREATE SCHEMA tSQLt;\nGO\nCREATE PROCEDURE tSQLt.Info AS RETURN;\nGO\n"

STAND_IN_CONFTEST = """
def pytest_configure(config):
    config.addinivalue_line("markers", "mssql: needs a SQL Server")
"""
# Records the URL each engine's half was given; the -m selection decides which of the two runs.
STAND_IN_TESTS = """
import os
from pathlib import Path

import pytest

SEEN = Path(__file__).with_name("seen.txt")


@pytest.mark.mssql
def test_sql_server_half():
    with SEEN.open("a") as seen:
        seen.write("mssql " + os.environ["TABLEQUEUE_MSSQL_URL"] + "\\n")


def test_postgres_half():
    with SEEN.open("a") as seen:
        seen.write("postgres " + os.environ.get("TABLEQUEUE_PG_URL", "") + "\\n")
"""
FAILING_TEST = """
import pytest


@pytest.mark.mssql
def test_sql_server_claim_is_wrong():
    assert 1 == 2, "deliberately wrong"


def test_postgres_claim_is_wrong():
    assert 1 == 2, "deliberately wrong"
"""


def stand_in_suite(tmp_path: Path, *, failing: bool = False) -> Path:
    suite = tmp_path / "conformance"
    suite.mkdir()
    (suite / "conftest.py").write_text(STAND_IN_CONFTEST)
    (suite / "test_stand_in.py").write_text(STAND_IN_TESTS)
    if failing:
        (suite / "test_failing.py").write_text(FAILING_TEST)
    return suite


def seen_urls(suite: Path) -> list[str]:
    seen = suite / "seen.txt"
    return seen.read_text().splitlines() if seen.exists() else []


def junit_cases(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    return {f"{case.get('classname')}::{case.get('name')}": case for case in root.iter("testcase")}


# --- a fake SQL Server -----------------------------------------------------------------------

def database_of(url: str) -> str:
    """The database the ODBC driver would be asked for: what the fake server connects a session to."""
    fields = {key.upper(): value for key, value in _odbc_fields(mssql_connection_string(url))}
    return fields.get("DATABASE", "master").strip("{}")


class FakeSqlServer:
    """Sessions on databases of one server: records (database, statement) in the order sent, keeps
    each database's READ_COMMITTED_SNAPSHOT, and answers tSQLt.TestResult with every test the
    session created, each passing unless named in ``outcomes`` (test name -> (Result, Msg))."""

    def __init__(self, *, edition: int = 3, url_rcsi: bool = False, outcomes: dict | None = None,
                 answers: dict | None = None, clr_enabled: int = 1) -> None:
        self.edition, self.clr_enabled = edition, clr_enabled
        self.rcsi: dict[str, bool] = {"app": url_rcsi, "master": False}
        self.outcomes = outcomes or {}
        self.answers = answers or {}
        self.log: list[tuple[str, str]] = []        # (database, statement)
        self.params: list[tuple] = []               # the parameters of each statement in log
        self.sessions: list[ServerSession] = []

    def connect(self, url: str, autocommit: bool = True) -> ServerSession:
        session = ServerSession(self, database_of(url))
        session.autocommit = autocommit
        self.sessions.append(session)
        return session

    def statements(self, database: str | None = None) -> list[str]:
        return [sql for db, sql in self.log if database is None or db == database]

    def created_database(self) -> str:
        names = [m.group(1) for sql in self.statements("master") for m in [re.match(r"CREATE DATABASE \[(.+)\];", sql)] if m]
        assert len(names) == 1, names
        return names[0]


class ServerSession(FakeConnection):
    def __init__(self, server: FakeSqlServer, database: str) -> None:
        super().__init__(edition=server.edition, database=database, clr_enabled=server.clr_enabled,
                         answers=server.answers, require_noscan=False)
        self.server = server

    def respond(self, sql: str) -> list:
        self.server.log.append((self.database, sql))
        self.server.params.append(self.parameters[-1])
        server = self.server
        if sql == selftest.MSSQL_SERVER_FACTS_SQL:
            return [ResultSet(rows=[(VERSION, "16.0.4125.3", "Developer Edition (64-bit)", server.edition,
                                     self.database, server.rcsi.get(self.database, False), 160)])]
        if sql == selftest.MSSQL_DATABASE_FACTS_SQL:
            name = self.parameters[-1][0]
            return [ResultSet(rows=[(server.rcsi[name], 160)])] if name in server.rcsi else [ResultSet()]
        for fragment, answer in self.answers.items():
            if fragment in sql:
                return list(answer)
        created = re.match(r"CREATE DATABASE \[(.+)\];$", sql)
        if created:
            server.rcsi[created.group(1)] = False
        switched = re.match(r"ALTER DATABASE \[(.+)\] SET READ_COMMITTED_SNAPSHOT (ON|OFF) WITH ROLLBACK IMMEDIATE;$", sql)
        if switched:
            server.rcsi[switched.group(1)] = switched.group(2) == "ON"
        if "sp_getapplock" in sql:
            return [ResultSet(rows=[(0,)])]
        if sql == selftest.MSSQL_TSQLT_INSTALLED_SQL:
            return [ResultSet(rows=[(int(any("CREATE SCHEMA tSQLt" in s for s in server.statements(self.database))),)])]
        if sql == tsqlt.RESULTS_SQL:
            created_tests = tsqlt.find_tsqlt_tests([("session", text) for text in self.executed])
            rows = []
            for test_class, name in created_tests:
                result, message = server.outcomes.get(name, ("Success", None))
                rows.append((test_class, name, result, message, None, None))
            return [ResultSet(rows=rows)]
        return super().respond(sql)


# Two queues keep the fake runs quick; the first test runs the built-in catalog (every kind and option).
SMALL_CATALOG = """\
schema: small
queues:
  - {name: events, kind: heap}
  - {name: jobs, kind: work, options: {dedupe: true}}
"""


def mssql_options(tmp_path: Path, **overrides) -> SelftestOptions:
    installer = tmp_path / "tSQLt.class.sql"
    installer.write_text(INSTALL)
    catalog = tmp_path / "small.yml"
    catalog.write_text(SMALL_CATALOG)
    settings = dict(url=MSSQL_URL, tsqlt_installer=installer, junit=tmp_path / "out" / "selftest.xml",
                    report=tmp_path / "out" / "selftest.md", catalog=catalog)
    settings.update(overrides)
    return SelftestOptions(**settings)


def position(statements: list[str], pattern: str, start: int = 0) -> int:
    for index in range(start, len(statements)):
        if re.search(pattern, statements[index]):
            return index
    raise AssertionError(f"no statement matching {pattern!r} after position {start}")


# --- SQL Server, scratch database ------------------------------------------------------------

def test_sql_server_run_creates_tests_under_both_rcsi_settings_and_drops_the_database(tmp_path: Path) -> None:
    server = FakeSqlServer()
    suite = stand_in_suite(tmp_path)
    result = run_selftest(mssql_options(tmp_path, catalog=selftest.DEFAULT_CATALOG), connect=server.connect,
                          conformance_dir=suite)

    assert result.exit_code == 0, result.summary()
    assert len(result.catalog.queues) == len(load_catalog(selftest.DEFAULT_CATALOG).queues) > 10
    scratch = server.created_database()
    assert re.fullmatch(r"tablequeue_selftest_\d{14}_[0-9a-f]{6}", scratch)
    master = server.statements("master")
    # created, RCSI off then on, then single user and dropped: in this order, all from master
    created = position(master, rf"^CREATE DATABASE \[{scratch}\];$")
    off = position(master, rf"ALTER DATABASE \[{scratch}\] SET READ_COMMITTED_SNAPSHOT OFF WITH ROLLBACK IMMEDIATE", created)
    on = position(master, rf"ALTER DATABASE \[{scratch}\] SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE", off)
    single = position(master, rf"^ALTER DATABASE \[{scratch}\] SET SINGLE_USER WITH ROLLBACK IMMEDIATE;$", on)
    assert master[single + 1] == f"DROP DATABASE [{scratch}];"

    # the catalog is deployed into the scratch database, tSQLt runs there once per RCSI setting, and
    # each run follows its ALTER DATABASE
    everything = [sql for _, sql in server.log]
    schema = result.catalog.schema
    assert re.fullmatch(r"selftest_\d{14}_[0-9a-f]{6}", schema) and scratch.endswith(schema[len("selftest_"):])
    assert any(f"CREATE SCHEMA [{schema}]" in sql for sql in server.statements(scratch))
    run_alls = [i for i, sql in enumerate(everything) if sql == tsqlt.RUN_ALL_SQL]
    assert [db for db, sql in server.log if sql == tsqlt.RUN_ALL_SQL] == [scratch, scratch]
    alters = [i for i, sql in enumerate(everything) if "SET READ_COMMITTED_SNAPSHOT" in sql]
    drop = everything.index(f"DROP DATABASE [{scratch}];")
    assert alters[0] < run_alls[0] < alters[1] < run_alls[1] < drop
    assert not any("tSQLt" in sql for sql in server.statements("app") + master)
    assert all(session.closed for session in server.sessions)

    # the conformance subprocess ran the SQL Server half only, once per mode, on the scratch database
    seen = seen_urls(suite)
    assert [line.split()[0] for line in seen] == ["mssql", "mssql"]
    assert all(database_of(line.split()[1]) == scratch for line in seen)

    tsqlt_half = result.modes[0].halves[0]
    assert [mode.label for mode in result.modes] == ["RCSI off", "RCSI on"]
    assert [mode.rcsi for mode in result.modes] == [False, True]
    assert tsqlt_half.status == "passed" and tsqlt_half.tests == tsqlt_half.passed > 100
    assert f"{len(result.catalog.queues)} queues into schema {schema}" in result.deploy_detail


def test_report_has_the_server_facts_and_a_row_per_mode_and_half(tmp_path: Path) -> None:
    server = FakeSqlServer(url_rcsi=True)
    result = run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=stand_in_suite(tmp_path))
    report = (tmp_path / "out" / "selftest.md").read_text()

    assert report.startswith("## tablequeue selftest: passed\n")
    assert "| server | Microsoft SQL Server 2022 (RTM-CU12) (KB5033663) - 16.0.4125.3 (X64) |" in report
    assert "| product version | 16.0.4125.3 |" in report
    assert "| edition | Developer Edition (64-bit) (EngineEdition 3) |" in report
    assert "| database app (the URL's) | RCSI on, compatibility level 160 |" in report
    assert "| CLR (tSQLt) | available; clr enabled = 1, clr strict security = 1 |" in report
    assert f"| scratch | database {server.created_database()}, compatibility level 160; dropped |" in report
    assert "| RCSI runs | RCSI off, RCSI on |" in report
    tests = result.modes[0].halves[0].tests
    for mode in ("RCSI off", "RCSI on"):
        assert re.search(rf"^\| {mode} \| tSQLt \| passed \| {tests} \| {tests} \| 0 \| 0 \| \d+\.\d \|$", report, re.M)
        assert re.search(rf"^\| {mode} \| conformance \| passed \| 1 \| 1 \| 0 \| 0 \| \d+\.\d \|$", report, re.M)
    assert "### Failures" not in report


def test_junit_file_holds_both_halves_of_both_modes(tmp_path: Path) -> None:
    server = FakeSqlServer()
    result = run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=stand_in_suite(tmp_path))
    cases = junit_cases(tmp_path / "out" / "selftest.xml")

    tests = result.modes[0].halves[0].tests
    for prefix in ("rcsi_off", "rcsi_on"):
        tsqlt_cases = [name for name in cases if name.startswith(f"{prefix}.tsqlt.test_selftest_")]
        assert len(tsqlt_cases) == tests
        assert f"{prefix}.conformance.test_stand_in::test_sql_server_half" in cases
    assert "selftest.deploy::deploy" in cases
    root = ET.parse(tmp_path / "out" / "selftest.xml").getroot()
    assert root.get("tests") == str(len(cases)) == str(2 * tests + 2 + 1)
    assert (root.get("failures"), root.get("errors"), root.get("skipped")) == ("0", "0", "0")


def test_failing_tests_give_exit_code_1_and_are_listed(tmp_path: Path) -> None:
    server = FakeSqlServer(outcomes={"test dequeue returns the message as it was stored": (
        "Failure", "Expected: <0> but was: <1>")})
    suite = stand_in_suite(tmp_path, failing=True)
    result = run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=suite)

    assert result.exit_code == 1
    failed_tsqlt = [half for mode in result.modes for half in mode.halves if half.name == "tSQLt"]
    assert all(half.status == "failed" and half.failed > 0 for half in failed_tsqlt)
    report = (tmp_path / "out" / "selftest.md").read_text()
    assert report.startswith("## tablequeue selftest: FAILED\n")
    assert re.search(r"^- RCSI on, tSQLt: \[test_selftest_\w+\]\.\[test dequeue returns the message as it was stored\]: "
                     r"Expected: <0> but was: <1>$", report, re.M)
    assert re.search(r"^- RCSI off, conformance: test_failing::test_sql_server_claim_is_wrong: "
                     r"AssertionError: deliberately wrong", report, re.M)
    root = ET.parse(tmp_path / "out" / "selftest.xml").getroot()
    failures = int(root.get("failures"))
    assert failures == sum(half.failed for mode in result.modes for half in mode.halves) > 2
    assert f"DROP DATABASE [{server.created_database()}];" in server.statements("master")


def test_the_scratch_database_is_dropped_when_the_deploy_fails(tmp_path: Path) -> None:
    server = FakeSqlServer(answers={"CREATE TABLE": [db_error("The CREATE TABLE permission was denied.")]})
    suite = stand_in_suite(tmp_path)
    result = run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=suite)

    assert result.exit_code == 1
    assert result.deploy_status == "error" and "CREATE TABLE permission was denied" in result.deploy_detail
    scratch = server.created_database()
    assert server.statements("master")[-2:] == [
        f"ALTER DATABASE [{scratch}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE;", f"DROP DATABASE [{scratch}];"]
    assert tsqlt.RUN_ALL_SQL not in server.statements() and seen_urls(suite) == []
    assert "| deploy | error: FakeDbError: The CREATE TABLE permission was denied." in (
        tmp_path / "out" / "selftest.md").read_text()
    deploy_case = junit_cases(tmp_path / "out" / "selftest.xml")["selftest.deploy::deploy"]
    assert "CREATE TABLE permission was denied" in deploy_case.find("error").get("message")


def test_a_tsqlt_run_that_cannot_be_carried_out_is_an_error_and_the_rest_still_runs(tmp_path: Path) -> None:
    server = FakeSqlServer(clr_enabled=0)
    suite = stand_in_suite(tmp_path)
    result = run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=suite)

    assert result.exit_code == 1
    halves = {(mode.label, half.name): half for mode in result.modes for half in mode.halves}
    assert halves[("RCSI off", "tSQLt")].status == "error"
    assert "'clr enabled' = 0" in halves[("RCSI off", "tSQLt")].reason
    assert halves[("RCSI on", "conformance")].status == "passed" and len(seen_urls(suite)) == 2
    assert f"DROP DATABASE [{server.created_database()}];" in server.statements("master")
    error = junit_cases(tmp_path / "out" / "selftest.xml")["rcsi_on.tsqlt::tSQLt"].find("error")
    assert "'clr enabled' = 0" in error.get("message")


def test_the_drop_happens_when_setting_rcsi_fails(tmp_path: Path) -> None:
    server = FakeSqlServer(answers={"READ_COMMITTED_SNAPSHOT ON": [db_error("ALTER DATABASE failed.")]})
    result = run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=stand_in_suite(tmp_path))

    assert result.exit_code == 1
    on = result.modes[1]
    assert on.label == "RCSI on" and [half.status for half in on.halves] == ["error", "error"]
    assert "could not set READ_COMMITTED_SNAPSHOT ON" in on.halves[0].reason
    assert server.statements("master")[-1] == f"DROP DATABASE [{server.created_database()}];"


def test_a_failed_drop_fails_the_run_and_says_how_to_finish(tmp_path: Path) -> None:
    server = FakeSqlServer(answers={"SET SINGLE_USER": [db_error("User does not have permission to alter database.")]})
    result = run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=stand_in_suite(tmp_path))

    assert result.exit_code == 1 and result.cleanup_failed
    scratch = server.created_database()
    assert "User does not have permission to alter database" in result.scratch.cleanup
    assert f"DROP DATABASE [{scratch}];" in result.scratch.cleanup
    assert "cleanup FAILED" in (tmp_path / "out" / "selftest.md").read_text()


def test_keep_leaves_the_scratch_database(tmp_path: Path) -> None:
    server = FakeSqlServer()
    result = run_selftest(mssql_options(tmp_path, keep=True), connect=server.connect,
                          conformance_dir=stand_in_suite(tmp_path))
    assert result.exit_code == 0
    assert not any("DROP DATABASE" in sql or "SINGLE_USER" in sql for sql in server.statements())
    assert result.scratch.cleanup.startswith("kept (--keep)")


def test_rcsi_on_runs_once_with_rcsi_on(tmp_path: Path) -> None:
    server = FakeSqlServer()
    suite = stand_in_suite(tmp_path)
    result = run_selftest(mssql_options(tmp_path, rcsi="on"), connect=server.connect, conformance_dir=suite)
    assert [mode.label for mode in result.modes] == ["RCSI on"]
    assert [sql for sql in server.statements() if "SET READ_COMMITTED_SNAPSHOT" in sql] == [
        f"ALTER DATABASE [{server.created_database()}] SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE;"]
    assert len(seen_urls(suite)) == 1


def test_create_database_refused_names_the_permission_and_runs_nothing(tmp_path: Path) -> None:
    server = FakeSqlServer(answers={"CREATE DATABASE": [db_error("CREATE DATABASE permission denied in database 'master'.")]})
    with pytest.raises(SelftestError) as info:
        run_selftest(mssql_options(tmp_path), connect=server.connect, conformance_dir=stand_in_suite(tmp_path))
    message = str(info.value)
    assert "CREATE DATABASE permission denied in database 'master'." in message
    assert "CREATE ANY DATABASE" in message and "dbcreator" in message
    assert "--scratch schema" in message and "database 'app'" in message
    assert "pw@" not in message  # the URL in the message is masked
    assert not any("DROP" in sql or "ALTER" in sql for sql in server.statements())
    assert not (tmp_path / "out").exists()


def test_without_tsqlt_the_sql_server_run_is_not_green(tmp_path: Path) -> None:
    server = FakeSqlServer()
    result = run_selftest(mssql_options(tmp_path, tsqlt_installer=None), connect=server.connect,
                          conformance_dir=stand_in_suite(tmp_path))
    assert result.exit_code == 1
    half = result.modes[0].halves[0]
    assert (half.status, half.reason) == ("not run", "no tSQLt.class.sql given (--tsqlt or TABLEQUEUE_TSQLT)")
    assert result.modes[0].halves[1].status == "passed"
    skipped = junit_cases(tmp_path / "out" / "selftest.xml")["rcsi_off.tsqlt::tSQLt"].find("skipped")
    assert skipped.get("message") == "not run: no tSQLt.class.sql given (--tsqlt or TABLEQUEUE_TSQLT)"


def test_conformance_tests_missing_is_reported_as_not_run_never_as_passed(tmp_path: Path) -> None:
    server = FakeSqlServer()
    result = run_selftest(mssql_options(tmp_path, rcsi="off"), connect=server.connect,
                          conformance_dir=tmp_path / "no-checkout" / "tests" / "conformance")
    assert result.exit_code == 1
    half = result.modes[0].halves[1]
    assert half.status == "not run" and "not with the installed package" in half.reason
    assert result.modes[0].halves[0].status == "passed"  # deploy and tSQLt still ran
    report = (tmp_path / "out" / "selftest.md").read_text()
    assert re.search(r"^\| RCSI off \| conformance \| not run: the conformance tests are not here", report, re.M)


def test_odbc_connect_urls_get_the_scratch_database_inside_the_odbc_string(tmp_path: Path) -> None:
    raw = "DRIVER={ODBC Driver 18 for SQL Server};SERVER=sql.example;DATABASE=app;UID=sa;PWD={p;w}"
    url = "mssql+pyodbc:///?odbc_connect=" + quote(raw, safe="")
    server = FakeSqlServer()
    result = run_selftest(mssql_options(tmp_path, url=url, rcsi="off"), connect=server.connect,
                          conformance_dir=stand_in_suite(tmp_path))
    assert result.exit_code == 0, result.summary()
    scratch = server.created_database()
    # facts, create, its compatibility level, deploy, RCSI, tSQLt, drop
    assert [session.database for session in server.sessions] == [
        "app", "master", "master", scratch, "master", scratch, "master"]
    assert {db for db, sql in server.log if sql == tsqlt.RUN_ALL_SQL} == {scratch}


# --- SQL Server, scratch schema ---------------------------------------------------------------

def test_scratch_schema_on_sql_server_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    server = FakeSqlServer(url_rcsi=True)
    suite = stand_in_suite(tmp_path)
    result = run_selftest(mssql_options(tmp_path, scratch="schema"), connect=server.connect, conformance_dir=suite)

    assert result.exit_code == 0, result.summary()
    assert [mode.label for mode in result.modes] == ["RCSI on"]  # as found; not changed
    assert not any("DATABASE" in sql for sql in server.statements() if sql.startswith(("CREATE", "ALTER", "DROP")))
    assert {db for db, _ in server.log} == {"app"}
    schema = result.catalog.schema
    app = server.statements("app")
    assert any(f"CREATE SCHEMA [{schema}]" in sql for sql in app)
    # the run's test classes and the tSQLt it installed are removed, then the schema
    dropped_classes = {params[0] for (_, sql), params in zip(server.log, server.params) if "tSQLt.DropClass" in sql}
    assert dropped_classes == {f"test_{schema}_{queue.name}" for queue in result.catalog.queues}
    drop_schema = app.index(MSSQL_DROP_SCHEMA)
    assert app.index("EXEC tSQLt.Uninstall;") < drop_schema
    assert server.params[[sql for _, sql in server.log].index(MSSQL_DROP_SCHEMA)] == (schema,) * 8
    assert [line.split()[1] for line in seen_urls(suite)] == [MSSQL_URL]


def test_scratch_schema_keeps_a_tsqlt_that_was_there_before(tmp_path: Path) -> None:
    server = FakeSqlServer(answers={selftest.MSSQL_TSQLT_INSTALLED_SQL: [ResultSet(rows=[(1,)])]})
    result = run_selftest(mssql_options(tmp_path, scratch="schema"), connect=server.connect,
                          conformance_dir=stand_in_suite(tmp_path))
    assert result.exit_code == 0
    assert any("tSQLt.DropClass" in sql for sql in server.statements())
    assert "EXEC tSQLt.Uninstall;" not in server.statements()


@pytest.mark.parametrize(("rcsi", "url_rcsi"), [("both", False), ("on", False), ("off", True)])
def test_scratch_schema_refuses_an_rcsi_it_would_have_to_change(tmp_path: Path, rcsi: str, url_rcsi: bool) -> None:
    server = FakeSqlServer(url_rcsi=url_rcsi)
    with pytest.raises(SelftestInvalid, match=f"--rcsi {rcsi} needs a scratch database"):
        run_selftest(mssql_options(tmp_path, scratch="schema", rcsi=rcsi), connect=server.connect,
                     conformance_dir=stand_in_suite(tmp_path))
    assert server.statements() == [selftest.MSSQL_SERVER_FACTS_SQL, tsqlt.CLR_SQL]


def test_azure_sql_database_needs_a_scratch_schema_and_has_no_tsqlt(tmp_path: Path) -> None:
    suite = stand_in_suite(tmp_path)
    refusing = FakeSqlServer(edition=5)
    with pytest.raises(SelftestInvalid, match="Azure SQL Database.*--scratch schema"):
        run_selftest(mssql_options(tmp_path), connect=refusing.connect, conformance_dir=suite)
    assert not any("CREATE" in sql for sql in refusing.statements())

    server = FakeSqlServer(edition=5)
    result = run_selftest(mssql_options(tmp_path, scratch="schema"), connect=server.connect, conformance_dir=suite)
    half = result.modes[0].halves[0]
    assert (half.status, half.reason) == ("not applicable", "Azure SQL Database has no SQLCLR, which tSQLt needs")
    assert [sql for sql in server.statements() if "tSQLt" in sql] == [selftest.MSSQL_TSQLT_INSTALLED_SQL]
    assert result.exit_code == 0  # what cannot exist on the platform does not fail the run
    assert "| CLR (tSQLt) | not available on this platform |" in (tmp_path / "out" / "selftest.md").read_text()


# --- PostgreSQL --------------------------------------------------------------------------------

def tablequeue(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tablequeue", *args], capture_output=True, text=True, timeout=600)


def leftovers(url: str) -> tuple[list[str], list[str], list[str]]:
    """Databases, schemas and roles a selftest run may leave behind."""
    with psycopg.connect(url, autocommit=True) as conn:
        databases = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'tablequeue\\_selftest\\_%'").fetchall()]
        schemas = [r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'selftest\\_%'").fetchall()]
        roles = [r[0] for r in conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'selftest\\_%'").fetchall()]
    return databases, schemas, roles


def test_postgresql_selftest_runs_the_conformance_suite_in_a_scratch_database(pg_url: str, tmp_path: Path) -> None:
    run = tablequeue("selftest", "--url", pg_url, "--junit", str(tmp_path / "selftest.xml"),
                     "--report", str(tmp_path / "selftest.md"),
                     "--conformance-filter", "test_dequeue_on_an_empty_queue_returns_no_rows")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    scratch = re.search(r"created scratch database (tablequeue_selftest_\w+)", run.stdout).group(1)
    assert "TABLEQUEUE_PG_URL set to the scratch database" in run.stdout

    report = (tmp_path / "selftest.md").read_text()
    assert report in run.stdout  # printed as well as written
    assert re.search(r"^\| server \| PostgreSQL \d+", report, re.M)
    assert f"| scratch | database {scratch}; dropped |" in report
    assert "| PostgreSQL | tSQLt | not applicable: tSQLt is for SQL Server |" in report
    counted = re.search(r"^\| PostgreSQL \| conformance \| passed \| (\d+) \| (\d+) \| 0 \| 0 \|", report, re.M)
    assert counted and counted.group(1) == counted.group(2) and int(counted.group(1)) >= 5

    cases = junit_cases(tmp_path / "selftest.xml")
    conformance = [name for name in cases if name.startswith("postgres.conformance.")]
    assert len(conformance) == int(counted.group(1))
    assert all("test_dequeue_on_an_empty_queue_returns_no_rows[postgres-" in name for name in conformance)
    assert cases["postgres.tsqlt::tSQLt"].find("skipped") is not None
    assert cases["selftest.deploy::deploy"].find("error") is None

    databases, schemas, roles = leftovers(pg_url)
    assert scratch not in databases and schemas == [] and roles == []


def test_postgresql_scratch_schema_deploys_into_the_url_database_and_drops_it(pg_url: str, tmp_path: Path) -> None:
    suite = stand_in_suite(tmp_path)
    # the stand-in test also records which selftest schemas and roles exist while it runs
    (suite / "test_sees_the_schema.py").write_text(
        "import os\nimport psycopg\nfrom pathlib import Path\n\n"
        "def test_schema_is_deployed():\n"
        "    with psycopg.connect(os.environ['TABLEQUEUE_PG_URL']) as conn:\n"
        "        found = conn.execute(\"SELECT n.nspname || '.' || p.proname FROM pg_proc AS p JOIN pg_namespace AS n \"\n"
        "                             \"ON n.oid = p.pronamespace WHERE n.nspname LIKE 'selftest%%' \"\n"
        "                             \"AND p.proname = 'work_all_process'\").fetchall()\n"
        "    Path(__file__).with_name('deployed.txt').write_text(repr(found))\n")
    result = run_selftest(SelftestOptions(url=pg_url, scratch="schema"), conformance_dir=suite)

    assert result.exit_code == 0, result.summary()
    assert (suite / "deployed.txt").read_text() == repr([(f"{result.catalog.schema}.work_all_process",)])
    assert seen_urls(suite) == [f"postgres {pg_url}"]
    assert leftovers(pg_url) == ([], [], [])


def test_postgresql_keep_leaves_the_scratch_database_with_the_catalog(pg_url: str, tmp_path: Path) -> None:
    result = run_selftest(SelftestOptions(url=pg_url, keep=True), conformance_dir=stand_in_suite(tmp_path))
    scratch = result.scratch
    try:
        assert result.exit_code == 0, result.summary()
        assert scratch.cleanup.startswith("kept (--keep): drop it with DROP DATABASE")
        with psycopg.connect(scratch.url) as conn:
            queues = conn.execute("SELECT count(*) FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
                                  "WHERE n.nspname = %s AND p.proname LIKE '%%\\_enqueue'",
                                  (scratch.schema,)).fetchone()[0]
        assert queues == len(result.catalog.queues)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch.database}" WITH (FORCE)')
            for role in SCHEMA_ROLES:
                conn.execute(f'DROP ROLE IF EXISTS "{scratch.schema}_{role}"')


def test_postgresql_failing_conformance_test_gives_exit_code_1(pg_url: str, tmp_path: Path) -> None:
    result = run_selftest(SelftestOptions(url=pg_url, report=tmp_path / "r.md"),
                          conformance_dir=stand_in_suite(tmp_path, failing=True))
    assert result.exit_code == 1
    half = result.modes[0].halves[1]
    assert (half.status, half.tests, half.passed, half.failed) == ("failed", 2, 1, 1)
    assert "- PostgreSQL, conformance: test_failing::test_postgres_claim_is_wrong: AssertionError: deliberately wrong" \
        in (tmp_path / "r.md").read_text()
    assert leftovers(pg_url) == ([], [], [])


def test_postgresql_conformance_filter_matching_nothing_is_an_error(pg_url: str, tmp_path: Path) -> None:
    result = run_selftest(SelftestOptions(url=pg_url, conformance_filter="no_such_test"),
                          conformance_dir=stand_in_suite(tmp_path))
    half = result.modes[0].halves[1]
    assert (half.status, half.reason) == ("error", "pytest exited with code 5")
    assert result.exit_code == 1


def test_postgresql_login_without_createdb_is_told_what_it_needs(pg_url: str) -> None:
    role, password = f"nocreate_{secrets.token_hex(3)}", secrets.token_hex(8)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB PASSWORD '{password}'")
    try:
        url = re.sub(r"://[^@]+@", f"://{role}:{password}@", pg_url)
        run = tablequeue("selftest", "--url", url)
        assert run.returncode == 1
        assert "permission denied to create database" in run.stderr
        assert "CREATEDB" in run.stderr and "--scratch schema" in run.stderr
        assert password not in run.stderr
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize(("args", "message"), [
    (["--url", "postgresql://u@127.0.0.1:1/db", "--rcsi", "on"], "--rcsi is a SQL Server setting"),
    (["--url", "postgresql://u@127.0.0.1:1/db", "--tsqlt", "tSQLt.class.sql"], "tSQLt runs on SQL Server only"),
    (["--url", MSSQL_URL, "--tsqlt", "/nonexistent/tSQLt.class.sql"],
     "--tsqlt /nonexistent/tSQLt.class.sql: cannot read the file"),
    (["--url", MSSQL_URL, "--catalog", "/nonexistent/queues.yml"], "/nonexistent/queues.yml"),
])
def test_invalid_input_is_exit_code_2_before_any_connection(args: list[str], message: str) -> None:
    # the URLs point nowhere: reaching a connection would be exit code 1, not 2
    run = tablequeue("selftest", *args)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr
