"""Where a one-row enqueue's time goes: the raw INSERT, then the same INSERT wrapped step by step
until it is the queue's enqueue function, all driven by pgbench (4 clients) in the same run.

    raw INSERT                 the ceiling's statement (INSERT ... RETURNING id)
    PL/pgSQL, caller's rights  a function that runs only that INSERT and returns (id, duplicate)
    + SECURITY DEFINER, SET search_path
                               the same function as every tablequeue function is declared (DESIGN §5)
    the enqueue function       the template's function: the same plus its argument checks

The two minimal functions are created in the benchmark schema for the measurement and dropped with
it. Each variant runs `rounds` times in alternating order and the runs are averaged.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .ceiling import Shape, _literal, fn_call, measure, raw_enqueue
from .env import PAYLOAD, Env, fill_columns

VARIANTS = ("raw INSERT", "PL/pgSQL, caller's rights", "+ SECURITY DEFINER, SET search_path", "enqueue function")


def _minimal_function(env: Env, queue: str, name: str, definer: bool) -> str:
    with env.conn() as conn:
        cols = fill_columns(conn, env.schema, queue)
    names = ", ".join(f'"{c}"' for c, _ in cols)
    values = ", ".join(f"{name}.payload" if c == "payload" else "clock_timestamp()" for c, _ in cols)
    security = "SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp\n" if definer else ""
    return (f'CREATE FUNCTION "{env.schema}"."{name}"(payload jsonb, dedupe_key text DEFAULT NULL)\n'
            "RETURNS TABLE (id bigint, duplicate boolean)\nLANGUAGE plpgsql\nVOLATILE\n" + security +
            "AS $function$\nBEGIN\n"
            f"    INSERT INTO {env.table(queue)} AS m ({names}) VALUES ({values}) RETURNING m.id INTO {name}.id;\n"
            f"    {name}.duplicate := false;\n    RETURN NEXT;\nEND;\n$function$;")


def run(env: Env, kinds: list[str], clients: int, seconds: float, rounds: int, log: Any) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="tq-overhead-"))
    os.chmod(workdir, 0o755)  # pgbench runs as the caller; the embedded server's user reads nothing here
    call = f"payload => {_literal(PAYLOAD)}::jsonb"
    out = []
    try:
        for kind in kinds:
            queue = f"q_{kind}"
            invoker, definer = f"{queue}_enqueue_invoker", f"{queue}_enqueue_definer"
            with env.conn() as conn:
                conn.execute(_minimal_function(env, queue, invoker, definer=False))
                conn.execute(_minimal_function(env, queue, definer, definer=True))
            scripts = dict(zip(VARIANTS, (raw_enqueue(env, queue),
                                          f'SELECT * FROM "{env.schema}"."{invoker}"({call});\n',
                                          f'SELECT * FROM "{env.schema}"."{definer}"({call});\n',
                                          fn_call(env, queue, "enqueue", call))))
            runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r in range(rounds):
                for variant in (VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))):
                    shape = Shape(variant, queue, "enqueue", 1, scripts[variant], scripts[variant])
                    runs[variant].append(measure(env, shape, "raw", clients, seconds, 0, workdir)["messages_per_s"])
            mean = {v: sum(x) / len(x) for v, x in runs.items()}
            entry = {"kind": kind, "clients": clients, "seconds": seconds, "runs": runs, "messages_per_s": mean,
                     "vs_raw": {v: mean[v] / mean[VARIANTS[0]] for v in VARIANTS}, "scripts": scripts}
            log(f"  overhead {kind} enqueue: " + ", ".join(f"{v} {mean[v]:.0f}/s ({entry['vs_raw'][v]:.2f})"
                                                            for v in VARIANTS))
            out.append(entry)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out
