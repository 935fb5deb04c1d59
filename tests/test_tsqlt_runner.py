"""Unit tests for tablequeue.tsqlt with a fake DB-API connection (no SQL Server here).

The fake (tests/fake_mssql.py) records every batch the runner sends and answers the runner's own
queries with canned rows.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fake_mssql import PREFIX, T0, FakeConnection, FakeDbError, ResultSet, db_error, row
from tablequeue import tsqlt
from tablequeue.tsqlt import (
    TsqltError, TsqltResult, TsqltTestResult, count_tsqlt_tests, find_tsqlt_tests, run_tsqlt,
)

INSTALL = """\
IF OBJECT_ID('tSQLt.Info') IS NOT NULL EXEC ('PRINT ''old''');
GO
CREATE SCHEMA tSQLt;
GO
CREATE PROCEDURE tSQLt.Demo AS PRINT 'a GO inside a string
GO
is not a separator';
GO
"""

CLASS_A = """\
EXEC tSQLt.NewTestClass 'QueueTests';
GO
CREATE PROCEDURE QueueTests.[test enqueue then dequeue]
AS
BEGIN
  /* nested /* comment */ with GO
GO
  */
  EXEC tSQLt.AssertEquals 1, 1;
END;
GO
CREATE OR ALTER PROC [QueueTests].[test dequeue on empty queue] AS RETURN 0;
GO 2
"""

CLASS_B = """\
EXEC tSQLt.NewTestClass 'DeadLetterTests';
GO
CREATE PROCEDURE DeadLetterTests.test_requeue AS RETURN 0;
GO
"""

PASSING_ROWS = [
    row("QueueTests", "test enqueue then dequeue", "Success", ms=250),
    row("QueueTests", "test dequeue on empty queue", "Success", ms=1500),
    row("DeadLetterTests", "test_requeue", "Success", ms=5),
]


def scripts():
    return [("tests_tsql/queue.sql", CLASS_A), ("tests_tsql/dead.sql", CLASS_B)]


# --- the sequence of batches -----------------------------------------------------------------

def test_batches_are_split_and_sent_in_order():
    conn = FakeConnection(results=PASSING_ROWS)
    result = run_tsqlt(conn, INSTALL, scripts(), None)

    assert conn.executed[:3] == [tsqlt.EDITION_SQL, tsqlt.SESSION_SQL, tsqlt.CLR_SQL]
    assert conn.batches() == [
        "IF OBJECT_ID('tSQLt.Info') IS NOT NULL EXEC ('PRINT ''old''');",
        "CREATE SCHEMA tSQLt;",
        "CREATE PROCEDURE tSQLt.Demo AS PRINT 'a GO inside a string\nGO\nis not a separator';",
        "EXEC tSQLt.NewTestClass 'QueueTests';",
        "CREATE PROCEDURE QueueTests.[test enqueue then dequeue]\nAS\nBEGIN\n"
        "  /* nested /* comment */ with GO\nGO\n  */\n  EXEC tSQLt.AssertEquals 1, 1;\nEND;",
        # GO 2: sent twice
        "CREATE OR ALTER PROC [QueueTests].[test dequeue on empty queue] AS RETURN 0;",
        "CREATE OR ALTER PROC [QueueTests].[test dequeue on empty queue] AS RETURN 0;",
        "EXEC tSQLt.NewTestClass 'DeadLetterTests';",
        "CREATE PROCEDURE DeadLetterTests.test_requeue AS RETURN 0;",
    ]
    # what a killed run left undone, install, then tSQLt.Info(), then the test classes, RunAll,
    # and the results last
    assert conn.executed[3] == tsqlt.UNDO_SQL
    assert conn.executed.index(tsqlt.VERSION_SQL) == 7
    assert conn.executed[-2:] == [tsqlt.RUN_ALL_SQL, tsqlt.RESULTS_SQL]
    assert conn.closed_cursors == len(conn.executed)
    assert result.tsqlt_version == "1.0.8083.3529"
    assert (result.passed, result.failed, result.errors, result.skipped) == (3, 0, 0, 0)
    assert result.not_run == ()
    assert result.exit_code == 0


def test_test_doubles_a_killed_run_left_are_undone_before_tsqlt_is_reinstalled():
    # a NoTransaction test renames the real tables it fakes; the installer drops tSQLt's log of
    # the renames, so tSQLt.UndoTestDoubles must run (forced, when tSQLt is there) before it
    conn = FakeConnection(results=PASSING_ROWS)
    run_tsqlt(conn, INSTALL, scripts(), None)
    undo = conn.executed.index(tsqlt.UNDO_SQL)
    assert undo < conn.executed.index(INSTALL.split("\nGO\n")[0])
    assert conn.executed.count(tsqlt.UNDO_SQL) == 1
    assert tsqlt.UNDO_SQL == (
        "IF OBJECT_ID(N'tSQLt.UndoTestDoubles', N'P') IS NOT NULL EXEC tSQLt.UndoTestDoubles @Force = 1;"
    )


def test_a_failing_undo_of_test_doubles_stops_the_run_before_the_install():
    refused = db_error("Attempting to remove object(s) that is/are not marked as temporary.")
    conn = FakeConnection(answers={"tSQLt.UndoTestDoubles": [refused]})
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    assert str(info.value).startswith("tSQLt.UndoTestDoubles (test doubles a killed run left): ")
    assert "CREATE SCHEMA tSQLt;" not in conn.executed


def test_every_result_set_is_drained_so_late_errors_surface():
    # the error comes after a rowcount and a PRINT, as pyodbc reports it: on nextset()
    late_error = [ResultSet(), ResultSet(messages=[("[01000] (0)", "x")]), db_error("There is already a schema named 'tSQLt'.")]
    conn = FakeConnection(answers={"CREATE SCHEMA tSQLt;": late_error})
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    message = str(info.value)
    assert message.startswith("tSQLt.class.sql: the batch starting at line 3 failed: ")
    assert "There is already a schema named 'tSQLt'." in message
    assert "[Microsoft]" not in message
    assert tsqlt.RUN_ALL_SQL not in conn.executed


def test_pyodbc_error_class_is_found_through_the_connections_module():
    class Connection:  # no .Error attribute, like pyodbc.Connection
        pass

    Connection.__module__ = "fake_driver_module"
    import sys
    import types

    module = types.ModuleType("fake_driver_module")
    module.Error = FakeDbError
    sys.modules["fake_driver_module"] = module
    try:
        assert tsqlt.driver_error_class(Connection()) is FakeDbError
    finally:
        del sys.modules["fake_driver_module"]


# --- RunAll's error when tests fail ----------------------------------------------------------

FAILING_ROWS = [
    row("QueueTests", "test enqueue then dequeue", "Success"),
    row("QueueTests", "test dequeue on empty queue", "Failure",
        "Expected: <1> but was: <0>\nsecond line of the message"),
    row("DeadLetterTests", "test_requeue", "Error",
        "Divide by zero error encountered.[16,1]{DeadLetterTests.test_requeue,3}"),
]


def run_all_failing():
    return [
        ResultSet(messages=[("[01000] (0)", f"{PREFIX}|No|Test Case Name|Result|")]),
        ResultSet(messages=[("[01000] (0)", f"{PREFIX}[QueueTests].[test dequeue on empty queue] failed")]),
        db_error("Test Case Summary: 3 test case(s) executed, 1 succeeded, 0 skipped, 1 failed, 1 errored."),
    ]


def test_run_all_error_is_tolerated_and_results_are_read():
    conn = FakeConnection(results=FAILING_ROWS, run_all=run_all_failing())
    result = run_tsqlt(conn, INSTALL, scripts(), None)

    assert conn.executed[-1] == tsqlt.RESULTS_SQL
    assert result.run_all_error == (
        "Test Case Summary: 3 test case(s) executed, 1 succeeded, 0 skipped, 1 failed, 1 errored. "
        "(50000) (SQLExecDirectW)"
    )
    assert result.output == ("|No|Test Case Name|Result|", "[QueueTests].[test dequeue on empty queue] failed")
    assert (result.passed, result.failed, result.errors, result.skipped) == (1, 1, 1, 0)
    assert not result.unexplained_error
    assert result.exit_code == 1
    assert "1 failed, 1 errors" in result.summary()


def test_run_all_error_raised_on_execute_is_tolerated_too():
    conn = FakeConnection(results=FAILING_ROWS, run_all=[db_error("Test Case Summary: ... 1 failed")])
    result = run_tsqlt(conn, INSTALL, scripts(), None)
    assert result.failed == 1 and result.output == ()


def test_run_all_error_with_all_tests_passing_still_fails_the_run():
    conn = FakeConnection(results=PASSING_ROWS, run_all=[db_error("Cannot find tSQLt.Private_Init")])
    result = run_tsqlt(conn, INSTALL, scripts(), None)
    assert result.unexplained_error
    assert result.exit_code == 1
    assert "tSQLt.RunAll raised: Cannot find tSQLt.Private_Init" in result.summary()


def test_results_unreadable_after_run_all_error_names_both():
    conn = FakeConnection(
        run_all=[db_error("Communication link failure", "08S01")],
        answers={tsqlt.RESULTS_SQL: [db_error("Invalid column name 'TestStartTime'.")]},
    )
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    assert "Invalid column name 'TestStartTime'." in str(info.value)
    assert "tSQLt.RunAll had failed with: Communication link failure" in str(info.value)


# --- exit code -------------------------------------------------------------------------------

def result_of(*rows, not_run=(), run_all_error=None) -> TsqltResult:
    tests = tuple(TsqltTestResult(c, n, r, m or "", s, e) for c, n, r, m, s, e in rows)
    return TsqltResult(tests=tests, not_run=not_run, run_all_error=run_all_error)


@pytest.mark.parametrize(("rows", "code"), [
    ([row("A", "test 1", "Success"), row("A", "test 2", "Success")], 0),
    ([row("A", "test 1", "Success"), row("A", "test 2", "Failure", "boom")], 1),
    ([row("A", "test 1", "Success"), row("A", "test 2", "Error", "boom")], 1),
    ([], 1),                                                        # zero tests ran
    ([row("A", "test 1", "Skipped", "not on Linux")], 1),           # nothing actually executed
    ([row("A", "test 1", "Success"), row("A", "test 2", "Skipped")], 0),
    ([row("A", "test 1", "A severe error happened during test execution. Test did not finish.")], 1),
    ([row("A", "test 1", None)], 1),
])
def test_exit_code(rows, code):
    assert result_of(*rows).exit_code == code


def test_exit_code_for_defined_tests_that_did_not_run():
    result = result_of(row("A", "test 1", "Success"), not_run=(("B", "test orphan"),))
    assert result.exit_code == 1
    assert "1 defined but not run: [B].[test orphan]" in result.summary()


def test_zero_tests_from_the_server_gives_exit_code_1():
    conn = FakeConnection(results=[])
    result = run_tsqlt(conn, INSTALL, [], None)
    assert result.exit_code == 1
    assert "0 tSQLt tests" in result.summary()


def test_tests_missing_from_results_are_reported_as_not_run():
    conn = FakeConnection(results=[r for r in PASSING_ROWS if r[1] != "test_requeue"])
    result = run_tsqlt(conn, INSTALL, scripts(), None)
    assert result.not_run == (("DeadLetterTests", "test_requeue"),)
    assert result.exit_code == 1


def test_result_names_match_case_insensitively():
    rows = [(c.upper(), n.upper(), *rest) for c, n, *rest in PASSING_ROWS]
    result = run_tsqlt(FakeConnection(results=rows), INSTALL, scripts(), None)
    assert result.not_run == ()


# --- JUnit XML -------------------------------------------------------------------------------

def test_junit_xml_content(tmp_path: Path):
    rows = FAILING_ROWS + [
        row("DeadLetterTests", "test skipped one", "Skipped", "needs Enterprise edition", ms=0),
        ("QueueTests", "test never finished", "A severe error happened during test execution. Test did not finish.",
         None, T0, None),
    ]
    junit = tmp_path / "reports" / "tsqlt.xml"
    conn = FakeConnection(results=rows, run_all=run_all_failing())
    result = run_tsqlt(conn, INSTALL, scripts(), junit)
    assert result.exit_code == 1

    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("5", "1", "2", "1")

    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert set(suites) == {"QueueTests", "DeadLetterTests"}
    queue = suites["QueueTests"]
    assert (queue.get("tests"), queue.get("failures"), queue.get("errors"), queue.get("skipped")) == ("3", "1", "1", "0")
    assert queue.get("timestamp") == "2024-05-01T12:00:00"

    cases = {case.get("name"): case for case in root.iter("testcase")}
    assert cases["test enqueue then dequeue"].get("classname") == "QueueTests"
    assert cases["test enqueue then dequeue"].get("time") == "0.100"
    assert list(cases["test enqueue then dequeue"]) == []

    failure = cases["test dequeue on empty queue"].find("failure")
    assert failure.get("message") == "Expected: <1> but was: <0>"
    assert failure.text == "Expected: <1> but was: <0>\nsecond line of the message"
    assert failure.get("type") == "tSQLt.Fail"

    error = cases["test_requeue"].find("error")
    assert error.get("message").startswith("Divide by zero error encountered.")
    assert error.get("type") == "SQL Error"

    skipped = cases["test skipped one"].find("skipped")
    assert skipped.get("message") == "needs Enterprise edition"

    never = cases["test never finished"]
    assert never.get("time") == "0.000"
    assert "Test did not finish" in never.find("error").text


def test_junit_lists_not_run_tests_as_errors_and_survives_control_characters(tmp_path: Path):
    result = result_of(row("A", "test 1", "Failure", "bad \x00 byte \x1b[31m"), not_run=(("B", "test orphan"),))
    path = tmp_path / "out.xml"
    tsqlt.write_junit(result, path)
    root = ET.parse(path).getroot()  # parses: the control characters were replaced
    cases = {case.get("name"): case for case in root.iter("testcase")}
    assert "\ufffd" in cases["test 1"].find("failure").text
    orphan = cases["test orphan"].find("error")
    assert "tSQLt.NewTestClass" in orphan.text
    assert root.get("errors") == "1" and root.get("failures") == "1"


def test_no_junit_file_when_not_asked(tmp_path: Path):
    run_tsqlt(FakeConnection(results=PASSING_ROWS), INSTALL, scripts(), None)
    assert list(tmp_path.iterdir()) == []


# --- server checks ---------------------------------------------------------------------------

@pytest.mark.parametrize(("edition", "name"), [(5, "Azure SQL Database"), (9, "Azure SQL Edge"),
                                               (6, "Azure Synapse"), (11, "Azure Synapse")])
def test_platforms_without_clr_are_refused_before_anything_runs(edition, name):
    conn = FakeConnection(edition=edition)
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    assert name in str(info.value)
    assert f"SERVERPROPERTY('EngineEdition') = {edition}" in str(info.value)
    assert "SQLCLR" in str(info.value)
    assert conn.executed == [tsqlt.EDITION_SQL]


def test_session_is_reset_to_xact_abort_off_before_tsqlt_runs():
    # the deploy connection runs SET XACT_ABORT ON; tSQLt's per-test rollback to a savepoint
    # fails in a transaction that XACT_ABORT doomed
    conn = FakeConnection(results=PASSING_ROWS)
    run_tsqlt(conn, INSTALL, scripts(), None)
    assert "SET XACT_ABORT OFF;" in tsqlt.SESSION_SQL
    assert "SET QUOTED_IDENTIFIER ON;" in tsqlt.SESSION_SQL
    assert conn.executed.index(tsqlt.SESSION_SQL) < conn.executed.index(conn.batches()[0])


def test_managed_instance_is_accepted():
    assert run_tsqlt(FakeConnection(edition=8, results=PASSING_ROWS), INSTALL, scripts(), None).exit_code == 0


def test_system_database_is_refused():
    with pytest.raises(TsqltError, match="system database 'master'"):
        run_tsqlt(FakeConnection(database="master"), INSTALL, scripts(), None)


def test_clr_disabled_without_prepare_script_explains_what_to_run():
    conn = FakeConnection(clr_enabled=0)
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    assert "'clr enabled' = 0" in str(info.value)
    assert "PrepareServer.sql" in str(info.value)
    assert "sp_configure 'clr enabled', 1" in str(info.value)
    assert conn.batches() == []  # the runner does not reconfigure the server on its own


def test_prepare_server_script_runs_first_then_clr_is_checked():
    prepare = "EXEC master.sys.sp_configure @configname='clr enabled', @configvalue = 1;\nRECONFIGURE;\nGO\nEXEC #PrepareServer;\nGO\n"
    conn = FakeConnection(clr_enabled=0, results=PASSING_ROWS)
    result = run_tsqlt(conn, INSTALL, scripts(), None, prepare_server_script=prepare)
    assert result.exit_code == 0
    assert conn.executed[1:5] == [
        tsqlt.SESSION_SQL,
        "EXEC master.sys.sp_configure @configname='clr enabled', @configvalue = 1;\nRECONFIGURE;",
        "EXEC #PrepareServer;",
        tsqlt.CLR_SQL,
    ]


def test_clr_still_disabled_after_prepare_script():
    conn = FakeConnection(clr_enabled=0)
    with pytest.raises(TsqltError, match="still 0 after running PrepareServer.sql"):
        run_tsqlt(conn, INSTALL, scripts(), None, prepare_server_script="SELECT 1;\nGO\n")


def test_install_failure_hints_at_prepare_server_under_clr_strict_security():
    conn = FakeConnection(answers={"CREATE SCHEMA tSQLt": [db_error(
        "CREATE or ALTER ASSEMBLY for assembly 'tSQLtCLR' with the SAFE or EXTERNAL_ACCESS option failed")]})
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    message = str(info.value)
    assert message.startswith("tSQLt.class.sql: the batch starting at line 3 failed: CREATE or ALTER ASSEMBLY")
    assert "'clr strict security' is 1" in message


def test_install_failure_without_strict_security_has_no_hint():
    conn = FakeConnection(clr_strict=None, answers={"CREATE SCHEMA tSQLt": [db_error("boom")]})
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    assert "clr strict security" not in str(info.value)


def test_test_script_failure_names_the_file_and_line():
    conn = FakeConnection(answers={"CREATE PROCEDURE DeadLetterTests": [db_error("Invalid object name 'dbo.nope'.")]})
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, scripts(), None)
    assert str(info.value).startswith(
        "tests_tsql/dead.sql: the batch starting at line 3 failed: Invalid object name 'dbo.nope'.")
    assert tsqlt.RUN_ALL_SQL not in conn.executed


def test_unparseable_script_fails_before_anything_is_sent():
    conn = FakeConnection()
    broken = [("tests_tsql/broken.sql", "EXEC tSQLt.NewTestClass 'X';\nGO\nSELECT 'unterminated\nGO\n")]
    with pytest.raises(TsqltError) as info:
        run_tsqlt(conn, INSTALL, broken, None)
    assert str(info.value).startswith("tests_tsql/broken.sql: line 3: unterminated string literal")
    assert conn.executed == []


def test_tsqlt_info_failure_after_install():
    conn = FakeConnection(answers={tsqlt.VERSION_SQL: [db_error("Invalid object name 'tSQLt.Info'.")]})
    with pytest.raises(TsqltError, match="tSQLt.Info\\(\\) fails: Invalid object name"):
        run_tsqlt(conn, INSTALL, scripts(), None)


def test_autocommit_off_is_refused():
    conn = FakeConnection()
    conn.autocommit = False
    with pytest.raises(TsqltError, match="autocommit"):
        run_tsqlt(conn, INSTALL, scripts(), None)
    assert conn.executed == []


# --- counting tests without a server ---------------------------------------------------------

def test_count_tsqlt_tests_in_the_fixture_scripts():
    assert count_tsqlt_tests(scripts()) == 3
    assert find_tsqlt_tests(scripts()) == [
        ("QueueTests", "test enqueue then dequeue"),
        ("QueueTests", "test dequeue on empty queue"),
        ("DeadLetterTests", "test_requeue"),
    ]


@pytest.mark.parametrize(("text", "expected"), [
    ("CREATE PROCEDURE [C].[test a] AS RETURN;", [("C", "test a")]),
    ("create procedure C.[Test Mixed Case] as return;", [("C", "Test Mixed Case")]),
    ("CREATE OR ALTER PROCEDURE [C].[test b] AS RETURN;", [("C", "test b")]),
    ("CREATE   OR\n  ALTER\tPROC  C . testC AS RETURN;", [("C", "testC")]),
    ("CREATE PROC [my class].[test it's [odd]]] AS RETURN;", [("my class", "test it's [odd]")]),
    ('CREATE PROCEDURE "C"."test quoted" AS RETURN;', [("C", "test quoted")]),
    ("CREATE /* why not */ PROCEDURE C.[test commented keyword gap] AS RETURN;",
     [("C", "test commented keyword gap")]),
    ("CREATE PROCEDURE C.SetUp AS RETURN;", []),                          # not a test
    ("CREATE PROCEDURE C.[helper test] AS RETURN;", []),                  # must START with test
    ("CREATE PROCEDURE [test unqualified] AS RETURN;", []),               # dbo, not a test class
    ("ALTER PROCEDURE C.[test altered only] AS RETURN;", []),
    ("-- CREATE PROCEDURE C.[test in line comment] AS RETURN;", []),
    ("/* CREATE PROCEDURE C.[test in /* nested */ comment] AS RETURN; */", []),
    ("EXEC('CREATE PROCEDURE C.[test dynamic sql] AS RETURN;');", []),
    ("CREATE FUNCTION C.[test function]() RETURNS int AS BEGIN RETURN 1; END;", []),
    ("CREATE PROCEDURE C.[test a] AS RETURN;\nGO\nCREATE OR ALTER PROCEDURE c.[TEST A] AS RETURN;",
     [("C", "test a")]),                                                  # same test twice
])
def test_find_tsqlt_tests_forms(text, expected):
    assert find_tsqlt_tests([("t.sql", text)]) == expected
    assert count_tsqlt_tests([("t.sql", text)]) == len(expected)


def test_count_tsqlt_tests_of_nothing():
    assert count_tsqlt_tests([]) == 0


def test_count_tsqlt_tests_names_the_broken_file():
    with pytest.raises(TsqltError, match="^bad.sql: line 2: unterminated"):
        count_tsqlt_tests([("ok.sql", "SELECT 1"), ("bad.sql", "SELECT 1\n/* open")])
