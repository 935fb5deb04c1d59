"""Drain a `work` queue with N Spark tasks as consumers; results to Parquet, one row per message.

Each task is one consumer (worker name from the Spark application, the run and the partition). It
leases a batch, applies the transform to each payload, fails the messages whose transform raised,
writes the others' results to a staging file, completes them in one transaction and then records
what complete() returned in a marker file. It stops when the queue is drained or the time budget
ends. When every task is done, the driver keeps the staged results that were completed (by marker,
or confirmed in the history table), one per message id, and writes them to
<output>/results/run_id=<run>/. docs/pipelines.md has the exactly-once argument.

    python -m pipelines.drain_job --url postgresql://... --catalog database/queues.yml --queue emails \
        --transform pipelines.transforms:uppercase_name --output /data/emails-out --tasks 4
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

from pipelines.common import (PipelineError, QueueTarget, build_session, canonical_json,  # noqa: E402
                              elapsed_since, filesystem, load_callable, log, progress_monitor,
                              remove_tree, transaction)

ERROR_TEXT_LIMIT = 4000
OUTPUT_COLUMNS = ("id", "result", "enqueued_at", "attempts", "worker", "processed_at")


@dataclass(frozen=True)
class DrainConfig:
    """What every task of one drain run needs; pickled to the executors."""
    run_id: str
    worker_prefix: str
    staging: str
    transform: str
    batch_size: int = 100
    lease_seconds: int | None = None
    time_budget_seconds: float = 600.0
    retry_after_seconds: int = 0
    wait_for_retries: bool = True
    poll_seconds: float = 1.0
    log_every_batches: int = 10
    probe: str | None = None
    probe_args: dict[str, Any] = field(default_factory=dict)

    def worker(self, partition: int) -> str:
        return f"{self.worker_prefix}-p{partition}"


# -- staging files (executor side) -------------------------------------------------------------------
def _schemas(client_ids: bool) -> tuple[Any, Any]:
    import pyarrow as pa

    id_type = pa.string() if client_ids else pa.int64()
    results = pa.schema([("id", id_type), ("result", pa.string()),
                         ("enqueued_at", pa.timestamp("us", tz="UTC")), ("attempts", pa.int32()),
                         ("worker", pa.string()), ("processed_at", pa.timestamp("us", tz="UTC")),
                         ("batch", pa.int32())])
    markers = pa.schema([("id", id_type), ("outcome", pa.string()), ("batch", pa.int32())])
    return results, markers


STAGING_KINDS = ("results", "markers")


class TaskStaging:
    """One task attempt's staging folders, made before its first lease together with the other
    one-time costs (the Parquet writer's import, the filesystem: on an object store a region and
    credential lookup). On a loaded executor they take seconds to tens of seconds, and a first batch
    that paid them could outlive its lease and be processed twice."""

    def __init__(self, root: str, partition: int, attempt: int) -> None:
        import pyarrow.parquet  # noqa: F401

        self.fs, base = filesystem(root)
        self.folders = {kind: f"{base}/{kind}/part={partition}/attempt={attempt}" for kind in STAGING_KINDS}
        for folder in self.folders.values():
            self.fs.create_dir(folder, recursive=True)

    def write(self, kind: str, rows: list[dict], schema: Any, batch: int) -> None:
        """Write a Parquet file under a temporary name (ignored by Spark readers: leading '_'), then
        rename it: a reader sees the whole file or nothing."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = self.folders[kind]
        final = f"{folder}/batch-{batch:06d}.parquet"
        temporary = f"{folder}/_tmp-batch-{batch:06d}-{secrets.token_hex(4)}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), temporary, filesystem=self.fs)
        self.fs.move(temporary, final)


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


def _key(value: Any) -> Any:
    """Message ids as the output stores them: bigint as is, client-supplied GUIDs as text."""
    return str(value) if isinstance(value, uuid.UUID) else value


def _takes_message(function: Callable) -> bool:
    try:
        parameters = [p for p in inspect.signature(function).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return False
    return len(parameters) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def drain_partition(target: QueueTarget, config: DrainConfig) -> dict[str, Any]:
    """Run on an executor: one consumer until the queue is drained or the time budget ends."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    worker = config.worker(partition)
    transform = load_callable(config.transform)
    with_message = _takes_message(transform)
    probe = load_callable(config.probe) if config.probe else None
    results_schema, markers_schema = _schemas(bool(target.queue.options.get("client_ids")))
    started = time.monotonic()
    deadline = started + config.time_budget_seconds
    counts = {"partition": partition, "attempt": attempt, "worker": worker, "batches": 0, "leased": 0,
              "completed": 0, "lease_lost": 0, "retrying": 0, "dead": 0, "stopped": "time budget"}

    def fire(event: str, batch: int, completed_in_batch: int = 0) -> None:
        if probe is not None:
            probe(event, {"partition": partition, "attempt": attempt, "batch": batch, "worker": worker,
                          "completed_in_batch": completed_in_batch}, **config.probe_args)

    log().info("drain %s: task %s attempt %s starts as worker %s", target.name, partition, attempt, worker)
    staging = TaskStaging(config.staging, partition, attempt)
    with target.client() as client:
        batch = 0
        while time.monotonic() < deadline:
            messages = client.dequeue(config.batch_size, worker=worker, lease_seconds=config.lease_seconds)
            if not messages:
                if config.wait_for_retries and _more_to_come(client):
                    time.sleep(config.poll_seconds)
                    continue
                counts["stopped"] = "drained"
                break
            batch += 1
            counts["batches"] += 1
            counts["leased"] += len(messages)
            leases = {_key(m["id"]): m for m in messages}
            lease_seconds = config.lease_seconds or target.queue.options["lease_seconds"]
            renewed_at = time.monotonic()
            staged: list[dict[str, Any]] = []
            outcomes: list[dict[str, Any]] = []
            for message in messages:
                if time.monotonic() - renewed_at > lease_seconds / 3:
                    # A slow transform must not let the batch's leases run out before they are
                    # completed: renew those still open (each by its token) at a third of the lease.
                    settled = {o["id"] for o in outcomes}
                    for key, lease in leases.items():
                        if key not in settled:
                            client.extend_lease(lease["id"], worker, lease_seconds, lease_token=lease["lease_token"])
                    renewed_at = time.monotonic()
                payload = _payload(target, message["payload"])
                try:
                    value = transform(payload, dict(message)) if with_message else transform(payload)
                    result = canonical_json(value)
                except Exception as exc:  # noqa: BLE001 - any error of the transform fails the message
                    outcome = client.fail(message["id"], worker, _error_text(exc), config.retry_after_seconds,
                                          lease_token=message["lease_token"])
                    # retrying | dead | lost (the lease had expired: another worker may have it)
                    outcome = outcome if outcome in ("retrying", "dead") else "lease_lost"
                    outcomes.append({"id": _key(message["id"]), "outcome": outcome, "batch": batch})
                    counts[outcome] += 1
                    continue
                staged.append({"id": _key(message["id"]), "result": result,
                               "enqueued_at": _aware(message.get("enqueued_at")),
                               "attempts": message.get("attempts"), "worker": worker,
                               "processed_at": datetime.now(timezone.utc), "batch": batch})
            if staged:
                # 1. results are durable before any of them is completed ...
                staging.write("results", staged, results_schema, batch)
                fire("staged", batch)
                # 2. ... the batch's completes commit together (one statement, each fenced by its
                # lease token: a crash rolls them all back) ...
                with transaction(client):
                    answer = client.complete_batch([leases[row["id"]] for row in staged], worker)
                    completed = {_key(row["id"]): bool(row["completed"]) for row in answer}
                    for row in staged:
                        outcomes.append({"id": row["id"], "outcome": "completed" if completed[row["id"]] else "lease_lost",
                                         "batch": batch})
                    fire("completed", batch, len(staged))
                fire("committed", batch)
            # 3. ... and what complete() returned is recorded; the driver keeps only completed results.
            staging.write("markers", outcomes, markers_schema, batch)
            fire("marked", batch)
            for outcome in outcomes[len(outcomes) - len(staged):]:
                counts[outcome["outcome"]] += 1
            if batch % config.log_every_batches == 0:
                log().info("drain %s: task %s attempt %s: %s batches, %s leased, %s completed, %s retrying, "
                           "%s dead, %s leases lost", target.name, partition, attempt, counts["batches"],
                           counts["leased"], counts["completed"], counts["retrying"], counts["dead"],
                           counts["lease_lost"])
    counts["seconds"] = elapsed_since(started)
    log().info("drain %s: task %s attempt %s %s after %.1fs: %s leased, %s completed, %s retrying, %s dead, "
               "%s leases lost", target.name, partition, attempt, counts["stopped"], counts["seconds"],
               counts["leased"], counts["completed"], counts["retrying"], counts["dead"], counts["lease_lost"])
    return counts


def _more_to_come(client: Any) -> bool:
    """Is anything delayed (a retry after retry_after_seconds) or leased (another consumer's batch,
    or a crashed one's, which comes back when its lease ends)? stats is an admin verb: without the
    right to call it, a consumer stops at the first empty dequeue."""
    try:
        stats = client.stats()
    except Exception as exc:  # noqa: BLE001
        log().warning("stats unavailable (%s): stopping at the first empty dequeue", _error_text(exc))
        return False
    return bool((stats.get("ready") or 0) + (stats.get("delayed") or 0) + (stats.get("in_flight") or 0))


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


def confirm_completed(target: QueueTarget, ids: list[Any], worker_prefix: str) -> set[Any] | None:
    """Of these message ids, those the history table shows completed by one of this run's workers;
    None when the queue keeps no history (then nothing can be confirmed)."""
    if not target.queue.options.get("history"):
        return None
    confirmed: set[Any] = set()
    table = target.table("_history")
    with target.client() as client:
        for start in range(0, len(ids), 1000):
            chunk = ids[start:start + 1000]
            if target.dialect == "postgres":
                cast = "uuid[]" if target.queue.options.get("client_ids") else "bigint[]"
                rows = client.conn.execute(
                    f"SELECT h.id FROM {table} AS h WHERE h.id = ANY(%s::{cast}) AND h.worker LIKE %s",
                    (chunk, worker_prefix + "-p%")).fetchall()
            else:
                cursor = client.conn.cursor()
                marks = ", ".join("?" for _ in chunk)
                cursor.execute(f"SELECT h.id FROM {table} AS h WHERE h.id IN ({marks}) AND h.worker LIKE ?",
                               *chunk, worker_prefix + "-p%")
                rows = cursor.fetchall()
                cursor.close()
            confirmed.update(row[0] for row in rows)
    return confirmed


def finalize_drain(spark: Any, target: QueueTarget, output: str, run_id: str, worker_prefix: str,
                   staging: str) -> dict[str, Any]:
    """Staged results -> <output>/results/run_id=<run_id>: completed ones only, one row per id.

    Re-runnable: it reads only the staging folder and the history table, and overwrites its folder.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    final_path = f"{output.rstrip('/')}/results/run_id={run_id}"
    results_dir, markers_dir = f"{staging}/results", f"{staging}/markers"
    summary: dict[str, Any] = {"output": final_path, "staged_rows": 0, "completed": 0, "unconfirmed": 0,
                               "confirmed_from_history": 0, "dead": 0, "retrying": 0, "lease_lost": 0}
    markers = spark.read.parquet(markers_dir).cache() if _has_staged_files(markers_dir) else None
    if markers is not None:
        for row in markers.groupBy("outcome").agg(F.count("*").alias("n")).collect():
            if row["outcome"] in ("dead", "retrying", "lease_lost"):
                summary[row["outcome"]] = row["n"]
    if not _has_staged_files(results_dir):
        results_schema, _ = _schemas(bool(target.queue.options.get("client_ids")))
        empty = spark.createDataFrame([], _spark_schema(results_schema)).select(*OUTPUT_COLUMNS)
        empty.write.mode("overwrite").parquet(final_path)
        return summary
    staged = spark.read.parquet(results_dir).cache()
    summary["staged_rows"] = staged.count()
    keys = ["id", "part", "attempt", "batch"]
    if markers is not None:
        completed = (markers.filter(F.col("outcome") == "completed").select(*keys)
                     .withColumn("marked", F.lit(True)))
    else:
        completed = staged.select(*keys).limit(0).withColumn("marked", F.lit(True))
    joined = staged.join(completed, keys, "left")
    marked_ids = completed.select("id").distinct()
    uncertain = [row["id"] for row in staged.select("id").distinct().join(marked_ids, "id", "left_anti").collect()]
    keep = F.col("marked")
    if uncertain:
        confirmed = confirm_completed(target, uncertain, worker_prefix)
        if confirmed is None:
            summary["unconfirmed"] = len(uncertain)
            log().warning("drain %s: %s staged result(s) have no completion marker and the queue keeps no "
                          "history to confirm them; they are left out of %s (see docs/pipelines.md)",
                          target.name, len(uncertain), final_path)
        else:
            summary["confirmed_from_history"] = len(confirmed)
            if confirmed:
                keep = keep | F.col("id").isin(sorted(confirmed))
    ranked = Window.partitionBy("id").orderBy(F.col("marked").desc_nulls_last(), "part", "attempt", "batch")
    final = (joined.filter(F.coalesce(keep, F.lit(False)))
             .withColumn("_rank", F.row_number().over(ranked))
             .filter(F.col("_rank") == 1)
             .select(*OUTPUT_COLUMNS))
    final.write.mode("overwrite").parquet(final_path)
    summary["completed"] = spark.read.parquet(final_path).count()
    staged.unpersist()
    if markers is not None:
        markers.unpersist()
    return summary


def _spark_schema(arrow_schema: Any) -> Any:
    from pyspark.sql import types as T

    mapping = {"int64": T.LongType(), "int32": T.IntegerType(), "string": T.StringType()}
    fields = []
    for f in arrow_schema:
        kind = T.TimestampType() if str(f.type).startswith("timestamp") else mapping[str(f.type)]
        fields.append(T.StructField(f.name, kind, True))
    return T.StructType(fields)


def run_drain(spark: Any, url: str, catalog: Any, queue: str, transform: str | Callable, output: str, *,
              tasks: int = 2, batch_size: int = 100, lease_seconds: int | None = None,
              time_budget_seconds: float = 600.0, retry_after_seconds: int = 0, wait_for_retries: bool = True,
              poll_seconds: float = 1.0, probe: str | None = None, probe_args: dict[str, Any] | None = None,
              keep_staging: bool = False) -> dict[str, Any]:
    """Drain `queue` with `tasks` consumers; return the summary (output path, counts, per task)."""
    target = QueueTarget.of(url, catalog, queue)
    target.require_kind("work")
    if not isinstance(transform, str):
        transform = f"{transform.__module__}:{transform.__qualname__}"
    load_callable(transform)          # fail on the driver, not in every task
    if probe:
        load_callable(probe)
    if not 1 <= batch_size <= 1000:
        raise PipelineError(f"batch_size must be between 1 and 1000, got {batch_size}")
    if tasks < 1:
        raise PipelineError(f"tasks must be at least 1, got {tasks}")
    context = spark.sparkContext
    if context.getConf().get("spark.speculation", "false").lower() == "true":
        raise PipelineError("spark.speculation is on: a speculative copy of a drain task would be a second "
                            "consumer under the same worker name (the work queue hands a worker's leased "
                            "messages back to it); run the drain job with spark.speculation=false")
    if tasks > context.defaultParallelism:
        log().warning("drain: %s tasks but %s cores: the extra tasks start only when others finish",
                      tasks, context.defaultParallelism)
    run_id = f"{context.applicationId}-{secrets.token_hex(4)}"
    staging = f"{output.rstrip('/')}/_staging/{run_id}"
    config = DrainConfig(run_id=run_id, worker_prefix=f"spark-{run_id}", staging=staging, transform=transform,
                         batch_size=batch_size, lease_seconds=lease_seconds,
                         time_budget_seconds=time_budget_seconds, retry_after_seconds=retry_after_seconds,
                         wait_for_retries=wait_for_retries, poll_seconds=poll_seconds, probe=probe,
                         probe_args=dict(probe_args or {}))
    started = time.monotonic()
    log().info("drain %s: run %s with %s tasks, batches of %s, time budget %ss", target.describe(), run_id,
               tasks, batch_size, time_budget_seconds)

    def task(_: int, __: Iterator[Any]) -> Iterator[dict[str, Any]]:
        yield drain_partition(target, config)

    with progress_monitor(spark, f"drain {target.name}"):
        per_task = sorted(context.parallelize(range(tasks), tasks).mapPartitionsWithIndex(task).collect(),
                          key=lambda c: c["partition"])
    summary: dict[str, Any] = {"queue": target.name, "run_id": run_id, "worker_prefix": config.worker_prefix}
    summary.update(finalize_drain(spark, target, output, run_id, config.worker_prefix, staging))
    summary["tasks"] = per_task
    summary["retried_tasks"] = [c["partition"] for c in per_task if c["attempt"] > 0]
    summary["seconds"] = elapsed_since(started)
    with target.client() as client:
        try:
            summary["queue_after"] = {k: v for k, v in client.stats().items()}
        except Exception as exc:  # noqa: BLE001 - stats is an admin verb; the summary does without it
            summary["queue_after"] = {"error": str(exc).splitlines()[0]}
    if not keep_staging:
        remove_tree(staging)
    else:
        summary["staging"] = staging
    line = (f"drain {target.name}: {summary['completed']} completed (one output row each, {summary['output']}), "
            f"{summary['dead']} dead, {summary['retrying']} retries, {summary['lease_lost']} leases lost, "
            f"{len(summary['retried_tasks'])} task(s) retried by Spark ({summary['seconds']:.1f}s)")
    if summary["unconfirmed"]:
        line += f"; {summary['unconfirmed']} result(s) unconfirmed and left out"
    log().info(line)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipelines.drain_job", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="postgresql://... or mssql+pyodbc://...")
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--queue", required=True, help="a queue of kind work")
    parser.add_argument("--transform", required=True, help="package.module:function")
    parser.add_argument("--output", required=True, help="folder shared by driver and executors")
    parser.add_argument("--tasks", type=int, default=2, help="consumers (Spark tasks)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--lease-seconds", type=int, help="default: the queue's lease_seconds")
    parser.add_argument("--time-budget", type=float, default=600.0, help="seconds; then tasks stop leasing")
    parser.add_argument("--retry-after", type=int, default=0, help="retry_after_seconds passed to fail")
    parser.add_argument("--no-wait", action="store_true",
                        help="stop at the first empty dequeue, even while retries are delayed")
    parser.add_argument("--keep-staging", action="store_true")
    parser.add_argument("--master", help="Spark master when run with python (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spark = build_session("tablequeue-drain", master=args.master)
    try:
        summary = run_drain(spark, args.url, args.catalog, args.queue, args.transform, args.output,
                            tasks=args.tasks, batch_size=args.batch_size, lease_seconds=args.lease_seconds,
                            time_budget_seconds=args.time_budget, retry_after_seconds=args.retry_after,
                            wait_for_retries=not args.no_wait, keep_staging=args.keep_staging)
    except PipelineError as exc:
        print(f"drain_job: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    for task in summary["tasks"]:
        print(json.dumps(task, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
