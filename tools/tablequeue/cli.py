"""Command line: tablequeue render | deploy | script | status | test-tsql | check-tsql | demo.

Exit codes: 0 success; 1 a database or runtime error; 2 invalid input (catalog, arguments);
3 deploy refused (a change that would drop or rebuild a queue table).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .catalog import Catalog, CatalogError, load_catalog
from .render import DIALECTS, RenderError, Unit, render_catalog, render_tsqlt, write_files

EXIT_ERROR, EXIT_INVALID, EXIT_REFUSED = 1, 2, 3


def _units(catalog: Catalog, dialect: str) -> list[Unit]:
    return [unit for rendered in render_catalog(catalog, dialect) for unit in rendered.units]


def cmd_render(args: argparse.Namespace) -> int:
    catalog = load_catalog(args.catalog)
    files = render_tsqlt(catalog) if args.tsqlt else render_catalog(catalog, args.dialect)
    for path in write_files(files, Path(args.out)):
        print(path)
    return 0


def _connect(url: str):
    from .engines import connect, parse_url

    target = parse_url(url)
    return target, connect(url, autocommit=target.dialect == "postgres")


def cmd_deploy(args: argparse.Namespace) -> int:
    from .deploy import DeployRefused, deploy
    from .engines import dialect_for

    catalog = load_catalog(args.catalog)
    target, conn = _connect(args.url)
    units = _units(catalog, target.dialect)
    try:
        result = deploy(conn, dialect_for(target.dialect), catalog.schema, units, dry_run=args.dry_run,
                        lock_timeout_seconds=args.lock_timeout, progress=print)
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
    from .script import mssql_script, postgres_script

    catalog = load_catalog(args.catalog)
    builder = mssql_script if args.dialect == "mssql" else postgres_script
    text = builder(catalog.schema, _units(catalog, args.dialect), args.catalog)
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

    catalog = load_catalog(args.catalog)
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

    return run_demo(args.catalog, args.messages, args.spark)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tablequeue", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="render a catalog to SQL files")
    p.add_argument("--catalog", required=True)
    p.add_argument("--dialect", choices=DIALECTS, default="mssql")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tsqlt", action="store_true", help="render the tSQLt test classes instead")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("deploy", help="apply what changed to a database")
    p.add_argument("--catalog", required=True)
    p.add_argument("--url", required=True, help="postgresql://... or mssql+pyodbc://...")
    p.add_argument("--dry-run", action="store_true", help="print the plan, apply nothing")
    p.add_argument("--lock-timeout", type=int, default=300, help="seconds to wait for another deploy")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("script", help="write one script a DBA can review and run by hand")
    p.add_argument("--catalog", required=True)
    p.add_argument("--dialect", choices=DIALECTS, default="mssql")
    p.add_argument("--out", required=True)
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
    p.add_argument("--catalog", default="database/queues.yml")
    p.add_argument("--junit", help="write JUnit XML here")
    p.set_defaults(func=cmd_test_tsql)

    p = sub.add_parser("check-tsql", help="resolve every reference of rendered T-SQL and run the static rules")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="T-SQL files, Python modules (their SQL strings), or directories of both")
    p.set_defaults(func=cmd_check_tsql)

    p = sub.add_parser("demo", help="deploy the catalog to a throwaway PostgreSQL and run every queue")
    p.add_argument("--catalog", default="database/queues.yml")
    p.add_argument("--messages", type=int, default=2000, help="messages per queue")
    p.add_argument("--spark", action="store_true", help="also run the PySpark pipeline loop")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CatalogError as exc:
        print(f"tablequeue: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except (RenderError, OSError) as exc:
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
