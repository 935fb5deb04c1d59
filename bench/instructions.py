"""Server work per message, counted in CPU instructions: the targets' ratios where the machine's
clock cannot be trusted.

On a host whose CPUs are taken away from it for tenths of a second at a time, messages per second
measure the host. Instructions do not: a second throwaway server runs every one of its processes
under valgrind's callgrind, which counts the instructions each process executes and writes the
count when the process ends. Each shape's pgbench script (the ceiling's and the peer's, one client)
runs twice, SHORT and LONG transactions, each in its own connection; the instructions of that run's
server processes (found by application name in the server log) differ by LONG - SHORT transactions'
worth, so connection, start-up and plan-cache warm-up cancel. Divided by the messages the extra
transactions moved: instructions per message, in the server only (pgbench is the same C client on
both sides of every ratio).

What instructions leave out: waiting (locks, I/O), memory stalls (a deeper index costs cache misses
more than instructions), and concurrency. Throughput ratios compare the same shapes with those in;
these compare the work.

Held-back vacuum is not counted here. Under valgrind the server runs some 50 times slower, and the
claim position lives one second of wall time: behind thousands of dead tuples, finding it from the
head takes longer than that, so under valgrind every call would find it anew, which on a real server
happens once a second. That would count valgrind's slowdown, not the templates. The buffers a
consuming session's dequeue reads, clean and held (the vacuum part), are that target's evidence that
a stalling host cannot blur.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from tablequeue.embedded import EmbeddedPostgres, start_embedded

from .ceiling import destructive_shapes, work_shapes
from .env import Env, max_id, set_depth

# LONG - SHORT messages span two B-tree leaf pages (some 370 `bigint` keys each): a scan reads the
# rest of the leaf page it starts on, so where on its page a queue's head happens to lie moves a
# 200-message difference by up to a tenth; over whole pages that averages out.
SHORT, LONG = 40, 780
# Counted-server settings: no process may come and go but the ones a run starts, and nothing runs
# in parallel workers, whose instructions would land in other files.
SETTINGS = {"autovacuum": "off", "max_parallel_workers_per_gather": "0", "log_connections": "on",
            "log_line_prefix": "'%p '"}
APPLICATION = "tq-counted"
DEPTHS = (1_000, 1_000_000)


def valgrind() -> str:
    path = shutil.which("valgrind")
    if not path:
        raise RuntimeError("bench: the instructions part needs valgrind (apt-get install valgrind; "
                           "`make setup` installs it)")
    return path


@contextlib.contextmanager
def throwaway_server() -> Iterator[EmbeddedPostgres]:
    """A throwaway cluster with SETTINGS, started natively so that queues deploy and load fast;
    count_from_now_on restarts it under callgrind."""
    pg = start_embedded(SETTINGS)
    try:
        yield pg
    finally:
        pg.stop()


def count_from_now_on(pg: EmbeddedPostgres) -> "Counter":
    """Restarts `pg` on the same data with every server process under callgrind."""
    out = Path(tempfile.mkdtemp(prefix="callgrind-", dir=pg.workdir))  # removed with the cluster
    os.chmod(out, 0o777)  # the server's own account writes here
    pg.restart((valgrind(), "--tool=callgrind", "--dump-instr=no", "--dump-line=no", "-q",
                f"--callgrind-out-file={out}/cg.%p"))
    return Counter(pg.url, out, pg.workdir / "server.log")


class Counter:
    def __init__(self, url: str, out: Path, log: Path):
        self.url, self.out, self.log = url, out, log
        self.last_pids: list[int] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="tq-counted-"))
        os.chmod(self.workdir, 0o755)

    def _pids_since(self, offset: int) -> list[int]:
        with self.log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        return [int(m.group(1)) for m in
                re.finditer(rf"^(\d+) LOG:  connection authorized: .*application_name={APPLICATION}\b", text, re.M)]

    def _totals(self, pid: int, timeout: float = 300.0) -> int:
        """The instruction total callgrind writes when process `pid` ends."""
        path = self.out / f"cg.{pid}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                found = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)
                if found:
                    return int(found.group(1))
            time.sleep(0.2)
        raise RuntimeError(f"bench: callgrind wrote no totals for server process {pid} in {timeout:.0f}s")

    def pgbench(self, url: str, script: str, transactions: int, defines: dict[str, str] | None = None) -> int:
        """Runs `script` `transactions` times in one pgbench client (`defines`: its variables' first
        values); returns the instructions of the server processes pgbench connected to."""
        from .ceiling import pgbench_defines

        path = self.workdir / "script.sql"
        path.write_text(script)
        offset = self.log.stat().st_size
        cmd = ["pgbench", "-n", "-M", "prepared", "-c", "1", "-t", str(transactions), *pgbench_defines(defines),
               "-f", str(path), url]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.workdir,
                              env={**os.environ, "PGAPPNAME": APPLICATION})
        failed = re.search(r"number of failed transactions: (\d+)", proc.stdout)
        if proc.returncode != 0 or (failed and int(failed.group(1))):
            raise RuntimeError(f"bench: pgbench failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                               f"{proc.stderr[-2000:]}\n{script}")
        pids = self._pids_since(offset)
        if not pids:
            raise RuntimeError(f"bench: no {APPLICATION} connection in {self.log}")
        total = sum(self._totals(pid) for pid in pids)
        self.last_pids = pids
        return total

    def functions(self, names: dict[str, tuple[str, ...]]) -> dict[str, int]:
        """The inclusive instructions of the last run's server processes in each group of server
        functions (callgrind_annotate --inclusive): where a run's instructions went. Groups may
        overlap (WAL records are written from inside heap and index changes)."""
        wanted = {fn: group for group, fns in names.items() for fn in fns}
        out = dict.fromkeys(names, 0)
        for pid in self.last_pids:
            text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no",
                                   str(self.out / f"cg.{pid}")], capture_output=True, text=True, check=True).stdout
            for found in re.finditer(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*?:([A-Za-z_][\w]*)\b", text, re.M):
                group = wanted.get(found.group(2))
                if group:
                    out[group] += int(found.group(1).replace(",", ""))
        return out

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def per_message(counter: Counter, env: Env, queue: str, script: str, op: str, setup: Any) -> dict:
    """Instructions per message of `script`: the LONG run's instructions minus the SHORT run's,
    over the messages the extra transactions moved. `setup()` is a context manager that puts the
    queue in the same state before each run (and holds it there while the run lasts)."""
    runs = []
    for transactions in (SHORT, LONG):
        with setup():
            before, before_id = rows_written(env, queue, op), max_id(env, queue)
            instructions = counter.pgbench(env.url, script, transactions)
            moved = rows_written(env, queue, op) - before
            if op == "enqueue":
                with env.conn() as conn:
                    conn.execute(f"DELETE FROM {env.table(queue)} WHERE id > %s", (before_id,))
        runs.append({"transactions": transactions, "instructions": instructions, "messages": moved})
    return marginal(runs)


def rows_written(env: Env, queue: str, op: str) -> int:
    """Rows the queue table has had inserted (enqueue) or deleted (dequeue; work: completed), from
    the table's statistics. Counter.pgbench returns once the run's server processes have ended, and
    a server process reports its counts as it ends, so they are complete. (A count(*) of a deep
    queue would take minutes under callgrind.)"""
    column = "n_tup_ins" if op == "enqueue" else "n_tup_del"
    with env.conn() as conn:
        return conn.execute(f"SELECT {column} FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
                            (env.schema, queue)).fetchone()[0]


def marginal(runs: list[dict]) -> dict:
    """The SHORT and LONG runs, and what one more message cost between them (and the WAL bytes
    it wrote, when the runs measured them)."""
    moved = runs[1]["messages"] - runs[0]["messages"]
    out = {"runs": runs, "per_message": (runs[1]["instructions"] - runs[0]["instructions"]) / moved
           if moved > 0 else None}
    if all("wal_bytes" in r for r in runs):
        out["wal_per_message"] = (runs[1]["wal_bytes"] - runs[0]["wal_bytes"]) / moved if moved > 0 else None
    return out


def compared(log: Any, what: str, reference: tuple[str, dict], measured: tuple[str, dict]) -> float | None:
    """The reference's instructions per message over the measured side's (higher is better, as for
    throughput), logged."""
    (ref_name, ref), (name, got) = reference, measured
    ratio = ref["per_message"] / got["per_message"] if ref["per_message"] and got["per_message"] else None
    log(f"  instructions {what}: {ref_name} {ref['per_message'] or 0:,.0f}, {name} {got['per_message'] or 0:,.0f} "
        f"per message ({ref_name} / {name} {ratio or 0:.2f})")
    return ratio


@contextlib.contextmanager
def at_depth(env: Env, queue: str, depth: int) -> Iterator[None]:
    set_depth(env, queue, depth)
    yield


def ceiling(counter: Counter, env: Env, kinds: list[str], log: Any) -> list[dict]:
    out = []
    for kind in kinds:
        queue = f"q_{kind}"
        shapes = work_shapes(env, queue) if kind == "work" else destructive_shapes(env, queue, (1,))
        for shape in shapes:
            if shape.batch != 1:
                continue
            depth = 0 if shape.op == "enqueue" else DEPTHS[0]
            raw = per_message(counter, env, queue, shape.raw, shape.op, lambda: at_depth(env, queue, depth))
            fn = per_message(counter, env, queue, shape.fn, shape.op, lambda: at_depth(env, queue, depth))
            out.append({"shape": shape.name, "kind": kind, "op": shape.op, "raw": raw, "fn": fn,
                        "ratio": compared(log, shape.name, ("raw", raw), ("functions", fn))})
    return out


def dequeue_script(env: Env, queue: str) -> str:
    """What the depth target measures: a batch-of-one dequeue (work: dequeue + complete)."""
    from .ceiling import fn_call
    from .work_raw import work_fn_cycle

    if env.queue(queue).kind == "work":
        return work_fn_cycle(env, queue)
    return fn_call(env, queue, "dequeue", "batch_size => 1")


def depth(counter: Counter, env: Env, kinds: list[str], log: Any) -> list[dict]:
    """The same dequeue on q_<kind> at the shallowest depth and on its twin q_<kind>_deep, loaded to
    the deepest (and vacuumed) before the server went under callgrind, and left as it is between its
    two runs: they take SHORT + LONG messages of a million."""
    out = []
    for kind in kinds:
        shallow, deep = f"q_{kind}", f"q_{kind}_deep"
        entry: dict[str, Any] = {"kind": kind, "depths": list(DEPTHS)}
        for d, queue, setup in ((DEPTHS[0], shallow, lambda: at_depth(env, shallow, DEPTHS[0])),
                                (DEPTHS[-1], deep, contextlib.nullcontext)):
            entry[str(d)] = per_message(counter, env, queue, dequeue_script(env, queue), "dequeue", setup)
        entry["ratio"] = compared(log, f"depth {kind}", (f"{DEPTHS[0]:,} waiting", entry[str(DEPTHS[0])]),
                                  (f"{DEPTHS[-1]:,} waiting", entry[str(DEPTHS[-1])]))
        out.append(entry)
    return out


def peer(counter: Counter, env: Env, pgq_url: str, log: Any) -> dict:
    """Batch-of-one dequeue + acknowledgement: PgQueuer's SQL (its own statements) against the work
    kind's functions, both through pgbench, on the counted server."""
    from .peer import _pgq_queued, load_pgqueuer, pgqueuer_cycle_script

    script = pgqueuer_cycle_script()
    runs = []
    for transactions in (SHORT, LONG):
        load_pgqueuer(pgq_url, DEPTHS[0])
        before = _pgq_queued(pgq_url)
        instructions = counter.pgbench(pgq_url, script, transactions)
        runs.append({"transactions": transactions, "instructions": instructions,
                     "messages": before - _pgq_queued(pgq_url)})
    pgqueuer = marginal(runs)
    work = per_message(counter, env, "q_work", dequeue_script(env, "q_work"), "dequeue",
                       lambda: at_depth(env, "q_work", DEPTHS[0]))
    return {"pgqueuer": pgqueuer, "work": work, "script_pgqueuer": script,
            "ratio": compared(log, "peer cycle", ("PgQueuer SQL", pgqueuer), ("q_work", work))}


class OneConnectionEnv(Env):
    """An Env whose helpers share one connection: under callgrind every new connection costs
    seconds of server start-up, and a helper's server process ending in the middle of a run would
    be harder to tell from the run's own."""

    shared: Any = None

    def conn(self, autocommit: bool = True) -> Any:
        if self.shared is None or self.shared.closed:
            self.shared = super().conn(autocommit=True)
        return contextlib.nullcontext(self.shared)


def run(kinds: list[str], log: Any) -> dict:
    from .env import deploy_env, queue_entries
    from .peer import pgq_database

    with throwaway_server() as pg:
        deployed = deploy_env(pg.url, queue_entries(kinds, deep=True))
        for kind in kinds:
            t0 = time.monotonic()
            set_depth(deployed, f"q_{kind}_deep", DEPTHS[-1])
            log(f"  instructions: q_{kind}_deep loaded with {DEPTHS[-1]:,} messages in {time.monotonic() - t0:.0f}s")
        pgq_url = pgq_database(pg.url) if "work" in kinds else None
        counter = count_from_now_on(pg)
        log("  instructions: the server now runs under callgrind")
        env = OneConnectionEnv(deployed.url, deployed.schema, deployed.catalog)
        try:
            out: dict[str, Any] = {"short": SHORT, "long": LONG}
            out["ceiling"] = ceiling(counter, env, kinds, log)
            out["peer"] = peer(counter, env, pgq_url, log) if pgq_url else None
            out["depth"] = depth(counter, env, kinds, log)
            return out
        finally:
            counter.close()
            if env.shared is not None:
                env.shared.close()
