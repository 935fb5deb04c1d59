"""Message groups, measured (docs/queue-kinds.md, Message groups): throughput of consumers over
grouped queues with 1, 10 and 1,000 groups next to the same kind without groups, and one dequeue at
depth with few or many groups. Reported, never asserted; tests/test_bench_smoke.py runs it tiny.

The queues are filled with raw SQL in the state enqueue leaves (every message of a group waits behind
the group's first, which is its head candidate; one groups row per key), so a million messages take
seconds, not minutes. Consumers are threads with one connection each (the server does the work).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from typing import Callable

from tablequeue.client import QueueClient

from .env import PAYLOAD, Env, deploy_env

KINDS = ("fifo", "work")


def name_of(kind: str, groups: int | None) -> str:
    return f"q_{kind}_plain" if groups is None else f"q_{kind}_g{groups}"


def entries(kinds: tuple[str, ...], group_counts: tuple[int, ...]) -> list[dict]:
    out = []
    for kind in kinds:
        out.append({"name": name_of(kind, None), "kind": kind, "payload": "json"})
        out += [{"name": name_of(kind, g), "kind": kind, "payload": "json", "options": {"groups": True}}
                for g in group_counts]
    return out


def fill(env: Env, kind: str, groups: int | None, messages: int) -> None:
    """Empty the queue, then `messages` messages spread round-robin over `groups` keys (None: no group)."""
    name = name_of(kind, groups)
    table = env.table(name)
    work = kind == "work"
    with env.conn() as conn:
        conn.execute(f"TRUNCATE {table}")
        columns = "enqueued_at, due_at, visible_at, payload" if work else "enqueued_at, payload"
        values = "now(), now(), now(), %(payload)s::jsonb" if work else "now(), %(payload)s::jsonb"
        if groups is None:
            conn.execute(f"INSERT INTO {table} ({columns}) SELECT {values} FROM generate_series(1, %(n)s)",
                         {"n": messages, "payload": PAYLOAD})
        else:
            conn.execute(f'TRUNCATE "{env.schema}"."{name}_groups"')
            conn.execute(f'INSERT INTO "{env.schema}"."{name}_groups" (group_key) '
                         "SELECT 'g' || i FROM generate_series(0, %(g)s - 1) AS i", {"g": groups})
            conn.execute(f"INSERT INTO {table} ({columns}, group_key, group_head) "
                         f"SELECT {values}, 'g' || (i %% %(g)s), i < %(g)s FROM generate_series(0, %(n)s - 1) AS i",
                         {"n": messages, "g": groups, "payload": PAYLOAD})
        conn.execute(f"VACUUM (ANALYZE) {table}")


def consume_for(env: Env, kind: str, groups: int | None, consumers: int, seconds: float) -> dict:
    """`consumers` threads dequeue one message per call (work: and complete it) for `seconds`."""
    name = name_of(kind, groups)
    counts = [0] * consumers
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds

    def consume(slot: int) -> None:
        conn = env.conn()
        client = QueueClient.for_catalog(conn, "postgres", env.catalog, name)
        try:
            while time.monotonic() < stop:
                if kind == "work":
                    rows = client.dequeue(worker=f"b{slot}")
                    for row in rows:
                        client.complete(row["id"], f"b{slot}", lease_token=row["lease_token"])
                else:
                    rows = client.dequeue()
                counts[slot] += len(rows)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=consume, args=(slot,)) for slot in range(consumers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    if errors:
        raise errors[0]
    return {"kind": kind, "groups": groups, "consumers": consumers, "messages": sum(counts),
            "per_s": sum(counts) / elapsed}


def throughput(env: Env, kinds: tuple[str, ...], group_counts: tuple[int, ...], consumers: int,
               seconds: float, messages: int, rounds: int, log: Callable[[str], None]) -> list[dict]:
    rows = []
    for kind in kinds:
        for groups in (None, *group_counts):
            rates = []
            for _ in range(rounds):
                fill(env, kind, groups, messages)
                cell = consume_for(env, kind, groups, consumers, seconds)
                if cell["messages"] >= messages:
                    raise RuntimeError(f"groups bench: {name_of(kind, groups)} ran dry: fill more than {messages}")
                rates.append(cell["per_s"])
            rows.append({"kind": kind, "groups": groups, "consumers": consumers, "per_s": statistics.median(rates),
                         "rounds": rates})
            log(f"  groups: {kind} {'no groups' if groups is None else f'{groups} groups'}: "
                f"{rows[-1]['per_s']:.0f} messages/s at {consumers} consumers")
    return rows


def dequeue_at_depth(env: Env, kind: str, cells: tuple[tuple[int, int], ...], calls: int,
                     log: Callable[[str], None]) -> list[dict]:
    """One consumer, one message per call, for each (messages, groups) cell: `calls` calls, or half
    the queue where it is shorter (so the last call still meets the depth it names)."""
    rows = []
    for depth, groups in cells:
        fill(env, kind, groups, depth)
        cell = consume_calls(env, kind, groups, min(calls, max(1, depth // 2)))
        rows.append({"kind": kind, "depth": depth, "groups": groups, **cell})
        log(f"  groups at depth: {kind} {depth:,} messages in {groups:,} groups: "
            f"median {cell['median_ms']:.2f} ms, p95 {cell['p95_ms']:.2f} ms per dequeue")
    return rows


def consume_calls(env: Env, kind: str, groups: int, calls: int) -> dict:
    name = name_of(kind, groups)
    conn = env.conn()
    client = QueueClient.for_catalog(conn, "postgres", env.catalog, name)
    times = []
    try:
        for _ in range(calls):
            started = time.perf_counter()
            rows = client.dequeue(worker="depth") if kind == "work" else client.dequeue()
            times.append((time.perf_counter() - started) * 1000)
            if not rows:
                raise RuntimeError(f"groups bench: {name} ran dry")
            if kind == "work":
                client.complete(rows[0]["id"], "depth", lease_token=rows[0]["lease_token"])
    finally:
        conn.close()
    times.sort()
    return {"calls": calls, "median_ms": statistics.median(times), "p95_ms": times[int(len(times) * 0.95) - 1]}


def run(url: str, consumers: int, seconds: float, rounds: int, log: Callable[[str], None], quick: bool = False) -> dict:
    group_counts = (1, 10, 1_000)
    messages, depth, calls = (2_000, 20_000, 50) if quick else (60_000, 1_000_000, 2_000)
    # Issue 21's target, dequeue at 10^6 messages in 10^4 groups >= 0.9x "at 10^3", read both ways:
    # against 10^3 groups at the same depth, and against a queue of 10^3 messages (in 10 groups, as
    # many messages per group as the deep queue has, and in 10^3 groups, one each).
    depth_cells = ((1_000, 10), (1_000, 1_000), (depth, 1_000), (depth, 10_000))
    facts = {"started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_start": os.getloadavg(),
             "nproc": os.cpu_count(), "git_head": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                                 capture_output=True, text=True).stdout.strip()}
    env = deploy_env(url, entries(KINDS, tuple(sorted(set(group_counts) | {g for _, g in depth_cells}))))
    try:
        log(f"groups: throughput at {consumers} consumers, {rounds} round(s) of {seconds:.1f} s")
        rates = throughput(env, KINDS, group_counts, consumers, seconds, messages, rounds, log)
        log(f"groups: one dequeue at {depth:,} messages")
        deep = [row for kind in KINDS for row in dequeue_at_depth(env, kind, depth_cells, calls, log)]
    finally:
        env.drop()
    return {"throughput": rates, "depth": deep, **facts, "loadavg_end": os.getloadavg()}


def section(measured: dict, w: Callable[[str], None]) -> None:
    w("## Message groups: throughput and depth")
    w("")
    if "loadavg_start" in measured:
        busy = max(measured["loadavg_start"][0], measured["loadavg_end"][0]) > (measured.get("nproc") or 1)
        w(f"Measured from {measured['started_at']} (commit `{measured.get('git_head') or '?'}`, "
          "`python -m bench.run --parts groups`); load average at start "
          f"{measured['loadavg_start'][0]:.1f}, at the end {measured['loadavg_end'][0]:.1f} on {measured.get('nproc')} "
          "CPUs." + (" **The host was busy with other work: the figures measure it more than tablequeue; read only "
                     "the comparisons within each table.**" if busy else ""))
        w("")
    rates = measured["throughput"]
    consumers = rates[0]["consumers"] if rates else 0
    w(f"{consumers} consumer threads (one connection each) dequeue one message per call (work: and complete "
      "it) from a full queue; medians of the rounds. One group serialises its messages: its throughput is "
      "one consumer's at a time.")
    w("")
    w("| kind | groups | messages/s |")
    w("|---|---:|---:|")
    for row in rates:
        groups = "none" if row["groups"] is None else f"{row['groups']:,}"
        w(f"| {row['kind']} | {groups} | {row['per_s']:,.0f} |")
    w("")
    w("One consumer, one message per call, at depth (work: each completed before the next dequeue).")
    w("")
    w("| kind | messages | groups | median ms | p95 ms |")
    w("|---|---:|---:|---:|---:|")
    for row in measured["depth"]:
        w(f"| {row['kind']} | {row['depth']:,} | {row['groups']:,} | {row['median_ms']:.2f} | {row['p95_ms']:.2f} |")
    w("")
    targets = depth_targets(measured["depth"])
    if targets:
        w("Target (issue 21): one dequeue at the deepest queue with the most groups at >= 0.9x the speed of "
          "each shallower or less grouped queue (speed ratio = the other's median / the deep one's).")
        w("")
        w("| kind | deep queue | against | speed ratio | target |")
        w("|---|---|---|---:|---|")
        for t in targets:
            verdict = "met" if t["ratio"] >= 0.9 else f"missed by {(0.9 - t['ratio']) / 0.9:.0%}"
            w(f"| {t['kind']} | {t['deep']} | {t['against']} | {t['ratio']:.2f} | {verdict} |")
        w("")


def depth_targets(depth: list[dict]) -> list[dict]:
    """The deepest, most grouped cell of each kind against every other cell of that kind."""
    out = []
    for kind in dict.fromkeys(row["kind"] for row in depth):
        cells = [row for row in depth if row["kind"] == kind]
        deep = max(cells, key=lambda row: (row["depth"], row["groups"]))
        for other in cells:
            if other is not deep:
                out.append({"kind": kind, "deep": f"{deep['depth']:,} in {deep['groups']:,} groups",
                            "against": f"{other['depth']:,} in {other['groups']:,} groups",
                            "ratio": other["median_ms"] / deep["median_ms"]})
    return out
