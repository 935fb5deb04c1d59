"""Held-back vacuum: the same dequeue figures while another session keeps a REPEATABLE READ
transaction open (with its snapshot taken) for the whole held phase, and the dead tuples that pile
up meanwhile (pg_stat_user_tables.n_dead_tup, and pgstattuple's exact count).

Per kind, two identical queues: the held one in the benchmark's database, where the holder opens
its snapshot, and its clean twin in a second database, which the snapshot does not hold back.
Before the holder opens, the buffers a new session's and a consuming session's dequeue read
(profile.py). While it is open, the timeline alternates clean and held slices (clean, held, held,
clean, ...) so that a machine that stalls now and then stalls both sides alike, and each cell shape
runs clean and then held. Then the dead tuples and the buffers again, the holder ends and the table
is vacuumed. Buffers are the work behind the throughput, which a busy machine does not blur.
"""
from __future__ import annotations

import time
from typing import Any

import psycopg

from .cells import cell
from .env import Env, dead_tuples, set_depth
from .profile import consuming_session_buffers, explain_claim


class SnapshotHolder:
    """A session holding a REPEATABLE READ snapshot: VACUUM may not remove anything deleted after it."""

    def __init__(self, env: Env):
        self.conn = psycopg.connect(env.url, autocommit=False)
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        # The snapshot is taken by the first statement; read a queue table so it is plainly real.
        self.conn.execute("SELECT count(*) FROM pg_class").fetchone()
        self.xmin = self.conn.execute("SELECT backend_xmin::text FROM pg_stat_activity "
                                      "WHERE pid = pg_backend_pid()").fetchone()[0]
        self.opened = time.monotonic()

    def close(self) -> float:
        self.conn.rollback()
        self.conn.close()
        return time.monotonic() - self.opened


def alternate(env: Env, clean_env: Env, name: str, shape: tuple[int, int], depth: int, seconds: float,
              slices: int) -> dict:
    """`slices` clean and `slices` held dequeue slices of seconds / slices each, in the order clean,
    held, held, clean, ...: every neighbouring pair holds one of each side, whose held / clean is a
    pair ratio. Neither queue is reset between its slices: the held one keeps its dead tuples."""
    processes, batch = shape
    order = (["clean", "held", "held", "clean"] * slices)[: 2 * slices]
    runs = []
    for side in order:
        r = cell(clean_env if side == "clean" else env, name, "dequeue", processes, batch, depth,
                 seconds / slices, prepare=False)
        run = {k: r[k] for k in ("throughput", "p50_ms", "p99_ms", "seconds", "timeline", "check")}
        run["side"] = side
        if side == "held":
            run["n_dead_tup"] = dead_tuples(env, name).get("n_dead_tup")
        runs.append(run)
    mean = {side: sum(r["throughput"] for r in runs if r["side"] == side) / slices for side in ("clean", "held")}
    pair_ratios = []
    for a, b in zip(runs[0::2], runs[1::2]):
        held, clean = (a, b) if a["side"] == "held" else (b, a)
        pair_ratios.append(held["throughput"] / clean["throughput"] if clean["throughput"] else None)
    return {"processes": processes, "batch": batch, "slices": slices, "slice_seconds": seconds / slices,
            "runs": runs, "throughput": mean, "pair_ratios": pair_ratios,
            "ratio": mean["held"] / mean["clean"] if mean["clean"] else None}


def run_kind(env: Env, clean_env: Env, kind: str, shapes: list[tuple[int, int]], depth: int, seconds: float,
             timeline_seconds: float, slices: int, timeline_shape: tuple[int, int], log: Any) -> dict:
    name = f"q_{kind}"
    out: dict[str, Any] = {"kind": kind, "depth": depth, "clean": [], "held": []}
    set_depth(env, name, depth)
    out["explain_clean"] = explain_claim(env, name, 1, "clean")
    out["consumer_clean"] = consuming_session_buffers(env, name)
    set_depth(env, name, depth)
    set_depth(clean_env, name, depth)
    holder = SnapshotHolder(env)
    out["holder_xmin"] = holder.xmin
    try:
        out["timeline"] = alternate(env, clean_env, name, timeline_shape, depth, timeline_seconds, slices)
        out["dead_after_timeline"] = dead_tuples(env, name, exact=True)
        for c, b in shapes:
            out["clean"].append(cell(clean_env, name, "dequeue", c, b, depth, seconds))
            # set_depth still VACUUMs: with the snapshot held it can remove nothing new.
            result = cell(env, name, "dequeue", c, b, depth, seconds)
            result["dead"] = dead_tuples(env, name)
            out["held"].append(result)
        out["dead_end"] = dead_tuples(env, name, exact=True)
        out["explain_held"] = explain_claim(env, name, 1, "held")
        set_depth(env, name, depth)
        out["consumer_held"] = consuming_session_buffers(env, name)
    finally:
        out["held_seconds"] = holder.close()
    with env.conn() as conn:
        t0 = time.monotonic()
        conn.execute(f"VACUUM {env.table(name)}")
        out["vacuum_after_release_seconds"] = time.monotonic() - t0
    out["dead_after_vacuum"] = dead_tuples(env, name, exact=True)
    with clean_env.conn() as conn:
        conn.execute(f"TRUNCATE {clean_env.table(name)}")
    t = out["timeline"]
    pairs = ", ".join("-" if r is None else f"{r:.2f}" for r in t["pair_ratios"])
    log(f"  vacuum {kind}: {t['slices']} alternating slices a side, clean {t['throughput']['clean']:.0f}/s, "
        f"held {t['throughput']['held']:.0f}/s (ratio {t['ratio'] or 0:.2f}; pairs {pairs}), "
        f"dead tuples at end {out['dead_end'].get('pgstattuple_dead', out['dead_end'].get('n_dead_tup'))}, "
        f"a consuming session's dequeue reads {out['consumer_clean'].get('least', 'error')} -> "
        f"{out['consumer_held'].get('least', 'error')} buffers")
    return out
