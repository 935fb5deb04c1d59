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
