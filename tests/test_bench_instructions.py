"""The benchmark's instruction counts (bench/instructions.py): a server under callgrind, whose
per-message figure is the difference of two runs. Behaviour only: the counts are real, they come
from the runs' own server processes, and a function that wraps a statement counts more than the
statement. How many instructions anything takes is not asserted.
"""
from __future__ import annotations

import pytest

from bench import instructions
from bench.ceiling import enqueue_shapes
from bench.env import deploy_env, queue_entries


def test_a_message_costs_the_difference_of_a_short_and_a_long_run() -> None:
    runs = [{"transactions": 10, "instructions": 5_000, "messages": 10},
            {"transactions": 30, "instructions": 9_000, "messages": 30}]
    assert instructions.marginal(runs)["per_message"] == 200
    assert instructions.marginal([runs[0], runs[0]])["per_message"] is None  # nothing more moved


def test_the_server_under_callgrind_counts_each_run_and_the_function_over_its_statement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    instructions.valgrind()  # installed by tools/setup-system.sh; an error here names the package
    monkeypatch.setattr(instructions, "SHORT", 5)
    monkeypatch.setattr(instructions, "LONG", 25)
    lines: list[str] = []
    with instructions.throwaway_server() as pg:
        deployed = deploy_env(pg.url, queue_entries(["heap"]))
        counter = instructions.count_from_now_on(pg)
        env = instructions.OneConnectionEnv(deployed.url, deployed.schema, deployed.catalog)
        try:
            one_row = enqueue_shapes(env, "q_heap", "heap")[0]
            raw, fn = (instructions.per_message(counter, env, "q_heap", script, "enqueue",
                                                lambda: instructions.at_depth(env, "q_heap", 0))
                       for script in (one_row.raw, one_row.fn))
            ratio = instructions.compared(lines.append, "heap enqueue", ("raw", raw), ("functions", fn))
            # The last run (the function's, 25 one-row enqueues): its inserts, inside its total.
            inside = counter.functions({"insert": ("heap_insert", "btinsert"), "absent": ("no_such_function",)})
        finally:
            counter.close()
            env.shared.close()
    for measured in (raw, fn):
        short, long = measured["runs"]
        assert (short["messages"], long["messages"]) == (5, 25)  # every transaction enqueued one message
        assert 0 < short["instructions"] < long["instructions"]
        assert measured["per_message"] > 0
    assert fn["per_message"] > raw["per_message"]
    assert ratio == pytest.approx(raw["per_message"] / fn["per_message"])
    assert lines and "raw / functions" in lines[0]
    assert 0 < inside["insert"] < fn["runs"][1]["instructions"] and inside["absent"] == 0


def test_the_work_kinds_raw_cycle_is_cut_out_of_the_rendered_functions_and_runs() -> None:
    # work_raw reads dequeue's and complete's statements out of the rendered functions: a template
    # change that moves them must fail here, not half way through `make bench` (it did once).
    import subprocess
    import tempfile
    from pathlib import Path

    from bench.env import server, set_depth
    from bench.work_raw import work_raw_cycle

    with server() as srv:
        for options in ({}, {"history": True}):
            deployed = deploy_env(srv["url"], [{"name": "q_work", "kind": "work", "payload": "json",
                                                "options": options}])
            try:
                set_depth(deployed, "q_work", 20)
                script = work_raw_cycle(deployed, "q_work")
                folder = Path(tempfile.mkdtemp())
                (folder / "cycle.sql").write_text(script)
                run = subprocess.run(["pgbench", "-n", "-M", "prepared", "-c", "1", "-t", "5", "-f",
                                      str(folder / "cycle.sql"), deployed.url], capture_output=True, text=True)
                assert "number of transactions actually processed: 5/5" in run.stdout, run.stdout + run.stderr
                with deployed.conn() as conn:
                    left = conn.execute(f"SELECT count(*) FROM {deployed.table('q_work')}").fetchone()[0]
                assert left == 15, options  # each cycle leased one message and completed it
            finally:
                deployed.drop()
