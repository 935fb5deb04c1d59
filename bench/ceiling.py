"""The ceiling: the raw SQL statement shapes the functions run, driven by pgbench (a C client), next
to the same work through the functions, also driven by pgbench: same server, same run, same clients.

The raw dequeue shape of a destructive kind is taken from the rendered function itself (its
RETURN QUERY statement), so it follows the template; the work kind's raw cycle is the claim UPDATE
and the complete DELETE written out by hand from work.sql (see WORK_RAW). Each pair runs twice in
the order raw, functions, functions, raw and the two runs of each are averaged.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tablequeue.render import render_queue

from .cells import percentile
from .env import PAYLOAD, Env, count, fill_columns, set_depth


@dataclass
class Shape:
    name: str            # e.g. fifo dequeue batch 1
    queue: str
    op: str              # enqueue | dequeue | cycle
    batch: int
    raw: str             # pgbench script
    fn: str              # pgbench script


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def rendered_unit(env: Env, queue: str, verb: str) -> str:
    rendered = render_queue(env.catalog, env.queue(queue), "postgres")
    for unit in rendered.units:
        if unit.name == f"{env.schema}.{queue}_{verb}":
            return unit.body
    raise KeyError(f"{queue}_{verb} not rendered")


def raw_destructive_dequeue(env: Env, queue: str, batch: int) -> str:
    """The claim statement the dequeue function runs (its RETURN QUERY), with a literal LIMIT 1 for
    batch 1 (the function's own one-message statement has that literal too, and also finds its next
    claim position and fills the OUT parameters: what a hand-written claim does not need), else
    batch_size as a pgbench variable."""
    body = rendered_unit(env, queue, "dequeue")
    statements = re.findall(r"RETURN QUERY\s*(WITH\b.*?);", body, re.S)
    if len(statements) != 1 or "LIMIT batch_size" not in statements[0]:
        raise RuntimeError(f"bench: cannot find the claim statement in {queue}_dequeue")
    statement = re.sub(r"\bbatch_size\b", "1" if batch == 1 else ":batch", statements[0])
    # A plpgsql variable holding clock_timestamp() at the call's start is, for a one-statement
    # transaction, what now() is: a value known when the statement starts (so it bounds the index).
    statement = re.sub(r"\bnow_utc\b", "now()", statement)
    # A hand-written claim starts at the head of the index: the function's claim position at its
    # lowest (docs/queue-kinds.md, The claim position).
    statement = position_at_head(statement)
    # pgbench reads one SQL command per line unless it ends in ';' -- flatten to one line.
    return " ".join(line.strip() for line in statement.splitlines() if line.strip()) + ";\n"


def position_at_head(sql: str) -> str:
    """The claim position's variables as the head of the index: a claim as written by hand."""
    sql = re.sub(r"\bposition_id\b", "0", sql)
    return re.sub(r"\b(position_time|own_since)\b", "'-infinity'::timestamptz", sql)


def raw_enqueue(env: Env, queue: str) -> str:
    with env.conn() as conn:
        cols = fill_columns(conn, env.schema, queue)
    names = ", ".join(f'"{c}"' for c, _ in cols)
    values = ", ".join(_literal(PAYLOAD) + "::jsonb" if c == "payload" else "clock_timestamp()"
                       for c, _ in cols)
    return f"INSERT INTO {env.table(queue)} AS m ({names}) VALUES ({values}) RETURNING m.id;\n"


def payload_array(batch: int) -> str:
    return f"array_fill({_literal(PAYLOAD)}::jsonb, ARRAY[{batch}])"


def raw_enqueue_batch(env: Env, queue: str, batch: int) -> str:
    """A set-based INSERT of `batch` rows from an array: what enqueue_batch's INSERT does, bare."""
    with env.conn() as conn:
        cols = fill_columns(conn, env.schema, queue)
    names = ", ".join(f'"{c}"' for c, _ in cols)
    values = ", ".join("u.payload" if c == "payload" else "clock_timestamp()" for c, _ in cols)
    return (f"INSERT INTO {env.table(queue)} AS m ({names}) SELECT {values} "
            f"FROM unnest({payload_array(batch)}) AS u (payload) RETURNING m.id;\n")


def enqueue_shapes(env: Env, queue: str, kind: str) -> list[Shape]:
    """A one-row enqueue, and a batch of ten through enqueue_batch (what amortises the call)."""
    return [Shape(f"{kind} enqueue", queue, "enqueue", 1, raw_enqueue(env, queue),
                  fn_call(env, queue, "enqueue", f"payload => {_literal(PAYLOAD)}::jsonb")),
            Shape(f"{kind} enqueue_batch of 10", queue, "enqueue", 10, raw_enqueue_batch(env, queue, 10),
                  fn_call(env, queue, "enqueue_batch", f"payloads => {payload_array(10)}"))]


def fn_call(env: Env, queue: str, verb: str, args: str) -> str:
    return f'SELECT * FROM "{env.schema}"."{queue}_{verb}"({args});\n'


def destructive_shapes(env: Env, queue: str, batches: tuple[int, ...]) -> list[Shape]:
    kind = env.queue(queue).kind
    shapes = enqueue_shapes(env, queue, kind)
    for b in batches:
        head = f"\\set batch {b}\n"
        shapes.append(Shape(f"{kind} dequeue batch {b}", queue, "dequeue", b,
                            head + raw_destructive_dequeue(env, queue, b),
                            head + fn_call(env, queue, "dequeue", "batch_size => :batch")))
    return shapes


def work_shapes(env: Env, queue: str) -> list[Shape]:
    from .work_raw import work_fn_cycle, work_minimal_cycle, work_raw_cycle

    shapes = enqueue_shapes(env, queue, "work")
    raw = work_raw_cycle(env, queue)
    if raw is not None:
        fn = work_fn_cycle(env, queue)
        shapes.append(Shape("work cycle batch 1 (same statements)", queue, "cycle", 1, raw, fn))
        shapes.append(Shape("work cycle batch 1 (minimal raw: one claim UPDATE + one DELETE)", queue, "cycle", 1,
                            work_minimal_cycle(env, queue), fn))
    return shapes


def run_pgbench(url: str, script: str, clients: int, seconds: float, workdir: Path,
                settings: dict[str, str] | None = None, transactions: int = 0,
                defines: dict[str, str] | None = None) -> dict:
    """`script` from `clients` clients for `seconds` (or, given `transactions`, that many per
    client); `settings` are set in every client's session (PGOPTIONS), `defines` are the
    script's variables' first values (-D)."""
    path = workdir / "script.sql"
    path.write_text(script)
    for old in glob.glob(str(workdir / "log*")):
        os.unlink(old)
    length = ["-t", str(transactions)] if transactions else ["-T", str(max(1, round(seconds)))]
    cmd = ["pgbench", "-n", "-M", "prepared", "-f", str(path), "-c", str(clients),
           "-j", str(min(clients, os.cpu_count() or 1)), *length, *pgbench_defines(defines),
           "-l", "--log-prefix", str(workdir / "log"), url]
    options = " ".join(f"-c {name}={value}" for name, value in (settings or {}).items())
    env = {**os.environ, "PGOPTIONS": (os.environ.get("PGOPTIONS", "") + " " + options).strip()} if options else None
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=env)
    out = proc.stdout + proc.stderr
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    processed = re.search(r"number of transactions actually processed: (\d+)", out)
    lat = []
    for log in glob.glob(str(workdir / "log*")):
        with open(log) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    lat.append(int(parts[2]) / 1000.0)  # microseconds -> ms
    if proc.returncode != 0 or not tps:
        raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{' '.join(cmd)}\n{out[-3000:]}\n{script}")
    return {"tps": float(tps.group(1)), "failed": int(failed.group(1)) if failed else 0,
            "processed": int(processed.group(1)) if processed else len(lat),
            "p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99), "transactions": len(lat)}


def pgbench_defines(defines: dict[str, str] | None) -> list[str]:
    return [arg for name, value in (defines or {}).items() for arg in ("-D", f"{name}={value}")]


def measure(env: Env, shape: Shape, variant: str, clients: int, seconds: float, depth: int,
            workdir: Path) -> dict:
    script = shape.raw if variant == "raw" else shape.fn
    set_depth(env, shape.queue, depth)
    with env.conn() as conn:
        before = count(conn, env.table(shape.queue))
        before_id = conn.execute(f"SELECT coalesce(max(id), 0) FROM {env.table(shape.queue)}").fetchone()[0]
    result = run_pgbench(env.url, script, clients, seconds, workdir)
    with env.conn() as conn:
        after = count(conn, env.table(shape.queue))
        if shape.op == "enqueue":
            conn.execute(f"DELETE FROM {env.table(shape.queue)} WHERE id > %s", (before_id,))
    moved = after - before if shape.op == "enqueue" else before - after
    result.update(messages=moved, messages_per_s=moved / max(1, round(seconds)),
                  drained=(after == 0 and shape.op != "enqueue"), variant=variant)
    return result


def run(env: Env, kinds: list[str], clients: int, seconds: float, batches: tuple[int, ...],
        rounds: int, log: callable) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="tq-pgbench-"))
    os.chmod(workdir, 0o755)
    shapes: list[Shape] = []
    for kind in kinds:
        queue = f"q_{kind}"
        shapes += work_shapes(env, queue) if kind == "work" else destructive_shapes(env, queue, batches)
    results = []
    try:
        for shape in shapes:
            # Deep enough that the run never empties the queue (checked: `drained`): on a quiet host
            # a batch-of-one dequeue function moved more than 25,000 messages/s.
            depth = 0 if shape.op == "enqueue" else int(min(1_500_000, 80_000 * shape.batch * seconds))
            runs = {"raw": [], "fn": []}
            order = ["raw", "fn", "fn", "raw"] * rounds
            for variant in order[: 2 * rounds]:
                runs[variant].append(measure(env, shape, variant, clients, seconds, depth, workdir))
            entry = {"shape": shape.name, "queue": shape.queue, "op": shape.op, "batch": shape.batch,
                     "clients": clients, "seconds": seconds, "depth": depth,
                     "raw_script": shape.raw, "fn_script": shape.fn}
            for variant, rs in runs.items():
                entry[variant] = {
                    "messages_per_s": sum(r["messages_per_s"] for r in rs) / len(rs),
                    "tps": sum(r["tps"] for r in rs) / len(rs),
                    "p50_ms": sum(r["p50_ms"] or 0 for r in rs) / len(rs),
                    "p99_ms": sum(r["p99_ms"] or 0 for r in rs) / len(rs),
                    "failed": sum(r["failed"] for r in rs), "drained": any(r["drained"] for r in rs),
                    "runs": rs}
            entry["ratio"] = (entry["fn"]["messages_per_s"] / entry["raw"]["messages_per_s"]
                              if entry["raw"]["messages_per_s"] else None)
            log(f"  ceiling {shape.name}: raw {entry['raw']['messages_per_s']:.0f}/s, "
                f"functions {entry['fn']['messages_per_s']:.0f}/s, ratio {entry['ratio']:.2f}")
            results.append(entry)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results
