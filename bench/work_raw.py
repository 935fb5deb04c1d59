"""The work kind's raw SQL cycle for the pgbench ceiling, cut out of the rendered functions.

"Same shape" means the same statements the functions run, in the same order, without PL/pgSQL
around them: the probe for the worker's own messages, the claim of visible messages, the read of
the claimed rows, then complete's DELETE. PL/pgSQL variables become pgbench variables or the
expressions they hold (now_utc -> now(): for a one-statement transaction, the same instant known
at statement start). A second, minimal shape (one claim UPDATE, one DELETE) shows what the leanest
possible lease cycle costs, for scale.
"""
from __future__ import annotations

import re

from .ceiling import position_at_head, rendered_unit

WORKER = "('pgbench-' || :client_id::text)"


def _flat(sql: str) -> str:
    lines = [line.split("--", 1)[0].strip() if line.strip().startswith("--") else line.strip()
             for line in sql.splitlines()]
    return " ".join(line for line in lines if line)


def _subst(sql: str, fn: str, lease: int) -> str:
    sql = sql.replace(f"{fn}_dequeue.worker", WORKER).replace(f"{fn}_complete.worker", WORKER)
    sql = sql.replace(f"{fn}_complete.id", "(:p_ids::bigint[])[1]")
    sql = re.sub(r"\blease_until\b", f"(now() + make_interval(secs => {lease}))", sql)
    sql = re.sub(r"\bnow_utc\b", "now()", sql)
    sql = re.sub(r"\b(batch_size|remaining)\b", ":batch", sql)
    return position_at_head(sql)


def work_raw_cycle(env, queue: str, lease: int = 300) -> str | None:  # noqa: ANN001
    """dequeue's statements for a batch of one (the own-messages probe, the LIMIT 1 claim of visible
    messages, the read of the claimed rows) in one transaction, then complete's DELETE. After the
    probe finds nothing the function skips the own-messages claim, and so does this script."""
    q = env.queue(queue)
    if q.options.get("client_ids") or q.options.get("priority"):
        return None  # ids are uuids / claims loop over levels: not a one-line shape
    fn = q.name
    deq = rendered_unit(env, queue, "dequeue")
    probe = re.search(r"IF EXISTS \(\s*(SELECT FROM .*?)\s*\) THEN", deq, re.S)
    claims = re.findall(r"(WITH next_messages AS \(.*?)\s+INTO step_ids, exhausted_ids, exhausted_workers\s+"
                        r"(FROM leased AS l);", deq, re.S)
    visible = [" ".join(c) for c in claims if "visible_at <= now_utc" in c[0] and "LIMIT 1\n" in c[0]]
    final = re.search(r"RETURN QUERY\s*(SELECT m\.id.*?);\s*END;", deq, re.S)
    comp = rendered_unit(env, queue, "complete")
    delete = re.search(r"(DELETE FROM .*?);\s*GET DIAGNOSTICS", comp, re.S)
    if delete is None:  # history: one statement, queue table then history table
        history = re.search(r"(WITH done AS .*?SELECT count\(\*\))\s+INTO done_count\s+(FROM kept);", comp, re.S)
        delete = history and re.match(r"(.*)", history.group(1) + " " + history.group(2), re.S)
    if not probe or len(visible) != 1 or not final or not delete:
        raise RuntimeError(f"bench: the statements of {queue}_dequeue/_complete are not where work_raw expects")
    own = "SELECT EXISTS (" + _flat(_subst(probe.group(1), fn, lease)) + ")"
    claim = _flat(_subst(visible[0], fn, lease))
    claim = re.sub(r"\) FILTER \(WHERE l\.attempts <= (\d+)\),", r") FILTER (WHERE l.attempts <= \1) AS ids,", claim, count=1)
    read = _flat(_subst(final.group(1), fn, lease)).replace("unnest(claimed_ids)", "unnest(:p_ids::bigint[])")
    done = _flat(_subst(delete.group(1), fn, lease))
    # dequeue's three statements run in one transaction, as inside the function; complete in its own.
    return ("\\set batch 1\nBEGIN;\n" + own + ";\n" + claim + " \\gset p_\n" + read + ";\nCOMMIT;\n"
            + done + ";\n")


def work_minimal_cycle(env, queue: str, lease: int = 300) -> str:  # noqa: ANN001
    """The leanest lease cycle: one claim UPDATE (literal LIMIT 1, so its generic plan is cached)
    and one DELETE."""
    t = env.table(queue)
    claim = (f"WITH n AS (SELECT m.id FROM {t} AS m WHERE m.visible_at <= now() ORDER BY m.visible_at, m.id "
             f"LIMIT 1 FOR UPDATE SKIP LOCKED) UPDATE {t} AS m SET attempts = m.attempts + 1, "
             f"visible_at = now() + make_interval(secs => {lease}), leased_by = {WORKER}, leased_at = now() "
             f"FROM n WHERE m.id = n.id RETURNING m.id, m.payload, m.enqueued_at, m.due_at, m.attempts \\gset p_\n")
    done = (f"DELETE FROM {t} AS m WHERE m.id = :p_id AND m.leased_by = {WORKER} AND m.visible_at > now();\n")
    return claim + done


def work_fn_cycle(env, queue: str, lease: int = 300) -> str:  # noqa: ANN001
    """The same cycle through the functions: dequeue a batch of one, complete it."""
    return (f'SELECT id FROM "{env.schema}"."{queue}_dequeue"(batch_size => 1, worker => {WORKER}, '
            f"lease_seconds => {lease}) \\gset\n"
            f'SELECT * FROM "{env.schema}"."{queue}_complete"(id => :id, worker => {WORKER});\n')
