"""What the Python client sends to SQL Server, checked without a server.

pyodbc binds a table-valued parameter from a list: the type's name and its schema first, then the
rows. The items type lives in the catalog schema, so without them SQL Server answers error 2715
("cannot find data type"); and pyodbc releases before 5.x took each column's SQL type from the first
row, so a NULL there could not be bound. The SQL Server half of the conformance suite runs the real
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


def test_enqueue_batch_puts_the_row_with_the_fewest_nulls_first_and_keeps_every_ordinal() -> None:
    client, conn = client_for("pending", dedupe=True)
    due = datetime(2030, 1, 1, tzinfo=timezone.utc)
    items = [{"payload": {"n": 1}}, {"payload": {"n": 2}, "due_at": due}, {"payload": {"n": 3}, "due_at": due,
                                                                           "dedupe_key": "k"}]
    client.enqueue_batch(items)

    [(_, (table_value,))] = conn.calls
    rows = table_value[2:]
    columns = TVP_COLUMNS["pending"]
    first = dict(zip(columns, rows[0]))
    assert first["ordinal"] == 3 and first["dedupe_key"] == "k" and first["due_at"] == due.replace(tzinfo=None)
    by_ordinal = {row[0]: dict(zip(columns, row)) for row in rows}
    assert set(by_ordinal) == {1, 2, 3}
    assert by_ordinal[1]["due_at"] is None and by_ordinal[1]["payload"] == '{"n": 1}'
