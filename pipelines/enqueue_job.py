"""Enqueue a dataset (Parquet, CSV or JSON) into a queue through format("tablequeue").

Each row becomes one message: its payload is the JSON of the row (or of the columns picked and
renamed with --columns), its dedupe key the SHA-256 of the key columns (--key), both computed in the
JVM (pipelines.sources.to_messages). The queue must have `dedupe: true`: then a Spark task that is
retried, or a whole job that is run again, re-sends rows the queue still holds and they come back as
duplicates instead of second messages; --ledger extends that to rows already consumed.

    TABLEQUEUE_URL=postgresql://... python -m pipelines.enqueue_job --catalog database/queues.yml \
        --queue emails --input data/customers.parquet --key id --columns id,name:customer_name
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

if __package__ in (None, ""):  # `spark-submit pipelines/enqueue_job.py` without --py-files
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.common import (PipelineError, QueueTarget, add_queue_arguments, arrow_location,  # noqa: E402
                              elapsed_since, is_connect_session, job_description, job_main, load_callable)
from pipelines.sources import FORMAT, require_dedupe, target_options, to_messages  # noqa: E402

FORMATS = ("parquet", "csv", "json")


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

def run_enqueue(spark: Any, url: str, catalog: Any, queue: str, source: Any, *, key: str | Sequence[str],
                fmt: str | None = None, columns: str | Sequence[str] | Mapping[str, str] | None = None,
                batch_size: int = 1000, max_connections: int | None = 16,
                read_options: Mapping[str, str] | None = None, ledger: str | None = None,
                probe: str | None = None, probe_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Enqueue every row of `source` (a path, or a DataFrame) into `queue`; return the counts.

    `enqueued` counts rows the queue did not have, `duplicates` rows whose dedupe key it still held
    (from an earlier run, or from an attempt of the same task that Spark retried), `refused` rows
    with NaN or an infinity (the job fails after writing the others).
    """
    target = QueueTarget.of(url, catalog, queue)
    if is_connect_session(spark):
        raise PipelineError(f"{target.name}: run_enqueue needs a classic SparkSession: it passes the database URL "
                            f"and takes the counts back through files on this machine, which a Spark Connect "
                            f"server cannot read")
    require_dedupe(target)
    if probe:
        load_callable(probe)
    frame = source if hasattr(source, "sparkSession") else read_dataset(spark, str(source), fmt, read_options)
    if ledger is not None:
        # The location Spark reads it at, which the writer's tasks then write through Arrow.
        ledger = arrow_location(spark, ledger, "ledger")
    messages = to_messages(frame, key, columns=columns, binary=target.queue.payload == "binary",
                           max_connections=max_connections, ledger=ledger)
    started = time.monotonic()
    folder = tempfile.mkdtemp(prefix="tablequeue-enqueue-")     # mode 0700: the URL may hold a password
    url_file, summary_file = os.path.join(folder, "url"), os.path.join(folder, "summary.json")
    try:
        with open(os.open(url_file, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="utf-8") as handle:
            handle.write(url)
        writer = messages.write.format(FORMAT).mode("append").options(**target_options(target, url_file))
        writer = writer.option("batchSize", str(batch_size)).option("summaryFile", summary_file)
        if max_connections is not None:
            writer = writer.option("maxConnections", str(max_connections))
        if ledger is not None:
            writer = writer.option("ledger", ledger)
        if probe:
            writer = writer.option("probe", probe).option("probeArgs", json.dumps(dict(probe_args or {})))
        failure: Exception | None = None
        with job_description(spark, f"enqueue {target.name}"):
            try:
                writer.save()
            except Exception as exc:  # noqa: BLE001 - refused rows fail the job after the rest is written
                failure = exc
        summary = json.loads(Path(summary_file).read_text()) if Path(summary_file).exists() else None
    finally:
        for name in (url_file, summary_file):
            if os.path.exists(name):
                os.unlink(name)
        os.rmdir(folder)
    if failure is not None:
        if summary is not None and summary["refused"]:
            raise PipelineError(f"{target.name}: {summary['refused']} row(s) refused and not enqueued, the other "
                                f"{summary['rows'] - summary['refused']} written; first: "
                                f"{'; '.join(summary['refused_samples'])}") from None
        raise failure
    summary["seconds"] = elapsed_since(started)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipelines.enqueue_job", description=__doc__.splitlines()[0])
    add_queue_arguments(parser)
    parser.add_argument("--input", help="file or folder (local, hdfs://, s3a://, ...)")
    parser.add_argument("--format", choices=FORMATS, help="default: from the file extension")
    parser.add_argument("--key", help="the columns that identify a row: col,col,... (hashed into the dedupe key)")
    parser.add_argument("--columns", help="payload fields: col,col:renamed,... (default: every column)")
    parser.add_argument("--batch-size", type=int, default=1000, help="items per enqueue_batch call")
    parser.add_argument("--max-connections", type=int, default=16,
                        help="at most this many partitions, and so connections, at once (coalesce, no shuffle)")
    parser.add_argument("--ledger", help="folder of the keys sent before: skip them, record the new ones")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a reader option, e.g. --option delimiter=';' (repeatable)")
    parser.add_argument("--master", help="Spark master when run with python (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    def run(spark: Any, args: Any, url: str) -> dict:
        options = dict(o.split("=", 1) for o in args.option)
        return run_enqueue(spark, url, args.catalog, args.queue, args.input, key=args.key, fmt=args.format,
                           columns=args.columns, batch_size=args.batch_size, max_connections=args.max_connections,
                           read_options=options, ledger=args.ledger)
    return job_main("tablequeue-enqueue", build_parser(), argv, ("catalog", "queue", "input", "key"), run)[0]


if __name__ == "__main__":
    sys.exit(main())
