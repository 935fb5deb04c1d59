"""A fake pyodbc connection to SQL Server, for the tests of code that talks to SQL Server (no server here).

The fake records every statement sent and answers the tSQLt runner's own queries with canned rows;
``answers`` maps a text fragment to the result sets of any statement containing it. A response is a
list of result sets; each is a ResultSet (rows, messages) or an exception, raised when the caller
reaches it (on execute() for the first set, on nextset() for later ones), which is how pyodbc reports
an error raised after PRINT output.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tablequeue import tsqlt

T0 = datetime(2024, 5, 1, 12, 0, 0)
PREFIX = "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"


class FakeDbError(Exception):
    """Like pyodbc.Error: args are (sqlstate, message)."""


@dataclass
class ResultSet:
    rows: list[tuple] = field(default_factory=list)
    messages: list[tuple[str, str]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)   # named: a result set a procedure SELECTs


def db_error(message: str, sqlstate: str = "42000") -> FakeDbError:
    return FakeDbError(sqlstate, f"{PREFIX}{message} (50000) (SQLExecDirectW)")


def row(test_class, case, result, msg=None, ms=100):
    """A row of tSQLt.TestResult."""
    return (test_class, case, result, msg, T0, T0 + timedelta(milliseconds=ms))


class FakeCursor:
    def __init__(self, connection: FakeConnection) -> None:
        self.connection = connection
        self.noscan = False
        self._sets: list = []
        self._current = ResultSet()
        self.closed = False

    @property
    def messages(self) -> list[tuple[str, str]]:
        return self._current.messages

    @property
    def description(self) -> list[tuple] | None:
        """As pyodbc: None for a set without columns (a row count), else one tuple per column."""
        return [(name, None, None, None, None, None, True) for name in self._current.columns] or None

    def execute(self, sql: str, *params: Any) -> FakeCursor:
        if self.connection.require_noscan:
            assert self.noscan is True, "the runner must set noscan before executing script text"
        self.connection.executed.append(sql)
        self.connection.parameters.append(params)
        self._sets = list(self.connection.respond(sql))
        self._advance()
        return self

    def _advance(self) -> bool:
        if not self._sets:
            self._current = ResultSet()
            return False
        item = self._sets.pop(0)
        if isinstance(item, Exception):
            self._current = ResultSet()
            raise item
        self._current = item
        return True

    def nextset(self) -> bool | None:
        return True if self._advance() else None

    def fetchone(self):
        return self._current.rows[0] if self._current.rows else None

    def fetchall(self):
        return list(self._current.rows)

    def close(self) -> None:
        self.closed = True
        self.connection.closed_cursors += 1


class FakeConnection:
    """``executed`` and ``parameters`` may be lists shared by several connections, so a test sees the
    statements of all of them in the order they were sent. ``require_noscan`` (the tSQLt runner's
    tests) fails any statement sent without ``cursor.noscan`` set."""

    Error = FakeDbError  # PEP 249 optional extension; pyodbc is found through its module instead

    def __init__(self, *, edition=3, database="tablequeue", clr_enabled=1, clr_strict=1,
                 results=(), run_all=None, answers=None, version="1.0.8083.3529",
                 executed: list[str] | None = None, parameters: list[tuple] | None = None,
                 require_noscan: bool = True) -> None:
        self.autocommit = True
        self.executed: list[str] = executed if executed is not None else []
        self.parameters: list[tuple] = parameters if parameters is not None else []
        self.require_noscan = require_noscan
        self.closed_cursors = 0
        self.commits = 0
        self.closed = False
        self.edition, self.database = edition, database
        self.clr_enabled, self.clr_strict = clr_enabled, clr_strict
        self.results = list(results)
        self.run_all = run_all if run_all is not None else [ResultSet(messages=[("[01000] (0)", f"{PREFIX}ok")])]
        self.answers = answers or {}    # text fragment -> result sets/errors for that batch
        self.version = version

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def commit(self) -> None:
        self.commits += 1

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def respond(self, sql: str) -> list:
        for fragment, answer in self.answers.items():
            if fragment in sql:
                return list(answer)
        if sql == tsqlt.EDITION_SQL:
            return [ResultSet(rows=[(self.edition, self.database)])]
        if sql == tsqlt.CLR_SQL:
            return [ResultSet(rows=[(self.clr_enabled, self.clr_strict)])]
        if sql == tsqlt.VERSION_SQL:
            return [ResultSet(rows=[(self.version,)])]
        if sql == tsqlt.RUN_ALL_SQL:
            return list(self.run_all)
        if sql == tsqlt.RESULTS_SQL:
            return [ResultSet(rows=list(self.results))]
        if "sp_configure" in sql:  # PrepareServer.sql enables CLR
            self.clr_enabled = 1
        # a DDL batch: a rowcount "set" and a PRINT, like SQL Server with NOCOUNT OFF
        return [ResultSet(), ResultSet(messages=[("[01000] (0)", f"{PREFIX}done")])]

    def batches(self) -> list[str]:
        """What was executed other than the tSQLt runner's own queries."""
        own = {tsqlt.EDITION_SQL, tsqlt.SESSION_SQL, tsqlt.CLR_SQL, tsqlt.UNDO_SQL, tsqlt.VERSION_SQL,
               tsqlt.RUN_ALL_SQL, tsqlt.RESULTS_SQL}
        return [sql for sql in self.executed if sql not in own]
