"""PostgreSQL: no statement inside a verb is planned again on every call.

PL/pgSQL caches a statement's plan, but under plan_cache_mode = auto it keeps re-planning a statement
whose custom plan (costed with the call's real array length or LIMIT) always looks cheaper than the
generic one: dequeue's result over unnest(claimed_ids), enqueue_batch, complete_batch and the fifo
claim with LIMIT batch_size were each planned on every call (80-430 µs, a third to half of a call's
server time). pg_stat_statements counts plans per nested statement: after many calls, every statement
the verbs ran must have been planned only a handful of times.
"""
from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from tablequeue.embedded import start_embedded

CALLS = 40
CATALOG = """\
schema: q
queues:
  - {name: jobs, kind: work, payload: text, options: {history: true, dedupe: true}}
  - {name: ranked, kind: work, payload: text, options: {priority: true}}
  - {name: f, kind: fifo, payload: text, options: {dedupe: true}}
  - {name: p, kind: pending, payload: text}
  - {name: h, kind: heap, payload: text}
  - {name: l, kind: lifo, payload: text}
"""


@pytest.fixture(scope="module")
def counted_url(tmp_path_factory: pytest.TempPathFactory):
    server = start_embedded({"shared_preload_libraries": "pg_stat_statements",
                             "pg_stat_statements.track": "all", "pg_stat_statements.track_planning": "on"})
    try:
        catalog = tmp_path_factory.mktemp("plan_cache") / "queues.yml"
        catalog.write_text(CATALOG)
        subprocess.run([sys.executable, "-m", "tablequeue", "deploy", "--url", server.url, "--catalog", str(catalog)],
                       check=True, capture_output=True, text=True)
        yield server.url
    finally:
        server.stop()


def test_no_statement_of_a_verb_is_planned_on_every_call(counted_url: str) -> None:
    with psycopg.connect(counted_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        for i in range(CALLS):
            conn.execute("SELECT * FROM q.jobs_enqueue('x', dedupe_key => %s)", (f"k{i}",))
            conn.execute("SELECT * FROM q.jobs_enqueue_batch(%s, dedupe_keys => %s)",
                         (["a", "b", "c"], [f"a{i}", f"b{i}", f"c{i}"]))
            conn.execute("SELECT * FROM q.ranked_enqueue_batch(%s, priorities => %s)", (["a", "b", "c"], [1, 5, 9]))
            for queue in ("f", "h", "l"):
                conn.execute(f"SELECT * FROM q.{queue}_enqueue_batch(%s)", (["a", "b", "c"],))
            conn.execute("SELECT * FROM q.p_enqueue('x', now())")
        for _ in range(CALLS):
            for queue in ("f", "h", "l", "p"):
                conn.execute(f"SELECT * FROM q.{queue}_dequeue(2)").fetchall()
            for queue in ("jobs", "ranked"):
                rows = conn.execute(f"SELECT * FROM q.{queue}_dequeue(3, 'w', 60)").fetchall()
                assert rows, queue
                conn.execute(f"SELECT * FROM q.{queue}_complete_batch(ids => %s, worker => 'w', lease_tokens => %s)",
                             ([row[0] for row in rows], [row[-1] for row in rows])).fetchall()
            conn.execute("CALL q.jobs_wait(0, NULL)")
        replanned = conn.execute(
            "SELECT calls, plans, left(regexp_replace(query, '\\s+', ' ', 'g'), 120) FROM pg_stat_statements"
            " WHERE NOT toplevel AND calls >= %s AND plans > calls / 4 ORDER BY plans DESC", (CALLS,)).fetchall()
        ran = conn.execute("SELECT count(*) FROM pg_stat_statements WHERE NOT toplevel AND calls >= %s",
                           (CALLS,)).fetchone()[0]
    assert ran > 20, "pg_stat_statements saw too few statements of the verbs to judge"
    assert replanned == [], replanned
