"""Drain a `work` queue with N Spark tasks as consumers; results to Parquet, one row per message.

Each task attempt is one consumer (worker name from the run, the launch, the partition and the
attempt). It leases a batch, keeps its leases alive from a heartbeat thread, applies the transform
to each payload, fails the messages whose transform raised, writes the others' results to a staging
file, completes them in one transaction and then records what complete() returned in a marker file.
It stops when nothing is ready for --idle-seconds or the time budget ends. When the tasks are done,
or have failed, the driver takes back what the run's workers still hold and finalises: the staged
results that were completed, one per message id, go to <output>/results/run_id=<run>/. A run that
died is finished by starting it again with --run-id (and --finalize-only to drain no further).
docs/pipelines.md has the exactly-once argument.

    TABLEQUEUE_URL=postgresql://... python -m pipelines.drain_job --catalog database/queues.yml \
        --queue emails --transform pipelines.transforms:uppercase_name --output /data/emails-out --tasks 4
"""
from __future__ import annotations

import argparse
import inspect
import json
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

if __package__ in (None, ""):  # `spark-submit pipelines/drain_job.py` without --py-files
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.common import (MAX_BATCH, TASK_RETRIES, LeaseHeartbeat, PipelineError, QueueTarget,  # noqa: E402
                              Reconnecting, add_queue_arguments, path_exists,
                              arrow_location, canonical_json, elapsed_since, filesystem, job_description, job_main,
                              load_callable, log, progress_monitor, remove_tree, require_shared_storage, transaction,
                              with_retries)

ERROR_TEXT_LIMIT = 4000
OUTPUT_COLUMNS = ("id", "result", "enqueued_at", "attempts", "worker", "processed_at")
# Outcomes a marker file records. "released": the lease was given back (a retried attempt taking
# over its predecessors' leases, or the driver's sweep at the end of the run), so the worker holding
# it did not complete the message. "zombie_completed": a take-back's release of a staged lease
# answered false and lease_status said gone: a zombie of the attempt completed it (take_back_attempt).
OUTCOMES = ("completed", "lease_lost", "retrying", "dead", "released", "zombie_completed")
SWEEP_PARTITION = -1      # the driver's sweep writes its markers as this partition
TAKE_BACK_LOCK_TIMEOUT = 10  # seconds a take-back waits for a row lock in one try (TASK_RETRIES more tries)
TAKE_BACK_LEASE_SECONDS = 60  # a take-back's extend: what is left held if the take-back then fails
TAKE_BACK_ROUNDS = 3          # dequeues of one take-back, while a staged lease is still held after one


@dataclass(frozen=True)
class DrainConfig:
    """What every task of one launch of a drain run needs; pickled to the executors. A run (run_id)
    may take several launches (a job started again with --run-id): each launch's workers and
    staging folders carry its own launch tag, so no two attempts ever share either."""
    run_id: str
    launch: str
    staging: str
    transform: str
    batch_size: int = 100
    lease_seconds: int | None = None
    time_budget_seconds: float = 600.0
    retry_after_seconds: int = 0
    idle_seconds: float = 5.0
    log_every_batches: int = 10
    probe: str | None = None
    probe_args: dict[str, Any] = field(default_factory=dict)

    def worker(self, partition: int, attempt: int) -> str:
        return worker_name(self.run_id, self.launch, partition, attempt)


class Stopped(Exception):
    """The attempt is to stop (TaskStaging.stop_reason): its complete does not begin another try."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def worker_name(run_id: str, launch: str, partition: int, attempt: int) -> str:
    """One name per task attempt: a retried attempt is a new consumer, and a zombie of the attempt
    before it cannot complete what the new one holds (each lease is fenced by its token as well).
    The stage attempt is not in the name: the consumers' job is one stage with no shuffle input,
    which Spark never runs again as a new stage attempt (only its tasks, as new task attempts)."""
    return f"spark-{run_id}-{launch}-p{partition}-a{attempt}"


# -- staging files (executor side) -------------------------------------------------------------------
def _schemas() -> tuple[Any, Any]:
    """Message ids are staged as text: bigint ids and client-supplied GUIDs alike (the output's id
    column is text too, so that a GUID never has to pass through Spark's isin or a join as a UUID)."""
    import pyarrow as pa

    results = pa.schema([("id", pa.string()), ("result", pa.string()),
                         ("enqueued_at", pa.timestamp("us", tz="UTC")), ("attempts", pa.int32()),
                         ("lease_token", pa.string()), ("worker", pa.string()),
                         ("processed_at", pa.timestamp("us", tz="UTC")), ("batch", pa.int32())])
    markers = pa.schema([("id", pa.string()), ("outcome", pa.string()), ("attempts", pa.int32()),
                         ("lease_token", pa.string()), ("batch", pa.int32())])
    return results, markers


STAGING_KINDS = ("results", "markers")
# Written under the run's staging folder before the finalising sweep, one per launch (stop_file):
# a task that outlived its job (an executor declared lost that still runs) sees it before its next
# lease or complete and stops, instead of completing messages whose results the driver has stopped
# collecting. Never removed: a later launch of the run has its own, and its zombies stay stopped.
STOP_FILE = "_stop"


def stop_file(staging: str, launch: str) -> str:
    return f"{staging}/{STOP_FILE}-{launch}"
# Written in an attempt's markers folder when its task returns: it then holds no lease (every batch
# is completed, failed, lost or given back), so the sweep does not ask its worker, even after the
# job failed (when no task's counts reach the driver).
DONE_FILE = "_done"
# Written in an attempt's markers folder once a take-back of it (the next attempt's, or the sweep's)
# has finished: it was told to stop before, so it holds nothing since, and is not asked again (by a
# later finalisation of the run, or a later attempt of the task).
TAKEN_BACK_FILE = "_taken_back"
# One file per launch under the run's staging folder, written by the driver before its tasks start:
# the launch's batch size, the most any of its workers can hold (what the sweep asks each for).
LAUNCHES = "launches"
# Written in an attempt's markers folder by the next attempt of its task before it takes back what
# the attempt holds: a zombie of the attempt sees it as a stop file of its own.
SUPERSEDED_FILE = "_superseded"


class TaskStaging:
    """One task attempt's staging folders, made before its first lease together with the other
    one-time costs (the Parquet writer's import, the filesystem: on an object store a region and
    credential lookup). On a loaded executor they take seconds to tens of seconds, and a first batch
    that paid them could outlive its lease and be processed twice."""

    def __init__(self, root: str, launch: str, partition: int, attempt: int) -> None:
        import pyarrow.parquet  # noqa: F401

        self.fs, base = filesystem(root)
        self.base = base
        self.stop_file = stop_file(base, launch)
        self.folders = {kind: attempt_folder(base, kind, launch, partition, attempt) for kind in STAGING_KINDS}
        for folder in self.folders.values():
            self.fs.create_dir(folder, recursive=True)

    def stop_reason(self) -> str | None:
        """Why this attempt is to stop, if it is: the driver has begun to finalise the run (written
        the stop file before its sweep), or a later attempt of the task has begun to take back what
        this one holds (written this attempt's superseded file first)."""
        if path_exists(self.fs, self.stop_file):
            return "run finalised"
        if path_exists(self.fs, f"{self.folders['markers']}/{SUPERSEDED_FILE}"):
            return "superseded by a later attempt"
        return None

    def supersede(self, attempt: int) -> None:
        """Tell an earlier attempt of this task (a zombie, if it still runs) to stop. Its folder is
        made if it has none yet (it died, or is still starting: then it stops before its first
        lease), at the price of one filler batch when the sweep asks that worker."""
        folder = self.folders["markers"].rsplit("/", 1)[0] + f"/attempt={attempt}"
        self.fs.create_dir(folder, recursive=True)
        with self.fs.open_output_stream(f"{folder}/{SUPERSEDED_FILE}") as stream:
            stream.write(b"superseded")

    def write_done(self) -> None:
        with self.fs.open_output_stream(f"{self.folders['markers']}/{DONE_FILE}") as stream:
            stream.write(b"done")

    def write(self, kind: str, rows: list[dict], schema: Any, batch: int, name: str | None = None) -> None:
        """Write a Parquet file (batch-<batch>, or `name`) under a temporary name (ignored by Spark
        readers: leading '_'), then rename it: a reader sees the whole file or nothing."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = self.folders[kind]
        name = name or f"batch-{batch:06d}"
        final = f"{folder}/{name}.parquet"
        temporary = f"{folder}/_tmp-{name}-{secrets.token_hex(4)}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), temporary, filesystem=self.fs)
        self.fs.move(temporary, final)


def attempt_folder(staging: str, kind: str, launch: str, partition: int, attempt: int) -> str:
    """An attempt's results or markers folder (staging: the run's, within its filesystem)."""
    return f"{staging}/{kind}/launch={launch}/part={partition}/attempt={attempt}"


def _marker(message: dict, outcome: str, batch: int) -> dict[str, Any]:
    """What a marker file records of one lease: the message, the lease (its attempt count and
    token, which is how finalisation orders it against a staged result) and what became of it."""
    return {"id": _key(message["id"]), "outcome": outcome, "attempts": message.get("attempts"),
            "lease_token": _token(message.get("lease_token")), "batch": batch}


def give_back(call: Callable[[str, Callable[[Any], Any]], Any], worker: str, rows: list[dict],
              record: Callable[[list[dict]], None]) -> int:
    """A task gives back its own leases `rows` (dequeue's rows), recorded as released first, so that
    a crash in between never leaves a released message unrecorded; returns how many there were. The
    record stays whatever a release answers: the task holds these leases and completes none of them
    after this, so a false is a lease that ran out or a repeated release whose first try committed."""
    if rows:
        record(rows)
        for row in rows:
            call("release", lambda client, row=row: client.release(row["id"], worker, lease_token=row["lease_token"]))
    return len(rows)


def take_back(call: Callable[[str, Callable[[Any], Any]], Any], worker: str, batch_size: int,
              record: Callable[[list[dict], str], None], staged: set[tuple] = frozenset()) -> int:
    """Give back whatever `worker` (a worker told to stop) still holds; returns how many leases were
    given back. A dequeue under its name returns its own leases first (live ones unchanged, expired
    ones leased again), and fills the batch with other ready messages; all of them are released,
    attempt included, and the released tokens are void: a zombie of that worker can no longer
    complete them. Then recorded, by what each release answered: released; or, for a staged lease
    (`staged`: its (id, token)) whose first release try answered false, what lease_status says: gone
    is a zombie's complete that got in first (take_back_attempt), recorded zombie_completed. Records
    come after the releases: a crash in between leaves those staged leases untraced, and finalisation
    then asks lease_status itself (finalize_drain), which answers lost for a lease given back.
    batch_size must be at least what the worker can hold: one batch of its launch (each dequeue
    under a name declares that it holds nothing else, so a name never holds more than its largest
    dequeue). One dequeue then takes back all of it, except a lease whose row another session has
    locked at that instant (the dequeue skips locked rows: see sweep); no answer could show that
    more is held, since on a deep queue every answer is filled with other messages.
    call(what, function of the client): see retrying_calls; a repeated dequeue under the same name
    returns the same leases, a repeated release answers false."""
    rows = call("take back", lambda client: client.dequeue(batch_size, worker=worker))
    given_back, refused = [], []
    for row in rows:
        tries = []

        def release(client: Any, row: dict = row) -> Any:
            tries.append(1)
            return client.release(row["id"], worker, lease_token=row["lease_token"])
        if call("release", release) or (_key(row["id"]), _token(row["lease_token"])) not in staged:
            given_back.append(row)
        elif len(tries) > 1:
            # A repeat answering false after a try whose answer was lost: most likely that try
            # committed. Taken as released; were it a zombie's complete instead, its result is lost.
            log().warning("drain: worker %s: the release of message %s answered false on a repeated try: "
                          "recorded as released", worker, row["id"])
            given_back.append(row)
        else:
            refused.append(row)
    if refused:
        answers = lease_statuses(call, refused)
        completed = [r for r in refused if answers[(_key(r["id"]), _token(r["lease_token"]))] == "gone"]
        given_back += [r for r in refused if r not in completed]
        if completed:
            record(completed, "zombie_completed")
    if given_back:
        record(given_back, "released")
    return len(rows)


def retrying_calls(target: QueueTarget, connection: Reconnecting, retries: int = TASK_RETRIES
                   ) -> Callable[[str, Callable[[Any], Any]], Any]:
    """call(what, function) runs function(client) on the connection, and again on a new connection
    after a transient error (a failover drops it), up to `retries` more times. Every verb the drain
    uses is safe to repeat: dequeue under the same worker gives back that worker's own leases,
    complete, fail and release are fenced by the lease token (a repeat of one that committed answers
    'lost'), and a function holding a transaction is rolled back whole before it is repeated."""
    def call(what: str, function: Callable[[Any], Any]) -> Any:
        return with_retries(f"{what} {target.name}", lambda: function(connection.client()), retries,
                            on_retry=connection.reset)
    return call


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= ERROR_TEXT_LIMIT else text[:ERROR_TEXT_LIMIT - 3] + "..."


def _payload(target: QueueTarget, raw: Any) -> Any:
    if target.queue.payload == "json" and isinstance(raw, (str, bytes)):
        return json.loads(raw)   # SQL Server returns JSON as nvarchar
    if target.queue.payload == "binary" and isinstance(raw, memoryview):
        return bytes(raw)
    return raw


def _aware(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)   # SQL Server datetime2 is UTC by contract
    return value


def _key(value: Any) -> str:
    """Message ids as staging and the output store them: text, for bigint ids and GUIDs alike."""
    return str(value)


def _token(value: Any) -> str | None:
    return None if value is None else str(value)


def _takes_message(function: Callable) -> bool:
    try:
        parameters = [p for p in inspect.signature(function).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return False
    return len(parameters) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def drain_partition(target: QueueTarget, config: DrainConfig) -> dict[str, Any]:
    """Run on an executor: one consumer until nothing is ready for idle_seconds or the time budget ends."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    worker = config.worker(partition, attempt)
    transform = load_callable(config.transform)
    with_message = _takes_message(transform)
    probe = load_callable(config.probe) if config.probe else None
    results_schema, markers_schema = _schemas()
    lease_seconds = config.lease_seconds or int(target.queue.options["lease_seconds"])
    started = time.monotonic()
    deadline = started + config.time_budget_seconds
    counts = {"partition": partition, "attempt": attempt, "worker": worker, "batches": 0, "leased": 0,
              "completed": 0, "lease_lost": 0, "retrying": 0, "dead": 0, "released": 0, "stopped": "time budget"}

    def fire(event: str, batch: int, completed_in_batch: int = 0) -> None:
        if probe is not None:
            probe(event, {"partition": partition, "attempt": attempt, "batch": batch, "worker": worker,
                          "completed_in_batch": completed_in_batch}, **config.probe_args)

    staging = TaskStaging(config.staging, config.launch, partition, attempt)
    heartbeat = LeaseHeartbeat(target, lease_seconds)
    batch = 0
    settled = True
    connection = Reconnecting(target)
    call = retrying_calls(target, connection)
    try:
        # The attempts before this one died or were given up: take back what they held, so their
        # messages come back now (not when their leases run out) and no zombie completes them. Each
        # is told to stop first, as the sweep does with the run (take_back_attempt). Their markers
        # are batch 0 of this attempt (before its first lease), one file per predecessor. They are
        # of this launch: none held more than this launch's batch size.
        if attempt > 0:
            waiting = Reconnecting(target, lock_timeout_seconds=TAKE_BACK_LOCK_TIMEOUT)
            try:
                for earlier in range(attempt):
                    predecessor = RunAttempt(config.launch, partition, earlier)
                    if holds_nothing(staging.fs, staging.base, predecessor):
                        continue
                    staging.supersede(earlier)

                    def record(rows: list[dict], round_: int, outcome: str, earlier: int = earlier) -> None:
                        staging.write("markers", [_marker(r, outcome, 0) for r in rows], markers_schema, 0,
                                      name=f"{outcome}-from-attempt-{earlier}-{round_}")
                    counts["released"] += take_back_attempt(
                        target, retrying_calls(target, waiting, TASK_RETRIES), config.staging, predecessor,
                        config.run_id, config.batch_size, record, "Spark's next attempt of this task tries again")
            finally:
                waiting.close()
        while time.monotonic() < deadline:
            if (reason := staging.stop_reason()) is not None:
                counts["stopped"] = reason
                break
            messages = call("dequeue", lambda client: client.dequeue(config.batch_size, worker=worker,
                                                                     lease_seconds=config.lease_seconds))
            if not messages:
                # wait claims nothing and holds no lock; a retry delayed beyond idle_seconds, or a
                # lease another consumer holds, is left to the next run.
                wait_ms = max(1, int(min(config.idle_seconds, deadline - time.monotonic()) * 1000))
                if call("wait", lambda client: client.wait(wait_ms)):
                    continue
                counts["stopped"] = "drained"
                break
            batch += 1
            if (reason := staging.stop_reason()) is not None:
                # Looked at again after the lease: the driver writes the stop file before its sweep's
                # dequeues, so a batch leased after the sweep asked this worker is seen here and given
                # back, never completed into a staging folder the driver has stopped reading.
                def record(rows: list[dict], batch: int = batch) -> None:
                    staging.write("markers", [_marker(r, "released", batch) for r in rows], markers_schema, batch)
                counts["released"] += give_back(call, worker, messages, record)
                counts["stopped"] = reason
                break
            counts["batches"] += 1
            counts["leased"] += len(messages)
            leases = {_key(m["id"]): m for m in messages}
            heartbeat.hold(batch, [{"worker": worker, "acks": [[m["id"], m["lease_token"]] for m in messages]}])
            staged: list[dict[str, Any]] = []
            outcomes: list[dict[str, Any]] = []

            def record_failures(failures: list[dict], batch: int = batch) -> None:
                # The fails of a batch left unmarked are traces all the same (a message failed here
                # may have a row staged by an earlier lease): their own file, under a batch number
                # no staged file has, so that the batch stays unmarked.
                if failures:
                    staging.write("markers", [{**f, "batch": -batch} for f in failures], markers_schema, -batch,
                                  name=f"failed-{batch:06d}")
            for message in messages:
                payload = _payload(target, message["payload"])
                try:
                    value = transform(payload, dict(message)) if with_message else transform(payload)
                    result = canonical_json(value)
                except Exception as exc:  # noqa: BLE001 - any error of the transform fails the message
                    error = _error_text(exc)
                    outcome = call("fail", lambda client: client.fail(
                        message["id"], worker, error, config.retry_after_seconds,
                        lease_token=message["lease_token"]))
                    # retrying | dead | lost (the lease had expired: another worker may have it)
                    outcome = outcome if outcome in ("retrying", "dead") else "lease_lost"
                    outcomes.append(_marker(message, outcome, batch))
                    counts[outcome] += 1
                    continue
                staged.append({"id": _key(message["id"]), "result": result,
                               "enqueued_at": _aware(message.get("enqueued_at")),
                               "attempts": message.get("attempts"), "worker": worker,
                               "lease_token": _token(message.get("lease_token")),
                               "processed_at": datetime.now(timezone.utc), "batch": batch})
            if staged:
                # 1. results are durable before any of them is completed ...
                staging.write("results", staged, results_schema, batch)
                fire("staged", batch)
                # 2. ... the batch's completes commit together (one statement, each fenced by its
                # lease token: a crash rolls them all back; a transient error repeats the whole
                # transaction) ...
                tries = []

                def complete(client: Any) -> list[dict]:
                    # Looked at before each try, after the staging: once the driver has written the
                    # stop file, no try of this worker begins, so the sweep, which reads the staging
                    # after writing it, knows of every lease a try can still be completing.
                    if (reason := staging.stop_reason()) is not None:
                        raise Stopped(reason)
                    tries.append(1)
                    with transaction(client):
                        answer = client.complete_batch([leases[row["id"]] for row in staged], worker)
                        completed = {_key(row["id"]): bool(row["completed"]) for row in answer}
                        fire("completed", batch, len(staged))
                    return [_marker(leases[row["id"]], "completed" if completed[row["id"]] else "lease_lost",
                                    batch) for row in staged]
                try:
                    outcomes += call("complete", complete)
                except Stopped as stop:
                    heartbeat.drop(batch)
                    counts["stopped"] = stop.reason
                    if tries:
                        # A try before may have committed: left unmarked, for the sweep and the
                        # finalisation to decide, as when a task dies between commit and marker.
                        record_failures(outcomes)
                        settled = False
                        break

                    def record(rows: list[dict], batch: int = batch) -> None:
                        staging.write("markers", outcomes + [_marker(r, "released", batch) for r in rows],
                                      markers_schema, batch)
                    counts["released"] += give_back(call, worker, [leases[row["id"]] for row in staged], record)
                    break
                fire("committed", batch)
            heartbeat.drop(batch)
            if staged and len(tries) > 1 and any(o["outcome"] != "completed" for o in outcomes[-len(staged):]):
                # A try whose answer the dropped connection lost may have committed: a lease the repeat
                # found gone may be one it completed. The batch stays unmarked, as when a task dies
                # between commit and marker, and finalisation keeps a staged result that has no trace
                # after it (a completed message leaves none).
                log().warning("drain %s: worker %s: batch %s's complete was repeated after a transient error "
                              "and found leases gone; left unmarked for finalisation to decide", target.name,
                              worker, batch)
                record_failures(outcomes[:len(outcomes) - len(staged)])
                settled = False
                continue
            # 3. ... and what complete() returned is recorded; the driver keeps only completed results.
            staging.write("markers", outcomes, markers_schema, batch)
            fire("marked", batch)
            for outcome in outcomes[len(outcomes) - len(staged):]:
                counts[outcome["outcome"]] += 1
            if counts["batches"] % config.log_every_batches == 0:
                log().info("drain %s: worker %s: %s batches, %s leased, %s completed, %s retrying, %s dead, "
                           "%s leases lost", target.name, worker, counts["batches"], counts["leased"],
                           counts["completed"], counts["retrying"], counts["dead"], counts["lease_lost"])
        if settled:
            # This attempt holds nothing now: the sweep need not ask its worker (see sweep). Not
            # so after a batch left unmarked: a lease its repeated complete found gone may be one
            # that ran out and is still under this worker's name.
            staging.write_done()
    finally:
        heartbeat.close()
        connection.close()
    counts["seconds"] = elapsed_since(started)
    log().info("drain %s: worker %s %s after %.1fs: %s leased, %s completed, %s retrying, %s dead, %s leases "
               "lost, %s taken back from earlier attempts", target.name, worker, counts["stopped"],
               counts["seconds"], counts["leased"], counts["completed"], counts["retrying"], counts["dead"],
               counts["lease_lost"], counts["released"])
    return counts


# -- finalisation (driver side) ------------------------------------------------------------------------
def _has_staged_files(path: str) -> bool:
    """Does any task attempt's folder under path hold a finished file? Every attempt makes its
    folders before its first lease, so an attempt that staged nothing leaves them empty; a name
    starting with '_' is a write that a dying task never finished (Spark skips those too)."""
    from pyarrow import fs

    filesystem_, inner = filesystem(path)
    return any(info.type == fs.FileType.File and info.base_name.endswith(".parquet")
               and not info.base_name.startswith("_")
               for info in filesystem_.get_file_info(fs.FileSelector(inner, recursive=True, allow_not_found=True)))


@dataclass(frozen=True)
class RunAttempt:
    """One task attempt of a run, found by its staging folders (made before its first lease)."""
    launch: str
    partition: int
    attempt: int

    def worker(self, run_id: str) -> str:
        return worker_name(run_id, self.launch, self.partition, self.attempt)


def attempt_marker_folder(staging: str, attempt: RunAttempt) -> str:
    return attempt_folder(staging, "markers", attempt.launch, attempt.partition, attempt.attempt)


def holds_nothing(filesystem_: Any, staging: str, attempt: RunAttempt) -> bool:
    """Has the attempt returned with every batch marked (its done file), or been taken back after it
    was told to stop (its taken-back file)? Then it holds no lease and need not be asked."""
    folder = attempt_marker_folder(staging, attempt)
    return any(path_exists(filesystem_, f"{folder}/{name}") for name in (DONE_FILE, TAKEN_BACK_FILE))


def run_attempts(staging: str) -> list[RunAttempt]:
    """Every task attempt of the run (the sweep's own folders left out)."""
    from pyarrow import fs

    filesystem_, inner = filesystem(f"{staging}/markers")
    found = set()
    for info in filesystem_.get_file_info(fs.FileSelector(inner, recursive=True, allow_not_found=True)):
        parts = dict(p.split("=", 1) for p in info.path[len(inner):].strip("/").split("/") if "=" in p)
        if info.type == fs.FileType.Directory and {"launch", "part", "attempt"} <= set(parts) \
                and int(parts["part"]) != SWEEP_PARTITION:
            found.add(RunAttempt(parts["launch"], int(parts["part"]), int(parts["attempt"])))
    return sorted(found, key=lambda a: (a.launch, a.partition, a.attempt))


def run_launches(staging: str) -> list[str]:
    """Every launch of the run: those recorded (before their tasks started) and those whose
    attempts made staging folders."""
    from pyarrow import fs

    filesystem_, inner = filesystem(f"{staging}/{LAUNCHES}")
    recorded = {info.base_name[:-len(".json")]
                for info in filesystem_.get_file_info(fs.FileSelector(inner, allow_not_found=True))
                if info.type == fs.FileType.File and info.base_name.endswith(".json")
                and not info.base_name.startswith("_")}
    return sorted(recorded | {attempt.launch for attempt in run_attempts(staging)})


def write_launch(staging: str, launch: str, batch_size: int) -> None:
    filesystem_, inner = filesystem(f"{staging}/{LAUNCHES}")
    filesystem_.create_dir(inner, recursive=True)
    temporary = f"{inner}/_tmp-{launch}-{secrets.token_hex(4)}.json"
    with filesystem_.open_output_stream(temporary) as stream:
        stream.write(json.dumps({"batch_size": batch_size}).encode("ascii"))
    filesystem_.move(temporary, f"{inner}/{launch}.json")


def launch_batch_size(staging: str, launch: str) -> int:
    """The batch size the launch's tasks leased with; MAX_BATCH, the most any can have, when the
    launch left no record (its driver died between its folders and the record: it leased nothing)
    or one that cannot be read."""
    filesystem_, inner = filesystem(f"{staging}/{LAUNCHES}/{launch}.json")
    try:
        with filesystem_.open_input_stream(inner) as stream:
            return int(json.loads(stream.read())["batch_size"])
    except FileNotFoundError:
        return MAX_BATCH
    except (ValueError, KeyError, TypeError) as exc:
        log().warning("drain: launch %s's record %s cannot be read (%s): its workers are asked for %s",
                      launch, inner, exc, MAX_BATCH)
        return MAX_BATCH


def staged_unmarked(staging: str, attempt: RunAttempt) -> list[dict]:
    """The attempt's staged rows (id, attempts, lease_token) of its batches without a marker file:
    leases that were being completed when the task stopped, each one completed, or still held."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    filesystem_, inner = filesystem(staging)
    names = {kind: {info.base_name for info in filesystem_.get_file_info(fs.FileSelector(
                 attempt_folder(inner, kind, attempt.launch, attempt.partition, attempt.attempt), allow_not_found=True))
                 if info.type == fs.FileType.File and info.base_name.startswith("batch-")}
             for kind in STAGING_KINDS}
    rows: list[dict] = []
    for name in sorted(names["results"] - names["markers"]):
        path = f"{attempt_folder(inner, 'results', attempt.launch, attempt.partition, attempt.attempt)}/{name}"
        rows += pq.read_table(path, columns=["id", "attempts", "lease_token"], filesystem=filesystem_).to_pylist()
    return rows


def take_back_attempt(target: QueueTarget, call: Callable[[str, Callable[[Any], Any]], Any], staging: str,
                      attempt: RunAttempt, run_id: str, batch_size: int, record: Callable[[list[dict], int, str], None],
                      then: str) -> int:
    """Take back what `attempt` holds, once it has been told to stop (the run's stop file, or its
    superseded file); returns how many leases were given back. First each staged lease of its
    batches without a marker (being completed when it stopped: completed, or still held) is
    extended by its token, which waits for a transaction holding its row, a zombie of the attempt
    inside that batch's complete. No try of a complete begins once the attempt is told to stop
    (drain_partition looks before each), and a zombie completes only what it staged. Except a
    zombie that looked just before the stop file was written: its complete may land between the
    take-back's dequeue and its release, which then answers false on its first try. The extend left
    each such lease live for TAKE_BACK_LEASE_SECONDS, so no one but the zombie can have ended it:
    lease_status tells which (gone: completed), recorded as zombie_completed, which finalisation
    keeps (take_back). A staged lease the dequeue skipped (its row locked at that instant: a zombie's heartbeat)
    is still extended afterwards: then another round, at most TAKE_BACK_ROUNDS.
    record(rows, round, outcome) writes a round's record. `call` has a lock timeout; a lease still
    locked after its tries stops this with an error that says what to do, `then`."""
    worker = attempt.worker(run_id)
    def held() -> list[dict]:
        # Listed again each time: a batch the attempt staged since the last look is checked too.
        still = []
        for row in staged_unmarked(staging, attempt):
            try:
                if call("wait for a lease", lambda client, row=row: client.extend_lease(
                        row["id"], worker, TAKE_BACK_LEASE_SECONDS, lease_token=row["lease_token"])):
                    still.append(row)
            except Exception as exc:
                if not lock_timed_out(exc):
                    raise
                raise PipelineError(
                    f"drain {target.name}: worker {worker}'s lease of message {row['id']} stayed locked by "
                    f"another session through {TASK_RETRIES + 1} waits of {TAKE_BACK_LOCK_TIMEOUT}s (a zombie of "
                    f"that task inside its complete?): end that session, then {then}") from exc
        return still

    held()
    released = 0
    for round_ in range(TAKE_BACK_ROUNDS):
        try:
            staged = {(_key(r["id"]), _token(r["lease_token"])) for r in staged_unmarked(staging, attempt)}
            released += take_back(call, worker, batch_size,
                                  lambda rows, outcome, round_=round_: record(rows, round_, outcome), staged)
        except Exception as exc:
            if not lock_timed_out(exc):
                raise
            raise PipelineError(f"drain {target.name}: taking back what worker {worker} holds, a release or "
                                f"lease_status stayed locked by another session through {TASK_RETRIES + 1} waits of "
                                f"{TAKE_BACK_LOCK_TIMEOUT}s (a zombie of that task?): end that session, then "
                                f"{then}") from exc
        still = held()
        if not still:
            filesystem_, inner = filesystem(staging)
            with filesystem_.open_output_stream(f"{attempt_marker_folder(inner, attempt)}/{TAKEN_BACK_FILE}") as stream:
                stream.write(b"taken back")
            return released
    raise PipelineError(f"drain {target.name}: worker {worker} still holds message(s) "
                        f"{', '.join(str(r['id']) for r in still)} after {TAKE_BACK_ROUNDS} take-backs (a zombie of "
                        f"that task still running?): stop it, then {then}")


def lease_statuses(call: Callable[[str, Callable[[Any], Any]], Any], leases: list[dict]) -> dict[tuple, str]:
    """lease_status of `leases` (id, lease_token): (id, token) as staged (_key, _token) -> held,
    lost, dead or gone. At most MAX_BATCH a call and an id once a call: the k-th lease of each
    message goes to the k-th round of calls. It waits for a transaction holding a message (`call`'s
    lock timeout bounds it); it changes nothing, so a repeat is safe."""
    rounds: list[list[tuple]] = []
    seen: dict[str, int] = {}
    for lease in leases:
        key = (_key(lease["id"]), _token(lease["lease_token"]))
        k = seen.get(_same_id(key[0]), 0)
        seen[_same_id(key[0])] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(key)
    answers: dict[tuple, str] = {}
    for keys in rounds:
        for start in range(0, len(keys), MAX_BATCH):
            chunk = {_same_id(id_): (id_, token) for id_, token in keys[start:start + MAX_BATCH]}
            asked = [{"id": id_, "lease_token": token} for id_, token in chunk.values()]
            for row in call("lease status", lambda client, asked=asked: client.lease_status(asked)):
                answers[chunk[_same_id(_key(row["id"]))]] = row["status"]
    return answers


def _same_id(text: str) -> str:
    """An id's text as one form, whatever driver wrote it: a GUID in lower case with hyphens."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def lock_timed_out(exc: BaseException) -> bool:
    """PostgreSQL's lock_not_available (lock_timeout) or SQL Server's 1222 (LOCK_TIMEOUT)."""
    return getattr(exc, "sqlstate", None) == "55P03" or "(1222)" in str(exc)


def sweep(target: QueueTarget, staging: str, run_id: str) -> int:
    """The driver takes back what every worker of the run still holds (a task that died, a zombie,
    a leased batch whose task was cancelled), recording each message as released: those were not
    completed by the run. Returns how many were released. The stop file is written before.

    An attempt whose task returned with every batch marked (its done file) holds nothing and is not
    asked. Each other is taken back (take_back_attempt) with one dequeue under its name of its
    launch's batch size: it may be another launch's, larger than this one's (--finalize-only, a
    later launch), and a lease the sweep left held would have no trace after its staged row, which
    finalisation would then keep as completed."""
    _, markers_schema = _schemas()
    sweeper = TaskStaging(staging, f"sweep{secrets.token_hex(3)}", SWEEP_PARTITION, 0)
    filesystem_, inner = filesystem(staging)
    released = batch = 0
    connection = Reconnecting(target, lock_timeout_seconds=TAKE_BACK_LOCK_TIMEOUT)
    call = retrying_calls(target, connection, TASK_RETRIES)
    batch_sizes: dict[str, int] = {}
    try:
        for attempt in run_attempts(staging):
            if holds_nothing(filesystem_, inner, attempt):
                continue
            if attempt.launch not in batch_sizes:
                batch_sizes[attempt.launch] = launch_batch_size(staging, attempt.launch)
            batch += 1

            def record(rows: list[dict], round_: int, outcome: str, batch: int = batch) -> None:
                sweeper.write("markers", [_marker(r, outcome, batch) for r in rows], markers_schema, batch,
                              name=f"batch-{batch:06d}-{round_}" + ("" if outcome == "released" else f"-{outcome}"))
            released += take_back_attempt(target, call, staging, attempt, run_id, batch_sizes[attempt.launch],
                                          record, f"finalise again with --run-id {run_id} --finalize-only")
    finally:
        connection.close()
    return released


def finalize_drain(spark: Any, target: QueueTarget, output: str, run_id: str) -> dict[str, Any]:
    """Staged results -> <output>/results/run_id=<run_id>: completed ones only, one row per id.

    First the sweep (what the run's workers still hold goes back to the queue, recorded as
    released). Then a staged row is kept when its batch's marker says completed; or, for a batch
    without a marker (its task died between commit and marker), when nothing is recorded about its
    lease after it was staged (no marker of that lease, none of a later lease of the message, and
    the sweep did not find it held): a completed message leaves the queue without a trace, every
    other fate of a lease leaves one in the run's markers. Re-runnable:
    it reads only the run's staging folder and overwrites the run's output folder.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    staging = staging_path(output, run_id)
    final_path = f"{output.rstrip('/')}/results/run_id={run_id}"
    results_dir, markers_dir = f"{staging}/results", f"{staging}/markers"
    summary: dict[str, Any] = {"output": final_path, "staged_rows": 0, "completed": 0,
                               "confirmed_unmarked": 0, **{o: 0 for o in OUTCOMES if o != "completed"}}
    with job_description(spark, f"drain {target.name}: finalize run {run_id}"):
        filesystem_, inner = filesystem(staging)
        filesystem_.create_dir(inner, recursive=True)
        for launch in run_launches(staging):
            with filesystem_.open_output_stream(stop_file(inner, launch)) as stream:
                stream.write(run_id.encode("ascii"))
        summary["swept"] = sweep(target, staging, run_id)
        cached: list[Any] = []   # unpersisted however finalisation ends
        try:
            markers = spark.read.parquet(markers_dir).cache() if _has_staged_files(markers_dir) else None
            cached.append(markers)
            if markers is not None:
                for row in markers.filter(F.col("part") != SWEEP_PARTITION).groupBy("outcome").agg(F.count("*").alias("n")).collect():
                    if row["outcome"] in summary and row["outcome"] != "completed":
                        summary[row["outcome"]] = row["n"]
            if not _has_staged_files(results_dir):
                results_schema, _ = _schemas()
                empty = spark.createDataFrame([], _spark_schema(results_schema)).select(*OUTPUT_COLUMNS)
                empty.write.mode("overwrite").parquet(final_path)
                return summary
            staged = spark.read.parquet(results_dir).cache()
            cached.append(staged)
            summary["staged_rows"] = staged.count()
            keys = ["id", "launch", "part", "attempt", "batch"]
            if markers is None:
                # No marker anywhere (a task died between its only commit and its marker, and the sweep
                # found nothing held): an empty frame of the markers' columns.
                markers = (staged.select(*keys).limit(0).withColumn("outcome", F.lit(None).cast("string"))
                           .withColumn("attempts", F.lit(None).cast("int"))
                           .withColumn("lease_token", F.lit(None).cast("string")))
            completed = markers.filter(F.col("outcome") == "completed").select(*keys).withColumn("marked", F.lit(True))
            batch_keys = ["launch", "part", "attempt", "batch"]
            marked_batches = markers.select(*batch_keys).distinct().withColumn("has_marker", F.lit(True))
            # A trace of a staged lease: a marker of the same lease (same token: released, failed, lost)
            # or of a later lease of the message (more attempts; a released lease gives its attempt back,
            # so an equal count with another token is an earlier lease). A completed message has none.
            later = (staged.select(*keys, "attempts", "lease_token")
                     .join(markers.select("id", F.col("attempts").alias("marker_attempts"),
                                          F.col("lease_token").alias("marker_token")), "id")
                     .filter((F.col("marker_attempts") > F.col("attempts")) | (F.col("marker_token") == F.col("lease_token")))
                     .select(*keys).distinct().withColumn("traced", F.lit(True)))
            rows = (staged.join(completed, keys, "left")
                    .join(marked_batches, batch_keys, "left")
                    .join(later, keys, "left"))
            # A staged lease a take-back found completed by a zombie (its release refused, then gone).
            late = (markers.filter(F.col("outcome") == "zombie_completed").select("id", "lease_token").distinct()
                    .withColumn("late", F.lit(True)))
            rows = rows.join(late, ["id", "lease_token"], "left")
            # Unmarked: the batch has no marker file. Untraced: unmarked, no trace of the lease after it was
            # staged, and the sweep did not find it held (that too is a released marker). What became of
            # each untraced lease the queue tells (lease_status): gone is completed (or purged); dead is a
            # lease that ran out on the message's last attempt, buried by a dequeue; held, expired or lost
            # is a message still in the queue (under the run's lease, alive or run out; released, retried,
            # leased again by a consumer outside the run). Expired is final here as the others are: no
            # complete of the run begins after the stop file, and the sweep waited for those in flight.
            unmarked = F.col("has_marker").isNull()
            untraced = unmarked & F.col("traced").isNull() & F.col("late").isNull()
            asked = [row.asDict() for row in rows.filter(untraced).select("id", "lease_token").distinct().collect()]
            answers = _statuses_of(target, staging, asked, run_id)
            summary["unmarked_status"] = {status: sum(1 for s in answers.values() if s == status)
                                          for status in ("gone", "dead", "lost", "expired", "held")}
            if summary["unmarked_status"]["dead"]:
                log().warning("drain %s: run %s: %s staged row(s) of batches without a marker are of messages now in "
                              "%s (their lease ran out on the last attempt): not written out", target.name, run_id,
                              summary["unmarked_status"]["dead"], target.table("_dead"))
            gone = spark.createDataFrame([(i, t) for (i, t), status in answers.items() if status == "gone"],
                                         "id string, lease_token string").withColumn("gone", F.lit(True))
            rows = rows.join(gone, ["id", "lease_token"], "left").persist()
            cached.append(rows)
            confirmed = untraced & F.col("gone").isNotNull()
            counted = rows.agg(F.sum(F.when(confirmed, 1).otherwise(0)).alias("confirmed"),
                               F.countDistinct(F.when(F.col("late").isNotNull(), F.col("id"))).alias("late")).collect()[0]
            confirmed_count = counted["confirmed"]
            summary["zombie_completed"] = int(counted["late"] or 0)
            # One row per id: a marked completion first, then a zombie's completion a take-back saw, then
            # a confirmed one (within each, the earliest launch, task and batch).
            reason = (F.when(F.col("marked").isNotNull(), 0).when(F.col("late").isNotNull(), 1)
                      .when(confirmed, 2))
            ranked = Window.partitionBy("id").orderBy(reason, "launch", "part", "attempt", "batch")
            final = (rows.filter(reason.isNotNull())
                     .withColumn("_rank", F.row_number().over(ranked))
                     .filter(F.col("_rank") == 1)
                     .select(*OUTPUT_COLUMNS))
            final.write.mode("overwrite").parquet(final_path)
            summary["completed"] = spark.read.parquet(final_path).count()
            summary["confirmed_unmarked"] = int(confirmed_count or 0)
        finally:
            for frame in cached:
                if frame is not None:
                    frame.unpersist()
    return summary


STATUSES = "statuses"   # under the run's staging folder: lease_status answers, asked once


def _statuses_of(target: QueueTarget, staging: str, leases: list[dict], run_id: str) -> dict[tuple, str]:
    """lease_status of the untraced staged leases (a consumer's verb, on a connection of its own).
    An answer other than held is final for a lease (a void token never completes, a lost or dead
    lease is not revived), so it is kept under the run's staging folder and a later finalisation of
    the run reads it instead of asking again: a message purged or whose dead letter was deleted in
    between would answer gone."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    filesystem_, inner = filesystem(f"{staging}/{STATUSES}")
    known: dict[tuple, str] = {}
    for info in filesystem_.get_file_info(fs.FileSelector(inner, allow_not_found=True)):
        if info.type == fs.FileType.File and info.base_name.endswith(".parquet") and not info.base_name.startswith("_"):
            for row in pq.read_table(info.path, filesystem=filesystem_).to_pylist():
                known[(row["id"], row["lease_token"])] = row["status"]
    wanted = [lease for lease in leases if (_key(lease["id"]), _token(lease["lease_token"])) not in known]
    answers = {key: known[key] for key in ((_key(l["id"]), _token(l["lease_token"])) for l in leases) if key in known}
    if not wanted:
        return answers
    connection = Reconnecting(target, lock_timeout_seconds=TAKE_BACK_LOCK_TIMEOUT)
    try:
        asked = lease_statuses(retrying_calls(target, connection, TASK_RETRIES), wanted)
    except Exception as exc:
        if not lock_timed_out(exc):
            raise
        raise PipelineError(f"drain {target.name}: asking what became of {len(wanted)} staged lease(s), a message "
                            f"stayed locked by another session through {TASK_RETRIES + 1} waits of "
                            f"{TAKE_BACK_LOCK_TIMEOUT}s (a zombie of the run inside its complete?): end that "
                            f"session, then finalise again with --run-id {run_id} --finalize-only") from exc
    finally:
        connection.close()
    final = [{"id": i, "lease_token": t, "status": status} for (i, t), status in asked.items() if status != "held"]
    if final:
        filesystem_.create_dir(inner, recursive=True)
        name = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}.parquet"
        schema = pa.schema([("id", pa.string()), ("lease_token", pa.string()), ("status", pa.string())])
        pq.write_table(pa.Table.from_pylist(final, schema=schema), f"{inner}/_tmp-{name}", filesystem=filesystem_)
        filesystem_.move(f"{inner}/_tmp-{name}", f"{inner}/{name}")
    return {**answers, **asked}


def _exists(path: str) -> bool:
    return path_exists(*filesystem(path))


def _staged_runs(output: str) -> list[str]:
    """The run ids whose staging folder is under output (runs not finalised, or kept)."""
    from pyarrow import fs

    filesystem_, inner = filesystem(f"{output.rstrip('/')}/_staging")
    return sorted(info.base_name.split("=", 1)[1]
                  for info in filesystem_.get_file_info(fs.FileSelector(inner, allow_not_found=True))
                  if info.type == fs.FileType.Directory and info.base_name.startswith("run_id="))


def staging_path(output: str, run_id: str) -> str:
    return f"{output.rstrip('/')}/_staging/run_id={run_id}"


def _spark_schema(arrow_schema: Any) -> Any:
    from pyspark.sql import types as T

    mapping = {"int64": T.LongType(), "int32": T.IntegerType(), "string": T.StringType()}
    fields = []
    for f in arrow_schema:
        kind = T.TimestampType() if str(f.type).startswith("timestamp") else mapping[str(f.type)]
        fields.append(T.StructField(f.name, kind, True))
    return T.StructType(fields)


def run_drain(spark: Any, url: str, catalog: Any, queue: str, transform: str | Callable | None, output: str, *,
              tasks: int = 2, batch_size: int = 100, lease_seconds: int | None = None,
              time_budget_seconds: float = 600.0, retry_after_seconds: int = 0, idle_seconds: float = 5.0,
              probe: str | None = None, probe_args: dict[str, Any] | None = None, keep_staging: bool = False,
              run_id: str | None = None, finalize_only: bool = False, force: bool = False) -> dict[str, Any]:
    """Drain `queue` with `tasks` consumers and finalise; return the summary (output path, counts,
    per task). run_id: go on with (or, with finalize_only, just finish) a run that was started before
    and died; its results, old and new, land in one output folder. When tasks fail, the run is
    finalised all the same (what was completed is written out) and the failure raised after.
    A new run is refused while another run's staging is under `output` (it died, or kept its
    staging): that run must be finalised first, or a consumer of this run could complete its expired
    leases and finalising it would then keep results this run also wrote. force: start all the same."""
    target = QueueTarget.of(url, catalog, queue)
    target.require_kind("work")
    if finalize_only and not run_id:
        raise PipelineError("finalize_only needs the run_id of the run to finish (logged when it started)")
    if not finalize_only:
        if transform is None:
            raise PipelineError("transform is missing: package.module:function")
        if not isinstance(transform, str):
            transform = f"{transform.__module__}:{transform.__qualname__}"
        load_callable(transform)          # fail on the driver, not in every task
    if probe:
        load_callable(probe)
    # The sweep takes a worker's leases back with one dequeue: no worker may hold more than the verbs' cap.
    if not 1 <= batch_size <= MAX_BATCH:
        raise PipelineError(f"drain {target.name}: batch_size must be between 1 and {MAX_BATCH}, got {batch_size}")
    if tasks < 1:
        raise PipelineError(f"tasks must be at least 1, got {tasks}")
    if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
        raise PipelineError("spark.speculation is on: a speculative copy of a drain task would be a second "
                            "consumer of the same batch; run the drain job with spark.speculation=false")
    # The tasks stage through Arrow and the finalisation reads the staged rows back through Spark:
    # one location for both (arrow_location), refused before anything is leased if Spark would glob
    # the name (literal_path).
    output = arrow_location(spark, output, f"drain {target.name}: output")
    resuming = run_id is not None
    unfinished = [name for name in _staged_runs(output) if name != run_id]
    if not resuming and unfinished and not force:
        raise PipelineError(f"drain {target.name}: {output} holds the staging of run(s) {', '.join(unfinished)}, "
                            f"not finalised: finish each with --run-id <id> --finalize-only first (a new run could "
                            f"complete their expired leases, and their finalisation would then keep results this "
                            f"run writes too), or pass --force")
    run_id = run_id or f"r{secrets.token_hex(6)}"
    staging = staging_path(output, run_id)
    if resuming and not _exists(staging) and _exists(f"{output.rstrip('/')}/results/run_id={run_id}"):
        raise PipelineError(f"drain {target.name}: run {run_id} is finished (its output is written and its staging "
                            f"removed): going on would overwrite that output; start a new run")
    started = time.monotonic()
    summary: dict[str, Any] = {"queue": target.name, "run_id": run_id, "tasks": [], "retried_tasks": []}
    failure: BaseException | None = None
    if not finalize_only:
        require_shared_storage(spark, staging)
        config = DrainConfig(run_id=run_id, launch=f"l{secrets.token_hex(3)}", staging=staging, transform=transform,
                             batch_size=batch_size, lease_seconds=lease_seconds,
                             time_budget_seconds=time_budget_seconds, retry_after_seconds=retry_after_seconds,
                             idle_seconds=idle_seconds, probe=probe, probe_args=dict(probe_args or {}))
        log().info("drain %s: run %s (launch %s) with %s tasks, batches of %s, time budget %ss", target.describe(),
                   run_id, config.launch, tasks, batch_size, time_budget_seconds)
        write_launch(staging, config.launch, batch_size)
        try:
            summary["tasks"] = _run_tasks(spark, target, config, tasks)
        except Exception as exc:  # noqa: BLE001 - finalised below, raised after
            failure = exc
            log().error("drain %s: run %s: the tasks failed (%s); finalising what they completed", target.name,
                        run_id, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        summary["retried_tasks"] = [c["partition"] for c in summary["tasks"] if c["attempt"] > 0]
    summary.update(finalize_drain(spark, target, output, run_id))
    summary["seconds"] = elapsed_since(started)
    if failure is None and not keep_staging:
        remove_tree(staging)
    else:
        summary["staging"] = staging
    line = (f"drain {target.name}: run {run_id}: {summary['completed']} completed (one output row each, "
            f"{summary['output']}), {summary['dead']} dead, {summary['retrying']} retries, "
            f"{summary['lease_lost']} leases lost, {summary['swept']} taken back from the run's workers, "
            f"{len(summary['retried_tasks'])} task(s) retried by Spark ({summary['seconds']:.1f}s)")
    log().info(line)
    if failure is not None:
        raise PipelineError(f"drain {target.name}: run {run_id} failed after writing its {summary['completed']} "
                            f"completed result(s) to {summary['output']}; start it again with --run-id {run_id} "
                            f"to go on (its staging stays in {staging})") from failure
    return summary


def _run_tasks(spark: Any, target: QueueTarget, config: DrainConfig, tasks: int) -> list[dict[str, Any]]:
    """The consumers as one Spark job over `tasks` partitions (DataFrame API only, no RDD)."""
    import pyarrow as pa

    def consume(batches: Iterator[Any]) -> Iterator[Any]:
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"counts": [json.dumps(drain_partition(target, config))]})

    with job_description(spark, f"drain {target.name}: run {config.run_id}, {tasks} consumers"), \
            progress_monitor(spark, f"drain {target.name}"):
        rows = spark.range(0, tasks, 1, tasks).mapInArrow(consume, "counts string").collect()
    return sorted((json.loads(row["counts"]) for row in rows), key=lambda c: c["partition"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipelines.drain_job", description=__doc__.splitlines()[0])
    add_queue_arguments(parser, "a queue of kind work")
    parser.add_argument("--transform", help="package.module:function")
    parser.add_argument("--output", help="folder shared by driver and executors")
    parser.add_argument("--tasks", type=int, default=2, help="consumers (Spark tasks)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--lease-seconds", type=int, help="default: the queue's lease_seconds")
    parser.add_argument("--time-budget", type=float, default=600.0, help="seconds; then tasks stop leasing")
    parser.add_argument("--idle-seconds", type=float, default=5.0,
                        help="a task stops when nothing is ready for this long")
    parser.add_argument("--retry-after", type=int, default=0, help="retry_after_seconds passed to fail")
    parser.add_argument("--run-id", help="go on with the run of this id (logged when it started)")
    parser.add_argument("--finalize-only", action="store_true",
                        help="with --run-id: take back the run's leases and write its output, lease nothing")
    parser.add_argument("--keep-staging", action="store_true")
    parser.add_argument("--force", action="store_true",
                        help="start a new run although another run's staging (not finalised) is under --output")
    parser.add_argument("--master", help="Spark master when run with python (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    def run(spark: Any, args: Any, url: str) -> dict:
        return run_drain(spark, url, args.catalog, args.queue, args.transform, args.output, tasks=args.tasks,
                         batch_size=args.batch_size, lease_seconds=args.lease_seconds,
                         time_budget_seconds=args.time_budget, retry_after_seconds=args.retry_after,
                         idle_seconds=args.idle_seconds, keep_staging=args.keep_staging, run_id=args.run_id,
                         finalize_only=args.finalize_only, force=args.force)
    return job_main("tablequeue-drain", build_parser(), argv,
                    lambda args: ("catalog", "queue", "output") + (() if args.finalize_only else ("transform",)),
                    run)[0]


if __name__ == "__main__":
    sys.exit(main())
