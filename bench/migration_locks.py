"""How long each migration step takes, and so holds its lock, on a queue of a million messages
(PostgreSQL, a throwaway embedded server). docs/upgrades.md quotes a run.

    python -m bench.migration_locks              # 1,000,000 rows per queue
    python -m bench.migration_locks --rows 100000 --only "0.1.0"

Each scenario deploys a catalog, loads the rows straight into the queue table (and a thousand dead
letters), deploys the changed catalog and reads every step's duration from the deploy's progress
lines. The storage upgrade scenario deploys the kept release 0.1.0 (tests/fixtures/releases/, applied
as 0.1.0's own deploy did) with a thousand of its messages leased, and upgrades it to this release. A transaction step holds its lock for its whole duration; a concurrent step blocks no reads
or writes however long it takes.
"""
from __future__ import annotations

import argparse
import re
import secrets
import time
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tablequeue.catalog import parse_catalog
from tablequeue.deploy import deploy
from tablequeue.embedded import postgres_url
from tablequeue.engines import connect, dialect_for
from tablequeue.render import render_catalog

# The kept releases and 0.1.0's own deploy live with the upgrade tests; the bench reuses them.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from releases import RELEASES, deploy_v010, release_units  # noqa: E402

STEP_LINE = re.compile(r"^\s+(?P<migration>\S+) (?P<number>\d+/\d+) (?P<what>.*) \((?P<ms>\d+) ms\)$")


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    before: dict
    after: dict
    skip_units: tuple[str, ...] = ()   # units left out of the first deploy (a unit added by a later release)
    release: str | None = None         # deploy this kept release's work queue first, upgrade it unchanged


SCENARIOS = (
    Scenario("heap: dedupe on", "heap", {}, {"dedupe": True}),
    Scenario("work: dedupe on", "work", {}, {"dedupe": True}),
    Scenario("work: priority on", "work", {}, {"priority": True}),
    Scenario("work: dedupe off", "work", {"dedupe": True}, {}),
    Scenario("work: priority off", "work", {"priority": True}, {}),
    Scenario("work: a new index unit (ix_Q_lease_start)", "work", {}, {}, skip_units=("_lease_start",)),
    Scenario("work: 0.1.0 (storage v1) to this release (v3)", "work", {}, {}, release="0.1.0"),
)
RELEASE_QUEUE = "emails"   # the kept catalog's work queue with dedupe and history, renamed `q` here


def _units(schema: str, kind: str, options: dict):
    catalog = parse_catalog({"schema": schema, "queues": [{"name": "q", "kind": kind, "options": options}]})
    return [u for f in render_catalog(catalog, "postgres") for u in f.units]


def _deploy_release(conn, scenario: Scenario, schema: str) -> dict:
    """The kept release's work queue (its framework and that queue's units), its table named `q`;
    returns the queue's options, which the upgrade deploys unchanged."""
    word = rf"(?<![A-Za-z0-9]){RELEASE_QUEUE}(?![A-Za-z0-9])"
    units = [u for u in release_units(scenario.release, "postgres", "queues", schema)
             if u.queue in (None, RELEASE_QUEUE)]
    deploy_v010(conn, "postgres", [type(u)(re.sub(word, "q", u.name), u.type, u.queue and "q",
                                            re.sub(word, "q", u.body)) for u in units], schema)
    kept = yaml.safe_load((RELEASES / scenario.release / "queues.yml").read_text())
    return next(q for q in kept["queues"] if q["name"] == RELEASE_QUEUE).get("options") or {}


def _load(conn, schema: str, kind: str, rows: int, options: dict, leased: int = 0) -> None:
    table = f'"{schema}"."q"'
    if leased:
        # A thousand messages a worker holds when the upgrade runs: the new claim index leaves them out.
        conn.execute(f"INSERT INTO {table} (due_at, visible_at, attempts, leased_by, leased_at, payload) "
                     f"SELECT now(), now() + interval '10 minutes', 1, 'worker-' || (g % 4), now(), "
                     f"jsonb_build_object('n', g) FROM generate_series(1, {leased}) AS g")
    if kind == "work":
        conn.execute(f"INSERT INTO {table} (due_at, visible_at, payload) "
                     f"SELECT now(), now(), jsonb_build_object('n', g) FROM generate_series(1, {rows}) AS g")
        priority = ("priority, ", "0, ") if options.get("priority") else ("", "")
        conn.execute(f'INSERT INTO "{schema}"."q_dead" (id, enqueued_at, due_at, {priority[0]}attempts, dead_at, '
                     f"payload) SELECT -g, now(), now(), {priority[1]}5, now(), jsonb_build_object('n', g) "
                     "FROM generate_series(1, 1000) AS g")
    else:
        conn.execute(f"INSERT INTO {table} (payload) SELECT jsonb_build_object('n', g) FROM generate_series(1, {rows}) AS g")
    conn.execute(f"VACUUM ANALYZE {table}")


def run(url: str, scenario: Scenario, rows: int) -> list[tuple[str, str, str, int]]:
    schema = f"b_{secrets.token_hex(4)}"
    conn = connect(url)
    try:
        before, after = scenario.before, scenario.after
        if scenario.release:
            before = after = _deploy_release(conn, scenario, schema)
        else:
            first = [u for u in _units(schema, scenario.kind, before)
                     if not u.name.endswith(scenario.skip_units or ("\0",))]
            deploy(conn, dialect_for("postgres"), schema, first)
        _load(conn, schema, scenario.kind, rows, before, leased=1000 if scenario.release else 0)
        lines: list[str] = []
        started = time.monotonic()
        result = deploy(conn, dialect_for("postgres"), schema, _units(schema, scenario.kind, after),
                        progress=lines.append)
        total = time.monotonic() - started
        modes = {(migration.name, step.what): step.mode + (", after the code units" if step.after_code else "")
                 for item in result.plan.items for migration in item.migrations for step in migration.steps}
        out = [(m["migration"], modes[m["migration"], m["what"]], m["what"], int(m["ms"]))
               for m in map(STEP_LINE.match, lines) if m]
        for item in result.plan.changes:   # units created (an index unit on an existing table)
            if item.unit.type == "storage" and not item.migrations:
                ms = next(int(re.search(r"\((\d+) ms\)", line)[1]) for line in lines if item.unit.name in line)
                out.append((f"{item.action.lower()} {item.unit.name.split('.', 1)[1]}",
                            "concurrent" if item.concurrent else "transaction", item.reason or "created", ms))
        out.append(("(whole deploy)", "", "", int(total * 1000)))
        return out
    finally:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for role in ("producer", "consumer", "admin"):
            conn.execute(f'DROP ROLE IF EXISTS "{schema}_{role}"')
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", default="", help="run only the scenarios whose name contains this text")
    args = parser.parse_args()
    scenarios = [s for s in SCENARIOS if args.only in s.name]
    if not scenarios:
        raise SystemExit(f"--only {args.only!r}: no scenario's name contains it ({', '.join(s.name for s in SCENARIOS)})")
    with postgres_url() as url:
        conn = connect(url)
        version = conn.execute("SHOW server_version").fetchone()[0]
        conn.close()
        print(f"PostgreSQL {version}, {args.rows:,} messages per queue\n")
        print("| scenario | step | mode | what | ms |\n|---|---|---|---|---:|")
        for scenario in scenarios:
            for migration, mode, what, ms in run(url, scenario, args.rows):
                print(f"| {scenario.name} | {migration} | {mode} | {what} | {ms:,} |")


if __name__ == "__main__":
    main()
