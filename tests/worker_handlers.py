"""Handlers that tests run in `tablequeue worker` processes (--handler worker_handlers:NAME).

The command line passes a handler only the message, so these take their settings from the
environment: TQ_TEST_LOG (a file: one line "started <id>" before the work, "finished <id>" after),
TQ_TEST_SECONDS (how long the work takes), TQ_TEST_DONE_TABLE (schema.table the transactional
handler inserts the message id into; it logs "started <id>" too, so a run whose transaction rolled
back shows).
"""
from __future__ import annotations

import os
import time

from tablequeue.worker import Message


def _log(line: str) -> None:
    path = os.environ.get("TQ_TEST_LOG")
    if path:
        # One write of a whole line to a file opened for appending: lines of concurrent slots and
        # processes do not interleave.
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


def record(message: Message) -> None:
    _log(f"started {message.id}")
    time.sleep(float(os.environ.get("TQ_TEST_SECONDS", "0")))
    _log(f"finished {message.id}")


def insert_done(message: Message) -> None:
    """Transactional mode: the id goes into TQ_TEST_DONE_TABLE in the transaction that completes it."""
    assert message.connection is not None, "insert_done runs in transactional mode only"
    _log(f"started {message.id}")
    schema, table = os.environ["TQ_TEST_DONE_TABLE"].split(".")
    message.connection.execute(f'INSERT INTO "{schema}"."{table}" (id) VALUES (%s)', (message.id,))
