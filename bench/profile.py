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
