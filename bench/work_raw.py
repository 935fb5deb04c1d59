"""The work kind's raw SQL cycle for the pgbench ceiling, cut out of the rendered functions.

"Same shape" means the same statements the functions run, in the same order, without PL/pgSQL
around them: the probe for the worker's own messages, the one-message claim of visible messages
(which returns the leased row and finds the next claim position with its lateral), then complete's
DELETE. PL/pgSQL variables become pgbench variables or the
expressions they hold (now_utc -> now(): for a one-statement transaction, the same instant known
at statement start). A second, minimal shape (one claim UPDATE, one DELETE) shows what the leanest
possible lease cycle costs, for scale.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .ceiling import position_at_head, rendered_unit

WORKER = "('pgbench-' || :client_id::text)"


def _flat(sql: str) -> str:
    lines = [line.split("--", 1)[0].strip() if line.strip().startswith("--") else line.strip()
             for line in sql.splitlines()]
    return " ".join(line for line in lines if line)


def _subst(sql: str, fn: str, lease: int) -> str:
    sql = sql.replace(f"{fn}_dequeue.worker", WORKER).replace(f"{fn}_complete.worker", WORKER)
    sql = sql.replace(f"{fn}_complete.id", ":p_id")
    # The raw shapes check the lease by worker name (work_fn_cycle's `fenced` off): no token.
    sql = sql.replace(f"{fn}_complete.lease_token", "NULL::uuid")
    sql = re.sub(r"\blease_until\b", f"(now() + make_interval(secs => {lease}))", sql)
    sql = re.sub(r"\bnow_utc\b", "now()", sql)
    sql = re.sub(r"\b(batch_size|remaining)\b", ":batch", sql)
    return position_at_head(sql)


def work_raw_cycle(env, queue: str, lease: int = 300) -> str | None:  # noqa: ANN001
    """dequeue's statements for a batch of one (the own-messages probe, the one-message claim of
    visible messages with its position lateral) in one transaction, then complete's DELETE. After
    the probe finds nothing the function skips the own-messages claim, and so does this script."""
    q = env.queue(queue)
    if q.options.get("client_ids") or q.options.get("priority"):
        return None  # ids are uuids / claims loop over levels: not a one-line shape
    fn = q.name
    deq = rendered_unit(env, queue, "dequeue")
    probe = re.search(r"IF EXISTS \(\s*(SELECT FROM .*?)\s*\) THEN", deq, re.S)
    # The hot path's claim, after the look for expired leases (storage v3), which a session runs at
    # most once a second and so is no part of a message's cycle.
    hot = deq.find("the hot path")
    one = hot >= 0 and re.search(r"(WITH next_messages AS \((?:(?!WITH next_messages).)*?LIMIT 1\s.*?)\s+SELECT\s+l\.id,.*?INTO\s+id,.*?"
                    r"(FROM leased AS l\s+LEFT JOIN LATERAL .*?\) AS seen ON true);", deq[hot:], re.S)
    comp = rendered_unit(env, queue, "complete")
    delete = re.search(r"(DELETE FROM .*?);\s*GET DIAGNOSTICS", comp, re.S)
    if delete is None:  # history: one statement, queue table then history table
        history = re.search(r"(WITH done AS .*?SELECT count\(\*\))\s+INTO done_count\s+(FROM kept);", comp, re.S)
        delete = history and re.match(r"(.*)", history.group(1) + " " + history.group(2), re.S)
    if not probe or not one or not delete:
        raise RuntimeError(f"bench: the statements of {queue}_dequeue/_complete are not where work_raw expects")
    own = "SELECT EXISTS (" + _flat(_subst(probe.group(1), fn, lease)) + ")"
    claim = _flat(_subst(one.group(1) + " SELECT l.id, l.payload, l.enqueued_at, l.due_at, l.attempts, "
                                        "l.lease_token, seen.id AS seen_id " + one.group(2), fn, lease))
    done = _flat(_subst(delete.group(1), fn, lease))
    # dequeue's two statements run in one transaction, as inside the function; complete in its own.
    return "BEGIN;\n" + own + ";\n" + claim + " \\gset p_\nCOMMIT;\n" + done + ";\n"


def work_minimal_cycle(env, queue: str, lease: int = 300) -> str:  # noqa: ANN001
    """The leanest lease cycle: one claim UPDATE (literal LIMIT 1, so its generic plan is cached)
    and one DELETE. The claim reads the messages nobody leases, as ix_<q>_ready holds them (storage
    v3: without `leased_by IS NULL` it cannot use that partial index and reads the table); it does
    not take expired leases back, which the functions' look does."""
    t = env.table(queue)
    claim = (f"WITH n AS (SELECT m.id FROM {t} AS m WHERE m.leased_by IS NULL AND m.visible_at <= now() "
             f"ORDER BY m.visible_at, m.id "
             f"LIMIT 1 FOR UPDATE SKIP LOCKED) UPDATE {t} AS m SET attempts = m.attempts + 1, "
             f"visible_at = now() + make_interval(secs => {lease}), leased_by = {WORKER}, leased_at = now() "
             f"FROM n WHERE m.id = n.id RETURNING m.id, m.payload, m.enqueued_at, m.due_at, m.attempts \\gset p_\n")
    done = (f"DELETE FROM {t} AS m WHERE m.id = :p_id AND m.leased_by = {WORKER} AND m.visible_at > now();\n")
    return claim + done


def work_fn_cycle(env, queue: str, lease: int = 300, fenced: bool = False) -> str:  # noqa: ANN001
    """The same cycle through the functions: dequeue a batch of one, complete it (`fenced`: with
    the lease token, as the contract recommends; else by worker name, as the raw shapes check)."""
    token = ", lease_token => :lease_token" if fenced else ""
    return (f'SELECT id{", lease_token" if fenced else ""} FROM "{env.schema}"."{queue}_dequeue"(batch_size => 1, '
            f"worker => {WORKER}, lease_seconds => {lease}) \\gset\n"
            f'SELECT * FROM "{env.schema}"."{queue}_complete"(id => :id, worker => {WORKER}{token});\n')


# -- a cheaper lease: the storage designs compared (issue 22, item 2) ------------------------------
@dataclass(frozen=True)
class LeaseDesign:
    """One storage design for the work kind, as raw SQL: the indexes its table carries and the
    statements of one batch-of-one work cycle on it (the own-messages probe, the claims, the
    complete). Statements name the table `{t}`, the worker `{w}`, the claimed id `{id}`."""

    name: str
    table: str                    # today's: the deployed queue table; the others: prototypes beside it
    indexes: tuple[str, ...]      # CREATE INDEX ... ON {t} (...); empty: the table as deployed
    probe: str
    claims: tuple[str, ...]       # the last claim hands out the message; any before it reclaims
    done: str


_LEASE_SET = ("SET attempts = m.attempts + 1, visible_at = now() + make_interval(secs => 300), leased_by = {w}, "
              "leased_at = now(), lease_token = gen_random_uuid()")


def _claim(where: str, order: str = "m.visible_at, m.id") -> str:
    return (f"WITH n AS (SELECT m.id FROM {{t}} AS m WHERE {where} ORDER BY {order} LIMIT 1 FOR UPDATE SKIP LOCKED) "
            f"UPDATE {{t}} AS m {_LEASE_SET} FROM n WHERE m.id = n.id "
            "RETURNING m.id, m.payload, m.enqueued_at, m.due_at, m.attempts, m.lease_token")


_DONE = "DELETE FROM {t} AS m WHERE m.id = {id} AND m.leased_by = {w} AND m.visible_at > now()"


def lease_designs(queue: str) -> list[LeaseDesign]:
    """Storage v2's indexes, two designs that write fewer index entries per lease, and today's
    (storage v3, design C). Every design keeps the worker's own unfinished messages first (its probe)
    and the claim's exact index order."""
    return [
        LeaseDesign(
            "v2 (0.2.0 before storage v3): pk, claim (visible_at, id), lease (leased_by, visible_at, id), lease start "
            "(leased_by, leased_at)", f"{queue}_design_v2",
            ("CREATE INDEX ON {t} (visible_at, id)",
             "CREATE INDEX ON {t} (leased_by, visible_at, id) WHERE leased_by IS NOT NULL",
             "CREATE INDEX ON {t} (leased_by, leased_at) WHERE leased_by IS NOT NULL"),
            "SELECT EXISTS (SELECT FROM {t} AS m WHERE m.leased_by = {w} AND m.leased_at >= '-infinity')",
            (_claim("m.visible_at <= now()"),), _DONE),
        LeaseDesign(
            "A, one lease index: pk, claim (visible_at, id), lease start (leased_by, leased_at)",
            f"{queue}_design_a",
            ("CREATE INDEX ON {t} (visible_at, id)",
             "CREATE INDEX ON {t} (leased_by, leased_at) WHERE leased_by IS NOT NULL"),
            "SELECT EXISTS (SELECT FROM {t} AS m WHERE m.leased_by = {w} AND m.leased_at >= '-infinity')",
            (_claim("m.visible_at <= now()"),), _DONE),
        LeaseDesign(
            "B, indexes by lease state: pk, ready (visible_at, id) where not leased, leased (visible_at, id) "
            "where leased", f"{queue}_design_b",
            ("CREATE INDEX ON {t} (visible_at, id) WHERE leased_by IS NULL",
             "CREATE INDEX ON {t} (visible_at, id) WHERE leased_by IS NOT NULL"),
            # The live leases are few (consumers x batch); the probe reads them in expiry order.
            "SELECT EXISTS (SELECT FROM {t} AS m WHERE m.leased_by IS NOT NULL AND m.leased_by = {w} "
            "AND m.leased_at >= '-infinity')",
            # Expired leases first (a probe of the leased index's head that finds none in normal
            # operation), then the ready messages: two statements, never an OR.
            ("WITH l AS (" + _claim("m.leased_by IS NOT NULL AND m.visible_at <= now()") + ") SELECT count(*) FROM l",
             _claim("m.leased_by IS NULL AND m.visible_at <= now()")), _DONE),
        LeaseDesign(
            "today (design C, storage v3): pk, ready (visible_at, id) where not leased, lease start "
            "(leased_by, leased_at) where leased", queue, (),
            "SELECT EXISTS (SELECT FROM {t} AS m WHERE m.leased_by = {w} AND m.leased_at >= '-infinity')",
            # Expired leases are not in index order: a session's look reads the live leases at most
            # once a second (docs/work-queue.md, Expired leases), no part of the per-message cycle.
            (_claim("m.leased_by IS NULL AND m.visible_at <= now()"),), _DONE),
    ]


def create_design_table(conn, schema: str, queue: str, design: LeaseDesign) -> None:  # noqa: ANN001
    """The prototype's table: the queue table's columns, defaults, checks and storage settings,
    with the design's indexes instead of the deployed ones."""
    if not design.indexes:
        return
    t = f'"{schema}"."{design.table}"'
    conn.execute(f"DROP TABLE IF EXISTS {t}")
    conn.execute(f'CREATE TABLE {t} (LIKE "{schema}"."{queue}" INCLUDING ALL EXCLUDING INDEXES, PRIMARY KEY (id)) '
                 "WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, "
                 "autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000)")
    for ddl in design.indexes:
        conn.execute(ddl.format(t=t))


def design_script(schema: str, design: LeaseDesign) -> str:
    """The design's cycle as a pgbench script: the probe, the claims and the claim that hands out
    the message in one transaction (as inside dequeue), then the complete in its own."""
    t = f'"{schema}"."{design.table}"'
    *reclaims, claim = design.claims
    lines = ["BEGIN;", design.probe.format(t=t, w=WORKER) + ";"]
    lines += [c.format(t=t, w=WORKER) + ";" for c in reclaims]
    lines += [claim.format(t=t, w=WORKER) + " \\gset p_", "COMMIT;",
              design.done.format(t=t, w=WORKER, id=":p_id") + ";"]
    return "\n".join(lines) + "\n"


def wal_written(conn, statements: list[str]) -> list[dict]:  # noqa: ANN001
    """What `statements`, run in one transaction on the autocommit connection `conn`, wrote to the
    WAL (pg_walinspect), one row per relation and record type: the heap update (HOT or not) and
    every index entry, named. Meant for a quiet server: records other sessions write in between
    are counted too."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    with conn.transaction():
        # pg_walinspect reads only WAL that has been flushed: this commit waits for its flush.
        conn.execute("SET LOCAL synchronous_commit = on")
        for statement in statements:
            conn.execute(statement)
    end = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    rows = conn.execute(
        r"""SELECT r.resource_manager, r.record_type,
                   coalesce((SELECT string_agg(coalesce(pg_filenode_relation(
                                 CASE WHEN b[1]::oid = 1663 THEN 0 ELSE b[1]::oid END, b[3]::oid)::text,
                                 'relfilenode ' || b[3]), ', ')
                             FROM regexp_matches(r.block_ref, 'rel (\d+)/(\d+)/(\d+)', 'g') AS b), '') AS relation,
                   count(*), sum(r.record_length)
            FROM pg_get_wal_records_info(%s, %s) AS r
            GROUP BY 1, 2, 3 ORDER BY 1, 2, 3""", (start, end)).fetchall()
    return [{"rmgr": r[0], "record": r[1], "relation": r[2], "count": r[3], "bytes": int(r[4])} for r in rows]


def index_entries(records: list[dict]) -> dict[str, int]:
    """Index entries written, per index, from wal_written's records."""
    out: dict[str, int] = {}
    for r in records:
        # A split carries the entry that caused it; INSERT_UPPER is a downlink, not a message's entry.
        if r["rmgr"] == "Btree" and r["record"] in ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R"):
            out[r["relation"]] = out.get(r["relation"], 0) + r["count"]
    return out
