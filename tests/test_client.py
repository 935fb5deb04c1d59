"""What the Python client sends to SQL Server, checked without a server.

pyodbc binds a table-valued parameter from a list: the type's name and its schema first, then the
rows. The items type lives in the catalog schema, so without them SQL Server answers error 2715
("cannot find data type"). And pyodbc takes a single list argument of execute() as the whole
parameter list: a table-valued parameter passed alone would be split into one parameter per row (the
fake cursor below does what pyodbc does). The SQL Server half of the conformance suite runs the real
round trip when TABLEQUEUE_MSSQL_URL is set.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tablequeue.catalog import parse_catalog
from tablequeue.client import TVP_COLUMNS, QueueClient


class RecordingCursor:
    def __init__(self, calls: list[tuple[str, tuple]]) -> None:
        self.calls = calls
        self.description = None

    def execute(self, sql: str, *params: Any) -> None:
        # As pyodbc: a single list or tuple argument is the whole parameter list.
        if len(params) == 1 and isinstance(params[0], (list, tuple)):
            params = tuple(params[0])
        self.calls.append((sql, params))
        self.description = [("ordinal",), ("id",), ("duplicate",)]

    def nextset(self) -> bool:
        return False

    def fetchall(self) -> list[tuple]:
        return []

    def close(self) -> None:
        pass


class RecordingConnection:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def cursor(self) -> RecordingCursor:
        return RecordingCursor(self.calls)


def client_for(kind: str, **options: Any) -> tuple[QueueClient, RecordingConnection]:
    catalog = parse_catalog({"schema": "jobs_schema", "queues": [
        {"name": "jobs", "kind": kind, "payload": "json", "options": options}]})
    conn = RecordingConnection()
    return QueueClient.for_catalog(conn, "mssql", catalog, "jobs"), conn


def test_enqueue_batch_names_the_table_type_and_its_schema_before_the_rows() -> None:
    client, conn = client_for("work", dedupe=True)
    client.enqueue_batch([{"payload": {"n": 1}, "dedupe_key": "a"}, {"payload": {"n": 2}, "dedupe_key": "b"}])

    [(sql, params)] = conn.calls
    assert sql.endswith("EXEC [jobs_schema].[jobs_enqueue_batch] @items = ?;")
    [table_value] = params
    assert table_value[:2] == ["jobs_items", "jobs_schema"]
    rows = table_value[2:]
    assert all(len(row) == len(TVP_COLUMNS["work"]) for row in rows)
    assert sorted(row[0] for row in rows) == [1, 2]


def test_enqueue_batch_sends_every_item_with_its_ordinal_and_nulls_where_an_item_has_no_value() -> None:
    client, conn = client_for("pending", dedupe=True)
    due = datetime(2030, 1, 1, tzinfo=timezone.utc)
    client.enqueue_batch([{"payload": {"n": 1}}, {"payload": {"n": 2}, "due_at": due, "dedupe_key": "k"}])

    [(_, (table_value,))] = conn.calls
    columns = TVP_COLUMNS["pending"]
    rows = [dict(zip(columns, row)) for row in table_value[2:]]
    assert rows == [{"ordinal": 1, "payload": '{"n": 1}', "due_at": None, "dedupe_key": None},
                    {"ordinal": 2, "payload": '{"n": 2}', "due_at": due.replace(tzinfo=None), "dedupe_key": "k"}]


def test_every_verb_passes_its_arguments_as_one_parameter_list() -> None:
    client, conn = client_for("work")
    client.dequeue(batch_size=5, worker="w")
    [(sql, params)] = conn.calls
    assert sql.endswith("@batch_size = ?, @worker = ?;") and params == (5, "w")
