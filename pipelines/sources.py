"""tablequeue as a Spark data source (PySpark 4's Python Data Source API: no RDD).

Writing, to any queue kind with `dedupe: true`:

    to_messages(df, key=["customer_id", "created_at"], max_connections=8) \\
        .write.format("tablequeue").mode("append") \\
        .option("catalog", "queues.yml").option("queue", "emails").option("urlFile", "/secrets/url").save()

to_messages builds each row's payload (JSON) and dedupe key (SHA-256) in the JVM, so that neither
depends on an executor's time zone, the column order or Python's view of the values; the writer sends
them with enqueue_batch, each batch its own transaction, retried after a jittered pause on transient
errors.

Reading a `work` queue as a stream, one micro-batch at a time:

    spark.readStream.format("tablequeue").option("catalog", ...).option("queue", "emails").load()

An offset is a set of leases: for micro-batch s and partition p the driver leases up to
messagesPerPartition messages under the worker name <consumer>-<run>-s<s>-p<p> (run: drawn for each new
checkpoint, pinned by its first offset) and records each lease's id and token in the offset (Spark writes it to the checkpoint
before the batch runs). The partition's
task asks for that worker's leases again (a worker's own live leases come back unchanged: the same
token, no attempt spent) and yields those whose token matches; commit() completes them with
complete_batch, fenced by the recorded tokens. docs/pipelines.md has the exactly-once argument.

With option ack=sink the sink acknowledges instead (pipelines.stream_job.AckSink: complete_batch for
rows without an error, fail_batch for rows with one, after their results are written), and commit()
fails, fenced, whatever the sink left unacknowledged: no message is completed without a result.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping, Sequence

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamReader, InputPartition,
                                    WriterCommitMessage)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from tablequeue.catalog import Queue
from tablequeue.client import MAX_WAIT_MS
from tablequeue.engines import parse_url

from pipelines.common import (MAX_BATCH, TASK_RETRIES, LeaseHeartbeat, PipelineError, QueueTarget, Reconnecting,
                              arrow_location, filesystem, load_callable, log, require_shared_storage, resolve_url,
                              with_retries)

FORMAT = "tablequeue"
MAX_DEDUPE_KEY = 200             # the templates' CHECK (length(dedupe_key) <= 200)
# What the writer takes: payload and dedupe_key always (to_messages makes them), the rest when given.
WRITER_COLUMNS = ("payload", "dedupe_key", "refused", "due_at", "priority", "group_key")
REFUSED_SAMPLES = 5


def register(spark: Any) -> None:
    """Make format("tablequeue") known to this session (build_session calls it)."""
    spark.dataSource.register(TableQueueSource)


# -- rows to messages, in the JVM -------------------------------------------------------------------
JSON_OPTIONS = {"timeZone": "UTC", "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
                "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS", "ignoreNullFields": "false"}


def _column(name: str) -> Any:
    """The column of that name, whatever characters it holds (a backtick is doubled inside the quotes)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _key_text(name: str, data_type: Any) -> Any:
    """One key column as text that names the instant or value, never the session's view of it nor
    its declared type: a timestamp as microseconds since the epoch (the autumn hour that repeats on
    a wall clock is two different numbers), a timestamp without zone as its zone-free text, a date
    as ISO text, binary as base64, a decimal without trailing zeros (1.5 is 1.5 at any scale), a
    negative zero as zero, a map as its entries sorted by key, other nested values as UTC JSON.
    Length-prefixed, so that no value can imitate a separator."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    column = _column(name)
    if isinstance(data_type, T.TimestampType):
        text = F.unix_micros(column).cast("string")
    elif isinstance(data_type, T.TimestampNTZType):
        text = column.cast("string")                  # no session time zone involved, unlike date_format
    elif isinstance(data_type, T.DateType):
        text = F.date_format(column, "yyyy-MM-dd")
    elif isinstance(data_type, T.BinaryType):
        text = F.base64(column)
    elif isinstance(data_type, T.DecimalType):
        text = F.regexp_replace(column.cast("string"), r"(\.[0-9]*[1-9])0+$|\.0+$", "$1")
    elif isinstance(data_type, (T.FloatType, T.DoubleType)):
        text = F.when(column == 0, F.lit(0).cast(data_type)).otherwise(column).cast("string")
    elif isinstance(data_type, T.MapType):
        by_key = F.array_sort(F.map_entries(column), lambda left, right: F.when(left["key"] < right["key"], -1)
                              .when(left["key"] > right["key"], 1).otherwise(0))
        text = F.to_json(by_key, JSON_OPTIONS)
    elif isinstance(data_type, (T.StructType, T.ArrayType)):
        text = F.to_json(column, JSON_OPTIONS)
    else:
        text = column.cast("string")
    return F.when(column.isNull(), F.lit(f"{name}:null")).otherwise(
        F.concat(F.lit(f"{name}="), F.length(text).cast("string"), F.lit(":"), text))


def _holds_float(data_type: Any) -> bool:
    from pyspark.sql import types as T

    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return True
    if isinstance(data_type, T.StructType):
        return any(_holds_float(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return _holds_float(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return _holds_float(data_type.keyType) or _holds_float(data_type.valueType)
    return False


def _non_finite(column: Any, data_type: Any) -> Any:
    """True when the value, or any float inside it (struct fields, array elements, map keys and
    values, at any depth), is NaN or an infinity; false or NULL otherwise."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return F.isnan(column) | column.isin(float("inf"), float("-inf"))
    if isinstance(data_type, T.StructType):
        checks = [_non_finite(column.getField(f.name), f.dataType) for f in data_type.fields if _holds_float(f.dataType)]
        result = checks[0]
        for check in checks[1:]:
            result = result | check
        return result
    if isinstance(data_type, T.ArrayType):
        return F.exists(column, _element_check(data_type.elementType))
    checks = [F.exists(entries, _element_check(kind))
              for entries, kind in ((F.map_keys(column), data_type.keyType), (F.map_values(column), data_type.valueType))
              if _holds_float(kind)]
    return checks[0] if len(checks) == 1 else checks[0] | checks[1]


def _element_check(data_type: Any) -> Any:
    """_non_finite as the one-argument function that higher-order functions (exists) take."""
    return lambda element: _non_finite(element, data_type)


def _refusals(fields: Sequence[Any]) -> Any:
    """A row's reasons to be refused (NaN or an infinity, also inside a struct, array or map: JSON
    has neither, and to_json would write them as strings), or NULL."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    checks = []
    for field in fields:
        if _holds_float(field.dataType):
            where = "is" if isinstance(field.dataType, (T.FloatType, T.DoubleType)) else "holds a value that is"
            bad = F.coalesce(_non_finite(_column(field.name), field.dataType), F.lit(False))
            checks.append(F.when(bad, F.lit(f"column {field.name} {where} NaN or infinite (JSON has neither)")))
    if not checks:
        return F.lit(None).cast("string")
    reasons = F.concat_ws("; ", *checks)
    return F.when(reasons != "", reasons)


def parse_columns(spec: str | Sequence[str] | Mapping[str, str] | None) -> dict[str, str] | None:
    """'a,b:new_b' or ['a', 'b:new_b'] or {'a': 'a', 'b': 'new_b'} -> {source: payload field}."""
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        mapping = dict(spec)
    else:
        items = spec.split(",") if isinstance(spec, str) else list(spec)
        mapping = {}
        for item in (i.strip() for i in items):
            if item:
                source, _, target = item.partition(":")
                mapping[source.strip()] = (target or source).strip()
    if not mapping:
        raise PipelineError("columns is empty: name at least one column (source or source:field)")
    targets = list(mapping.values())
    if len(set(targets)) != len(targets):
        raise PipelineError(f"columns maps two columns to the same payload field: {targets}")
    return mapping


def to_messages(frame: Any, key: Sequence[str] | str, *, columns: str | Sequence[str] | Mapping[str, str] | None = None,
                binary: bool = False, max_connections: int | None = None, ledger: str | None = None) -> Any:
    """frame -> (payload, dedupe_key, refused): what format("tablequeue") writes.

    key: the columns that identify a row (a name, a comma-separated list or a list); the dedupe key
      is the SHA-256 of their names and values (sorted by name: the frame's column order and the order
      they are named in do not matter), so schema drift in other columns changes no key.
    columns: the payload's fields (see parse_columns; default every column), as JSON with sorted
      field names, timestamps in UTC, null fields kept. binary: the payload as UTF-8 bytes.
    max_connections: coalesce to at most this many partitions (one connection each; no shuffle).
    ledger: a folder of keys written before (the writer's ledger option): rows whose key is in it
      are left out, so a re-run sends nothing that was sent, even after it was consumed. It is read
      once, here: it covers runs before this one, not a task that Spark retries within this job.
    """
    from pyspark.sql import functions as F

    keys = [k.strip() for k in (key.split(",") if isinstance(key, str) else key) if k.strip()]
    mapping = parse_columns(columns) or {c: c for c in frame.columns}
    missing = [c for c in dict.fromkeys(keys + list(mapping)) if c not in frame.columns]
    if not keys:
        raise PipelineError("key names no column: the dedupe key is made from explicit key columns")
    if missing:
        raise PipelineError(f"column(s) {missing} not in the dataset (columns: {frame.columns})")
    if max_connections is not None and max_connections < 1:
        raise PipelineError(f"max_connections must be at least 1, got {max_connections}")
    types = {f.name: f for f in frame.schema.fields}
    payload_fields = sorted(mapping.items(), key=lambda item: item[1])
    payload = F.to_json(F.struct(*[_column(source).alias(target) for source, target in payload_fields]),
                        JSON_OPTIONS)
    dedupe_key = F.sha2(F.concat_ws("\n", *[_key_text(k, types[k].dataType) for k in sorted(set(keys))]), 256)
    checked = [types[c] for c in dict.fromkeys(list(mapping) + keys)]
    messages = frame.select((F.encode(payload, "UTF-8") if binary else payload).alias("payload"),
                            dedupe_key.alias("dedupe_key"), _refusals(checked).alias("refused"))
    if ledger is not None:
        # Spark reads the ledger back below and the writer's tasks write it through Arrow: one
        # location for both (arrow_location); a name Spark would glob (ledger{a,b}) dedupes against
        # other folders (literal_path).
        ledger = arrow_location(frame.sparkSession, ledger, "ledger")
        # Executors write the ledger and the driver reads it here: a folder only each node sees
        # would be found empty, and every row sent again without a word.
        require_shared_storage(frame.sparkSession, ledger)
    if ledger is not None and ledger_exists(ledger):
        sent = frame.sparkSession.read.parquet(ledger).select("dedupe_key").distinct()
        messages = messages.join(sent, "dedupe_key", "left_anti").select("payload", "dedupe_key", "refused")
    if max_connections is not None:
        messages = messages.coalesce(max_connections)
    return messages


def ledger_exists(path: str) -> bool:
    from pyarrow import fs


    filesystem_, inner = filesystem(path)
    return any(info.type == fs.FileType.File and info.base_name.endswith(".parquet")
               for info in filesystem_.get_file_info(fs.FileSelector(inner, recursive=True, allow_not_found=True)))


# -- options ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceOptions:
    target: QueueTarget
    options: dict[str, str]

    @classmethod
    def of(cls, options: Mapping[str, str]) -> "SourceOptions":
        lowered = {k.lower(): v for k, v in options.items()}
        url = resolve_url(lowered.get("url"), lowered.get("urlfile"), given_as="option url")
        if lowered.get("queuespec"):
            # A queue already resolved from a catalog on the driver (target_options): the jobs pass
            # Catalog objects, which have no file to name.
            spec = json.loads(lowered["queuespec"])
            queue = Queue(spec["name"], spec["kind"], spec["payload"], spec["options"])
            return cls(QueueTarget(url, parse_url(url).dialect, spec["schema"], queue), lowered)
        for required in ("catalog", "queue"):
            if not lowered.get(required):
                raise PipelineError(f"format('{FORMAT}') needs option {required!r}")
        return cls(QueueTarget.of(url, lowered["catalog"], lowered["queue"]), lowered)


    def integer(self, name: str, default: int | None, low: int, high: int) -> int | None:
        raw = self.options.get(name.lower())
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise PipelineError(f"{self.target.name}: option {name} must be an integer from {low} to {high}, "
                                f"got {raw!r}")
        return value


def target_options(target: QueueTarget, url_file: str) -> dict[str, str]:
    """Options naming an already resolved queue (and a file holding the URL) for format('tablequeue')."""
    spec = {"schema": target.schema, "name": target.queue.name, "kind": target.queue.kind,
            "payload": target.queue.payload, "options": target.queue.options}
    return {"queueSpec": json.dumps(spec, default=str), "urlFile": url_file}


class TableQueueSource(DataSource):
    """format("tablequeue"): a batch writer for every kind, a stream reader for work queues."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        target = SourceOptions.of(self.options).target
        id_type = "string" if target.queue.options.get("client_ids") else "bigint"
        payload_type = "binary" if target.queue.payload == "binary" else "string"
        # lease_token only for the sink that acknowledges with it (ack=sink): with the default
        # ack=commit the schema stays what it was before ack=sink existed.
        sink = (SourceOptions.of(self.options).options.get("ack") or "commit").lower() == "sink"
        return (f"id {id_type}, payload {payload_type}, enqueued_at timestamp, attempts int, worker string"
                + (", lease_token string" if sink else ""))

    def writer(self, schema: Any, overwrite: bool) -> "QueueWriter":
        return QueueWriter(SourceOptions.of(self.options), schema, overwrite)

    def streamReader(self, schema: Any) -> "QueueStreamReader":
        return QueueStreamReader(SourceOptions.of(self.options))


# -- the writer ---------------------------------------------------------------------------------------
@dataclass
class WriteCounts(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int = 0
    enqueued: int = 0
    duplicates: int = 0
    refused: int = 0
    retries: int = 0
    refused_samples: tuple = ()


def require_dedupe(target: QueueTarget) -> None:
    if not target.queue.options.get("dedupe"):
        raise PipelineError(
            f"{target.name} has dedupe: false; format('{FORMAT}') needs dedupe: true, because Spark "
            f"re-runs failed tasks and only a dedupe key makes a re-sent row a duplicate instead of a "
            f"second message (set options: {{dedupe: true}} in the catalog; it changes the table, so "
            f"deploy it under a new queue name)")


class QueueWriter(DataSourceArrowWriter):
    """Runs write() in each task: one connection, batches of batchSize (default 1000) through
    enqueue_batch, each its own transaction; a transient error reconnects and sends the batch again
    (dedupe makes a batch that had committed come back as duplicates)."""

    def __init__(self, source: SourceOptions, schema: Any, overwrite: bool) -> None:
        target = source.target
        if overwrite:
            raise PipelineError(f"{target.name}: a queue is appended to; write with mode('append')")
        require_dedupe(target)
        names = [f.name for f in schema.fields]
        missing = [c for c in ("payload", "dedupe_key") if c not in names]
        unknown = [c for c in names if c not in WRITER_COLUMNS]
        if missing or unknown:
            raise PipelineError(f"{target.name}: format('{FORMAT}') writes the columns {', '.join(WRITER_COLUMNS[:2])} "
                                f"(and optionally {', '.join(WRITER_COLUMNS[2:])}); "
                                f"{'missing ' + str(missing) if missing else ''}"
                                f"{' ' if missing and unknown else ''}{'unknown ' + str(unknown) if unknown else ''}: "
                                f"build them with pipelines.sources.to_messages(df, key=[...])")
        self.target = target
        self.batch_size = source.integer("batchSize", MAX_BATCH, 1, MAX_BATCH)
        self.max_connections = source.integer("maxConnections", None, 1, 100_000)
        self.retries = source.integer("retries", 5, 0, 100)
        self.ledger = source.options.get("ledger")
        self.summary_file = source.options.get("summaryfile")
        self.probe = source.options.get("probe")
        self.probe_args = json.loads(source.options.get("probeargs", "{}"))

    def write(self, batches: Iterator[Any]) -> WriteCounts:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        if self.max_connections is not None and partition >= self.max_connections:
            raise PipelineError(f"{self.target.name}: partition {partition} of the input is beyond maxConnections="
                                f"{self.max_connections}: coalesce the input to at most that many partitions "
                                f"first (to_messages(..., max_connections=N) does); the tasks of lower partitions "
                                f"still write their rows, which a re-run sends again as duplicates")
        counts = WriteCounts(partition, attempt)
        on_batch = load_callable(self.probe) if self.probe else None
        samples: list[str] = []
        connection = Reconnecting(self.target)
        try:
            pending: list[dict[str, Any]] = []
            for record_batch in batches:
                for row in record_batch.to_pylist():
                    counts.rows += 1
                    if row.get("refused"):
                        counts.refused += 1
                        if len(samples) < REFUSED_SAMPLES:
                            samples.append(f"key {row['dedupe_key'][:16]}...: {row['refused']}")
                        continue
                    pending.append({k: v for k, v in row.items() if k != "refused" and v is not None})
                    if len(pending) >= self.batch_size:
                        self._send(connection, pending, counts, on_batch)
            if pending:
                self._send(connection, pending, counts, on_batch)
        finally:
            connection.close()
        counts.refused_samples = tuple(samples)
        return counts

    def _send(self, connection: "Reconnecting", items: list[dict[str, Any]], counts: WriteCounts,
              on_batch: Any) -> None:
        def send() -> list[dict]:
            return connection.client().enqueue_batch(items)

        def reconnect() -> None:
            counts.retries += 1
            connection.reset()

        results = with_retries(f"enqueue {self.target.name} partition {counts.partition}", send, self.retries,
                               on_retry=reconnect)
        duplicates = sum(1 for r in results if r["duplicate"])
        counts.duplicates += duplicates
        counts.enqueued += len(results) - duplicates
        if self.ledger:
            self._record(items, results, counts)
        items.clear()
        if on_batch is not None:
            on_batch("enqueued", {"partition": counts.partition, "attempt": counts.attempt,
                                  "batch": (counts.enqueued + counts.duplicates + self.batch_size - 1) // self.batch_size,
                                  "completed_in_batch": len(results)}, **self.probe_args)

    def _record(self, items: list[dict[str, Any]], results: list[dict], counts: WriteCounts) -> None:
        """One ledger file per committed batch (written after its commit: a crash in between leaves
        the batch out of the ledger, and dedupe still covers it while its messages are queued)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        filesystem_, folder = filesystem(self.ledger)
        filesystem_.create_dir(folder, recursive=True)
        by_ordinal = {int(r.get("ordinal", i + 1)): r for i, r in enumerate(results)}
        now = datetime.now(timezone.utc)
        table = pa.table({"dedupe_key": [i["dedupe_key"] for i in items],
                          "id": [str(by_ordinal[n + 1]["id"]) for n in range(len(items))],
                          "duplicate": [bool(by_ordinal[n + 1]["duplicate"]) for n in range(len(items))],
                          "written_at": pa.array([now] * len(items), pa.timestamp("us", tz="UTC"))})
        name = f"{folder}/part-{counts.partition:05d}-{uuid.uuid4().hex}.parquet"
        temporary = f"{folder}/_tmp-{uuid.uuid4().hex}.parquet"
        pq.write_table(table, temporary, filesystem=filesystem_)
        filesystem_.move(temporary, name)

    def commit(self, messages: list[WriteCounts | None]) -> None:
        done = [m for m in messages if m is not None]
        summary = {"queue": self.target.name, "partitions": len(done),
                   "retried_partitions": sorted(m.partition for m in done if m.attempt > 0)}
        for field in ("rows", "enqueued", "duplicates", "refused", "retries"):
            summary[field] = sum(getattr(m, field) for m in done)
        samples = [s for m in done for s in m.refused_samples][:REFUSED_SAMPLES]
        summary["refused_samples"] = samples
        if self.summary_file:
            with open(self.summary_file, "w", encoding="utf-8") as handle:
                json.dump(summary, handle)
        log().info("enqueue %s: %s rows in %s partitions -> %s enqueued, %s duplicates, %s refused, %s retries",
                   self.target.name, summary["rows"], summary["partitions"], summary["enqueued"],
                   summary["duplicates"], summary["refused"], summary["retries"])
        if summary["refused"]:
            raise PipelineError(f"{self.target.name}: {summary['refused']} row(s) refused and not enqueued, the "
                                f"other {summary['rows'] - summary['refused']} written; first: {'; '.join(samples)}")


# -- the stream reader ------------------------------------------------------------------------------
# An offset holds every lease's id and token, and Spark repeats it in each StreamingQueryProgress
# (the log, recentProgress, listeners): a cap on the leases per micro-batch keeps those small.
MAX_LEASES_PER_BATCH = 10_000
# Pages of MAX_BATCH a run of availableNow reads past a wall of newer messages: as many rows as the
# largest micro-batch.
WALL_PAGES = MAX_LEASES_PER_BATCH // MAX_BATCH
# Leases a micro-batch of availableNow holds across its partitions before the pages: once reached,
# the partitions left lease in the next micro-batch.
HOLD_LIMIT = MAX_LEASES_PER_BATCH
# read(): how often to ask again for recorded leases that a dequeue skipped (SKIP LOCKED: the
# driver's heartbeat, or a zombie attempt under the same worker name, had the row locked).
READ_ROUNDS = 5
# ack=commit: commit() completes a micro-batch's leases; ack=sink: the sink completes or fails each
# row after writing it, and commit() fails what the sink left (a row the query filtered out).
ACK_MODES = ("commit", "sink")
UNACKNOWLEDGED = "the micro-batch of offset {seq} was committed without the sink acknowledging this message (ack=sink)"


def _database_now(client: Any) -> datetime:
    """The database's clock, UTC (SQL Server's SYSUTCDATETIME is zone-free)."""
    sql = "SELECT clock_timestamp()" if client.dialect == "postgres" else "SELECT SYSUTCDATETIME()"
    return _utc(client.conn.execute(sql).fetchone()[0])


def _utc(value: Any) -> Any:
    """A naive datetime as UTC (SQL Server's datetime2 columns hold UTC by contract)."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def _enqueued_by(cutoff: datetime, row: dict) -> bool:
    """Whether a leased row was enqueued, and is due, by `cutoff`: a run of availableNow's."""
    times = [_utc(row[name]) for name in ("enqueued_at", "due_at") if row.get(name) is not None]
    return max(times, default=cutoff) <= cutoff


def _held(worker: str, row: dict) -> tuple[str, tuple[str, str, str]]:
    """A lease held while a micro-batch leases, by message id: (worker, id, token), as text."""
    return str(row["id"]), (worker, str(row["id"]), str(row["lease_token"]))


def _recorded(worker: str, rows: list[dict]) -> dict:
    """A lease as an offset records it: the worker and each message's id and token, as text."""
    return {"worker": worker, "acks": [[str(r["id"]), str(r["lease_token"])] for r in rows]}


@dataclass
class LeasePartition(InputPartition):
    worker: str
    acks: list          # [[id as text, lease token as text], ...]

    def __init__(self, worker: str, acks: list) -> None:
        super().__init__((worker, acks))
        self.worker, self.acks = worker, acks


class LeasesStillHeld(PipelineError):
    """read() could not get back leases that are still this micro-batch's: Spark retries the task
    (commit() completes every recorded lease, so a partial read would lose those messages)."""


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Options: partitions (default 2), messagesPerPartition (1..1000, default 100; at most
    MAX_LEASES_PER_BATCH leases per micro-batch), leaseSeconds (default the queue's), consumer (the
    worker names' prefix, default spark), idleWaitSeconds (0..20, default 2: how long latestOffset
    waits for a message when none is ready), ack (commit, the default: commit() completes every
    lease of the micro-batch; sink: the sink acknowledges each row, see pipelines.stream_job.AckSink,
    and commit() fails the leases it left unacknowledged).

    trigger(availableNow=True) runs micro-batches until one finds nothing that was enqueued (and
    due) by the time the query started (newer messages it meets first, as a priority queue hands
    them out, are held until every partition has leased, then released; past a wall of them, pages
    read on: _lease_behind_the_wall); the last latestOffset, which finds nothing, completes the
    last micro-batch. trigger(once=True) runs one micro-batch and never plans a next one, so with
    ack=commit nothing of it would be completed before the next run: refused."""

    def __init__(self, source: SourceOptions) -> None:
        source.target.require_kind("work")
        self.target = source.target
        self.partition_count = source.integer("partitions", 2, 1, 1000)
        self.per_partition = source.integer("messagesPerPartition", 100, 1, MAX_BATCH)
        if self.partition_count * self.per_partition > MAX_LEASES_PER_BATCH:
            raise PipelineError(f"{self.target.name}: partitions x messagesPerPartition = "
                                f"{self.partition_count * self.per_partition} leases per micro-batch; at most "
                                f"{MAX_LEASES_PER_BATCH} (every lease is in the offset, which Spark logs with "
                                f"each micro-batch's progress)")
        self.lease_seconds = source.integer("leaseSeconds", None, 1, 86_400)
        self.idle_wait_seconds = source.integer("idleWaitSeconds", 2, 0, MAX_WAIT_MS // 1000)
        self.consumer = source.options.get("consumer") or "spark"
        self.ack = (source.options.get("ack") or "commit").lower()
        if self.ack not in ACK_MODES:
            raise PipelineError(f"{self.target.name}: option ack must be one of {', '.join(ACK_MODES)}, "
                                f"got {source.options.get('ack')!r}")
        self._driver: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # The driver's connection, heartbeat and bookkeeping stay on the driver.
        return {k: v for k, v in self.__dict__.items() if k != "_driver"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._driver = {}

    # driver side
    def _client(self) -> Any:
        if "connection" not in self._driver:
            self._driver["connection"] = Reconnecting(self.target)
            self._driver["completed"] = set()
            self._driver["heartbeat"] = LeaseHeartbeat(self.target, self.lease_seconds)
        return self._driver["connection"].client()

    def _call(self, what: str, call: Any) -> Any:
        """call(client) on the driver's connection, retried on transient errors; each try asks the
        connection for its client, so a try after a reconnect uses the new one."""
        connection = self._driver["connection"]
        return with_retries(f"{what} {self.target.name}", lambda: call(connection.client()), 3,
                            on_retry=connection.reset)

    def initialOffset(self) -> dict:
        # run: this query's part of every worker name, drawn anew on each call. Spark calls this
        # whenever a micro-batch starts from no recorded offset (until offsets/0 is in the
        # checkpoint, and to replay micro-batch 0), so only the run an offset records is pinned:
        # from the first offset on, a restart uses the same names (and gets its recorded leases
        # back), and a new checkpoint (a second query with the same consumer, a deleted checkpoint)
        # never shares a name with live leases of another. A driver that dies after leasing the
        # first micro-batch and before Spark recorded it leaves those leases to run out.
        return {"run": uuid.uuid4().hex[:12], "seq": 0, "leases": []}

    def getDefaultReadLimit(self) -> Any:
        # Each micro-batch is partitions x messagesPerPartition leases at most, whatever the trigger.
        # Saying so lets latestOffset recognise Trigger.Once: Spark replaces any other limit with
        # ReadAllAvailable for it (and warns that the limit is ignored).
        return ReadMaxRows(self.partition_count * self.per_partition)

    def prepareForTriggerAvailableNow(self) -> None:
        # Spark calls this once, before the run's first latestOffset (again after a driver restart,
        # which moves the cutoff later). What was enqueued (and due) until now is this run's to read;
        # anything later is left for the next run, so that a steady producer cannot keep the run
        # from ending. Now is the database's clock, which set enqueued_at and due_at (with client
        # ids, enqueued_at is the producer's: docs/pipelines.md).
        self._client()
        self._driver["available_until"] = self._call("read the clock of", _database_now)

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        available_now = "available_until" in self._driver
        if isinstance(limit, ReadAllAvailable) and not available_now and self.ack == "commit":
            raise PipelineError(
                f"stream {self.target.name}: trigger(once=True) with ack=commit would never complete its "
                f"micro-batch (Spark commits a micro-batch only while it plans the next one, and a run "
                f"of trigger once plans none): its leases would run out before the next run and its "
                f"messages be read again. Use trigger(availableNow=True), which completes every "
                f"micro-batch before it ends, or trigger(processingTime=...), or option ack=sink (the "
                f"sink acknowledges each row as it writes it)")
        self._client()
        # start is the end of the last committed micro-batch; commit() may not have run for it (the
        # driver died in between): completing it again is harmless.
        self._complete(start)
        # Offsets of a checkpoint written before offsets carried a run: a run from now on.
        run = start.get("run") or self._driver.setdefault("run", uuid.uuid4().hex[:12])
        seq = int(start["seq"]) + 1
        leases = self._lease(run, seq)
        # Nothing ready: wait for a message (the contract's wait claims nothing) instead of returning
        # at once, which Spark's default trigger would turn into a dequeue every few milliseconds.
        # Not in a run of availableNow: what arrives now is the next run's.
        if not leases and self.idle_wait_seconds and not available_now and \
                self._call("wait", lambda client: client.wait(self.idle_wait_seconds * 1000)):
            leases = self._lease(run, seq)
        if not leases:
            return start
        offset = {"run": run, "seq": seq, "leases": leases}
        self._driver["heartbeat"].hold(seq, leases)
        log().info("stream %s: micro-batch offset %s leased %s message(s) in %s partition(s)", self.target.name,
                   seq, sum(len(lease["acks"]) for lease in leases), len(leases))
        return offset

    def _lease(self, run: str, seq: int) -> list[dict]:
        cutoff = self._driver.get("available_until")
        if cutoff is None:
            leases = []
            for partition in range(self.partition_count):
                worker = f"{self.consumer}-{run}-s{seq}-p{partition}"
                rows = self._call("lease", lambda client, worker=worker: client.dequeue(
                    self.per_partition, worker=worker, lease_seconds=self.lease_seconds))
                if rows:
                    leases.append(_recorded(worker, rows))
            return leases
        # A run of availableNow: every lease taken in this call, by message id, as (worker, id,
        # token), until it is either this micro-batch's or released. Released only once every
        # partition has leased, so that the next partition's dequeue reads past them instead of
        # meeting them again; on an error, all of them (kept ones included: the failed call records
        # no offset, so nothing would ever take them back by name), and the error is the one raised.
        # The kept ones are under the heartbeat from the start: releasing can take a while.
        holding: dict[str, tuple[str, str, str]] = {}
        leases, walled = [], True
        heartbeat = self._driver["heartbeat"]
        heartbeat.hold(seq, leases)
        try:
            for partition in range(self.partition_count):
                if len(holding) >= HOLD_LIMIT:
                    break   # the rest of the partitions lease in the next micro-batch
                worker = f"{self.consumer}-{run}-s{seq}-p{partition}"
                rows, full = self._lease_enqueued_by(cutoff, worker, holding)
                walled = walled and full   # a dequeue that came up short read the queue to its end
                if rows:
                    leases.append(_recorded(worker, rows))
            if walled and not leases:
                leases += self._lease_behind_the_wall(cutoff, run, seq, holding)
        except Exception:
            heartbeat.drop(seq)
            self._release_passed_over(list(holding.values()), retried=False)
            raise
        if not leases:
            heartbeat.drop(seq)
        kept = {i for lease in leases for i, _ in lease["acks"]}
        passed_over = [held for message_id, held in holding.items() if message_id not in kept]
        self._release_passed_over(passed_over)
        if passed_over:
            log().info("stream %s: micro-batch offset %s passed over %s message(s) enqueued or due after the "
                       "run started (released, attempt given back)", self.target.name, seq, len(passed_over))
        return leases

    def _lease_enqueued_by(self, cutoff: datetime, worker: str, holding: dict) -> tuple[list[dict], bool]:
        """Up to messagesPerPartition leases of messages enqueued and due by `cutoff` (the
        database's clock when the run started), and whether the dequeue came up against MAX_BATCH
        rows without them. Newer messages can come first (a higher priority, a retry's visible_at),
        so the worker asks again for more while it holds them: its own live leases come back first
        and unchanged, and the new ones after them. Every lease taken goes into `holding`, and stays
        there unless released here."""
        asked = self.per_partition
        while True:
            rows = self._call("lease", lambda client: client.dequeue(asked, worker=worker,
                                                                     lease_seconds=self.lease_seconds))
            holding.update(_held(worker, row) for row in rows)
            eligible = [row for row in rows if _enqueued_by(cutoff, row)]
            kept, surplus = eligible[:self.per_partition], eligible[self.per_partition:]
            if len(kept) == self.per_partition or len(rows) < asked or asked == MAX_BATCH:
                # The run's messages beyond this partition's share go back at once: the next
                # partition's (or micro-batch's) to lease.
                self._release_passed_over([holding[str(row["id"])] for row in surplus])
                for row in surplus:
                    del holding[str(row["id"])]
                return kept, len(rows) == MAX_BATCH and len(kept) < self.per_partition
            asked = min(MAX_BATCH, 2 * len(rows))

    def _lease_behind_the_wall(self, cutoff: datetime, run: str, seq: int, holding: dict) -> list[dict]:
        """Every partition met MAX_BATCH newer messages and none of the run's: look further, a page
        of MAX_BATCH at a time under a worker name of its own (each page reads past the rows held
        before it), for one lease of the run's messages (a partition of this micro-batch) or the
        queue's end. Bounded: after WALL_PAGES pages it cannot tell whether messages of the run are
        left, and stops the query rather than end the run as if none were."""
        for page in range(WALL_PAGES):
            worker = f"{self.consumer}-{run}-s{seq}-w{page}"
            rows = self._call("lease", lambda client: client.dequeue(MAX_BATCH, worker=worker,
                                                                     lease_seconds=self.lease_seconds))
            holding.update(_held(worker, row) for row in rows)
            kept = [row for row in rows if _enqueued_by(cutoff, row)][:self.per_partition]
            if kept:
                return [_recorded(worker, kept)]
            if len(rows) < MAX_BATCH:
                return []
        raise PipelineError(
            f"stream {self.target.name}: trigger(availableNow=True) met {len(holding)} messages enqueued or due "
            f"after the run started and none older ahead of them (its partitions' dequeues, then {WALL_PAGES} "
            f"page(s) of {MAX_BATCH}; newer messages come first on a queue with priority, and behind a retry's "
            f"later visible_at): it cannot tell whether messages of this run are left behind them, so it "
            f"stops instead of ending the run. Use trigger(processingTime=...) on this queue")

    def _release_passed_over(self, held: list[tuple[str, str, str]], retried: bool = True) -> None:
        """Release each held lease (worker, id, token), attempt given back. At the first that cannot
        be released the rest are left to their leases running out (an attempt spent), with one line
        logged: the database is likely gone, and every row's retries would keep the query waiting.
        Not retried after an error (the error is what the caller waits for)."""
        for released, (worker, message_id, token) in enumerate(held):
            def release(client: Any, worker: str = worker, message_id: str = message_id, token: str = token) -> Any:
                return client.release(message_id, worker, lease_token=token)
            try:
                if retried:
                    self._call("release", release)
                else:
                    release(self._driver["connection"].client())
            except Exception as error:  # noqa: BLE001 - logged: the leases run out on their own
                log().warning("stream %s: %s of %s passed-over message(s) could not be released (%s: %s); left "
                              "to their leases running out, an attempt spent", self.target.name,
                              len(held) - released, len(held), type(error).__name__, error)
                return

    def partitions(self, start: dict, end: dict) -> Sequence[LeasePartition]:
        if int(end["seq"]) == int(start["seq"]):
            return []
        # A micro-batch replayed after a restart comes here without latestOffset: its leases need the
        # heartbeat too, or a replay longer than the lease loses them halfway.
        self._client()
        if int(end["seq"]) not in self._driver["completed"]:
            self._driver["heartbeat"].hold(int(end["seq"]), end["leases"])
        return [LeasePartition(lease["worker"], lease["acks"]) for lease in end["leases"]]

    def commit(self, end: dict) -> None:
        self._client()
        self._complete(end)

    def _complete(self, offset: dict) -> None:
        """Settle a committed micro-batch: complete its leases (ack=commit), or fail those the sink
        left unacknowledged (ack=sink: a lease the sink completed or failed is gone, and the fenced
        call answers lost for it)."""
        seq = int(offset["seq"])
        if seq == 0 or seq in self._driver["completed"]:
            return
        settled = lost = 0
        for lease in offset["leases"]:
            acks = [{"id": i, "lease_token": t} for i, t in lease["acks"]]
            if self.ack == "sink":
                answer = self._call("fail", lambda client: client.fail_batch(
                    acks, lease["worker"], UNACKNOWLEDGED.format(seq=seq), 0))
                done = sum(1 for row in answer if row["outcome"] != "lost")
            else:
                answer = self._call("complete", lambda client: client.complete_batch(acks, lease["worker"]))
                done = sum(1 for row in answer if row["completed"])
            settled, lost = settled + done, lost + len(answer) - done
        self._driver["completed"].add(seq)
        self._driver["heartbeat"].drop(seq)
        if self.ack == "sink":
            log().log(logging.WARNING if settled else logging.INFO,
                      "stream %s: micro-batch offset %s committed: %s lease(s) the sink did not acknowledge "
                      "failed, %s acknowledged by the sink (or run out)", self.target.name, seq, settled, lost)
            return
        log().info("stream %s: micro-batch offset %s committed: %s completed, %s no longer held (completed "
                   "before, or the lease ran out)", self.target.name, seq, settled, lost)

    def stop(self) -> None:
        if self._driver:
            self._driver["heartbeat"].close()
            self._driver["connection"].close()

    # executor side
    def read(self, partition: LeasePartition) -> Iterator[tuple]:
        connection = Reconnecting(self.target)
        try:
            mine = self._recorded_leases(self._task_calls(connection, partition.worker), partition)
        finally:
            connection.close()
        client_ids = bool(self.target.queue.options.get("client_ids"))
        for row in mine:
            payload = row["payload"]
            if self.target.queue.payload == "json" and not isinstance(payload, (str, bytes)):
                payload = json.dumps(payload, sort_keys=True, separators=(",", ":"))
            elif isinstance(payload, memoryview):
                payload = bytes(payload)
            values = (str(row["id"]) if client_ids else int(row["id"]), payload, _utc(row.get("enqueued_at")),
                      row.get("attempts"), partition.worker)
            yield values + (str(row["lease_token"]),) if self.ack == "sink" else values

    def _task_calls(self, connection: Reconnecting, worker: str) -> Any:
        """call(what, function of the client) for a task: tried again on a new connection after a
        transient error (a failover), TASK_RETRIES times. Each call read() makes is safe to repeat:
        a dequeue under the same worker gives back that worker's own leases, extend_lease and
        release are fenced by the lease token. An error that ends the task names the queue, the
        call and the worker."""
        def call(what: str, function: Any) -> Any:
            try:
                return with_retries(f"stream {self.target.name}: {what} for {worker}",
                                    lambda: function(connection.client()), TASK_RETRIES, on_retry=connection.reset)
            except Exception as exc:  # noqa: BLE001 - re-raised with the queue and the worker named
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise PipelineError(f"stream {self.target.name}: {what} for worker {worker} failed "
                                    f"({type(exc).__name__}: {first_line}); Spark retries the task") from exc
        return call

    def _recorded_leases(self, call: Any, partition: LeasePartition) -> list[dict]:
        """The partition's recorded leases that are still live, with their messages.

        The worker's own live leases come back from dequeue unchanged; a lease that ran out comes
        back with a new token (or went to another worker), and anything else fills the batch: those
        are not this micro-batch's messages and are given back at once, attempt included. dequeue
        skips rows another session has locked (the heartbeat's extend_lease, a zombie attempt), so
        a recorded lease missing from its answer is not yet known to be lost: extend_lease, which
        waits for the lock, says whether it is still ours, and then it is asked for again. commit()
        completes every recorded lease, so a lease still ours is never left out: the task fails
        instead and Spark runs it again."""
        wanted = dict((i, t) for i, t in partition.acks)
        worker = partition.worker
        mine: dict[str, dict] = {}
        for _ in range(READ_ROUNDS):
            for row in call("dequeue", lambda client: client.dequeue(len(wanted), worker=worker,
                                                                     lease_seconds=self.lease_seconds)):
                if wanted.get(str(row["id"])) == str(row["lease_token"]):
                    mine[str(row["id"])] = row
                else:
                    call("release", lambda client, row=row: client.release(row["id"], worker,
                                                                           lease_token=row["lease_token"]))
            missing = [i for i in wanted if i not in mine]
            held = [i for i in missing
                    if call("extend_lease", lambda client, i=i: client.extend_lease(
                        i, worker, self.lease_seconds, lease_token=wanted[i]))]
            if not held:
                break
        else:
            raise LeasesStillHeld(f"stream {self.target.name}: {len(held)} of {len(wanted)} leases of "
                                  f"{partition.worker} are still held but locked by another session "
                                  f"after {READ_ROUNDS} tries; the task is retried")
        lost = len(wanted) - len(mine)
        if lost:
            log().warning("stream %s: %s of %s leases of %s ran out before the micro-batch read them; their "
                          "messages come again in a later micro-batch", self.target.name, lost, len(wanted),
                          partition.worker)
        return [mine[i] for i in wanted if i in mine]
