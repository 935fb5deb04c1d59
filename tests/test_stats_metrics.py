"""`tablequeue stats` and `tablequeue metrics` report what each queue's own stats verb says.

A scripted load leaves every count non-zero somewhere (ready, delayed, in flight, dead); the command
line's numbers must equal the stats verb's, read just before and just after (ages lie between the
two readings). The metrics endpoint is read over HTTP from a `tablequeue metrics` process.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tablequeue.catalog import load_catalog, parse_catalog
from tablequeue.deploy import deploy
from tablequeue.engines import connect, dialect_for
from tablequeue.render import render_catalog
from tablequeue.cli import main
from tablequeue.demo import show_stats
from tablequeue import metrics
from tablequeue.metrics import QueueStatsCollector, ScrapeError

REPO = Path(__file__).resolve().parents[1]
QUEUES = (
    {"name": "events", "kind": "heap", "payload": "json"},
    {"name": "reminders", "kind": "pending", "payload": "json"},
    {"name": "jobs", "kind": "work", "payload": "json", "options": {"max_attempts": 1, "lease_seconds": 600}},
)
COUNTS = ("ready", "delayed", "in_flight", "dead")
EXPECTED = {"events": (3, 0, 0, 0), "reminders": (2, 3, 0, 0), "jobs": (2, 1, 2, 1)}


def scripted_load(deployed: Any, conn: Any) -> None:
    now = datetime.now(timezone.utc)
    deployed.client("events", conn).enqueue_batch({"payload": {"n": n}} for n in range(3))
    deployed.client("reminders", conn).enqueue_batch(
        [{"payload": {"n": n}, "due_at": now - timedelta(minutes=1)} for n in range(2)]
        + [{"payload": {"n": n}, "due_at": now + timedelta(hours=1)} for n in range(3)])
    jobs = deployed.client("jobs", conn)
    jobs.enqueue_batch({"payload": {"n": n}} for n in range(5))
    jobs.enqueue({"n": "later"}, due_at=now + timedelta(hours=1))
    assert len(jobs.dequeue(batch_size=2, worker="busy")) == 2
    [doomed] = jobs.dequeue(worker="clumsy")
    assert jobs.fail(doomed["id"], "clumsy", "bad input", lease_token=doomed["lease_token"]) == "dead"


def stats_of(deployed: Any, conn: Any) -> dict[str, dict]:
    return {q["name"]: deployed.client(q["name"], conn).stats() for q in QUEUES}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def tablequeue(capsys: Any, *args: str) -> Result:
    """The command line, in this process (what it prints is captured)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return Result(code, out, err)


def write_catalog(folder: Path, schema: str, queues: tuple[dict, ...] = QUEUES) -> Path:
    path = folder / "queues.yml"
    path.write_text(yaml.safe_dump({"schema": schema, "queues": list(queues)}), encoding="utf-8")
    return path


def assert_reports(reported: dict[str, dict], before: dict[str, dict], after: dict[str, dict],
                   kinds: dict[str, str]) -> None:
    assert set(reported) == set(EXPECTED)
    for name, row in reported.items():
        assert tuple(row[c] for c in COUNTS) == EXPECTED[name]
        assert tuple(before[name][c] for c in COUNTS) == tuple(after[name][c] for c in COUNTS) == EXPECTED[name]
        assert row["kind"] == kinds[name]
        low, high = before[name]["oldest_ready_age_seconds"], after[name]["oldest_ready_age_seconds"]
        assert low <= row["oldest_ready_age_seconds"] <= high, (name, low, row, high)


def test_stats_equals_each_queues_stats_verb(deploy_queues, tmp_path: Path, capsys) -> None:
    deployed = deploy_queues(*QUEUES)
    schema = deployed.catalog.schema
    conn = deployed.connect()
    scripted_load(deployed, conn)
    catalog = write_catalog(tmp_path, schema)

    before = stats_of(deployed, conn)
    from_catalog = tablequeue(capsys, "stats", "--url", deployed.url, "--catalog", str(catalog), "--json")
    discovered = tablequeue(capsys, "stats", "--url", deployed.url, "--json")
    table = tablequeue(capsys, "stats", "--url", deployed.url, "--catalog", str(catalog))
    after = stats_of(deployed, conn)

    assert from_catalog.returncode == 0, from_catalog.stderr
    document = json.loads(from_catalog.stdout)
    datetime.fromisoformat(document["at"])
    assert [(row["schema"], row["queue"]) for row in document["queues"]] == [(schema, q["name"]) for q in QUEUES]
    assert_reports({row["queue"]: row for row in document["queues"]}, before, after,
                   {"events": "heap", "reminders": "pending", "jobs": "work"})
    # Without the catalog: every queue of the database (other tests' schemas too); heap, fifo and lifo
    # have the same verbs, so discovery cannot tell them apart and says so.
    assert discovered.returncode == 0, discovered.stderr
    ours = {row["queue"]: row for row in json.loads(discovered.stdout)["queues"] if row["schema"] == schema}
    assert_reports(ours, before, after, {"events": "heap|fifo|lifo", "reminders": "pending", "jobs": "work"})

    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["schema", "queue", "kind", "ready", "delayed", "in_flight", "dead", "oldest_ready_age"]
    assert re.fullmatch(rf"{schema}\s+jobs\s+work\s+2\s+1\s+2\s+1\s+\d+\.\ds", lines[3]), lines[3]


def test_discovery_calls_only_the_stats_of_deployed_queues(pg_url: str, capsys) -> None:
    """A database holding other software's *_stats functions: an extension's (pg_walinspect's
    pg_get_wal_stats, even inside a queue schema) and a lookalike in a schema tablequeue never deployed
    to. Each raises if called; discovery finds the one real queue and calls nothing else."""
    name = f"tq_discovery_{secrets.token_hex(3)}"
    url = pg_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        catalog = parse_catalog({"schema": "tq", "queues": [QUEUES[0]]}, "<discovery test>")
        units = [u for f in render_catalog(catalog, "postgres") for u in f.units]
        with connect(url, autocommit=True) as conn:
            deploy(conn, dialect_for("postgres"), "tq", units)
            conn.execute("CREATE EXTENSION pg_walinspect SCHEMA tq")
            conn.execute("CREATE SCHEMA lookalike")
            conn.execute("CREATE FUNCTION lookalike.events_stats() RETURNS int LANGUAGE plpgsql"
                         " AS $$BEGIN RAISE EXCEPTION 'not a queue'; END$$")
            conn.execute("CREATE FUNCTION lookalike.events_enqueue() RETURNS int LANGUAGE sql AS 'SELECT 1'")
            assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = 'pg_get_wal_stats'"
                                " AND pronamespace = 'tq'::regnamespace").fetchone()[0] == 1
        discovered = tablequeue(capsys, "stats", "--url", url, "--json")
        assert discovered.returncode == 0, discovered.stderr
        assert [(row["schema"], row["queue"], row["kind"]) for row in json.loads(discovered.stdout)["queues"]] == [
            ("tq", "events", "heap|fifo|lifo")]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_stats_names_the_catalog_and_the_queue_that_is_not_deployed(deploy_queues, tmp_path: Path, capsys) -> None:
    deployed = deploy_queues(*QUEUES)
    catalog = write_catalog(tmp_path, deployed.catalog.schema,
                            QUEUES + ({"name": "missing", "kind": "fifo", "payload": "text"},))
    result = tablequeue(capsys, "stats", "--url", deployed.url, "--catalog", str(catalog))
    assert result.returncode == 1
    assert result.stderr.strip() == (f"tablequeue stats: {catalog}: queue 'missing': "
                                     f"{deployed.catalog.schema}.missing_stats is not deployed in this database, "
                                     "or the login may not execute it")


def scrape(port: int) -> dict[tuple[str, str, str], dict[str, float]]:
    """{(schema, queue, kind): {gauge name: value}} of the tablequeue_queue_* gauges."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    gauges: dict[tuple[str, str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("tablequeue_queue_"):
                key = (sample.labels["schema"], sample.labels["queue"], sample.labels["kind"])
                gauges.setdefault(key, {})[sample.name.removeprefix("tablequeue_queue_")] = sample.value
    return gauges


def test_metrics_endpoint_serves_each_queues_stats_over_http(deploy_queues, tmp_path: Path) -> None:
    deployed = deploy_queues(*QUEUES)
    schema = deployed.catalog.schema
    conn = deployed.connect()
    scripted_load(deployed, conn)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tools"), str(REPO)])}
    process = subprocess.Popen([sys.executable, "-m", "tablequeue", "metrics", "--url", deployed.url, "--port", "0",
                                "--catalog", str(write_catalog(tmp_path, schema))],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = process.stdout.readline()
        match = re.match(r"tablequeue metrics: serving http://0\.0\.0\.0:(\d+)/metrics for \S+", first)
        assert match, first
        before = stats_of(deployed, conn)
        gauges = scrape(int(match[1]))
        after = stats_of(deployed, conn)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0, process.stderr.read()
    kinds = {"events": "heap", "reminders": "pending", "jobs": "work"}
    assert set(gauges) == {(schema, name, kind) for name, kind in kinds.items()}
    reported = {queue: {**values, "kind": kind} for (_, queue, kind), values in gauges.items()}
    assert_reports(reported, before, after, kinds)


@pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)   # the demo runs on PostgreSQL
def test_the_demo_ends_with_the_stats_of_its_catalogs_queues(deploy_queues) -> None:
    deployed = deploy_queues(*QUEUES)
    scripted_load(deployed, deployed.connect())
    lines = show_stats(deployed.url, deployed.catalog).splitlines()
    assert lines[0].split()[:4] == ["schema", "queue", "kind", "ready"]
    assert [line.split()[:7] for line in lines[1:]] == [
        [deployed.catalog.schema, q["name"], q["kind"], *map(str, EXPECTED[q["name"]])] for q in QUEUES]


@contextmanager
def admin_login(deployed: Any) -> Iterator[str]:
    """A URL of a new login that holds the schema's admin role and nothing else (dropped afterwards)."""
    name, password = f"monitor_{secrets.token_hex(3)}", f"Mon-{secrets.token_hex(8)}"
    role = f"{deployed.catalog.schema}_admin"
    url, count = re.subn(r"://[^@/]+@", f"://{name}:{password}@", deployed.url, count=1)
    assert count == 1, "the test needs a URL with user:password@ to put the new login's in its place"
    with deployed.connect() as conn:
        if deployed.dialect == "postgres":
            conn.execute(f'CREATE ROLE "{name}" LOGIN PASSWORD \'{password}\' IN ROLE "{role}"')
        else:
            conn.execute(f"CREATE LOGIN [{name}] WITH PASSWORD = N'{password}', CHECK_POLICY = OFF; "
                         f"CREATE USER [{name}] FOR LOGIN [{name}]; ALTER ROLE [{role}] ADD MEMBER [{name}];")
    try:
        yield url
    finally:
        with deployed.connect() as conn:
            if deployed.dialect == "postgres":
                conn.execute(f'DROP ROLE "{name}"')
            else:
                conn.execute(f"DROP USER [{name}]; DROP LOGIN [{name}];")


def test_stats_and_metrics_need_only_the_admin_role(deploy_queues, tmp_path: Path, capsys) -> None:
    deployed = deploy_queues(*QUEUES)
    schema = deployed.catalog.schema
    conn = deployed.connect()
    scripted_load(deployed, conn)
    catalog_path = write_catalog(tmp_path, schema)
    kinds = {"events": "heap", "reminders": "pending", "jobs": "work"}
    # SQL Server shows a login only the procedures it may execute: an admin-only login cannot see
    # enqueue, so it cannot tell pending from the other kinds without the catalog.
    discovered_kinds = ({"events": "heap|fifo|lifo", "reminders": "pending", "jobs": "work"}
                        if deployed.dialect == "postgres" else
                        {"events": "heap|fifo|lifo|pending", "reminders": "heap|fifo|lifo|pending", "jobs": "work"})
    with admin_login(deployed) as url:
        before = stats_of(deployed, conn)
        from_catalog = tablequeue(capsys, "stats", "--url", url, "--catalog", str(catalog_path), "--json")
        discovered = tablequeue(capsys, "stats", "--url", url, "--json")
        collector = QueueStatsCollector(url, load_catalog(catalog_path))
        try:
            samples = [sample for family in collector.collect() for sample in family.samples]
        finally:
            collector.close()
        after = stats_of(deployed, conn)

    assert from_catalog.returncode == 0, from_catalog.stderr
    assert_reports({row["queue"]: row for row in json.loads(from_catalog.stdout)["queues"]}, before, after, kinds)
    assert discovered.returncode == 0, discovered.stderr
    # The admin role of this schema only: no other schema's queue is found.
    document = json.loads(discovered.stdout)
    assert {row["schema"] for row in document["queues"]} == {schema}
    assert_reports({row["queue"]: row for row in document["queues"]}, before, after, discovered_kinds)
    gauges: dict[tuple[str, str], dict[str, float]] = {}
    for sample in samples:
        gauges.setdefault((sample.labels["queue"], sample.labels["kind"]), {})[
            sample.name.removeprefix("tablequeue_queue_")] = sample.value
    assert_reports({queue: {**values, "kind": kind} for (queue, kind), values in gauges.items()}, before, after, kinds)


def test_a_scrape_does_not_wait_behind_a_scrape_still_running(pg_url: str) -> None:
    collector = QueueStatsCollector(pg_url, timeout_seconds=0.5)
    outcome: list[BaseException | None] = []

    def scrape_once() -> None:
        try:
            list(collector.collect())
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome.append(exc)

    with collector._lock:                     # an earlier scrape holds the connection
        thread = threading.Thread(target=scrape_once, daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the scrape waited for the earlier one instead of failing"
    [error] = outcome
    assert isinstance(error, ScrapeError) and "an earlier scrape is still running after 0.5s" in str(error)
    collector.close()


def test_a_scrape_whose_connect_fails_does_not_try_again(monkeypatch) -> None:
    attempts: list[str] = []

    def refused(url: str, **kwargs: Any) -> Any:
        attempts.append(url)
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(metrics, "connect", refused)
    collector = QueueStatsCollector("postgresql://nobody@127.0.0.1:1/none", timeout_seconds=0.5)
    with pytest.raises(psycopg.OperationalError, match="connection refused"):
        list(collector.collect())
    assert len(attempts) == 1
