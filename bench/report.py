"""results.json -> docs/BENCHMARKS.md and docs/bench/*.png (matplotlib, Agg).

Everything numeric in the report comes from the one run recorded in results.json; the analysis
prose that explains the numbers lives in bench/notes.md and is included verbatim.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .groups import section as groups_section  # noqa: E402
from .pgmq_peer import RAW  # noqa: E402

NOTES = Path(__file__).with_name("notes.md")
TARGET_SHAPE = {"processes": 4, "batch": 1}
KIND_ORDER = ("heap", "fifo", "lifo", "pending", "work")


# -- checks and targets -----------------------------------------------------------------------------
def failed_checks(results: dict) -> list[str]:
    failures = []
    for part in ("matrix", "depth"):
        for c in results.get(part) or []:
            if not c["check"]["ok"]:
                failures.append(f"{part} {c['kind']} {c['op']} p={c['processes']} b={c['batch']} d={c['depth']}: "
                                f"{c['check']}")
    for v in results.get("vacuum") or []:
        for c in v["clean"] + v["held"]:
            if not c["check"]["ok"]:
                failures.append(f"vacuum {c['kind']} p={c['processes']} b={c['batch']}: {c['check']}")
        for r in v["timeline"]["runs"]:
            if not r["check"]["ok"]:
                failures.append(f"vacuum {v['kind']} {r['side']} slice: {r['check']}")
    for e in results.get("depth_pairs") or []:
        for rs in e["runs"].values():
            for r in rs:
                if not r["check"]["ok"]:
                    failures.append(f"depth pair {e['kind']}: {r['check']}")
    for row in (results.get("peer") or {}).get("rows", []):
        for who in ["pgqueuer", *results["peer"]["queues"]]:
            if not row[who]["check"]["ok"]:
                failures.append(f"peer {who} batch {row['batch']}: {row[who]['check']}")
    for regime, rows in ((results.get("pgmq") or {}).get("regimes") or {}).items():
        for row in rows:
            for who, side in row["sides"].items():
                if side["failed"] or side["drained"]:
                    failures.append(f"pgmq synchronous_commit={regime} {row['shape']} {who}: drained={side['drained']} "
                                    f"failed={side['failed']}")
    for e in results.get("ceiling") or []:
        for variant in ("raw", "fn"):
            if e[variant]["drained"] or e[variant]["failed"]:
                failures.append(f"ceiling {e['shape']} {variant}: drained={e[variant]['drained']} "
                                f"failed={e[variant]['failed']}")
    return failures


def _find(cells: list[dict], **kw: Any) -> dict | None:
    for c in cells:
        if all(c.get(k) == v for k, v in kw.items()):
            return c
    return None


def headline_kind(results: dict) -> str:
    return "work" if "work" in results["kinds"] else ("fifo" if "fifo" in results["kinds"] else results["kinds"][0])


def targets(results: dict) -> list[dict]:
    """The four targets, each on every shape it applies to; `headline` marks the work kind's row
    (or fifo's when the work template did not exist)."""
    kind = headline_kind(results)
    out = []
    peer = results.get("peer")
    if peer:
        for q in peer["queues"]:
            row = next((r for r in peer["rows"] if r["batch"] == 1), None)
            if row:
                ratio = row[f"{q}_ratio_dequeue_ack"]
                out.append({"target": "cycle vs PgQueuer dequeue+ack (batch 1, "
                                      f"{row['processes']} consumers)", "want": ">= 2.00x",
                            "shape": f"{q} {row[q]['dequeue_ack']['throughput']:.0f}/s vs PgQueuer "
                                     f"{row['pgqueuer']['dequeue_ack']['throughput']:.0f}/s ({row['messages']:,} msgs)",
                            "value": ratio, "met": ratio >= 2.0, "gap": ratio / 2.0 - 1,
                            "headline": q == f"q_{kind}"})
        via = peer.get("pgbench")
        for q, ratio in ((via or {}).get("ratios") or {}).items():
            out.append({"target": "the same, both sides' SQL driven by pgbench (no Python client)",
                        "want": ">= 2.00x",
                        "shape": f"{q} {via['throughput'][q]:.0f}/s vs PgQueuer SQL {via['throughput']['pgqueuer']:.0f}/s",
                        "value": ratio, "met": ratio >= 2.0, "gap": ratio / 2.0 - 1, "headline": False})
    out += pgmq_targets(results)
    for e in results.get("ceiling") or []:
        if e["batch"] != 1 or e["ratio"] is None:
            continue
        out.append({"target": "functions / raw SQL ceiling (pgbench, same shape)", "want": ">= 0.90",
                    "shape": f"{e['shape']}, {e['clients']} clients: {e['fn']['messages_per_s']:.0f}/s vs "
                             f"{e['raw']['messages_per_s']:.0f}/s",
                    "value": e["ratio"], "met": e["ratio"] >= 0.9, "gap": e["ratio"] / 0.9 - 1,
                    "headline": e["queue"] == f"q_{kind}" and e["op"] != "enqueue"})
    pairs = results.get("depth_pairs")
    depth = None if pairs else results.get("depth")
    for e in pairs or []:
        if e.get("op", "dequeue") != "dequeue" or (e["processes"], e["batch"]) != (4, 1):
            continue
        lo, hi = e["shallow"], e["deep"]
        out.append({"target": f"dequeue at {hi:,} waiting / at {lo:,} (batch {e['batch']}, {e['processes']} "
                              f"consumers, alternating twin queues)",
                    "want": ">= 0.90",
                    "shape": f"{e['kind']}: {_tp(e, hi):.0f}/s vs {_tp(e, lo):.0f}/s",
                    "value": e["ratio"], "met": e["ratio"] >= 0.9, "gap": e["ratio"] / 0.9 - 1,
                    "headline": e["kind"] == kind})
    if depth:
        depths = sorted({c["depth"] for c in depth})
        lo, hi = depths[0], depths[-1]
        for k in _kinds(results):
            a = _find(depth, kind=k, op="dequeue", depth=lo, **TARGET_SHAPE)
            b = _find(depth, kind=k, op="dequeue", depth=hi, **TARGET_SHAPE)
            if a and b:
                ratio = b["throughput"] / a["throughput"]
                out.append({"target": f"dequeue at {hi:,} waiting / at {lo:,} (batch 1, 4 consumers)",
                            "want": ">= 0.90",
                            "shape": f"{k}: {b['throughput']:.0f}/s vs {a['throughput']:.0f}/s",
                            "value": ratio, "met": ratio >= 0.9, "gap": ratio / 0.9 - 1, "headline": k == kind})
    for v in results.get("vacuum") or []:
        t = v["timeline"]
        ratio = t["ratio"] or 0.0
        out.append({"target": f"dequeue with vacuum held back / clean (batch {t['batch']}, {t['processes']} "
                              f"consumers, {t['slices']} alternating slices of {t['slice_seconds']:.1f}s a side)",
                    "want": ">= 0.80",
                    "shape": f"{v['kind']}: {t['throughput']['held']:.0f}/s vs {t['throughput']['clean']:.0f}/s; "
                             f"pair ratios {_pair_ratios(t)}",
                    "value": ratio, "met": ratio >= 0.8, "gap": ratio / 0.8 - 1, "headline": v["kind"] == kind})
    return out


# (shape key, contender, target ratio over pgmq's throughput, what is compared)
PGMQ_TARGETS = (("cycle", "tablequeue", 1.2, "dequeue + complete vs pgmq read + delete (batch 1)"),
                ("history", "tablequeue", 1.2, "dequeue + complete with history vs pgmq read + archive (batch 1)"),
                ("cycle", "complete_next", 1.5, "complete_next vs pgmq read + delete (batch 1)"),
                ("batch_10", "tablequeue", 1.5, "dequeue + complete_batch vs pgmq read + delete(array) (batch 10)"),
                ("batch_100", "tablequeue", 1.5, "dequeue + complete_batch vs pgmq read + delete(array) (batch 100)"))


def pgmq_targets(results: dict) -> list[dict]:
    """Issue 22's throughput targets against pgmq, in each commit regime."""
    measured = results.get("pgmq") or {}
    out = []
    for regime, rows in (measured.get("regimes") or {}).items():
        by_key = {r["key"]: r for r in rows}
        for key, who, want, what in PGMQ_TARGETS:
            row = by_key.get(key)
            ratio = row and row["ratios"].get(who)
            if ratio is None:
                continue
            out.append({"target": f"{what}, pgbench, {measured['clients']} clients, synchronous_commit={regime}",
                        "want": f">= {want:.2f}x",
                        "shape": f"{row['sides'][who]['messages_per_s']:.0f}/s vs pgmq "
                                 f"{row['sides']['pgmq']['messages_per_s']:.0f}/s",
                        "value": ratio, "met": ratio >= want, "gap": ratio / want - 1, "headline": key == "cycle"})
    return out


def pgmq_counted_targets(results: dict) -> list[dict]:
    """Issue 22's work targets: instructions and WAL bytes per message no more than pgmq's (shown
    as pgmq's over ours, higher is better, as for throughput), enqueue within 1.2x the bare INSERT."""
    counted = (results.get("pgmq") or {}).get("counted")
    if not counted:
        return []
    out = []
    for row in counted["shapes"]:
        sides = row["sides"]
        if row["key"].startswith("enqueue"):
            ours, bare = sides["tablequeue"]["per_message"], sides["bare INSERT"]["per_message"]
            if ours and bare:
                out.append({"target": f"{row['shape']}: bare INSERT / enqueue, instructions", "want": ">= 0.83",
                            "shape": f"enqueue {ours:,.0f} vs bare INSERT {bare:,.0f} per message",
                            "value": bare / ours, "met": bare / ours >= 1 / 1.2, "gap": bare / ours * 1.2 - 1,
                            "headline": row["key"] == "enqueue_1"})
            continue
        for who, ratio in row["instruction_ratios"].items():
            if who == RAW:
                continue    # the floor, shown beside the sides: no target
            out.append({"target": f"{row['shape']}: pgmq / {who}, instructions per message", "want": ">= 1.00",
                        "shape": f"{sides[who]['per_message']:,.0f} vs pgmq {sides['pgmq']['per_message']:,.0f}",
                        "value": 1 / ratio, "met": ratio <= 1, "gap": 1 / ratio - 1, "headline": row["key"] == "cycle"})
        for who, ratio in row["wal_ratios"].items():
            if who == RAW:
                continue
            out.append({"target": f"{row['shape']}: pgmq / {who}, WAL bytes per message", "want": ">= 1.00",
                        "shape": f"{sides[who]['wal_per_message']:,.0f} vs pgmq {sides['pgmq']['wal_per_message']:,.0f}",
                        "value": 1 / ratio, "met": ratio <= 1, "gap": 1 / ratio - 1, "headline": row["key"] == "cycle"})
    return out


def target_table(rows: list[dict], w: Any) -> None:
    w("| target | wanted | measured | shape | result |")
    w("|---|---:|---:|---|---|")
    for t in rows:
        gap = abs(t["gap"]) * 100
        verdict = "met" if t["met"] else f"**missed by {gap:.0f}%**" if gap >= 1 else f"**missed by {gap:.1f}%**"
        name = f"**{t['target']}**" if t.get("headline") else t["target"]
        w(f"| {name} | {t['want']} | {t['value']:.2f} | {t['shape']} | {verdict} |")


def instruction_targets(results: dict, kind: str) -> list[dict]:
    """Three targets again in server instructions per message (bench/instructions.py): the work
    behind each throughput ratio, which a stalling host cannot blur. Higher is better, as for
    throughput: each ratio is the other side's instructions over tablequeue's (the shallow queue's
    over the deep one's)."""
    counted = results.get("instructions")
    if not counted:
        return []
    out = []

    def row(target: str, want: float, shape: str, value: float | None, headline: bool) -> None:
        if value is not None:
            out.append({"target": target, "want": f">= {want:.2f}",
                        "shape": shape, "value": value, "met": value >= want, "gap": value / want - 1,
                        "headline": headline})

    peer = counted.get("peer")
    if peer:
        row("cycle vs PgQueuer's SQL (batch 1)", 2.0, f"q_work {peer['work']['per_message']:,.0f} vs PgQueuer "
            f"{peer['pgqueuer']['per_message']:,.0f}", peer["ratio"], True)
    for e in counted["ceiling"]:
        row("raw SQL / functions (same shape)", 0.9, f"{e['shape']}: functions {e['fn']['per_message'] or 0:,.0f} "
            f"vs raw {e['raw']['per_message'] or 0:,.0f}", e["ratio"], e["kind"] == kind and e["op"] != "enqueue")
    for e in counted["depth"]:
        lo, hi = e["depths"][0], e["depths"][-1]
        row(f"at {lo:,} waiting / at {hi:,} (batch 1)", 0.9, f"{e['kind']}: {e[str(hi)]['per_message'] or 0:,.0f} vs "
            f"{e[str(lo)]['per_message'] or 0:,.0f}", e["ratio"], e["kind"] == kind)
    return out


def _pair_ratios(timeline: dict) -> str:
    return ", ".join("–" if r is None else f"{r:.2f}" for r in timeline["pair_ratios"])


def _tp(entry: dict, depth: int) -> float:
    """A depth pair's mean throughput (JSON turns the int keys into strings)."""
    t = entry["throughput"]
    return t[depth] if depth in t else t[str(depth)]


def _runs(runs: list[dict]) -> str:
    return ", ".join(f"{r['throughput']:.0f}" for r in runs)


# -- plots ------------------------------------------------------------------------------------------
def _kinds(results: dict) -> list[str]:
    return [k for k in KIND_ORDER if k in results["kinds"]]


def plot_matrix(results: dict, op: str, path: Path) -> None:
    kinds = _kinds(results)
    cells = [c for c in results["matrix"] if c["op"] == op]
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.2 * len(kinds), 3.4), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for b in sorted({c["batch"] for c in cells}):
            pts = sorted((c["processes"], c["throughput"]) for c in cells if c["kind"] == kind and c["batch"] == b)
            ax.plot([p for p, _ in pts], [t for _, t in pts], marker="o", label=f"batch {b}")
        ax.set_title(kind)
        ax.set_xlabel("processes")
        ax.set_yscale("log")
        ax.set_xticks(sorted({c["processes"] for c in cells}))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("messages/s")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{op}: throughput by processes and batch size (depth {results['plan']['matrix_depth']:,})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(results: dict, path: Path) -> None:
    kinds = _kinds(results)
    cells = [c for c in results["matrix"] if c["op"] == "dequeue"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.2 * len(kinds), 3.4), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for i, b in enumerate(sorted({c["batch"] for c in cells})):
            pts = sorted((c["processes"], c["p50_ms"], c["p99_ms"]) for c in cells
                         if c["kind"] == kind and c["batch"] == b)
            color = f"C{i}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=f"p50 batch {b}")
            ax.plot([p[0] for p in pts], [p[2] for p in pts], marker="x", ls="--", color=color, label=f"p99 batch {b}")
        ax.set_title(kind)
        ax.set_xlabel("consumers")
        ax.set_yscale("log")
        ax.set_xticks(sorted({c["processes"] for c in cells}))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("ms per dequeue call (cycle)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("dequeue latency per call: p50 (solid), p99 (dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_depth(results: dict, path: Path) -> None:
    kinds = _kinds(results)
    cells = results["depth"]
    procs = sorted({c["processes"] for c in cells})
    fig, axes = plt.subplots(2, len(kinds), figsize=(3.2 * len(kinds), 6.2), sharey="row", squeeze=False)
    for row, op in enumerate(("dequeue", "enqueue")):
        for ax, kind in zip(axes[row], kinds):
            for i, b in enumerate(sorted({c["batch"] for c in cells})):
                for j, p in enumerate(procs):
                    pts = sorted((c["depth"], c["throughput"]) for c in cells
                                 if c["kind"] == kind and c["op"] == op and c["batch"] == b and c["processes"] == p)
                    ax.plot([d for d, _ in pts], [t for _, t in pts], marker="o", color=f"C{i}",
                            ls="-" if j == len(procs) - 1 else ":", label=f"batch {b}, {p} proc")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{kind} {op}")
            ax.set_xlabel("messages waiting")
            ax.grid(True, which="both", alpha=0.3)
        axes[row][0].set_ylabel("messages/s")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("throughput by queue depth")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vacuum(results: dict, path: Path) -> None:
    """Per kind, each side's slices end to end (per-second throughput), and n_dead_tup after each
    held slice, on the held side's own time axis."""
    vac = results["vacuum"]
    fig, axes = plt.subplots(1, len(vac), figsize=(3.4 * len(vac), 3.6), squeeze=False)
    for ax, v in zip(axes[0], vac):
        runs = v["timeline"]["runs"]
        for side, label, color in (("clean", "clean", "C0"), ("held", "snapshot held", "C3")):
            series = [x for r in runs if r["side"] == side for x in r["timeline"]]
            ax.plot(range(len(series)), series, label=label, color=color)
        ax.set_title(v["kind"])
        ax.set_xlabel("second of each side's slices")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        held = [r for r in runs if r["side"] == "held"]
        ends = [sum(len(r["timeline"]) for r in held[: i + 1]) for i in range(len(held))]
        ax2 = ax.twinx()
        ax2.plot(ends, [r.get("n_dead_tup") or 0 for r in held], color="grey", ls=":", marker=".",
                 label="n_dead_tup")
        ax2.set_ylim(bottom=0)
        ax2.tick_params(labelsize=7)
    axes[0][0].set_ylabel("messages/s")
    axes[0][0].legend(fontsize=8, loc="lower left")
    shape = results["plan"]["vacuum_timeline_shape"]
    fig.suptitle(f"dequeue throughput per second, {shape[0]} consumers, batch {shape[1]}: clean vs a REPEATABLE "
                 f"READ snapshot held (grey dotted: n_dead_tup, right axis)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ceiling(results: dict, path: Path) -> None:
    rows = results["ceiling"]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["raw"]["messages_per_s"] for r in rows], width=0.4, label="raw SQL (pgbench)")
    ax.bar([x + 0.2 for x in xs], [r["fn"]["messages_per_s"] for r in rows], width=0.4, label="functions (pgbench)")
    for x, r in zip(xs, rows):
        ax.text(x, max(r["raw"]["messages_per_s"], r["fn"]["messages_per_s"]) * 1.02, f"{r['ratio']:.2f}",
                ha="center", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["shape"].replace(" (minimal raw: one claim UPDATE + one DELETE)", " (minimal raw)")
                        for r in rows],
                       rotation=35, ha="right",
                       fontsize=8)
    ax.set_ylabel("messages/s")
    ax.set_title(f"ceiling: functions / raw SQL, pgbench -M prepared -c {rows[0]['clients']} (ratio on top)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_peer(results: dict, path: Path) -> None:
    peer = results["peer"]
    rows = peer["rows"]
    who = ["pgqueuer", *peer["queues"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), squeeze=False)
    for ax, metric, title in ((axes[0][0], "enqueue", "enqueue"), (axes[0][1], "dequeue_ack", "dequeue + ack")):
        width = 0.8 / len(who)
        for i, w in enumerate(who):
            ax.bar([j + (i - (len(who) - 1) / 2) * width for j in range(len(rows))],
                   [r[w][metric]["throughput"] for r in rows], width=width,
                   label="PgQueuer" if w == "pgqueuer" else f"tablequeue {w}")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"batch {r['batch']}\n{r['messages']:,} msgs" for r in rows], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{title}, {rows[0]['processes']} processes")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("messages/s")
    axes[0][1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- markdown -----------------------------------------------------------------------------------------
def _f(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def _ms(x: float | None) -> str:
    return "–" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}")


def matrix_table(cells: list[dict], op: str) -> list[str]:
    kinds = [k for k in KIND_ORDER if any(c["kind"] == k for c in cells)]
    procs = sorted({c["processes"] for c in cells})
    batches = sorted({c["batch"] for c in cells})
    lines = ["| kind | batch | " + " | ".join(f"{p} proc: msg/s (p50 / p99 ms)" for p in procs) + " |",
             "|---|---:|" + "---:|" * len(procs)]
    for kind in kinds:
        for b in batches:
            row = [kind, str(b)]
            for p in procs:
                c = _find(cells, kind=kind, op=op, processes=p, batch=b)
                row.append(f"{_f(c['throughput'])} ({_ms(c['p50_ms'])} / {_ms(c['p99_ms'])})" if c else "–")
            lines.append("| " + " | ".join(row) + " |")
    return lines


def depth_table(cells: list[dict], op: str) -> list[str]:
    kinds = [k for k in KIND_ORDER if any(c["kind"] == k for c in cells)]
    depths = sorted({c["depth"] for c in cells})
    shapes = sorted({(c["processes"], c["batch"]) for c in cells})
    lines = ["| kind | processes | batch | " + " | ".join(f"{d:,} waiting: msg/s (p50 / p99 ms)" for d in depths)
             + f" | {depths[-1]:,} / {depths[0]:,} |", "|---|---:|---:|" + "---:|" * (len(depths) + 1)]
    for kind in kinds:
        for p, b in shapes:
            row = [kind, str(p), str(b)]
            found = [_find(cells, kind=kind, op=op, processes=p, batch=b, depth=d) for d in depths]
            for c in found:
                row.append(f"{_f(c['throughput'])} ({_ms(c['p50_ms'])} / {_ms(c['p99_ms'])})" if c else "–")
            row.append(f"{found[-1]['throughput'] / found[0]['throughput']:.2f}" if found[0] and found[-1] else "–")
            lines.append("| " + " | ".join(row) + " |")
    return lines


def write_report(results: dict, out_root: Path) -> Path:
    bench_dir = out_root / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    images = []
    if results.get("matrix"):
        for op in ("dequeue", "enqueue"):
            plot_matrix(results, op, bench_dir / f"matrix_{op}.png")
            images.append(f"matrix_{op}.png")
        plot_latency(results, bench_dir / "matrix_latency.png")
    if results.get("depth"):
        plot_depth(results, bench_dir / "depth.png")
    if results.get("vacuum"):
        plot_vacuum(results, bench_dir / "vacuum.png")
    if results.get("ceiling"):
        plot_ceiling(results, bench_dir / "ceiling.png")
    if results.get("peer"):
        plot_peer(results, bench_dir / "peer.png")

    facts = results.get("facts", {})
    plan = results["plan"]
    L: list[str] = []
    w = L.append
    w("# Benchmarks (PostgreSQL)")
    w("")
    w("Measured, never asserted: these numbers come from one run of the harness in `bench/`; no test fails "
      "because something was slow. Re-run them on your own hardware before relying on them.")
    w("")
    w("## Reproduce")
    w("")
    w("```sh")
    w("make bench        # installs the test and bench extras (pgmq==1.1.4, pgqueuer==1.6.0, matplotlib), then:")
    w(".venv/bin/python -m bench.run" + (" --quick" if results.get("quick") else ""))
    w("```")
    w("")
    w(f"This file was written by: `{results['command']}`. `--quick` runs a reduced matrix in a couple of "
      "minutes (into `build/bench-quick/`); `--parts` and `--kinds` select pieces. Results: "
      "[`docs/bench/results.json`](bench/results.json); plots: `docs/bench/*.png`. Everything runs against the "
      "embedded throwaway cluster (`tablequeue.embedded.start_embedded`), or `TABLEQUEUE_PG_URL` when set. "
      "A full run first checks whether the host stalls (a busy loop that loses time); if it does, the run "
      "stops before it starts and leaves this file as it is (`make bench BENCH_ARGS=--on-a-stalling-host` "
      "publishes anyway, and says so here). The `instructions` part counts the server's instructions per "
      "message under valgrind's callgrind on a second throwaway server (always embedded): the work behind the "
      "target ratios, which a stalling host cannot blur.")
    w("")
    w("## The run")
    w("")
    w(f"- Started {results.get('started_at')}, took {results.get('total_seconds', 0) / 60:.1f} minutes "
      + "(" + ", ".join(f"{k} {v / 60:.1f} min" for k, v in (results.get("part_seconds") or {}).items()
                        if k not in (results.get("part_runs") or {})) + ").")
    w(f"- Machine: {facts.get('nproc')} CPUs ({facts.get('cpu_model', '?')}), {facts.get('mem_total', '?')} RAM, "
      f"{facts.get('platform', '')}; Python {facts.get('python')}, psycopg {facts.get('psycopg')}, "
      f"pgqueuer {facts.get('pgqueuer')}, {facts.get('pgbench')}.")
    w(f"- Load average at start {tuple(round(x, 2) for x in facts.get('loadavg_start', ()))}, at end "
      f"{tuple(round(x, 2) for x in facts.get('loadavg_end', ()))}. The server and every benchmark process share "
      f"the {facts.get('nproc')} CPUs, so compare ratios taken within the run.")
    host = facts.get("host")
    if host:
        a, b = host["stalls_start"], host["stalls_end"]
        share = host.get("cpu_share")
        stalling = max(a["lost_seconds"] / a["seconds"], b["lost_seconds"] / b["seconds"]) > host["stalling_above"]
        w(f"- Host check: a busy {a['seconds']:.0f}-second Python loop lost {a['lost_seconds']:.2f}s to gaps over 20 ms "
          f"at the start (longest {a['longest_gap_seconds']:.2f}s) and {b['lost_seconds']:.2f}s at the end"
          + (f"; over the run the kernel accounted {share:.0%} of the CPUs' wall time" if share is not None else "")
          + ". "
          + ("**This host was stalling: the throughput and latency figures measure it more than tablequeue.** "
             "The buffer counts, plans and instruction counts do not depend on it." if stalling else
             "A quiet machine loses next to nothing there."))
    w(f"- Code: commit `{facts.get('git_head', '?')}`; the PostgreSQL templates were "
      f"{'**modified in the working tree**' if facts.get('templates_dirty') else 'as committed'} when the run started.")
    for part, run in (results.get("part_runs") or {}).items():
        w(f"- The `{part}` part comes from a later run of its own: `{run['command']}`, started {run['started_at']}, "
          f"took {run['seconds'] / 60:.1f} minutes, commit `{run.get('git_head', '?')}`"
          + (" (PostgreSQL templates **modified in the working tree**)" if run.get("templates_dirty") else "")
          + f", load average at start {tuple(round(x, 2) for x in run['loadavg_start'])}, at end "
          f"{tuple(round(x, 2) for x in run['loadavg_end'])}.")
    for part, error in (results.get("errors") or {}).items():
        what = "The clean-up after the parts failed" if part == "clean-up" else \
            f"The {part} part failed, so its section is missing"
        w(f"- **{what}**: `{error.strip().splitlines()[-1]}` (the whole traceback is in results.json).")
    w(f"- PostgreSQL: {facts.get('postgres_version')} ({'embedded throwaway cluster' if facts.get('embedded') else 'TABLEQUEUE_PG_URL'}).")
    settings = facts.get("settings_non_default") or {}
    if settings:
        w("- Server settings that differ from the defaults (as the embedded cluster starts it): "
          + ", ".join(f"`{k}={v}`" for k, v in sorted(settings.items())
                      if k not in ("config_file", "data_directory", "hba_file", "ident_file", "unix_socket_directories",
                                   "port", "listen_addresses", "lc_messages", "lc_monetary", "lc_numeric", "lc_time",
                                   "log_timezone", "default_text_search_config", "dynamic_shared_memory_type"))
          + ". Note `fsync=off`, `synchronous_commit=off`, `full_page_writes=off`: commits cost no disk flush, "
            "so these figures are CPU-bound upper limits, not what a durable production server does.")
    w(f"- Autovacuum on with default naptime ({(facts.get('settings') or {}).get('autovacuum_naptime', '?')}); "
      "the queue tables carry the per-table autovacuum settings the templates give them.")
    w("")
    w("## Targets")
    w("")
    w("Ratios are taken within this one run; each target is shown on every shape it applies to, the work "
      "kind's rows in bold (the shape the target was set for). A miss says by how much it fell short of the "
      "target (measured / wanted − 1); the reasons are in *Analysis*.")
    w("")
    measured = targets(results)
    if measured:
        target_table(measured, w)
        w("")
    counted = instruction_targets(results, headline_kind(results)) + pgmq_counted_targets(results)
    if counted:
        w("The targets' comparisons in the server's instructions per message, one pgbench client, counted by "
          "callgrind (*Server work per message*): what the throughput ratios are made of, whatever the host did. They "
          "count work, not waiting: a ratio here that differs from its throughput ratio says how much of that one "
          "came from waits, round trips or the client. Held-back vacuum is not counted (see that section).")
        w("")
        target_table(counted, w)
    if results.get("kinds") and "work" not in results["kinds"]:
        w("")
        w("*The work kind's PostgreSQL template did not exist when this run started, so the targets use the "
          "`fifo` kind's dequeue (destructive: one statement per message) in its place.*")
    w("")
    w("## Method")
    w("")
    w(f"- Queues: one per kind (`heap`, `fifo`, `lifo`, `pending`, `work`; JSON payload of {len(_payload())} bytes), "
      "deployed by the deploy tool into a fresh schema, exactly as the tests do. Callers use only the functions, "
      "through `tablequeue.client.QueueClient` (psycopg 3, one connection per process, server-side prepared "
      "statements after five calls).")
    w("- A *process* is a separate OS process with its own connection; cells fork them, let each warm up (5 "
      "calls), release them together through a barrier and let them run for the cell's duration "
      f"({plan['matrix_seconds']}s in the matrix, {plan['depth_seconds']}s per depth cell, "
      f"{plan['vacuum_seconds']}s per vacuum cell, {plan['vacuum_timeline_seconds']}s a side per vacuum timeline, "
      f"in {plan.get('vacuum_slices', 1)} slices).")
    w("- **Enqueue**: batch 1 calls `enqueue`; batch 10/100 call `enqueue_batch` with that many items. Each call is "
      "its own transaction (autocommit). Latency is per call.")
    w("- **Dequeue**, destructive kinds: `dequeue(batch_size)` then `COMMIT` is one cycle (the delete happens in "
      "the caller's transaction). **work**: `dequeue(batch_size, worker, lease_seconds)` then `complete(id, worker)` "
      "for every message is one cycle (the contract has no batch complete). Latency is per cycle.")
    w(f"- **Depth** is held constant: after each cycle the consumer puts back as many messages as it took, with an "
      "untimed raw `INSERT ... SELECT ... FROM generate_series(1, n)` into the queue table. Throughput is, per "
      "process, messages / (run time − refill time), summed over processes; with no refill that is messages / wall "
      f"time. The matrix runs at {plan['matrix_depth']:,} waiting. Deep queues are preloaded the same set-based way "
      "(`INSERT ... SELECT generate_series`, in chunks of 250,000), then `VACUUM (ANALYZE)`.")
    w("- Every cell starts from a `VACUUM`ed table at its depth and checks its counts afterwards: rows before + "
      "refilled − dequeued = rows after, every id handed out once, no lost lease; enqueue cells count the rows "
      "added and remove them again. The run exits non-zero if any check fails "
      f"({'none failed' if not failed_checks(results) else str(len(failed_checks(results))) + ' FAILED'} in this run).")
    w("")
    if results.get("matrix"):
        w("## Throughput and latency by processes and batch size")
        w("")
        w(f"Depth {plan['matrix_depth']:,}, {plan['matrix_seconds']}s per cell. Cells: messages/s (p50 / p99 "
          "latency per call in ms).")
        w("")
        w("### Dequeue (work: dequeue + complete)")
        w("")
        L.extend(matrix_table(results["matrix"], "dequeue"))
        w("")
        w("![dequeue throughput](bench/matrix_dequeue.png)")
        w("")
        w("![dequeue latency](bench/matrix_latency.png)")
        w("")
        w("### Enqueue")
        w("")
        L.extend(matrix_table(results["matrix"], "enqueue"))
        w("")
        w("![enqueue throughput](bench/matrix_enqueue.png)")
        w("")
    if results.get("depth"):
        w("## Queue depth")
        w("")
        w(f"The same figures with {', '.join(f'{d:,}' for d in plan['depths'])} messages waiting "
          f"({plan['depth_seconds']}s per cell; depth held constant by the untimed refill; the last column is the "
          "deepest over the shallowest).")
        w("")
        w("### Dequeue")
        w("")
        L.extend(depth_table(results["depth"], "dequeue"))
        w("")
        w("### Enqueue")
        w("")
        L.extend(depth_table(results["depth"], "enqueue"))
        w("")
        loads = {}
        for c in results["depth"]:
            loads[(c["kind"], c["depth"])] = c.get("load_seconds", 0)
        w("Preload time (seconds, set-based insert of the difference plus `VACUUM (ANALYZE)`): "
          + ", ".join(f"{k} {d:,}: {s:.1f}" for (k, d), s in sorted(loads.items())) + ".")
        w("")
        w("![depth](bench/depth.png)")
        w("")
        if results.get("depth_pairs"):
            w("**The reliable depth comparison.** Single 1.5 s cells on a shared machine are noisy (a cell that "
              "meets someone else's test run loses half its throughput). So chosen shapes are measured once more, "
              "alternating between two identical queues held at the shallowest and the deepest depth (shallow, deep, "
              "deep, shallow; the target's shape twice over), so that the noise falls on both alike; the depth "
              "target is taken from here:")
            w("")
            w("| kind | op | processes | batch | shallow msg/s (runs) | deep msg/s (runs) | deep / shallow |")
            w("|---|---|---:|---:|---:|---:|---:|")
            for e in results["depth_pairs"]:
                lo, hi = e["shallow"], e["deep"]
                runs = e["runs"]
                rl = runs[str(lo)] if str(lo) in runs else runs[lo]
                rh = runs[str(hi)] if str(hi) in runs else runs[hi]
                w(f"| {e['kind']} | {e.get('op', 'dequeue')} | {e['processes']} | {e['batch']} | {_tp(e, lo):,.0f} "
                  f"({_runs(rl)}) | {_tp(e, hi):,.0f} ({_runs(rh)}) | {e['ratio']:.2f} |")
            w("")
        ex = results.get("depth_explain") or []
        if ex:
            w("Profile of the claim inside `dequeue` (auto_explain, ANALYZE + BUFFERS, the 7th call of a session, "
              "rolled back), per depth:")
            w("")
            w("| kind | depth | statement ms | whole call ms (inflated by auto_explain's own logging) | buffers of each statement "
              "| a consuming session's dequeue: buffers | one enqueue_batch of 100: buffers |")
            w("|---|---:|---:|---:|---|---:|---:|")
            for e in ex:
                w(f"| {e['kind']} | {e['label']} | {', '.join(f'{x:.3f}' for x in e.get('statement_ms', []))} | "
                  f"{_f(e.get('call_ms'), 3)} | {'; '.join(e.get('statement_buffers', [])) or e.get('error', '')} | "
                  f"{(e.get('consumer') or {}).get('least', '–')} | {e.get('enqueue_batch_100_buffers', '–')} |")
            w("")
            w("The last two columns count the work whatever the machine's load: every statement of a batch-of-one "
              "dequeue in a session that has been consuming (the least of five), and of one `enqueue_batch` of 100 "
              "messages (rolled back). A deeper queue should add about one B-tree level per index touched.")
            w("")
    if results.get("vacuum"):
        w("## Vacuum held back")
        w("")
        shape = plan["vacuum_timeline_shape"]
        w(f"Per kind, two identical queues at depth {plan['matrix_depth']:,}: the *held* one in the benchmark's "
          "database, where another session runs `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT ...` (its snapshot "
          "taken) and keeps that transaction open for the whole held phase, and its *clean* twin in a second database "
          "on the same server, which that snapshot does not hold back (since PostgreSQL 14 a snapshot holds back "
          "vacuum only in its own database). The timeline alternates the two sides in slices (clean, held, held, "
          f"clean, ...; {plan.get('vacuum_slices', 1)} slices of "
          f"{plan['vacuum_timeline_seconds'] / plan.get('vacuum_slices', 1):.1f}s a side, {shape[0]} consumers at "
          f"batch {shape[1]}), so a machine that stalls now and then stalls both sides alike; neither queue is reset "
          "between its slices, so the held one keeps every dead tuple it made. Each neighbouring clean and held "
          "slice is a pair, whose ratio shows how much the machine moved the figure. The cells follow, clean then "
          "held for each shape, with even more dead tuples on the held side. Dead tuples: "
          "`pg_stat_user_tables.n_dead_tup` and pgstattuple's exact `dead_tuple_count` at the end of the held "
          "phase, and after the holder ended and `VACUUM` ran.")
        w("")
        w("| kind | timeline: clean msg/s | held msg/s | held / clean | pair ratios, in order | n_dead_tup after the "
          "last held slice |")
        w("|---|---:|---:|---:|---|---:|")
        for v in results["vacuum"]:
            t = v["timeline"]
            last = [r for r in t["runs"] if r["side"] == "held"][-1]
            w(f"| {v['kind']} | {_f(t['throughput']['clean'])} | {_f(t['throughput']['held'])} | "
              f"{(t['ratio'] or 0):.2f} | {_pair_ratios(t)} | {_f(last.get('n_dead_tup'))} |")
        w("")
        w("| kind | cell | clean msg/s (p50 / p99 ms) | held msg/s (p50 / p99 ms) | held / clean |")
        w("|---|---|---:|---:|---:|")
        for v in results["vacuum"]:
            for c, h in zip(v["clean"], v["held"]):
                w(f"| {v['kind']} | {c['processes']} proc, batch {c['batch']} | {_f(c['throughput'])} "
                  f"({_ms(c['p50_ms'])} / {_ms(c['p99_ms'])}) | {_f(h['throughput'])} ({_ms(h['p50_ms'])} / "
                  f"{_ms(h['p99_ms'])}) | {h['throughput'] / c['throughput']:.2f} |")
        w("")
        w("| kind | snapshot held (s) | n_dead_tup at end | pgstattuple dead at end | table bytes at end | "
          "dead after release + VACUUM | a new session's dequeue: buffers per statement, clean → held | "
          "a consuming session's dequeue: buffers, clean → held |")
        w("|---|---:|---:|---:|---:|---:|---|---:|")
        for v in results["vacuum"]:
            d, a = v.get("dead_end", {}), v.get("dead_after_vacuum", {})
            bc = "; ".join((v.get("explain_clean") or {}).get("statement_buffers", []))
            bh = "; ".join((v.get("explain_held") or {}).get("statement_buffers", []))
            consumer = " → ".join(str((v.get(k) or {}).get("least", "–")) for k in ("consumer_clean", "consumer_held"))
            w(f"| {v['kind']} | {v.get('held_seconds', 0):.0f} | {_f(d.get('n_dead_tup'))} | "
              f"{_f(d.get('pgstattuple_dead'))} | {_f(d.get('table_bytes'))} | {_f(a.get('pgstattuple_dead'))} | "
              f"{bc} → {bh} | {consumer} |")
        w("")
        w("A new session finds its claim position from the head of the claim index, through every entry the "
          "held snapshot keeps; a session that has been consuming (300 messages, then the least of five "
          "batch-of-one dequeues, every statement of the function counted, the work kind's own-messages probe "
          "included) claims from its position. Buffers are the work behind the throughput figures above and do "
          "not depend on how busy the machine was.")
        w("")
        w("![vacuum](bench/vacuum.png)")
        w("")
    if results.get("ceiling"):
        rows = results["ceiling"]
        w("## The ceiling: raw SQL vs the functions, both driven by pgbench")
        w("")
        w(f"`pgbench -n -M prepared -c {rows[0]['clients']} -j {min(rows[0]['clients'], facts.get('nproc') or 2)} "
          f"-T {round(rows[0]['seconds'])} -f <script>` on the same server in the same run; each pair ran "
          f"{plan['ceiling_rounds']}× in the order raw, functions, functions, raw (averaged). Messages/s are counted "
          "from the table (rows removed or added), not from pgbench's tps. Dequeue runs start from a preloaded "
          "queue deep enough never to drain (checked). The raw destructive claim is the statement the function "
          "runs for that batch size (batch 1 has its own, with a literal `LIMIT 1`), cut out of the rendered SQL; "
          "the raw side of `enqueue_batch of 10` is one set-based `INSERT ... SELECT ... FROM unnest(array)`.")
        w("")
        w("| shape | raw msg/s (p50 / p99 ms) | functions msg/s (p50 / p99 ms) | functions / raw |")
        w("|---|---:|---:|---:|")
        for r in rows:
            w(f"| {r['shape']} | {_f(r['raw']['messages_per_s'])} ({_ms(r['raw']['p50_ms'])} / "
              f"{_ms(r['raw']['p99_ms'])}) | {_f(r['fn']['messages_per_s'])} ({_ms(r['fn']['p50_ms'])} / "
              f"{_ms(r['fn']['p99_ms'])}) | {r['ratio']:.2f} |")
        w("")
        w("![ceiling](bench/ceiling.png)")
        w("")
        if results.get("planning"):
            w("Planning vs execution of each claim statement with literal arguments (a custom plan, which is what "
              "PL/pgSQL makes on every call of a statement with `LIMIT batch_size`: its generic plan, costed for an "
              "unknown LIMIT, is worse, so the plan cache keeps re-planning). EXPLAIN (ANALYZE, BUFFERS, SUMMARY), "
              "median of 7, 1,000 waiting:")
            w("")
            w("| kind | statement | planning ms | execution ms |")
            w("|---|---|---:|---:|")
            for p in results["planning"]:
                w(f"| {p['kind']} | {p['statement']} | {p['planning_ms']:.3f} | {p['execution_ms']:.3f} |")
            w("")
        w("<details><summary>pgbench scripts</summary>")
        w("")
        for r in rows:
            w(f"**{r['shape']}**, raw:")
            w("```sql")
            w(r["raw_script"].rstrip())
            w("```")
            w("functions:")
            w("```sql")
            w(r["fn_script"].rstrip())
            w("```")
        w("</details>")
        w("")
    if results.get("overhead"):
        from .overhead import VARIANTS

        w("## What a one-row enqueue pays for being a function")
        w("")
        w("The raw INSERT of the ceiling, then the same INSERT wrapped step by step until it is the queue's "
          "`enqueue` function (`bench/overhead.py`), each driven by pgbench with "
          f"{results['overhead'][0]['clients']} clients, alternating, in this run. msg/s, and in brackets the "
          "ratio to the raw INSERT.")
        w("")
        w("| kind | " + " | ".join(VARIANTS) + " |")
        w("|---|" + "---:|" * len(VARIANTS))
        for e in results["overhead"]:
            w(f"| {e['kind']} | " + " | ".join(f"{_f(e['messages_per_s'][v])} ({e['vs_raw'][v]:.2f})"
                                                for v in VARIANTS) + " |")
        w("")
    if results.get("peer"):
        peer = results["peer"]
        w("## A peer: PgQueuer")
        w("")
        w(f"PgQueuer {facts.get('pgqueuer')} in its own database on the same server, installed by its own "
          "`Queries.install()` (durable tables, its NOTIFY trigger, its log table), driven through its `Queries` API "
          f"from {peer['rows'][0]['processes']} processes with psycopg 3 (its async psycopg driver): enqueue with "
          "`Queries.enqueue` (lists for a batch), then dequeue with `Queries.dequeue(batch_size, ...)` and ack the "
          "batch with one `Queries.log_jobs(..., 'successful')`. tablequeue does the same count through "
          "`enqueue`/`enqueue_batch`, then `dequeue` + one `complete` per message. Same message count, same "
          "processes, same batch size; throughput = messages / wall time from a common start to the last process.")
        w("")
        cols = ["pgqueuer", *peer["queues"]]
        w("| batch | messages | " + " | ".join(f"{c} enqueue msg/s" for c in cols) + " | "
          + " | ".join(f"{c} dequeue+ack msg/s (p50 / p99 ms)" for c in cols) + " | "
          + " | ".join(f"{q} / PgQueuer (enqueue, dequeue+ack)" for q in peer["queues"]) + " |")
        w("|---:|---:|" + "---:|" * (2 * len(cols) + len(peer["queues"])))
        for r in peer["rows"]:
            w(f"| {r['batch']} | {r['messages']:,} | "
              + " | ".join(_f(r[c]["enqueue"]["throughput"]) for c in cols) + " | "
              + " | ".join(f"{_f(r[c]['dequeue_ack']['throughput'])} ({_ms(r[c]['dequeue_ack']['p50_ms'])} / "
                           f"{_ms(r[c]['dequeue_ack']['p99_ms'])})" for c in cols) + " | "
              + " | ".join(f"{r[q + '_ratio_enqueue']:.2f}x, {r[q + '_ratio_dequeue_ack']:.2f}x" for q in peer["queues"])
              + " |")
        w("")
        w("![peer](bench/peer.png)")
        w("")
        via = peer.get("pgbench")
        if via:
            w(f"The batch-1 cycle once more without either Python client: PgQueuer's own dequeue and `log_jobs` SQL "
              f"(taken from its query builder, see below) and tablequeue's `dequeue` + `complete` calls, both driven by "
              f"`pgbench -M prepared -c {via['clients']}` for {via['seconds']:.0f}s, {via['rounds']} runs each "
              "(alternating), each from a freshly loaded queue; messages/s counted from the tables.")
            w("")
            w("| queue | msg/s (runs) | p50 / p99 ms | / PgQueuer |")
            w("|---|---:|---:|---:|")
            for who, rs in via["runs"].items():
                ratio = via["ratios"].get(who)
                listed = ", ".join(f"{r['messages_per_s']:.0f}" for r in rs)
                w(f"| {who} | {via['throughput'][who]:,.0f} ({listed}) | "
                  f"{sum(r['p50_ms'] or 0 for r in rs) / len(rs):.2f} / {sum(r['p99_ms'] or 0 for r in rs) / len(rs):.2f} | "
                  f"{'–' if ratio is None else f'{ratio:.2f}x'} |")
            w("")
            w("<details><summary>PgQueuer's cycle as a pgbench script</summary>")
            w("")
            w("```sql")
            w(via["script_pgqueuer"].rstrip())
            w("```")
            w("</details>")
            w("")
    if results.get("pgmq"):
        pgmq_section(results["pgmq"], w)
    if results.get("instructions"):
        instruction_section(results["instructions"], w)
    if results.get("consumers"):
        consumers_section(results["consumers"], w)
    if results.get("groups"):
        groups_section(results["groups"], w)
    if NOTES.exists():
        w(NOTES.read_text().rstrip())
        w("")
    path = out_root / "BENCHMARKS.md"
    path.write_text("\n".join(L) + "\n")
    return path


def pgmq_section(measured: dict, w: Any) -> None:
    srv = measured.get("server") or {}
    w("## A second peer: pgmq, in both commit regimes")
    w("")
    w(f"pgmq {measured['pgmq_sql']} (the SQL that PyPI's `pgmq=={measured['pgmq_package']}` ships, installed as plain "
      "SQL by its own installer, no extension build) in its own database, one queue; the work kind's `q_work` and "
      "`q_work_with_history` beside it on the same server. Both sides are pgbench scripts (`-M prepared`, "
      f"{measured['clients']} clients, "
      + (f"{measured['transactions']} transactions per client" if measured.get("transactions") else
         f"{measured['seconds']:.0f}s per run")
      + f", {measured['rounds']} round(s), the sides' order alternating by round and shape), each run from a freshly "
      "loaded queue, vacuumed. tablequeue's calls pass the lease token (fenced), as the contract recommends. "
      f"The server: fsync={srv.get('fsync')}, full_page_writes={srv.get('full_page_writes')} "
      f"({'an embedded cluster of its own' if srv.get('embedded') else 'TABLEQUEUE_PG_URL'}); the commit regime is "
      "`synchronous_commit` set in every pgbench session. WAL bytes per message: `pg_current_wal_insert_lsn()` before and "
      "after the run over the messages moved, full-page images and autovacuum included. Reproduce: "
      "`make bench BENCH_ARGS=\"--parts pgmq\"`.")
    w("")
    w(f"Measured from {measured.get('started_at')} (commit `{measured.get('git_head', '?')}`); load average at start "
      f"{tuple(round(x, 2) for x in measured.get('loadavg_start', ()))}, at the end of the throughput runs "
      f"{tuple(round(x, 2) for x in measured.get('loadavg_end', ()))}: on a shared machine the msg/s move with the "
      "load; the instruction and WAL counts below do not."
      + (f" The host check at the start of that run: a busy loop lost {measured['host']['stalls_start']['lost_seconds']:.2f}s "
         f"of {measured['host']['stalls_start']['seconds']:.0f}s to gaps over 20 ms." if measured.get("host") else ""))
    w("")
    for regime, rows in measured["regimes"].items():
        w(f"**synchronous_commit = {regime}**")
        w("")
        w("| shape | pgmq msg/s (p50 ms) | tablequeue msg/s (p50 ms) | / pgmq | WAL B/msg pgmq → tablequeue | "
          "full-page images per 1,000 msgs, pgmq → tablequeue |")
        w("|---|---:|---:|---:|---:|---:|")
        for row in rows:
            ref = row["sides"]["pgmq"]
            for who, side in row["sides"].items():
                if who == "pgmq":
                    continue
                w(f"| {row['shape']}: {ref['label']} vs {side['label']} | {_f(ref['messages_per_s'])} "
                  f"({_ms(ref['p50_ms'])}) | {_f(side['messages_per_s'])} ({_ms(side['p50_ms'])}) | "
                  f"{_ratio(row['ratios'].get(who))} | {_f(ref['wal_bytes_per_message'])} → "
                  f"{_f(side['wal_bytes_per_message'])} | {_f((ref['fpi_per_message'] or 0) * 1000, 1)} → "
                  f"{_f((side['fpi_per_message'] or 0) * 1000, 1)} |")
        w("")
    counted = measured.get("counted")
    if counted:
        w(f"The same scripts with one client on a server under callgrind (*Server work per message*: "
          f"{counted['short']} and {counted['long']} messages' worth of transactions, the difference over the "
          f"messages moved; {counted['depth']:,} waiting; full_page_writes off there, so the WAL is the records "
          "alone). The commit regime does not change these: the flush is the kernel's work and the WAL is the same.")
        w("")
        w("| shape | side | instructions per message | WAL bytes per message | instructions / pgmq's | WAL / pgmq's |")
        w("|---|---|---:|---:|---:|---:|")
        for row in counted["shapes"]:
            for who, side in row["sides"].items():
                w(f"| {row['shape']} | {who} | {_f(side['per_message'])} | {_f(side.get('wal_per_message'))} | "
                  f"{_ratio(row['instruction_ratios'].get(who))} | {_ratio(row['wal_ratios'].get(who))} |")
        w("")
    if counted and any(side.get("profile") for row in counted["shapes"] for side in row["sides"].values()):
        # A group whose functions callgrind did not resolve counts nothing anywhere: left out.
        groups = [g for g in next(side["profile"] for row in counted["shapes"] for side in row["sides"].values()
                                  if side.get("profile"))
                  if any((side.get("profile") or {}).get(g) for row in counted["shapes"] for side in row["sides"].values())]
        w("Where those instructions go: per message, the inclusive instructions of the server functions behind "
          "each step (callgrind_annotate over the same runs). The rows overlap: WAL records are assembled inside "
          "the heap and index changes, and most of it runs inside the executor; the rest of the total is the "
          "protocol, PL/pgSQL, expression evaluation and the functions' own statements.")
        w("")
        w("| shape | side | total | " + " | ".join(groups) + " |")
        w("|---|---|---:|" + "---:|" * len(groups))
        for row in counted["shapes"]:
            for who, side in row["sides"].items():
                profile = side.get("profile") or {}
                w(f"| {row['shape']} | {who} | {_f(side['per_message'])} | "
                  + " | ".join(_f(profile.get(g)) for g in groups) + " |")
        for d in counted.get("designs", []):
            profile = d.get("profile") or {}
            w(f"| lease design | {d['design'].split(':')[0]} | {_f(d['per_message'])} | "
              + " | ".join(_f(profile.get(g)) for g in groups) + " |")
        w("")
    lease = measured.get("lease_wal")
    if lease:
        w("**What one lease writes** (pg_walinspect over one batch-of-one lease: the probe and the claims in one "
          "transaction): the index entries per index, and whether the row's new version was a HOT update; then the "
          "whole cycle (lease + complete) counted as above. Today's storage (design C, storage v3), storage v2's and two "
          "other designs as raw SQL (`bench/work_raw.py`, *Analysis*), and pgmq's `read` + `delete` (its functions, as "
          "in the tables above).")
        w("")
        w("| design | index entries a lease writes | HOT " + ("| instructions per cycle | WAL bytes per cycle "
                                                                  if counted else "") + "|")
        w("|---|---|---|" + ("---:|---:|" if counted else ""))
        designs = {d["design"]: d for d in (counted or {}).get("designs", [])}
        pgmq_cycle = next((r["sides"]["pgmq"] for r in (counted or {}).get("shapes", []) if r["key"] == "cycle"), None)
        for e in lease:
            entries = ", ".join(f"`{name.split('.')[-1]}` {n}" for name, n in sorted(e["lease_index_entries"].items()))
            total = sum(e["lease_index_entries"].values())
            cells = ""
            if counted:
                d = pgmq_cycle if e["design"].startswith("pgmq") else designs.get(e["design"])
                cells = f"| {_f(d['per_message']) if d else '–'} | {_f(d.get('wal_per_message')) if d else '–'} "
            w(f"| {e['design']} | {total}: {entries} | {'yes' if e['hot'] else 'no'} {cells}|")
        w("")
    w("<details><summary>the pgbench scripts</summary>")
    w("")
    first = next(iter(measured["regimes"].values()))
    for row in first:
        for who, side in row["sides"].items():
            w(f"**{row['shape']}, {who}** ({side['label']}):")
            w("```sql")
            w(side["script"].rstrip())
            w("```")
    for d in (counted or {}).get("designs", []):
        w(f"**lease design {d['design']}**:")
        w("```sql")
        w(d["script"].rstrip())
        w("```")
    w("</details>")
    w("")


def consumers_section(measured: dict, w: Any) -> None:
    cost = measured["notify_cost"]
    w("## Consumers v2: what notify costs, how soon a waiting consumer wakes")
    w("")
    w(f"{cost['producers']} producer processes enqueue one message per call into two work queues, one with "
      "`notify: true`, in alternating rounds (medians). NOTIFY takes a cluster-wide lock while the "
      "transaction commits, so committing producers queue on it.")
    w("")
    w("| queue | enqueues/s |")
    w("|---|---:|")
    w(f"| notify off | {_f(cost['plain_per_s'])} |")
    w(f"| notify on | {_f(cost['notify_per_s'])} |")
    w(f"| cost of notify | {_f(cost['cost_percent'], 1)} % |")
    w("")
    w("A consumer waits in `dequeue(wait=...)` while a producer commits one message at a random moment "
      "(50–250 ms apart); latency from the producer's `enqueue` returning to the consumer's `dequeue` "
      "returning that message.")
    w("")
    w("| woken by | messages | p50 ms | p95 ms | max ms |")
    w("|---|---:|---:|---:|---:|")
    for row in measured["wake_latency"]:
        w(f"| {row['mode']} | {row['messages']} | {_f(row['p50_ms'], 1)} | {_f(row['p95_ms'], 1)} | {_f(row['max_ms'], 1)} |")
    w("")
    paced = measured.get("paced")
    if paced:
        paced_section(paced, w)


def paced_section(paced: dict, w: Any) -> None:
    n = paced["consumers"]
    w(f"### {n} consumers at {paced['rate']:.0f} msg/s: waiting against polling")
    w("")
    w(f"One producer process enqueues one message per call at {paced['rate']:.0f} messages/s for "
      f"{paced['seconds']:.0f} s while {n} consumer processes take one message at a time (`dequeue`, then "
      f"`complete` with its lease token) for {paced['drain_seconds']:.0f} s longer. LISTEN: `dequeue(wait=...)` "
      "on a queue with `notify: true`; wait verb: the same on a queue without it; polling: `dequeue`, and a "
      "sleep when it returned nothing. Latency: from the producer's `enqueue` returning (committed) to a "
      "consumer's `dequeue` returning that message; every message reached exactly one consumer. Statements: "
      "what the consumers sent, each a round trip (a `CALL` of the wait verb counts once, however long it waits).")
    w("")
    w(f"Idle: {n} new consumer processes of the same mode with nothing to take for {paced['idle_seconds']:.0f} s. "
      "Statements sent are counted by the client; transactions are the database's `xact_commit` over the "
      "idle run (read once the consumers' backends have exited and reported; it includes each consumer's "
      "first call, and anything autovacuum ran in that database); server CPU is what their "
      "backends ran (`/proc/<pid>/schedstat`, embedded server only).")
    w("")
    w("| mode | p50 ms | p95 ms | p99 ms | max ms | producer behind schedule, max ms | statements/s (busy) | "
      "idle: statements/s sent | idle: transactions/s | idle: server CPU % of a core | "
      "load average (1 min) before → after |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in paced["runs"]:
        w(f"| {r['mode']} | {_f(r['p50_ms'], 1)} | {_f(r['p95_ms'], 1)} | {_f(r['p99_ms'], 1)} | "
          f"{_f(r['max_ms'], 1)} | {_f(r['producer_max_behind_ms'], 1)} | {_f(r['busy_statements_per_s'])} | "
          f"{_f(r['idle_statements_per_s'], 2)} | "
          f"{_f(r['idle_server_transactions_per_s'], 1)} | {_f(r['idle_server_cpu_percent'], 2)} | "
          f"{r['load_start'][0]:.2f} → {r['load_end'][0]:.2f} |")
    w("")


def instruction_section(counted: dict, w: Any) -> None:
    w("## Server work per message: instructions (callgrind)")
    w("")
    w("A second throwaway server runs every one of its processes under valgrind's callgrind, which counts the "
      "instructions each one executes, whatever else the machine is doing. Each shape's pgbench script (one client, "
      f"`-M prepared`) runs {counted['short']} and then {counted['long']} transactions, each time in a new "
      "connection from the same starting state; the difference between the two runs' server instructions, over the "
      "difference in messages moved, is the steady-state cost of one message: connection, start-up and plan-cache "
      "warm-up cancel. It counts the server's work only (parse, plan, execute, commit, the protocol), not waiting, "
      "memory stalls or concurrency, and pgbench is the same C client on both sides. Autovacuum is off on that "
      "server; the queues are vacuumed where the other parts vacuum them. Held-back vacuum is not counted: under "
      "valgrind's slowdown the claim position (which lives one second) would expire on every call behind "
      "thousands of dead tuples, which counts valgrind, not the templates (bench/instructions.py); the buffer "
      "counts of *Vacuum held back* are that target's machine-independent evidence.")
    w("")
    w("| shape | raw SQL | functions | raw / functions |")
    w("|---|---:|---:|---:|")
    for e in counted["ceiling"]:
        w(f"| {e['shape']} | {_f(e['raw']['per_message'])} | {_f(e['fn']['per_message'])} | "
          f"{_ratio(e['ratio'])} |")
    w("")
    peer = counted.get("peer")
    if peer:
        w("| batch-1 dequeue + acknowledgement | instructions per message |")
        w("|---|---:|")
        w(f"| PgQueuer's SQL (the pgbench script of *A peer*) | {_f(peer['pgqueuer']['per_message'])} |")
        w(f"| q_work: `dequeue` + `complete` | {_f(peer['work']['per_message'])} |")
        w(f"| PgQueuer / tablequeue | {_ratio(peer['ratio'])} |")
        w("")
    w("| kind (batch-1 dequeue; work: + complete) | " + " | ".join(f"at {d:,} waiting" for d in counted["depth"][0]["depths"])
      + " | shallow / deep |")
    w("|---|" + "---:|" * (len(counted["depth"][0]["depths"]) + 1))
    for e in counted["depth"]:
        w(f"| {e['kind']} | " + " | ".join(_f(e[str(d)]["per_message"]) for d in e["depths"]) + f" | {_ratio(e['ratio'])} |")
    w("")


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _payload() -> str:
    from .env import PAYLOAD

    return PAYLOAD


if __name__ == "__main__":  # re-render the report from a results.json: python -m bench.report <results.json> <out>
    data = json.loads(Path(sys.argv[1]).read_text())
    print(write_report(data, Path(sys.argv[2]) if len(sys.argv) > 2 else Path("docs")))
