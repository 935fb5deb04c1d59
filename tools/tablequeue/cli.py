"""Command line: tablequeue render | deploy | script | status | test-tsql | selftest | check-tsql | demo |
worker | stats | metrics.

Exit codes: 0 success; 1 a database or runtime error; 2 invalid input (catalog, arguments);
3 deploy refused (a change no migration can make without losing messages).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .catalog import Catalog, CatalogError, load_catalog
from .distribution import DistributionError, example_catalog, version
from .render import DIALECTS, RenderError, Unit, render_catalog, render_migrations, render_tsqlt, write_files

EXIT_ERROR, EXIT_INVALID, EXIT_REFUSED = 1, 2, 3
# A second SIGTERM or SIGINT: the shell's code for a process ended by Ctrl-C.
EXIT_INTERRUPTED = 130
EXAMPLE_CATALOG_HELP = "default: the example catalog, database/queues.yml (a copy ships in the package)"


def _units(catalog: Catalog, dialect: str) -> list[Unit]:
    return [unit for rendered in render_catalog(catalog, dialect) for unit in rendered.units]


def cmd_render(args: argparse.Namespace) -> int:
    catalog = load_catalog(args.catalog)
    if args.tsqlt:
        files = render_tsqlt(catalog)
    elif args.migrations:
        files = render_migrations(catalog, args.dialect)
    else:
        files = render_catalog(catalog, args.dialect)
    for path in write_files(files, Path(args.out)):
        print(path)
    return 0


def _connect(url: str):
    from .engines import connect, parse_url

    target = parse_url(url)
    return target, connect(url, autocommit=target.dialect == "postgres")


def cmd_deploy(args: argparse.Namespace) -> int:
    from .deploy import DeployRefused, LockPolicy, deploy
    from .engines import dialect_for

    catalog = load_catalog(args.catalog)
    target, conn = _connect(args.url)
    units = _units(catalog, target.dialect)
    try:
        result = deploy(conn, dialect_for(target.dialect), catalog.schema, units, dry_run=args.dry_run,
                        lock_timeout_seconds=args.lock_timeout, progress=print, share_roles=args.share_roles,
                        lock_policy=LockPolicy(args.ddl_lock_timeout, args.ddl_retry_for))
    except DeployRefused as exc:
        print(f"tablequeue deploy: refused, nothing was applied to {target.describe()}:\n{exc}",
              file=sys.stderr)
        return EXIT_REFUSED
    finally:
        conn.close()
    if args.dry_run:
        print(f"plan for {target.describe()} (dry run, nothing applied):")
        print(result.plan.describe())
    else:
        print(f"deployed {catalog.path} to {target.describe()}: {len(result.applied)} unit(s) applied, "
              f"{len(result.plan.items) - len(result.applied)} unchanged")
    return 0


def cmd_script(args: argparse.Namespace) -> int:
    from .deploy import LockPolicy, make_plan, plan_against
    from .engines import dialect_for, parse_url
    from .script import build_script

    catalog = load_catalog(args.catalog)
    policy = LockPolicy(args.ddl_lock_timeout, args.ddl_retry_for)
    dialect = args.dialect or (parse_url(args.url).dialect if args.url else "mssql")
    if args.url and parse_url(args.url).dialect != dialect:
        print(f"tablequeue script: --dialect {dialect} does not match the database {parse_url(args.url).describe()}",
              file=sys.stderr)
        return EXIT_INVALID
    units = _units(catalog, dialect)
    engine = dialect_for(dialect)
    type_parts, replaced = {}, {}
    if args.url:
        target, conn = _connect(args.url)
        try:
            plan = plan_against(conn, engine, catalog.schema, units, policy)
            type_parts = {item.unit.name: engine.type_recreate_parts(conn, item.unit, list(item.recreates))
                          for item in plan.changes if item.unit.object == "type" and item.action == "migrate"}
            replaced = {item.unit.name: engine.routines(conn, item.unit.name)
                        for item in plan.changes if item.unit.type == "code" and item.action == "update"}
        finally:
            conn.close()
        source = f"{args.catalog}, planned against {target.describe()}"
    else:
        plan = make_plan(units, [], lock_policy=policy)
        source = f"{args.catalog}, a fresh install"
    if plan.refused:
        reasons = dict.fromkeys(item.reason for item in plan.refused)
        print("tablequeue script: refused, no script written:\n" + "\n".join(reasons), file=sys.stderr)
        return EXIT_REFUSED
    text = build_script(dialect, catalog.schema, plan, source, fresh=not args.url, type_parts=type_parts,
                        concurrent_sql=engine.concurrent_index_sql, replaced=replaced)
    Path(args.out).write_text(text, encoding="utf-8")
    print(args.out)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .deploy import status
    from .engines import dialect_for

    target, conn = _connect(args.url)
    try:
        schema = args.schema
        units = None
        if args.catalog:
            catalog = load_catalog(args.catalog)
            schema, units = catalog.schema, _units(catalog, target.dialect)
        rows = status(conn, dialect_for(target.dialect), schema, units)
    finally:
        conn.close()
    if not rows:
        print(f"nothing deployed in schema '{schema}' of {target.describe()}")
        return 0
    width = max(len(row.unit_name) for row in rows)
    print(f"{'unit':<{width}}  {'type':<7}  {'applied_at':<26}  {'by':<16}  state")
    for row in rows:
        applied = str(row.applied_at or "")[:26]
        print(f"{row.unit_name:<{width}}  {row.unit_type:<7}  {applied:<26}  {str(row.applied_by or ''):<16}  "
              f"{row.state}")
    drifted = [row for row in rows if row.state.startswith(("drift", "missing"))]
    if drifted:
        print(f"{len(drifted)} object(s) differ from what tablequeue applied", file=sys.stderr)
        return EXIT_ERROR
    return 0


def cmd_test_tsql(args: argparse.Namespace) -> int:
    from .deploy import deploy
    from .engines import connect, dialect_for, parse_url
    from .tsqlt import count_tsqlt_tests, run_tsqlt

    catalog = load_catalog(args.catalog or example_catalog())
    classes = [(f.name, f.text) for f in render_tsqlt(catalog)]
    url = args.url or os.environ.get("TABLEQUEUE_MSSQL_URL")
    installer_path = args.tsqlt or os.environ.get("TABLEQUEUE_TSQLT")
    if not url:
        if not args.if_configured:
            print("tablequeue test-tsql: --url (or TABLEQUEUE_MSSQL_URL) is required", file=sys.stderr)
            return EXIT_INVALID
        print(f"tSQLt: {count_tsqlt_tests(classes)} test(s) in {len(classes)} class(es) did NOT run: "
              "no SQL Server configured (TABLEQUEUE_MSSQL_URL is not set)")
        return 0
    if not installer_path:
        print("tablequeue test-tsql: SQL Server is configured but not tSQLt: pass --tsqlt PATH/tSQLt.class.sql "
              "or set TABLEQUEUE_TSQLT", file=sys.stderr)
        return EXIT_INVALID
    if parse_url(url).dialect != "mssql":
        print("tablequeue test-tsql: the URL must be a SQL Server URL (mssql+pyodbc://...)", file=sys.stderr)
        return EXIT_INVALID
    conn = connect(url, autocommit=False)
    try:
        deploy(conn, dialect_for("mssql"), catalog.schema, _units(catalog, "mssql"), progress=print)
        conn.autocommit = True
        installer = Path(installer_path).read_text(encoding="utf-8-sig")
        prepare_path = args.prepare_server or os.environ.get("TABLEQUEUE_TSQLT_PREPARE")
        prepare = Path(prepare_path).read_text(encoding="utf-8-sig") if prepare_path else None
        result = run_tsqlt(conn, installer, classes, Path(args.junit) if args.junit else None,
                           prepare_server_script=prepare)
    finally:
        conn.close()
    print(f"tSQLt on SQL Server ({parse_url(url).describe()}): {result.passed} passed, {result.failed} failed, "
          f"{result.errors} errors, {result.skipped} skipped")
    return result.exit_code


def cmd_selftest(args: argparse.Namespace) -> int:
    from .engines import parse_url
    from .selftest import (
        DEFAULT_CATALOG, SelftestError, SelftestInvalid, SelftestOptions, markdown_report, run_selftest,
    )

    mssql = parse_url(args.url).dialect == "mssql"
    # The environment's tSQLt paths are for SQL Server URLs; only the options are refused for PostgreSQL.
    installer = args.tsqlt or (os.environ.get("TABLEQUEUE_TSQLT") if mssql else None)
    prepare = args.prepare_server or (os.environ.get("TABLEQUEUE_TSQLT_PREPARE") if mssql else None)
    options = SelftestOptions(
        url=args.url, catalog=Path(args.catalog) if args.catalog else DEFAULT_CATALOG,
        tsqlt_installer=Path(installer) if installer else None,
        prepare_server=Path(prepare) if prepare else None,
        scratch=args.scratch, rcsi=args.rcsi, keep=args.keep,
        junit=Path(args.junit) if args.junit else None, report=Path(args.report) if args.report else None,
        conformance_filter=args.conformance_filter,
    )
    try:
        result = run_selftest(options, progress=lambda line: print(line, flush=True))
    except SelftestInvalid as exc:
        print(f"tablequeue selftest: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except SelftestError as exc:
        print(f"tablequeue selftest: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print()
    print(markdown_report(result))
    print(result.summary())
    return result.exit_code


def cmd_check_tsql(args: argparse.Namespace) -> int:
    from .tsqlcheck import check_paths

    try:
        report = check_paths(args.paths)
    except (FileNotFoundError, UnicodeDecodeError) as exc:
        print(f"tablequeue check-tsql: {exc}", file=sys.stderr)
        return EXIT_INVALID
    for line in sorted(report.findings, key=lambda f: (f.file, f.line)) + sorted(
            report.violations, key=lambda v: (v.file, v.line)):
        print(line)
    procedures = sum(1 for s in report.signatures)
    print(f"check-tsql: {report.files} file(s), {len(report.batches)} batch(es), {procedures} procedure(s): "
          f"{len(report.findings)} unresolved reference(s), {len(report.violations)} rule violation(s)")
    if report.skipped:
        print(f"skipped, {len(report.skipped)} reference(s) known only at run time or statement(s) not modelled:")
        for finding in report.skipped:
            print(f"  {finding}")
    return 0 if report.clean else EXIT_ERROR


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.catalog or example_catalog(), args.messages, args.spark)


def _log_to_stderr() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)


def _until_signalled(on_signal) -> None:
    """Call on_signal at the first SIGTERM or SIGINT (systemd's stop, Ctrl-C); a second one exits at
    once with 130 (what is still leased waits for its leases to expire)."""
    import signal

    signalled = []

    def handle(number: int, _frame: Any) -> None:
        if signalled:
            print(f"tablequeue: {signal.Signals(number).name} again: exiting without waiting", file=sys.stderr,
                  flush=True)
            os._exit(EXIT_INTERRUPTED)
        signalled.append(number)
        on_signal()

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, handle)


def cmd_worker(args: argparse.Namespace) -> int:
    from .worker import Worker, WorkerError

    catalog = load_catalog(args.catalog)
    try:
        worker = Worker(args.url, catalog, args.queue, args.handler, concurrency=args.concurrency,
                        batch_size=args.batch_size, worker_name=args.worker_name, grace_seconds=args.grace_seconds,
                        transactional=args.transactional, metrics_port=args.metrics_port,
                        handler_timeout_seconds=args.handler_timeout)
    except WorkerError as exc:
        print(f"tablequeue worker: {exc}", file=sys.stderr)
        return EXIT_INVALID
    _log_to_stderr()
    _until_signalled(worker.stop)
    try:
        worker.run()
    except WorkerError as exc:
        print(f"tablequeue worker: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    import time
    from datetime import datetime, timezone

    from .engines import connect, parse_url
    from .stats import StatsError, find_queues, format_table, read_stats, to_json

    catalog = load_catalog(args.catalog) if args.catalog else None
    target = parse_url(args.url)
    conn = connect(args.url, autocommit=True)
    try:
        while True:
            rows = read_stats(conn, target.dialect, find_queues(conn, target.dialect, catalog))
            at = datetime.now(timezone.utc).isoformat(timespec="seconds")
            if args.json:
                print(to_json(rows, at), flush=True)
            elif not rows:
                print(f"no queues whose stats this login may call in {target.describe()}", flush=True)
            else:
                print((f"{at}\n" if args.watch else "") + format_table(rows), flush=True)
            if not args.watch:
                return 0
            time.sleep(args.watch)
            if not args.json:
                print(flush=True)
    except StatsError as exc:
        print(f"tablequeue stats: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 0
    finally:
        conn.close()


def cmd_metrics(args: argparse.Namespace) -> int:
    import threading

    from .engines import parse_url
    from .metrics import serve

    catalog = load_catalog(args.catalog) if args.catalog else None
    _log_to_stderr()
    server, collector = serve(args.url, args.port, catalog, args.timeout)
    stopped = threading.Event()
    _until_signalled(stopped.set)
    print(f"tablequeue metrics: serving http://0.0.0.0:{server.server_port}/metrics for "
          f"{parse_url(args.url).describe()}", flush=True)
    stopped.wait()
    server.shutdown()
    server.server_close()
    collector.close()
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def _lock_policy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ddl-lock-timeout", type=_positive, default=2.0,
                   help="seconds a step waits for a lock on a queue's table before it gives way to the queue's "
                        "traffic and retries (default 2)")
    p.add_argument("--ddl-retry-for", type=_positive, default=600.0,
                   help="seconds a step keeps retrying, and a concurrent index build waits, before the deploy "
                        "stops (default 600)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tablequeue", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="render a catalog to SQL files")
    p.add_argument("--catalog", required=True)
    p.add_argument("--dialect", choices=DIALECTS, default="mssql")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tsqlt", action="store_true", help="render the tSQLt test classes instead")
    p.add_argument("--migrations", action="store_true",
                   help="render every migration the catalog's storage can take instead (for review and lint)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("deploy", help="apply what changed to a database")
    p.add_argument("--catalog", required=True)
    p.add_argument("--url", required=True, help="postgresql://... or mssql+pyodbc://...")
    p.add_argument("--dry-run", action="store_true", help="print the plan, apply nothing")
    p.add_argument("--share-roles", action="store_true",
                   help="PostgreSQL: let the schema's roles (cluster-wide) also serve a same-named schema that "
                        "another database of the cluster deployed; refused otherwise")
    p.add_argument("--lock-timeout", type=int, default=300, help="seconds to wait for another deploy")
    _lock_policy_arguments(p)
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("script", help="write one script a DBA can review and run by hand")
    p.add_argument("--catalog", required=True)
    p.add_argument("--dialect", choices=DIALECTS, help="default: the --url's, else mssql")
    p.add_argument("--url", help="plan against this database (read only): the script holds its migrations")
    p.add_argument("--out", required=True)
    _lock_policy_arguments(p)
    p.set_defaults(func=cmd_script)

    p = sub.add_parser("status", help="what is deployed, and drift")
    p.add_argument("--url", required=True)
    p.add_argument("--catalog", help="also compare with this catalog")
    p.add_argument("--schema", default="queue", help="schema when no catalog is given")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("test-tsql", help="deploy, install tSQLt, run the rendered test classes")
    p.add_argument("--url", help="SQL Server URL (default: $TABLEQUEUE_MSSQL_URL)")
    p.add_argument("--tsqlt", help="path to tSQLt.class.sql (default: $TABLEQUEUE_TSQLT)")
    p.add_argument("--if-configured", action="store_true",
                   help="without a SQL Server, print how many tSQLt tests did not run and exit 0")
    p.add_argument("--prepare-server", help="path to tSQLt's PrepareServer.sql (SQL Server 2017+)")
    p.add_argument("--catalog", help=EXAMPLE_CATALOG_HELP)
    p.add_argument("--junit", help="write JUnit XML here")
    p.set_defaults(func=cmd_test_tsql)

    p = sub.add_parser("selftest", help="on your server: scratch database, deploy, tSQLt and the conformance "
                                        "suite, a JUnit file and a markdown report, then drop it all")
    p.add_argument("--url", required=True, help="mssql+pyodbc://... or postgresql://...")
    p.add_argument("--tsqlt", help="path to tSQLt.class.sql (default: $TABLEQUEUE_TSQLT; SQL Server only)")
    p.add_argument("--prepare-server", help="path to tSQLt's PrepareServer.sql (default: $TABLEQUEUE_TSQLT_PREPARE)")
    p.add_argument("--catalog", help="the catalog to deploy and test (default: the built-in catalog with "
                                     "every kind and option)")
    p.add_argument("--scratch", choices=("database", "schema"), default="database",
                   help="create a scratch database (default), or only a scratch schema in the URL's database")
    p.add_argument("--rcsi", choices=("on", "off", "both"),
                   help="READ_COMMITTED_SNAPSHOT of the scratch database (default: both, one run each)")
    p.add_argument("--keep", action="store_true", help="do not drop the scratch database or schema")
    p.add_argument("--junit", help="write one JUnit XML file with every test of the run here")
    p.add_argument("--report", help="write the markdown report here (it is printed too)")
    p.add_argument("--conformance-filter", metavar="EXPR",
                   help="run only the conformance tests matching this pytest -k expression")
    p.set_defaults(func=cmd_selftest)

    p = sub.add_parser("check-tsql", help="resolve every reference of rendered T-SQL and run the static rules")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="T-SQL files, Python modules (their SQL strings), or directories of both")
    p.set_defaults(func=cmd_check_tsql)

    p = sub.add_parser("worker", help="consume a work queue with a Python handler (docs/operations.md)")
    p.add_argument("--url", required=True, help="postgresql://... or mssql+pyodbc://...")
    p.add_argument("--catalog", required=True, help="the catalog that deployed the queue")
    p.add_argument("--queue", required=True, help="a work queue of the catalog")
    p.add_argument("--handler", required=True, metavar="PACKAGE.MODULE:FUNCTION",
                   help="called with each message (tablequeue.worker.Message); raising fails the attempt")
    p.add_argument("--concurrency", type=int, default=1,
                   help="slots: threads with a connection and a worker name each, NAME/1..NAME/N (default 1)")
    p.add_argument("--batch-size", type=int, default=10,
                   help="messages a slot leases at once and acknowledges together, 1..1000 (default 10)")
    p.add_argument("--worker-name", help="NAME of the slots NAME/1..NAME/N; keep it across restarts so a "
                                         "restarted worker gets its unfinished messages back (default: the host name)")
    p.add_argument("--grace-seconds", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, how long running handlers may take to finish before what is left "
                        "is released (default 30)")
    p.add_argument("--transactional", action="store_true",
                   help="run the handler and complete in one transaction on the handler's connection "
                        "(message.connection): its writes and the ack commit together")
    p.add_argument("--handler-timeout", type=_positive, metavar="SECONDS",
                   help="once a handler has run this long its lease is no longer extended: it expires, the attempt "
                        "counts and the message goes to another consumer (default: no limit)")
    p.add_argument("--metrics-port", type=int,
                   help="serve the worker's Prometheus counters on this port (0: any free port)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("stats", help="one row per queue: ready, delayed, in flight, dead, oldest ready age")
    p.add_argument("--url", required=True)
    p.add_argument("--catalog", help="the catalog's queues with their exact kinds (default: every queue the login "
                                     "may call stats on; heap, fifo and lifo then show as heap|fifo|lifo)")
    p.add_argument("--watch", type=_positive, metavar="SECONDS", help="print again every SECONDS until Ctrl-C")
    p.add_argument("--json", action="store_true", help='one JSON line per reading: {"at": ..., "queues": [...]}')
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("metrics", help="a Prometheus endpoint with every queue's stats, read at scrape time")
    p.add_argument("--url", required=True)
    p.add_argument("--port", type=int, required=True, help="port of the endpoint /metrics (0: any free port)")
    p.add_argument("--catalog", help="as for stats")
    p.add_argument("--timeout", type=_positive, default=5.0,
                   help="seconds a scrape may take to connect and to run each stats call (default 5)")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("demo", help="deploy the catalog to a throwaway PostgreSQL and run every queue")
    p.add_argument("--catalog", help=EXAMPLE_CATALOG_HELP)
    p.add_argument("--messages", type=int, default=2000, help="messages per queue")
    p.add_argument("--spark", action="store_true", help="also run the PySpark pipeline loop")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except CatalogError as exc:
        print(f"tablequeue: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except (RenderError, DistributionError, OSError) as exc:
        print(f"tablequeue: {exc}", file=sys.stderr)
        return EXIT_INVALID if isinstance(exc, RenderError) else EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - a DBA gets one line, not a traceback
        if os.environ.get("TABLEQUEUE_DEBUG"):
            raise
        one_line = " ".join(str(exc).split())
        print(f"tablequeue: {type(exc).__name__}: {one_line}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
