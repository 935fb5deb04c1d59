"""``tablequeue selftest``: what a DBA runs first against their own server, in a scratch database.

In order:

1. Reads the server's facts over the URL's own connection: version, edition, engine edition,
   READ_COMMITTED_SNAPSHOT (RCSI) and compatibility level of the URL's database, the CLR settings.
2. Creates the scratch target: a database ``tablequeue_selftest_<UTC yyyymmddhhmmss>_<hex>`` (SQL
   Server: from ``master``; PostgreSQL: from the URL's database), or with ``--scratch schema`` only a
   schema in the URL's database, for logins that may not create databases.
3. Deploys the catalog (by default the package's ``selftest_catalog.yml``: every kind with every
   option) into the schema ``selftest_<same stamp>``. The catalog's own schema name is not used: on
   PostgreSQL the roles ``<schema>_producer`` and so on belong to the whole cluster, and a scratch
   run must not grant to, or drop, the roles of a real deployment.
4. Per RCSI mode (SQL Server, scratch database: off, then on, unless ``--rcsi`` says one; the review
   found the claims' defects exactly where RCSI changes locking): sets READ_COMMITTED_SNAPSHOT, runs the
   tSQLt classes of the catalog through ``tsqlt.run_tsqlt`` when given ``tSQLt.class.sql``, and runs the
   engine's half of the conformance suite as ``python -m pytest tests/conformance -m mssql`` (PostgreSQL:
   ``-m "not mssql"``) with ``TABLEQUEUE_MSSQL_URL`` (``TABLEQUEUE_PG_URL``) set to the scratch
   database: the suite CI runs. The tests come with a checkout of the repository, not with the
   installed package; without them the conformance half does not run and the report says why.
5. Drops the scratch target (unless ``--keep``), also when a step failed.
6. Writes one JUnit file (both halves of every mode) and a markdown report.

Exit code 0 only when the deploy and every half that can run on the engine ran and passed. A half
that cannot exist on the platform (tSQLt on PostgreSQL or on Azure SQL Database: no SQLCLR) is "not
applicable"; one that could but did not run (no tSQLt.class.sql given, tests not installed) makes the
exit code 1, so a green selftest always means everything ran.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import secrets
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .distribution import version
from .catalog import Catalog, load_catalog
from .deploy import deploy
from .engines import Target, dialect_for, parse_url, with_database
from .engines import connect as engine_connect
from .distribution import checkout_root
from .render import render_catalog, render_tsqlt
from .tsqlt import (
    CLR_SQL, NO_CLR_EDITIONS, SYSTEM_DATABASES, TsqltResult, find_tsqlt_tests, junit_element, run_tsqlt,
    server_message,
)

DEFAULT_CATALOG = Path(__file__).with_name("selftest_catalog.yml")
SCRATCH_KINDS = ("database", "schema")
RCSI_CHOICES = ("on", "off", "both")
FAILURES_LISTED = 50

MSSQL_SERVER_FACTS_SQL = """\
SELECT @@VERSION AS version,
       CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)) AS product_version,
       CAST(SERVERPROPERTY('Edition') AS nvarchar(128)) AS edition,
       CAST(SERVERPROPERTY('EngineEdition') AS int) AS engine_edition,
       DB_NAME() AS database_name,
       d.is_read_committed_snapshot_on,
       d.compatibility_level
FROM sys.databases AS d
WHERE d.database_id = DB_ID();"""
MSSQL_DATABASE_FACTS_SQL = (
    "SELECT is_read_committed_snapshot_on, compatibility_level FROM sys.databases WHERE name = ?;"
)
# tSQLt.Info exists once tSQLt is installed; in schema mode a tSQLt this run installed is removed again.
MSSQL_TSQLT_INSTALLED_SQL = "SELECT CASE WHEN OBJECT_ID(N'tSQLt.Info') IS NULL THEN 0 ELSE 1 END;"
POSTGRES_SERVER_FACTS_SQL = "SELECT version(), current_setting('server_version'), current_database()"


class SelftestInvalid(ValueError):
    """Options that do not fit the target; found before anything is created (exit code 2)."""


class SelftestError(RuntimeError):
    """The scratch target could not be created; nothing ran (exit code 1)."""


@dataclass(frozen=True)
class SelftestOptions:
    url: str
    catalog: Path = DEFAULT_CATALOG
    tsqlt_installer: Path | None = None      # tSQLt.class.sql
    prepare_server: Path | None = None       # tSQLt's PrepareServer.sql
    scratch: str = "database"                # database | schema
    rcsi: str | None = None                  # on | off | both; None: the default for the target
    keep: bool = False
    junit: Path | None = None
    report: Path | None = None
    conformance_filter: str | None = None    # a pytest -k expression, to rerun part of the suite


@dataclass(frozen=True)
class ServerFacts:
    dialect: str
    version: str                  # @@VERSION / version(), first line
    product_version: str
    database: str                 # the URL's database
    edition: str | None = None
    engine_edition: int | None = None
    rcsi: bool | None = None      # of the URL's database
    compatibility_level: int | None = None
    clr_enabled: bool | None = None
    clr_strict_security: bool | None = None

    @property
    def has_clr(self) -> bool:
        """SQLCLR exists on this platform (tSQLt needs it); whether it is enabled is clr_enabled."""
        return self.dialect == "mssql" and self.engine_edition not in NO_CLR_EDITIONS


@dataclass
class Scratch:
    kind: str                     # database | schema
    database: str                 # the scratch database, or in schema mode the URL's database
    schema: str                   # the catalog is deployed into this schema
    url: str                      # every sub-step connects here
    compatibility_level: int | None = None
    cleanup: str = "not attempted"


@dataclass
class HalfRun:
    """tSQLt or the conformance suite, in one mode.

    status: passed, failed (tests failed), error (the run could not be carried out), not run (could
    run on this engine but did not), not applicable (cannot exist on this platform)."""

    name: str
    status: str
    reason: str = ""
    tests: int = 0
    passed: int = 0
    failed: int = 0               # failures and errors
    skipped: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    suites: list[ET.Element] = field(default_factory=list)

    @property
    def counts_against(self) -> bool:
        return self.status in ("failed", "error", "not run")


@dataclass
class ModeRun:
    label: str                    # "RCSI off", "RCSI on", "PostgreSQL"
    junit_prefix: str             # rcsi_off, rcsi_on, postgres
    rcsi: bool | None = None      # as read back from the scratch database
    halves: list[HalfRun] = field(default_factory=list)


@dataclass
class SelftestResult:
    target: Target
    catalog: Catalog
    facts: ServerFacts
    scratch: Scratch
    started: datetime
    deploy_status: str = "not run"   # passed | error
    deploy_detail: str = ""
    deploy_seconds: float = 0.0
    modes: list[ModeRun] = field(default_factory=list)
    cleanup_failed: bool = False
    total_seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        halves = [half for mode in self.modes for half in mode.halves]
        if self.deploy_status != "passed" or self.cleanup_failed:
            return 1
        if any(half.counts_against for half in halves) or not any(h.status == "passed" for h in halves):
            return 1
        return 0

    def summary(self) -> str:
        verdict = "passed" if self.exit_code == 0 else "FAILED"
        parts = [f"deploy {self.deploy_status}"]
        for mode in self.modes:
            for half in mode.halves:
                parts.append(f"{mode.label} {half.name} {_status_text(half)}")
        if self.cleanup_failed:
            parts.append(f"cleanup: {self.scratch.cleanup}")
        return f"tablequeue selftest {verdict}: " + "; ".join(parts)


# --- the run ---------------------------------------------------------------------------------

Connect = Callable[..., Any]


def run_selftest(options: SelftestOptions, *, connect: Connect = engine_connect,
                 conformance_dir: Path | None = None,
                 progress: Callable[[str], None] = lambda line: None) -> SelftestResult:
    """Run everything, clean up, write the JUnit file and the report; see the module docstring.

    ``connect(url, autocommit=...)`` opens a DB-API connection (tests pass a fake).
    Raises SelftestInvalid for options that do not fit the target (nothing created), SelftestError
    when the scratch target cannot be created, CatalogError for a bad catalog.
    """
    started = datetime.now(timezone.utc)
    clock = time.monotonic()
    target = parse_url(options.url)
    _check_options(options, target)
    catalog = load_catalog(options.catalog)
    installer = _read_script(options.tsqlt_installer, "--tsqlt")
    prepare = _read_script(options.prepare_server, "--prepare-server")

    with _connection(connect, options.url, autocommit=True) as conn:
        facts = _read_facts(conn, target.dialect)
    _check_target(options, facts)
    modes = _modes(options, facts)

    stamp = f"{started:%Y%m%d%H%M%S}_{secrets.token_hex(3)}"
    scratch = _create_scratch(connect, options, target, facts, stamp, progress)
    catalog = dataclasses.replace(catalog, schema=scratch.schema)
    result = SelftestResult(target, catalog, facts, scratch, started)
    tsqlt_preinstalled = False
    try:
        if target.dialect == "mssql" and scratch.kind == "database":
            with _connection(connect, _admin_url(options.url, "mssql"), autocommit=True) as conn:
                scratch.compatibility_level = _rows(conn, MSSQL_DATABASE_FACTS_SQL, scratch.database)[0][1]
        if target.dialect == "mssql" and scratch.kind == "schema":
            with _connection(connect, scratch.url, autocommit=True) as conn:
                tsqlt_preinstalled = bool(_scalar(conn, MSSQL_TSQLT_INSTALLED_SQL))
        _deploy_step(result, connect, progress)
        if result.deploy_status == "passed":
            for rcsi in modes:
                mode = _mode_run(result, connect, options, rcsi)
                result.modes.append(mode)
                if mode.halves:  # the mode could not be set up: its halves say why
                    continue
                mode.halves.append(_tsqlt_half(result, connect, mode, installer, prepare, progress))
                mode.halves.append(_conformance_half(result, options, mode, conformance_dir, progress))
    finally:
        _cleanup(result, connect, options, tsqlt_preinstalled, progress)
        result.total_seconds = time.monotonic() - clock
    if options.junit is not None:
        _write_xml(junit_document(result), options.junit)
    if options.report is not None:
        options.report.parent.mkdir(parents=True, exist_ok=True)
        options.report.write_text(markdown_report(result), encoding="utf-8")
    return result


def _check_options(options: SelftestOptions, target: Target) -> None:
    if options.scratch not in SCRATCH_KINDS:
        raise SelftestInvalid(f"--scratch must be one of {', '.join(SCRATCH_KINDS)}, not {options.scratch!r}")
    if options.rcsi is not None and options.rcsi not in RCSI_CHOICES:
        raise SelftestInvalid(f"--rcsi must be one of {', '.join(RCSI_CHOICES)}, not {options.rcsi!r}")
    if target.dialect == "postgres":
        if options.rcsi is not None:
            raise SelftestInvalid("--rcsi is a SQL Server setting (READ_COMMITTED_SNAPSHOT); "
                                  "PostgreSQL has no such mode")
        if options.tsqlt_installer is not None or options.prepare_server is not None:
            raise SelftestInvalid("tSQLt runs on SQL Server only: --tsqlt and --prepare-server do not "
                                  "apply to a PostgreSQL URL")


def _read_script(path: Path | None, option: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise SelftestInvalid(f"{option} {path}: cannot read the file: {exc.strerror}") from exc


def _check_target(options: SelftestOptions, facts: ServerFacts) -> None:
    if facts.dialect != "mssql":
        return
    if options.scratch == "database" and facts.engine_edition == 5:
        raise SelftestInvalid(
            "Azure SQL Database (SERVERPROPERTY('EngineEdition') = 5): a scratch database there would be "
            "a new, separately billed database; run with --scratch schema")
    if options.scratch == "schema" and facts.database.lower() in SYSTEM_DATABASES:
        raise SelftestInvalid(
            f"--scratch schema works in the URL's database, which is the system database "
            f"'{facts.database}': put a user database in the URL")


def _modes(options: SelftestOptions, facts: ServerFacts) -> list[bool | None]:
    """The RCSI settings to run under: True/False to set it, None to leave the database as it is."""
    if facts.dialect != "mssql":
        return [None]
    if options.scratch == "schema":
        # Switching RCSI needs the database to itself: not for someone else's database.
        wanted = {"on": True, "off": False}.get(options.rcsi or "")
        if options.rcsi == "both" or (wanted is not None and wanted != facts.rcsi):
            raise SelftestInvalid(
                f"--rcsi {options.rcsi} needs a scratch database: with --scratch schema the tests run "
                f"with the RCSI setting database '{facts.database}' has "
                f"({'on' if facts.rcsi else 'off'}), which selftest does not change")
        return [None]
    return {"on": [True], "off": [False]}.get(options.rcsi or "both", [False, True])


@contextmanager
def _connection(connect: Connect, url: str, autocommit: bool) -> Iterator[Any]:
    conn = connect(url, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


def _rows(conn: Any, sql: str, *params: Any) -> list[Any]:
    cursor = conn.cursor()
    try:
        cursor.execute(sql, *params)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _scalar(conn: Any, sql: str, *params: Any) -> Any:
    rows = _rows(conn, sql, *params)
    return rows[0][0] if rows else None


def _execute(conn: Any, sql: str, *params: Any) -> None:
    cursor = conn.cursor()
    try:
        cursor.execute(sql, *params)
        while cursor.nextset():
            pass
    finally:
        cursor.close()


def _read_facts(conn: Any, dialect: str) -> ServerFacts:
    if dialect == "postgres":
        version, product_version, database = _rows(conn, POSTGRES_SERVER_FACTS_SQL)[0]
        return ServerFacts("postgres", version, product_version, database)
    version, product_version, edition, engine_edition, database, rcsi, level = _rows(
        conn, MSSQL_SERVER_FACTS_SQL)[0]
    clr_enabled, clr_strict = _rows(conn, CLR_SQL)[0]
    return ServerFacts(
        "mssql", str(version).strip().splitlines()[0], str(product_version), str(database),
        edition=edition, engine_edition=None if engine_edition is None else int(engine_edition),
        rcsi=bool(rcsi), compatibility_level=level,
        clr_enabled=None if clr_enabled is None else bool(clr_enabled),
        clr_strict_security=None if clr_strict is None else bool(clr_strict),
    )


def _bracket(name: str) -> str:
    return "[" + name.replace("]", "]]") + "]"


def _admin_url(url: str, dialect: str) -> str:
    """Where a database is created and dropped: master on SQL Server, the URL's database on PostgreSQL."""
    return with_database(url, "master") if dialect == "mssql" else url


def _create_scratch(connect: Connect, options: SelftestOptions, target: Target, facts: ServerFacts,
                    stamp: str, progress: Callable[[str], None]) -> Scratch:
    schema = f"selftest_{stamp}"
    if options.scratch == "schema":
        # The deploy creates the schema; the cleanup drops it with what is in it.
        progress(f"selftest: scratch schema {schema} in database {facts.database}")
        return Scratch("schema", facts.database, schema, options.url)
    name = f"tablequeue_selftest_{stamp}"
    create = f"CREATE DATABASE {_bracket(name)};" if target.dialect == "mssql" else f'CREATE DATABASE "{name}"'
    with _connection(connect, _admin_url(options.url, target.dialect), autocommit=True) as conn:
        try:
            _execute(conn, create)
        except Exception as exc:  # noqa: BLE001 - any refusal: explain the right it needs
            raise SelftestError(_create_refused(target, name, server_message(exc), facts.database)) from exc
    progress(f"selftest: created scratch database {name}")
    return Scratch("database", name, schema, with_database(options.url, name))


def _create_refused(target: Target, name: str, message: str, database: str) -> str:
    if target.dialect == "mssql":
        right = ("the CREATE DATABASE permission in master (CREATE ANY DATABASE, or the dbcreator server "
                 "role)")
        schema_rights = "db_owner (the deploy creates a schema owned by dbo, tables, types, procedures and roles)"
    else:
        right = "the CREATEDB attribute (ALTER ROLE ... CREATEDB)"
        schema_rights = "CREATE on the database and the CREATEROLE attribute"
    return (f"cannot create the scratch database {name} on {target.describe()}: {message}. "
            f"Creating it needs {right}. Without that right, run with --scratch schema: it works in a "
            f"scratch schema of database '{database}' and needs {schema_rights} there.")


def _deploy_step(result: SelftestResult, connect: Connect, progress: Callable[[str], None]) -> None:
    dialect = result.target.dialect
    units = [unit for rendered in render_catalog(result.catalog, dialect) for unit in rendered.units]
    clock = time.monotonic()
    try:
        with _connection(connect, result.scratch.url, autocommit=dialect == "postgres") as conn:
            deployed = deploy(conn, dialect_for(dialect), result.catalog.schema, units)
    except Exception as exc:  # noqa: BLE001 - recorded in the report; the cleanup still runs
        result.deploy_status, result.deploy_detail = "error", _one_line(exc)
    else:
        result.deploy_status = "passed"
        result.deploy_detail = (f"{len(deployed.applied)} units of {len(result.catalog.queues)} queues "
                                f"into schema {result.catalog.schema}")
    result.deploy_seconds = time.monotonic() - clock
    progress(f"selftest: deploy {result.deploy_status}: {result.deploy_detail} "
             f"({result.deploy_seconds:.1f} s)")


def _mode_run(result: SelftestResult, connect: Connect, options: SelftestOptions,
              rcsi: bool | None) -> ModeRun:
    """The mode, set up; when it cannot be, its halves are errors that say why."""
    if result.target.dialect == "postgres":
        return ModeRun("PostgreSQL", "postgres")
    if rcsi is None:  # a scratch schema: the database stays as it was found
        label = "on" if result.facts.rcsi else "off"
        return ModeRun(f"RCSI {label}", f"rcsi_{label}", rcsi=result.facts.rcsi)
    label = "on" if rcsi else "off"
    try:
        with _connection(connect, _admin_url(options.url, "mssql"), autocommit=True) as conn:
            # Needs the database to itself: every connection of this run to it is closed by now,
            # and ROLLBACK IMMEDIATE ends any that a driver's pool kept open.
            _execute(conn, f"ALTER DATABASE {_bracket(result.scratch.database)} "
                           f"SET READ_COMMITTED_SNAPSHOT {label.upper()} WITH ROLLBACK IMMEDIATE;")
            actual = bool(_rows(conn, MSSQL_DATABASE_FACTS_SQL, result.scratch.database)[0][0])
        if actual != rcsi:
            raise RuntimeError(f"READ_COMMITTED_SNAPSHOT is still {'ON' if actual else 'OFF'}")
    except Exception as exc:  # noqa: BLE001 - recorded in the report; the cleanup still runs
        reason = f"could not set READ_COMMITTED_SNAPSHOT {label.upper()}: {_one_line(exc)}"
        return ModeRun(f"RCSI {label}", f"rcsi_{label}", halves=[
            HalfRun("tSQLt", "error", reason), HalfRun("conformance", "error", reason)])
    return ModeRun(f"RCSI {label}", f"rcsi_{label}", rcsi=actual)


# --- tSQLt half ------------------------------------------------------------------------------

def _tsqlt_half(result: SelftestResult, connect: Connect, mode: ModeRun, installer: str | None,
                prepare: str | None, progress: Callable[[str], None]) -> HalfRun:
    facts = result.facts
    if facts.dialect != "mssql":
        return HalfRun("tSQLt", "not applicable", "tSQLt is for SQL Server")
    if not facts.has_clr:
        return HalfRun("tSQLt", "not applicable",
                       f"{NO_CLR_EDITIONS[facts.engine_edition or 0]} has no SQLCLR, which tSQLt needs")
    if installer is None:
        return HalfRun("tSQLt", "not run", "no tSQLt.class.sql given (--tsqlt or TABLEQUEUE_TSQLT)")
    classes = [(rendered.name, rendered.text) for rendered in render_tsqlt(result.catalog)]
    progress(f"selftest: {mode.label}: tSQLt, {len(classes)} test classes")
    clock = time.monotonic()
    try:
        with _connection(connect, result.scratch.url, autocommit=True) as conn:
            outcome = run_tsqlt(conn, installer, classes, None, prepare_server_script=prepare)
    except Exception as exc:  # noqa: BLE001 - recorded in the report; the next steps still run
        half = HalfRun("tSQLt", "error", _one_line(exc), seconds=time.monotonic() - clock)
    else:
        half = _tsqlt_outcome(outcome, time.monotonic() - clock)
    progress(f"selftest: {mode.label}: tSQLt {_status_text(half)} ({half.seconds:.1f} s)")
    return half


def _tsqlt_outcome(outcome: TsqltResult, seconds: float) -> HalfRun:
    failures = [f"{test.full_name}: {_first_line(test.message) or test.result}"
                for test in outcome.tests if test.outcome in ("failed", "error")]
    failures += [f"[{schema}].[{name}]: defined but not run by tSQLt.RunAll" for schema, name in outcome.not_run]
    if outcome.unexplained_error:
        failures.append(f"tSQLt.RunAll raised: {outcome.run_all_error}")
    status = "passed" if outcome.exit_code == 0 else "failed"
    return HalfRun(
        "tSQLt", status, "" if status == "passed" else outcome.summary(),
        tests=len(outcome.tests) + len(outcome.not_run), passed=outcome.passed,
        failed=outcome.failed + outcome.errors + len(outcome.not_run), skipped=outcome.skipped,
        seconds=seconds, failures=failures, suites=list(junit_element(outcome)),
    )


# --- conformance half ------------------------------------------------------------------------

def _conformance_half(result: SelftestResult, options: SelftestOptions, mode: ModeRun,
                      tests_dir: Path | None, progress: Callable[[str], None]) -> HalfRun:
    """tests_dir: the conformance suite; None: the checkout's tests/conformance, when there is one."""
    if tests_dir is None:
        root = checkout_root()
        if root is None:
            return HalfRun("conformance", "not run", (
                "the conformance tests come with a checkout of the tablequeue repository, not with the "
                "installed package; run selftest from a checkout"))
        tests_dir = root / "tests" / "conformance"
    tests_dir = tests_dir.resolve()
    if not tests_dir.is_dir():
        return HalfRun("conformance", "not run", (
            f"the conformance tests are not here ({tests_dir} does not exist): they come with a checkout "
            "of the tablequeue repository, not with the installed package; run selftest from a checkout"))
    if importlib.util.find_spec("pytest") is None:
        return HalfRun("conformance", "not run",
                       "pytest is not installed (pip install 'tablequeue[test]' or use the checkout's .venv)")
    dialect = result.target.dialect
    url_variable = "TABLEQUEUE_MSSQL_URL" if dialect == "mssql" else "TABLEQUEUE_PG_URL"
    handle, name = tempfile.mkstemp(prefix=f"tablequeue-selftest-{mode.junit_prefix}-", suffix=".xml")
    os.close(handle)
    junit_path = Path(name)
    command = [sys.executable, "-m", "pytest", str(tests_dir), "-m", "mssql" if dialect == "mssql" else "not mssql",
               f"--junitxml={junit_path}", "-p", "no:cacheprovider"]
    if options.conformance_filter:
        command += ["-k", options.conformance_filter]
    env = dict(os.environ)
    env[url_variable] = result.scratch.url
    # The subprocess imports this very tablequeue, not another one installed elsewhere.
    package_parent = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    progress(f"selftest: {mode.label}: conformance suite, {' '.join(command[1:])} with {url_variable} "
             "set to the scratch database")
    clock = time.monotonic()
    sys.stdout.flush()
    try:
        # From the suite's folder: without a configuration file above it, pytest's root (and so the
        # JUnit class names the report lists) is then the suite's folder, not the folder it shares
        # with wherever selftest was started (a checkout under /tmp: /tmp).
        completed = subprocess.run(command, env=env, check=False, cwd=tests_dir)
        return _conformance_outcome(junit_path, completed.returncode, time.monotonic() - clock)
    finally:
        junit_path.unlink(missing_ok=True)


def _conformance_outcome(junit_path: Path, returncode: int, seconds: float) -> HalfRun:
    try:
        root = ET.parse(junit_path).getroot()
    except (OSError, ET.ParseError):
        return HalfRun("conformance", "error",
                       f"pytest exited with code {returncode} and wrote no JUnit file", seconds=seconds)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases = [case for suite in suites for case in suite.iter("testcase")]
    failures, skipped = [], 0
    for case in cases:
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            failures.append(f"{name}: {_first_line(problem.get('message') or problem.text or '')}")
        elif case.find("skipped") is not None:
            skipped += 1
    half = HalfRun("conformance", "passed", tests=len(cases), passed=len(cases) - len(failures) - skipped,
                   failed=len(failures), skipped=skipped, seconds=seconds, failures=failures, suites=suites)
    if returncode not in (0, 1):
        # 2 interrupted, 3 internal error, 4 usage error, 5 no test selected
        half.status, half.reason = "error", f"pytest exited with code {returncode}"
    elif half.tests - half.skipped == 0:
        half.status, half.reason = "error", "no conformance test ran (all deselected or skipped)"
    elif failures or returncode == 1:
        half.status = "failed"
        half.reason = f"{len(failures)} of {half.tests} tests failed"
    return half


# --- cleanup ---------------------------------------------------------------------------------

def _cleanup(result: SelftestResult, connect: Connect, options: SelftestOptions,
             tsqlt_preinstalled: bool, progress: Callable[[str], None]) -> None:
    scratch, dialect = result.scratch, result.target.dialect
    if options.keep:
        scratch.cleanup = f"kept (--keep): {_drop_hint(result)}"
        progress(f"selftest: {scratch.cleanup}")
        return
    try:
        if scratch.kind == "database":
            with _connection(connect, _admin_url(options.url, dialect), autocommit=True) as conn:
                if dialect == "mssql":
                    _execute(conn, f"ALTER DATABASE {_bracket(scratch.database)} "
                                   "SET SINGLE_USER WITH ROLLBACK IMMEDIATE;")
                    _execute(conn, f"DROP DATABASE {_bracket(scratch.database)};")
                else:
                    conn.execute(f'DROP DATABASE IF EXISTS "{scratch.database}" WITH (FORCE)')
                    # the scratch schema's roles belong to the cluster and outlive the database
                    dialect_for(dialect).drop_schema(conn, scratch.schema)
        else:
            with _connection(connect, scratch.url, autocommit=True) as conn:
                if dialect == "mssql":
                    _drop_tsqlt_classes(result, conn, tsqlt_preinstalled)
                dialect_for(dialect).drop_schema(conn, scratch.schema)
    except Exception as exc:  # noqa: BLE001 - reported with how to finish the job by hand
        result.cleanup_failed = True
        scratch.cleanup = f"cleanup FAILED: {_one_line(exc)}; {_drop_hint(result)}"
    else:
        scratch.cleanup = "dropped"
    progress(f"selftest: scratch {scratch.kind} {_scratch_name(scratch)} {scratch.cleanup}")


def _drop_tsqlt_classes(result: SelftestResult, conn: Any, tsqlt_preinstalled: bool) -> None:
    """In someone's database: drop the test classes this run created, and tSQLt if it installed it."""
    ran_tsqlt = any(half.name == "tSQLt" and half.status in ("passed", "failed", "error")
                    for mode in result.modes for half in mode.halves)
    if not ran_tsqlt or not _scalar(conn, MSSQL_TSQLT_INSTALLED_SQL):
        return
    classes = [(rendered.name, rendered.text) for rendered in render_tsqlt(result.catalog)]
    for test_class in dict.fromkeys(schema for schema, _ in find_tsqlt_tests(classes)):
        _execute(conn, "IF SCHEMA_ID(?) IS NOT NULL EXEC tSQLt.DropClass @ClassName = ?;", test_class, test_class)
    if not tsqlt_preinstalled:
        _execute(conn, "EXEC tSQLt.Uninstall;")


def _scratch_name(scratch: Scratch) -> str:
    return scratch.database if scratch.kind == "database" else scratch.schema


def _drop_hint(result: SelftestResult) -> str:
    scratch = result.scratch
    if scratch.kind == "schema":
        return (f"drop schema {scratch.schema} of database {scratch.database} with what is in it "
                f"(and the roles {scratch.schema}_producer, _consumer, _admin, _owner)")
    if result.target.dialect == "mssql":
        return (f"drop it with ALTER DATABASE {_bracket(scratch.database)} SET SINGLE_USER WITH ROLLBACK "
                f"IMMEDIATE; DROP DATABASE {_bracket(scratch.database)};")
    return (f'drop it with DROP DATABASE "{scratch.database}" WITH (FORCE); and the roles '
            f"{scratch.schema}_producer, _consumer, _admin, _owner")


# --- JUnit and the report --------------------------------------------------------------------

def junit_document(result: SelftestResult) -> ET.Element:
    """One <testsuites> for the whole run: every half of every mode, the suites renamed
    <mode>.<half>.<suite> and the test classes prefixed the same way, so the two RCSI runs of a test
    are two test cases; the deploy, and each half that did not run or broke, are test cases too."""
    root = ET.Element("testsuites", name="tablequeue selftest")
    _step_suite(root, "selftest.deploy", "deploy", "passed" if result.deploy_status == "passed" else "error",
                result.deploy_detail, result.deploy_seconds)
    for mode in result.modes:
        for half in mode.halves:
            prefix = f"{mode.junit_prefix}.{half.name.lower()}"
            if not half.suites or half.status == "error":
                _step_suite(root, prefix, half.name, half.status, half.reason, half.seconds)
            for suite in half.suites:
                renamed = ET.SubElement(root, "testsuite", dict(suite.attrib))
                renamed.set("name", f"{prefix}.{suite.get('name', half.name)}")
                for case in suite.iter("testcase"):
                    copy = ET.SubElement(renamed, "testcase", dict(case.attrib))
                    copy.set("classname", f"{prefix}.{case.get('classname', '')}")
                    copy.extend(list(case))
    cases = list(root.iter("testcase"))
    root.set("tests", str(len(cases)))
    root.set("failures", str(sum(case.find("failure") is not None for case in cases)))
    root.set("errors", str(sum(case.find("error") is not None for case in cases)))
    root.set("skipped", str(sum(case.find("skipped") is not None for case in cases)))
    root.set("time", f"{result.total_seconds:.3f}")
    return root


def _step_suite(root: ET.Element, name: str, case_name: str, status: str, detail: str, seconds: float) -> None:
    suite = ET.SubElement(root, "testsuite", name=name, tests="1", time=f"{seconds:.3f}",
                          failures="0", errors="1" if status == "error" else "0",
                          skipped="1" if status in ("not run", "not applicable") else "0")
    case = ET.SubElement(suite, "testcase", classname=name, name=case_name, time=f"{seconds:.3f}")
    if status == "error":
        ET.SubElement(case, "error", message=detail).text = detail
    elif status in ("not run", "not applicable"):
        ET.SubElement(case, "skipped", message=f"{status}: {detail}")


def _write_xml(root: ET.Element, path: Path) -> None:
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def markdown_report(result: SelftestResult) -> str:
    """A short report a DBA can paste into an issue."""
    facts, scratch = result.facts, result.scratch
    verdict = "passed" if result.exit_code == 0 else "FAILED"
    rows: list[tuple[str, str]] = [
        ("tablequeue", f"{version()}; catalog {result.catalog.path} ({len(result.catalog.queues)} queues)"),
        ("server", facts.version),
        ("product version", facts.product_version),
    ]
    if facts.dialect == "mssql":
        clr = ("available" if facts.has_clr else "not available on this platform")
        if facts.has_clr:
            clr += (f"; clr enabled = {_flag(facts.clr_enabled)}, "
                    f"clr strict security = {_flag(facts.clr_strict_security)}")
        rows += [
            ("edition", f"{facts.edition} (EngineEdition {facts.engine_edition})"),
            (f"database {facts.database} (the URL's)",
             f"RCSI {'on' if facts.rcsi else 'off'}, compatibility level {facts.compatibility_level}"),
            ("CLR (tSQLt)", clr),
        ]
    scratch_text = f"{scratch.kind} {_scratch_name(scratch)}"
    if scratch.kind == "schema":
        scratch_text += f" in database {scratch.database}"
    if scratch.compatibility_level is not None:
        scratch_text += f", compatibility level {scratch.compatibility_level}"
    rows += [
        ("scratch", f"{scratch_text}; {scratch.cleanup}"),
        ("RCSI runs", ", ".join(mode.label for mode in result.modes) if facts.dialect == "mssql"
         else "not applicable (PostgreSQL)"),
        ("deploy", f"{result.deploy_status}: {result.deploy_detail} ({result.deploy_seconds:.1f} s)"),
        ("started (UTC)", f"{result.started:%Y-%m-%d %H:%M:%S}"),
        ("total", f"{result.total_seconds:.1f} s"),
    ]
    lines = [f"## tablequeue selftest: {verdict}", "", "| | |", "|---|---|"]
    lines += [f"| {_cell(key)} | {_cell(value)} |" for key, value in rows]
    lines += ["", "| mode | half | result | tests | passed | failed | skipped | seconds |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for mode in result.modes:
        for half in mode.halves:
            cells = [mode.label, half.name, _cell(_status_text(half))]
            if half.tests or half.status in ("passed", "failed"):
                cells += [str(half.tests), str(half.passed), str(half.failed), str(half.skipped),
                          f"{half.seconds:.1f}"]
            else:
                cells += ["", "", "", "", f"{half.seconds:.1f}" if half.seconds else ""]
            lines.append("| " + " | ".join(cells) + " |")
    failures = [(mode.label, half) for mode in result.modes for half in mode.halves if half.failures]
    if failures:
        lines += ["", "### Failures", ""]
        for label, half in failures:
            for failure in half.failures[:FAILURES_LISTED]:
                lines.append(f"- {label}, {half.name}: {_cell(failure)}")
            if len(half.failures) > FAILURES_LISTED:
                lines.append(f"- {label}, {half.name}: {len(half.failures) - FAILURES_LISTED} more "
                             "in the JUnit file")
    return "\n".join(lines) + "\n"


def _status_text(half: HalfRun) -> str:
    if half.status == "passed":
        return "passed"
    if half.status == "failed":
        return f"FAILED ({half.failed} of {half.tests})"
    if half.status == "error":
        return f"ERROR: {half.reason}"
    return f"{half.status}: {half.reason}"


def _flag(value: bool | None) -> str:
    return "unknown" if value is None else str(int(value))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _first_line(text: str) -> str:
    stripped = (text or "").strip()
    return stripped.splitlines()[0] if stripped else ""


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(server_message(exc).split())}"
