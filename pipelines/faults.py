"""Fault injection for the drain job: crash a Spark task at a chosen point of its first attempt.

The drain job calls its probe (--probe pipelines.faults:crash_first_attempt) at these events:
  staged     a batch's results are written to staging, nothing of it is completed yet
  completed  the batch's complete_batch returned, inside its open transaction (rolled back by a crash)
  committed  the batch's completes are committed, its marker file is not written yet
  marked     the batch's marker file is written
The enqueue job calls it with "enqueued" after each enqueue_batch call (committed on its own).
drop_connections_once ends the database sessions instead (PostgreSQL), as a failover would.
The tests use it to show that a task Spark retries after a crash leaves no duplicate and loses
nothing; an operator can use it the same way to rehearse a failure.

Tasks share one queue, so which task gets how many batches is a race. With `hold` (a directory
every task can reach) the race cannot make a planned crash miss its batch: every task the plan
never crashes pauses after staging its first batch until every planned crash has happened (a
crashing task leaves a file in `hold` just before it dies), or for at most `hold_seconds`: a retry
planned to crash must find messages left to lease, however slowly Spark starts it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

EVENTS = ("staged", "completed", "committed", "marked", "enqueued")


class SimulatedCrash(RuntimeError):
    """Raised (how='raise') to fail the Spark task the way an unexpected error would."""


CRASHED_FILE = "crashed"


def crash_first_attempt(event: str, info: Mapping[str, Any], *, at: str = "staged", partition: int = 0,
                        batch: int = 2, after_completes: int = 1, how: str = "exit", hold: str | None = None,
                        hold_seconds: float = 60.0) -> None:
    """Crash attempt 0 of task `partition` at event `at` of its batch number `batch` (1-based);
    for at='completed', once that batch's complete_batch answered for at least `after_completes`
    messages. how='exit' kills the Python
    worker (os._exit: no cleanup, the database sees the connection drop); how='raise' raises.
    hold: see the module's docstring."""
    crash_plan(event, info, plan=[{"at": at, "partition": partition, "batch": batch, "attempt": 0,
                                   "after_completes": after_completes}], how=how, hold=hold,
               hold_seconds=hold_seconds)


def crash_plan(event: str, info: Mapping[str, Any], *, plan: Sequence[Mapping[str, Any]],
               how: str = "exit", hold: str | None = None, hold_seconds: float = 60.0) -> None:
    """Crash at every point of the plan: a list of {at, partition, batch, attempt, after_completes};
    e.g. attempt 0 at one point, then its retry (attempt 1) at another. hold: see the module's
    docstring."""
    if hold is not None and event == "staged" and info["batch"] == 1 \
            and all(info["partition"] != step.get("partition", 0) for step in plan):
        _wait_for_crashes(Path(hold), len(plan), hold_seconds)
        return
    for number, step in enumerate(plan):
        at = step.get("at", "staged")
        if at not in EVENTS:
            raise ValueError(f"unknown event {at!r} (expected one of {EVENTS})")
        if (event != at or info["attempt"] != step.get("attempt", 0)
                or info["partition"] != step.get("partition", 0) or info["batch"] != step.get("batch", 1)):
            continue
        if at == "completed" and info["completed_in_batch"] < step.get("after_completes", 1):
            continue
        if hold is not None:
            Path(hold).mkdir(parents=True, exist_ok=True)
            (Path(hold) / crashed_file(number)).touch()
        if how == "exit":
            os._exit(17)
        raise SimulatedCrash(f"simulated crash of task {info['partition']} attempt {info['attempt']} "
                             f"at {at} of batch {info['batch']}")


def crashed_file(number: int) -> str:
    """The file a plan's crash number `number` (0-based) leaves in `hold`."""
    return CRASHED_FILE if number == 0 else f"{CRASHED_FILE}-{number + 1}"


def _wait_for_crashes(hold: Path, crashes: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (not all((hold / crashed_file(number)).exists() for number in range(crashes))
           and time.monotonic() < deadline):
        time.sleep(0.05)


def first_task_attempt_only(payload: Mapping[str, Any], message: Mapping[str, Any]) -> Any:
    """A transform that works only in a Spark task's first attempt (a downstream that went away with
    the crashed attempt): the messages a retried task takes back, its own leases included, fail, and
    with max_attempts 1 end in the dead-letter table; a result staged for one of them before the
    crash must not reach the output."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() > 0:
        raise RuntimeError(f"downstream gone: task attempt {context.attemptNumber()}, message {message.get('id')}")
    return {"id": payload.get("id") if isinstance(payload, Mapping) else None, "ok": True}


def drop_connections_once(event: str, info: Mapping[str, Any], *, url: str, once: str, at: str = "staged",
                          batch: int = 1) -> None:
    """A failover as the task sees it: at event `at` of batch `batch`, end every other session of the
    database (the task's own connection and its heartbeat's among them), once per run: the file
    `once` records that it happened."""
    if event != at or info["batch"] != batch or os.path.exists(once):
        return
    Path(once).touch()
    from tablequeue.engines import connect

    conn = connect(url, autocommit=True)
    try:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                     "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    finally:
        conn.close()
