"""The worker runtime, `tablequeue worker` and tablequeue.worker.Worker, against PostgreSQL.

What a caller observes: which messages the handler ran, what the queue, its history and its dead
letters hold afterwards, what the worker logs and counts. Signals go to real `tablequeue worker`
processes; the other tests run a Worker on a thread of the test. The server restart runs on a
cluster of its own (tablequeue.embedded), stopped and started under two worker processes.
"""
from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pyodbc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tablequeue.catalog import parse_catalog
from tablequeue.client import QueueClient
from tablequeue.deploy import deploy
from tablequeue.embedded import start_embedded
from tablequeue.engines import connect, dialect_for
from tablequeue.errors import DISCONNECT, TRANSIENT, retry_kind
from tablequeue.render import render_catalog
from tablequeue.worker import DISCONNECT_RERUNS, Message, Worker, WorkerError, retry_after_seconds

REPO = Path(__file__).resolve().parents[1]
QUEUE = "jobs"


@pytest.fixture
def engine_url(pg_url: str) -> tuple[str, str]:
    """PostgreSQL only: these tests read the queue's tables to see what the worker left behind."""
    return "postgres", pg_url


def work_queue(**options: Any) -> dict:
    return {"name": QUEUE, "kind": "work", "payload": "json", "options": {"history": True, **options}}


def write_catalog(folder: Path, schema: str, *queues: dict) -> Path:
    path = folder / "queues.yml"
    path.write_text(yaml.safe_dump({"schema": schema, "queues": list(queues)}), encoding="utf-8")
    return path


def worker_process(url: str, catalog: Path, log: Path, *args: str, seconds: float = 0.0,
                   handler: str = "worker_handlers:record", extra_env: dict[str, str] | None = None,
                   output: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tools"), str(REPO), str(REPO / "tests")]),
           "TQ_TEST_LOG": str(log), "TQ_TEST_SECONDS": str(seconds), **(extra_env or {})}
    stream = open(output or log.with_suffix(".out"), "w", encoding="utf-8")
    return subprocess.Popen([sys.executable, "-m", "tablequeue", "worker", "--url", url, "--catalog", str(catalog),
                             "--queue", QUEUE, "--handler", handler, *args],
                            env=env, stdout=stream, stderr=subprocess.STDOUT)


def handled(log: Path, event: str) -> list[int]:
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith(event + " ")]


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """The worker on a thread; stopped (gracefully) and joined when the block ends."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)

    thread = threading.Thread(target=run, name="test-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive(), "the worker did not stop within 60 s"
    assert not failure, failure


def rows(conn: Any, sql: str, *params: Any) -> list[tuple]:
    return conn.execute(sql, params).fetchall()


def history(conn: Any, schema: str) -> list[tuple[int, int, str]]:
    return rows(conn, f'SELECT id, attempts, worker FROM "{schema}"."{QUEUE}_history" ORDER BY id')


def queued(conn: Any, schema: str) -> list[tuple]:
    """id, attempts, leased_by, lease_token, last_error, leased now (a live lease)."""
    return rows(conn, f'SELECT id, attempts, leased_by, lease_token, last_error, '
                      f'leased_by IS NOT NULL AND visible_at > clock_timestamp() '
                      f'FROM "{schema}"."{QUEUE}" ORDER BY id')


def test_sigterm_during_a_batch_loses_doubles_and_spends_nothing(deploy_queues, tmp_path: Path) -> None:
    queue = work_queue(max_attempts=3, lease_seconds=60)
    deployed = deploy_queues(queue)
    schema = deployed.catalog.schema
    conn = deployed.connect()
    ids = [row["id"] for row in deployed.client(QUEUE, conn).enqueue_batch({"payload": {"n": n}} for n in range(40))]
    log = tmp_path / "handled.log"
    process = worker_process(deployed.url, write_catalog(tmp_path, schema, queue), log, "--batch-size", "20",
                             "--worker-name", "term", "--grace-seconds", "20", seconds=0.3)
    wait_until(lambda: handled(log, "started"), "the worker runs a handler")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, log.with_suffix(".out").read_text()

    started, finished = handled(log, "started"), handled(log, "finished")
    # The running handler finished within the grace period; no new one started after the signal.
    assert started == finished and 1 <= len(finished) < 20
    assert history(conn, schema) == [(i, 1, "term/1") for i in sorted(finished)]
    left = queued(conn, schema)
    assert [row[0] for row in left] == sorted(set(ids) - set(finished))
    # Released (the rest of the batch) or never leased: no attempt spent, no lease held.
    assert {(row[1], row[2], row[5]) for row in left} == {(0, None, False)}
    output = log.with_suffix(".out").read_text()
    assert output.count("released unhandled") == 20 - len(finished)

    drained: list[int] = []
    worker = Worker(deployed.url, deployed.catalog, QUEUE, lambda m: drained.append(m.id), worker_name="drain",
                    batch_size=20)
    with running(worker):
        wait_until(lambda: len(history(conn, schema)) == 40, "the second worker completes the rest")
    assert sorted(drained + finished) == sorted(ids)
    assert [(i, attempts) for i, attempts, _ in history(conn, schema)] == [(i, 1) for i in sorted(ids)]


def test_a_handler_outlasting_the_grace_period_has_its_messages_released(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=60))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    ids = [row["id"] for row in deployed.client(QUEUE, conn).enqueue_batch({"payload": {"n": n}} for n in range(3))]
    started, finish = threading.Event(), threading.Event()

    def stuck(message: Message) -> None:
        started.set()
        finish.wait(30)

    worker = Worker(deployed.url, deployed.catalog, QUEUE, stuck, worker_name="stuck", batch_size=3,
                    grace_seconds=0.5)
    with running(worker):
        assert started.wait(30)
    # run() returned with the handler still running: the messages it never started are back in the
    # queue with their attempts given back; the one it hangs on is failed, its attempt spent, so that
    # a message that hangs the handler every time reaches max_attempts instead of cycling for ever.
    assert (worker.counts["released"], worker.counts["retrying"]) == (2, 1)
    left = {row[0]: (row[1], row[2], row[4]) for row in queued(conn, schema)}
    assert left == {ids[0]: (1, None, "the worker stopped: the handler was still running when the grace period "
                                      "ended"),
                    ids[1]: (0, None, None), ids[2]: (0, None, None)}
    finish.set()
    # The handler's late return acknowledges nothing: its slot's thread ends without a call.
    wait_until(lambda: all(thread.name != "stuck/1" for thread in threading.enumerate()), "the slot's thread ends")
    assert history(conn, schema) == [] and worker.counts["completed"] == 0


def test_sigkill_leaves_leases_that_expire_and_another_worker_completes(deploy_queues, tmp_path: Path) -> None:
    queue = work_queue(max_attempts=3, lease_seconds=2)
    deployed = deploy_queues(queue)
    schema = deployed.catalog.schema
    conn = deployed.connect()
    ids = [row["id"] for row in deployed.client(QUEUE, conn).enqueue_batch({"payload": {"n": n}} for n in range(10))]
    log = tmp_path / "handled.log"
    process = worker_process(deployed.url, write_catalog(tmp_path, schema, queue), log, "--batch-size", "5",
                             "--worker-name", "doomed", seconds=0.5)
    wait_until(lambda: len(handled(log, "started")) >= 2, "the worker runs its second message")
    process.kill()
    process.wait(timeout=30)
    held = [row[0] for row in queued(conn, schema) if row[5] and row[2] == "doomed/1"]
    assert held, "the killed worker held no live lease: the test proves nothing"

    worker = Worker(deployed.url, deployed.catalog, QUEUE, lambda m: None, worker_name="rescuer")
    with running(worker):
        wait_until(lambda: len(history(conn, schema)) == 10, "the second worker completes every message")
    done = history(conn, schema)
    assert [row[0] for row in done] == sorted(ids) and {row[2] for row in done} == {"rescuer/1"}
    # The killed worker's expired lease counted as an attempt; the others were leased once.
    assert {row[0]: row[1] for row in done} == {i: 2 if i in held else 1 for i in ids}
    assert worker.counts["completed"] == 10 and deployed.client(QUEUE, conn).stats()["dead"] == 0


def test_a_raising_handler_is_retried_with_growing_delays_and_ends_dead(deploy_queues, caplog) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    client = deployed.client(QUEUE, conn)
    message_id = client.enqueue({"to": "a@example.com"})["id"]
    calls: list[tuple[float, int]] = []

    def refuse(message: Message) -> None:
        calls.append((time.monotonic(), message.attempts))
        raise RuntimeError(f"cannot send to {message.payload['to']}")

    caplog.set_level("INFO", logger="tablequeue.worker")
    worker = Worker(deployed.url, deployed.catalog, QUEUE, refuse, worker_name="retry", rng=random.Random(3))
    with running(worker):
        wait_until(lambda: client.stats()["dead"] == 1, "the message ends in the dead letters")
    assert [attempt for _, attempt in calls] == [1, 2, 3]
    delays = [int(d) for d in re.findall(r"visible again in (\d+)s", caplog.text)]
    assert len(delays) == 2 and 1 <= delays[0] < delays[1], caplog.text
    # Each retry came no earlier than the delay the worker asked fail for.
    for (first, _), (second, _), delay in zip(calls, calls[1:], delays):
        assert second - first >= delay - 0.05
    dead = rows(conn, f'SELECT id, attempts, last_error, last_worker FROM "{schema}"."{QUEUE}_dead"')
    assert dead == [(message_id, 3, "RuntimeError: cannot send to a@example.com", "retry/1")]
    assert (worker.counts["retrying"], worker.counts["dead"]) == (2, 1)


def test_retry_delays_grow_with_every_attempt_up_to_the_cap() -> None:
    for seed in range(50):
        rng = random.Random(seed)
        delays = [retry_after_seconds(attempt, rng) for attempt in range(1, 11)]
        assert delays == sorted(set(delays)), delays
        assert all(2 ** (n - 1) <= d < 1.5 * 2 ** (n - 1) for n, d in enumerate(delays, start=1))
        assert all(900 <= retry_after_seconds(attempt, rng) <= 1350 for attempt in (11, 30))


def test_transactional_a_failing_write_rolls_back_with_the_ack(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    conn.execute(f'CREATE TABLE "{schema}".writes (id bigint NOT NULL)')
    message_id = deployed.client(QUEUE, conn).enqueue({"n": 1})["id"]

    def write_twice(message: Message) -> None:
        message.connection.execute(f'INSERT INTO "{schema}".writes (id) VALUES (%s)', (message.id,))
        message.connection.execute(f'INSERT INTO "{schema}".writes (id) VALUES (NULL)')

    worker = Worker(deployed.url, deployed.catalog, QUEUE, write_twice, worker_name="tx", transactional=True)
    with running(worker):
        wait_until(lambda: worker.counts["retrying"] == 1, "the failed attempt is recorded")
        worker.stop()
    assert rows(conn, f'SELECT id FROM "{schema}".writes') == []
    assert history(conn, schema) == []
    [(queued_id, attempts, leased_by, _, last_error, _)] = queued(conn, schema)
    assert (queued_id, attempts, leased_by) == (message_id, 1, None)
    assert last_error.startswith("NotNullViolation: null value in column \"id\"")


def test_transactional_a_transient_error_keeps_the_lease_and_runs_again(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    conn.execute(f'CREATE TABLE "{schema}".writes (id bigint NOT NULL)')
    conn.execute(f'CREATE TABLE "{schema}".account (balance integer NOT NULL)')
    conn.execute(f'INSERT INTO "{schema}".account VALUES (0)')
    message_id = deployed.client(QUEUE, conn).enqueue({"n": 1})["id"]
    second_call, proceed = threading.Event(), threading.Event()
    tokens: list[Any] = []

    def book(message: Message) -> None:
        tokens.append(message.lease_token)
        if len(tokens) == 2:
            second_call.set()
            assert proceed.wait(30)
        message.connection.execute(f'INSERT INTO "{schema}".writes (id) VALUES (%s)', (message.id,))
        message.connection.execute("SET LOCAL lock_timeout = '100ms'")
        message.connection.execute(f'UPDATE "{schema}".account SET balance = balance + 1')

    worker = Worker(deployed.url, deployed.catalog, QUEUE, book, worker_name="tx", transactional=True)
    # Another session holds the account row: the handler's update times out (55P03, transient).
    with deployed.connect(autocommit=False) as blocker:
        blocker.execute(f'SELECT * FROM "{schema}".account FOR UPDATE')
        with running(worker):
            assert second_call.wait(30), "the handler was not run again after the lock timeout"
            # Between the tries: the first try's write rolled back, the message still leased to
            # the slot under the same lease (token), its attempt not spent.
            assert rows(conn, f'SELECT id FROM "{schema}".writes') == []
            [(_, attempts, leased_by, token, last_error, leased)] = queued(conn, schema)
            assert (attempts, leased_by, token, last_error, leased) == (1, "tx/1", tokens[0], None, True)
            blocker.rollback()
            proceed.set()
            wait_until(lambda: worker.counts["completed"] == 1, "the second try completes")
    assert tokens[0] == tokens[1]
    assert rows(conn, f'SELECT id FROM "{schema}".writes') == [(message_id,)]
    assert history(conn, schema) == [(message_id, 1, "tx/1")]


def test_transactional_a_lost_lease_rolls_the_handlers_writes_back(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    conn.execute(f'CREATE TABLE "{schema}".writes (id bigint NOT NULL)')
    message_id = deployed.client(QUEUE, conn).enqueue({"n": 1})["id"]
    runs: list[int] = []

    def write_after_losing_the_lease(message: Message) -> None:
        runs.append(message.attempts)
        message.connection.execute(f'INSERT INTO "{schema}".writes (id) VALUES (%s)', (message.id,))
        if len(runs) == 1:
            # Someone else (an operator, an expired lease taken over) ends this lease meanwhile.
            with deployed.connect() as other:
                assert deployed.client(QUEUE, other).release(message.id, "tx/1", message.lease_token)

    worker = Worker(deployed.url, deployed.catalog, QUEUE, write_after_losing_the_lease, worker_name="tx",
                    transactional=True)
    with running(worker):
        wait_until(lambda: worker.counts["completed"] == 1, "the message is completed on its next lease")
    assert worker.counts["lost"] == 1 and runs == [1, 1]
    assert rows(conn, f'SELECT id FROM "{schema}".writes') == [(message_id,)]
    assert history(conn, schema) == [(message_id, 1, "tx/1")]


def test_leases_are_extended_while_a_handler_runs(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=3))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    message_id = deployed.client(QUEUE, conn).enqueue({"n": 1})["id"]
    started, release = threading.Event(), threading.Event()

    def slow(message: Message) -> None:
        started.set()
        assert release.wait(30)

    worker = Worker(deployed.url, deployed.catalog, QUEUE, slow, worker_name="slow")
    with running(worker):
        assert started.wait(30)
        began = time.monotonic()
        wait_until(lambda: time.monotonic() - began > 4.5, "past the lease of 3 s")
        # Another consumer finds nothing to claim: the lease is still the slow worker's.
        assert deployed.client(QUEUE, conn).dequeue(worker="thief") == []
        release.set()
        wait_until(lambda: worker.counts["completed"] == 1, "the slow handler's message is completed")
    assert history(conn, schema) == [(message_id, 1, "slow/1")]


def test_worker_metrics_count_outcomes_and_time_the_handler(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30))
    conn = deployed.connect()
    deployed.client(QUEUE, conn).enqueue_batch({"payload": {"n": n}} for n in range(3))

    def fail_one(message: Message) -> None:
        if message.payload["n"] == 1:
            raise ValueError("n is 1")

    worker = Worker(deployed.url, deployed.catalog, QUEUE, fail_one, worker_name="metered", metrics_port=0,
                    retry_base_seconds=60)
    with running(worker):
        wait_until(lambda: sum(worker.counts.values()) == 3, "three outcomes")
        port = worker.metrics_server.server_port
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("tablequeue_worker_messages_total", (("outcome", "completed"),))] == 2
    assert samples[("tablequeue_worker_messages_total", (("outcome", "retrying"),))] == 1
    assert samples[("tablequeue_worker_messages_total", (("outcome", "dead"),))] == 0
    assert samples[("tablequeue_worker_handler_duration_seconds_count", ())] == 3


def test_transactional_a_handler_error_from_another_connection_spends_the_attempt(deploy_queues) -> None:
    """An OperationalError of the handler's own connection elsewhere (a service that is down) looks
    like a lost connection, but the slot's connection is fine: it is a failed attempt, not a rerun."""
    deployed = deploy_queues(work_queue(max_attempts=1, lease_seconds=30))
    conn = deployed.connect()
    client = deployed.client(QUEUE, conn)
    client.enqueue({"n": 1})
    attempts: list[int] = []

    def call_a_service_that_is_down(message: Message) -> None:
        attempts.append(message.attempts)
        psycopg.connect("postgresql://nobody@127.0.0.1:1/none", connect_timeout=1)

    worker = Worker(deployed.url, deployed.catalog, QUEUE, call_a_service_that_is_down, worker_name="tx",
                    transactional=True)
    with running(worker):
        wait_until(lambda: client.stats()["dead"] == 1, "the only attempt fails", timeout=20)
    assert attempts == [1]
    assert worker.counts["dead"] == 1


def test_transactional_a_handler_that_breaks_the_slots_connection_every_time_ends_dead(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=1, lease_seconds=30))
    conn = deployed.connect()
    client = deployed.client(QUEUE, conn)
    client.enqueue({"n": 1})
    runs: list[int] = []

    def break_the_connection(message: Message) -> None:
        runs.append(message.attempts)
        message.connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    worker = Worker(deployed.url, deployed.catalog, QUEUE, break_the_connection, worker_name="tx", transactional=True)
    with running(worker):
        wait_until(lambda: client.stats()["dead"] == 1, "the attempt is failed after the reruns", timeout=30)
    # The first run and DISCONNECT_RERUNS reruns under the same attempt, then the attempt fails.
    assert runs == [1] * (DISCONNECT_RERUNS + 1)
    [(attempts, last_error)] = rows(conn, f'SELECT attempts, last_error FROM "{deployed.catalog.schema}"."{QUEUE}_dead"')
    assert attempts == 1 and f"the connection was lost in {DISCONNECT_RERUNS + 1} runs" in last_error


def test_a_deadlock_on_an_acknowledgement_is_retried(deploy_queues, monkeypatch) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    ids = [row["id"] for row in deployed.client(QUEUE, conn).enqueue_batch({"payload": {"n": n}} for n in range(5))]
    complete_batch, calls = QueueClient.complete_batch, []

    def deadlocked_once(self: QueueClient, *args: Any, **kwargs: Any) -> list[dict]:
        calls.append(1)
        if len(calls) == 1:
            raise psycopg.errors.DeadlockDetected("deadlock detected")
        return complete_batch(self, *args, **kwargs)

    monkeypatch.setattr(QueueClient, "complete_batch", deadlocked_once)
    handled_ids: list[int] = []
    worker = Worker(deployed.url, deployed.catalog, QUEUE, lambda m: handled_ids.append(m.id), worker_name="ack",
                    batch_size=5)
    with running(worker):
        wait_until(lambda: worker.counts["completed"] == 5, "the batch is completed after the deadlock")
    assert sorted(handled_ids) == sorted(ids) and len(calls) >= 2
    assert [(i, attempts) for i, attempts, _ in history(conn, schema)] == [(i, 1) for i in sorted(ids)]


def test_a_slot_stopping_on_an_error_hands_back_what_it_holds(deploy_queues, monkeypatch) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=60))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    ids = [row["id"] for row in deployed.client(QUEUE, conn).enqueue_batch({"payload": {"n": n}} for n in range(3))]

    def refused(self: QueueClient, *args: Any, **kwargs: Any) -> list[dict]:
        raise psycopg.errors.InsufficientPrivilege("permission denied for function jobs_complete_batch")

    monkeypatch.setattr(QueueClient, "complete_batch", refused)
    worker = Worker(deployed.url, deployed.catalog, QUEUE, lambda m: None, worker_name="doomed", batch_size=3)
    with pytest.raises(WorkerError, match="InsufficientPrivilege: permission denied"):
        worker.run()
    # The handled messages were completed on a connection of their own, not left leased to be
    # handled again once their leases expire.
    assert [(i, attempts, name) for i, attempts, name in history(conn, schema)] == [(i, 1, "doomed/1") for i in ids]
    assert queued(conn, schema) == [] and worker.counts["completed"] == 3


def test_a_notify_queue_keeps_no_notifications_while_busy(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30, notify=True))
    producer = deployed.client(QUEUE, deployed.connect())
    consumer_conn = deployed.connect()
    consumer = deployed.client(QUEUE, consumer_conn)
    assert consumer.dequeue(worker="busy", wait=0.05) == []      # LISTENing from now on
    for n in range(200):                                          # one NOTIFY per committed enqueue
        producer.enqueue({"n": n})
    assert len(consumer.dequeue(worker="busy", wait=1)) == 1
    # psycopg keeps notifications that arrive outside notifies() in an unbounded list: a consumer that
    # never waits (its queue never empties) must not keep one per enqueue for as long as it runs.
    assert len(consumer_conn._notifies_backlog) == 0


def test_a_handler_past_its_timeout_loses_its_lease_and_spends_the_attempt(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=2))
    conn = deployed.connect()
    client = deployed.client(QUEUE, conn)
    message_id = client.enqueue({"n": 1})["id"]
    started, finish = threading.Event(), threading.Event()

    def hang(message: Message) -> None:
        started.set()
        finish.wait(30)

    worker = Worker(deployed.url, deployed.catalog, QUEUE, hang, worker_name="hung", handler_timeout_seconds=0.5,
                    metrics_port=0)
    with running(worker):
        assert started.wait(30)
        taken: list[dict] = []
        wait_until(lambda: taken.extend(client.dequeue(worker="other")) or taken, "the hung handler's lease expires",
                   timeout=20)
        finish.set()
        wait_until(lambda: worker.counts["lost"] == 1, "the late handler's ack is refused")
        text = urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_server.server_port}/metrics",
                                      timeout=10).read().decode()
    [message] = taken
    assert (message["id"], message["attempts"]) == (message_id, 2)
    assert "tablequeue_worker_handler_timeouts_total 1.0" in text
    assert worker.counts["completed"] == 0


def test_a_message_whose_lease_was_lost_is_not_handled(deploy_queues, caplog) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=3))
    schema = deployed.catalog.schema
    conn = deployed.connect()
    client = deployed.client(QUEUE, conn)
    first, *others = [row["id"] for row in client.enqueue_batch({"payload": {"n": n}} for n in range(3))]
    caplog.set_level("INFO", logger="tablequeue.worker")
    ran: list[int] = []

    def lose_the_others(message: Message) -> None:
        ran.append(message.id)
        if len(ran) == 1:
            # An operator (or an expired lease taken over) hands the rest of the batch to another consumer.
            for message_id, token in rows(conn, f'SELECT id, lease_token FROM "{schema}"."{QUEUE}" WHERE id <> %s',
                                          message.id):
                assert client.release(message_id, "batch/1", token)
            assert len(client.dequeue(batch_size=2, worker="thief")) == 2
            wait_until(lambda: caplog.text.count("the lease could not be extended") == 2,
                       "the keeper finds both leases lost", timeout=20)

    worker = Worker(deployed.url, deployed.catalog, QUEUE, lose_the_others, worker_name="batch", batch_size=3)
    with running(worker):
        wait_until(lambda: worker.counts["completed"] + worker.counts["lost"] == 3, "the batch is finished")
    assert ran == [first]
    assert (worker.counts["completed"], worker.counts["lost"]) == (1, 2)
    assert [(row[0], row[2]) for row in queued(conn, schema)] == [(i, "thief") for i in others]


def test_two_workers_with_one_name_are_refused(deploy_queues) -> None:
    deployed = deploy_queues(work_queue(max_attempts=3, lease_seconds=30))
    first = Worker(deployed.url, deployed.catalog, QUEUE, lambda m: None, worker_name="twin")
    with running(first):
        wait_until(lambda: first.slots[0].client is not None, "the first worker's slot is connected")
        second = Worker(deployed.url, deployed.catalog, QUEUE, lambda m: None, worker_name="twin")
        outcome: list[BaseException] = []
        thread = threading.Thread(target=lambda: outcome.append(pytest.raises(WorkerError, second.run).value))
        thread.start()
        thread.join(30)
        if thread.is_alive():
            second.stop()
            thread.join(30)
            raise AssertionError("the second worker of the same name ran")
    [error] = outcome
    assert "worker name twin/1 is in use by another process: give each process a --worker-name of its own" \
        in str(error)


def test_a_metrics_port_in_use_is_told_plainly(deploy_queues) -> None:
    deployed = deploy_queues(work_queue())
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = Worker(deployed.url, deployed.catalog, QUEUE, lambda m: None, worker_name="port", metrics_port=port)
        with pytest.raises(WorkerError, match=rf"--metrics-port {port}: cannot serve the worker's metrics: "
                                              r"Address already in use"):
            worker.run()


def test_the_database_restarting_under_two_workers_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """10,000 messages, two worker processes of two slots each: A transactional (its handler inserts
    the id in the transaction that completes it), B acknowledging in batches. The cluster is stopped
    (fast shutdown: 57P01 to every session) and started again while they work."""
    messages = 10_000
    server = start_embedded()
    try:
        schema = "restart"
        queue = work_queue(max_attempts=5, lease_seconds=30)
        catalog = parse_catalog({"schema": schema, "queues": [queue]})
        conn = connect(server.url)
        deploy(conn, dialect_for("postgres"), schema, [u for f in render_catalog(catalog, "postgres") for u in f.units])
        conn.execute(f'CREATE TABLE "{schema}".done (id bigint NOT NULL)')
        client = QueueClient.for_catalog(conn, "postgres", catalog, QUEUE)
        for start in range(0, messages, 1000):
            client.enqueue_batch({"payload": {"n": n}} for n in range(start, start + 1000))
        catalog_path = write_catalog(tmp_path, schema, queue)
        common = ("--concurrency", "2", "--batch-size", "50", "--grace-seconds", "30")
        workers = [
            worker_process(server.url, catalog_path, tmp_path / "a.log", *common, "--worker-name", "A",
                           "--transactional", handler="worker_handlers:insert_done",
                           extra_env={"TQ_TEST_DONE_TABLE": f"{schema}.done"}),
            worker_process(server.url, catalog_path, tmp_path / "b.log", *common, "--worker-name", "B"),
        ]
        conn.close()

        def completed() -> int:
            with connect(server.url) as probe:
                return probe.execute(f'SELECT count(*) FROM "{schema}"."{QUEUE}_history"').fetchone()[0]

        wait_until(lambda: completed() >= messages // 5, "a fifth of the messages completed", timeout=120)
        server.restart(())
        wait_until(lambda: completed() >= messages, "every message completed after the restart", timeout=240)
        for process in workers:
            process.send_signal(signal.SIGTERM)
        outputs = []
        for process, name in zip(workers, "ab"):
            code = process.wait(timeout=60)
            outputs.append((tmp_path / f"{name}.out").read_text())
            assert code == 0, outputs[-1][-3000:]
        assert all("connection lost" in output for output in outputs), "a worker did not see the restart"
        counts = [stopped_counts(output) for output in outputs]
        started = [handled(tmp_path / f"{name}.log", "started") for name in "ab"]

        with connect(server.url) as conn:
            done = history(conn, schema)
            assert len(done) == messages and len({row[0] for row in done}) == messages
            assert {row[2].split("/")[0] for row in done} == {"A", "B"}
            written = [row[0] for row in rows(conn, f'SELECT id FROM "{schema}".done')]
            # A's writes: exactly the messages A completed, each once.
            assert sorted(written) == sorted(row[0] for row in done if row[2].startswith("A/"))
            stats = QueueClient.for_catalog(conn, "postgres", catalog, QUEUE).stats()
            assert (stats["ready"], stats["delayed"], stats["in_flight"], stats["dead"]) == (0, 0, 0, 0)
        # Each completion counted once, by the process that made it; nothing released or dead.
        assert [c["completed"] for c in counts] == [sum(row[2].startswith(n + "/") for row in done) for n in "AB"]
        assert all(c["retrying"] == c["dead"] == c["released"] == 0 for c in counts), counts
        # No message handled by both workers: a lease outlived the restart.
        assert not set(started[0]) & set(started[1])
        # B acknowledges in batches with the lease token: after reconnecting it acknowledges what it
        # had handled, so it runs no handler twice and loses no acknowledgement.
        assert len(started[1]) == len(set(started[1])) and counts[1]["lost"] == 0, counts
        # A runs a handler again only when the restart cut its transaction (at most once per slot);
        # a rerun whose first commit had gone through finds its lease gone and counts as lost.
        reruns = len(started[0]) - len(set(started[0]))
        assert counts[0]["lost"] <= reruns <= 2, (reruns, counts)
    finally:
        server.stop()


def stopped_counts(output: str) -> dict[str, int]:
    """The outcome counts of a worker's last log line, "worker NAME stopped: 5 completed, ..."."""
    [line] = re.findall(r"worker \S+ stopped: (.*)", output)
    return {outcome: int(count) for count, outcome in re.findall(r"(\d+) (\w+)", line)}


def test_worker_refuses_a_queue_that_is_not_a_work_queue_and_a_handler_it_cannot_import(tmp_path: Path) -> None:
    catalog = write_catalog(tmp_path, "queue", {"name": "events", "kind": "heap", "payload": "json"}, work_queue())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tools"), str(REPO)])}
    base = [sys.executable, "-m", "tablequeue", "worker", "--url", "postgresql://nobody@127.0.0.1:1/none",
            "--catalog", str(catalog)]
    heap = subprocess.run([*base, "--queue", "events", "--handler", "json:dumps"], env=env, capture_output=True,
                          text=True)
    assert heap.returncode == 2
    assert heap.stderr.strip() == (f"tablequeue worker: {catalog}: queue 'events': field 'kind': the worker runs work "
                                   "queues, this one is heap")
    missing = subprocess.run([*base, "--queue", QUEUE, "--handler", "json:no_such_function"], env=env,
                             capture_output=True, text=True)
    assert missing.returncode == 2
    assert missing.stderr.strip() == ("tablequeue worker: --handler 'json:no_such_function': module 'json' has no "
                                      "attribute 'no_such_function'")
    with pytest.raises(WorkerError, match=r"queue 'jobs': --batch-size must be 1\.\.1000 \(the contract's batch cap\), got 1001"):
        Worker("postgresql://nobody@127.0.0.1:1/none", parse_catalog({"schema": "queue", "queues": [work_queue()]}),
               QUEUE, print, batch_size=1001)


@pytest.mark.parametrize(("error", "kind"), [
    (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), DISCONNECT),
    (psycopg.errors.CannotConnectNow("the database system is starting up"), DISCONNECT),
    (psycopg.OperationalError("server closed the connection unexpectedly"), DISCONNECT),
    (psycopg.errors.DeadlockDetected("deadlock detected"), TRANSIENT),
    (psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"), TRANSIENT),
    (psycopg.errors.UniqueViolation("duplicate key"), None),
    # pyodbc's text: "[state] message (native error) (SQLFunction)" per record, records joined by "; ".
    (pyodbc.Error("08S01", "[08S01] [Microsoft][ODBC Driver 18 for SQL Server]TCP Provider: An existing connection "
                           "was forcibly closed by the remote host. (10054) (SQLExecDirectW)"), DISCONNECT),
    (pyodbc.Error("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Database 'q' on server 's' "
                           "is not currently available. (40613) (SQLExecDirectW)"), DISCONNECT),
    (pyodbc.Error("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]The service has encountered "
                           "an error processing your request. (40197) (SQLExecDirectW)"), DISCONNECT),
    (pyodbc.Error("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Cannot open database \"q\" "
                           "requested by the login. (4060) (SQLDriverConnect); [42000] [Microsoft][ODBC Driver 18 for "
                           "SQL Server][SQL Server]Login failed for user 'w'. (18456) (SQLDriverConnect)"), DISCONNECT),
    (pyodbc.Error("40001", "[40001] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Transaction (Process ID 52) "
                           "was deadlocked on lock resources with another process. (1205) (SQLExecDirectW)"), TRANSIENT),
    (pyodbc.Error("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Invalid argument (51001) "
                           "(SQLExecDirectW)"), None),
    # Numbers in parentheses inside the message text are data, not error numbers.
    (pyodbc.IntegrityError("23000", "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of "
                                    "PRIMARY KEY constraint 'PK_t'. Cannot insert duplicate key in object 'dbo.t'. "
                                    "The duplicate key value is (64). (2627) (SQLExecDirectW)"), None),
    (pyodbc.IntegrityError("23000", "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of "
                                    "PRIMARY KEY constraint 'PK_t'. Cannot insert duplicate key in object 'dbo.t'. "
                                    "The duplicate key value is (1205). (2627) (SQLExecDirectW)"), None),
    (pyodbc.ProgrammingError("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]s.jobs_complete: "
                                      "id (4060) is not valid (51001) (SQLExecDirectW)"), None),
    (ValueError("no database involved"), None),
])
def test_retry_kind_sorts_engine_errors(error: BaseException, kind: str | None) -> None:
    assert retry_kind(error) == kind


def test_retry_kind_finds_an_engine_error_a_handler_wrapped() -> None:
    try:
        try:
            raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")
        except psycopg.Error as exc:
            raise RuntimeError("could not save the order") from exc
    except RuntimeError as wrapped:
        assert retry_kind(wrapped) == DISCONNECT


def test_the_errors_page_lists_every_engine_error_a_client_retries() -> None:
    from tablequeue.errors import (
        MSSQL_DISCONNECT_NUMBERS, MSSQL_TRANSIENT_NUMBERS, ODBC_DISCONNECT_STATES, POSTGRES_DISCONNECT_STATES,
        POSTGRES_TRANSIENT_STATES,
    )

    page = (REPO / "docs" / "errors.md").read_text().split("## Engine errors a client retries", 1)[1]
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    _, disconnect, transient = rows
    for value in (*MSSQL_DISCONNECT_NUMBERS, *ODBC_DISCONNECT_STATES, *POSTGRES_DISCONNECT_STATES):
        assert re.search(rf"\b{value}\b", disconnect), value
    for value in (*MSSQL_TRANSIENT_NUMBERS, *POSTGRES_TRANSIENT_STATES):
        assert re.search(rf"\b{value}\b", transient), value
