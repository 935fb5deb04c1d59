"""Enqueue a dataset (Parquet, CSV or JSON) into a queue, one connection per Spark partition.

Each row becomes one message: its payload is the JSON of the row (or of the columns picked and
renamed with --columns), its dedupe key a column of the row (--dedupe-column) or a SHA-256 of the
row's canonical JSON. The queue must have `dedupe: true`: then a Spark task that is retried, or a
whole job that is run again, re-sends rows the queue already has and they come back as duplicates
instead of second messages.

    python -m pipelines.enqueue_job --url postgresql://... --catalog database/queues.yml \
        --queue emails --input data/customers.parquet --columns id,name:customer_name
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

if __package__ in (None, ""):  # `spark-submit pipelines/enqueue_job.py` without --py-files
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.common import (PipelineError, QueueTarget, build_session, canonical_json,  # noqa: E402
                              elapsed_since, load_callable, log, progress_monitor)

FORMATS = ("parquet", "csv", "json")
MAX_DEDUPE_KEY = 200   # the templates' CHECK (length(dedupe_key) <= 200)


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
            if not item:
                continue
            source, _, target = item.partition(":")
            mapping[source.strip()] = (target or source).strip()
    if not mapping:
        raise PipelineError("--columns is empty: name at least one column (source or source:field)")
    targets = list(mapping.values())
    if len(set(targets)) != len(targets):
        raise PipelineError(f"--columns maps two columns to the same payload field: {targets}")
    return mapping


def read_dataset(spark: Any, source: str, fmt: str | None = None,
                 options: Mapping[str, str] | None = None) -> Any:
    """Read Parquet, CSV (header row, inferred types) or JSON lines; the format defaults to the
    file extension of the source."""
    if fmt is None:
        suffix = Path(source.rstrip("/")).suffix.lower().lstrip(".")
        fmt = {"jsonl": "json", "ndjson": "json", "pq": "parquet"}.get(suffix, suffix) or "parquet"
    if fmt not in FORMATS:
        raise PipelineError(f"unknown input format {fmt!r} for {source} (expected one of {', '.join(FORMATS)})")
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load(source)


def row_payload(row: Mapping[str, Any], columns: Mapping[str, str] | None) -> dict[str, Any]:
    if columns is None:
        return dict(row)
    return {target: row[source] for source, target in columns.items()}


def row_dedupe_key(row: Mapping[str, Any], dedupe_column: str | None) -> str:
    """The given column's value, or the SHA-256 of the whole row's canonical JSON (stable across
    runs, partitionings and nodes: sorted keys, fixed encodings for dates, decimals and bytes)."""
    if dedupe_column is not None:
        value = row[dedupe_column]
        if value is None:
            raise PipelineError(f"row has no value in dedupe column {dedupe_column!r}: without a key the "
                                f"row could be enqueued twice on a retry; fix the data or derive the key")
        key = value if isinstance(value, str) else canonical_json(value)
        if len(key) > MAX_DEDUPE_KEY:
            raise PipelineError(f"dedupe key from column {dedupe_column!r} is {len(key)} characters; the "
                                f"queue accepts at most {MAX_DEDUPE_KEY}")
        return key
    return hashlib.sha256(canonical_json(dict(row)).encode("utf-8")).hexdigest()


def _payload_for(target: QueueTarget, payload: dict[str, Any]) -> Any:
    """The row's canonical JSON (dates, decimals, bytes as json_default has them): as text for json
    and text queues (a json queue parses it once), as UTF-8 bytes for binary ones."""
    text = canonical_json(payload)
    return text.encode("utf-8") if target.queue.payload == "binary" else text


def enqueue_partition(target: QueueTarget, rows: Iterable[Any], columns: Mapping[str, str] | None,
                      dedupe_column: str | None, batch_size: int, log_every: int,
                      probe: str | None = None, probe_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run on an executor: enqueue one partition's rows in batches over one connection (each batch
    its own transaction). probe (a dotted path, see pipelines.faults) is called after each batch."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    started = time.monotonic()
    counts = {"partition": partition, "attempt": attempt, "rows": 0, "enqueued": 0, "duplicates": 0,
              "batches": 0}
    next_log = log_every
    on_batch = load_callable(probe) if probe else None
    with target.client() as client:
        batch: list[dict[str, Any]] = []

        def flush() -> None:
            results = client.enqueue_batch(batch)
            duplicates = sum(1 for r in results if r["duplicate"])
            counts["duplicates"] += duplicates
            counts["enqueued"] += len(results) - duplicates
            counts["rows"] += len(results)
            counts["batches"] += 1
            batch.clear()
            if on_batch is not None:
                on_batch("enqueued", {"partition": partition, "attempt": attempt, "batch": counts["batches"],
                                      "completed_in_batch": len(results)}, **dict(probe_args or {}))

        for spark_row in rows:
            row = spark_row.asDict(recursive=True)
            batch.append({"payload": _payload_for(target, row_payload(row, columns)),
                          "dedupe_key": row_dedupe_key(row, dedupe_column)})
            if len(batch) >= batch_size:
                flush()
                if counts["rows"] >= next_log:
                    log().info("enqueue %s partition %s (attempt %s): %s rows, %s new, %s duplicates",
                               target.name, partition, attempt, counts["rows"], counts["enqueued"],
                               counts["duplicates"])
                    next_log += log_every
        if batch:
            flush()
    counts["seconds"] = elapsed_since(started)
    log().info("enqueue %s partition %s (attempt %s) done: %s rows, %s new, %s duplicates in %.1fs",
               target.name, partition, attempt, counts["rows"], counts["enqueued"], counts["duplicates"],
               counts["seconds"])
    return counts


def run_enqueue(spark: Any, url: str, catalog: Any, queue: str, source: Any, *, fmt: str | None = None,
                columns: str | Sequence[str] | Mapping[str, str] | None = None,
                dedupe_column: str | None = None, batch_size: int = 1000, partitions: int | None = None,
                read_options: Mapping[str, str] | None = None, log_every: int = 10_000,
                probe: str | None = None, probe_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Enqueue every row of `source` (a path, or a DataFrame) into `queue`; return the counts.

    `enqueued` counts rows the queue did not have, `duplicates` rows whose dedupe key it already had
    (from an earlier run, or from an attempt of the same task that Spark retried).
    """
    target = QueueTarget.of(url, catalog, queue)
    if not target.queue.options.get("dedupe"):
        raise PipelineError(
            f"{target.name} has dedupe: false; the enqueue job needs dedupe: true, because Spark re-runs "
            f"failed tasks and only a dedupe key makes a re-sent row a duplicate instead of a second "
            f"message (set options: {{dedupe: true}} in the catalog; it changes the table, so deploy it "
            f"under a new queue name)")
    if not 1 <= batch_size <= 1000:
        raise PipelineError(f"batch_size must be between 1 and 1000, got {batch_size}")
    mapping = parse_columns(columns)
    if probe:
        load_callable(probe)
    frame = source if hasattr(source, "rdd") else read_dataset(spark, str(source), fmt, read_options)
    missing = [c for c in list(mapping or {}) + ([dedupe_column] if dedupe_column else [])
               if c not in frame.columns]
    if missing:
        raise PipelineError(f"column(s) {missing} not in the dataset (columns: {frame.columns})")
    if partitions:
        frame = frame.repartition(partitions)
    started = time.monotonic()

    def task(_: int, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        yield enqueue_partition(target, rows, mapping, dedupe_column, batch_size, log_every, probe, probe_args)

    with progress_monitor(spark, f"enqueue {target.name}"):
        # Counts come back as the partitions' results, so only the successful attempt of each task
        # is counted (an accumulator in a transformation could count a retried task twice).
        per_partition = sorted(frame.rdd.mapPartitionsWithIndex(task).collect(),
                               key=lambda c: c["partition"])
    summary = {
        "queue": target.name,
        "rows": sum(c["rows"] for c in per_partition),
        "enqueued": sum(c["enqueued"] for c in per_partition),
        "duplicates": sum(c["duplicates"] for c in per_partition),
        "partitions": per_partition,
        "seconds": elapsed_since(started),
    }
    retried = [c["partition"] for c in per_partition if c["attempt"] > 0]
    summary["retried_partitions"] = retried
    line = (f"enqueue {target.name}: {summary['rows']} rows in {len(per_partition)} partitions -> "
            f"{summary['enqueued']} enqueued, {summary['duplicates']} duplicates "
            f"({summary['seconds']:.1f}s)")
    if retried:
        line += f"; partitions {retried} were retried by Spark (their re-sent rows count as duplicates)"
    log().info(line)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipelines.enqueue_job", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="postgresql://... or mssql+pyodbc://...")
    parser.add_argument("--catalog", required=True, help="the catalog YAML the queue was deployed from")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--input", required=True, help="file or folder (local, hdfs://, s3a://, ...)")
    parser.add_argument("--format", choices=FORMATS, help="default: from the file extension")
    parser.add_argument("--columns", help="payload fields: col,col:renamed,... (default: every column)")
    parser.add_argument("--dedupe-column", help="column holding the dedupe key (default: hash of the row)")
    parser.add_argument("--batch-size", type=int, default=1000, help="items per enqueue_batch call")
    parser.add_argument("--partitions", type=int, help="repartition the input first (= connections)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a reader option, e.g. --option delimiter=';' (repeatable)")
    parser.add_argument("--master", help="Spark master when run with python (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = dict(o.split("=", 1) for o in args.option)
    spark = build_session("tablequeue-enqueue", master=args.master)
    try:
        run_enqueue(spark, args.url, args.catalog, args.queue, args.input, fmt=args.format,
                    columns=args.columns, dedupe_column=args.dedupe_column, batch_size=args.batch_size,
                    partitions=args.partitions, read_options=options)
    except PipelineError as exc:
        print(f"enqueue_job: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
