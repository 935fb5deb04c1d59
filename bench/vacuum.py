"""Held-back vacuum: the same dequeue figures while another session keeps a REPEATABLE READ
transaction open (with its snapshot taken) for the whole held phase, and the dead tuples that pile
up meanwhile (pg_stat_user_tables.n_dead_tup, and pgstattuple's exact count).

Per kind: clean cells (each starts from a VACUUMed table), a clean timeline, then the holder opens
its snapshot, then a held timeline and the held cells, then the dead tuples are read, the holder
ends and the table is vacuumed. Clean and held cells run the same shapes in the same order. Before
the holder opens and before it ends, the buffers a new session's and a consuming session's dequeue
read (profile.py): the work behind the throughput, which a busy machine does not blur.
"""
from __future__ import annotations

import threading
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


class DeadSampler(threading.Thread):
    """n_dead_tup once a second (statistics are flushed by backends about once a second)."""

    def __init__(self, env: Env, name: str):
        super().__init__(daemon=True)
        self.env, self.name, self.samples = env, name, []
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                d = dead_tuples(self.env, self.name)
                self.samples.append((round(time.monotonic() - self.t0, 2), d.get("n_dead_tup")))
            except psycopg.Error:
                pass
            self.stop_event.wait(1.0)

    def stop(self) -> list:
        self.stop_event.set()
        self.join(5)
        return self.samples


def run_kind(env: Env, kind: str, shapes: list[tuple[int, int]], depth: int, seconds: float,
             timeline_seconds: float, timeline_shape: tuple[int, int], log: Any) -> dict:
    name = f"q_{kind}"
    out: dict[str, Any] = {"kind": kind, "depth": depth, "clean": [], "held": []}
    for c, b in shapes:
        out["clean"].append(cell(env, name, "dequeue", c, b, depth, seconds))
    set_depth(env, name, depth)
    tc, tb = timeline_shape
    out["clean_timeline"] = cell(env, name, "dequeue", tc, tb, depth, timeline_seconds)
    set_depth(env, name, depth)
    out["explain_clean"] = explain_claim(env, name, 1, "clean")
    out["consumer_clean"] = consuming_session_buffers(env, name)
    set_depth(env, name, depth)
    holder = SnapshotHolder(env)
    out["holder_xmin"] = holder.xmin
    try:
        sampler = DeadSampler(env, name)
        sampler.start()
        out["held_timeline"] = cell(env, name, "dequeue", tc, tb, depth, timeline_seconds, prepare=False)
        out["dead_after_timeline"] = dead_tuples(env, name, exact=True)
        for c, b in shapes:
            # set_depth still VACUUMs: with the snapshot held it can remove nothing new.
            result = cell(env, name, "dequeue", c, b, depth, seconds)
            result["dead"] = dead_tuples(env, name)
            out["held"].append(result)
        out["dead_samples"] = sampler.stop()
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
    ct, ht = out["clean_timeline"]["throughput"], out["held_timeline"]["throughput"]
    out["timeline_ratio"] = ht / ct if ct else None
    log(f"  vacuum {kind}: clean {ct:.0f}/s, held {ht:.0f}/s (ratio {out['timeline_ratio']:.2f}), "
        f"dead tuples at end {out['dead_end'].get('pgstattuple_dead', out['dead_end'].get('n_dead_tup'))}, "
        f"a consuming session's dequeue reads {out['consumer_clean'].get('least', 'error')} -> "
        f"{out['consumer_held'].get('least', 'error')} buffers")
    return out
