"""Shared fixtures: the databases every test talks to.

PostgreSQL always runs: TABLEQUEUE_PG_URL when set, else a throwaway cluster for the session.
SQL Server runs when TABLEQUEUE_MSSQL_URL is set; otherwise every SQL Server test is skipped and the
run ends with a plain count of what did not run. A skipped test is never reported as passed.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from tablequeue.catalog import Catalog, parse_catalog
from tablequeue.client import QueueClient
from tablequeue.deploy import deploy
from tablequeue.embedded import postgres_url
from tablequeue.engines import connect, dialect_for
from tablequeue.render import render_catalog

REPO = Path(__file__).resolve().parents[1]
MSSQL_SKIP_REASON = "SQL Server not configured (TABLEQUEUE_MSSQL_URL is not set)"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with postgres_url() as url:
        yield url


@pytest.fixture(scope="session")
def mssql_url() -> str:
    url = os.environ.get("TABLEQUEUE_MSSQL_URL")
    if not url:
        pytest.skip(MSSQL_SKIP_REASON)
    return url


@pytest.fixture(params=["postgres", pytest.param("mssql", marks=pytest.mark.mssql)])
def engine_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(dialect, url) for every configured engine: the conformance suite runs once per engine."""
    name = request.param
    return name, request.getfixturevalue("pg_url" if name == "postgres" else "mssql_url")


@dataclass
class Deployed:
    dialect: str
    url: str
    catalog: Catalog

    def connect(self, autocommit: bool = True) -> Any:
        return connect(self.url, autocommit=autocommit)

    def client(self, queue: str, conn: Any) -> QueueClient:
        return QueueClient.for_catalog(conn, self.dialect, self.catalog, queue)

    def empty(self, conn: Any = None) -> None:
        """PostgreSQL: back to a freshly deployed state (empty tables, sequences restarted), through
        conn (autocommit) when given, else a connection of its own."""
        assert self.dialect == "postgres", "empty() is for PostgreSQL schemas"
        if not empty_schema(self.url, self.catalog.schema, conn):
            raise RuntimeError(f"schema {self.catalog.schema}: a session still holds a lock on its tables")


def drop_schema(dialect: str, url: str, schema: str) -> None:
    conn = connect(url, autocommit=True)
    try:
        dialect_for(dialect).drop_schema(conn, schema)
    finally:
        conn.close()


def empty_schema(url: str, schema: str, conn: Any = None) -> bool:
    """Empty every table of a deployed PostgreSQL schema and restart its sequences (the deploy
    history stays), so the next user starts from what a fresh deploy gives; False when a lock a
    session still holds kept it from being emptied within 5 seconds. Through conn (autocommit) when
    given, else a connection of its own."""
    own = conn is None
    conn = connect(url, autocommit=True) if own else conn
    try:
        conn.execute("SET lock_timeout = '5s'")
        relations = conn.execute(
            "SELECT c.relkind, format('%%I.%%I', n.nspname, c.relname) FROM pg_class AS c "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'S') "
            "AND c.relname <> 'tablequeue_deploy_history'", (schema,)).fetchall()
        with conn.transaction():
            tables = [name for kind, name in relations if kind in ("r", "p")]
            if tables:
                conn.execute(f"TRUNCATE {', '.join(tables)}")
            for name in (name for kind, name in relations if kind == "S"):
                conn.execute(f"ALTER SEQUENCE {name} RESTART")
        return True
    except psycopg.errors.LockNotAvailable:
        return False
    finally:
        if own:
            conn.close()


class SchemaPool:
    """PostgreSQL schemas that tests deployed with reuse=True, kept for the next test that deploys
    the same queues: emptying the tables of a deployed schema costs a fraction of rendering,
    deploying and dropping one, which over the conformance suite is many minutes on a 2-core machine.
    A schema is emptied when it is taken, so nothing a failed test left behind reaches the next one;
    a schema that cannot be emptied (a lock a failed test still holds) is dropped instead."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.free: dict[str, list[Deployed]] = {}
        self.schemas: list[str] = []

    def take(self, key: str) -> Deployed | None:
        while self.free.get(key):
            deployed = self.free[key].pop()
            if self._emptied(deployed.catalog.schema):
                return deployed
            self.schemas.remove(deployed.catalog.schema)
            drop_schema("postgres", self.url, deployed.catalog.schema)
        return None

    def give_back(self, key: str, deployed: Deployed) -> None:
        if deployed.catalog.schema not in self.schemas:
            self.schemas.append(deployed.catalog.schema)
        self.free.setdefault(key, []).append(deployed)

    def _emptied(self, schema: str) -> bool:
        return empty_schema(self.url, schema)


@pytest.fixture(scope="session")
def pg_schema_pool(pg_url: str) -> Iterator[SchemaPool]:
    pool = SchemaPool(pg_url)
    yield pool
    for schema in pool.schemas:
        drop_schema("postgres", pg_url, schema)


@pytest.fixture
def deploy_queues(engine_url: tuple[str, str],
                  request: pytest.FixtureRequest) -> Iterator[Callable[..., Deployed]]:
    """Deploy queues (catalog 'queues' entries) into a fresh schema of the engine under test.
    reuse=True (tests that change no object of the schema): on PostgreSQL, a schema an earlier test
    deployed with the same queues, emptied, when there is one (see SchemaPool)."""
    dialect, url = engine_url
    schemas: list[str] = []
    borrowed: list[tuple[SchemaPool, str, Deployed]] = []

    def _deploy(*queues: dict, schema: str | None = None, reuse: bool = False) -> Deployed:
        pool = request.getfixturevalue("pg_schema_pool") if reuse and dialect == "postgres" else None
        key = json.dumps(queues, sort_keys=True, default=str)
        if pool is not None and schema is None:
            reused = pool.take(key)
            if reused is not None:
                borrowed.append((pool, key, reused))
                return reused
        schema = schema or f"t_{secrets.token_hex(4)}"
        catalog = parse_catalog({"schema": schema, "queues": list(queues)}, f"<test catalog {schema}>")
        units = [u for f in render_catalog(catalog, dialect) for u in f.units]
        conn = connect(url, autocommit=dialect == "postgres")
        try:
            deploy(conn, dialect_for(dialect), schema, units)
        finally:
            conn.close()
        deployed = Deployed(dialect, url, catalog)
        if pool is not None:
            borrowed.append((pool, key, deployed))
        else:
            schemas.append(schema)
        return deployed

    yield _deploy
    for pool, key, deployed in borrowed:
        pool.give_back(key, deployed)
    for schema in schemas:
        drop_schema(dialect, url, schema)


@pytest.fixture
def pg_schemas(pg_url: str) -> Iterator[list[str]]:
    """Two fresh PostgreSQL schema names, dropped afterwards: the schema a test upgrades, and one for a
    fresh install of the same catalog to compare it with."""
    names = [f"u_{secrets.token_hex(4)}", f"f_{secrets.token_hex(4)}"]
    yield names
    for name in names:
        drop_schema("postgres", pg_url, name)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    not_run = [r for r in skipped if MSSQL_SKIP_REASON in str(getattr(r, "longrepr", ""))]
    passed_mssql = [r for r in terminalreporter.stats.get("passed", []) if "[mssql" in r.nodeid]
    write = terminalreporter.write_line
    if os.environ.get("TABLEQUEUE_MSSQL_URL"):
        write(f"SQL Server: {len(passed_mssql)} test(s) ran and passed against TABLEQUEUE_MSSQL_URL")
    else:
        write(f"SQL Server: {len(not_run)} test(s) did NOT run: TABLEQUEUE_MSSQL_URL is not set")
