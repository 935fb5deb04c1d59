"""The benchmark harness's quick path on tiny sizes: behaviour only, never timing.

It must produce results for every kind and its counts must add up (nothing lost, nothing handed
out twice). How fast anything was is not asserted anywhere.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tablequeue.distribution import template_root

pytest.importorskip("matplotlib")


def test_quick_matrix_runs_every_kind_and_loses_nothing(pg_url: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import run
    from bench.env import KINDS

    monkeypatch.setenv("TABLEQUEUE_PG_URL", pg_url)  # the session's cluster: no second server
    code = run.main(["--quick", "--parts", "matrix", "--seconds", "0.3", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "bench" / "results.json").read_text())

    kinds = [k for k in KINDS if (template_root() / "postgres" / f"{k}.sql").exists()]
    assert results["kinds"] == kinds
    cells = results["matrix"]
    for kind in kinds:
        for op in ("enqueue", "dequeue"):
            mine = [c for c in cells if c["kind"] == kind and c["op"] == op]
            assert mine, f"no {op} results for {kind}"
            for c in mine:
                assert c["messages"] > 0 and c["calls"] > 0
                check = c["check"]
                assert check["ok"], check
                if op == "enqueue":
                    assert check["produced"] == check["rows_added"] == check["distinct_ids"]
                else:
                    assert check["before"] + check["refilled"] - check["dequeued"] == check["after"]
                    assert check["distinct_ids"] == check["dequeued"]
    assert code == 0
    # Whether the host ran the benchmark at all is measured and reported, not assumed.
    host = results["facts"]["host"]
    for probe in (host["stalls_start"], host["stalls_end"]):
        assert 0 <= probe["lost_seconds"] <= probe["seconds"] + probe["longest_gap_seconds"]
    assert host["cpu_share"] is None or 0 < host["cpu_share"] <= 1.1
    assert "Host check: a busy 5-second Python loop lost" in (tmp_path / "BENCHMARKS.md").read_text()
    assert (tmp_path / "bench" / "matrix_dequeue.png").stat().st_size > 0


def quiet_probe() -> dict:
    return {"seconds": 5.0, "lost_seconds": 0.0, "gaps": 0, "longest_gap_seconds": 0.0}


def stalling_probe() -> dict:
    return {"seconds": 5.0, "lost_seconds": 3.6, "gaps": 12, "longest_gap_seconds": 0.6}


def test_a_full_run_on_a_stalling_host_stops_before_it_starts_and_keeps_the_published_report(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from bench import run

    published = run.REPO / "docs" / "BENCHMARKS.md"
    before = published.stat().st_mtime_ns
    monkeypatch.setattr(run, "host_stall_probe", stalling_probe)
    monkeypatch.setattr(run, "server", lambda: pytest.fail("a refused run started a server"))
    assert run.main([]) == run.REFUSED
    assert published.stat().st_mtime_ns == before
    message = capsys.readouterr().err
    assert "refusing to replace" in message and "lost 3.60s of 5s" in message and "--on-a-stalling-host" in message


class ServerStarted(Exception):
    pass


def no_server():
    raise ServerStarted


@pytest.mark.parametrize("argv", [["--out", "{tmp}"], ["--quick"], ["--on-a-stalling-host"]])
def test_a_stalling_host_only_warns_when_the_run_is_not_published_or_is_forced(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from bench import run

    monkeypatch.setattr(run, "REPO", tmp_path)      # --quick and the published run write under REPO
    monkeypatch.setattr(run, "host_stall_probe", stalling_probe)
    monkeypatch.setattr(run, "server", no_server)
    with pytest.raises(ServerStarted):
        run.main([a.format(tmp=tmp_path / "out") for a in argv])
    assert "WARNING: this machine is stalling" in capsys.readouterr().out


def test_quick_vacuum_alternates_a_held_queue_with_its_clean_twin_and_drops_the_twin(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from bench import run

    monkeypatch.setenv("TABLEQUEUE_PG_URL", pg_url)
    code = run.main(["--quick", "--parts", "vacuum", "--kinds", "work", "--seconds", "0.3",
                     "--out", str(tmp_path)])
    results = json.loads((tmp_path / "bench" / "results.json").read_text())

    assert code == 0
    assert [v["kind"] for v in results["vacuum"]] == ["work"]
    for v in results["vacuum"]:
        timeline = v["timeline"]
        assert [r["side"] for r in timeline["runs"]] == ["clean", "held", "held", "clean"]
        assert all(r["check"]["ok"] for r in timeline["runs"]), timeline["runs"]
        assert len(timeline["pair_ratios"]) == 2
        held = sum(r["throughput"] for r in timeline["runs"] if r["side"] == "held") / 2
        clean = sum(r["throughput"] for r in timeline["runs"] if r["side"] == "clean") / 2
        assert timeline["ratio"] == pytest.approx(held / clean)
        # The holder's snapshot kept what the held queue consumed; once it ended, VACUUM removed it.
        assert v["dead_end"]["pgstattuple_dead"] > 0
        assert v["dead_after_vacuum"]["pgstattuple_dead"] == 0
        assert [c["check"]["ok"] for c in v["clean"] + v["held"]] == [True, True]
    with psycopg.connect(pg_url) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'bench_clean%'").fetchall()
    assert left == []
    report = (tmp_path / "BENCHMARKS.md").read_text()
    assert "alternating slices" in report and "pair ratios" in report
    assert (tmp_path / "bench" / "vacuum.png").stat().st_size > 0


def test_quick_pgmq_part_runs_every_shape_in_both_commit_regimes_and_moves_what_it_counts(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from bench import run

    monkeypatch.setenv("TABLEQUEUE_PG_URL", pg_url)
    code = run.main(["--quick", "--parts", "pgmq", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "bench" / "results.json").read_text())

    assert code == 0, results.get("errors")
    measured = results["pgmq"]
    clients, transactions = measured["clients"], measured["transactions"]
    assert measured["pgmq_sql"] == "1.13.0"
    assert list(measured["regimes"]) == ["on", "off"]
    for regime, rows in measured["regimes"].items():
        assert [r["key"] for r in rows] == ["cycle", "history", "batch_10", "enqueue_1", "enqueue_10"]
        for row in rows:
            assert row["sides"]["pgmq"]["messages_per_s"] > 0
            for who, side in row["sides"].items():
                # complete_next's first call in each client only leases: it completes nothing.
                per_client = transactions - 1 if who == "complete_next" else transactions
                for r in side["runs"]:
                    assert r["transactions"] == clients * transactions, (regime, row["key"], who)
                    assert r["messages"] == clients * per_client * row["batch"], (regime, row["key"], who)
                    assert r["failed"] == 0 and not r["drained"]
                    assert r["wal_bytes_per_message"] > 0
            assert set(row["ratios"]) == set(row["sides"]) - {"pgmq"}
    # A lease is never a HOT update and writes one entry into every index of the queue table whose
    # predicate its row version meets: storage v2 four, today's (design C) two, as pgmq's read.
    lease = {e["design"].split(":")[0].split(",")[0]: e for e in measured["lease_wal"]}
    assert not any(e["hot"] for e in lease.values())
    with psycopg.connect(pg_url) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'bench_pgmq%'").fetchall()
    assert left == []
    assert sum(lease["v2 (0.2.0 before storage v3)"]["lease_index_entries"].values()) == 4
    assert sum(lease["A"]["lease_index_entries"].values()) == 3
    for design in ("B", "today (design C", "pgmq"):
        assert sum(lease[design]["lease_index_entries"].values()) == 2, design
    report = (tmp_path / "BENCHMARKS.md").read_text()
    assert "A second peer: pgmq" in report and "**synchronous_commit = off**" in report
    assert "dequeue + complete vs pgmq read + delete (batch 1)" in report


def test_groups_part_runs_tiny_and_hands_out_every_message_once(pg_url: str) -> None:
    """bench/groups.py on tiny sizes: the raw fill is the state enqueue leaves (every message is
    handed out once, one group at a time), and the section renders. No timing is asserted."""
    from bench import groups
    from bench.env import deploy_env

    env = deploy_env(pg_url, groups.entries(("fifo", "work"), (3,)))
    try:
        for kind in ("fifo", "work"):
            groups.fill(env, kind, 3, 30)
            drained = groups.consume_calls(env, kind, 3, 30)
            assert drained["calls"] == 30
            with env.conn() as conn:
                assert conn.execute(f"SELECT count(*) FROM {env.table(groups.name_of(kind, 3))}").fetchone()[0] == 0
        rates = groups.throughput(env, ("fifo",), (3,), 2, 0.2, 5_000, 1, lambda line: None)
        deep = groups.dequeue_at_depth(env, "work", ((100, 3), (8, 3)), 5, lambda line: None)
    finally:
        env.drop()
    assert [(row["kind"], row["groups"]) for row in rates] == [("fifo", None), ("fifo", 3)]
    # the short queue is called for half its messages, so its last call still meets the depth it names
    assert all(row["per_s"] > 0 for row in rates) and [row["calls"] for row in deep] == [5, 4]
    lines: list[str] = []
    groups.section({"throughput": rates, "depth": deep}, lines.append)
    report = "\n".join(lines)
    assert "| fifo | 3 |" in report
    ratio = deep[1]["median_ms"] / deep[0]["median_ms"]
    assert f"| work | 100 in 3 groups | 8 in 3 groups | {ratio:.2f} |" in report


def test_quick_consumers_part_merged_into_earlier_results_keeps_their_parts(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import run
    from bench.consumers import MODES

    monkeypatch.setenv("TABLEQUEUE_PG_URL", pg_url)
    monkeypatch.setattr(run, "host_stall_probe", quiet_probe)   # the matrix test runs the real one
    published = json.loads((run.REPO / "docs" / "bench" / "results.json").read_text())
    # The published run's matrix stands for its parts (the report draws fewer plots).
    earlier = {k: v for k, v in published.items() if k in ("command", "quick", "kinds", "plan", "started_at",
                                                            "facts", "schema", "matrix", "total_seconds")}
    earlier.update(parts=["matrix"], part_seconds={"matrix": published["part_seconds"]["matrix"]})
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps(earlier))
    code = run.main(["--quick", "--parts", "consumers", "--merge", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "bench" / "results.json").read_text())

    assert code == 0 and "errors" not in results
    for key in ("facts", "matrix", "started_at", "command"):
        assert results[key] == earlier[key], key
    assert results["parts"] == ["matrix", "consumers"]
    assert "--parts consumers --merge" in results["part_runs"]["consumers"]["command"]
    paced = results["consumers"]["paced"]
    assert [r["mode"] for r in paced["runs"]] == list(MODES)
    for r in paced["runs"]:   # the part itself refuses a run where a message was lost or taken twice
        assert r["messages"] == int(paced["rate"] * paced["seconds"])
        assert r["idle_statements_per_s"] > 0 and r["idle_server_transactions_per_s"] > 0
    wait_verb = next(r for r in paced["runs"] if r["mode"] == "wait verb")
    # The wait verb probes in the server: many transactions for each statement a consumer sends.
    assert wait_verb["idle_server_transactions_per_s"] > 2 * wait_verb["idle_statements_per_s"]
    report = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Throughput and latency by processes and batch size" in report
    assert "The `consumers` part comes from a later run of its own" in report
    assert "consumers at 200 msg/s: waiting against polling" in report


def test_migration_locks_upgrades_the_kept_release_through_every_work_storage_version(pg_url: str) -> None:
    from bench import migration_locks

    scenario = next(s for s in migration_locks.SCENARIOS if s.release)
    steps = migration_locks.run(pg_url, scenario, rows=50)
    timed = {(migration, what) for migration, _, what, _ in steps}
    assert ("work_table_v1_to_v2", "add column lease_token") in timed
    assert ("work_table_v2_to_v3", "build ix_q_ready CONCURRENTLY") in timed
    assert {what for migration, mode, what, _ in steps
            if migration == "work_table_v2_to_v3" and "after the code" in mode} == \
        {"drop ix_q_claim CONCURRENTLY", "drop ix_q_lease CONCURRENTLY"}
    assert steps[-1][0] == "(whole deploy)"
