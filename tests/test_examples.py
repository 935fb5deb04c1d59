"""examples/: callers in other languages, run against PostgreSQL as a reader would run them.

They call queue.emails of the example catalog (database/queues.yml). The test deploys that queue into
a database of its own, runs the Java file with `java` (single-file source launch, the JDBC driver of
the Spark set-up) and the psql script with `psql`, and checks that they exit 0 with their first
message in the history and their second (no recipient) failed: back in the queue, not leased, with
its attempt spent and its error recorded, which a lease taken in the transaction that the failed work
rolls back could not give. The SQL Server twins cannot run here (no SQL Server): the Java
one is compiled, the sqlcmd script goes through check-tsql with the golden T-SQL of the example
catalog, so a renamed procedure, parameter or result column fails here too.
"""
from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Iterator
from urllib.parse import quote, urlsplit

import psycopg
import pytest

from tablequeue.catalog import Catalog, load_catalog
from tablequeue.deploy import deploy
from tablequeue.embedded import find_bindir
from tablequeue.engines import SCHEMA_ROLES, connect, dialect_for
from tablequeue.render import render_catalog
from tablequeue.tsqlcheck import check_sources
from tsql_renders import golden_sources

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
JDBC_DRIVER = Path("/usr/share/java/postgresql.jar")   # tools/setup-system.sh: libpostgresql-jdbc-java
EXAMPLE_CATALOG = load_catalog(REPO / "database" / "queues.yml")
# Only the queue the examples call: deploying the whole example catalog would take longer for nothing.
EMAILS = Catalog(EXAMPLE_CATALOG.path, EXAMPLE_CATALOG.schema, (EXAMPLE_CATALOG.queue("emails"),))


@pytest.fixture
def examples_database(pg_url: str) -> Iterator[str]:
    """A database of its own (the example catalog's schema is `queue`, which other tests use too) with
    the example catalog's queue emails deployed; dropped afterwards."""
    name = f"tq_examples_{secrets.token_hex(3)}"
    url = pg_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with connect(url) as conn:
            deploy(conn, dialect_for("postgres"), EMAILS.schema,
                   [u for f in render_catalog(EMAILS, "postgres") for u in f.units], share_roles=True)
        yield url
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            for role in SCHEMA_ROLES:
                try:
                    admin.execute(f'DROP ROLE IF EXISTS "{EMAILS.schema}_{role}"')
                except psycopg.errors.DependentObjectsStillExist:
                    pass   # another database of the cluster has a schema named queue deployed


def jdbc_url(url: str) -> str:
    parts = urlsplit(url)
    return (f"jdbc:postgresql://{parts.hostname}:{parts.port}{parts.path}"
            f"?user={quote(parts.username or '', safe='')}&password={quote(parts.password or '', safe='')}")


def what_the_example_left(url: str) -> tuple[list[tuple], list[tuple]]:
    """(worker, attempts) of each completed message; (attempts, leased_by, last_error, retry due in
    the future) of each message still queued."""
    with connect(url) as conn:
        done = conn.execute('SELECT worker, attempts FROM "queue"."emails_history"').fetchall()
        queued = conn.execute('SELECT attempts, leased_by, last_error, visible_at > clock_timestamp() '
                              'FROM "queue"."emails"').fetchall()
    return done, queued


def test_the_java_example_runs_against_postgresql(examples_database: str) -> None:
    result = subprocess.run(["java", "-cp", str(JDBC_DRIVER), str(EXAMPLES / "postgres" / "Example.java")],
                            env={"PATH": "/usr/bin:/bin", "TABLEQUEUE_JDBC_URL": jdbc_url(examples_database)},
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("enqueued message ") and lines[-1] == "refused as documented: TQ001 invalid_argument"
    assert what_the_example_left(examples_database) == (
        [("java-example", 1)],
        [(1, None, "java.lang.IllegalArgumentException: no recipient (payload.to)", True)])


def test_the_psql_script_runs_against_postgresql(examples_database: str) -> None:
    psql = find_bindir() / "psql"
    result = subprocess.run([str(psql if psql.exists() else shutil.which("psql")), examples_database,
                             "-X", "-f", str(EXAMPLES / "postgres" / "example.sql")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "refused as documented: TQ001 invalid_argument"
    # The one error the script provokes, and no other.
    assert result.stderr.count("ERROR:") == 1
    assert what_the_example_left(examples_database) == ([("psql-example", 1)],
                                                        [(1, None, "no recipient (payload.to)", True)])


def test_the_sql_server_java_twin_compiles(tmp_path: Path) -> None:
    result = subprocess.run(["javac", "-d", str(tmp_path), str(EXAMPLES / "sqlserver" / "Example.java")],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "Example.class").exists()


def test_the_sqlcmd_twin_calls_only_what_the_example_catalog_deploys() -> None:
    script = EXAMPLES / "sqlserver" / "example.sql"
    # Named as tests/tsql_renders.py names them: parsed once per test run, whichever test reads them first.
    golden = [source for source in golden_sources()
              if source[0] in ("database/rendered/mssql/_framework.sql", "database/rendered/mssql/emails.sql")]
    assert len(golden) == 2
    report = check_sources(golden + [(str(script), script.read_text(encoding="utf-8"))])
    assert report.clean, "\n".join(map(str, report.findings + report.violations))
    assert any(model.file == str(script) for model in report.models)
