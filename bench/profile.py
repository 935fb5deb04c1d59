"""Profiles of the claim: the plan PostgreSQL actually runs inside the dequeue function, with
EXPLAIN (ANALYZE, BUFFERS) numbers, captured with auto_explain (log_nested_statements) and sent to
the client as notices. Every call runs in a transaction that is rolled back: nothing is consumed.
"""
from __future__ import annotations

import re
from typing import Any

import psycopg

from .env import LEASE_SECONDS, Env

CALLS = 7  # plpgsql switches to a generic plan after five custom ones: profile the steady state


def _call(env: Env, queue: str, batch: int) -> str:
    kind = env.queue(queue).kind
    fn = f'"{env.schema}"."{queue}_dequeue"'
    if kind == "work":
        return f"SELECT * FROM {fn}(batch_size => {batch}, worker => 'profile', lease_seconds => {LEASE_SECONDS})"
    return f"SELECT * FROM {fn}(batch_size => {batch})"


def explain_claim(env: Env, queue: str, batch: int, label: str) -> dict[str, Any]:
    notices: list[str] = []
    out: dict[str, Any] = {"queue": queue, "kind": env.queue(queue).kind, "batch": batch, "label": label}
    try:
        with psycopg.connect(env.url, autocommit=True) as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            conn.execute("LOAD 'auto_explain'")
            for setting, value in (("auto_explain.log_min_duration", "0"), ("auto_explain.log_analyze", "on"),
                                   ("auto_explain.log_buffers", "on"), ("auto_explain.log_timing", "on"),
                                   ("auto_explain.log_nested_statements", "on"),
                                   ("client_min_messages", "log")):
                conn.execute(f"SET {setting} = {value}")
            for _ in range(CALLS):
                notices.clear()
                conn.execute("BEGIN")
                conn.execute(_call(env, queue, batch)).fetchall()
                conn.execute("ROLLBACK")
    except psycopg.Error as exc:
        out["error"] = str(exc)
        return out
    # The nested statements' plans (not the outer "SELECT * FROM fn()" Function Scan).
    call = _call(env, queue, batch)
    outer = [n for n in notices if f"Query Text: {call}" in n]
    inner = [n for n in notices if f"Query Text: {call}" not in n]
    out["plans"] = inner
    out["statement_ms"] = [float(m.group(1)) for n in inner if (m := re.search(r"duration: ([\d.]+) ms", n))]
    out["call_ms"] = (float(m.group(1)) if outer and (m := re.search(r"duration: ([\d.]+) ms", outer[0]))
                      else None)
    # Buffers of each statement: the first "Buffers:" line of a plan is its top node's total.
    out["statement_buffers"] = [m.group(1) if (m := re.search(r"Buffers: ([^\n]+)", n)) else ""
                                for n in inner]
    return out


def planning_vs_execution(env: Env, kinds: list[str], depth: int = 1_000, repeats: int = 7) -> list[dict]:
    """Planning and execution time of each statement of a batch-of-one dequeue (EXPLAIN ANALYZE,
    SUMMARY). The planning column is what every call would pay if the statement were planned each
    time, as a `LIMIT batch_size` statement is; with its literal LIMIT 1 the function keeps a generic
    plan for the session instead. Median of `repeats`, each in a rolled-back transaction."""
    from statistics import median

    from .ceiling import raw_destructive_dequeue
    from .env import set_depth
    from .work_raw import work_raw_cycle

    out = []
    for kind in kinds:
        queue = f"q_{kind}"
        if kind == "work":
            script = work_raw_cycle(env, queue)
            if script is None:
                continue
            lines = script.splitlines()
            statements = {"own-messages probe": next(x for x in lines if x.startswith("SELECT EXISTS")),
                          "visible claim (LIMIT 1)": next(x for x in lines if x.startswith("WITH"))}
        else:
            statements = {"claim (LIMIT 1)": raw_destructive_dequeue(env, queue, 1)}
        set_depth(env, queue, depth)
        for label, sql in statements.items():
            sql = (sql.replace(":batch", "1").replace(":client_id::text", "'1'")
                   .replace(" \\gset p_", "").strip().rstrip(";"))
            planning, execution = [], []
            with psycopg.connect(env.url, autocommit=True) as conn:
                for _ in range(repeats):
                    conn.execute("BEGIN")
                    text = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS, SUMMARY) " + sql))
                    conn.execute("ROLLBACK")
                    planning.append(float(re.search(r"Planning Time: ([\d.]+) ms", text).group(1)))
                    execution.append(float(re.search(r"Execution Time: ([\d.]+) ms", text).group(1)))
            out.append({"kind": kind, "statement": label, "depth": depth, "planning_ms": median(planning),
                        "execution_ms": median(execution)})
    return out
