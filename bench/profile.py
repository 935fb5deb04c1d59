"""Profiles of the claim: the plan PostgreSQL actually runs inside the dequeue function, with
EXPLAIN (ANALYZE, BUFFERS) numbers, captured with auto_explain (log_nested_statements) and sent to
the client as notices. Every call runs in a transaction that is rolled back: nothing is consumed.
"""
from __future__ import annotations

import re
from typing import Any

import psycopg

from .env import LEASE_SECONDS, PAYLOAD, Env

CALLS = 7  # plpgsql switches to a generic plan after five custom ones: profile the steady state


def _call(env: Env, queue: str, batch: int) -> str:
    kind = env.queue(queue).kind
    fn = f'"{env.schema}"."{queue}_dequeue"'
    if kind == "work":
        return f"SELECT * FROM {fn}(batch_size => {batch}, worker => 'profile', lease_seconds => {LEASE_SECONDS})"
    return f"SELECT * FROM {fn}(batch_size => {batch})"


def _explain_nested(conn: psycopg.Connection, notices: list[str], timing: bool = True) -> None:
    """auto_explain, with buffers, of every statement the session's functions run, as notices."""
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting, value in (("auto_explain.log_min_duration", "0"), ("auto_explain.log_analyze", "on"),
                           ("auto_explain.log_buffers", "on"), ("auto_explain.log_timing", "on" if timing else "off"),
                           ("auto_explain.log_nested_statements", "on"), ("client_min_messages", "log")):
        conn.execute(f"SET {setting} = {value}")


def explain_claim(env: Env, queue: str, batch: int, label: str) -> dict[str, Any]:
    notices: list[str] = []
    out: dict[str, Any] = {"queue": queue, "kind": env.queue(queue).kind, "batch": batch, "label": label}
    try:
        with psycopg.connect(env.url, autocommit=True) as conn:
            _explain_nested(conn, notices)
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


def consuming_session_buffers(env: Env, queue: str, consume: int = 300, dequeues: int = 5) -> dict[str, Any]:
    """See _consuming_session_buffers; an error is recorded (as explain_claim does), not raised."""
    try:
        return _consuming_session_buffers(env, queue, consume, dequeues)
    except (psycopg.Error, RuntimeError) as exc:
        return {"queue": queue, "error": str(exc)}


def _consuming_session_buffers(env: Env, queue: str, consume: int, dequeues: int) -> dict[str, Any]:
    """The shared buffers (hit + read) one batch-of-one dequeue reads in a session that has been
    consuming (`consume` messages, committed; work: each completed), summed over the statements the
    function runs, the work kind's own-messages probe included. Machine-independent: under a held
    snapshot it shows whether a claim still reads the entries of what was consumed. The least of
    `dequeues` back-to-back calls: a session finds its claim position again from the head at least
    once a second (docs/queue-kinds.md), which may be any one of them on a slow machine."""
    from tablequeue.client import QueueClient

    is_work = env.queue(queue).kind == "work"
    notices: list[str] = []
    per_dequeue: list[int] = []
    with psycopg.connect(env.url, autocommit=True) as conn:
        client = QueueClient.for_catalog(conn, "postgres", env.catalog, queue)

        def take(batch: int) -> list[dict]:
            rows = (client.dequeue(batch_size=batch, worker="steady", lease_seconds=LEASE_SECONDS) if is_work
                    else client.dequeue(batch_size=batch))
            if not rows:
                raise RuntimeError(f"bench: {queue} ran dry in the consuming-session profile")
            return rows

        done = 0
        while done < consume:
            rows = take(10)
            if is_work:
                for row in rows:
                    client.complete(row["id"], "steady")
            done += len(rows)
        _explain_nested(conn, notices, timing=False)
        for _ in range(dequeues):
            notices.clear()
            rows = take(1)
            per_dequeue.append(sum(_top_buffers(n) for n in notices if "Query Text:" in n
                                   and not re.search(r'_dequeue"?\(', n.split("Query Text:", 1)[1][:200])))
            if is_work:
                conn.execute("SET auto_explain.log_min_duration = -1")
                client.complete(rows[0]["id"], "steady")
                conn.execute("SET auto_explain.log_min_duration = 0")
    return {"queue": queue, "consumed": consume, "per_dequeue": per_dequeue, "least": min(per_dequeue)}


def enqueue_batch_buffers(env: Env, queue: str, batch: int = 100) -> int | str:
    """The shared buffers (hit + read) one `enqueue_batch` of `batch` messages touches: EXPLAIN
    (ANALYZE, BUFFERS) of the call, whose Function Scan counts every statement run inside it. The
    least of CALLS calls, each rolled back; the error's text if the call fails."""
    call = f'SELECT * FROM "{env.schema}"."{queue}_enqueue_batch"(payloads => %s::jsonb[])'
    totals = []
    try:
        with psycopg.connect(env.url, autocommit=True) as conn:
            for _ in range(CALLS):
                conn.execute("BEGIN")
                plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + call,
                                                              ([PAYLOAD] * batch,)))
                conn.execute("ROLLBACK")
                totals.append(_top_buffers(plan))
    except psycopg.Error as exc:
        return f"error: {exc}"
    return min(totals)


def _top_buffers(plan: str) -> int:
    """hit + read of a plan's first Buffers line: its top node's total."""
    top = re.search(r"Buffers: shared((?: \w+=\d+)+)", plan)
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top.group(1))) if top else 0


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
