"""Entry point: `python -m bench.run` (what `make bench` runs). See docs/BENCHMARKS.md.

    python -m bench.run                 # the full run: docs/BENCHMARKS.md, docs/bench/*.png, results.json
    python -m bench.run --quick         # a reduced matrix in a couple of minutes (to build/bench-quick)
    python -m bench.run --quick --parts matrix,peer --kinds fifo,work --out /tmp/b
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import ceiling, consumers, groups, instructions, overhead, peer, pgmq_peer, vacuum
from .cells import cell
from .profile import consuming_session_buffers, enqueue_batch_buffers, explain_claim, planning_vs_execution
from .env import (REPO, available_kinds, cpu_accounting, cpu_share, create_database, deploy_env, drop_database,
                  host_stall_probe, machine_facts, queue_entries, server, set_depth)

PARTS = ("matrix", "depth", "vacuum", "ceiling", "overhead", "peer", "pgmq", "instructions", "consumers", "groups")
# The share of the host check's loop lost to stalls above which a run is reported as measuring the host.
STALLING = 0.05
# The exit code of a full run refused on a stalling host (argparse's is 2, a failed check's 1).
REFUSED = 3


@dataclass
class Plan:
    matrix_processes: tuple[int, ...] = (1, 2, 4, 8)
    matrix_batches: tuple[int, ...] = (1, 10, 100)
    matrix_depth: int = 1_000
    matrix_seconds: float = 2.0
    depths: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    depth_processes: tuple[int, ...] = (1, 4)
    depth_batches: tuple[int, ...] = (1, 10, 100)
    depth_seconds: float = 1.5
    # (op, processes, batch, rounds): the depth target's shape twice, the others once.
    depth_pairs: tuple = (("dequeue", 4, 1, 2), ("enqueue", 4, 1, 1), ("enqueue", 4, 100, 1))
    vacuum_shapes: tuple[tuple[int, int], ...] = ((1, 1), (4, 1), (4, 10), (4, 100))
    vacuum_seconds: float = 2.0
    # Per side (clean, held), in vacuum_slices alternating slices.
    vacuum_timeline_seconds: float = 15.0
    vacuum_slices: int = 6
    vacuum_timeline_shape: tuple[int, int] = (4, 1)
    ceiling_clients: int = 4
    ceiling_seconds: float = 3.0
    ceiling_batches: tuple[int, ...] = (1, 10)
    ceiling_rounds: int = 2
    peer_processes: int = 4
    peer_batches: tuple[int, ...] = (1, 10, 100)
    peer_messages: dict = field(default_factory=lambda: {1: 12_000, 10: 40_000, 100: 100_000})
    peer_rounds: dict = field(default_factory=lambda: {1: 2})
    # pgmq, in both commit regimes: pgbench runs of pgmq_seconds (or, when pgmq_transactions is set,
    # that many transactions per client), then the instruction counts under callgrind.
    pgmq_clients: int = 4
    pgmq_seconds: float = 3.0
    pgmq_rounds: int = 2
    pgmq_transactions: int = 0
    pgmq_batches: tuple[int, ...] = (10, 100)
    pgmq_enqueue_batches: tuple[int, ...] = (1, 10, 100)
    pgmq_counted: bool = True
    # Message groups: tiny fills and depths on --quick (bench/groups.py).
    groups_quick: bool = False
    # Messages a waiting consumer is woken for, per way of waking.
    consumers_wakes: int = 40
    # A paced producer (messages/s, seconds) for four consumers per way of waiting; then the same
    # consumers idle this long.
    consumers_rate: float = 200.0
    consumers_seconds: float = 20.0
    consumers_idle_seconds: float = 20.0


def quick_plan() -> Plan:
    return Plan(matrix_processes=(1, 4), matrix_batches=(1, 10), matrix_seconds=0.5,
                depths=(1_000, 20_000), depth_processes=(4,), depth_batches=(10,), depth_seconds=0.5,
                depth_pairs=(("dequeue", 4, 1, 1),),
                vacuum_shapes=((4, 1),), vacuum_seconds=0.5, vacuum_timeline_seconds=2.0, vacuum_slices=2,
                ceiling_seconds=1.0, ceiling_batches=(1,), ceiling_rounds=1,
                peer_batches=(1, 10), peer_messages={1: 1_000, 10: 2_000},
                pgmq_clients=2, pgmq_rounds=1, pgmq_transactions=10, pgmq_batches=(10,), pgmq_enqueue_batches=(1, 10),
                pgmq_counted=False, groups_quick=True,
                consumers_wakes=10, consumers_seconds=1.0, consumers_idle_seconds=1.0)


def _log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)


def run_matrix(env, kinds, plan: Plan, log) -> list[dict]:
    out = []
    for kind in kinds:
        name = f"q_{kind}"
        for op in ("enqueue", "dequeue"):
            for p in plan.matrix_processes:
                for b in plan.matrix_batches:
                    r = cell(env, name, op, p, b, plan.matrix_depth, plan.matrix_seconds)
                    out.append(r)
                    log(f"  matrix {kind:8} {op:8} processes={p} batch={b:<3} {r['throughput']:9.0f} msg/s "
                        f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms{'' if r['check']['ok'] else '  CHECK FAILED'}")
    return out


def run_depth(env, kinds, plan: Plan, log) -> tuple[list[dict], list[dict]]:
    out, explains = [], []
    for kind in kinds:
        name = f"q_{kind}"
        for depth in plan.depths:
            t0 = time.monotonic()
            set_depth(env, name, depth)  # preload: one set-based INSERT ... SELECT generate_series
            load = time.monotonic() - t0
            log(f"  depth {kind}: {depth} messages loaded in {load:.1f}s")
            for op in ("enqueue", "dequeue"):
                for p in plan.depth_processes:
                    for b in plan.depth_batches:
                        r = cell(env, name, op, p, b, depth, plan.depth_seconds)
                        r["load_seconds"] = load
                        out.append(r)
                        log(f"  depth {kind:8} {depth:>9} {op:8} processes={p} batch={b:<3} "
                            f"{r['throughput']:9.0f} msg/s p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms"
                            f"{'' if r['check']['ok'] else '  CHECK FAILED'}")
            set_depth(env, name, depth)
            profile = explain_claim(env, name, 1, f"depth {depth}")
            profile["enqueue_batch_100_buffers"] = enqueue_batch_buffers(env, name, 100)
            profile["consumer"] = consuming_session_buffers(env, name, consume=min(300, depth // 2))
            explains.append(profile)
        with env.conn() as conn:  # back to an empty table for the next parts
            conn.execute(f"TRUNCATE {env.table(name)}")
    return out, explains


def run_depth_pairs(env, kinds, plan: Plan, log) -> list[dict]:
    """Chosen shapes measured alternately on two identical queues, one held at the shallowest depth
    and one at the deepest, so that a noisy machine hits both alike."""
    out = []
    lo, hi = plan.depths[0], plan.depths[-1]
    for kind in kinds:
        shallow, deep = f"q_{kind}", f"q_{kind}_deep"
        set_depth(env, deep, hi)
        for op, p, b, rounds in plan.depth_pairs:
            runs: dict[int, list] = {lo: [], hi: []}
            for _ in range(rounds):
                for depth, name in ((lo, shallow), (hi, deep), (hi, deep), (lo, shallow)):
                    r = cell(env, name, op, p, b, depth, plan.depth_seconds)
                    runs[depth].append({k: r[k] for k in ("throughput", "p50_ms", "p99_ms", "check")})
            mean = {d: sum(r["throughput"] for r in rs) / len(rs) for d, rs in runs.items()}
            entry = {"kind": kind, "op": op, "processes": p, "batch": b, "shallow": lo, "deep": hi, "runs": runs,
                     "throughput": mean, "ratio": mean[hi] / mean[lo] if mean[lo] else None}
            log(f"  depth pairs {kind} {op} processes={p} batch={b}: {lo:,} waiting {mean[lo]:.0f}/s, "
                f"{hi:,} waiting {mean[hi]:.0f}/s, ratio {entry['ratio']:.2f}")
            out.append(entry)
        with env.conn() as conn:
            conn.execute(f"TRUNCATE {env.table(deep)}, {env.table(shallow)}")
    return out


def run_vacuum(env, kinds, plan: Plan, log, admin_url: str) -> list[dict]:
    """The held queues live in the benchmark's database, where the holder holds its snapshot; their
    clean twins in a second database on the same server, which that snapshot does not hold back
    (PostgreSQL 14 and later keep a snapshot's horizon to its own database), so clean and held
    slices can alternate and a noisy machine hits both alike."""
    twin_url = create_database(admin_url, "bench_clean")
    try:
        clean_env = deploy_env(twin_url, queue_entries(kinds))
        try:
            return [vacuum.run_kind(env, clean_env, kind, list(plan.vacuum_shapes), plan.matrix_depth,
                                    plan.vacuum_seconds, plan.vacuum_timeline_seconds, plan.vacuum_slices,
                                    plan.vacuum_timeline_shape, log) for kind in kinds]
        finally:
            clean_env.drop()
    finally:
        drop_database(admin_url, twin_url)


def run_ceiling(env, kinds, plan: Plan, log) -> list[dict]:
    return ceiling.run(env, kinds, plan.ceiling_clients, plan.ceiling_seconds, plan.ceiling_batches,
                       plan.ceiling_rounds, log)


def run_peer(env, kinds, plan: Plan, log, admin_url: str) -> dict:
    queues = [q for q in ("q_work", "q_work_with_history") if "work" in kinds
              and any(x.name == q for x in env.catalog.queues)]
    if not queues:  # no work kind yet: compare the closest destructive shape, and say so
        queues = ["q_fifo"] if "fifo" in kinds else [f"q_{kinds[0]}"]
    pgq_url = peer.pgq_database(admin_url)
    try:
        rows = peer.run(env, pgq_url, queues, plan.peer_processes, plan.peer_batches, plan.peer_messages, log,
                        plan.peer_rounds)
        via_pgbench = peer.pgbench_cycle(env, pgq_url, queues, plan.ceiling_clients, plan.ceiling_seconds,
                                         plan.ceiling_rounds, log) if "work" in kinds else None
    finally:
        drop_database(admin_url, pgq_url)
    return {"queues": queues, "rows": rows, "pgbench": via_pgbench}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced matrix, tiny sizes (a couple of minutes)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--kinds", default="", help="comma list of kinds (default: every kind with a template)")
    parser.add_argument("--out", default="", help="output folder (default: docs/ for a full run, "
                                                   "build/bench-quick for --quick)")
    parser.add_argument("--seconds", type=float, default=0, help="override every per-cell duration")
    parser.add_argument("--no-report", action="store_true", help="results.json only: no plots, no markdown")
    parser.add_argument("--merge", action="store_true",
                        help="add this run's parts to the results.json already in the output folder (replacing "
                             "those parts, keeping the others) and render the report from both; the report "
                             "names the run each merged part came from")
    parser.add_argument("--on-a-stalling-host", action="store_true",
                        help="publish to docs/ even when the host check at the start finds this machine "
                             f"stalling (without it such a run stops before it starts, exit code {REFUSED}; "
                             "a host that starts stalling later is flagged in the report)")
    args = parser.parse_args(argv)

    plan = quick_plan() if args.quick else Plan()
    if args.seconds:
        plan.matrix_seconds = plan.depth_seconds = plan.vacuum_seconds = args.seconds
        plan.vacuum_timeline_seconds = max(args.seconds, 1.0)
        plan.ceiling_seconds = plan.pgmq_seconds = max(1.0, args.seconds)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or available_kinds()
    missing = [k for k in kinds if k not in available_kinds()]
    if missing:
        parser.error(f"no PostgreSQL template for kind(s): {', '.join(missing)}")
    out_root = Path(args.out) if args.out else (REPO / "build" / "bench-quick" if args.quick else REPO / "docs")
    bench_dir = out_root / "bench"

    started = time.monotonic()
    stalls_start, accounting_start = host_stall_probe(), cpu_accounting()
    _log(f"host check: a busy loop lost {stalls_start['lost_seconds']:.2f}s of {stalls_start['seconds']:.0f}s "
         f"to gaps over 20 ms (longest {stalls_start['longest_gap_seconds']:.2f}s)")
    if stalls_start["lost_seconds"] > STALLING * stalls_start["seconds"]:
        publishes = out_root.resolve() == (REPO / "docs").resolve()
        if publishes and not args.on_a_stalling_host:
            print(f"bench: refusing to replace {out_root / 'BENCHMARKS.md'} with a measurement of this host: "
                  f"a busy loop lost {stalls_start['lost_seconds']:.2f}s of {stalls_start['seconds']:.0f}s to "
                  f"stalls (more than {STALLING:.0%}), so throughput and latency would measure the machine, "
                  "not tablequeue. Run it on a quiet machine; or measure here with --out DIR (or --quick); "
                  "or publish anyway with --on-a-stalling-host (the report then says the host was stalling).",
                  file=sys.stderr)
            return REFUSED
        _log("WARNING: this machine is stalling: throughput and latency will measure the host; "
             "buffer counts and plans stay valid")
    earlier = bench_dir / "results.json"
    if args.merge and not earlier.exists():
        parser.error(f"--merge: no results to merge into at {earlier}")
    bench_dir.mkdir(parents=True, exist_ok=True)
    command = "make bench  (= .venv/bin/python -m bench.run" + (" " + " ".join(argv or sys.argv[1:])).rstrip() + ")"
    results: dict = {"command": command, "quick": args.quick, "parts": parts, "kinds": kinds,
                     "plan": asdict(plan), "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    with server() as srv:
        _log(f"server: {'embedded throwaway cluster' if srv['embedded'] else 'TABLEQUEUE_PG_URL'}")
        env = deploy_env(srv["url"], queue_entries(kinds, extra_work_history="peer" in parts,
                                                   deep="depth" in parts))
        results["facts"] = machine_facts(srv["url"])
        results["facts"]["embedded"] = srv["embedded"]
        results["schema"] = env.schema
        try:
            for part in parts:
                t0 = time.monotonic()
                _log(f"part {part}")
                keys_before = set(results)
                try:
                    run_part(part, results, env, kinds, plan, srv["url"])
                    results.setdefault("part_keys", {})[part] = sorted(set(results) - keys_before)
                except Exception:  # one part's failure must not lose the others' results
                    results.setdefault("errors", {})[part] = traceback.format_exc()
                    _log(f"part {part} FAILED:\n{results['errors'][part]}")
                results.setdefault("part_seconds", {})[part] = time.monotonic() - t0
                _log(f"part {part} done in {time.monotonic() - t0:.0f}s")
        finally:
            try:
                env.drop()
            except Exception:  # a failed clean-up must not lose the measurements
                results.setdefault("errors", {})["clean-up"] = traceback.format_exc()
                _log(f"clean-up FAILED:\n{results['errors']['clean-up']}")
        results["facts"]["loadavg_end"] = os.getloadavg()
    results["facts"]["host"] = {"stalls_start": stalls_start, "stalls_end": host_stall_probe(),
                                "cpu_share": cpu_share(accounting_start, cpu_accounting()),
                                "stalling_above": STALLING}
    results["total_seconds"] = time.monotonic() - started
    _log(f"results: {bench_dir / 'results.json'} ({results['total_seconds']:.0f}s)")
    if args.merge:
        results = merged(json.loads(earlier.read_text()), results)
    (bench_dir / "results.json").write_text(json.dumps(results, indent=2, default=_json_default) + "\n")
    if not args.no_report:
        from .report import write_report

        path = write_report(results, out_root)
        _log(f"report: {path}")
    return 0 if all_checks_ok(results) else 1


def run_part(part: str, results: dict, env, kinds: list[str], plan: Plan, admin_url: str) -> None:  # noqa: ANN001
    if part == "matrix":
        results["matrix"] = run_matrix(env, kinds, plan, _log)
    elif part == "depth":
        results["depth"], results["depth_explain"] = run_depth(env, kinds, plan, _log)
        results["depth_pairs"] = run_depth_pairs(env, kinds, plan, _log)
    elif part == "vacuum":
        results["vacuum"] = run_vacuum(env, kinds, plan, _log, admin_url)
    elif part == "ceiling":
        results["ceiling"] = run_ceiling(env, kinds, plan, _log)
        results["planning"] = planning_vs_execution(env, kinds)
    elif part == "overhead":
        results["overhead"] = overhead.run(env, kinds, plan.ceiling_clients, plan.ceiling_seconds,
                                           plan.ceiling_rounds, _log)
    elif part == "peer":
        results["peer"] = run_peer(env, kinds, plan, _log, admin_url)
    elif part == "pgmq":
        results["pgmq"] = pgmq_peer.run(plan.pgmq_clients, plan.pgmq_seconds, plan.pgmq_rounds, plan.pgmq_transactions,
                                        plan.pgmq_batches, plan.pgmq_enqueue_batches, plan.pgmq_counted, _log)
        # The section can be merged into a report of an earlier full run: it names its own commit.
        results["pgmq"]["git_head"] = results["facts"].get("git_head")
    elif part == "instructions":
        results["instructions"] = instructions.run(kinds, _log)
    elif part == "consumers":
        results["consumers"] = consumers.run(env.url, 4, plan.ceiling_seconds, max(2, plan.ceiling_rounds),
                                             plan.consumers_wakes, plan.consumers_rate, plan.consumers_seconds,
                                             plan.consumers_idle_seconds, _log)
    elif part == "groups":
        results["groups"] = groups.run(env.url, 4, plan.ceiling_seconds, max(2, plan.ceiling_rounds), _log,
                                       quick=plan.groups_quick)


def merged(earlier: dict, run: dict) -> dict:
    """The earlier results with the parts of `run` in place of theirs (a failed part keeps the
    earlier results and records the error), and for each part the facts of the run it came from."""
    out = dict(earlier)
    errors = {p: e for p, e in (out.get("errors") or {}).items() if p not in run["parts"]}
    facts = run["facts"]
    for part in run["parts"]:
        if part in (run.get("errors") or {}):
            errors[part] = run["errors"][part]
            continue
        for key in run["part_keys"][part]:
            out[key] = run[key]
        out.setdefault("part_seconds", {})[part] = run["part_seconds"][part]
        out.setdefault("part_runs", {})[part] = {
            "command": run["command"], "started_at": run["started_at"], "seconds": run["total_seconds"],
            "git_head": facts.get("git_head"), "templates_dirty": facts.get("templates_dirty"),
            "loadavg_start": facts["loadavg_start"], "loadavg_end": facts["loadavg_end"], "host": facts["host"]}
        if part not in out["parts"]:
            out["parts"] = [*out["parts"], part]
    errors.update({what: e for what, e in (run.get("errors") or {}).items() if what not in run["parts"]})
    out["errors"] = errors
    if not errors:
        del out["errors"]
    return out


def all_checks_ok(results: dict) -> bool:
    from .report import failed_checks

    failures = failed_checks(results) + [f"part {part} failed" for part in results.get("errors") or {}]
    for f in failures:
        print("CHECK FAILED:", f, file=sys.stderr)
    return not failures


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
