"""Proposed template changes, measured in the same run without touching the templates.

Each proposal is a text transformation of the *rendered* function (so it follows the template),
applied with CREATE OR REPLACE to a second queue of the same kind (q_<kind>_prop) in the bench
schema. The current and the proposed function are then measured side by side, alternating:
with pgbench (C client, next to the raw SQL ceiling) and with the Python client cells.

P1 "batch-1 claim": when batch_size (work: the remaining count) is 1, run the same claim with a
   literal LIMIT 1. PL/pgSQL caches plans per statement; a claim with `LIMIT batch_size` is
   re-planned on every call (its generic plan, costed for an unknown LIMIT, is a sort over the
   whole table, so the plan cache rightly keeps choosing custom plans), while the LIMIT 1 twin
   has a generic plan that is the same index scan and is planned once per session.
P2 "own-messages probe" (work): run the claim of the worker's own messages only when
   `EXISTS (... WHERE leased_by = worker)`: the probe is a one-line statement whose plan is cached;
   the four-CTE claim it guards is re-planned on every call.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .cells import cell
from .ceiling import Shape, fn_call, measure, raw_destructive_dequeue, rendered_unit
from .env import Env, set_depth
from .profile import explain_claim
from .work_raw import WORKER, work_minimal_cycle


def prop_name(kind: str) -> str:
    return f"q_{kind}_prop"


def destructive_batch1(body: str) -> str:
    m = re.search(r"(    RETURN QUERY\s*WITH\b.*?;)\s*END;", body, re.S)
    if not m or "LIMIT batch_size" not in m.group(1):
        raise RuntimeError("bench: claim statement not found for proposal P1")
    stmt = m.group(1)
    one = stmt.replace("LIMIT batch_size", "LIMIT 1")
    return body.replace(stmt, "    IF batch_size = 1 THEN\n" + one + "\n    ELSE\n" + stmt + "\n    END IF;")


def work_batch1(body: str) -> str:
    m = re.search(r"(\n[ ]*WITH next_messages AS \([^;]*?WHERE m\.visible_at <= now_utc.*?INTO step_ids, buried_count;)",
                  body, re.S)
    if not m or "LIMIT remaining" not in m.group(1):
        raise RuntimeError("bench: visible claim not found for proposal P1 (work)")
    stmt = m.group(1)
    one = stmt.replace("LIMIT remaining", "LIMIT 1")
    return body.replace(stmt, "\n    IF remaining = 1 THEN" + one + "\n    ELSE" + stmt + "\n    END IF;")


def work_probe(body: str, table: str, fn: str) -> str:
    m = re.search(r"(\n[ ]*WITH next_messages AS \([^;]*?WHERE m\.leased_by = [^;]*?INTO step_ids, buried_count;"
                  r"\s*claimed_ids := claimed_ids \|\| coalesce\(step_ids, '\{\}'\);)", body, re.S)
    if not m:
        raise RuntimeError("bench: own-messages claim not found for proposal P2 (work)")
    stmt = m.group(1)
    guard = f"\n    IF EXISTS (SELECT FROM {table} AS m WHERE m.leased_by = {fn}_dequeue.worker) THEN"
    return body.replace(stmt, guard + stmt + "\n    END IF;")


def install(env: Env, kind: str) -> dict[str, tuple[list[str], str]]:
    """Replace q_<kind>_prop's dequeue with the proposed version."""
    name = prop_name(kind)
    out = {}
    body = rendered_unit(env, name, "dequeue").split("\nREVOKE ALL")[0]
    if kind == "work":
        out["dequeue"] = (["P1", "P2"], work_batch1(work_probe(body, env.table(name), name)))
    else:
        out["dequeue"] = (["P1"], destructive_batch1(body))
    with env.conn() as conn:
        for _, sql in out.values():
            conn.execute(sql)
    return out


def _work_fn_script(env: Env, queue: str) -> str:
    return (f'SELECT id FROM "{env.schema}"."{queue}_dequeue"(batch_size => 1, worker => {WORKER}, '
            f"lease_seconds => 300) \\gset\n"
            f'SELECT * FROM "{env.schema}"."{queue}_complete"(id => :id, worker => {WORKER});\n')


def run(env: Env, kinds: list[str], clients: int, seconds: float, rounds: int, cell_seconds: float,
        log: Any) -> list[dict]:
    import os
    import shutil
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="tq-prop-"))
    os.chmod(workdir, 0o755)
    out = []
    try:
        for kind in kinds:
            name = prop_name(kind)
            if not any(q.name == name for q in env.catalog.queues):
                continue
            installed = install(env, kind)
            base = f"q_{kind}"
            for verb, (proposals, sql) in installed.items():
                if kind == "work":
                    current, proposed = _work_fn_script(env, base), _work_fn_script(env, name)
                    raw, op, depth = work_minimal_cycle(env, base), "cycle", int(25_000 * seconds)
                else:
                    current = "\\set batch 1\n" + fn_call(env, base, "dequeue", "batch_size => :batch")
                    proposed = "\\set batch 1\n" + fn_call(env, name, "dequeue", "batch_size => :batch")
                    raw, op, depth = "\\set batch 1\n" + raw_destructive_dequeue(env, base), "dequeue", int(25_000 * seconds)
                variants = {"raw": Shape("raw", base, op, 1, raw, raw),
                            "current": Shape("current", base, op, 1, current, current),
                            "proposed": Shape("proposed", name, op, 1, proposed, proposed)}
                runs: dict[str, list] = {k: [] for k in variants}
                for v in (list(variants) + list(reversed(variants))) * rounds:
                    runs[v].append(measure(env, variants[v], "fn", clients, seconds, depth, workdir))
                pg = {v: sum(r["messages_per_s"] for r in rs) / len(rs) for v, rs in runs.items()}
                # The Python client path (what the matrix and the peer use): 4 processes, batch 1.
                py: dict[str, list] = {"current": [], "proposed": []}
                for _ in range(rounds):
                    for v, q in (("current", base), ("proposed", name), ("proposed", name), ("current", base)):
                        py[v].append(cell(env, q, verb, 4, 1, 1_000, cell_seconds)["throughput"])
                pyavg = {v: sum(x) / len(x) for v, x in py.items()}
                entry = {"kind": kind, "verb": verb, "proposals": proposals, "function_sql": sql,
                         "pgbench": pg, "pgbench_runs": {v: [r["messages_per_s"] for r in rs] for v, rs in runs.items()},
                         "python": pyavg, "python_runs": py, "clients": clients, "seconds": seconds,
                         "current_vs_raw": pg["current"] / pg["raw"], "proposed_vs_raw": pg["proposed"] / pg["raw"],
                         "proposed_vs_current": pg["proposed"] / pg["current"],
                         "python_proposed_vs_current": pyavg["proposed"] / pyavg["current"]}
                if verb == "dequeue":
                    # The LIMIT 1 claim's cached generic plan must stay the index scan however deep the queue.
                    set_depth(env, name, 1_000_000)
                    entry["explain_proposed"] = explain_claim(env, name, 1, "proposed, 1,000,000 waiting")
                    with env.conn() as conn:
                        conn.execute(f"TRUNCATE {env.table(name)}")
                log(f"  proposals {kind} {verb} {'+'.join(proposals)}: pgbench raw {pg['raw']:.0f}/s, current "
                    f"{pg['current']:.0f}/s ({entry['current_vs_raw']:.2f}), proposed {pg['proposed']:.0f}/s "
                    f"({entry['proposed_vs_raw']:.2f}); python client current {pyavg['current']:.0f}/s, proposed "
                    f"{pyavg['proposed']:.0f}/s ({entry['python_proposed_vs_current']:.2f}x)")
                out.append(entry)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out
