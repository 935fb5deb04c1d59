"""A work queue drained by a streaming query: the stream reader (ack=sink), a handler, and a sink
that writes each micro-batch's results before it completes or fails their messages.

    stream = spark.readStream.format("tablequeue").options(**source).load()    # source holds ack=sink
    results = handle(stream, "pipelines.transforms:uppercase_name", payload_type="json")
    sink = AckSink("hdfs:///out/emails", source, checkpoint="hdfs:///chk/emails")
    results.writeStream.foreachBatch(sink).option("checkpointLocation", "hdfs:///chk/emails").start()

The stream's rows carry (id, lease_token, worker) from the reader and an `error` column (NULL when
the handler succeeded). AckSink, for micro-batch N:
1. unless <output>/batch_id=N/_tablequeue_written exists, writes the micro-batch (every column) to
   <output>/batch_id=N (overwrite: a folder without the marker was never acknowledged from), then
   writes the marker;
2. reads back (id, lease_token, worker, error) from that folder, and each task acknowledges its rows
   by worker: complete_batch for rows without an error, fail_batch for rows with one (the queue
   retries them, or moves them to the dead letters at max_attempts). Both are fenced by the lease
   token: an acknowledgement repeated after a restart answers lost and changes nothing.

The acknowledgement comes from what was written, never from a recomputation: a micro-batch replayed
from the checkpoint after a crash between 1 and 2 is not written again (the replay would hold only the
messages still leased, and a handler may answer differently the second time); its stored rows are
acknowledged again. See docs/pipelines.md, "Failing messages from a stream".

    TABLEQUEUE_URL=postgresql://... python -m pipelines.stream_job --catalog database/queues.yml \\
        --queue emails --handler pipelines.transforms:uppercase_name --output out/emails \\
        --checkpoint out/emails-checkpoint
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

if __package__ in (None, ""):  # `spark-submit pipelines/stream_job.py` without --py-files
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.common import (PipelineError, QueueTarget, Reconnecting, add_queue_arguments, elapsed_since,  # noqa: E402
                              job_description, job_main, load_callable, log, require_shared_storage,
                              with_retries)
from pipelines.drain_job import _takes_message as takes_message  # noqa: E402
from pipelines.sources import FORMAT, MAX_BATCH, SourceOptions, target_options  # noqa: E402

ACK_COLUMNS = ("id", "lease_token", "worker", "error")
WRITTEN = "_tablequeue_written"      # Spark's readers skip names starting with "_"
ERROR_TEXT_LIMIT = 2000
# Lower bounds, not a ledger (see docs/pipelines.md): "lost" is an answer of the first try of a call,
# "uncertain" one of a call tried again after a transient error (the earlier try may have committed).
COUNTS = ("completed", "retrying", "dead", "lost", "uncertain")


# -- the handler ----------------------------------------------------------------------------------
def handle(stream: Any, handler: str | Callable, *, payload_type: str = "json") -> Any:
    """stream (the reader's rows) + `result` (JSON text of what the handler returned) and `error`
    (the exception's type and text, NULL when it returned). The handler takes the payload (a dict for
    json queues, str for text, bytes for binary) and optionally the message (id, enqueued_at,
    attempts) as a second argument, like the drain job's transforms."""
    from pyspark.sql import functions as F

    dotted = handler if isinstance(handler, str) else f"{handler.__module__}:{handler.__qualname__}"
    with_message = takes_message(load_callable(dotted))      # fails on the driver, not in every task

    loaded: list[Callable] = []          # per task's copy of the function: imported once, not per row

    @F.udf("struct<result:string,error:string>")
    def run(payload: Any, message_id: Any, enqueued_at: Any, attempts: Any) -> tuple:
        if not loaded:
            loaded.append(load_callable(dotted))
        message = {"id": message_id, "enqueued_at": enqueued_at, "attempts": attempts} if with_message else None
        return handle_row(loaded[0], payload, message, payload_type)

    outcome = run(F.col("payload"), F.col("id"), F.col("enqueued_at"), F.col("attempts"))
    return stream.withColumn("_outcome", outcome).select(
        *[c for c in stream.columns], F.col("_outcome.result").alias("result"), F.col("_outcome.error").alias("error"))


def handle_row(function: Callable, payload: Any, message: Mapping[str, Any] | None, payload_type: str) -> tuple:
    """(result, error) of one row: the payload decoded (json queues), the handler's answer, its JSON
    text. An error in any of the three (a payload that is not JSON, a handler's exception, an answer
    JSON cannot hold) is this row's error: the message is failed, the micro-batch goes on. Only a
    crash or hang of the Python worker itself fails the task, and then the micro-batch: see
    docs/pipelines.md, "Failing messages from a stream"."""
    try:
        value = json.loads(payload) if payload_type == "json" and isinstance(payload, str) else payload
        returned = function(value) if message is None else function(value, message)
        return json.dumps(returned, sort_keys=True, default=str), None
    except Exception as exc:  # noqa: BLE001 - any error of this row fails its message
        text = f"{type(exc).__name__}: {exc}"
        return None, text if len(text) <= ERROR_TEXT_LIMIT else text[:ERROR_TEXT_LIMIT - 3] + "..."


# -- the sink -------------------------------------------------------------------------------------
def acknowledge_partition(target: QueueTarget, retry_after_seconds: int | None,
                          batches: Iterator[Any]) -> Iterator[Any]:
    """Run in a task (mapInArrow): acknowledge the stored rows of this partition, by worker, in
    calls of at most 1,000; yield one row of counts."""
    import pyarrow as pa

    by_worker: dict[str, list[dict]] = defaultdict(list)
    for batch in batches:
        for row in batch.to_pylist():
            by_worker[row["worker"]].append(row)
    counts = dict.fromkeys(COUNTS, 0)
    connection = Reconnecting(target)
    try:
        for worker, rows in by_worker.items():
            done = [r for r in rows if r["error"] is None]
            failed: dict[str, list[dict]] = defaultdict(list)
            for row in rows:
                if row["error"] is not None:
                    failed[row["error"]].append(row)
            for start in range(0, len(done), MAX_BATCH):
                chunk = done[start:start + MAX_BATCH]
                answer, retried = _acknowledged(connection, f"complete {target.name}",
                                                lambda client: client.complete_batch(chunk, worker))
                completed = sum(1 for r in answer if r["completed"])
                counts["completed"] += completed
                counts["uncertain" if retried else "lost"] += len(answer) - completed
            for error, group in failed.items():
                for start in range(0, len(group), MAX_BATCH):
                    chunk = group[start:start + MAX_BATCH]
                    answer, retried = _acknowledged(connection, f"fail {target.name}", lambda client: client.fail_batch(
                        chunk, worker, error, retry_after_seconds))
                    for r in answer:
                        counts["uncertain" if retried and r["outcome"] == "lost" else r["outcome"]] += 1
    finally:
        connection.close()
    yield pa.RecordBatch.from_pylist([counts], schema=pa.schema([(c, pa.int64()) for c in COUNTS]))


def _acknowledged(connection: Reconnecting, what: str, call: Callable[[Any], list[dict]]) -> tuple[list[dict], bool]:
    """(answer, whether the call was tried again) of a fenced batch call, again after a transient
    error on a new connection. A repeat of a call that committed before its connection dropped answers
    lost for its messages: they were acknowledged, by the first try, so lost is uncertain then."""
    tries: list[int] = []

    def again() -> None:
        tries.append(1)
        connection.reset()
    answer = with_retries(what, lambda: call(connection.client()), 8, on_retry=again)
    return answer, bool(tries)


class HadoopFiles:
    """The sink's small files (markers, the checkpoint's metadata, the listing of batch folders)
    through Spark's own Hadoop FileSystem on the driver (JVM), so that they go where Spark writes the
    Parquet: the same spark.hadoop.fs.* settings (s3a credentials, endpoints) and schemes (abfss,
    gs, dbfs) as the micro-batch's rows. Not for Spark Connect (no JVM on the client)."""

    def __init__(self, spark: Any) -> None:
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _at(self, path: str) -> tuple[Any, Any]:
        where = self.jvm.org.apache.hadoop.fs.Path(path)
        return where, where.getFileSystem(self.conf)

    def is_file(self, path: str) -> bool:
        where, fs = self._at(path)
        return bool(fs.exists(where) and fs.getFileStatus(where).isFile())

    def read_text(self, path: str) -> str:
        where, fs = self._at(path)
        stream = fs.open(where)
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def create_new(self, path: str, data: bytes) -> bool:
        """Write a file that must not exist yet (create(path, overwrite=false)); False if it does."""
        from py4j.protocol import Py4JJavaError

        where, fs = self._at(path)
        try:
            stream = fs.create(where, False)
        except Py4JJavaError as exc:
            if "FileAlreadyExistsException" in str(exc.java_exception.getClass().getName()) or fs.exists(where):
                return False
            raise
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
        return True

    def folders(self, path: str) -> list[str]:
        where, fs = self._at(path)
        if not fs.exists(where):
            return []
        return sorted(status.getPath().getName() for status in fs.listStatus(where) if status.isDirectory())


class AckSink:
    """foreachBatch(AckSink(output, options, checkpoint=...)): options name the queue as the reader's
    do (catalog and queue, or queueSpec; urlFile or url, else $TABLEQUEUE_URL); checkpoint is the
    query's checkpointLocation (its id marks each written micro-batch). retry_after_seconds: the failed
    messages' delay (default the queue's). Counts of every micro-batch are added up in `counts`: lower
    bounds for progress logs, not a ledger (a task retried by Spark, or a replayed micro-batch, counts
    its messages again as lost; a call tried again after its connection dropped counts as uncertain
    what its first try may have acknowledged). Count outcomes from the queue's history and dead tables."""

    def __init__(self, output: str, options: Mapping[str, str], *, checkpoint: str,
                 retry_after_seconds: int | None = None) -> None:
        source = SourceOptions.of(options)
        self.target = source.target
        self.target.require_kind("work")
        ack = (source.options.get("ack") or "commit").lower()
        if ack != "sink":
            raise PipelineError(f"stream {self.target.name}: AckSink needs the reader's options with ack=sink, got "
                                f"ack={ack}: with ack=commit the reader completes every message the micro-batch "
                                f"read, also those the sink never saw, without a result")
        self.output = output.rstrip("/")
        self.checkpoint = checkpoint.rstrip("/")
        self.retry_after_seconds = retry_after_seconds
        self.counts = dict.fromkeys(COUNTS, 0)
        self._storage_checked = False
        self._query: str | None = None
        self._files: HadoopFiles | None = None

    def query_id(self) -> str:
        """The streaming query's id, from <checkpoint>/metadata: Spark writes it when the query first
        starts and keeps it across restarts from that checkpoint; a new checkpoint is a new query."""
        if self._query is None:
            from py4j.protocol import Py4JJavaError

            try:
                metadata = self._files.read_text(f"{self.checkpoint}/metadata")
                self._query = str(json.loads(metadata.splitlines()[0])["id"])
            except (Py4JJavaError, ValueError, KeyError, IndexError) as exc:
                raise PipelineError(f"stream {self.target.name}: cannot read the query's id from "
                                    f"{self.checkpoint}/metadata ({exc}): pass AckSink the checkpointLocation "
                                    f"of the query it is the sink of") from exc
        return self._query

    def folder(self, batch_id: int) -> str:
        return f"{self.output}/batch_id={batch_id}"

    def __call__(self, frame: Any, batch_id: int) -> None:
        missing = [c for c in ACK_COLUMNS if c not in frame.columns]
        if missing:
            raise PipelineError(f"stream {self.target.name}: the sink acknowledges each row by {', '.join(ACK_COLUMNS)} "
                                f"(error NULL: completed, else failed); the stream lacks {missing}: keep the "
                                f"reader's id, lease_token and worker, and add error (handle() does)")
        if not self._storage_checked:
            require_shared_storage(frame.sparkSession, self.output)
            self._storage_checked = True
        self._files = HadoopFiles(frame.sparkSession)
        with job_description(frame.sparkSession, f"stream {self.target.name}: micro-batch {batch_id}"):
            replay = self.written(batch_id)
            if replay:
                log().info("stream %s: micro-batch %s was written before (a replay): acknowledging its stored "
                           "rows again", self.target.name, batch_id)
            else:
                self.write(frame, batch_id)
            counts = self.acknowledge(frame.sparkSession, batch_id)
        for name in COUNTS:
            self.counts[name] += counts[name]
        if not replay and counts["lost"]:
            # A first acknowledgement of a fresh write found leases no longer held (run out): those
            # messages come again in a later micro-batch with a second result row.
            log().warning("stream %s: micro-batch %s: %s message(s) written but no longer held (the lease ran "
                          "out before the acknowledgement): a second result row follows; dedupe on id",
                          self.target.name, batch_id, counts["lost"])
        log().info("stream %s: micro-batch %s: %s completed, %s retrying, %s dead, %s no longer held, %s uncertain "
                   "(after a retried call)",
                   self.target.name, batch_id, *(counts[c] for c in COUNTS))

    def written(self, batch_id: int) -> bool:
        """Whether this query wrote micro-batch batch_id before (its marker exists). A marker of
        another query (an earlier checkpoint) is refused: its stored rows hold that query's leases,
        and this query's micro-batch would never be written."""
        marker = f"{self.folder(batch_id)}/{WRITTEN}"
        if not self._files.is_file(marker):
            return False
        text = self._files.read_text(marker)
        try:
            written_by = json.loads(text).get("query") if text.strip() else None
        except (ValueError, AttributeError):
            written_by = None
        if written_by != self.query_id():
            raise PipelineError(
                f"stream {self.target.name}: {self.folder(batch_id)} was written by another streaming query "
                f"({written_by or 'no query id'}), not by the query of checkpoint {self.checkpoint} "
                f"({self.query_id()}): a new checkpoint needs a new output folder (or keep the old checkpoint)")
        return True

    def write(self, frame: Any, batch_id: int) -> None:
        """The micro-batch's rows, then the marker naming the query and the micro-batch: a folder
        without it was never acknowledged from."""
        marker = json.dumps({"query": self.query_id(), "batch_id": batch_id}).encode("utf-8")
        frame.write.mode("overwrite").parquet(self.folder(batch_id))
        if not self._files.create_new(f"{self.folder(batch_id)}/{WRITTEN}", marker):
            # Created by someone else since written() said no: a second driver of this query.
            raise PipelineError(f"stream {self.target.name}: the marker of {self.folder(batch_id)} appeared while "
                                f"this driver wrote the micro-batch: another driver runs the query of checkpoint "
                                f"{self.checkpoint}; stop one of them")

    def acknowledge(self, spark: Any, batch_id: int) -> dict[str, int]:
        from functools import partial

        from pyspark.sql import functions as F

        stored = spark.read.parquet(self.folder(batch_id)).select(
            F.col("id"), F.col("lease_token"), F.col("worker"), F.col("error"))
        ack = partial(acknowledge_partition, self.target, self.retry_after_seconds)
        # One row of four counts per task comes back: one stage, no shuffle for the sum.
        per_task = stored.mapInArrow(ack, ", ".join(f"{c} long" for c in COUNTS)).collect()
        return {c: sum(int(row[c]) for row in per_task) for c in COUNTS}


def read_results(spark: Any, output: str) -> Any:
    """The rows of every acknowledged micro-batch under `output` (AckSink's folders): only the
    batch_id=N folders with a marker, with their batch_id column. spark.read.parquet(output) would
    also read a folder without one (a crash before the marker, a micro-batch being written, a
    non-atomic commit on object stores), whose rows were never acknowledged: a message's second
    result row. Rows with error NULL are the results."""
    files, root = HadoopFiles(spark), output.rstrip("/")
    marked = [name for name in files.folders(root)
              if name.startswith("batch_id=") and files.is_file(f"{root}/{name}/{WRITTEN}")]
    if not marked:
        raise PipelineError(f"{output}: no acknowledged micro-batch (batch_id=N folder with {WRITTEN}) to read")
    return spark.read.option("basePath", root).parquet(*[f"{root}/{name}" for name in marked])


# -- a whole run: until nothing is ready ------------------------------------------------------------
def run_stream(spark: Any, url: str, catalog: Any, queue: str, handler: str | Callable, output: str,
               checkpoint: str, *, partitions: int = 2, messages_per_partition: int = 500,
               lease_seconds: int | None = None, retry_after_seconds: int | None = None,
               url_file: str | None = None, time_budget_seconds: float | None = None) -> dict[str, Any]:
    """Drain `queue` with a streaming query until nothing is ready (processAllAvailable), or until
    time_budget_seconds have passed, then stop.
    Results: Parquet under `output`/batch_id=N (rows with error NULL are the results). Returns
    the sink's acknowledgement counts (completed, retrying, dead, lost, uncertain: lower bounds, see
    AckSink; the database's history and dead-letter tables are the record) and the output folder."""
    import os
    import tempfile

    target = QueueTarget.of(url, catalog, queue)
    target.require_kind("work")
    started = time.monotonic()
    folder = None
    if url_file is None:
        folder = tempfile.mkdtemp(prefix="tablequeue-stream-")     # mode 0700: the URL may hold a password
        url_file = os.path.join(folder, "url")
        with open(os.open(url_file, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="utf-8") as handle_:
            handle_.write(url)
    try:
        options = {**target_options(target, url_file), "partitions": str(partitions),
                   "messagesPerPartition": str(messages_per_partition), "ack": "sink", "idleWaitSeconds": "1"}
        if lease_seconds is not None:
            options["leaseSeconds"] = str(lease_seconds)
        stream = spark.readStream.format(FORMAT).options(**options).load()
        sink = AckSink(output, options, checkpoint=checkpoint, retry_after_seconds=retry_after_seconds)
        query = (handle(stream, handler, payload_type=target.queue.payload).writeStream.foreachBatch(sink)
                 .option("checkpointLocation", checkpoint).queryName(f"tablequeue {target.name}").start())
        budget = threading.Timer(time_budget_seconds, query.stop) if time_budget_seconds else None
        try:
            if budget is not None:
                budget.start()
            query.processAllAvailable()         # returns as well when the budget's timer stops the query
        finally:
            if budget is not None:
                budget.cancel()
            query.stop()
    finally:
        if folder is not None:
            os.unlink(url_file)
            os.rmdir(folder)
    summary = {"queue": target.name, **sink.counts, "output": output, "seconds": elapsed_since(started)}
    log().info("stream %s: %s completed, %s retrying, %s dead, %s no longer held, %s uncertain (%ss)", target.name,
               *(summary[c] for c in COUNTS), summary["seconds"])
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipelines.stream_job", description=__doc__.splitlines()[0])
    add_queue_arguments(parser, "a queue of kind work")
    parser.add_argument("--handler", help="package.module:function")
    parser.add_argument("--output", help="the results folder (shared storage on a cluster)")
    parser.add_argument("--checkpoint", help="the query's checkpoint folder (keep it between runs)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--messages-per-partition", type=int, default=500)
    parser.add_argument("--lease-seconds", type=int)
    parser.add_argument("--retry-after", type=int, help="seconds before a failed message is retried")
    parser.add_argument("--time-budget", type=float, help="stop after this many seconds even if messages are left")
    parser.add_argument("--master", help="Spark master when run with python (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    def run(spark: Any, args: Any, url: str) -> dict:
        return run_stream(spark, url, args.catalog, args.queue, args.handler, args.output, args.checkpoint,
                          partitions=args.partitions, messages_per_partition=args.messages_per_partition,
                          lease_seconds=args.lease_seconds, retry_after_seconds=args.retry_after,
                          url_file=args.url_file, time_budget_seconds=args.time_budget)
    return job_main("tablequeue-stream", build_parser(), argv,
                    ("catalog", "queue", "handler", "output", "checkpoint"), run)[0]


if __name__ == "__main__":
    sys.exit(main())
