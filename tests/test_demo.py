"""The demo's in-database worker: the example catalog's handler exists and does its work.

The example catalog names a handler for queue.thumbnails (queue.make_thumbnail); the demo deploys the
example handler shipped in database/examples/handlers/ and runs S.Q_process over messages, whose
writes and completions commit together.
"""
from __future__ import annotations

import secrets
from pathlib import Path

import psycopg
import pytest

from tablequeue.catalog import load_catalog
from tablequeue.demo import run_handler
from tablequeue.deploy import deploy
from tablequeue.engines import SCHEMA_ROLES, connect, dialect_for
from tablequeue.render import render_catalog

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def example_database(pg_url: str):
    """A database of its own: the example catalog's schema is `queue`, which other tests may use too."""
    name = f"tq_demo_{secrets.token_hex(3)}"
    url = pg_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield url
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for role in SCHEMA_ROLES:
            try:
                admin.execute(f'DROP ROLE IF EXISTS "queue_{role}"')
            except psycopg.errors.DependentObjectsStillExist:
                pass   # another database still has the example catalog deployed


def test_the_example_handler_runs_under_the_in_database_worker(example_database: str) -> None:
    catalog = load_catalog(REPO / "database" / "queues.yml")
    thumbnails = catalog.queue("thumbnails")
    units = [u for f in render_catalog(catalog, "postgres") for u in f.units]
    with connect(example_database, autocommit=True) as conn:
        deploy(conn, dialect_for("postgres"), catalog.schema, units, share_roles=True)

    line = run_handler(example_database, catalog, thumbnails, 40)

    assert "40 processed, 40 completed, 0 failed" in line
    with connect(example_database, autocommit=True) as conn:
        made = conn.execute('SELECT count(*) FROM "queue"."thumbnails_made"').fetchone()[0]
        left = conn.execute('SELECT count(*) FROM "queue"."thumbnails"').fetchone()[0]
    assert (made, left) == (40, 0)


def test_the_spark_demo_shows_its_summary_once(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """`make demo --spark` printed the Spark summary twice: run_spark_demo logged it (stderr) and the
    demo printed it. Spark itself is replaced here (tests/test_pipelines.py runs it for real): the
    jobs return fixed figures, and what the logger and print write is read together."""
    import io
    import logging

    import pipelines.demo as spark_demo
    from pipelines.common import log
    from pyspark.sql import functions

    from tablequeue import demo

    class Frame:   # read_results(...).where(...).agg(...).first()
        def where(self, _condition: str) -> "Frame":
            return self

        def agg(self, *_columns: object) -> "Frame":
            return self

        def first(self) -> dict:
            return {"rows": 20_000 - 207, "ids": 20_000 - 207}

    column = type("Column", (), {"alias": lambda self, name: name})()
    monkeypatch.setattr(functions, "count", lambda *_: column)
    monkeypatch.setattr(functions, "countDistinct", lambda *_: column)
    monkeypatch.setattr(spark_demo, "generate_dataset", lambda spark, rows, path: path)
    monkeypatch.setattr(spark_demo, "run_enqueue", lambda *a, **k: {"rows": 20_000, "enqueued": 20_000,
                                                                   "duplicates": 0})
    monkeypatch.setattr(spark_demo, "run_stream", lambda *a, **k: {"retrying": 1_538, "output": "out-folder"})
    monkeypatch.setattr(spark_demo, "run_report", lambda *a, **k: {
        "completed": 20_000 - 207, "dead": 207, "chart": "report-chart.png", "throughput": [{"completed": 9_871}],
        "latency": {"wait": {"p50": 0.5, "p95": 1.5, "p99": 2.5}, "processing": {}}})
    monkeypatch.setattr(spark_demo, "read_results", lambda spark, output: Frame())
    monkeypatch.setattr(spark_demo, "build_session", lambda name: type("Session", (), {"stop": lambda self: None})())
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    log().addHandler(handler)
    try:
        failed = demo._spark_demo("postgresql://demo@localhost/demo", load_catalog(REPO / "database" / "queues.yml"))
    finally:
        log().removeHandler(handler)

    assert failed is False
    shown = capsys.readouterr().out + logged.getvalue()
    for figure in ("report-chart.png", "out-folder", "9871", "1538"):
        assert shown.count(figure) == 1, (figure, shown)
