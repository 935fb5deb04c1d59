"""The error numbers (SQL Server) and SQLSTATEs (PostgreSQL) the procedures raise.

One table, used by the templates (so the SQL raises exactly these) and by docs/errors.md and the
tests (so callers can rely on them). Numbers never change meaning once released.
"""
from __future__ import annotations

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
    "no_handler": QueueError(51005, "TQ005", "the queue has no handler procedure configured for the in-database worker"),
    "handler_failed": QueueError(51006, "TQ006", "the handler procedure raised an error (recorded with fail)"),
    "deploy_refused": QueueError(51007, "TQ007", "the hand-run deploy script refused: the deploy history is in another "
                                 "state than the script was made for, a table to be created again is not empty, or "
                                 "(PostgreSQL) the schema's roles serve another database"),
    "isolation_level": QueueError(51008, "TQ008", "dequeue, complete_batch or fail_batch was called in a transaction that is not READ COMMITTED (PostgreSQL)"),
}
