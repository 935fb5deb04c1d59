"""Call a queue's procedures (SQL Server) or functions (PostgreSQL) through the public contract.

This is what the tests, the demo and the pipelines use; it is also a reference for callers in other
languages: every method is one procedure call with named parameters. The client never opens or ends
a transaction: with autocommit off, the caller commits (and a rolled-back dequeue puts messages back).
"""
from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from .catalog import Catalog, Queue

PG_PAYLOAD = {"binary": "bytea", "text": "text", "json": "jsonb"}
# The longest single wait the contract allows (wait_ms); dequeue(wait=...) waits in steps of it.
MAX_WAIT_MS = 20_000
# While LISTENing, how often dequeue looks anyway: a retry coming due, a lease expiring or a delayed
# message becoming due sends no notification.
LISTEN_RECHECK_SECONDS = 1.0
# The wait verb's step: how long a consumer pauses when wait said ready but dequeue found nothing.
WAIT_STEP_SECONDS = 0.05
# Column order of the SQL Server table type S.Q_items, per kind (it must match the templates).
TVP_COLUMNS = {
    "heap": ("ordinal", "payload", "dedupe_key"),
    "fifo": ("ordinal", "payload", "dedupe_key"),
    "lifo": ("ordinal", "payload", "dedupe_key"),
    "pending": ("ordinal", "payload", "due_at", "dedupe_key"),
    "work": ("ordinal", "payload", "due_at", "dedupe_key", "priority", "id", "enqueued_at"),
}
# A queue with option groups has one more column, last: the item's group_key.
TVP_GROUP_COLUMNS = ("group_key",)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: pass an aware datetime (UTC is assumed nowhere)")
    return value.astimezone(timezone.utc)


class QueueClient:
    def __init__(self, conn: Any, dialect: str, schema: str, queue: Queue, pooled: bool = False):
        """pooled: the connection goes through a transaction-pooling proxy (PgBouncer): the client
        never LISTENs (a notification would reach whichever client holds the server connection
        next); open such psycopg connections with prepare_threshold=None."""
        self.conn, self.dialect, self.schema, self.queue, self.pooled = conn, dialect, schema, queue, pooled
        self._listening = False

    @classmethod
    def for_catalog(cls, conn: Any, dialect: str, catalog: Catalog, name: str, pooled: bool = False) -> "QueueClient":
        return cls(conn, dialect, catalog.schema, catalog.queue(name), pooled)

    # -- plumbing ---------------------------------------------------------------------------
    def _routine(self, verb: str) -> str:
        name = f"{self.queue.name}_{verb}"
        return f'"{self.schema}"."{name}"' if self.dialect == "postgres" else f"[{self.schema}].[{name}]"

    def _pg_cast(self, param: str, verb: str) -> str:
        payload = PG_PAYLOAD[self.queue.payload]
        return {"payload": payload, "payloads": f"{payload}[]", "due_at": "timestamptz",
                "due_ats": "timestamptz[]", "dedupe_keys": "text[]", "priorities": "integer[]",
                "group_key": "text", "group_keys": "text[]",
                # enqueue_batch's ids are client ids (uuid) whatever the queue; it refuses them without.
                "ids": "uuid[]" if verb == "enqueue_batch" else f"{self._pg_id_type()}[]", "enqueued_ats": "timestamptz[]",
                "older_than": "timestamptz", "max_rows": "integer", "id": self._pg_id_type(),
                "enqueued_at": "timestamptz", "lease_token": "uuid", "lease_tokens": "uuid[]"}.get(param, "")

    def _pg_id_type(self) -> str:
        return "uuid" if self.queue.options.get("client_ids") else "bigint"

    def _payload_value(self, payload: Any) -> Any:
        if self.queue.payload == "json" and not isinstance(payload, (str, type(None))):
            return json.dumps(payload)
        return payload

    def _time(self, value: datetime | None) -> datetime | None:
        """Aware UTC for PostgreSQL (timestamptz); naive UTC for SQL Server (datetime2)."""
        value = _utc(value)
        return value.replace(tzinfo=None) if value is not None and self.dialect == "mssql" else value

    def _id(self, value: Any, field: str = "id") -> Any:
        """A message id in the queue's type: uuid.UUID on a client-id queue, int otherwise; None stays
        None, so that the procedure's own check answers it. A value of the wrong type is refused here,
        naming the queue and the field, instead of failing to convert on the server (8169, 22P02) in
        the middle of the caller's transaction."""
        if value is None:
            return None
        client_ids = bool(self.queue.options.get("client_ids"))
        try:
            if client_ids:
                return value if isinstance(value, uuid.UUID) else uuid.UUID(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str):
                return int(value)
        except (TypeError, ValueError, AttributeError):
            pass
        wanted = "a UUID (the queue has client_ids)" if client_ids else "an integer"
        raise ValueError(f"queue {self.schema}.{self.queue.name}: {field} must be {wanted}, got {value!r}")

    def _token(self, value: Any, field: str = "lease_token") -> uuid.UUID | None:
        """A lease token as uuid.UUID (dequeue returns a str through pyodbc, a UUID through psycopg);
        None stays None (the check by worker name). A malformed one is refused here, naming the queue
        and the field, instead of failing to convert on the server inside the caller's transaction."""
        if value is None or isinstance(value, uuid.UUID):
            return value
        try:
            return uuid.UUID(str(value))
        except ValueError:
            raise ValueError(f"queue {self.schema}.{self.queue.name}: {field} must be a UUID, got {value!r}") from None

    def call(self, verb: str, params: Mapping[str, Any], required: tuple[str, ...] = ()) -> list[dict]:
        """Run S.Q_<verb> with named parameters; None values are left out (the parameter's
        default applies) except those named in required, which are passed as NULL."""
        given = {k: v for k, v in params.items() if v is not None or k in required}
        if self.dialect == "postgres":
            # Arrays go in binary (psycopg's C dumper): the text format escapes every element in
            # Python, about a third of a 1,000-row enqueue_batch's client time.
            args = ", ".join(f"{k} => %({k})" + ("b" if isinstance(v, list) else "s")
                             + (f"::{self._pg_cast(k, verb)}" if self._pg_cast(k, verb) else "")
                             for k, v in given.items())
            cursor = self.conn.execute(f"SELECT * FROM {self._routine(verb)}({args})", given)
            columns = [c.name for c in cursor.description or []]
            return [dict(zip(columns, row)) for row in cursor.fetchall()]
        cursor = self.conn.cursor()
        try:
            args = ", ".join(f"@{k} = ?" for k in given)
            # One sequence of parameters, always: pyodbc takes a single list argument for the whole
            # parameter list, so a table-valued parameter (itself a list) passed alone would be split.
            cursor.execute(f"SET NOCOUNT ON; EXEC {self._routine(verb)} {args};", tuple(given.values()))
            while cursor.description is None and cursor.nextset():
                pass
            if cursor.description is None:
                return []
            columns = [c[0] for c in cursor.description]
            return [dict(zip(columns, row)) for row in cursor.fetchall()]
        finally:
            cursor.close()

    # -- the contract -----------------------------------------------------------------------
    def enqueue(self, payload: Any, due_at: datetime | None = None, dedupe_key: str | None = None,
                priority: int | None = None, id: Any = None, enqueued_at: datetime | None = None,
                group_key: str | None = None) -> dict:
        """group_key: the message's group (option groups): messages of one group are handed out one
        at a time, in enqueue order."""
        params = {"payload": self._payload_value(payload), "due_at": self._time(due_at),
                  "dedupe_key": dedupe_key, "priority": priority, "id": id,
                  "enqueued_at": self._time(enqueued_at), "group_key": group_key}
        return self.call("enqueue", params, required=("payload",))[0]

    def enqueue_batch(self, items: Iterable[Mapping[str, Any]]) -> list[dict]:
        """items: mappings with payload and optionally due_at, dedupe_key, priority (and id,
        enqueued_at for client-supplied ids), group_key (option groups). Returns one row per item:
        ordinal, id, duplicate."""
        items = list(items)
        if self.dialect == "postgres":
            params: dict[str, Any] = {"payloads": [self._payload_value(i.get("payload")) for i in items]}
            for key, array in (("due_at", "due_ats"), ("dedupe_key", "dedupe_keys"),
                               ("priority", "priorities"), ("id", "ids"), ("enqueued_at", "enqueued_ats"),
                               ("group_key", "group_keys")):
                if any(i.get(key) is not None for i in items):
                    values = [i.get(key) for i in items]
                    if key in ("due_at", "enqueued_at"):
                        values = [self._time(v) for v in values]
                    params[array] = values
            return self.call("enqueue_batch", params)
        return self.call("enqueue_batch", {"items": self._table_value("items", self._item_rows(items))})

    def _item_rows(self, items: list[Mapping[str, Any]]) -> list[tuple]:
        columns = TVP_COLUMNS[self.queue.kind] + (TVP_GROUP_COLUMNS if self.queue.options.get("groups") else ())
        rows = []
        for ordinal, item in enumerate(items, start=1):
            row = []
            for column in columns:
                value = ordinal if column == "ordinal" else item.get(column)
                if column == "payload":
                    value = self._payload_value(value)
                elif column in ("due_at", "enqueued_at"):
                    value = self._time(value)
                row.append(value)
            rows.append(tuple(row))
        return rows

    def _table_value(self, type_suffix: str, rows: list[tuple]) -> list:
        """A table-valued parameter as pyodbc binds it: the type's name and schema first (the type
        lives in the catalog schema, not dbo: without them SQL Server answers 2715), then the rows.
        pyodbc 5 (pinned) reads every row to type a column, so a NULL in the first row binds; a column
        NULL in every row binds as a NULL varchar, which SQL Server converts to the column's type."""
        return [f"{self.queue.name}_{type_suffix}", self.schema, *rows]

    def dequeue(self, batch_size: int = 1, worker: str | None = None,
                lease_seconds: int | None = None, wait: float | None = None) -> list[dict]:
        """wait: seconds to wait for a message when none is ready (None: return at once). Waiting
        holds no transaction, so with wait the connection must be in autocommit mode (each dequeue
        then commits at once: a destructive kind's messages are consumed when it returns). Woken
        by NOTIFY where the queue has notify: true (and the client is not pooled), else by the
        wait verb."""
        params = {"batch_size": batch_size, "worker": worker, "lease_seconds": lease_seconds}
        if wait is None:
            return self.call("dequeue", params)
        if wait < 0:
            raise ValueError(f"queue '{self.queue.name}': field 'wait': seconds to wait must be >= 0, got {wait}")
        self._require_autocommit("dequeue(wait=...)")
        deadline = time.monotonic() + wait
        listen = self.dialect == "postgres" and self.queue.options.get("notify") and not self.pooled
        if listen:
            self._listen()
        woken = False
        while True:
            rows = self.call("dequeue", params)
            if listen and rows:
                self._drop_notifications()
            remaining = deadline - time.monotonic()
            if rows or remaining <= 0:
                return rows
            if listen:
                for _ in self.conn.notifies(timeout=min(remaining, LISTEN_RECHECK_SECONDS), stop_after=1):
                    pass
                continue
            if woken:
                # wait said ready, yet this dequeue found nothing (another consumer was faster, or
                # the ready message was a lease that expired for the last time and went to the dead
                # letters): one wait step's pause before waiting again keeps that from becoming a
                # busy loop. Only then: a pause after every wake would delay every message by it.
                time.sleep(WAIT_STEP_SECONDS)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return rows
            woken = self.wait(min(MAX_WAIT_MS, max(1, int(remaining * 1000))))

    def _require_autocommit(self, what: str) -> None:
        if not getattr(self.conn, "autocommit", True):
            raise ValueError(f"queue '{self.queue.name}': {what} holds no transaction while it waits: "
                             f"use a connection in autocommit mode")

    def _listen(self) -> None:
        if not self._listening:
            channel = f"{self.schema}.{self.queue.name}".replace('"', '""')
            self.conn.execute(f'LISTEN "{channel}"')
            self._listening = True

    def _drop_notifications(self) -> None:
        """Forget the notifications that came since the last wait: the dequeue that just found
        messages has seen theirs. psycopg keeps every notification received outside notifies() in an unbounded
        list, so a consumer that is never idle would keep one per enqueue for as long as it lives."""
        for _ in self.conn.notifies(timeout=0):
            pass

    def wait(self, wait_ms: int = MAX_WAIT_MS) -> bool:
        """S.Q_wait: True as soon as a message is ready to dequeue, False after wait_ms; claims
        nothing. PostgreSQL: a procedure that commits between its steps, so the connection must be
        in autocommit mode."""
        if self.dialect == "postgres":
            self._require_autocommit("wait")
            cursor = self.conn.execute(f"CALL {self._routine('wait')}(wait_ms => %(wait_ms)s, ready => NULL)",
                                       {"wait_ms": wait_ms})
            return bool(cursor.fetchone()[0])
        return bool(self.call("wait", {"wait_ms": wait_ms}, required=("wait_ms",))[0]["ready"])

    def complete(self, id: Any, worker: str, lease_token: Any = None) -> bool:
        return bool(self.call("complete", {"id": self._id(id), "worker": worker, "lease_token": self._token(lease_token)},
                              required=("id", "worker"))[0]["completed"])

    def fail(self, id: Any, worker: str, error: str, retry_after_seconds: int | None = None,
             lease_token: Any = None) -> str:
        return self.call("fail", {"id": self._id(id), "worker": worker, "error": error,
                                  "retry_after_seconds": retry_after_seconds, "lease_token": self._token(lease_token)},
                         required=("id", "worker"))[0]["outcome"]

    def extend_lease(self, id: Any, worker: str, lease_seconds: int | None = None, lease_token: Any = None) -> bool:
        return bool(self.call("extend_lease", {"id": self._id(id), "worker": worker, "lease_seconds": lease_seconds,
                                               "lease_token": self._token(lease_token)}, required=("id", "worker"))[0]["extended"])

    def release(self, id: Any, worker: str, lease_token: Any = None) -> bool:
        """Give a leased message back now, with its attempt (a graceful shutdown spends none)."""
        return bool(self.call("release", {"id": self._id(id), "worker": worker, "lease_token": self._token(lease_token)},
                              required=("id", "worker"))[0]["released"])

    def complete_batch(self, acks: Iterable[Mapping[str, Any]], worker: str) -> list[dict]:
        """acks: mappings with id and lease_token (dequeue's rows will do). One row per ack in the
        engine's id order: match rows to acks by id, never by position (SQL Server orders a
        uniqueidentifier by its last bytes first). Returns id, completed."""
        return self.call("complete_batch", {**self._acks(acks), "worker": worker}, required=("worker",))

    def fail_batch(self, acks: Iterable[Mapping[str, Any]], worker: str, error: str,
                   retry_after_seconds: int | None = None) -> list[dict]:
        """As complete_batch; one row per ack in id order: id, outcome (retrying, dead, lost)."""
        return self.call("fail_batch", {**self._acks(acks), "worker": worker, "error": error,
                                        "retry_after_seconds": retry_after_seconds}, required=("worker",))

    def lease_status(self, leases: Iterable[Mapping[str, Any]]) -> list[dict]:
        """leases: mappings with id and lease_token (dequeue's rows will do), at most 1,000. What
        became of each, after waiting for a transaction still holding its message: held, expired
        (ran out, its token still on the message: a complete already waiting may still land), lost
        (released, failed or leased again: never completes), dead or gone (completed or purged). One
        row per lease in the engine's id order (match by id): id, status. Changes nothing. It waits
        as long as the session lets it: set a lock timeout (PostgreSQL: and a statement_timeout,
        which bounds the whole call; lock_timeout bounds each row's wait)."""
        return self.call("lease_status", self._acks(leases))

    def _acks(self, acks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        pairs = [(self._id(a["id"], "acks.id"), self._token(a.get("lease_token"), "acks.lease_token")) for a in acks]
        if self.dialect == "postgres":
            return {"ids": [i for i, _ in pairs], "lease_tokens": [t for _, t in pairs]}
        return {"acks": self._table_value("acks", pairs)}

    def complete_next(self, id: Any, worker: str, lease_token: Any = None, batch_size: int = 1,
                      lease_seconds: int | None = None) -> tuple[bool, list[dict]]:
        """complete, then dequeue, in one call and one commit: (previous_completed, the dequeued
        rows, without previous_completed; [] when nothing was ready)."""
        rows = self.call("complete_next", {"id": self._id(id), "worker": worker, "lease_token": self._token(lease_token),
                                           "batch_size": batch_size, "lease_seconds": lease_seconds},
                         required=("id", "worker"))
        previous = bool(rows[0]["previous_completed"])
        return previous, [{k: v for k, v in r.items() if k != "previous_completed"} for r in rows if r["id"] is not None]

    def stats(self) -> dict:
        return self.call("stats", {})[0]

    def purge(self, older_than: datetime | None = None, max_rows: int | None = None) -> int:
        """Remove queued messages (older than older_than, when given); at most max_rows of them per
        call, oldest first: loop until a call purges fewer, committing in between."""
        return int(self.call("purge", {"older_than": self._time(older_than), "max_rows": max_rows})[0]["purged"])

    # -- work kind: dead letters, history, the in-database worker ---------------------------
    def dead_list(self, after_id: Any = None, limit: int = 100) -> list[dict]:
        """One page of the dead-letter table in id order; pass the last id as after_id for the next.
        (The parameter is page_size in SQL: `limit` is reserved in PostgreSQL.)"""
        return self.call("dead_list", {"after_id": self._id(after_id, "after_id"), "page_size": limit})

    def dead_requeue(self, id: Any) -> bool:
        """Back to the queue under the same id, visible now, attempts reset (not_found if absent)."""
        return bool(self.call("dead_requeue", {"id": self._id(id)}, required=("id",))[0]["requeued"])

    def dead_delete(self, id: Any) -> bool:
        return bool(self.call("dead_delete", {"id": self._id(id)}, required=("id",))[0]["deleted"])

    def history_purge(self, older_than: datetime | None = None, max_rows: int | None = None) -> int:
        """Delete history finished before older_than (default: history_retention_days ago), at most
        max_rows of it per call, oldest first."""
        return int(self.call("history_purge", {"older_than": self._time(older_than),
                                               "max_rows": max_rows})[0]["purged"])

    def process(self, time_budget_seconds: int | None = None) -> dict:
        """Run the in-database worker until the queue has nothing ready or the budget ends; it
        commits once per message, so the connection must be in autocommit mode (no open
        transaction). Returns processed, completed, failed."""
        if self.dialect == "postgres":
            params = {} if time_budget_seconds is None else {"time_budget_seconds": time_budget_seconds}
            args = ", ".join(f"{k} => %({k})s" for k in params)
            cursor = self.conn.execute(f"CALL {self._routine('process')}({args})", params)
            columns = [c.name for c in cursor.description or []]
            row = dict(zip(columns, cursor.fetchone()))
            return {k: row[k] for k in ("processed", "completed", "failed")}
        return self.call("process", {"time_budget_seconds": time_budget_seconds})[0]
