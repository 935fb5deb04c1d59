"""Run tSQLt test classes against a SQL Server database and report the results.

Used by ``tablequeue test-tsql``. The connection is a DB-API connection (pyodbc in production,
a fake in the unit tests) opened with ``autocommit=True`` on the database under test: tSQLt runs
each test inside its own transaction and rolls it back, and its installer manages its own
transactions, so neither may run inside an implicit transaction of the driver.

What ``run_tsqlt`` does, in order:

1. Cuts every script into batches (gosplit) before touching the server, so a broken test file
   fails the run at once, naming its line.
2. Checks the server can run tSQLt at all. tSQLt needs SQLCLR, which Azure SQL Database, Azure
   SQL Edge and Azure Synapse do not have (``SERVERPROPERTY('EngineEdition')`` 5, 9, 6 and 11);
   Azure SQL Managed Instance (8) and SQL Server itself (2, 3, 4) are fine.
3. Resets the session's SET options to the SSMS/sqlcmd defaults tSQLt is written for. Above
   all ``XACT_ABORT OFF``: tSQLt runs each test in a transaction and rolls back to a savepoint
   afterwards, which a transaction doomed by XACT_ABORT ON cannot do (tSQLt issue #92), so a
   session left with XACT_ABORT ON (the deploy connection sets it) would turn failures into
   rollback errors.
4. Optionally runs tSQLt's ``PrepareServer.sql`` (from the tSQLt release zip). It enables
   ``clr enabled`` and installs the certificate/asymmetric-key login that lets the tSQLt assembly
   load while ``clr strict security`` stays on (the default since SQL Server 2017). It needs
   sysadmin and only has to run once per server; the runner never reconfigures the server by
   itself. The alternative, turning ``clr strict security`` off, lowers the security of the whole
   instance and is not what this tool recommends.
5. Installs tSQLt by running ``tSQLt.class.sql`` batch by batch (the installer drops and
   recreates tSQLt, so it is safe to run again). First, when tSQLt is already there, runs
   ``tSQLt.UndoTestDoubles @Force = 1``: a run killed during a NoTransaction test leaves the real
   tables renamed and their fakes in place, and only tSQLt's log (dropped by the installer) knows.
6. Runs each test class script batch by batch, then ``EXEC tSQLt.RunAll``. With tSQLt's default
   result formatter RunAll ends with a severity-16 error when any test failed; that error is
   expected and kept, and the results are read from ``tSQLt.TestResult`` regardless.
7. Writes a JUnit XML report if asked and returns a ``TsqltResult``.

pyodbc notes: a batch's later statements only run while the client reads its results, and an
error raised after the first result (e.g. after PRINT output) only surfaces on
``cursor.nextset()``, so every batch is drained with a ``nextset()`` loop. ``cursor.noscan`` is
set so the driver does not rewrite ODBC escape sequences (``{fn ...}``) in the scripts.
"""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from .gosplit import Batch, GoSplitError, mask_comments_and_strings, split_batches

__all__ = [
    "TsqltError", "TsqltTestResult", "TsqltResult",
    "run_tsqlt", "count_tsqlt_tests", "find_tsqlt_tests", "write_junit", "junit_element",
    "driver_error_class", "server_message",
]

# SERVERPROPERTY('EngineEdition') values whose engine has no SQLCLR, so no tSQLt.
NO_CLR_EDITIONS = {
    5: "Azure SQL Database",
    6: "Azure Synapse Analytics dedicated SQL pool",
    9: "Azure SQL Edge",
    11: "Azure Synapse Analytics serverless SQL pool",
}
SYSTEM_DATABASES = {"master", "model", "msdb", "tempdb"}

EDITION_SQL = "SELECT CAST(SERVERPROPERTY('EngineEdition') AS int) AS engine_edition, DB_NAME() AS database_name;"
# 'clr strict security' exists from SQL Server 2017 on; before that the subquery yields NULL.
CLR_SQL = """\
SELECT (SELECT CAST(value_in_use AS int) FROM sys.configurations
         WHERE name = N'clr enabled') AS clr_enabled,
       (SELECT CAST(value_in_use AS int) FROM sys.configurations
         WHERE name = N'clr strict security') AS clr_strict_security;"""
# The SSMS defaults; see the module docstring for why XACT_ABORT must be OFF.
SESSION_SQL = (
    "SET XACT_ABORT OFF; SET IMPLICIT_TRANSACTIONS OFF; SET ANSI_NULLS ON; "
    "SET QUOTED_IDENTIFIER ON; SET ANSI_PADDING ON; SET ANSI_WARNINGS ON; SET ARITHABORT ON; "
    "SET CONCAT_NULL_YIELDS_NULL ON; SET NUMERIC_ROUNDABORT OFF;"
)
VERSION_SQL = "SELECT Version FROM tSQLt.Info();"
# What a killed run left: a NoTransaction test (tSQLt 1.0.8083.3529) renames the real tables it fakes
# and commits, and only tSQLt.UndoTestDoubles (which reads tSQLt's own log of the renames) puts
# them back. The installer drops tSQLt and that log with it, so this runs before it; @Force = 1
# drops whatever sits under a real table's name. Deferred name resolution: no error without tSQLt.
UNDO_SQL = (
    "IF OBJECT_ID(N'tSQLt.UndoTestDoubles', N'P') IS NOT NULL "
    "EXEC tSQLt.UndoTestDoubles @Force = 1;"
)
RUN_ALL_SQL = "EXEC tSQLt.RunAll;"
RESULTS_SQL = (
    "SELECT Class, TestCase, Result, Msg, TestStartTime, TestEndTime "
    "FROM tSQLt.TestResult ORDER BY Id;"
)

# "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]" in front of each server message.
_DRIVER_PREFIX = re.compile(r"\[Microsoft\]\[[^\]]*\](?:\[SQL Server\])?")
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

# CREATE [OR ALTER] PROC[EDURE] schema.name, over the code view of a script.
_IDENT = r'(?:\[(?:[^\]]|\]\])*\]|"(?:[^"]|"")*"|(?:[^\W\d]|[@#])[\w@$#]*)'
_CREATE_PROC = re.compile(
    rf"\bCREATE\s+(?:OR\s+ALTER\s+)?PROC(?:EDURE)?\s+(?P<schema>{_IDENT})\s*\.\s*(?P<name>{_IDENT})",
    re.IGNORECASE,
)


class TsqltError(RuntimeError):
    """The tSQLt run could not be carried out (as opposed to tests that ran and failed)."""


class _Cursor(Protocol):
    def execute(self, sql: str) -> Any: ...
    def fetchone(self) -> Sequence[Any] | None: ...
    def fetchall(self) -> list[Sequence[Any]]: ...
    def nextset(self) -> bool | None: ...
    def close(self) -> None: ...


class _Connection(Protocol):
    def cursor(self) -> _Cursor: ...


@dataclass(frozen=True)
class TsqltTestResult:
    """One row of tSQLt.TestResult."""

    test_class: str
    test_case: str
    result: str                      # Success, Failure, Error, Skipped (anything else: error)
    message: str
    start_time: datetime | None = None
    end_time: datetime | None = None

    @property
    def outcome(self) -> str:
        """passed, failed, error or skipped. An unknown Result (e.g. tSQLt's 'A severe error
        happened during test execution. Test did not finish.') counts as an error."""
        return {"Success": "passed", "Failure": "failed", "Skipped": "skipped"}.get(self.result, "error")

    @property
    def duration_seconds(self) -> float:
        if self.start_time is None or self.end_time is None:
            return 0.0
        return max((self.end_time - self.start_time).total_seconds(), 0.0)

    @property
    def full_name(self) -> str:
        return f"[{self.test_class}].[{self.test_case}]"


@dataclass(frozen=True)
class TsqltResult:
    """The outcome of one tSQLt run.

    ``not_run`` lists (schema, procedure) of tests defined in the test class scripts that
    tSQLt.RunAll did not run, typically because their schema was not created with
    ``EXEC tSQLt.NewTestClass``.
    ``run_all_error`` is the error tSQLt.RunAll ended with (expected when tests failed);
    ``output`` its PRINT/informational messages (tSQLt's result table and summary).
    """

    tests: tuple[TsqltTestResult, ...]
    not_run: tuple[tuple[str, str], ...] = ()
    run_all_error: str | None = None
    output: tuple[str, ...] = ()
    tsqlt_version: str | None = None

    def _count(self, outcome: str) -> int:
        return sum(1 for test in self.tests if test.outcome == outcome)

    @property
    def passed(self) -> int:
        return self._count("passed")

    @property
    def failed(self) -> int:
        return self._count("failed")

    @property
    def errors(self) -> int:
        return self._count("error")

    @property
    def skipped(self) -> int:
        return self._count("skipped")

    @property
    def unexplained_error(self) -> bool:
        """RunAll raised an error although no test failed or errored: something else broke."""
        return self.run_all_error is not None and self.failed == 0 and self.errors == 0

    @property
    def exit_code(self) -> int:
        """0 only if at least one test ran (not skipped), none failed or errored, every test
        defined in the scripts ran, and RunAll raised no error the results do not explain."""
        executed = len(self.tests) - self.skipped
        if self.failed or self.errors or executed == 0 or self.not_run or self.unexplained_error:
            return 1
        return 0

    def summary(self) -> str:
        text = (
            f"{len(self.tests)} tSQLt tests: {self.passed} passed, {self.failed} failed, "
            f"{self.errors} errors, {self.skipped} skipped"
        )
        if self.not_run:
            names = ", ".join(f"[{schema}].[{name}]" for schema, name in self.not_run)
            text += f"; {len(self.not_run)} defined but not run: {names}"
        if self.unexplained_error:
            text += f"; tSQLt.RunAll raised: {self.run_all_error}"
        return text


# --- counting tests in scripts (no server needed) -------------------------------------------

def _unquote(identifier: str) -> str:
    if identifier.startswith("["):
        return identifier[1:-1].replace("]]", "]")
    if identifier.startswith('"'):
        return identifier[1:-1].replace('""', '"')
    return identifier


def find_tsqlt_tests(test_class_scripts: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(schema, procedure) of every tSQLt test defined in the scripts, in order, without repeats.

    A test is a ``CREATE [OR ALTER] PROC[EDURE] schema.name`` whose name starts with "test" in
    any case (tSQLt runs procedures of a test class whose ``LOWER(name) LIKE 'test%'``).
    Definitions inside comments or string literals (dynamic SQL) do not count. Names are
    compared case-insensitively. Raises TsqltError for a script that cannot be scanned.
    """
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for script_name, text in test_class_scripts:
        try:
            code = mask_comments_and_strings(text)
        except GoSplitError as exc:
            raise TsqltError(f"{script_name}: {exc}") from exc
        for match in _CREATE_PROC.finditer(code):
            schema, name = _unquote(match.group("schema")), _unquote(match.group("name"))
            if name.lower().startswith("test"):
                found.setdefault((schema.casefold(), name.casefold()), (schema, name))
    return list(found.values())


def count_tsqlt_tests(test_class_scripts: Iterable[tuple[str, str]]) -> int:
    """How many tSQLt tests the rendered test class scripts define (see find_tsqlt_tests)."""
    return len(find_tsqlt_tests(test_class_scripts))


# --- talking to the server -------------------------------------------------------------------

def driver_error_class(connection: object) -> type[Exception]:
    """The driver's DB-API ``Error`` class: ``connection.Error`` (PEP 249 optional extension)
    or ``Error`` of the module the connection's class comes from (``pyodbc.Error``)."""
    candidates = (
        getattr(connection, "Error", None),
        getattr(sys.modules.get(type(connection).__module__), "Error", None),
    )
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, Exception):
            return candidate
    raise TypeError(f"cannot find the DB-API Error class for {type(connection).__qualname__}")


def _server_text(text: str) -> str:
    return _DRIVER_PREFIX.sub("", text).strip()


def server_message(exc: BaseException) -> str:
    """The server's message from a driver error; pyodbc's args are (sqlstate, message)."""
    args = getattr(exc, "args", ())
    if len(args) >= 2 and isinstance(args[1], str):
        return _server_text(args[1])
    return _server_text(str(exc))


def _messages(cursor: object) -> list[str]:
    """Informational messages (PRINT, RAISERROR severity <= 10) of the current result."""
    return [_server_text(str(item[1]) if isinstance(item, tuple) and len(item) > 1 else str(item))
            for item in (getattr(cursor, "messages", None) or [])]


class _Session:
    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.error_class = driver_error_class(connection)

    def _cursor(self) -> _Cursor:
        cursor = self.connection.cursor()
        if hasattr(cursor, "noscan"):
            cursor.noscan = True  # type: ignore[attr-defined]
        return cursor

    def execute(self, sql: str, output: list[str] | None = None) -> None:
        """Run one batch, reading every result so all its statements run and errors surface."""
        cursor = self._cursor()
        try:
            cursor.execute(sql)
            while True:
                if output is not None:
                    output.extend(_messages(cursor))
                if not cursor.nextset():
                    break
        finally:
            cursor.close()

    def query(self, sql: str) -> list[Sequence[Any]]:
        cursor = self._cursor()
        try:
            cursor.execute(sql)
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def run_script(self, script_name: str, batches: list[Batch], hint: str = "") -> None:
        for batch in batches:
            for _ in range(batch.repeat):
                try:
                    self.execute(batch.text)
                except self.error_class as exc:
                    raise TsqltError(
                        f"{script_name}: the batch starting at line {batch.line} failed: "
                        f"{server_message(exc)}{hint}"
                    ) from exc


def _single_row(session: _Session, sql: str, what: str) -> Sequence[Any]:
    try:
        rows = session.query(sql)
    except session.error_class as exc:
        raise TsqltError(f"cannot read {what}: {server_message(exc)}") from exc
    if not rows:
        raise TsqltError(f"cannot read {what}: the query returned no row")
    return rows[0]


def _check_can_host_tsqlt(session: _Session) -> None:
    edition, database = _single_row(session, EDITION_SQL, "the server edition")
    if edition is not None and int(edition) in NO_CLR_EDITIONS:
        raise TsqltError(
            f"tSQLt cannot run on {NO_CLR_EDITIONS[int(edition)]} "
            f"(SERVERPROPERTY('EngineEdition') = {int(edition)}): tSQLt needs SQLCLR, "
            "which this platform does not support. Run the tSQLt tests on SQL Server (for "
            "example the mcr.microsoft.com/mssql/server container) or Azure SQL Managed Instance."
        )
    if str(database or "").lower() in SYSTEM_DATABASES:
        raise TsqltError(
            f"the connection is on the system database '{database}': tSQLt must be "
            "installed in the database under test; put that database in the connection URL"
        )


@dataclass(frozen=True)
class _ClrSettings:
    enabled: bool
    strict_security: bool


def _clr_settings(session: _Session) -> _ClrSettings:
    enabled, strict = _single_row(session, CLR_SQL, "the server's CLR settings")
    return _ClrSettings(enabled=bool(enabled), strict_security=bool(strict))


def _check_clr_enabled(clr: _ClrSettings, prepared: bool) -> None:
    if clr.enabled:
        return
    if prepared:
        raise TsqltError(
            "'clr enabled' is still 0 after running PrepareServer.sql: it needs a sysadmin "
            "login to change the server configuration"
        )
    raise TsqltError(
        "CLR is disabled on this server ('clr enabled' = 0) and tSQLt needs it. As sysadmin, "
        "run tSQLt's PrepareServer.sql once per server (it enables CLR and installs the key "
        "that lets tSQLt load with 'clr strict security' on), or at least "
        "EXEC sp_configure 'clr enabled', 1; RECONFIGURE;"
    )


def _install_hint(clr: _ClrSettings) -> str:
    if not clr.strict_security:
        return ""
    return (
        ". Note: 'clr strict security' is 1 on this server (the default since SQL Server 2017); "
        "if the failure is about creating the tSQLtCLR assembly, run tSQLt's PrepareServer.sql "
        "once per server as sysadmin first"
    )


def _tsqlt_version(session: _Session) -> str | None:
    try:
        rows = session.query(VERSION_SQL)
    except session.error_class as exc:
        raise TsqltError(f"tSQLt.class.sql ran but tSQLt.Info() fails: {server_message(exc)}") from exc
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


def _run_all(session: _Session) -> tuple[list[str], str | None]:
    output: list[str] = []
    try:
        session.execute(RUN_ALL_SQL, output)
    except session.error_class as exc:  # expected when a test failed: read the results anyway
        return output, server_message(exc)
    return output, None


def _read_results(session: _Session, run_all_error: str | None) -> list[TsqltTestResult]:
    try:
        rows = session.query(RESULTS_SQL)
    except session.error_class as exc:
        context = f" (tSQLt.RunAll had failed with: {run_all_error})" if run_all_error else ""
        raise TsqltError(
            f"cannot read tSQLt.TestResult: {server_message(exc)}{context}. This runner needs a "
            "tSQLt release whose TestResult table has TestStartTime and TestEndTime."
        ) from exc
    return [
        TsqltTestResult(
            test_class=str(test_class), test_case=str(test_case),
            result=str(result) if result is not None else "",
            message=str(message) if message is not None else "",
            start_time=start, end_time=end,
        )
        for test_class, test_case, result, message, start, end in rows
    ]


def _split(script_name: str, text: str) -> list[Batch]:
    try:
        return split_batches(text)
    except GoSplitError as exc:
        raise TsqltError(f"{script_name}: {exc}") from exc


def run_tsqlt(
    connection: _Connection,
    tsqlt_install_script: str,
    test_class_scripts: list[tuple[str, str]],
    junit_path: Path | None,
    *,
    prepare_server_script: str | None = None,
) -> TsqltResult:
    """Install tSQLt, create the test classes, run them all and collect the results.

    ``test_class_scripts`` are (name, rendered text) pairs; the name is only used in messages.
    ``prepare_server_script`` is the text of tSQLt's PrepareServer.sql, run first when given.
    Raises TsqltError when the run cannot be carried out; failing tests are not an exception,
    see ``TsqltResult.exit_code``.
    """
    if getattr(connection, "autocommit", True) is not True:
        raise TsqltError(
            "the connection must have autocommit on: tSQLt manages its own transactions and "
            "cannot run inside the driver's implicit transaction"
        )
    prepare_batches = _split("PrepareServer.sql", prepare_server_script) if prepare_server_script else []
    install_batches = _split("tSQLt.class.sql", tsqlt_install_script)
    test_batches = [(name, _split(name, text)) for name, text in test_class_scripts]
    expected = find_tsqlt_tests(test_class_scripts)

    session = _Session(connection)
    _check_can_host_tsqlt(session)
    session.run_script("session settings", [Batch(SESSION_SQL, 1, 1)])
    if prepare_server_script:
        session.run_script("PrepareServer.sql", prepare_batches)
    clr = _clr_settings(session)
    _check_clr_enabled(clr, prepared=bool(prepare_server_script))

    session.run_script("tSQLt.UndoTestDoubles (test doubles a killed run left)", [Batch(UNDO_SQL, 1, 1)])
    session.run_script("tSQLt.class.sql", install_batches, hint=_install_hint(clr))
    version = _tsqlt_version(session)
    for name, batches in test_batches:
        session.run_script(name, batches)

    output, run_all_error = _run_all(session)
    tests = _read_results(session, run_all_error)
    ran = {(test.test_class.casefold(), test.test_case.casefold()) for test in tests}
    not_run = tuple(
        (schema, name) for schema, name in expected if (schema.casefold(), name.casefold()) not in ran
    )
    result = TsqltResult(
        tests=tuple(tests), not_run=not_run, run_all_error=run_all_error,
        output=tuple(output), tsqlt_version=version,
    )
    if junit_path is not None:
        write_junit(result, junit_path)
    return result


# --- JUnit XML -------------------------------------------------------------------------------

def _xml_text(text: str) -> str:
    """Text with the characters XML 1.0 cannot hold (most control characters) replaced."""
    return _XML_INVALID.sub("\ufffd", text)


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def _add_testcase(suite: ET.Element, test: TsqltTestResult) -> None:
    case = ET.SubElement(suite, "testcase", classname=_xml_text(test.test_class),
                         name=_xml_text(test.test_case), time=_seconds(test.duration_seconds))
    outcome = test.outcome
    if outcome == "passed":
        return
    message = test.message
    if outcome == "error" and test.result not in ("Error", "Not run"):
        message = f"tSQLt reported Result = {test.result!r}. {message}".strip()
    first_line = message.strip().splitlines()[0] if message.strip() else test.result
    tag, kind = {"failed": ("failure", "tSQLt.Fail"), "error": ("error", "SQL Error"),
                 "skipped": ("skipped", "tSQLt.Skip")}[outcome]
    element = ET.SubElement(case, tag, message=_xml_text(first_line))
    if tag != "skipped":
        element.set("type", kind)
    element.text = _xml_text(message)


def _set_counts(element: ET.Element, tests: Sequence[TsqltTestResult]) -> None:
    element.set("tests", str(len(tests)))
    element.set("failures", str(sum(t.outcome == "failed" for t in tests)))
    element.set("errors", str(sum(t.outcome == "error" for t in tests)))
    element.set("skipped", str(sum(t.outcome == "skipped" for t in tests)))
    element.set("time", _seconds(sum(t.duration_seconds for t in tests)))


def _suite_element(parent: ET.Element, name: str, tests: list[TsqltTestResult]) -> ET.Element:
    suite = ET.SubElement(parent, "testsuite", name=_xml_text(name))
    _set_counts(suite, tests)
    starts = [t.start_time for t in tests if t.start_time is not None]
    if starts:
        suite.set("timestamp", min(starts).isoformat(timespec="seconds"))
    for test in tests:
        _add_testcase(suite, test)
    return suite


def write_junit(result: TsqltResult, path: Path) -> None:
    """Write junit_element(result) to path."""
    root = junit_element(result)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def junit_element(result: TsqltResult) -> ET.Element:
    """JUnit XML: one <testsuite> per test class, <failure>/<error>/<skipped> per outcome.

    Tests defined in the scripts but not run by tSQLt.RunAll are reported as errors so the
    report explains a non-zero exit code.
    """
    root = ET.Element("testsuites", name="tSQLt")
    by_class: dict[str, list[TsqltTestResult]] = {}
    for test in result.tests:
        by_class.setdefault(test.test_class, []).append(test)
    for name, not_run in _not_run_by_class(result.not_run).items():
        by_class.setdefault(name, []).extend(not_run)
    for name, tests in by_class.items():
        _suite_element(root, name, tests)
    _set_counts(root, [t for tests in by_class.values() for t in tests])
    return root


def _not_run_by_class(not_run: Sequence[tuple[str, str]]) -> dict[str, list[TsqltTestResult]]:
    grouped: dict[str, list[TsqltTestResult]] = {}
    for schema, name in not_run:
        grouped.setdefault(schema, []).append(TsqltTestResult(
            test_class=schema, test_case=name, result="Not run",
            message=(
                "defined in the test scripts but not run by tSQLt.RunAll: is its schema "
                "created with EXEC tSQLt.NewTestClass?"
            ),
        ))
    return grouped
