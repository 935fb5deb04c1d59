"""What the Python client sends to SQL Server, checked without a server.

pyodbc binds a table-valued parameter from a list: the type's name and its schema first, then the
rows. The items type lives in the catalog schema, so without them SQL Server answers error 2715
("cannot find data type"). And pyodbc takes a single list argument of execute() as the whole
parameter list: a table-valued parameter passed alone would be split into one parameter per row (the
fake cursor below does what pyodbc does). The SQL Server half of the conformance suite runs the real
round trip when TABLEQUEUE_MSSQL_URL is set.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from fake_mssql import FakeConnection, FakeDbError, ResultSet, db_error
from tablequeue.catalog import parse_catalog
from tablequeue.client import TVP_COLUMNS, WAIT_STEP_SECONDS, QueueClient


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



ANSWERS = {"complete": ("completed", False), "fail": ("outcome", "lost"), "extend_lease": ("extended", False),
           "dead_requeue": ("requeued", True), "dead_delete": ("deleted", True), "dead_list": ("id", 1)}


def fake_client(**options: Any) -> tuple[QueueClient, FakeConnection]:
    """A client of a work queue on the fake SQL Server, each verb answering one row."""
    catalog = parse_catalog({"schema": "jobs_schema", "queues": [
        {"name": "jobs", "kind": "work", "payload": "json", "options": options}]})
    conn = FakeConnection(require_noscan=False, answers={
        f"[jobs_{verb}]": [ResultSet(rows=[(value,)], columns=[column])] for verb, (column, value) in ANSWERS.items()})
    return QueueClient.for_catalog(conn, "mssql", catalog, "jobs"), conn


# A None id or worker reaches the procedure as NULL, where its argument check answers (51001, or
# completed = 0 for an id nothing holds): left out of the EXEC, the parameter (which has no default)
# would fail the caller's batch with error 201 instead.
NULL_ARGUMENTS = [
    ("complete", lambda c: c.complete(7, None), "@id = ?, @worker = ?", (7, None)),
    ("fail", lambda c: c.fail(None, "w", "boom"), "@id = ?, @worker = ?, @error = ?", (None, "w", "boom")),
    ("extend_lease", lambda c: c.extend_lease(7, None), "@id = ?, @worker = ?", (7, None)),
    ("dead_requeue", lambda c: c.dead_requeue(None), "@id = ?", (None,)),
    ("dead_delete", lambda c: c.dead_delete(None), "@id = ?", (None,)),
]


@pytest.mark.parametrize("verb, act, arguments, values", NULL_ARGUMENTS, ids=[a[0] for a in NULL_ARGUMENTS])
def test_a_none_id_or_worker_is_sent_as_null(verb: str, act, arguments: str, values: tuple) -> None:
    client, conn = fake_client()
    act(client)
    assert conn.executed == [f"SET NOCOUNT ON; EXEC [jobs_schema].[jobs_{verb}] {arguments};"]
    assert conn.parameters == [(values,)]


def test_the_servers_refusal_of_a_null_worker_reaches_the_caller() -> None:
    client, conn = fake_client()
    conn.answers["[jobs_complete]"] = [db_error("jobs_schema.jobs_complete: worker must be a name of 1 to 200 "
                                                "characters.")]
    with pytest.raises(FakeDbError, match="worker must be a name"):
        client.complete("12", None)
    assert conn.parameters == [((12, None),)]   # the id as the queue's type: bigint


def test_ids_are_converted_to_the_queues_type() -> None:
    given = "6F1C1F5E-8A43-4F7E-9D3C-2B1A0C9E8D7F"
    client, conn = fake_client(client_ids=True)
    assert client.complete(given, "w") is False
    assert client.dead_delete(uuid.UUID(given)) is True
    assert client.dead_list(after_id=given) == [{"id": 1}]
    assert [params[0][0] for params in conn.parameters] == [uuid.UUID(given)] * 3
    client, conn = fake_client()
    assert client.dead_requeue("42") is True and client.dead_requeue(43) is True
    assert conn.parameters == [((42,),), ((43,),)]


@pytest.mark.parametrize("options, value, wanted", [
    ({}, "12a", "an integer"), ({}, 1.5, "an integer"), ({}, True, "an integer"),
    ({}, uuid.UUID(int=1), "an integer"),
    ({"client_ids": True}, "not-a-guid", "a UUID (the queue has client_ids)"),
    ({"client_ids": True}, 12, "a UUID (the queue has client_ids)")])
def test_an_id_of_the_wrong_type_is_refused_naming_the_queue_and_the_field(options, value, wanted) -> None:
    client, conn = fake_client(**options)
    with pytest.raises(ValueError) as refused:
        client.extend_lease(value, "w")
    assert str(refused.value) == f"queue jobs_schema.jobs: id must be {wanted}, got {value!r}"
    with pytest.raises(ValueError, match=r"queue jobs_schema\.jobs: after_id must be "):
        client.dead_list(after_id=value)
    assert conn.executed == []   # nothing was sent


@pytest.mark.parametrize("dialect", ["mssql", "postgres"])
def test_a_malformed_lease_token_is_refused_before_anything_is_sent(dialect) -> None:
    queue = parse_catalog({"schema": "s", "queues": [{"name": "jobs", "kind": "work"}]}).queue("jobs")
    client = QueueClient(None, dialect, "s", queue)          # no connection: nothing may be sent
    for call in (lambda: client.complete(1, "w", lease_token="not-a-token"),
                 lambda: client.release(1, "w", lease_token="not-a-token"),
                 lambda: client.complete_batch([{"id": 1, "lease_token": "not-a-token"}], "w")):
        with pytest.raises(ValueError, match=r"queue s\.jobs: (acks\.)?lease_token must be a UUID"):
            call()


class ScriptedWaits(QueueClient):
    """A client whose server answers from a script: each dequeue the next list of rows, each wait
    the next ready flag. Records what dequeue(wait=...) does, pauses included."""

    def __init__(self, dequeues: list[list[dict]], waits: list[bool]) -> None:
        queue = parse_catalog({"schema": "s", "queues": [{"name": "jobs", "kind": "work"}]}).queue("jobs")
        super().__init__(None, "mssql", "s", queue)
        self.dequeues, self.waits, self.events = dequeues, waits, []

    def call(self, verb: str, params: dict, required: tuple = ()) -> list[dict]:
        assert verb == "dequeue", verb
        self.events.append("dequeue")
        return self.dequeues.pop(0)

    def wait(self, wait_ms: int = 0) -> bool:
        self.events.append("wait")
        return self.waits.pop(0)


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("tablequeue.client.time.sleep", slept.append)
    return slept


def test_dequeue_with_wait_dequeues_at_once_when_wait_says_ready(pauses) -> None:
    # A pause between a wake and its dequeue delays every message woken by the wait verb.
    client = ScriptedWaits(dequeues=[[], [{"id": 1}]], waits=[True])
    assert client.dequeue(worker="w", wait=30) == [{"id": 1}]
    assert client.events == ["dequeue", "wait", "dequeue"] and pauses == []


def test_dequeue_with_wait_pauses_a_step_only_after_a_wake_that_found_nothing(pauses) -> None:
    # Ready, then nothing to dequeue (another consumer was faster): without the pause a message
    # wait keeps seeing and dequeue cannot take would become a busy loop.
    client = ScriptedWaits(dequeues=[[], [], [], [{"id": 2}]], waits=[True, False, True])
    assert client.dequeue(worker="w", wait=30) == [{"id": 2}]
    assert client.events == ["dequeue", "wait", "dequeue", "wait", "dequeue", "wait", "dequeue"]
    assert pauses == [WAIT_STEP_SECONDS]
