"""The error numbers (SQL Server) and SQLSTATEs (PostgreSQL) the procedures raise, and the engines'
own errors a client retries.

One table, used by the templates (so the SQL raises exactly these) and by docs/errors.md and the
tests (so callers can rely on them). Numbers never change meaning once released.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueError:
    mssql: int        # THROW number, 50000 and up as SQL Server requires for user errors
    postgres: str     # SQLSTATE raised with RAISE EXCEPTION USING ERRCODE
    meaning: str


QUEUE_ERRORS: dict[str, QueueError] = {
    "invalid_argument": QueueError(51001, "TQ001", "an argument is missing, NULL where it must not be, or out of range"),
    "invalid_payload": QueueError(51002, "TQ002", "the payload is NULL or not valid for the queue's payload type"),
    "in_transaction": QueueError(51003, "TQ003", "process or wait (which commit between their steps) was called inside an open transaction"),
    "not_found": QueueError(51004, "TQ004", "no message with that id (dead-letter requeue/delete)"),
    "no_handler": QueueError(51005, "TQ005", "the in-database worker's handler procedure does not exist with the queue's parameters, "
                                              "the caller may not execute it, it can no longer be run, or the check could not "
                                              "run (SQL Server: 15517)"),
    "handler_failed": QueueError(51006, "TQ006", "the handler procedure raised an error (recorded with fail)"),
    "deploy_refused": QueueError(51007, "TQ007", "the hand-run deploy script refused: the deploy history is in another "
                                 "state than the script was made for, a table to be created again is not empty, or "
                                 "(PostgreSQL) the schema's roles serve another database"),
    "isolation_level": QueueError(51008, "TQ008", "dequeue, complete_batch, fail_batch or lease_status (in a queue with groups, any verb "
                                 "that joins or settles a group) was called in a transaction that is not READ "
                                 "COMMITTED (PostgreSQL)"),
}


# -- Engine errors a client answers by retrying --------------------------------------------------
# Not ours: the engines raise them. A worker (tablequeue.worker) reconnects after a DISCONNECT and
# runs the transaction again after a TRANSIENT error, on the same connection, spending no attempt.

# SQL Server: the connection or the database went away (a restart, a failover, Azure SQL moving the
# database: 40613 not currently available, 40197 service error, 40501 service busy, 4060 cannot open
# the database, 4221 login during a failover, 49918-49920 resource limits of a reconfiguration,
# 10928/10929 resource limits) or the network did (233, 64, 10053, 10054, 10060).
MSSQL_DISCONNECT_NUMBERS = frozenset({40613, 40197, 40501, 4060, 4221, 49918, 49919, 49920, 10928, 10929,
                                      233, 64, 10053, 10054, 10060})
# ODBC SQLSTATEs of a lost or refused connection (08S01: communication link failure).
ODBC_DISCONNECT_STATES = frozenset({"08S01", "08001", "08003", "08004", "08007"})
# SQL Server: deadlock victim, lock timeout, snapshot update conflict (DESIGN.md §4).
MSSQL_TRANSIENT_NUMBERS = frozenset({1205, 1222, 3960})
# PostgreSQL: admin shutdown (a restart, pg_terminate_backend), crash shutdown, the server starting
# up; and every connection exception (class 08).
POSTGRES_DISCONNECT_STATES = frozenset({"57P01", "57P02", "57P03"})
# PostgreSQL: deadlock, serialization failure, lock not available (lock_timeout).
POSTGRES_TRANSIENT_STATES = frozenset({"40P01", "40001", "55P03"})

DISCONNECT, TRANSIENT = "disconnect", "transient"

# pyodbc writes each diagnostic record as "[SQLSTATE] message (native error) (SQLFunction)" and joins
# the records with "; ". Only the number right before the function name is the engine's error
# number: a number in parentheses inside the message is data (a duplicate key value, an object id).
PYODBC_NATIVE_ERROR = re.compile(r"\((-?\d+)\) \(SQL\w+\)(?=;|$)")


def retry_kind(exc: BaseException) -> str | None:
    """DISCONNECT, TRANSIENT or None (not retryable) for an exception of psycopg or pyodbc, also
    one wrapped by a handler (its __cause__ or __context__ chain is followed)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = _retry_kind_of(current)
        if kind is not None:
            return kind
        current = current.__cause__ or current.__context__
    return None


def _retry_kind_of(exc: BaseException) -> str | None:
    module = type(exc).__module__.split(".")[0]
    if module == "psycopg":
        import psycopg

        state = getattr(exc, "sqlstate", None)
        if state in POSTGRES_TRANSIENT_STATES:
            return TRANSIENT
        if state in POSTGRES_DISCONNECT_STATES or (state or "").startswith("08"):
            return DISCONNECT
        # A connection that broke under a statement reports no SQLSTATE (no server answered it).
        if state is None and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return DISCONNECT
        return None
    if module == "pyodbc":
        state = str(exc.args[0]) if exc.args else ""
        numbers = {int(n) for text in exc.args[1:] for n in PYODBC_NATIVE_ERROR.findall(str(text).rstrip())}
        if numbers & MSSQL_TRANSIENT_NUMBERS:
            return TRANSIENT
        if state in ODBC_DISCONNECT_STATES or numbers & MSSQL_DISCONNECT_NUMBERS:
            return DISCONNECT
    return None
