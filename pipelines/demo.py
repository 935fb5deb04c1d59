"""The Spark part of `make demo`: enqueue a generated dataset through format("tablequeue")'s writer,
drain it with its stream reader (ack=sink: failed messages are retried, then dead-lettered), report.

    from pipelines.demo import run_spark_demo
    summary = run_spark_demo(url, catalog, "emails", 20000)
"""
from __future__ import annotations

import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipelines.common import QueueTarget, build_session, elapsed_since
from pipelines.enqueue_job import run_enqueue
from pipelines.report_job import run_report
from pipelines.stream_job import read_results, run_stream

DEMO_TRANSFORM = "pipelines.transforms:uppercase_name_or_fail"


def generate_dataset(spark: Any, rows: int, path: str, partitions: int = 4, poison_every: int = 97,
                     flaky_every: int = 13) -> str:
    """Customers: id, name, amount, created_at; every poison_every-th row is refused by the demo
    transform on every attempt (it ends dead), every flaky_every-th fails its first attempt only."""
    from pyspark.sql import functions as F

    frame = (spark.range(0, rows, 1, partitions)
             .select(F.col("id"),
                     F.concat(F.lit("customer-"), F.col("id").cast("string")).alias("name"),
                     ((F.col("id") * 37) % 100_000 / F.lit(100.0)).alias("amount"),
                     (F.col("id") % poison_every == poison_every - 1).alias("poison"),
                     (F.col("id") % flaky_every == flaky_every - 1).alias("flaky"),
                     F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("created_at")))
    frame.write.mode("overwrite").parquet(path)
    return path


def run_spark_demo(url: str, catalog: Any, queue: str, rows: int = 20_000, *, workdir: str | None = None,
                   spark: Any = None, tasks: int = 2, time_budget_seconds: float = 600.0) -> dict[str, Any]:
    """Spark enqueues `rows` generated rows into `queue` (a work queue with dedupe and history)
    with the writer, drains it with a streaming query of `tasks` partitions (the stream reader and
    pipelines.stream_job.AckSink) until nothing is ready, and reports on it. Returns a flat summary dict.

    url: the database (postgresql://... or mssql+pyodbc://...) the catalog is deployed to.
    catalog: a tablequeue Catalog or the path of its YAML file.
    workdir: where the dataset, the stream's output and checkpoint, and the report go (default: a new temporary folder).
    spark: an existing SparkSession (default: one is built, local[*], and stopped at the end).
    The summary is returned, not logged: the caller shows it.
    """
    from pyspark.sql import functions as F

    target = QueueTarget.of(url, catalog, queue)
    target.require_kind("work")
    own_session = spark is None
    spark = spark or build_session("tablequeue-demo")
    folder = Path(workdir or tempfile.mkdtemp(prefix="tablequeue-spark-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # The report counts what finished from here on: messages of an earlier run of the queue do not
    # count (the database's clock is assumed to agree with this one's, as on one machine).
    since = datetime.now(timezone.utc)
    try:
        dataset = generate_dataset(spark, rows, str(folder / "input"))
        enqueued = run_enqueue(spark, url, catalog, queue, dataset, key="id")
        drained = run_stream(spark, url, catalog, queue, DEMO_TRANSFORM, str(folder / "output"),
                             str(folder / "checkpoint"), partitions=tasks, messages_per_partition=1000,
                             lease_seconds=60, retry_after_seconds=0, time_budget_seconds=time_budget_seconds)
        report = run_report(spark, url, catalog, queue, str(folder / "report"), since=since)
        results = read_results(spark, drained["output"]).where("error IS NULL").agg(
            F.count("*").alias("rows"), F.countDistinct("id").alias("ids")).first()
    finally:
        if own_session:
            spark.stop()
    wait, processing = report["latency"].get("wait", {}), report["latency"].get("processing", {})
    summary = {
        "queue": target.name,
        "rows": enqueued["rows"],
        "enqueued": enqueued["enqueued"],
        "duplicates": enqueued["duplicates"],
        # From the database (history and dead-letter tables, through the report): the sink's counts
        # are lower bounds (a retried task or replayed micro-batch counts its messages as lost).
        "completed": report["completed"],
        "dead": report["dead"],
        "retries": drained["retrying"],
        "output": drained["output"],
        "results": results["rows"],
        "results_doubled": results["rows"] - results["ids"],
        "report": str(folder / "report"),
        "chart": report["chart"],
        "peak_per_minute": max((r["completed"] for r in report["throughput"]), default=0),
        "wait_p50_p95_p99_s": tuple(round(wait.get(p) or 0.0, 4) for p in ("p50", "p95", "p99")),
        "processing_p50_p95_p99_s": tuple(round(processing.get(p) or 0.0, 4) for p in ("p50", "p95", "p99")),
        "seconds": elapsed_since(started),
    }
    # Not logged: the caller shows it (`make demo` prints it, key by key); logging it too printed the
    # summary twice. The jobs above have logged their own lines.
    return summary
