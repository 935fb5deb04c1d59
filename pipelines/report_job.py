"""Report on a work queue from its history and dead-letter tables, read over JDBC.

Figures (written as Parquet under <output>/, and drawn in <output>/report.png):
  throughput   per minute: messages completed (by finished time) and dead-lettered (by death time)
  latency      wait (enqueued -> started) and processing (started -> finished) in seconds:
               p50, p95, p99 by percentile_approx (rank error at most count / PERCENTILE_ACCURACY),
               mean, max, count
  workers      per worker: completed, retried (completed after more than one attempt), dead,
               failure_rate = dead / (completed + dead), retry_rate = retried / completed

    python -m pipelines.report_job --url postgresql://... --catalog database/queues.yml \
        --queue emails --output /data/emails-report
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `spark-submit pipelines/report_job.py` without --py-files
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.common import (POSTGRES_JDBC_JAR, PipelineError, QueueTarget, add_queue_arguments, elapsed_since,  # noqa: E402
                              filesystem, jdbc_options, job_description, job_main, log)
from tablequeue.engines import parse_url  # noqa: E402

PERCENTILES = (0.5, 0.95, 0.99)
# percentile_approx's accuracy: the value it returns has a rank within count / PERCENTILE_ACCURACY
# of the exact one (1 in 10,000: over a million latencies, within 100 ranks), in a sketch of bounded
# memory per task instead of every value in one buffer.
PERCENTILE_ACCURACY = 10_000
# Partitions of each JDBC read (one connection each), split on the bigint id.
READ_PARTITIONS = 4
# The column each figure needs, first name found wins: the history and dead-letter tables are the
# work template's; these are the names it uses, and the report fails clearly if one is missing.
HISTORY_COLUMNS = {
    "id": ("id",),
    "enqueued_at": ("enqueued_at",),
    "started_at": ("started_at", "started"),
    "finished_at": ("finished_at", "completed_at", "finished"),
    "worker": ("worker",),
    "attempts": ("attempts",),
}
DEAD_COLUMNS = {
    "id": ("id",),
    "dead_at": ("dead_at", "died_at"),
    "worker": ("last_worker", "worker"),
    "attempts": ("attempts",),
}


def read_table(spark: Any, url: str, table: str, fetch_size: int = 10_000,
               partitions: int = READ_PARTITIONS, split_on_id: bool = True, naive_utc: bool | None = None) -> Any:
    """One table over JDBC (the PostgreSQL driver: spark.jars=/usr/share/java/postgresql.jar), in
    `partitions` reads of id ranges between the table's least and greatest id (a client_ids queue's
    GUIDs have no ranges: one read).

    naive_utc (default: on SQL Server, whose datetime2 columns hold UTC without a zone): read
    timestamps without a zone as the UTC times they are. Spark's JDBC reader otherwise takes them
    in the JVM's default zone, which spark-submit leaves at the host's: on a node in Paris every
    time would come out one or two hours early. They are read as TIMESTAMP_NTZ (no zone applied)
    and made timestamps in the session's zone, which run_report sets to UTC."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    options = jdbc_options(url)
    if naive_utc is None:
        naive_utc = parse_url(url).dialect == "mssql"
    if naive_utc and spark.conf.get("spark.sql.session.timeZone") != "UTC":
        raise PipelineError(f"reading {table}: the session's time zone must be UTC to read its times as UTC")

    def reader_with(**extra: str) -> Any:
        reader = spark.read.format("jdbc").option("fetchsize", str(fetch_size))
        for key, value in {**options, **({"preferTimestampNTZ": "true"} if naive_utc else {}), **extra}.items():
            reader = reader.option(key, value)
        return reader

    def load() -> Any:
        if split_on_id and partitions > 1:
            bounds = reader_with(query=f"SELECT min(id) AS low, max(id) AS high FROM {table}").load().collect()[0]
            if bounds["low"] is not None and bounds["high"] > bounds["low"]:
                return reader_with(dbtable=table, partitionColumn="id", lowerBound=str(bounds["low"]),
                                   upperBound=str(bounds["high"]), numPartitions=str(partitions)).load()
        return reader_with(dbtable=table).load()

    try:
        frame = load()
    except Exception as exc:
        if "ClassNotFoundException" in str(exc):
            raise PipelineError(
                f"the JDBC driver {options['driver']} is not on Spark's classpath: with spark-submit pass "
                f"--jars {POSTGRES_JDBC_JAR if 'postgresql' in options['driver'] else 'mssql-jdbc-<version>.jar'}"
                f" (see docs/pipelines.md)") from None
        raise
    return frame.select(*[F.col(f.name).cast(T.TimestampType()).alias(f.name)
                          if isinstance(f.dataType, T.TimestampNTZType) else F.col(f.name)
                          for f in frame.schema.fields])


def pick_columns(frame: Any, wanted: dict[str, tuple[str, ...]], table: str,
                 optional: tuple[str, ...] = ()) -> Any:
    """Select and rename the columns a figure needs; a missing required one is an error."""
    from pyspark.sql import functions as F

    present = {c.lower(): c for c in frame.columns}
    selected = []
    for name, candidates in wanted.items():
        found = next((present[c] for c in candidates if c in present), None)
        if found is None:
            if name in optional:
                selected.append(F.lit(None).alias(name))
                continue
            raise PipelineError(f"{table} has no column {' or '.join(candidates)} (columns: {frame.columns})")
        selected.append(F.col(found).alias(name))
    return frame.select(*selected)


def seconds_between(start: str, end: str) -> Any:
    from pyspark.sql import functions as F

    return (F.unix_micros(F.col(end)) - F.unix_micros(F.col(start))) / F.lit(1_000_000.0)


def compute(history: Any, dead: Any) -> dict[str, Any]:
    """The report's DataFrames from the two tables (already narrowed by pick_columns)."""
    from pyspark.sql import functions as F

    completed_per_minute = (history.groupBy(F.date_trunc("minute", "finished_at").alias("minute"))
                            .agg(F.count("*").alias("completed")))
    dead_per_minute = (dead.groupBy(F.date_trunc("minute", "dead_at").alias("minute"))
                       .agg(F.count("*").alias("dead")))
    throughput = (completed_per_minute.join(dead_per_minute, "minute", "full_outer")
                  .select("minute", F.coalesce("completed", F.lit(0)).cast("long").alias("completed"),
                          F.coalesce("dead", F.lit(0)).cast("long").alias("dead"))
                  .withColumn("completed_per_second", F.col("completed") / F.lit(60.0))
                  .orderBy("minute"))

    timed = history.select(seconds_between("enqueued_at", "started_at").alias("wait"),
                           seconds_between("started_at", "finished_at").alias("processing"))
    latency = None
    for metric in ("wait", "processing"):
        row = timed.agg(F.lit(metric).alias("metric"), F.count(metric).alias("count"),
                        F.mean(metric).alias("mean"), F.max(metric).alias("max"),
                        F.percentile_approx(metric, list(PERCENTILES), PERCENTILE_ACCURACY).alias("q"))
        row = row.select("metric", "count", "mean", "max",
                         *[F.col("q")[i].alias(f"p{int(p * 100)}") for i, p in enumerate(PERCENTILES)])
        latency = row if latency is None else latency.unionByName(row)

    completed_by_worker = history.groupBy("worker").agg(
        F.count("*").alias("completed"),
        F.sum(F.when(F.col("attempts") > 1, 1).otherwise(0)).alias("retried"),
        F.sum("attempts").alias("completed_attempts"))
    dead_by_worker = dead.groupBy("worker").agg(F.count("*").alias("dead"))
    workers = (completed_by_worker.join(dead_by_worker, "worker", "full_outer")
               .select(F.coalesce("worker", F.lit("(unknown)")).alias("worker"),
                       *[F.coalesce(c, F.lit(0)).cast("long").alias(c)
                         for c in ("completed", "retried", "dead", "completed_attempts")])
               .withColumn("failure_rate", F.when(F.col("completed") + F.col("dead") > 0,
                                                  F.col("dead") / (F.col("completed") + F.col("dead"))))
               .withColumn("retry_rate", F.when(F.col("completed") > 0, F.col("retried") / F.col("completed")))
               .orderBy("worker"))
    return {"throughput": throughput, "latency": latency, "workers": workers}


def draw_chart(path: str, title: str, throughput: list[dict], latency: list[dict], workers: list[dict]) -> str:
    """Three panels: throughput per minute, latency percentiles, failure and retry rate per worker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, middle, bottom) = plt.subplots(3, 1, figsize=(10, 11), constrained_layout=True)
    figure.suptitle(title)
    # One bar per minute on a plain axis: a date axis with one or two bars stretches them across it.
    minutes = [row["minute"].strftime("%H:%M") if row["minute"] else "?" for row in throughput]
    step = max(1, len(minutes) // 15)
    positions = list(range(len(minutes)))
    completed = [row["completed"] for row in throughput]
    top.bar(positions, completed, label="completed")
    top.bar(positions, [row["dead"] for row in throughput], bottom=completed, label="dead", color="tab:red")
    top.set_xticks(positions[::step], minutes[::step])
    top.set_title("throughput per minute (UTC)")
    top.set_ylabel("messages")
    top.legend()
    if not minutes:
        top.text(0.5, 0.5, "no completed or dead messages", ha="center", transform=top.transAxes)

    labels = [f"p{int(p * 100)}" for p in PERCENTILES]
    width = 0.38
    for offset, row in zip((-width / 2, width / 2), latency):
        values = [row[label] or 0.0 for label in labels]
        bars = middle.bar([i + offset for i in range(len(labels))], values, width, label=row["metric"])
        middle.bar_label(bars, fmt="%.3g", fontsize=8)
    middle.set_xticks(range(len(labels)), labels)
    middle.set_ylabel("seconds")
    middle.set_title("wait (enqueued -> started) and processing (started -> finished)")
    middle.legend()

    names = [row["worker"] for row in workers]
    positions = range(len(names))
    highest = max([row["failure_rate"] or 0.0 for row in workers] + [row["retry_rate"] or 0.0 for row in workers]
                  + [0.0])
    bottom.bar([i - width / 2 for i in positions], [row["failure_rate"] or 0.0 for row in workers], width,
               label="failure rate (dead / finished)", color="tab:red")
    bottom.bar([i + width / 2 for i in positions], [row["retry_rate"] or 0.0 for row in workers], width,
               label="retry rate (retried / completed)", color="tab:orange")
    bottom.set_xticks(list(positions), names, rotation=20, ha="right", fontsize=7)
    bottom.set_ylim(0, min(1.0, max(0.05, highest * 1.25)))
    bottom.set_ylabel("share")
    bottom.set_title("per worker")
    bottom.legend()

    filesystem_, inner = filesystem(path)
    filesystem_.create_dir(inner.rsplit("/", 1)[0], recursive=True)
    with filesystem_.open_output_stream(inner) as stream:
        figure.savefig(stream, format="png", dpi=110)
    plt.close(figure)
    return path


def run_report(spark: Any, url: str, catalog: Any, queue: str, output: str, *, since: Any = None) -> dict[str, Any]:
    """Read S.Q_history and S.Q_dead, write the figures to <output>/ and the chart to
    <output>/report.png; return the figures and paths, and log the chart's path."""

    target = QueueTarget.of(url, catalog, queue)
    target.require_kind("work")
    if not target.queue.options.get("history"):
        raise PipelineError(f"{target.name} keeps no history (options: history: false): the report reads "
                            f"completed messages from {target.name}_history")
    started = time.monotonic()
    # Minutes are UTC minutes whatever spark-submit's session says (its default is the JVM's zone).
    previous_zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        with job_description(spark, f"report {target.name}"):
            return _report(spark, url, target, output, since, started)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous_zone)


def _report(spark: Any, url: str, target: QueueTarget, output: str, since: Any, started: float) -> dict[str, Any]:
    from pyspark.sql import functions as F

    split = not target.queue.options.get("client_ids")
    history_table, dead_table = target.table("_history"), target.table("_dead")
    history = pick_columns(read_table(spark, url, history_table, split_on_id=split), HISTORY_COLUMNS, history_table)
    dead = pick_columns(read_table(spark, url, dead_table, split_on_id=split), DEAD_COLUMNS, dead_table,
                        optional=("worker",))
    if since is not None:
        history = history.filter(F.col("finished_at") >= F.lit(since))
        dead = dead.filter(F.col("dead_at") >= F.lit(since))
    history, dead = history.cache(), dead.cache()
    frames = compute(history, dead)
    base = output.rstrip("/")
    for name, frame in frames.items():
        frame.coalesce(1).write.mode("overwrite").parquet(f"{base}/{name}")
    throughput = [row.asDict() for row in frames["throughput"].collect()]
    latency = [row.asDict() for row in frames["latency"].collect()]
    workers = [row.asDict() for row in frames["workers"].collect()]
    chart = draw_chart(f"{base}/report.png", f"{target.name}: {sum(r['completed'] for r in throughput)} "
                       f"completed, {sum(r['dead'] for r in throughput)} dead", throughput, latency, workers)
    history.unpersist()
    dead.unpersist()
    summary = {
        "queue": target.name,
        "completed": sum(r["completed"] for r in throughput),
        "dead": sum(r["dead"] for r in throughput),
        "throughput": throughput,
        "latency": {row["metric"]: row for row in latency},
        "workers": workers,
        "parquet": {name: f"{base}/{name}" for name in frames},
        "chart": chart,
        "seconds": elapsed_since(started),
    }
    log().info("report %s: %s completed, %s dead over %s minute(s); chart %s", target.name,
               summary["completed"], summary["dead"], len(throughput), chart)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipelines.report_job", description=__doc__.splitlines()[0])
    add_queue_arguments(parser, "a work queue with history: true")
    parser.add_argument("--output", help="folder for the Parquet figures and report.png")
    parser.add_argument("--since", help="only messages finished (or dead) at or after this UTC timestamp")
    parser.add_argument("--master", help="Spark master when run with python (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    code, summary = job_main("tablequeue-report", build_parser(), argv, ("catalog", "queue", "output"),
                             lambda spark, args, url: run_report(spark, url, args.catalog, args.queue, args.output,
                                                                 since=args.since))
    if code:
        return code
    for metric, row in summary["latency"].items():
        print(f"{metric:<10} p50 {row['p50']}  p95 {row['p95']}  p99 {row['p99']}  (n={row['count']})")
    for row in summary["workers"]:
        print(f"{row['worker']}: {row['completed']} completed, {row['retried']} retried, {row['dead']} dead, "
              f"failure rate {row['failure_rate']}, retry rate {row['retry_rate']}")
    print(f"report chart: {summary['chart']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
