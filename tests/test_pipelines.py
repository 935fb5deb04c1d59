"""The PySpark pipelines against the throwaway PostgreSQL: enqueue, drain, report, demo.

One local SparkSession for the module, master local[2,4]: two cores, and a failed task is retried
up to 4 times, so a crash injected into a task's first attempt is retried the way a cluster would.
The queue state is checked through the database (the contract's history and dead-letter tables, and
the queue table for depth), the figures of the report against plain Python over the same rows.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
if shutil.which("java") is None:
    pytest.skip("no Java runtime: PySpark needs one (make setup installs openjdk-17-jre-headless)",
                allow_module_level=True)

import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from pipelines.common import MAX_BATCH, LOCAL_DEFAULTS, PipelineError, build_session, jdbc_options, log  # noqa: E402
from pipelines.demo import run_spark_demo  # noqa: E402
from pipelines.drain_job import run_drain  # noqa: E402
from pipelines.faults import SimulatedCrash, crash_plan  # noqa: E402
from pipelines.enqueue_job import run_enqueue  # noqa: E402
from pipelines.report_job import PERCENTILE_ACCURACY, run_report  # noqa: E402
from tablequeue.catalog import Catalog, load_catalog, parse_catalog  # noqa: E402
from tablequeue.deploy import deploy  # noqa: E402
from tablequeue.engines import connect, dialect_for  # noqa: E402
from tablequeue.render import render_catalog  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRANSFORM = "pipelines.transforms:uppercase_name_or_fail"
CRASH = "pipelines.faults:crash_first_attempt"


# -- fixtures --------------------------------------------------------------------------------------
# The tests' data is tiny and every Spark job here is mostly fixed cost (JIT, planning, code
# generation) on a 2-core machine: the quick JIT tier only, no whole-stage code generation, no
# adaptive re-planning, two shuffle partitions. What the jobs compute does not change.
SMALL_DATA_CONF = {
    "spark.driver.extraJavaOptions": f"{LOCAL_DEFAULTS['spark.driver.extraJavaOptions']} "
                                     "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
}


@contextlib.contextmanager
def logged_by_the_pipelines(level: int = logging.NOTSET) -> Iterator[list[logging.LogRecord]]:
    """The records the pipelines' logger emits at `level` or above while the block runs."""
    logged: list[logging.LogRecord] = []
    listener = logging.Handler(level)
    listener.emit = logged.append  # type: ignore[method-assign]
    log().addHandler(listener)
    try:
        yield logged
    finally:
        log().removeHandler(listener)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_session("tablequeue-tests", master="local[2,4]", conf=SMALL_DATA_CONF)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def pg(pg_url: str) -> Iterator["Postgres"]:
    db = Postgres(pg_url)
    yield db
    db.drop_all()


class Postgres:
    """Deploys queues into fresh schemas (as tests/conftest.py's deploy_queues does) and reads
    tables back with psycopg, independently of Spark."""

    def __init__(self, url: str):
        self.url = url
        self.schemas: list[str] = []

    def deploy(self, *queues: dict, schema: str | None = None) -> Catalog:
        schema = schema or f"p_{secrets.token_hex(4)}"
        catalog = parse_catalog({"schema": schema, "queues": list(queues)}, f"<pipelines test {schema}>")
        units = [u for f in render_catalog(catalog, "postgres") for u in f.units]
        conn = connect(self.url, autocommit=True)
        try:
            deploy(conn, dialect_for("postgres"), schema, units)
        finally:
            conn.close()
        self.schemas.append(schema)
        return catalog

    def rows(self, sql: str, *params: Any) -> list[dict]:
        conn = connect(self.url, autocommit=True)
        try:
            cursor = conn.execute(sql, params or None)
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]
        finally:
            conn.close()

    def scalar(self, sql: str, *params: Any) -> Any:
        return next(iter(self.rows(sql, *params)[0].values()))

    def drop_all(self) -> None:
        conn = connect(self.url, autocommit=True)
        try:
            for schema in self.schemas:
                dialect_for("postgres").drop_schema(conn, schema)
        finally:
            conn.close()


def work_queue(name: str = "jobs", **options: Any) -> dict:
    return {"name": name, "kind": "work", "payload": "json",
            "options": {"max_attempts": 3, "lease_seconds": 30, "dedupe": True, "history": True, **options}}


def customers(spark: Any, path: Path, rows: int, files: int, poison_every: int = 0, flaky_every: int = 0) -> str:
    """A Parquet dataset of `rows` customers in `files` files; every poison_every-th is refused by
    the test transform on every attempt, every flaky_every-th on its first attempt only."""
    poison = (F.col("id") % poison_every == 0) if poison_every else F.lit(False)
    flaky = (F.col("id") % flaky_every == 1) if flaky_every else F.lit(False)
    (spark.range(0, rows, 1, files)
     .select("id", F.concat(F.lit("customer "), F.col("id").cast("string")).alias("name"),
             (F.col("id") % 1000 / F.lit(10.0)).alias("amount"), poison.alias("poison"), flaky.alias("flaky"))
     .write.mode("overwrite").parquet(str(path)))
    return str(path)


def table(catalog: Catalog, name: str, suffix: str = "") -> str:
    return f'"{catalog.schema}"."{name}{suffix}"'


# -- enqueue ---------------------------------------------------------------------------------------
def test_enqueue_100k_rows_twice_leaves_100k_messages(spark, pg, tmp_path):
    catalog = pg.deploy(work_queue("bulk"))
    dataset = spark.read.parquet(customers(spark, tmp_path / "customers", 100_000, files=8)).repartition(8)

    first = run_enqueue(spark, pg.url, catalog, "bulk", dataset, key="id", max_connections=8, batch_size=1000)
    assert (first["rows"], first["enqueued"], first["duplicates"], first["partitions"]) == (100_000, 100_000, 0, 8)
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'bulk')}") == 100_000

    second = run_enqueue(spark, pg.url, catalog, "bulk", dataset, key="id", max_connections=8, batch_size=1000)
    assert (second["rows"], second["enqueued"], second["duplicates"]) == (100_000, 0, 100_000)
    depth = pg.rows(f"SELECT count(*) AS n, count(DISTINCT dedupe_key) AS keys, "
                    f"count(DISTINCT payload->>'id') AS ids FROM {table(catalog, 'bulk')}")[0]
    assert depth == {"n": 100_000, "keys": 100_000, "ids": 100_000}
    # The payload is the row's JSON, every column.
    sample = pg.scalar(f"SELECT payload FROM {table(catalog, 'bulk')} WHERE payload->>'id' = '4242'")
    assert sample == {"id": 4242, "name": "customer 4242", "amount": 24.2, "poison": False, "flaky": False}


def test_enqueue_column_mapping_and_key_columns(spark, pg, tmp_path):
    catalog = pg.deploy(work_queue("mapped"))
    dataset = customers(spark, tmp_path / "mapped", 500, files=2)
    summary = run_enqueue(spark, pg.url, catalog, "mapped", dataset, columns="id,name:customer_name", key="id")
    assert summary["enqueued"] == 500
    rows = pg.rows(f"SELECT dedupe_key, payload FROM {table(catalog, 'mapped')} ORDER BY id")
    assert len({r["dedupe_key"] for r in rows}) == 500 and all(len(r["dedupe_key"]) == 64 for r in rows)
    assert all(set(r["payload"]) == {"id", "customer_name"} for r in rows)
    assert all(r["payload"]["customer_name"] == f"customer {r['payload']['id']}" for r in rows)
    # A CSV of the same rows (its id column inferred as int, not bigint) with the same key: all duplicates.
    csv = tmp_path / "mapped.csv"
    spark.read.parquet(dataset).write.option("header", "true").csv(str(csv))
    again = run_enqueue(spark, pg.url, catalog, "mapped", str(csv), fmt="csv", columns="id,name:customer_name",
                        key="id")
    assert (again["enqueued"], again["duplicates"]) == (0, 500)


def test_enqueue_task_retried_by_spark_enqueues_nothing_twice(spark, pg, tmp_path):
    catalog = pg.deploy(work_queue("retried"))
    dataset = spark.read.parquet(customers(spark, tmp_path / "retried", 20_000, files=4)).repartition(4)
    # Attempt 0 of partition 1 dies after its 2nd batch of 1000 was committed; Spark runs it again.
    summary = run_enqueue(spark, pg.url, catalog, "retried", dataset, key="id", max_connections=4,
                          batch_size=1000, probe=CRASH, probe_args={"at": "enqueued", "partition": 1, "batch": 2})
    assert summary["retried_partitions"] == [1]
    assert summary["rows"] == 20_000
    # The retry re-sent the 2,000 rows the dead attempt had committed: they came back as duplicates.
    assert (summary["enqueued"], summary["duplicates"]) == (18_000, 2_000)
    assert pg.scalar(f"SELECT count(DISTINCT payload->>'id') FROM {table(catalog, 'retried')}") == 20_000
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'retried')}") == 20_000


def message_keys(spark: Any, rows: list[tuple], schema: str, key: list[str]) -> list[str]:
    from pipelines.sources import to_messages

    frame = spark.createDataFrame(rows, schema)
    return [r["dedupe_key"] for r in to_messages(frame, key).orderBy("payload").collect()]


def test_keys_are_the_same_under_other_time_zones_and_column_orders(spark):
    """The key is made in the JVM from the instant (not a wall-clock reading) and the named columns
    (not their order): another session time zone (what an executor's local zone was to Python's
    naive datetimes), another column order and another order of the key's names give the same keys;
    the autumn hour that a New York wall clock shows twice gives two keys."""
    first = datetime(2024, 11, 3, 5, 30, tzinfo=timezone.utc)     # 01:30 EDT
    second = datetime(2024, 11, 3, 6, 30, tzinfo=timezone.utc)    # 01:30 EST, the same wall clock
    rows = [(1, "a", first), (2, "b", second)]
    previous = spark.conf.get("spark.sql.session.timeZone")
    try:
        spark.conf.set("spark.sql.session.timeZone", "America/New_York")
        in_new_york = message_keys(spark, rows, "id long, name string, at timestamp", ["id", "at"])
        spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
        reordered = message_keys(spark, [(at, name, i) for i, name, at in rows],
                                 "at timestamp, name string, id long", ["at", "id"])
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    assert in_new_york == reordered
    assert len(set(in_new_york)) == 2
    # Only the key columns count: another value elsewhere in the row keeps the key.
    renamed = message_keys(spark, [(1, "z", first)], "id long, name string, at timestamp", ["id", "at"])
    assert renamed == in_new_york[:1]


def test_keys_ignore_zone_scale_sign_of_zero_and_map_order(spark):
    """A timestamp without zone (here in New York's spring gap), a decimal at two scales, zero and
    negative zero, a map built in two orders, a column name with a backtick: each pair is one key."""
    previous = spark.conf.get("spark.sql.session.timeZone")
    at = datetime(2024, 3, 10, 2, 30)
    ntz = []
    try:
        for zone in ("UTC", "America/New_York"):
            spark.conf.set("spark.sql.session.timeZone", zone)
            ntz += message_keys(spark, [(1, at)], "id long, at timestamp_ntz", ["id", "at"])
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    decimals = [to_messages_by(spark.sql(f"SELECT CAST(1.5 AS decimal({p},{q})) AS d"), ["d"])[0]
                for p, q in ((10, 2), (12, 4), (2, 1))]
    zeros = message_keys(spark, [(0.0,), (-0.0,)], "x double", ["x"])
    maps = [to_messages_by(spark.sql(f"SELECT map({entries}) AS m"), ["m"])[0]
            for entries in ("'a', 1, 'b', 2", "'b', 2, 'a', 1")]
    ticked = message_keys(spark, [(1,), (2,)], "`odd``name` long", ["odd`name"])
    assert len(set(ntz)) == 1 and len(set(decimals)) == 1 and len(set(zeros)) == 1 and len(set(maps)) == 1
    assert len(set(ticked)) == 2
    # Still values, not types: 1.5 and 1.25 differ, and so do 10 and 1 (no trailing zero of an integer goes).
    assert to_messages_by(spark.sql("SELECT CAST(1.25 AS decimal(10,2)) AS d"), ["d"])[0] != decimals[0]
    assert len(set(to_messages_by(spark.sql("SELECT CAST(10 AS decimal(10,0)) AS d UNION ALL "
                                            "SELECT CAST(1 AS decimal(10,0))"), ["d"]))) == 2


def to_messages_by(frame: Any, key: list[str]) -> list[str]:
    from pipelines.sources import to_messages

    return [r["dedupe_key"] for r in to_messages(frame, key).orderBy("payload").collect()]


def test_nested_nan_and_infinity_are_refused_by_column(spark):
    from pipelines.sources import to_messages

    frame = spark.createDataFrame(
        [(1, (float("nan"),), [1.0], {"k": 1.0}), (2, (1.0,), [float("inf")], {"k": 1.0}),
         (3, (1.0,), [1.0], {"k": float("-inf")}), (4, (None,), None, {"k": 2.0})],
        "id long, s struct<x: double>, a array<double>, m map<string, double>")
    refused = {r["id"]: r["refused"] for r in to_messages(frame, "id").select(
        F.get_json_object("payload", "$.id").cast("long").alias("id"), "refused").collect()}
    reason = "holds a value that is NaN or infinite (JSON has neither)"
    assert refused == {1: f"column s {reason}", 2: f"column a {reason}", 3: f"column m {reason}", 4: None}


def test_writer_refuses_nan_rows_by_name_and_writes_the_rest(spark, pg, tmp_path):
    catalog = pg.deploy(work_queue("nan"))
    frame = spark.createDataFrame([(i, float("nan") if i == 3 else i / 2) for i in range(10)], "id long, amount double")
    with pytest.raises(PipelineError, match=r"1 row\(s\) refused and not enqueued, the other 9 written; "
                                            r"first: key [0-9a-f]{16}\.\.\.: column amount is NaN or infinite"):
        run_enqueue(spark, pg.url, catalog, "nan", frame, key="id")
    assert sorted(r["id"] for r in pg.rows(f"SELECT (payload->>'id')::int AS id FROM {table(catalog, 'nan')}")) \
        == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_writer_caps_connections_and_keeps_a_ledger_of_what_it_sent(spark, pg, tmp_path):
    """Re-running an input after some of it was consumed: dedupe covers only the messages still in
    the queue, so the consumed rows would come back as new messages; the ledger leaves them out."""
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("ledgered"))
    frame = spark.range(0, 400, 1, 4).selectExpr("id", "concat('c', id) AS name")
    ledger = str(tmp_path / "ledger")
    first = run_enqueue(spark, pg.url, catalog, "ledgered", frame, key="id", max_connections=2, ledger=ledger)
    assert (first["enqueued"], first["partitions"]) == (400, 2)
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "ledgered")
        consumed = client.dequeue(100, worker="consumer")
        assert all(r["completed"] for r in client.complete_batch(consumed, "consumer"))
    finally:
        conn.close()
    with_ledger = run_enqueue(spark, pg.url, catalog, "ledgered", frame, key="id", max_connections=2, ledger=ledger)
    assert (with_ledger["rows"], with_ledger["enqueued"]) == (0, 0)
    without = run_enqueue(spark, pg.url, catalog, "ledgered", frame, key="id", max_connections=2)
    assert (without["enqueued"], without["duplicates"]) == (100, 300)
    # An input of more partitions than maxConnections is refused before it connects, not shuffled.
    from pipelines.sources import target_options
    from pipelines.common import QueueTarget
    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    with pytest.raises(Exception, match="partition [1-3] of the input is beyond maxConnections=1"):
        (to_messages_of(frame).write.format("tablequeue").mode("append")
         .options(**target_options(QueueTarget.of(pg.url, catalog, "ledgered"), str(url_file)))
         .option("maxConnections", "1").save())


def to_messages_of(frame: Any) -> Any:
    from pipelines.sources import to_messages

    return to_messages(frame, "id")


def test_to_messages_refuses_a_ledger_whose_path_has_glob_characters(spark, tmp_path):
    """A ledger named ledger{a,b}, holding none of the input's keys, next to a folder ledgera holding
    all of them: Spark's reader would glob the name to ledgera and dedupe against the wrong ledger.
    to_messages refuses it, naming it as given and as qualified (before: every row was left out)."""
    import pyarrow as pa

    from pipelines.sources import to_messages

    frame = spark.range(0, 3, 1, 1).selectExpr("id", "concat('c', id) AS name")
    to_messages(frame, "id").select("dedupe_key").write.parquet(str(tmp_path / "ledgera"))
    (tmp_path / "ledger{a,b}").mkdir()
    pq.write_table(pa.table({"dedupe_key": ["another input's key"]}), tmp_path / "ledger{a,b}" / "part-0.parquet")
    ledger = str(tmp_path / "ledger{a,b}")
    with pytest.raises(PipelineError, match=rf"^ledger {re.escape(ledger)} \(file:{re.escape(ledger)}\) holds "
                                            rf"\{{ \}}: Spark's reader takes a path with any of"):
        to_messages(frame, "id", ledger=ledger).count()


def test_drain_refuses_an_output_whose_path_has_glob_characters(spark, pg, tmp_path):
    """A drain output out[1]: the finalisation reads the staged rows back through Spark, which would
    glob the name (out1). run_drain refuses it before it leases anything, naming it (before: the run
    completed the messages, then its finalisation failed with PATH_NOT_FOUND)."""
    catalog = pg.deploy(work_queue("drainglob"))
    enqueue_numbered(pg, catalog, "drainglob", 3)
    output = str(tmp_path / "out[1]")
    with pytest.raises(PipelineError, match=rf"^drain [a-z0-9_]+\.drainglob: output {re.escape(output)} "
                                            rf"\(file:{re.escape(output)}\) holds \[ \]: "):
        run_drain(spark, pg.url, catalog, "drainglob", TRANSFORM, output, tasks=1, time_budget_seconds=60,
                  idle_seconds=1)
    assert not (tmp_path / "out[1]").exists()
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'drainglob', '_history')}") == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'drainglob')}") == 3


def test_enqueue_refuses_a_queue_without_dedupe(spark, pg, tmp_path):
    catalog = parse_catalog({"schema": "nodedupe", "queues": [
        {"name": "plain", "kind": "work", "payload": "json", "options": {"history": True}}]})
    with pytest.raises(PipelineError, match=r"nodedupe\.plain has dedupe: false.*dedupe: true"):
        run_enqueue(spark, pg.url, catalog, "plain", str(tmp_path / "never-read"), key="id")


# -- drain -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def drained(spark, pg, tmp_path_factory) -> dict:
    """5,000 messages, every 50th poison (dead after 3 attempts), every 10th flaky (completed on
    its 2nd attempt), drained by 2 tasks; shared by the drain and the report tests."""
    catalog = pg.deploy(work_queue("emails"))
    folder = tmp_path_factory.mktemp("drain")
    dataset = customers(spark, folder / "input", 5_000, files=4, poison_every=50, flaky_every=10)
    enqueued = run_enqueue(spark, pg.url, catalog, "emails", dataset, key="id")
    started = datetime.now(timezone.utc)
    summary = run_drain(spark, pg.url, catalog, "emails", TRANSFORM, str(folder / "output"), tasks=2,
                        batch_size=100, lease_seconds=30, time_budget_seconds=240)
    return {"catalog": catalog, "enqueued": enqueued, "summary": summary, "folder": folder, "started": started}


def output_rows(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_drain_leaves_one_output_row_per_completed_message(drained, pg):
    catalog, summary = drained["catalog"], drained["summary"]
    assert drained["enqueued"]["enqueued"] == 5_000
    history = pg.rows(f"SELECT id, worker, attempts FROM {table(catalog, 'emails', '_history')}")
    dead = pg.rows(f"SELECT id, payload, attempts, last_error FROM {table(catalog, 'emails', '_dead')}")
    output = output_rows(summary["output"])

    # Nothing lost: every message is completed or dead; the queue is empty.
    assert len(history) + len(dead) == 5_000
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'emails')}") == 0
    assert len(dead) == 100 and all(d["payload"]["poison"] for d in dead)
    assert all(d["attempts"] == 3 and "PoisonMessage" in d["last_error"] for d in dead)
    # Exactly one output row per completed message, and only for completed ones.
    ids = Counter(row["id"] for row in output)
    assert len(output) == len(ids) == len(history) == summary["completed"] == 4_900
    assert set(ids) == {str(h["id"]) for h in history}
    # One worker name per task attempt, under the run's id.
    assert {h["worker"] for h in history} == {t["worker"] for t in summary["tasks"]}
    assert all(w.startswith(f"spark-{summary['run_id']}-") for w in {h["worker"] for h in history})
    # The transform's result is what was written; flaky messages took two attempts.
    for row in output:
        result = json.loads(row["result"])
        assert result["name"] == f"CUSTOMER {result['id']}"
        assert row["attempts"] == (2 if result["flaky"] else 1)
    assert summary["dead"] == 100 and summary["retrying"] == 500 + 2 * 100


def test_drain_task_killed_between_its_completes_and_retried_by_spark_leaves_no_duplicate(spark, pg, tmp_path):
    """Attempt 0 of task 0 is killed (os._exit: the Python worker dies, the database sees the
    connection drop) in its 2nd batch after 20 of its 50 completes, so the batch's completes roll back
    and the retry does the whole batch again. The other two crash points are proven by the tests
    below: after staging (doomed, twice) and after the completes committed but before their marker
    (twice with history, nohist without), so each point's Spark retry is paid for once."""
    catalog = pg.deploy(work_queue("crashy"))
    dataset = customers(spark, tmp_path / "input", 1_000, files=2)
    run_enqueue(spark, pg.url, catalog, "crashy", dataset, key="id")
    summary = run_drain(spark, pg.url, catalog, "crashy", "pipelines.transforms:uppercase_name",
                        str(tmp_path / "output"), tasks=2, batch_size=50, lease_seconds=30,
                        time_budget_seconds=180, probe=CRASH,
                        probe_args={"at": "completed", "partition": 0, "batch": 2, "after_completes": 20,
                                    "hold": str(tmp_path / "hold")})
    assert summary["retried_tasks"] == [0], "the crash did not happen: the test proves nothing"
    history = pg.rows(f"SELECT id FROM {table(catalog, 'crashy', '_history')}")
    output = output_rows(summary["output"])
    assert len(history) == 1_000
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'crashy', '_dead')}") == 0
    assert len(output) == len({row["id"] for row in output}) == 1_000
    assert {row["id"] for row in output} == {str(h["id"]) for h in history}
    # The killed attempt's results were staged but its completes rolled back: the retry took its
    # leases back (released, attempt returned) and did them again.
    assert summary["staged_rows"] >= 1_050
    assert summary["confirmed_unmarked"] == 0 and summary["released"] >= 50


def test_drain_result_staged_for_a_message_that_later_dies_is_not_output(spark, pg, tmp_path):
    """Attempt 0 of the one task completes its 1st batch, dies after staging its 2nd; the retried
    attempt takes those 50 messages back (released, attempt given back), leases them again and its
    transform refuses them, and everything else (the downstream went away with the first attempt):
    with max_attempts 1 they end dead. Their results staged before the crash were never completed:
    none of them may reach the output. One task: with two, the other task could take the released
    50 before the retry leased them again (CI saw it), and the staged results would then belong to
    messages completed by the run, a different case."""
    catalog = pg.deploy(work_queue("doomed", max_attempts=1))
    run_enqueue(spark, pg.url, catalog, "doomed", customers(spark, tmp_path / "input", 600, files=2), key="id")
    summary = run_drain(spark, pg.url, catalog, "doomed", "pipelines.faults:first_task_attempt_only",
                        str(tmp_path / "output"), tasks=1, batch_size=50, lease_seconds=30,
                        time_budget_seconds=180, probe=CRASH, probe_args={"at": "staged", "batch": 2})
    assert summary["retried_tasks"] == [0]
    dead = {d["id"] for d in pg.rows(f"SELECT id FROM {table(catalog, 'doomed', '_dead')}")}
    history = {h["id"] for h in pg.rows(f"SELECT id FROM {table(catalog, 'doomed', '_history')}")}
    assert len(history) == 50 and len(dead) == 550 and not dead & history
    output = output_rows(summary["output"])
    assert len(output) == len(history) and {row["id"] for row in output} == {str(h) for h in history}


def test_drain_task_killed_twice_keeps_one_row_per_message(spark, pg, tmp_path):
    """Attempt 0 of task 0 dies after staging its 2nd batch; attempt 1 takes its predecessor's 50
    leases back (released, recorded), leases a batch (some of them again), stages it, commits its
    completes and dies before the marker. Attempt 0's rows are traced (their leases were released) and
    left out; attempt 1's have no trace after staging: confirmed. One row per message."""
    catalog = pg.deploy(work_queue("twice"))
    run_enqueue(spark, pg.url, catalog, "twice", customers(spark, tmp_path / "input", 600, files=2), key="id")
    summary = run_drain(spark, pg.url, catalog, "twice", "pipelines.transforms:uppercase_name",
                        str(tmp_path / "output"), tasks=2, batch_size=50, lease_seconds=150,
                        time_budget_seconds=180, probe="pipelines.faults:crash_plan",
                        probe_args={"plan": [{"at": "staged", "attempt": 0, "batch": 2},
                                             {"at": "committed", "attempt": 1, "batch": 1}],
                                    "hold": str(tmp_path / "hold")})
    assert [(t["partition"], t["attempt"]) for t in summary["tasks"]] == [(0, 2), (1, 0)]
    # Attempt 1's first batch, committed and unmarked (how many of attempt 0's released messages it
    # leased again, and how many task 1 took first, is a race).
    assert summary["confirmed_unmarked"] > 0
    output = output_rows(summary["output"])
    assert len(output) == len({row["id"] for row in output}) == 600
    assert {row["id"] for row in output} == {str(h["id"]) for h in pg.rows(
        f"SELECT id FROM {table(catalog, 'twice', '_history')}")}


def test_drain_without_history_confirms_a_batch_completed_just_before_a_crash(spark, pg, tmp_path):
    """A batch completed just before a crash, whose marker was never written, is confirmed from the
    run's own records (no later trace of its leases), not from the history table: a queue without
    history, and a consumer login that may not read it, lose nothing."""
    catalog = pg.deploy(work_queue("nohist", history=False))
    run_enqueue(spark, pg.url, catalog, "nohist", customers(spark, tmp_path / "input", 300, files=1), key="id")
    summary = run_drain(spark, pg.url, catalog, "nohist", "pipelines.transforms:uppercase_name",
                        str(tmp_path / "output"), tasks=1, batch_size=50, lease_seconds=30,
                        time_budget_seconds=120, probe=CRASH, probe_args={"at": "committed", "batch": 2})
    assert summary["retried_tasks"] == [0]
    assert summary["confirmed_unmarked"] == 50
    output = output_rows(summary["output"])
    assert len(output) == len({row["id"] for row in output}) == 300
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'nohist')}") == 0


def test_crash_plan_holds_the_other_tasks_until_the_planned_crash(tmp_path):
    """Task 1 may not run ahead of task 0's planned crash: it waits after staging its first batch
    until the crash has left its file, and then goes on; task 0 is never held."""
    hold = tmp_path / "hold"
    plan = [{"at": "staged", "partition": 0, "batch": 2}]
    info = {"partition": 1, "attempt": 0, "batch": 1, "completed_in_batch": 0}
    crash_plan("staged", info, plan=plan, how="raise", hold=str(hold), hold_seconds=0.3)
    assert not (hold / "crashed").exists()           # waited the full 0.3 s: nothing had crashed

    crashes: list[SimulatedCrash] = []

    def task_0_reaches_its_crash() -> None:
        try:
            crash_plan("staged", {**info, "partition": 0, "batch": 2}, plan=plan, how="raise", hold=str(hold))
        except SimulatedCrash as crash:
            crashes.append(crash)

    timer = threading.Timer(0.2, task_0_reaches_its_crash)
    timer.start()
    started = time.monotonic()
    crash_plan("staged", info, plan=plan, how="raise", hold=str(hold), hold_seconds=30)
    timer.join()
    assert time.monotonic() - started < 10 and (hold / "crashed").exists() and len(crashes) == 1
    # The crashing task never waits; the others' later batches are not held.
    started = time.monotonic()
    with pytest.raises(SimulatedCrash):
        crash_plan("staged", {**info, "partition": 0, "batch": 2}, plan=plan, how="raise",
                   hold=str(tmp_path / "elsewhere"), hold_seconds=30)
    crash_plan("staged", {**info, "batch": 2}, plan=plan, how="raise", hold=str(tmp_path / "elsewhere"),
               hold_seconds=30)
    assert time.monotonic() - started < 10


def test_crash_plan_of_two_crashes_holds_the_other_tasks_until_the_second(tmp_path):
    """A plan that crashes attempt 0 and then its retry: the other tasks wait for both (with only the
    first, a slow retry found the queue drained by them and never reached its crash)."""
    hold = tmp_path / "hold"
    plan = [{"at": "staged", "attempt": 0, "batch": 2}, {"at": "committed", "attempt": 1, "batch": 1}]
    other = {"partition": 1, "attempt": 0, "batch": 1, "completed_in_batch": 0}
    with pytest.raises(SimulatedCrash):
        crash_plan("staged", {**other, "partition": 0, "batch": 2}, plan=plan, how="raise", hold=str(hold))
    started = time.monotonic()
    crash_plan("staged", other, plan=plan, how="raise", hold=str(hold), hold_seconds=0.3)
    assert time.monotonic() - started >= 0.3          # the first crash alone does not free it

    def the_retry_reaches_its_crash() -> None:
        with pytest.raises(SimulatedCrash):
            crash_plan("committed", {**other, "partition": 0, "attempt": 1}, plan=plan, how="raise", hold=str(hold))

    timer = threading.Timer(0.2, the_retry_reaches_its_crash)
    timer.start()
    started = time.monotonic()
    crash_plan("staged", other, plan=plan, how="raise", hold=str(hold), hold_seconds=30)
    timer.join()
    assert time.monotonic() - started < 10 and sorted(p.name for p in hold.iterdir()) == ["crashed", "crashed-2"]


class OneClient:
    """A Reconnecting that hands out the one client it was given."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def client(self) -> Any:
        return self._client

    def reset(self) -> None:
        return None

    def close(self) -> None:
        return None


class StagingWatchingClient:
    """A work-queue client with one batch, which records what the staging folder held when the task
    first asked for a lease."""

    def __init__(self, staging: Path) -> None:
        self.staging, self.folders_at_first_lease, self.batches = staging, None, [[
            {"id": 1, "payload": {"id": 1, "name": "a", "flaky": False, "poison": False}, "attempts": 1,
             "enqueued_at": datetime.now(timezone.utc), "lease_token": None}]]

    def dequeue(self, batch_size: int, worker: str, lease_seconds: int | None) -> list[dict]:
        if self.folders_at_first_lease is None:
            self.folders_at_first_lease = sorted(str(p.relative_to(self.staging))
                                                 for p in self.staging.rglob("*") if p.is_dir())
        return self.batches.pop() if self.batches else []

    def complete_batch(self, acks: list[dict], worker: str) -> list[dict]:
        return [{"id": ack["id"], "completed": True} for ack in acks]

    def wait(self, wait_ms: int) -> bool:
        return False


def test_drain_task_makes_its_staging_folders_before_its_first_lease(tmp_path, monkeypatch):
    """The task's one-time costs (the Parquet writer, its folders) come before it holds a lease: on a
    loaded machine they took longer than a 30 s lease, and the first batch was then done twice."""
    from contextlib import nullcontext

    import pipelines.drain_job as drain_job

    staging = tmp_path / "staging"
    client = StagingWatchingClient(staging)
    target = drain_job.QueueTarget.of("postgresql://nobody@127.0.0.1:1/none",
                                      parse_catalog({"schema": "s", "queues": [work_queue("jobs")]}), "jobs")
    monkeypatch.setattr(drain_job, "Reconnecting", lambda target: OneClient(client))
    monkeypatch.setattr(drain_job, "transaction", lambda c: nullcontext())
    config = drain_job.DrainConfig(run_id="r", launch="l", staging=str(staging),
                                   transform="pipelines.transforms:uppercase_name")
    counts = drain_job.drain_partition(target, config)
    assert counts["completed"] == 1 and counts["stopped"] == "drained"
    assert client.folders_at_first_lease == [
        "markers", "markers/launch=l", "markers/launch=l/part=0", "markers/launch=l/part=0/attempt=0",
        "results", "results/launch=l", "results/launch=l/part=0", "results/launch=l/part=0/attempt=0"]


def test_staged_files_are_only_finished_batch_files(tmp_path):
    from pipelines.drain_job import _has_staged_files

    root = tmp_path / "results"
    assert not _has_staged_files(str(root))
    for attempt in ("launch=l/part=0/attempt=0", "launch=l/part=1/attempt=0", "launch=l/part=1/attempt=1"):
        (root / attempt).mkdir(parents=True)
    assert not _has_staged_files(str(root))                  # idle tasks' folders
    (root / "launch=l/part=1/attempt=0/_tmp-batch-000001-0a1b2c3d.parquet").write_bytes(b"PAR1")
    assert not _has_staged_files(str(root))                  # a write its task never finished
    (root / "launch=l/part=1/attempt=1/batch-000001.parquet").write_bytes(b"PAR1")
    assert _has_staged_files(str(root))


def staging_folders(output: Path) -> list[str]:
    return sorted(str(p.relative_to(output)) for p in output.glob("_staging/*/*/launch=*/part=[0-9]*/attempt=*"))


def test_drain_of_an_empty_queue_writes_an_empty_output(spark, pg, tmp_path):
    """Both tasks find nothing: their staging folders stay empty, and the output is empty, not an error."""
    catalog = pg.deploy(work_queue("idle"))
    summary = run_drain(spark, pg.url, catalog, "idle", "pipelines.transforms:uppercase_name",
                        str(tmp_path / "output"), tasks=2, batch_size=10, time_budget_seconds=60,
                        keep_staging=True)
    assert summary["completed"] == summary["staged_rows"] == 0
    assert [t["stopped"] for t in summary["tasks"]] == ["drained", "drained"]
    assert output_rows(summary["output"]) == []
    assert len(staging_folders(tmp_path / "output")) == 4     # results and markers of both tasks, empty
    assert not [p for p in (tmp_path / "output").glob("_staging/**/*.parquet")]


def test_drain_keeps_the_one_staged_result_next_to_idle_tasks_folders(spark, pg, tmp_path):
    """One message, three tasks: two find nothing and leave empty folders beside the third's files."""
    catalog = pg.deploy(work_queue("lonely"))
    run_enqueue(spark, pg.url, catalog, "lonely", customers(spark, tmp_path / "input", 1, files=1), key="id")
    summary = run_drain(spark, pg.url, catalog, "lonely", "pipelines.transforms:uppercase_name",
                        str(tmp_path / "output"), tasks=3, batch_size=10, time_budget_seconds=60,
                        keep_staging=True)
    assert len(staging_folders(tmp_path / "output")) == 6
    assert summary["completed"] == summary["staged_rows"] == 1
    assert [json.loads(row["result"])["name"] for row in output_rows(summary["output"])] == ["CUSTOMER 0"]


def test_drain_refuses_a_destructive_queue(spark, pg, tmp_path):
    catalog = parse_catalog({"schema": "destructive", "queues": [{"name": "h", "kind": "heap"}]})
    with pytest.raises(PipelineError, match="'heap' queue; this job needs a queue of kind 'work'"):
        run_drain(spark, pg.url, catalog, "h", TRANSFORM, str(tmp_path / "out"))


# -- report ----------------------------------------------------------------------------------------
def approximate_percentile_bounds(values: list[float], fraction: float, accuracy: int) -> tuple[float, float]:
    """The values percentile_approx may answer: those whose rank is within count / accuracy of the
    exact percentile's rank."""
    ordered = sorted(values)
    slack = math.ceil(len(ordered) / accuracy)
    position = (len(ordered) - 1) * fraction
    return (ordered[max(0, math.floor(position) - slack)], ordered[min(len(ordered) - 1, math.ceil(position) + slack)])


def test_report_reads_times_without_a_zone_as_utc_whatever_the_jvms_zone(spark, pg):
    """SQL Server's datetime2 columns hold UTC without a zone. Spark's JDBC reader takes such a
    time in the JVM's default zone, which spark-submit leaves at the host's: read_table reads them
    as the UTC times they are (SQL Server's default). A PostgreSQL `timestamp` column stands in for
    datetime2, read with the JVM in Paris (summer: UTC+2); the plain read shows the shift the test
    would catch."""
    from pipelines.report_job import read_table

    schema = f"p_{secrets.token_hex(4)}"
    conn = connect(pg.url, autocommit=True)
    try:
        conn.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.naive (id bigint, finished_at timestamp); "
                     f"INSERT INTO {schema}.naive VALUES (1, '2026-07-01 12:00:00'), (2, '2026-12-01 12:00:00.123456')")
    finally:
        conn.close()
    pg.schemas.append(schema)
    jvm_zone = spark.sparkContext._jvm.java.util.TimeZone
    utc = jvm_zone.getDefault()
    jvm_zone.setDefault(jvm_zone.getTimeZone("Europe/Paris"))
    try:
        def read(naive_utc: bool) -> list[int]:
            frame = read_table(spark, pg.url, f"{schema}.naive", split_on_id=False, naive_utc=naive_utc)
            return [r["micros"] for r in frame.orderBy("id").select(F.unix_micros("finished_at").alias("micros")).collect()]
        exact = [int(datetime(2026, 7, 1, 12, tzinfo=timezone.utc).timestamp()) * 1_000_000,
                 int(datetime(2026, 12, 1, 12, tzinfo=timezone.utc).timestamp()) * 1_000_000 + 123456]
        assert read(naive_utc=True) == exact
        hour = 3_600_000_000
        assert read(naive_utc=False) == [exact[0] - 2 * hour, exact[1] - hour]
        spark.conf.set("spark.sql.session.timeZone", "Europe/Paris")
        with pytest.raises(PipelineError, match="session's time zone must be UTC"):
            read(naive_utc=True)
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        jvm_zone.setDefault(utc)


def test_report_figures_match_an_independent_computation(spark, pg, drained):
    catalog = drained["catalog"]
    out = drained["folder"] / "report"
    # The drain took seconds: spread its history over four minutes (and the dead letters over
    # three) so that the per-minute grouping has something to group.
    for suffix, columns, spread in (("_history", ("enqueued_at", "started_at", "finished_at"), 4),
                                    ("_dead", ("enqueued_at", "dead_at"), 3)):
        shifts = ", ".join(f"{c} = {c} - (id % {spread}) * interval '1 minute'" for c in columns)
        pg.rows(f"UPDATE {table(catalog, 'emails', suffix)} SET {shifts} RETURNING 1")
    with logged_by_the_pipelines() as logged:
        report = run_report(spark, pg.url, catalog, "emails", str(out))
    history = pg.rows(f"SELECT enqueued_at, started_at, finished_at, worker, attempts "
                      f"FROM {table(catalog, 'emails', '_history')}")
    dead = pg.rows(f"SELECT dead_at, last_worker FROM {table(catalog, 'emails', '_dead')}")
    assert len(history) == 4_900 and len(dead) == 100

    # Per-minute throughput, from the Parquet the report wrote.
    minute = lambda t: t.astimezone(timezone.utc).replace(second=0, microsecond=0)  # noqa: E731
    expected_completed, expected_dead = Counter(minute(h["finished_at"]) for h in history), \
        Counter(minute(d["dead_at"]) for d in dead)
    written = pq.read_table(out / "throughput").to_pylist()
    assert {r["minute"]: r["completed"] for r in written if r["completed"]} == dict(expected_completed)
    assert {r["minute"]: r["dead"] for r in written if r["dead"]} == dict(expected_dead)
    assert report["completed"] == 4_900 and report["dead"] == 100
    assert len(written) >= 4

    # Wait and processing percentiles.
    waits = [(h["started_at"] - h["enqueued_at"]).total_seconds() for h in history]
    processing = [(h["finished_at"] - h["started_at"]).total_seconds() for h in history]
    latency = {r["metric"]: r for r in pq.read_table(out / "latency").to_pylist()}
    for metric, values in (("wait", waits), ("processing", processing)):
        assert latency[metric]["count"] == len(values)
        for fraction in (0.5, 0.95, 0.99):
            key = f"p{int(fraction * 100)}"
            low, high = approximate_percentile_bounds(values, fraction, PERCENTILE_ACCURACY)
            assert low - 1e-6 <= latency[metric][key] <= high + 1e-6, (metric, key)
            assert report["latency"][metric][key] == latency[metric][key]
        assert latency[metric]["max"] == pytest.approx(max(values), abs=1e-6)

    # Failure and retry rates per worker.
    per_worker: dict[str, dict[str, int]] = defaultdict(lambda: {"completed": 0, "retried": 0, "dead": 0})
    for h in history:
        per_worker[h["worker"]]["completed"] += 1
        per_worker[h["worker"]]["retried"] += h["attempts"] > 1
    for d in dead:
        per_worker[d["last_worker"]]["dead"] += 1
    workers = {r["worker"]: r for r in pq.read_table(out / "workers").to_pylist()}
    assert set(workers) == set(per_worker) and len(workers) == 2
    for name, counts in per_worker.items():
        row = workers[name]
        assert (row["completed"], row["retried"], row["dead"]) == (counts["completed"], counts["retried"],
                                                                   counts["dead"])
        assert row["failure_rate"] == pytest.approx(counts["dead"] / (counts["completed"] + counts["dead"]))
        assert row["retry_rate"] == pytest.approx(counts["retried"] / counts["completed"])
    assert sum(r["retried"] for r in workers.values()) == 500

    # The chart: a real PNG, and its path printed.
    chart = Path(report["chart"])
    assert chart == out / "report.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 20_000
    assert any(str(chart) in record.getMessage() for record in logged), [r.getMessage() for r in logged]


def test_jdbc_options_for_both_engines():
    pg = jdbc_options("postgresql://ada:s%40cret@127.0.0.1:5433/queues?sslmode=require")
    assert pg == {"user": "ada", "password": "s@cret", "url": "jdbc:postgresql://127.0.0.1:5433/queues?sslmode=require",
                  "driver": "org.postgresql.Driver"}
    ms = jdbc_options("mssql+pyodbc://sa:pw@db.example:1433/queues?driver=ODBC+Driver+18+for+SQL+Server"
                      "&Encrypt=yes&TrustServerCertificate=yes")
    assert ms["url"] == "jdbc:sqlserver://db.example:1433;databaseName=queues;encrypt=true;trustServerCertificate=true"
    assert ms["driver"] == "com.microsoft.sqlserver.jdbc.SQLServerDriver" and ms["user"] == "sa"


# -- the demo ----------------------------------------------------------------------------------------
def test_spark_demo_on_the_example_catalog(spark, pg, tmp_path):
    example = load_catalog(REPO / "database" / "queues.yml")
    work = next(q for q in example.queues if q.kind == "work" and q.options["dedupe"] and q.options["history"])
    catalog = pg.deploy({"name": work.name, "kind": "work", "payload": work.payload, "options": dict(
        (k, v) for k, v in work.options.items() if v is not None and k != "history_retention_days")})
    summary = run_spark_demo(pg.url, catalog, work.name, 2_000, workdir=str(tmp_path), spark=spark)
    assert summary["rows"] == summary["enqueued"] == 2_000
    assert summary["completed"] + summary["dead"] == 2_000 and summary["dead"] > 0
    history = pg.scalar(f"SELECT count(*) FROM {table(catalog, work.name, '_history')}")
    assert history == summary["completed"]
    assert Path(summary["chart"]).is_file()
    # The stream's output: one row without error per completed message, and one error row per failed attempt.
    # Its rows are in attempt folders (names starting with "_"), which a raw read of the folder skips.
    from pipelines.stream_job import read_results

    results = [r.asDict() for r in read_results(spark, summary["output"]).where("error IS NULL").collect()]
    assert len(results) == len({r["id"] for r in results}) == summary["completed"]
    assert summary["retries"] > 0
    assert summary["results"] == summary["completed"] and summary["results_doubled"] == 0


# -- the drain across a driver's death, storage the driver cannot see --------------------------------
def test_drain_killed_mid_run_is_finalized_by_the_next_run(spark, pg, tmp_path, monkeypatch):
    """A client_ids queue (ids are GUIDs). Run 1: its one task dies on every attempt right after its
    2nd batch's completes committed (before their marker), so Spark gives up on the job, and the
    driver dies before it can finalise. Run 2 (--finalize-only with the run id, keeping the staging
    to go on) takes the run's leases back and writes out everything that was completed; run 3 (the
    same run id) drains the rest. Nothing is lost and nothing doubled."""
    import uuid

    import pipelines.drain_job as drain_job
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("resumable", client_ids=True))
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "resumable")
        ids = [uuid.uuid4() for _ in range(1_000)]
        client.enqueue_batch([{"payload": {"id": n, "name": f"customer {n}"}, "dedupe_key": str(i), "id": i,
                               "enqueued_at": datetime.now(timezone.utc)} for n, i in enumerate(ids)])
    finally:
        conn.close()
    output = str(tmp_path / "output")
    plan = [{"at": "committed", "partition": 0, "batch": 2, "attempt": a} for a in range(4)]

    def driver_dies(*args: Any, **kwargs: Any) -> dict:
        raise DriverDied()

    monkeypatch.setattr(drain_job, "finalize_drain", driver_dies)
    with pytest.raises(DriverDied):
        run_drain(spark, pg.url, catalog, "resumable", "pipelines.transforms:uppercase_name", output, tasks=1,
                  batch_size=20, lease_seconds=60, time_budget_seconds=120, run_id="r1",
                  probe="pipelines.faults:crash_plan", probe_args={"plan": plan, "how": "raise"})
    monkeypatch.undo()
    history = lambda: {str(h["id"]) for h in pg.rows(  # noqa: E731
        f"SELECT id FROM {table(catalog, 'resumable', '_history')}")}
    assert len(history()) == 4 * 40         # each of the task's 4 attempts completed two batches
    assert output_rows_or_none(output) is None

    finalized = run_drain(spark, pg.url, catalog, "resumable", None, output, run_id="r1", finalize_only=True,
                          batch_size=20, keep_staging=True)
    written = output_rows(finalized["output"])
    assert len(written) == len({r["id"] for r in written}) and {r["id"] for r in written} == history()
    assert finalized["confirmed_unmarked"] == 4 * 20    # the 2nd batch of every attempt
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'resumable')} WHERE leased_by IS NOT NULL "
                     f"AND visible_at > now()") == 0  # nothing left held by the run's workers

    resumed = run_drain(spark, pg.url, catalog, "resumable", "pipelines.transforms:uppercase_name", output,
                        tasks=2, batch_size=20, lease_seconds=60, time_budget_seconds=120, run_id="r1")
    # A finished run (its staging removed) cannot be gone on with: its output would be overwritten.
    with pytest.raises(PipelineError, match="run r1 is finished"):
        run_drain(spark, pg.url, catalog, "resumable", None, output, run_id="r1", finalize_only=True)
    written = output_rows(resumed["output"])
    assert len(written) == len({r["id"] for r in written}) == 1_000
    assert {r["id"] for r in written} == history() == {str(i) for i in ids}
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'resumable')}") == 0


def test_drain_finalized_with_a_smaller_batch_takes_back_all_a_dead_attempt_held(spark, pg, tmp_path, monkeypatch):
    """Run 1 leases batches of 20; its one task dies on every attempt after staging its first batch
    (before completing it), then the driver dies. --finalize-only --batch-size 5 must take back all
    20 leases of the last attempt, not 5: a lease it left held would have no trace after its staged
    row, and that row would be written out as completed although its message never was."""
    import pipelines.drain_job as drain_job

    catalog = pg.deploy(work_queue("smaller", lease_seconds=600))
    enqueue_numbered(pg, catalog, "smaller", 60)
    output = str(tmp_path / "output")
    plan = [{"at": "staged", "partition": 0, "batch": 1, "attempt": a} for a in range(4)]

    def driver_dies(*args: Any, **kwargs: Any) -> dict:
        raise DriverDied()

    monkeypatch.setattr(drain_job, "finalize_drain", driver_dies)
    with pytest.raises(DriverDied):
        run_drain(spark, pg.url, catalog, "smaller", "pipelines.transforms:uppercase_name", output, tasks=1,
                  batch_size=20, time_budget_seconds=120, run_id="r1", probe="pipelines.faults:crash_plan",
                  probe_args={"plan": plan, "how": "raise"})
    monkeypatch.undo()
    held = f"SELECT count(*) FROM {table(catalog, 'smaller')} WHERE leased_by IS NOT NULL AND visible_at > now()"
    assert pg.scalar(held) == 20                      # the last attempt's first batch, staged, not completed

    finalized = run_drain(spark, pg.url, catalog, "smaller", None, output, run_id="r1", finalize_only=True,
                          batch_size=5)
    assert pg.scalar(held) == 0
    # Nothing was completed, so nothing is written out, and every message is back in the queue for
    # the next run (the killed-mid-run test above shows a later launch draining such a run once).
    # swept also counts the other ready messages each worker's dequeue was filled with.
    assert (finalized["completed"], finalized["confirmed_unmarked"]) == (0, 0) and finalized["swept"] >= 20
    assert output_rows(finalized["output"]) == []
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'smaller', '_history')}") == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'smaller')} WHERE leased_by IS NULL") == 60


def test_drain_task_rides_out_a_dropped_connection_without_a_spark_retry(spark, pg, tmp_path):
    """Every session ends while the task's first batch is staged (a failover): the task reconnects
    and repeats the complete (and whatever follows) itself; Spark runs no second attempt."""
    catalog = pg.deploy(work_queue("failover"))
    enqueue_numbered(pg, catalog, "failover", 40)
    summary = run_drain(spark, pg.url, catalog, "failover", "pipelines.transforms:uppercase_name",
                        str(tmp_path / "output"), tasks=1, batch_size=10, lease_seconds=30, idle_seconds=1,
                        time_budget_seconds=120, probe="pipelines.faults:drop_connections_once",
                        probe_args={"url": pg.url, "once": str(tmp_path / "dropped")})
    assert (tmp_path / "dropped").exists()
    assert summary["retried_tasks"] == [] and summary["completed"] == 40
    assert sorted(int(r["id"]) for r in output_rows(summary["output"])) == \
        sorted(r["id"] for r in pg.rows(f"SELECT id FROM {table(catalog, 'failover', '_history')}"))


def test_drain_output_given_relative_is_one_folder_for_spark_and_the_tasks(spark, pg, tmp_path, monkeypatch):
    """Spark resolves a relative (or scheme-less) output through Hadoop: against the JVM's working
    directory (or fs.defaultFS, HDFS on a cluster). The tasks and the finalisation read and write
    through Arrow, which would take it against the Python process's own directory. Here the Python
    driver's directory is not the JVM's: the drain must stage, finalise and write its output in the
    one folder Spark resolves, and nothing under the Python process's directory."""
    catalog = pg.deploy(work_queue("relative"))
    enqueue_numbered(pg, catalog, "relative", 20)
    jvm_directory = spark.sparkContext._jvm.java.lang.System.getProperty("user.dir")
    output = tmp_path / "output"
    python_directory = tmp_path / "python-cwd"
    python_directory.mkdir()
    monkeypatch.chdir(python_directory)
    summary = run_drain(spark, pg.url, catalog, "relative", "pipelines.transforms:uppercase_name",
                        os.path.relpath(output, jvm_directory), tasks=1, batch_size=10, idle_seconds=1,
                        time_budget_seconds=60)
    assert summary["output"] == f"{output}/results/run_id={summary['run_id']}"
    assert sorted(int(r["id"]) for r in output_rows(summary["output"])) == \
        sorted(r["id"] for r in pg.rows(f"SELECT id FROM {table(catalog, 'relative', '_history')}"))
    assert summary["completed"] == 20 and list(python_directory.iterdir()) == []


def test_arrow_location_is_hadoops_location_and_refuses_one_arrow_cannot_open(monkeypatch):
    import pipelines.common as common
    from pipelines.common import arrow_form, arrow_location

    assert [arrow_form(q) for q in ("file:/data/out", "file:///data/out", "s3a://bucket/out", "hdfs://nn:8020/out")] \
        == ["/data/out", "/data/out", "s3a://bucket/out", "hdfs://nn:8020/out"]
    # A cluster's fs.defaultFS: /data/out is HDFS's; this machine has no libhdfs (nor libjvm for it).
    monkeypatch.setattr(common, "literal_path", lambda spark, path, what: "hdfs://namenode:8020" + path)
    with pytest.raises(PipelineError, match=r"^drain q: output /data/out \(hdfs://namenode:8020/data/out\): the "
                                            r"tasks read and write it through Arrow's filesystems, which cannot "
                                            r"open it \(OSError: .*\); give a location Arrow reaches"):
        arrow_location(None, "/data/out", "drain q: output")


def test_new_drain_run_is_refused_while_an_unfinished_run_is_staged(spark, pg, tmp_path):
    catalog = pg.deploy(work_queue("unfinished"))
    (tmp_path / "output" / "_staging" / "run_id=rdied").mkdir(parents=True)
    with pytest.raises(PipelineError, match=r"holds the staging of run\(s\) rdied, not finalised: finish each with "
                                            r"--run-id <id> --finalize-only first .* or pass --force"):
        run_drain(spark, pg.url, catalog, "unfinished", "pipelines.transforms:uppercase_name",
                  str(tmp_path / "output"))


def test_drain_task_leases_nothing_once_the_run_is_being_finalised(pg, tmp_path):
    """A task that outlived its job (a lost executor still running) checks its launch's stop file
    before each lease: the driver writes it before its sweep. A later launch of the run (the run
    started again with --run-id) has its own and drains; the earlier launch stays stopped."""
    from pipelines.common import QueueTarget
    from pipelines.drain_job import DrainConfig, drain_partition, stop_file

    catalog = pg.deploy(work_queue("fenced"))
    enqueue_numbered(pg, catalog, "fenced", 10)
    staging = tmp_path / "staging"
    staging.mkdir()
    Path(stop_file(str(staging), "lzombie")).write_text("r1")
    counts = drain_partition(QueueTarget.of(pg.url, catalog, "fenced"),
                             DrainConfig(run_id="r1", launch="lzombie", staging=str(staging),
                                         transform="pipelines.transforms:uppercase_name", idle_seconds=1))
    assert (counts["leased"], counts["stopped"]) == (0, "run finalised")
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'fenced')} WHERE leased_by IS NULL") == 10
    counts = drain_partition(QueueTarget.of(pg.url, catalog, "fenced"),
                             DrainConfig(run_id="r1", launch="lnext", staging=str(staging),
                                         transform="pipelines.transforms:uppercase_name", idle_seconds=1))
    assert (counts["completed"], counts["stopped"]) == (10, "drained")
    assert Path(stop_file(str(staging), "lzombie")).exists()


def held_by(pg: "Postgres", catalog: Catalog, queue: str, worker: str) -> int:
    return pg.scalar(f"SELECT count(*) FROM {table(catalog, queue)} WHERE leased_by = %s AND visible_at > now()",
                     worker)


def stage_leases(staging: Path, launch: str, partition: int, rows: list[dict], batch: int = 1) -> None:
    """What a task attempt writes before completing its batch `batch`: its results, no marker yet."""
    from pipelines.drain_job import TaskStaging, _schemas

    results_schema, _ = _schemas()
    TaskStaging(str(staging), launch, partition, 0).write("results", [
        {"id": str(r["id"]), "result": "{}", "enqueued_at": r["enqueued_at"], "attempts": r["attempts"],
         "lease_token": str(r["lease_token"]), "worker": "w", "processed_at": datetime.now(timezone.utc),
         "batch": batch} for r in rows], results_schema, batch)


def test_sweep_asks_a_dead_attempt_for_its_launchs_batch_and_no_attempt_that_returned(pg, tmp_path):
    """Attempt p0 died holding 3 leases of a launch that leased batches of 4: the sweep's dequeue
    under its name asks for 4 (3 own, one other message leased and released), not the verbs' cap of
    1,000, which would lease and release (and send to the back of the queue) every other ready
    message. Attempt p1 returned (its done file): it is not asked, whatever the queue says. A second
    sweep (a later finalisation of the run) asks neither."""
    from pipelines.common import QueueTarget
    from pipelines.drain_job import TaskStaging, sweep, worker_name, write_launch
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("swept", lease_seconds=600))
    enqueue_numbered(pg, catalog, "swept", 30)
    staging = tmp_path / "staging"
    write_launch(str(staging), "la", 4)
    dead, returned = worker_name("r1", "la", 0, 0), worker_name("r1", "la", 1, 0)
    TaskStaging(str(staging), "la", 0, 0)
    TaskStaging(str(staging), "la", 1, 0).write_done()
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "swept")
        assert len(client.dequeue(3, worker=dead)) == 3
        assert len(client.dequeue(4, worker=returned)) == 4
    finally:
        conn.close()
    before = {r["id"]: r["visible_at"] for r in pg.rows(f"SELECT id, visible_at FROM {table(catalog, 'swept')}")}

    assert sweep(QueueTarget.of(pg.url, catalog, "swept"), str(staging), "r1") == 4
    assert (held_by(pg, catalog, "swept", dead), held_by(pg, catalog, "swept", returned)) == (0, 4)
    after = {r["id"]: r["visible_at"] for r in pg.rows(f"SELECT id, visible_at FROM {table(catalog, 'swept')}")}
    assert sum(before[i] != after[i] for i in before) == 4      # the dead attempt's 3 and one filler
    released = pq.read_table(staging / "markers", filters=[("part", "=", -1)]).to_pylist()
    assert len(released) == 4 and {r["outcome"] for r in released} == {"released"}
    # Taken back once, p0 is not asked again by a later finalisation: no message is touched.
    assert sweep(QueueTarget.of(pg.url, catalog, "swept"), str(staging), "r1") == 0
    assert {r["id"]: r["visible_at"] for r in pg.rows(f"SELECT id, visible_at FROM {table(catalog, 'swept')}")} \
        == after


def run_of_one_dead_attempt(pg: "Postgres", tmp_path: Path, queue: str, messages: int,
                            **options: Any) -> tuple[Catalog, str, Path, str]:
    """A queue of `messages` (work_queue options: lease_seconds 600 and `options`), and run r1's
    staging for one attempt of a launch that leased batches of that many: (catalog, output, staging
    folder, the attempt's worker name)."""
    from pipelines.drain_job import staging_path, worker_name, write_launch

    catalog = pg.deploy(work_queue(queue, **{"lease_seconds": 600, **options}))
    enqueue_numbered(pg, catalog, queue, messages)
    output = str(tmp_path / "output")
    staging = Path(staging_path(output, "r1"))
    write_launch(str(staging), "la", messages)
    return catalog, output, staging, worker_name("r1", "la", 0, 0)


def lock_wait_then(pg: "Postgres", query: str, then: Any, seen: list, done: threading.Event) -> threading.Thread:
    """A thread that, once a session running `query` waits for a lock, notes it in `seen` and runs
    then(); when `done` is set first (nothing waited), just then()."""
    condition = f"wait_event_type = 'Lock' AND query LIKE '%{query}%'"
    return when_a_session_waits(pg, condition, lambda: (seen.append(pg.scalar(
        f"SELECT count(*) FROM pg_stat_activity WHERE {condition}")), then()), done)


def short_take_back_waits(monkeypatch: Any) -> None:
    """A take-back's lock waits of 0.2 s, two tries, no backoff: a lock held past them is met fast."""
    import pipelines.drain_job as drain_job

    monkeypatch.setattr(drain_job, "TAKE_BACK_LOCK_TIMEOUT", 0.2)
    monkeypatch.setattr(drain_job, "TASK_RETRIES", 1)
    monkeypatch.setattr("pipelines.common.backoff_seconds", lambda attempt: 0.0)


def staged_lease(pg: "Postgres", catalog: Catalog, queue: str, staging: Path, worker: str) -> dict:
    """One message leased by `worker` (attempt 0 of partition 0 of launch la) and staged, unmarked."""
    from tablequeue.client import QueueClient

    conn = connect(pg.url, autocommit=True)
    try:
        [lease] = QueueClient.for_catalog(conn, "postgres", catalog, queue).dequeue(1, worker=worker)
    finally:
        conn.close()
    stage_leases(staging, "la", 0, [lease])
    return lease


@pytest.mark.parametrize("expired", [False, True], ids=["live", "expired"])
@pytest.mark.parametrize("zombie_ends", ["commit", "rollback"])
def test_sweep_waits_for_a_zombie_completing_a_staged_batch(spark, pg, tmp_path, zombie_ends, expired):
    """A zombie of a dead attempt is inside its batch's complete transaction when the driver
    finalises (expired: for longer than the lease, a COMMIT that does not arrive): the rows it
    completes are locked, and the sweep's dequeue would skip them. The sweep first extends each
    staged lease of a batch without a marker, by its token, which waits for the zombie: committed,
    the message was completed and its staged row is written out; rolled back, the dequeue then
    gives the lease back (an expired one leased again first), recorded, and the row is not written
    out."""
    from pipelines.common import QueueTarget
    from pipelines.drain_job import finalize_drain
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "zombie", 2)
    zombie = connect(pg.url, autocommit=False)
    done, seen = threading.Event(), []
    ends = None
    try:
        client = QueueClient.for_catalog(zombie, "postgres", catalog, "zombie")
        leases = client.dequeue(2, worker=worker, lease_seconds=1 if expired else None)
        zombie.commit()
        stage_leases(staging, "la", 0, leases)
        completing = min(leases, key=lambda r: r["id"])
        assert client.complete_batch([completing], worker)[0]["completed"]      # not committed yet
        if expired:
            time.sleep(1.2)
        ends = lock_wait_then(pg, "_extend_lease", getattr(zombie, zombie_ends), seen, done)
        summary = finalize_drain(spark, QueueTarget.of(pg.url, catalog, "zombie"), output, "r1")
    finally:
        done.set()
        if ends is not None:
            ends.join()
        zombie.close()
    assert seen == [1], "the sweep did not wait for the zombie's transaction"
    written = [r["id"] for r in output_rows(summary["output"])]
    in_queue = {r["id"] for r in pg.rows(f"SELECT id FROM {table(catalog, 'zombie')} WHERE leased_by IS NULL")}
    other = max(leases, key=lambda r: r["id"])["id"]
    if zombie_ends == "commit":
        assert (written, in_queue, summary["swept"]) == ([str(completing["id"])], {other}, 1)
    else:
        assert (written, in_queue, summary["swept"]) == ([], {completing["id"], other}, 2)


def test_sweep_gives_up_on_a_lease_locked_past_its_waits_naming_the_worker(pg, tmp_path, monkeypatch):
    """A zombie that stays inside its transaction (a paused process keeps its connection): the
    sweep's wait is bounded, and it stops with what to do rather than decide without knowing."""
    import pipelines.drain_job as drain_job
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "paused", 1)
    short_take_back_waits(monkeypatch)
    zombie = connect(pg.url, autocommit=False)
    try:
        client = QueueClient.for_catalog(zombie, "postgres", catalog, "paused")
        [lease] = client.dequeue(1, worker=worker)
        zombie.commit()
        stage_leases(staging, "la", 0, [lease])
        assert client.complete_batch([lease], worker)[0]["completed"]           # and never ends
        with pytest.raises(PipelineError, match=rf"worker {worker}'s lease of message {lease['id']} stayed locked by "
                                                r"another session through 2 waits of 0.2s .* end that session, then "
                                                r"finalise again with --run-id r1 --finalize-only"):
            drain_job.sweep(QueueTarget.of(pg.url, catalog, "paused"), str(staging), "r1")
    finally:
        zombie.close()


def test_sweep_gives_up_on_a_release_locked_past_its_waits_and_a_rerun_takes_it_back(spark, pg, tmp_path,
                                                                                      monkeypatch):
    """The dead worker holds a lease it never staged; the sweep's dequeue takes it back and its
    release then finds the row locked by another session (a zombie's heartbeat that never returns)
    through every wait: it stops with what to do, nothing recorded (records follow the releases).
    Once that session ends, finalising again gives the lease back."""
    import pipelines.drain_job as drain_job
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "held", 1)
    short_take_back_waits(monkeypatch)
    conn = connect(pg.url, autocommit=True)
    locker = connect(pg.url, autocommit=False)
    real_dequeue = QueueClient.dequeue

    def dequeue_then_lock(self, *args, **kwargs):
        rows = real_dequeue(self, *args, **kwargs)
        if rows and not locker.info.transaction_status:
            locker.execute(f"SELECT 1 FROM {table(catalog, 'held')} WHERE id = ANY(%s) FOR UPDATE",
                           ([r["id"] for r in rows],))
        return rows

    target = QueueTarget.of(pg.url, catalog, "held")
    try:
        [lease] = QueueClient.for_catalog(conn, "postgres", catalog, "held").dequeue(1, worker=worker)
        (staging / "markers" / "launch=la" / "part=0" / "attempt=0").mkdir(parents=True)   # the attempt began
        monkeypatch.setattr(QueueClient, "dequeue", dequeue_then_lock)
        with pytest.raises(PipelineError, match=rf"taking back what worker {worker} holds, a release or lease_status "
                                                r"stayed locked by another session through 2 waits of 0.2s \(a zombie "
                                                r"of that task\?\): end that session, then finalise again with "
                                                r"--run-id r1 --finalize-only"):
            drain_job.sweep(target, str(staging), "r1")
        assert not list((staging / "markers").rglob("*.parquet"))
        assert pg.rows(f"SELECT leased_by FROM {table(catalog, 'held')}") == [{"leased_by": worker}]
        locker.rollback()
        monkeypatch.setattr(QueueClient, "dequeue", real_dequeue)
        summary = finalize_drain_of(spark, target, output)
        assert (summary["swept"], summary["released"]) == (1, 0)
        assert pg.rows(f"SELECT leased_by FROM {table(catalog, 'held')}") == [{"leased_by": None}]
    finally:
        locker.close()
        conn.close()


def test_sweep_keeps_the_row_of_a_zombie_that_completed_before_its_release(spark, pg, tmp_path, monkeypatch):
    """The window the stop file leaves: a zombie looked just before the stop file was written and
    its complete lands between the sweep's dequeue and its release (recorded as released first).
    The release answers false; lease_status says gone (the lease was live, extended by the sweep's
    wait, so only the zombie can have ended it): recorded as zombie_completed, the row is written
    out and the message is not lost."""
    import pipelines.drain_job as drain_job
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "late", 2)
    zombie = connect(pg.url, autocommit=True)
    client = QueueClient.for_catalog(zombie, "postgres", catalog, "late")
    leases = client.dequeue(2, worker=worker)
    stage_leases(staging, "la", 0, leases)
    completing = min(leases, key=lambda r: r["id"])
    real_release, releases = QueueClient.release, []

    def zombie_completes_first(self, *args, **kwargs):
        releases.append(1)
        if len(releases) == 1:      # after the sweep's dequeue, before its first release
            assert client.complete(completing["id"], worker, lease_token=completing["lease_token"])
        return real_release(self, *args, **kwargs)

    monkeypatch.setattr(QueueClient, "release", zombie_completes_first)
    try:
        summary = finalize_drain_of(spark, QueueTarget.of(pg.url, catalog, "late"), output)
    finally:
        zombie.close()
    assert [r["id"] for r in output_rows(summary["output"])] == [str(completing["id"])]
    assert (summary["zombie_completed"], summary["swept"]) == (1, 2)
    other = max(leases, key=lambda r: r["id"])["id"]
    assert {r["id"] for r in pg.rows(f"SELECT id FROM {table(catalog, 'late')} WHERE leased_by IS NULL")} == {other}


def zombie_completes_before_the_first_release(monkeypatch: Any, client: Any, worker: str, completing: dict,
                                              then: Any = None) -> None:
    """The window the stop file leaves: the zombie's complete lands after the sweep's dequeue and
    before its first release (then(): what else happens there)."""
    from tablequeue.client import QueueClient

    real_release, releases = QueueClient.release, []

    def release(self, *args, **kwargs):
        releases.append(1)
        if len(releases) == 1:
            assert client.complete(completing["id"], worker, lease_token=completing["lease_token"])
            if then is not None:
                then()
        return real_release(self, *args, **kwargs)
    monkeypatch.setattr(QueueClient, "release", release)


@pytest.mark.parametrize("stops", ["driver dies", "lock timeout"])
def test_a_rerun_keeps_a_zombies_completion_the_first_finalisation_stopped_before_recording(
        spark, pg, tmp_path, monkeypatch, stops):
    """The data-engineer review of lease_status (M1): the zombie's complete lands between the
    sweep's dequeue and its release; then the finalisation stops before it records what the queue
    said (the driver dies asking lease_status; or the other lease's release stays locked, the
    documented stop). Nothing was recorded before the releases, so the re-run finds the completed
    lease untraced, asks lease_status (gone) and writes its row; the other, given back, is lost."""
    import pipelines.drain_job as drain_job
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "stops", 2)
    short_take_back_waits(monkeypatch)
    zombie = connect(pg.url, autocommit=True)
    locker = connect(pg.url, autocommit=False)
    client = QueueClient.for_catalog(zombie, "postgres", catalog, "stops")
    leases = client.dequeue(2, worker=worker)
    stage_leases(staging, "la", 0, leases)
    completing, other = sorted(leases, key=lambda r: r["id"])
    target = QueueTarget.of(pg.url, catalog, "stops")
    real_statuses = drain_job.lease_statuses
    try:
        if stops == "driver dies":
            zombie_completes_before_the_first_release(monkeypatch, client, worker, completing)

            def driver_dies(call: Any, leases_: list) -> dict:
                raise DriverDied("the driver is killed asking lease_status")
            monkeypatch.setattr(drain_job, "lease_statuses", driver_dies)
            with pytest.raises(DriverDied):
                finalize_drain_of(spark, target, output)
            monkeypatch.setattr(drain_job, "lease_statuses", real_statuses)
        else:
            zombie_completes_before_the_first_release(monkeypatch, client, worker, completing, lambda: locker.execute(
                f"SELECT 1 FROM {table(catalog, 'stops')} WHERE id = %s FOR UPDATE", (other["id"],)))
            with pytest.raises(PipelineError, match="a release or lease_status stayed locked"):
                finalize_drain_of(spark, target, output)
            locker.rollback()                                   # "end that session"
        summary = finalize_drain_of(spark, target, output)      # "then finalise again"
    finally:
        locker.close()
        zombie.close()
    assert [r["id"] for r in output_rows(summary["output"])] == [str(completing["id"])], summary
    assert summary["unmarked_status"]["gone"] == 1
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'stops')} WHERE leased_by IS NULL") == 1


def test_a_release_repeated_after_a_lost_answer_is_not_taken_for_a_zombies_complete(spark, pg, tmp_path, monkeypatch):
    """The data-engineer review (S1): the sweep's release commits and its answer is lost; before the
    repeat another consumer leases the message, now ready, and completes it. The repeat answers
    false and lease_status would say gone, but the run's lease did not complete it: a false on a
    repeated try is taken as released (with a warning), and the row is not written out."""
    import psycopg

    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "repeat", 1)
    conn = connect(pg.url, autocommit=True)
    outsider = QueueClient.for_catalog(conn, "postgres", catalog, "repeat")
    [lease] = outsider.dequeue(1, worker=worker)
    stage_leases(staging, "la", 0, [lease])
    release, answers = QueueClient.release, []

    def answer_lost_once(self, id, worker, lease_token=None):
        answers.append(release(self, id, worker, lease_token=lease_token))
        if len(answers) == 1:
            [other] = outsider.dequeue(1, worker="outsider")
            assert outsider.complete(other["id"], "outsider", lease_token=other["lease_token"])
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return answers[-1]
    monkeypatch.setattr(QueueClient, "release", answer_lost_once)
    monkeypatch.setattr("pipelines.common.backoff_seconds", lambda attempt: 0.0)
    try:
        with logged_by_the_pipelines(logging.WARNING) as logged:
            summary = finalize_drain_of(spark, QueueTarget.of(pg.url, catalog, "repeat"), output)
    finally:
        conn.close()
    assert answers == [True, False]
    assert (output_rows(summary["output"]), summary["zombie_completed"]) == ([], 0), summary
    assert any("answered false on a repeated try" in r.getMessage() for r in logged)


def test_a_second_finalisation_keeps_the_queues_first_answer(spark, pg, tmp_path):
    """The data-engineer review (S2): a staged lease buried on its last attempt is dead to the
    first finalisation. An operator then deletes the dead letter: the message is gone, which a new
    question would take for a completion. The answer, kept under the run's staging, stands."""
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "asked", 1, max_attempts=1)
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "asked")
        [lease] = client.dequeue(1, worker=worker, lease_seconds=1)
        stage_leases(staging, "la", 0, [lease])
        time.sleep(1.3)
        target = QueueTarget.of(pg.url, catalog, "asked")
        first = finalize_drain_of(spark, target, output)
        assert output_rows(first["output"]) == [] and first["unmarked_status"]["dead"] == 1
        assert client.dead_delete(lease["id"])
        second = finalize_drain_of(spark, target, output)
    finally:
        conn.close()
    assert output_rows(second["output"]) == [] and second["unmarked_status"]["dead"] == 1


def test_sweep_keeps_its_record_of_a_release_whose_answer_was_lost(spark, pg, tmp_path, monkeypatch):
    """The sweep's release commits and its answer is lost (a failover); the repeat answers false.
    The released marker written before stays: the message is back in the queue, so its staged row
    is not written out."""
    import psycopg

    from pipelines.common import QueueTarget
    from pipelines.drain_job import finalize_drain
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "answer", 1)
    lease = staged_lease(pg, catalog, "answer", staging, worker)
    release, answers = QueueClient.release, []

    def answer_lost_once(self: QueueClient, id: Any, worker: str, lease_token: Any = None) -> bool:
        answers.append(release(self, id, worker, lease_token=lease_token))
        if len(answers) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return answers[-1]
    monkeypatch.setattr(QueueClient, "release", answer_lost_once)
    monkeypatch.setattr("pipelines.common.backoff_seconds", lambda attempt: 0.0)
    summary = finalize_drain(spark, QueueTarget.of(pg.url, catalog, "answer"), output, "r1")
    assert answers == [True, False]
    assert output_rows(summary["output"]) == []
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'answer')} WHERE leased_by IS NULL") == 1


def test_finalize_keeps_a_batch_completed_before_its_marker_when_the_run_has_no_marker_at_all(spark, pg, tmp_path):
    """The run's only batch committed and its task died before the marker; the queue is empty, so
    the sweep records nothing either: no marker file anywhere in the run."""
    from pipelines.common import QueueTarget
    from pipelines.drain_job import finalize_drain
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "nomarker", 1)
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "nomarker")
        [lease] = client.dequeue(1, worker=worker)
        stage_leases(staging, "la", 0, [lease])
        assert client.complete_batch([lease], worker)[0]["completed"]
    finally:
        conn.close()
    summary = finalize_drain(spark, QueueTarget.of(pg.url, catalog, "nomarker"), output, "r1")
    assert [r["id"] for r in output_rows(summary["output"])] == [str(lease["id"])]
    assert summary["confirmed_unmarked"] == 1


@pytest.mark.parametrize("looks,staged", [([False, True], 0), ([False, False, True], 4)],
                         ids=["after-the-lease", "before-the-complete"])
def test_drain_task_gives_back_its_batch_once_the_run_is_being_finalised(pg, tmp_path, monkeypatch, looks, staged):
    """The stop file appears after a task's look before its lease (the driver's sweep may already
    have asked its worker): the task looks again after the lease, and before its complete (after the
    batch is staged, which the sweep reads after writing the stop file). Either look gives the batch
    back (recorded as released) and stops the task, completing nothing; having returned, it leaves
    its done file for the sweep."""
    from pipelines.common import QueueTarget
    from pipelines.drain_job import DONE_FILE, DrainConfig, TaskStaging, drain_partition

    catalog = pg.deploy(work_queue("late"))
    enqueue_numbered(pg, catalog, "late", 10)
    answers = iter(looks)
    monkeypatch.setattr(TaskStaging, "stop_reason", lambda self: "run finalised" if next(answers) else None)
    staging = tmp_path / "staging"
    counts = drain_partition(QueueTarget.of(pg.url, catalog, "late"),
                             DrainConfig(run_id="r1", launch="lz", staging=str(staging), batch_size=4,
                                         transform="pipelines.transforms:uppercase_name", idle_seconds=1))
    assert (counts["completed"], counts["released"], counts["stopped"]) == (0, 4, "run finalised")
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'late')} WHERE leased_by IS NULL AND attempts = 0") == 10
    assert len(pq.read_table(staging / "results").to_pylist()) == staged
    markers = pq.read_table(staging / "markers").to_pylist()
    assert len(markers) == 4 and {m["outcome"] for m in markers} == {"released"}
    assert (staging / "markers" / "launch=lz" / "part=0" / "attempt=0" / DONE_FILE).exists()


def test_drain_task_whose_repeated_complete_meets_the_stop_file_leaves_the_batch_to_the_sweep(
        pg, tmp_path, monkeypatch):
    """A complete's first try fails with a transient error (it may have committed: its answer is
    lost) and the stop file is there before the repeat: the task does not repeat it, leaves the batch
    unmarked and writes no done file, so the sweep asks its worker and takes the leases back."""
    import psycopg

    from pipelines.common import QueueTarget
    from pipelines.drain_job import DONE_FILE, DrainConfig, TaskStaging, drain_partition, sweep, write_launch
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("repeat"))
    enqueue_numbered(pg, catalog, "repeat", 10)
    looks = iter([False, False, False, True])   # before the lease, after it, before each try
    monkeypatch.setattr(TaskStaging, "stop_reason", lambda self: "run finalised" if next(looks) else None)
    monkeypatch.setattr(QueueClient, "complete_batch", lambda self, acks, worker: (_ for _ in ()).throw(
        psycopg.OperationalError("server closed the connection unexpectedly")))
    monkeypatch.setattr("pipelines.common.backoff_seconds", lambda attempt: 0.0)
    staging = tmp_path / "staging"
    target = QueueTarget.of(pg.url, catalog, "repeat")
    config = DrainConfig(run_id="r1", launch="lz", staging=str(staging), batch_size=4,
                         transform="pipelines.transforms:uppercase_name", idle_seconds=1)
    counts = drain_partition(target, config)
    assert (counts["completed"], counts["released"], counts["stopped"]) == (0, 0, "run finalised")
    assert not (staging / "markers" / "launch=lz" / "part=0" / "attempt=0" / DONE_FILE).exists()
    assert held_by(pg, catalog, "repeat", config.worker(0, 0)) == 4
    monkeypatch.undo()
    write_launch(str(staging), "lz", 4)
    assert sweep(target, str(staging), "r1") == 4
    assert held_by(pg, catalog, "repeat", config.worker(0, 0)) == 0


def test_drain_retry_stops_its_zombie_predecessor_and_waits_for_its_complete(pg, tmp_path, monkeypatch):
    """Attempt 1 of a task starts while attempt 0 still runs (an executor declared lost): attempt 0
    staged its batch of two and is inside its complete of one of them. Attempt 1 first writes attempt
    0's superseded file (attempt 0 looks for it as for the run's stop file: no further try, lease
    or complete), then waits for that transaction before it takes attempt 0's leases back: rolled
    back, both come back to attempt 1, which completes them. Attempt 0, looking again, stops."""
    import pyspark

    from pipelines.common import QueueTarget
    from pipelines.drain_job import DrainConfig, TaskStaging, drain_partition, write_launch
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("retried", lease_seconds=60))
    enqueue_numbered(pg, catalog, "retried", 2)
    staging = tmp_path / "staging"
    config = DrainConfig(run_id="r1", launch="la", staging=str(staging), batch_size=2,
                         transform="pipelines.transforms:uppercase_name", idle_seconds=1)
    write_launch(str(staging), "la", 2)
    zombie = connect(pg.url, autocommit=False)
    done, seen = threading.Event(), []
    ends = None
    try:
        client = QueueClient.for_catalog(zombie, "postgres", catalog, "retried")
        leases = client.dequeue(2, worker=config.worker(0, 0))
        zombie.commit()
        stage_leases(staging, "la", 0, leases)
        assert client.complete_batch([min(leases, key=lambda r: r["id"])], config.worker(0, 0))[0]["completed"]
        ends = lock_wait_then(pg, "_extend_lease", zombie.rollback, seen, done)
        monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(
            lambda: SimpleNamespace(partitionId=lambda: 0, attemptNumber=lambda: 1)))
        counts = drain_partition(QueueTarget.of(pg.url, catalog, "retried"), config)
    finally:
        done.set()
        if ends is not None:
            ends.join()
        zombie.close()
    assert seen == [1], "attempt 1 did not wait for attempt 0's transaction"
    assert (counts["released"], counts["completed"]) == (2, 2)
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'retried', '_history')}") == 2
    assert TaskStaging(str(staging), "la", 0, 0).stop_reason() == "superseded by a later attempt"


def test_drain_batch_left_unmarked_keeps_the_trace_of_its_failed_message(spark, pg, tmp_path, monkeypatch):
    """Attempt p9 staged X and died; X's lease ran out and p0 leased it again with two others. The
    transform refuses X (failed: retrying, in an hour); p0's complete of the other two fails with a
    transient error and the stop file is there before the repeat, so the batch is left unmarked.
    X's retrying marker is written all the same, so p9's staged X has a trace and is not written out
    while X waits for its retry."""
    import psycopg

    from pipelines.common import QueueTarget
    from pipelines.drain_job import DrainConfig, TaskStaging, drain_partition, staging_path, worker_name, write_launch
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("lostfail", lease_seconds=600))
    output = str(tmp_path / "output")
    staging = Path(staging_path(output, "r1"))
    write_launch(str(staging), "la", 3)
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "lostfail")
        client.enqueue({"id": 0}, dedupe_key="0")                   # no name: refused by the transform
        enqueue_numbered(pg, catalog, "lostfail", 2, first=1)
        [x] = client.dequeue(1, worker=worker_name("r1", "la", 9, 0), lease_seconds=1)
    finally:
        conn.close()
    stage_leases(staging, "la", 9, [x])
    time.sleep(1.3)                                                  # X's lease runs out
    looks = iter([False, False, False, True])   # before the lease, after it, before each try
    monkeypatch.setattr(TaskStaging, "stop_reason", lambda self: "run finalised" if next(looks) else None)
    monkeypatch.setattr(QueueClient, "complete_batch", lambda self, acks, worker: (_ for _ in ()).throw(
        psycopg.OperationalError("server closed the connection unexpectedly")))
    monkeypatch.setattr("pipelines.common.backoff_seconds", lambda attempt: 0.0)
    target = QueueTarget.of(pg.url, catalog, "lostfail")
    counts = drain_partition(target, DrainConfig(run_id="r1", launch="la", staging=str(staging), batch_size=3,
                                                 transform="pipelines.transforms:uppercase_name", idle_seconds=1,
                                                 retry_after_seconds=3600))
    monkeypatch.undo()
    assert (counts["leased"], counts["retrying"], counts["stopped"]) == (3, 1, "run finalised")
    summary = finalize_drain_of(spark, target, output)
    assert output_rows(summary["output"]) == []
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'lostfail')} WHERE id = %s AND leased_by IS NULL "
                     f"AND visible_at > now() + interval '10 minutes'", x["id"]) == 1


def test_drain_batch_committed_whose_answer_was_lost_before_the_stop_file_is_written_out(spark, pg, tmp_path,
                                                                                        monkeypatch):
    """A complete's first try commits and its answer is lost; the stop file is there before the
    repeat: the batch is left unmarked, the sweep finds nothing held, and every completed message's
    staged row is written out (confirmed: no trace after it)."""
    import contextlib

    import psycopg

    import pipelines.drain_job as drain_job
    from pipelines.common import QueueTarget, transaction
    from pipelines.drain_job import DrainConfig, TaskStaging, drain_partition, staging_path, write_launch

    catalog = pg.deploy(work_queue("lostanswer"))
    enqueue_numbered(pg, catalog, "lostanswer", 4)
    output = str(tmp_path / "output")
    staging = Path(staging_path(output, "r1"))
    write_launch(str(staging), "lz", 4)
    looks = iter([False, False, False, True])
    monkeypatch.setattr(TaskStaging, "stop_reason", lambda self: "run finalised" if next(looks) else None)
    lost = []

    @contextlib.contextmanager
    def commit_then_lose_the_answer(client: Any) -> Iterator[None]:
        with transaction(client):
            yield
        if not lost:
            lost.append(1)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
    monkeypatch.setattr(drain_job, "transaction", commit_then_lose_the_answer)
    monkeypatch.setattr("pipelines.common.backoff_seconds", lambda attempt: 0.0)
    target = QueueTarget.of(pg.url, catalog, "lostanswer")
    drain_partition(target, DrainConfig(run_id="r1", launch="lz", staging=str(staging), batch_size=4,
                                        transform="pipelines.transforms:uppercase_name", idle_seconds=1))
    monkeypatch.undo()
    summary = finalize_drain_of(spark, target, output)
    assert (summary["completed"], summary["confirmed_unmarked"], summary["swept"]) == (4, 4, 0)
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'lostanswer', '_history')}") == 4


def test_sweep_takes_back_a_staged_lease_its_dequeue_skipped_while_a_heartbeat_held_it(spark, pg, tmp_path,
                                                                                      monkeypatch):
    """At the instant of the sweep's dequeue a zombie's heartbeat holds the staged lease's row (one
    extend_lease statement), so the dequeue skips it. The sweep finds the lease still held after its
    dequeue and takes it back in another round: recorded, released, its staged row not written out."""
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "beating", 1)
    lease = staged_lease(pg, catalog, "beating", staging, worker)
    heartbeat = connect(pg.url, autocommit=False)
    beat, dequeue, dequeues = QueueClient.for_catalog(heartbeat, "postgres", catalog, "beating"), QueueClient.dequeue, []

    def dequeue_during_a_beat(self: QueueClient, *args: Any, **kwargs: Any) -> list[dict]:
        dequeues.append(1)
        if len(dequeues) > 1:
            return dequeue(self, *args, **kwargs)
        assert beat.extend_lease(lease["id"], worker, 30, lease_token=lease["lease_token"])     # holds the row
        try:
            return dequeue(self, *args, **kwargs)
        finally:
            heartbeat.commit()
    monkeypatch.setattr(QueueClient, "dequeue", dequeue_during_a_beat)
    try:
        summary = finalize_drain_of(spark, QueueTarget.of(pg.url, catalog, "beating"), output)
    finally:
        heartbeat.close()
    assert len(dequeues) == 2 and summary["swept"] == 1
    assert output_rows(summary["output"]) == []
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'beating')} WHERE leased_by IS NULL") == 1


def test_finalize_does_not_write_out_an_unmarked_row_whose_message_was_buried(spark, pg, tmp_path):
    """max_attempts 1: a dead attempt's staged lease runs out and the sweep's dequeue buries it
    (dead, 'lease expired'). The row has no trace in the run's markers; lease_status says dead, so
    it is not written out, and the finalisation says so (counted, a WARNING naming the table). The
    third data-engineer review: it had been kept as completed."""
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "lastone", 1, max_attempts=1)
    conn = connect(pg.url, autocommit=True)
    try:
        [lease] = QueueClient.for_catalog(conn, "postgres", catalog, "lastone").dequeue(1, worker=worker, lease_seconds=1)
    finally:
        conn.close()
    stage_leases(staging, "la", 0, [lease])
    time.sleep(1.3)
    with logged_by_the_pipelines(logging.WARNING) as logged:
        summary = finalize_drain_of(spark, QueueTarget.of(pg.url, catalog, "lastone"), output)
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'lastone', '_dead')}") == 1
    assert output_rows(summary["output"]) == []
    assert (summary["confirmed_unmarked"], summary["unmarked_status"]["dead"]) == (0, 1)
    assert any("now in" in r.getMessage() and "_dead" in r.getMessage() for r in logged)


def test_finalize_does_not_write_out_an_unmarked_row_leased_again_outside_the_run(spark, pg, tmp_path):
    """A dead attempt's staged lease runs out and a consumer outside the run takes the message
    before the finalisation: no marker of the run traces it. lease_status says lost: the row is not
    written out (the other consumer's result is the message's), and the message stays with it."""
    from pipelines.common import QueueTarget
    from tablequeue.client import QueueClient

    catalog, output, staging, worker = run_of_one_dead_attempt(pg, tmp_path, "taken", 1)
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "taken")
        [lease] = client.dequeue(1, worker=worker, lease_seconds=1)
        stage_leases(staging, "la", 0, [lease])
        time.sleep(1.3)
        [other] = client.dequeue(1, worker="outsider")
        summary = finalize_drain_of(spark, QueueTarget.of(pg.url, catalog, "taken"), output)
        assert output_rows(summary["output"]) == []
        assert (summary["confirmed_unmarked"], summary["unmarked_status"]["lost"]) == (0, 1)
        assert client.complete(other["id"], "outsider", lease_token=other["lease_token"])
    finally:
        conn.close()


def finalize_drain_of(spark: Any, target: Any, output: str) -> dict:
    from pipelines.drain_job import finalize_drain

    return finalize_drain(spark, target, output, "r1")


class DriverDied(BaseException):
    """The driver process ending between the tasks and the finalisation."""


def output_rows_or_none(output: str) -> list[dict] | None:
    folders = list(Path(output).glob("results/run_id=*"))
    return output_rows(str(folders[0])) if folders else None


def test_output_the_driver_cannot_see_is_refused_before_any_lease(spark, tmp_path, monkeypatch):
    """Each node's own disk, simulated: in the driver's process (only) a folder under `node` is
    looked up on another disk, so what an executor (a Python worker process) wrote there is not
    found. The same folder seen alike by both passes and is left clean."""
    import pipelines.common as common
    from pipelines.common import require_shared_storage

    real, driver = common.filesystem, os.getpid()
    node, driver_disk = str(tmp_path / "node"), str(tmp_path / "driver-disk")

    def own_disk_per_process(path: str) -> tuple[Any, str]:
        filesystem_, inner = real(path)
        return filesystem_, (inner.replace(node, driver_disk) if os.getpid() == driver else inner)

    monkeypatch.setattr(common, "filesystem", own_disk_per_process)
    tasks = spark.sparkContext.defaultParallelism       # one probe per core: every executor's disk
    with pytest.raises(PipelineError, match=rf"an executor on .* wrote {node}/out/_probe-[0-9a-f]+-\d+ and the "
                                            rf"driver on .* cannot see it \({tasks} of {tasks} probes unseen\)"):
        require_shared_storage(spark, f"{node}/out", local=False)
    assert len(list((tmp_path / "node" / "out").iterdir())) == tasks > 1      # each task wrote its probe
    monkeypatch.undo()
    require_shared_storage(spark, str(tmp_path / "shared"), local=False)
    assert list((tmp_path / "shared").iterdir()) == []


# -- the stream reader ------------------------------------------------------------------------------
# The issue's size, 20,000 messages (about 21 s here; 6,000 took 18: the stream's fixed costs lead).
# TABLEQUEUE_STREAM_MESSAGES sets another.
STREAM_MESSAGES = int(os.environ.get("TABLEQUEUE_STREAM_MESSAGES", "20000"))


def kill_first_attempts_at(ids: list[int], fatal: str) -> Any:
    """A UDF that kills the Python worker (os._exit) in the first attempt of a task that meets one
    of `ids`, and raises in every attempt while the file `fatal` exists and the task meets ids[0]."""
    import os

    from pyspark import TaskContext

    @F.udf("string")
    def result(payload: str) -> str:
        value = json.loads(payload)
        if value["id"] in ids and TaskContext.get().attemptNumber() == 0:
            os._exit(19)
        if value["id"] == ids[-1] and os.path.exists(fatal):
            raise RuntimeError("the sink's downstream is gone")
        return value["name"].upper()
    return result


def test_stream_reader_delivers_each_message_once_across_killed_tasks_and_a_restart(spark, pg, tmp_path):
    """STREAM_MESSAGES messages read as a stream in micro-batches of 2 x 1,000 leases into a Parquet sink. Two
    tasks are killed in their first attempt (Spark retries them: the retry gets the same leases
    back), then a micro-batch fails on every attempt and stops the query; it is restarted from its
    checkpoint and replays that micro-batch with its recorded leases. Every message ends completed
    once, and the sink holds each message's result exactly once."""
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("stream", lease_seconds=120))
    conn = connect(pg.url, autocommit=True)
    try:
        client = QueueClient.for_catalog(conn, "postgres", catalog, "stream")
        for start in range(0, STREAM_MESSAGES, 1000):
            client.enqueue_batch([{"payload": {"id": i, "name": f"customer {i}"}, "dedupe_key": str(i)}
                                  for i in range(start, start + 1000)])
    finally:
        conn.close()
    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    from pipelines.common import QueueTarget
    from pipelines.sources import target_options

    options = {**target_options(QueueTarget.of(pg.url, catalog, "stream"), str(url_file)),
               "partitions": "2", "messagesPerPartition": "1000", "consumer": "stream-test"}
    fatal = tmp_path / "fatal"
    fatal.touch()
    checkpoint, sink = str(tmp_path / "checkpoint"), str(tmp_path / "sink")

    def start() -> Any:
        source = spark.readStream.format("tablequeue").options(**options).load()
        kills = [STREAM_MESSAGES // 8, STREAM_MESSAGES * 3 // 8, STREAM_MESSAGES * 5 // 8 + 7]
        results = source.select("id", "payload", kill_first_attempts_at(kills, str(fatal))(
            F.col("payload")).alias("result"))
        return (results.writeStream.format("parquet").option("checkpointLocation", checkpoint)
                .option("path", sink).trigger(processingTime="0 seconds").start())

    query = start()
    with pytest.raises(Exception, match="the sink's downstream is gone"):
        query.awaitTermination(timeout=600)
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'stream', '_history')}") < STREAM_MESSAGES
    fatal.unlink()
    query = start()
    query.processAllAvailable()
    query.stop()

    delivered = spark.read.parquet(sink)
    counts = delivered.groupBy("id").count()
    assert counts.count() == STREAM_MESSAGES and counts.filter("count > 1").count() == 0
    assert delivered.filter(F.col("result") != F.upper(F.get_json_object("payload", "$.name"))).count() == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'stream')}") == 0
    history = pg.rows(f"SELECT count(*) AS n, count(DISTINCT id) AS ids, max(attempts) AS most "
                      f"FROM {table(catalog, 'stream', '_history')}")[0]
    # A retried task and a replayed micro-batch took their own leases back: no attempt was spent.
    assert history == {"n": STREAM_MESSAGES, "ids": STREAM_MESSAGES, "most": 1}


def test_stream_available_now_completes_every_micro_batch_before_it_ends_and_once_is_refused(spark, pg, tmp_path):
    """trigger(availableNow=True): micro-batches of at most 2 x 10 leases until nothing is left, and
    each is completed before the query ends (Spark commits a micro-batch only while it plans the
    next one: the last latestOffset, which finds nothing, completes the last one). Before, Spark
    called latestOffset once: one micro-batch per run, completed only by the next run. With
    ack=commit, trigger(once=True) would leave its only micro-batch uncompleted: refused before it
    leases anything."""
    from pipelines.common import QueueTarget
    from pipelines.sources import target_options

    catalog = pg.deploy(work_queue("availnow", lease_seconds=60))
    enqueue_numbered(pg, catalog, "availnow", 30)
    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    options = {**target_options(QueueTarget.of(pg.url, catalog, "availnow"), str(url_file)), "partitions": "2",
               "messagesPerPartition": "10", "idleWaitSeconds": "1", "consumer": "availnow-test"}
    sink = str(tmp_path / "sink")

    def start(checkpoint: str, **trigger: Any) -> Any:
        source = spark.readStream.format("tablequeue").options(**options).load()
        return (source.select("id", "payload").writeStream.format("parquet").option("path", sink)
                .option("checkpointLocation", str(tmp_path / checkpoint)).trigger(**trigger).start())

    query = start("checkpoint", availableNow=True)
    assert query.awaitTermination(timeout=120) and query.exception() is None
    assert [p.numInputRows for p in query.recentProgress if p.numInputRows] == [20, 10]
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'availnow', '_history')}") == 30
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'availnow')}") == 0
    assert spark.read.parquet(sink).select("id").distinct().count() == spark.read.parquet(sink).count() == 30

    enqueue_numbered(pg, catalog, "availnow", 5, first=100)
    once = start("checkpoint-once", once=True)
    with pytest.raises(Exception, match=r"availnow: trigger\(once=True\) with ack=commit would never complete "
                                        r"its micro-batch .* Use trigger\(availableNow=True\)"):
        once.awaitTermination(timeout=120)
    assert pg.rows(f"SELECT count(*) AS n, count(leased_by) AS held, max(attempts) AS most "
                   f"FROM {table(catalog, 'availnow')}") == [{"n": 5, "held": 0, "most": 0}]
    assert not list((tmp_path / "checkpoint-once" / "offsets").glob("[0-9]*"))


# -- the stream reader with failing rows: the sink acknowledges (ack=sink) ----------------------------
ACK_MESSAGES = 2000


class CrashingSink:
    """pipelines.stream_job.AckSink that stops the query once at each planned point: after writing
    micro-batch `after_write` (before any acknowledgement) and after acknowledging micro-batch
    `after_ack` (before Spark records the batch as committed). `crashed` outlives the restarts."""

    def __init__(self, sink: Any, after_write: int, after_ack: int, crashed: set) -> None:
        self.sink, self.after_write, self.after_ack, self.crashed = sink, after_write, after_ack, crashed

    def __call__(self, frame: Any, batch_id: int) -> None:
        original = self.sink.acknowledge

        def acknowledge(spark: Any, number: int, stored: Any = None) -> dict:
            if number == self.after_write and "write" not in self.crashed:
                self.crashed.add("write")
                raise RuntimeError(f"driver lost after writing micro-batch {number}")
            counts = original(spark, number, stored)
            if number == self.after_ack and "ack" not in self.crashed:
                self.crashed.add("ack")
                raise RuntimeError(f"driver lost after acknowledging micro-batch {number}")
            return counts
        self.sink.acknowledge = acknowledge
        try:
            self.sink(frame, batch_id)
        finally:
            self.sink.acknowledge = original


def test_stream_sink_fails_rows_with_errors_until_dead_and_a_restart_doubles_nothing(spark, pg, tmp_path):
    """ACK_MESSAGES messages through the reader (ack=sink), a handler and AckSink: 1 in 10 fails on
    every attempt (dead at max_attempts 3), 1 in 7 fails its first attempt only (retried, then
    completed), one row is filtered out by the query (the reader's commit fails it: no result, never
    completed). The query dies once after a micro-batch was written but not acknowledged, and once
    after one was acknowledged but not committed; each time it is restarted from its checkpoint.
    Every other message is completed exactly once with exactly one result row, and no error row is
    doubled."""
    from pipelines.common import QueueTarget
    from pipelines.sources import target_options
    from pipelines.stream_job import AckSink, handle, read_results

    catalog = pg.deploy(work_queue("acks", lease_seconds=120, max_attempts=3))
    poison = {i for i in range(ACK_MESSAGES) if i % 10 == 3}
    flaky = {i for i in range(ACK_MESSAGES) if i % 7 == 1} - poison
    dropped = 5
    conn = connect(pg.url, autocommit=True)
    try:
        from tablequeue.client import QueueClient

        client = QueueClient.for_catalog(conn, "postgres", catalog, "acks")
        for start in range(0, ACK_MESSAGES, 1000):
            client.enqueue_batch([{"payload": {"id": i, "name": f"customer {i}", "poison": i in poison,
                                               "flaky": i in flaky}, "dedupe_key": str(i)}
                                  for i in range(start, start + 1000)])
    finally:
        conn.close()
    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    options = {**target_options(QueueTarget.of(pg.url, catalog, "acks"), str(url_file)), "partitions": "2",
               "messagesPerPartition": "500", "consumer": "ack-test", "ack": "sink", "idleWaitSeconds": "1"}
    checkpoint, output = str(tmp_path / "checkpoint"), str(tmp_path / "output")
    crashed: set = set()

    def start() -> Any:
        stream = spark.readStream.format("tablequeue").options(**options).load()
        results = handle(stream, TRANSFORM).where(F.get_json_object("payload", "$.id") != str(dropped))
        ack_sink = AckSink(output, options, checkpoint=checkpoint, retry_after_seconds=0)
        ack_sink.prepare(spark)         # as docs/pipelines.md says: the restarts replay micro-batches 1 and 3
        sink = CrashingSink(ack_sink, 1, 3, crashed)
        return (results.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                .trigger(processingTime="0 seconds").start())

    for crash in ("after writing micro-batch 1", "after acknowledging micro-batch 3"):
        query = start()
        with pytest.raises(Exception, match=crash):
            query.awaitTermination(timeout=600)
    query = start()
    query.processAllAvailable()
    query.stop()

    rows = read_results(spark, output).select(
        F.get_json_object("payload", "$.id").cast("int").alias("n"), "id", "error", "batch_id")
    results = rows.where("error IS NULL").groupBy("n").count()
    completed = set(range(ACK_MESSAGES)) - poison - {dropped}
    assert results.count() == len(completed) and results.where("count > 1").count() == 0
    assert results.where(~F.col("n").isin(*completed)).count() == 0
    errors = {(r["n"], r["count"]) for r in rows.where("error IS NOT NULL").groupBy("n").count().collect()}
    assert errors == {(n, 3) for n in poison} | {(n, 1) for n in flaky}
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'acks')}") == 0
    history = pg.rows(f"SELECT (payload->>'id')::int AS n, attempts FROM {table(catalog, 'acks', '_history')}")
    assert sorted(r["n"] for r in history) == sorted(completed)
    assert {r["n"] for r in history if r["attempts"] == 2} == flaky
    assert {r["attempts"] for r in history} == {1, 2}
    dead = pg.rows(f"SELECT (payload->>'id')::int AS n, attempts, last_error FROM {table(catalog, 'acks', '_dead')}")
    assert {r["n"] for r in dead} == poison | {dropped} and {r["attempts"] for r in dead} == {3}
    assert [r["last_error"] for r in dead if r["n"] == dropped][0].endswith(
        "without the sink acknowledging this message (ack=sink)")
    assert all(r["last_error"].startswith("PoisonMessage: poison payload") for r in dead if r["n"] != dropped)


def test_stream_sink_names_the_queue_and_the_missing_columns(spark, pg, tmp_path):
    from pipelines.common import QueueTarget
    from pipelines.sources import target_options
    from pipelines.stream_job import AckSink

    catalog = pg.deploy(work_queue("bare"))
    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    options = target_options(QueueTarget.of(pg.url, catalog, "bare"), str(url_file))
    sink = AckSink(str(tmp_path / "out"), {**options, "ack": "sink"}, checkpoint=str(tmp_path / "checkpoint"))
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.bare: .* the stream lacks \['lease_token', 'worker', "
                                            r"'error'\]"):
        sink(spark.range(3), 0)
    for reader in (options, {**options, "ack": "commit"}):
        with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.bare: AckSink needs the reader's options with "
                                                r"ack=sink, got ack=commit"):
            AckSink(str(tmp_path / "out"), reader, checkpoint=str(tmp_path / "checkpoint"))
    with pytest.raises(PipelineError, match=r"\.bare: option ack must be one of commit, sink, got 'never'"):
        stream_reader(pg, catalog, "bare", ack="never")


def test_stream_handler_errors_of_decoding_and_serialising_are_the_rows_error():
    """A json queue's payload that is not JSON, and a handler's answer JSON cannot hold, fail the
    row (its error) instead of the task, and so the micro-batch, on every replay."""
    from pipelines.stream_job import handle_row

    assert handle_row(lambda p: {"n": p["n"] + 1}, '{"n": 1}', None, "json") == ('{"n": 2}', None)
    assert handle_row(lambda p, m: m["id"], '{}', {"id": 7}, "json") == ("7", None)
    result, error = handle_row(lambda p: p, "not json", None, "json")
    assert result is None and error.startswith("JSONDecodeError: Expecting value")
    result, error = handle_row(lambda p: {1: "a", "b": 2}, "{}", None, "json")
    assert result is None and error.startswith("TypeError: ")
    assert handle_row(lambda p: p.upper(), "plain text", None, "text") == ('"PLAIN TEXT"', None)


def test_stream_sink_warns_of_a_lost_lease_on_a_fresh_write_not_on_a_replay(spark, pg, tmp_path):
    """Leases that ran out before a fresh micro-batch was acknowledged mean a second result row
    later: a WARNING naming the queue and the micro-batch. A replay's lost answers are expected."""
    from pipelines.stream_job import COUNTS, AckSink

    catalog = pg.deploy(work_queue("late"))
    options = direct_sink_options(pg, catalog, "late", tmp_path, "3f1e-query")
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink.acknowledge = lambda spark_, batch_id, stored=None: {**dict.fromkeys(COUNTS, 0), "completed": 1, "lost": 2}
    frame = spark.createDataFrame([(1, "t1", "w", None), (2, "t2", "w", None), (3, "t3", "w", None)],
                                  "id long, lease_token string, worker string, error string")
    with logged_by_the_pipelines(logging.WARNING) as logged:
        sink(frame, 4)
        assert len(logged) == 1 and re.search(r"stream [a-z0-9_]+\.late: micro-batch 4: 2 message\(s\) written but "
                                              r"no longer held .* a second result row follows; dedupe on id",
                                              logged[0].getMessage())
        sink(frame, 4)                                  # the replay: its lost answers are expected
        assert len(logged) == 1
    marker = json.loads((tmp_path / "out" / "batch_id=4" / "_tablequeue_written").read_text())
    assert marker == {"query": "3f1e-query", "batch_id": 4, "attempt": attempt_folders(tmp_path / "out", 4)[0]}


def direct_sink_options(pg: "Postgres", catalog: Catalog, queue: str, tmp_path: Path, query: str) -> dict:
    """The reader's options (ack=sink) of `queue` for an AckSink called directly (no streaming query),
    with a checkpoint at tmp_path/checkpoint whose metadata holds the query id `query`."""
    from pipelines.common import QueueTarget
    from pipelines.sources import target_options

    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "metadata").write_text(json.dumps({"id": query}) + "\n")
    return {**target_options(QueueTarget.of(pg.url, catalog, queue), str(url_file)), "ack": "sink"}


def attempt_folders(output: Path, batch_id: int) -> list[str]:
    return sorted(p.name for p in (output / f"batch_id={batch_id}").iterdir() if p.name.startswith("_attempt-"))


def leased(pg: "Postgres", catalog: Catalog, queue: str, count: int, first: int = 0, worker: str = "w") -> list[tuple]:
    """(id, lease_token, worker) of `count` new messages, leased by `worker` as a reader would (a
    worker's own unfinished leases come back first: a second call needs another worker)."""
    from tablequeue.client import QueueClient

    enqueue_numbered(pg, catalog, queue, count, first)
    conn = connect(pg.url, autocommit=True)
    try:
        rows = QueueClient.for_catalog(conn, "postgres", catalog, queue).dequeue(count, worker=worker)
    finally:
        conn.close()
    assert len(rows) == count
    return [(r["id"], str(r["lease_token"]), worker) for r in rows]


SINK_ROWS = "id long, lease_token string, worker string, error string, written_by string"


def test_stream_crash_between_the_write_and_the_marker_rewrites_and_acknowledges_the_rewrite(spark, pg, tmp_path):
    """The query dies after micro-batch 0's rows were written (to an attempt folder) and before its
    marker. The first run's rows all carry an error; the restart's replay (same leases) computes them
    without one. The replay finds no marker, so it writes the micro-batch again, to an attempt folder
    of its own, acknowledges that, and deletes the first run's attempt folder: every message is
    completed once on its first attempt, and the stored row (error NULL, run 2) is the one
    acknowledged. Acknowledging the first write would have failed them all."""
    from pipelines.common import QueueTarget
    from pipelines.sources import target_options
    from pipelines.stream_job import WRITTEN, AckSink, handle, read_results

    catalog = pg.deploy(work_queue("unmarked", lease_seconds=120, max_attempts=1))
    enqueue_numbered(pg, catalog, "unmarked", 20)
    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    options = {**target_options(QueueTarget.of(pg.url, catalog, "unmarked"), str(url_file)), "partitions": "1",
               "messagesPerPartition": "50", "ack": "sink", "idleWaitSeconds": "1"}
    checkpoint, output = str(tmp_path / "checkpoint"), tmp_path / "output"

    crashed: list[str] = []

    class CrashBeforeMarker(AckSink):
        def mark(self, batch_id: int, attempt: str) -> None:
            if not crashed:
                crashed.append(attempt)
                raise RuntimeError(f"driver lost before the marker of micro-batch {batch_id}")
            super().mark(batch_id, attempt)

    def start(run: int) -> Any:
        stream = spark.readStream.format("tablequeue").options(**options).load()
        results = handle(stream, TRANSFORM).withColumn("run", F.lit(run))
        if run == 1:
            results = results.withColumn("error", F.lit("RuntimeError: only in the first run"))
        sink = CrashBeforeMarker(str(output), options, checkpoint=checkpoint, retry_after_seconds=0)
        return (results.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                .trigger(processingTime="0 seconds").start())

    query = start(1)
    with pytest.raises(Exception, match="driver lost before the marker of micro-batch 0"):
        query.awaitTermination(timeout=600)
    assert attempt_folders(output, 0) == crashed and not (output / "batch_id=0" / WRITTEN).exists()
    first = pq.read_table(output / "batch_id=0" / crashed[0]).to_pylist()
    assert len(first) == 20 and {r["run"] for r in first} == {1}
    query = start(2)
    query.processAllAvailable()
    query.stop()
    marked = json.loads((output / "batch_id=0" / WRITTEN).read_text())["attempt"]
    assert marked != crashed[0] and attempt_folders(output, 0) == [marked]
    stored = [r.asDict() for r in read_results(spark, str(output)).collect()]
    assert sorted(r["id"] for r in stored) == sorted(r["id"] for r in first)
    assert {(r["run"], r["error"], r["batch_id"]) for r in stored} == {(2, None, 0)}
    history = pg.rows(f"SELECT id, attempts FROM {table(catalog, 'unmarked', '_history')}")
    assert sorted(r["id"] for r in history) == sorted(r["id"] for r in stored) and {r["attempts"] for r in history} == {1}
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'unmarked', '_dead')}") == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'unmarked')}") == 0


def test_stream_results_are_read_from_marked_micro_batches_only(spark, tmp_path):
    """read_results skips a batch_id folder without the marker (written, never acknowledged: a
    crash before the marker) that spark.read.parquet(output) would include."""
    from pipelines.stream_job import WRITTEN, read_results

    output = tmp_path / "out"
    for batch_id, ids in ((0, [1, 2]), (1, [3]), (2, [3, 4])):
        spark.createDataFrame([(i, None) for i in ids], "id long, error string").write.parquet(
            str(output / f"batch_id={batch_id}"))
    for batch_id in (0, 1):
        (output / f"batch_id={batch_id}" / WRITTEN).write_text('{"query": "q", "batch_id": %d}' % batch_id)
    rows = sorted((r["id"], r["batch_id"]) for r in read_results(spark, str(output)).collect())
    assert rows == [(1, 0), (2, 0), (3, 1)]
    with pytest.raises(PipelineError, match="no acknowledged micro-batch"):
        read_results(spark, str(tmp_path / "empty"))


class FakeFs:
    """A Hadoop FileSystem (py4j) of the tests: the methods a subclass defines replace the real ones,
    the others are the real filesystem's."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


class HdfsFs(FakeFs):
    """A local filesystem that says it is HDFS and renames as HDFS does: rename(src, dst) refuses an
    existing file dst (false) and moves src into an existing directory dst (true); the NameNode's
    rename(src, dst, Options.Rename.NONE) of a file (FSDirRenameOp.validateOverwrite) raises for an
    existing directory dst a plain IOException, which the client gets as a RemoteException (DFSClient
    unwraps only FileAlreadyExistsException and a few others), and FileAlreadyExistsException for an
    existing file dst."""

    def getScheme(self) -> str:
        return "hdfs"

    def rename(self, source: Any, target: Any, *options: Any) -> Any:
        from py4j.protocol import Py4JJavaError
        from pyspark import SparkContext

        if options:
            assert [str(option) for option in options[0]] == ["NONE"]
            hadoop = SparkContext._jvm.org.apache.hadoop
            if self.fs.exists(target) and self.fs.getFileStatus(target).isDirectory():
                raise Py4JJavaError("An error occurred while calling o1.rename", hadoop.ipc.RemoteException(
                    "java.io.IOException", f"Source {source} and destination {target} must both be directories"))
            if self.fs.exists(target):
                raise Py4JJavaError("An error occurred while calling o1.rename", hadoop.fs.FileAlreadyExistsException(
                    f"rename destination {target} already exists"))
            return self.fs.rename(source, target)
        if self.fs.exists(target) and self.fs.getFileStatus(target).isFile():
            return False
        return self.fs.rename(source, target)        # onto a directory: into it (the local one does the same)


class CountedFs(FakeFs):
    """A Hadoop FileSystem that counts the calls made on it, by method name, into `calls`."""

    def __init__(self, fs: Any, calls: Counter) -> None:
        super().__init__(fs)
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.fs, name)

        def counted(*args: Any) -> Any:
            self.calls[name] += 1
            return method(*args)
        return counted


def files_through(wrap: Any) -> type:
    """A HadoopFiles whose every filesystem is wrap(fs): one of the fakes above (or fs itself)."""
    from pipelines.stream_job import HadoopFiles

    class Wrapped(HadoopFiles):
        def _at(self, path: str) -> tuple[Any, Any]:
            where, fs = super()._at(path)
            return where, wrap(fs)
    return Wrapped


def test_hadoop_files_kind_and_entries_ask_the_store_once(spark, tmp_path):
    """HadoopFiles.kind (a file, a folder, nothing) is one getFileStatus and entries (a folder,
    nothing) one listStatus: a missing path is the store's FileNotFoundException, not an exists()
    first (on an object store a round trip each); any other error of the store is raised (before:
    an exists, then the status or the listing)."""
    from py4j.protocol import Py4JJavaError

    calls: Counter = Counter()
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "file").write_text("x")
    files = files_through(lambda fs: CountedFs(fs, calls))(spark)
    assert [files.kind(str(tmp_path / name)) for name in ("folder/file", "folder", "missing")] == [
        "file", "folder", None]
    assert set(files.entries(str(tmp_path / "folder"))) == {"file"} and files.entries(str(tmp_path / "missing")) == {}
    assert calls == Counter({"getFileStatus": 3, "listStatus": 2})

    class Refusing(FakeFs):
        def getFileStatus(self, where: Any) -> Any:
            raise Py4JJavaError("An error occurred while calling o1.getFileStatus", spark.sparkContext._jvm.java.nio
                                .file.AccessDeniedException(f"{where}: 403 Forbidden"))

    with pytest.raises(Py4JJavaError, match="403 Forbidden"):
        files_through(Refusing)(spark).kind(str(tmp_path / "missing"))


def test_stream_results_list_the_output_once_and_read_only_the_markers(spark, tmp_path, monkeypatch):
    """read_results over 6 batch folders (4 marked attempt folders, one of them next to an unnamed
    attempt; one marked folder of the layout before attempt folders; one unmarked attempt: a crash
    before its marker) asks the filesystem for one glob of <output>/batch_id=*/* and opens each of
    the 5 markers, nothing else (before: an exists and a listing of the output, then per folder an
    exists, and with a marker a status, an open and an exists of the folder it names: 22 calls).
    These are py4j calls on the Hadoop FileSystem, not store requests: inside the JVM the glob still
    lists the output and each batch folder (see docs/pipelines.md)."""
    from pipelines import stream_job
    from pipelines.stream_job import WRITTEN, HadoopFiles, read_results

    calls: Counter = Counter()

    class Counted(HadoopFiles):
        def _at(self, path: str) -> tuple[Any, Any]:
            where, fs = super()._at(path)
            return where, CountedFs(fs, calls)

    output = tmp_path / "out"
    for batch_id in range(6):
        attempt = f"_attempt-{batch_id:032x}"
        folder = f"batch_id={batch_id}" if batch_id == 4 else f"batch_id={batch_id}/{attempt}"
        rows = [(batch_id * 10, None), (batch_id * 10 + 1, None)]
        spark.createDataFrame(rows, "id long, error string").write.parquet(str(output / folder))
        if batch_id < 5:
            named = {} if batch_id == 4 else {"attempt": attempt}
            (output / f"batch_id={batch_id}" / WRITTEN).write_text(json.dumps({"query": "q", "batch_id": batch_id,
                                                                               **named}))
    spark.createDataFrame([(99, None)], "id long, error string").write.parquet(
        str(output / "batch_id=2" / ("_attempt-" + "f" * 32)))
    monkeypatch.setattr(stream_job, "HadoopFiles", Counted)
    rows = sorted((r["id"], r["batch_id"]) for r in read_results(spark, str(output)).collect())
    assert rows == [(n * 10 + i, n) for n in range(5) for i in (0, 1)]
    assert calls == Counter({"globStatus": 1, "open": 5})


def test_paths_read_back_are_refused_with_a_glob_character_in_their_path_not_in_their_authority():
    """refuse_glob: a folder the jobs read back through Spark is refused, naming it as given and as
    qualified, when its qualified path holds one of Hadoop's glob characters { } [ ] * ? \\ (Spark's
    reader takes it as a pattern); an IPv6 NameNode's brackets in the authority are not globbed and
    pass (before: the output was escaped as a glob, which Spark 4 logs as a WARNING with a stack trace
    on every read, and the relative path's working directory was not escaped)."""
    from pipelines.common import refuse_glob

    refuse_glob("hdfs://[::1]:8020/out", "hdfs://[::1]:8020/out", "output")
    refuse_glob("file:/tmp/out", "/tmp/out", "output")
    for qualified, given, shown, found in (
            ("hdfs://[::1]:8020/out/a[1]", "hdfs://[::1]:8020/out/a[1]", r"hdfs://\[::1\]:8020/out/a\[1\]", r"\[ \]"),
            ("s3a://bucket/o*?{x}", "s3a://bucket/o*?{x}", r"s3a://bucket/o\*\?\{x\}", r"\* \? \{ \}"),
            ("file:/jobs/run[1]/out", "out", r"out \(file:/jobs/run\[1\]/out\)", r"\[ \]"),
            ("file:/tmp/a\\b", "/tmp/a\\b", r"/tmp/a\\b \(file:/tmp/a\\b\)", r"\\")):
        with pytest.raises(PipelineError, match=rf"^output {shown} holds {found}: Spark's reader takes a path with "
                                                rf"any of .* as a glob pattern"):
            refuse_glob(qualified, given, "output")


@contextlib.contextmanager
def hadoop_working_directory(spark: Any, folder: Path) -> Iterator[None]:
    """Hadoop's local filesystem (the one Spark's reader and writer and HadoopFiles get for a path
    without a scheme) working in `folder` while the block runs: a relative path is qualified against
    it, as against the working directory of a driver started there."""
    hadoop = spark.sparkContext._jvm.org.apache.hadoop
    local = hadoop.fs.FileSystem.get(spark.sparkContext._jsc.hadoopConfiguration())
    before = local.getWorkingDirectory()
    local.setWorkingDirectory(hadoop.fs.Path(f"file://{folder}"))
    try:
        yield
    finally:
        local.setWorkingDirectory(before)


def test_stream_sink_and_read_results_refuse_an_output_whose_path_has_glob_characters(spark, pg, tmp_path):
    """An output named out[x]{a,b}, and a relative output out/emails under a working directory
    run[1]: Spark's reader would glob either (out[x] reads outx). The sink refuses each at its first
    micro-batch with a PipelineError naming the output as given and qualified, before it writes or
    acknowledges anything; read_results refuses them too (before: the sink escaped the name as
    given, so out[x]{a,b} was written and read, with Spark 4's WARNING and stack trace on every read,
    and under run[1] its read of the attempt it had just written failed with PATH_NOT_FOUND)."""
    from pipelines.stream_job import AckSink, read_results

    catalog = pg.deploy(work_queue("globbed", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "globbed", tmp_path, "0c-query")
    frame = spark.createDataFrame([(*lease, None) for lease in leased(pg, catalog, "globbed", 2)],
                                  "id long, lease_token string, worker string, error string")
    (tmp_path / "run[1]").mkdir()
    named = (str(tmp_path / "out[x]{a,b}"), rf"{tmp_path}/out\[x\]\{{a,b\}} \(file:{tmp_path}/out\[x\]\{{a,b\}}\) "
                                            rf"holds \[ \] \{{ \}}")
    relative = ("out/emails", rf"out/emails \(file:{tmp_path}/run\[1\]/out/emails\) holds \[ \]")
    with hadoop_working_directory(spark, tmp_path / "run[1]"):
        for output, refused in (named, relative):
            sink = AckSink(output, options, checkpoint=str(tmp_path / "checkpoint"))
            with pytest.raises(PipelineError, match=rf"^stream [a-z0-9_]+\.globbed: output {refused}: Spark's "
                                                    rf"reader takes a path with any of .* as a glob pattern"):
                sink(frame, 0)
            assert sink.counts["completed"] == 0
            with pytest.raises(PipelineError, match=rf"^read_results: output {refused}: "):
                read_results(spark, output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "run[1]", "url"]
    assert list((tmp_path / "run[1]").iterdir()) == []
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'globbed')}") == 2          # none completed


@contextlib.contextmanager
def hadoop_settings(spark: Any, **settings: str) -> Iterator[None]:
    """`settings` in Spark's Hadoop configuration (the one its readers, writers and HadoopFiles get)
    while the block runs. Hadoop caches a filesystem per scheme and authority: give each test its own
    authority."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in settings.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            conf.unset(key)


def test_hadoop_files_resolve_a_path_only_through_a_mount_table(spark, tmp_path):
    """HadoopFiles.resolved asks resolvePath only of a filesystem with a client-side mount table: a
    local output is its qualified path, made, without a resolvePath (before: one, which on a store is
    a round trip, and on a vendor's wrapper might answer a physical path without the mount's
    credentials); a viewfs:// output, and an hdfs:// one under HDFS's ViewDistributedFileSystem as
    fs.hdfs.impl (no ViewFileSystem, so found by its name), are the mounted local folders. Only a
    path a mount table changed is logged (before: every output, "out is file:/.../out")."""
    calls: Counter = Counter()
    files = files_through(lambda fs: CountedFs(fs, calls))(spark)
    with logged_by_the_pipelines() as logged:
        assert files.resolved(str(tmp_path / "local" / "out"), "output") == f"file:{tmp_path}/local/out"
    assert (tmp_path / "local" / "out").is_dir() and calls["resolvePath"] == 0 and logged == []
    target = tmp_path / "mounted"
    target.mkdir()
    cluster, authority = f"c{secrets.token_hex(4)}", f"vd{secrets.token_hex(4)}"
    with hadoop_settings(spark, **{f"fs.viewfs.mounttable.{cluster}.link./data": f"file://{target}",
                                   "fs.hdfs.impl": "org.apache.hadoop.hdfs.ViewDistributedFileSystem",
                                   f"fs.viewfs.mounttable.{authority}.link./data": f"file://{target}"}):
        with logged_by_the_pipelines() as logged:
            assert files.resolved(f"viewfs://{cluster}/data/a", "output") == f"file:{target}/a"
        assert [r.getMessage() for r in logged] == [f"output viewfs://{cluster}/data/a resolves through its mount "
                                                    f"table to file:{target}/a: written, marked and read there"]
        assert files.resolved(f"hdfs://{authority}/data/b", "output") == f"file:{target}/b"
    # Two each: the new folder (missing), then its parent, the mount point; then made there.
    assert calls["resolvePath"] == 4 and (target / "a").is_dir() and (target / "b").is_dir()


def test_hadoop_files_resolve_a_new_output_through_a_mount_table_before_making_it(spark, tmp_path):
    """A viewfs:// output not made yet, two folders below a mount point: resolved through its nearest
    existing parent and made only on the mounted store, once its path there is checked. Onto a folder
    t* it is refused with nothing made there (before: made through the mount, then refused, leaving
    out/emails in t*; a mount onto t[1] or t{a} is no URI, so no mount table); onto ok it is made
    there."""
    cluster = f"c{secrets.token_hex(4)}"
    (tmp_path / "t*").mkdir()
    (tmp_path / "ok").mkdir()
    files = files_through(lambda fs: fs)(spark)
    with hadoop_settings(spark, **{f"fs.viewfs.mounttable.{cluster}.link./globbed": f"file://{tmp_path}/t*",
                                   f"fs.viewfs.mounttable.{cluster}.link./ok": f"file://{tmp_path}/ok"}):
        output = f"viewfs://{cluster}/globbed/out/emails"
        with pytest.raises(PipelineError, match=rf"^output {output} \(file:{re.escape(str(tmp_path))}/t\*/out/emails\) "
                                                rf"holds \*: Spark's reader"):
            files.resolved(output, "output")
        assert list((tmp_path / "t*").iterdir()) == []
        assert files.resolved(f"viewfs://{cluster}/ok/out/emails", "output") == f"file:{tmp_path}/ok/out/emails"
    assert (tmp_path / "ok" / "out" / "emails").is_dir()


class MountedOntoAnotherNameservice(FakeFs):
    """ViewFileSystemOverloadScheme (fs.hdfs.impl) of hdfs://<first>, whose mount table links /data to
    hdfs://<second>/inner: its resolvePath answers what the HDFS client of <second> would (that
    NameNode's own path, not through <second>'s mount table: the overload scheme reaches a target
    of its own scheme through fs.viewfs.overload.scheme.target.hdfs.impl). No NameNode here, so the
    answer is imitated; the second hop is the real overload scheme."""
    hops: dict[str, str] = {}

    def resolvePath(self, where: Any) -> Any:
        from pyspark import SparkContext

        text = str(where)
        mounted = next(mounted for mounted in self.hops if text.startswith(mounted))
        return SparkContext._jvm.org.apache.hadoop.fs.Path(self.hops[mounted] + text[len(mounted):])


def overload_hops(hops: dict[str, str]) -> type:
    """A HadoopFiles whose hdfs:// filesystems of the authorities in `hops` resolve as in
    MountedOntoAnotherNameservice: {"hdfs://<first>/data": "hdfs://<second>/inner", ...}."""
    class Hop(MountedOntoAnotherNameservice):
        pass
    Hop.hops = hops
    authorities = {mounted.split("/")[2] for mounted in hops}
    return files_through(lambda fs: Hop(fs) if str(fs.getUri().getAuthority()) in authorities else fs)


def test_hadoop_files_resolve_a_mount_onto_another_nameservices_mount_table_until_it_stays(spark, tmp_path):
    """ViewFileSystemOverloadScheme as fs.hdfs.impl: hdfs://<first>/data mounted onto
    hdfs://<second>/inner, and <second>'s mount table links /inner onto a local folder. The first
    resolvePath answers hdfs://<second>/inner/out, which Spark would write through <second>'s mount
    table: HadoopFiles.resolved resolves it again, to the local folder, and makes it there (before:
    hdfs://<second>/inner/out, the sink's decisions taken on the overload scheme, "hdfs"). Mount
    tables that lead into each other are refused after MOUNT_HOPS."""
    from pipelines.stream_job import MOUNT_HOPS

    first, second, loop_a, loop_b = (f"{name}{secrets.token_hex(4)}" for name in ("ova", "ovb", "loopa", "loopb"))
    target = tmp_path / "mounted"
    target.mkdir()
    with hadoop_settings(spark, **{"fs.hdfs.impl": "org.apache.hadoop.fs.viewfs.ViewFileSystemOverloadScheme",
                                   f"fs.viewfs.mounttable.{first}.link./data": f"hdfs://{second}/inner",
                                   f"fs.viewfs.mounttable.{second}.link./inner": f"file://{target}",
                                   f"fs.viewfs.mounttable.{loop_a}.link./data": f"hdfs://{loop_b}/data",
                                   f"fs.viewfs.mounttable.{loop_b}.link./data": f"hdfs://{loop_a}/data"}):
        files = overload_hops({f"hdfs://{first}/data": f"hdfs://{second}/inner"})(spark)
        assert files.resolved(f"hdfs://{first}/data/out", "output") == f"file:{target}/out"
        assert (target / "out").is_dir()
        looping = overload_hops({f"hdfs://{loop_a}/data": f"hdfs://{loop_b}/data",
                                 f"hdfs://{loop_b}/data": f"hdfs://{loop_a}/data"})(spark)
        with pytest.raises(PipelineError, match=rf"^output hdfs://{loop_a}/data/out resolves through more than "
                                                rf"{MOUNT_HOPS} mount tables \(hdfs://{loop_a}/data/out -> "
                                                rf"hdfs://{loop_b}/data/out -> .* -> \.\.\.\): mounts that lead "
                                                rf"into each other"):
            looping.resolved(f"hdfs://{loop_a}/data/out", "output")


def test_stream_sink_refuses_an_output_in_the_mount_tables_own_folders(spark, pg, tmp_path):
    """A viewfs:// mount table with a mount point /data/a: /data is a folder of the mount table
    itself (resolvePath answers it unchanged), on no store. prepare refuses it as the output with a
    PipelineError saying so and naming the mount point (before: a raw Py4JJavaError, "getWorkingDir
    should not have been called", from the capability check through the mount); a new folder
    /data/new beside the mount point, which the mount table will not make without a fallback, is
    refused with the mount table's own answer; with a fallback (linkFallback) it is made there and
    the sink works on it."""
    from pipelines.stream_job import AckSink

    plain, fallback = f"c{secrets.token_hex(4)}", f"f{secrets.token_hex(4)}"
    for folder in ("a", "fallback"):
        (tmp_path / folder).mkdir()
    catalog = pg.deploy(work_queue("mountfolders"))
    options = direct_sink_options(pg, catalog, "mountfolders", tmp_path, "6b-query")

    def prepared(output: str) -> AckSink:
        sink = AckSink(output, options, checkpoint=str(tmp_path / "checkpoint"))
        sink.prepare(spark)
        return sink

    with hadoop_settings(spark, **{f"fs.viewfs.mounttable.{plain}.link./data/a": f"file://{tmp_path}/a",
                                   f"fs.viewfs.mounttable.{fallback}.link./data/a": f"file://{tmp_path}/a",
                                   f"fs.viewfs.mounttable.{fallback}.linkFallback": f"file://{tmp_path}/fallback"}):
        with pytest.raises(PipelineError, match=rf"^stream [a-z0-9_]+\.mountfolders: output viewfs://{plain}/data "
                                                rf"resolves into the mount table of viewfs://{plain}/ itself: /data is "
                                                rf"a folder of its mount points \(/data/a\), on no mounted store"):
            prepared(f"viewfs://{plain}/data")
        with pytest.raises(PipelineError, match=rf"^stream [a-z0-9_]+\.mountfolders: output viewfs://{plain}/data/new "
                                                rf"is a new folder in /data, a folder of the mount points \(/data/a\) "
                                                rf"of the mount table of viewfs://{plain}/, which did not make it "
                                                rf"\(InternalDir of ViewFileSystem is readonly"):
            prepared(f"viewfs://{plain}/data/new")
        assert prepared(f"viewfs://{fallback}/data/new").output == f"file:{tmp_path}/fallback/data/new"
    assert (tmp_path / "fallback" / "data" / "new").is_dir() and list((tmp_path / "a").iterdir()) == []


def test_stream_sink_resolves_a_viewfs_output_and_works_on_the_mounted_store(spark, pg, tmp_path, monkeypatch):
    """viewfs://<cluster>/data mounted onto a local folder, with ViewFileSystem passing on a conditional
    create capability of the mounted store (hasPathCapability, as over S3A with hadoop-aws 3.4.2+) while
    its createFile builder rejects that option ("Unknown mandatory key for viewfs://..."). The sink
    resolves the output at its first micro-batch and works on the mounted file: folder: micro-batch 0
    is marked there, acknowledged, and read back by read_results through the mount (before: the
    marker's create failed with that error, as every micro-batch would)."""
    from pipelines import stream_job
    from pipelines.stream_job import CONDITIONAL_CREATE, WRITTEN, AckSink, read_results

    cluster = f"c{secrets.token_hex(4)}"
    target = tmp_path / "mounted"
    target.mkdir()

    class PassingCapability(FakeFs):
        def hasPathCapability(self, where: Any, capability: str) -> bool:
            return capability == CONDITIONAL_CREATE or self.fs.hasPathCapability(where, capability)

    MountedS3aLike = files_through(lambda fs: PassingCapability(fs) if fs.getScheme() == "viewfs" else fs)
    with hadoop_settings(spark, **{f"fs.viewfs.mounttable.{cluster}.link./data": f"file://{target}"}):
        builder = MountedS3aLike(spark)._at(f"viewfs://{cluster}/data/probe")[1].createFile(
            spark.sparkContext._jvm.org.apache.hadoop.fs.Path(f"viewfs://{cluster}/data/probe")).overwrite(False)
        with pytest.raises(Exception, match=rf"Unknown mandatory key +for viewfs://{cluster}/data/probe"):
            builder.must(CONDITIONAL_CREATE, True).build()
        catalog = pg.deploy(work_queue("viewed", lease_seconds=600))
        options = direct_sink_options(pg, catalog, "viewed", tmp_path, "5e-query")
        monkeypatch.setattr(stream_job, "HadoopFiles", MountedS3aLike)
        sink = AckSink(f"viewfs://{cluster}/data/out", options, checkpoint=str(tmp_path / "checkpoint"))
        leases = leased(pg, catalog, "viewed", 2)
        sink(spark.createDataFrame([(*lease, None) for lease in leases], "id long, lease_token string, worker string, "
                                                                          "error string"), 0)
        assert sink.output == f"file:{target}/out" and sink.counts["completed"] == 2
        attempt = json.loads((target / "out" / "batch_id=0" / WRITTEN).read_text())["attempt"]
        assert attempt_folders(target / "out", 0) == [attempt]
        assert sorted(r["id"] for r in read_results(spark, f"viewfs://{cluster}/data/out").collect()) == sorted(
            lease[0] for lease in leases)


def test_stream_sink_resolves_an_overload_scheme_hdfs_output_to_the_store_it_mounts(spark, pg, tmp_path,
                                                                                     monkeypatch):
    """ViewFileSystemOverloadScheme as fs.hdfs.impl, its hdfs://<authority>/data mounted onto a local
    folder: the filesystem says "hdfs", so the sink took the mounted store for HDFS and renamed a
    temporary marker into place there (on a mount onto S3A a rename is a copy: two drivers could both
    win and delete each other's attempt). The sink resolves the output to the mounted file: folder
    and decides there: micro-batch 0's marker is made by a create, no rename anywhere (before: the
    temporary file and a rename)."""
    from pipelines import stream_job
    from pipelines.stream_job import WRITTEN, AckSink

    authority = f"ov{secrets.token_hex(4)}"
    target = tmp_path / "mounted"
    target.mkdir()
    calls: Counter = Counter()
    catalog = pg.deploy(work_queue("overloaded", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "overloaded", tmp_path, "5f-query")
    monkeypatch.setattr(stream_job, "HadoopFiles", files_through(lambda fs: CountedFs(fs, calls)))
    with hadoop_settings(spark, **{"fs.hdfs.impl": "org.apache.hadoop.fs.viewfs.ViewFileSystemOverloadScheme",
                                   f"fs.viewfs.mounttable.{authority}.link./data": f"file://{target}"}):
        sink = AckSink(f"hdfs://{authority}/data/out", options, checkpoint=str(tmp_path / "checkpoint"))
        leases = leased(pg, catalog, "overloaded", 2)
        sink(spark.createDataFrame([(*lease, None) for lease in leases], "id long, lease_token string, worker string, "
                                                                          "error string"), 0)
    assert (calls["rename"], calls["create"]) == (0, 1)
    assert sink.output == f"file:{target}/out" and sink.counts["completed"] == 2
    assert sorted(p.name for p in (target / "out" / "batch_id=0").iterdir() if not p.name.startswith(".")) == sorted(
        [WRITTEN, *attempt_folders(target / "out", 0)])


def test_stream_sink_marker_is_created_only_if_absent_through_sparks_filesystem(spark, pg, tmp_path):
    """The marker goes through Spark's Hadoop FileSystem with create(path, overwrite=false): a
    marker another driver of the same query created while this one wrote the micro-batch is not
    overwritten; the write is refused, naming the queue, the folder and the checkpoint, and this
    driver's attempt folder is deleted."""
    from pipelines.stream_job import WRITTEN, AckSink, HadoopFiles

    catalog = pg.deploy(work_queue("zombie"))
    options = direct_sink_options(pg, catalog, "zombie", tmp_path, "7a-query")
    other = b'{"query": "7a-query", "batch_id": 0, "driver": "the other"}'

    class RacedFiles(HadoopFiles):
        """The other driver creates micro-batch 0's marker just after this one's Parquet write."""

        def create_new(self, path: str, data: bytes) -> bool:
            if "batch_id=0/" in path:
                assert super().create_new(path, other)
            return super().create_new(path, data)

    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink._files = RacedFiles(spark)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.zombie: the marker of .*/out/batch_id=0 appeared "
                                            r"while this driver wrote the micro-batch: another driver runs the query "
                                            r"of checkpoint .*/checkpoint"):
        sink.write(frame, 0)
    assert (tmp_path / "out" / "batch_id=0" / WRITTEN).read_bytes() == other
    assert attempt_folders(tmp_path / "out", 0) == []
    assert sorted(sink.write(frame, 1).select("id").collect()) == [(1,)]
    attempt = json.loads(sink._files.read_text(f"{sink.folder(1)}/{WRITTEN}"))["attempt"]
    assert attempt_folders(tmp_path / "out", 1) == [attempt] and re.fullmatch(r"_attempt-[0-9a-f]{32}", attempt)
    assert json.loads(sink._files.read_text(f"{sink.folder(1)}/{WRITTEN}")) == {
        "query": "7a-query", "batch_id": 1, "attempt": attempt}


def test_stream_zombie_driver_writing_after_the_winner_deletes_nothing_of_its_rows(spark, pg, tmp_path):
    """Two drivers of one query (two AckSinks on one checkpoint and output, their steps interleaved
    by hand): B finds no marker of micro-batch 0, then A writes, marks and acknowledges it, then B
    writes its own rows. B's write goes to its own attempt folder and is refused at the marker
    (its folder deleted); A's rows stay, read_results returns them, and A's acknowledgement stands.
    Before, B's overwrite deleted A's acknowledged rows and marker and published B's rows."""
    from pipelines.stream_job import WRITTEN, AckSink, HadoopFiles, read_results

    catalog = pg.deploy(work_queue("zombies", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "zombies", tmp_path, "5c-query")
    output, checkpoint = tmp_path / "out", str(tmp_path / "checkpoint")
    leases = leased(pg, catalog, "zombies", 6)
    first, zombie = (AckSink(str(output), options, checkpoint=checkpoint) for _ in range(2))
    zombie._files = HadoopFiles(spark)
    assert not zombie.written(0)                              # B checks first: nothing written yet
    first(spark.createDataFrame([(*lease, None, "A") for lease in leases], SINK_ROWS), 0)
    assert first.counts["completed"] == 6
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.zombies: the marker of .*/out/batch_id=0 appeared "
                                            r"while this driver wrote the micro-batch: another driver runs"):
        zombie.write(spark.createDataFrame([(*lease, "B's error", "B") for lease in leases], SINK_ROWS), 0)
    marked = json.loads((output / "batch_id=0" / WRITTEN).read_text())
    assert attempt_folders(output, 0) == [marked["attempt"]]
    stored = sorted((r["id"], r["written_by"], r["error"], r["batch_id"])
                    for r in read_results(spark, str(output)).collect())
    assert stored == sorted((lease[0], "A", None, 0) for lease in leases)
    history = pg.rows(f"SELECT id FROM {table(catalog, 'zombies', '_history')}")
    assert sorted(r["id"] for r in history) == sorted(lease[0] for lease in leases)
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'zombies')}") == 0


def test_stream_sink_warns_once_naming_the_output_when_the_store_has_no_atomic_create(spark, pg, tmp_path,
                                                                                     monkeypatch):
    """On a store without an atomic create-if-absent (HadoopFiles.atomic_create False: S3A without
    the conditional create, an unknown scheme), both drivers of a query could "win" the marker: the
    first micro-batch logs one WARNING naming the queue and the output and saying a second driver is
    not guarded against; later micro-batches log nothing more."""
    from pipelines import stream_job
    from pipelines.stream_job import COUNTS, AckSink, HadoopFiles

    class NonAtomic(HadoopFiles):
        def atomic_create(self, path: str) -> bool:
            return False

    monkeypatch.setattr(stream_job, "HadoopFiles", NonAtomic)
    catalog = pg.deploy(work_queue("plain"))
    options = direct_sink_options(pg, catalog, "plain", tmp_path, "2e-query")
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink.acknowledge = lambda spark_, batch_id, stored=None: dict.fromkeys(COUNTS, 0)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    with logged_by_the_pipelines(logging.WARNING) as logged:
        sink(frame, 0)
        sink(frame, 1)
    assert len(logged) == 1 and re.search(r"stream [a-z0-9_]+\.plain: .*/out has no atomic create-if-absent .* a "
                                          r"second driver of the query is then not guarded against",
                                          logged[0].getMessage())
    assert HadoopFiles(spark).atomic_create(str(tmp_path / "out"))          # file under a local master
    # S3A's own switch is not a conditional create (its plain create may still check, then PUT): only
    # the capability the builder is used with counts; and a local filesystem on a cluster (a shared
    # mount, several hosts) does not either.
    from pipelines.stream_job import HadoopFiles as Files

    class S3aSwitchOnly(Files):
        def _at(self, path: str) -> tuple[Any, Any]:
            where, fs = super()._at(path)

            class Fs:
                def getScheme(self) -> str:
                    return "s3a"

                def hasPathCapability(self, at: Any, capability: str) -> bool:
                    return capability == "fs.s3a.create.conditional.enabled"
            return where, Fs()
    assert not S3aSwitchOnly(spark).atomic_create(str(tmp_path / "out"))
    on_a_cluster = Files(spark)
    on_a_cluster.one_host = False
    assert not on_a_cluster.atomic_create(str(tmp_path / "out"))


def test_stream_sink_conditional_create_lost_at_close_is_a_lost_race(spark, pg, tmp_path):
    """A store with Hadoop's conditional create (S3A's If-None-Match PUT) is used through the builder
    with fs.option.create.conditional.overwrite as a must option, and reports the other driver's
    marker only at close() (412 / FileAlreadyExists): that is a lost race like one at create():
    this driver's attempt folder is deleted and the lost-race PipelineError raised (before: only
    create(path, false) was called and a failure at close escaped as a Py4JJavaError)."""
    from py4j.protocol import Py4JJavaError

    from pipelines.stream_job import WRITTEN, AckSink, HadoopFiles

    catalog = pg.deploy(work_queue("conditional"))
    options = direct_sink_options(pg, catalog, "conditional", tmp_path, "8c-query")
    other = b'{"query": "8c-query", "batch_id": 0, "attempt": "_attempt-' + b"0" * 32 + b'"}'
    used: list[tuple] = []

    class ConditionalFs(FakeFs):
        """An S3A-like filesystem for the marker: the conditional create, checked at close."""

        def hasPathCapability(self, where: Any, capability: str) -> bool:
            return capability == "fs.option.create.conditional.overwrite"

        def createFile(self, where: Any) -> Any:
            class Builder:
                def overwrite(self, flag: bool) -> "Builder":
                    used.append(("overwrite", flag))
                    return self

                def must(self, key: str, value: bool) -> "Builder":
                    used.append(("must", key, value))
                    return self

                def build(self) -> Any:
                    class Upload:
                        def write(self, data: bytearray) -> None:
                            used.append(("write", bytes(data)))

                        def close(self) -> None:          # the other driver's PUT came first: 412
                            assert plain.create_new(str(where), other)
                            raise Py4JJavaError("An error occurred while calling o1.close", plain.jvm.org.apache
                                                .hadoop.fs.FileAlreadyExistsException(f"{where}: 412 Precondition "
                                                                                      f"Failed"))
                    return Upload()
            return Builder()

    class ConditionalFiles(HadoopFiles):
        def _at(self, path: str) -> tuple[Any, Any]:
            where, fs = super()._at(path)
            return (where, ConditionalFs(fs)) if path.endswith(WRITTEN) else (where, fs)

    plain = HadoopFiles(spark)
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink._files = ConditionalFiles(spark)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.conditional: the marker of .*/out/batch_id=0 "
                                            r"appeared while this driver wrote the micro-batch: another driver runs"):
        sink.write(frame, 0)
    assert used[:2] == [("overwrite", False), ("must", "fs.option.create.conditional.overwrite", True)]
    assert json.loads(used[2][1])["query"] == "8c-query"          # the whole content in one write
    assert (tmp_path / "out" / "batch_id=0" / WRITTEN).read_bytes() == other
    assert attempt_folders(tmp_path / "out", 0) == []


def test_stream_sink_marker_is_a_temporary_file_renamed_into_place_where_rename_refuses_a_target(spark, pg,
                                                                                                 tmp_path):
    """On HDFS (and ABFS with a hierarchical namespace), where rename(src, dst) is atomic and returns
    false when dst exists, the marker is written whole to <batch>/_tablequeue_written.<hex>.tmp and
    renamed into place (a local filesystem that says it is HDFS and refuses an existing target, as
    HDFS does): micro-batch 0 wins and its marker holds the content; micro-batch 1's rename is
    refused (another driver's marker came first): a lost race, the temporary file and the attempt
    deleted; micro-batch 2's driver dies at the rename: no marker at all, so no empty marker to
    refuse (before: the marker was created empty, then written, under the same name)."""
    from pipelines.stream_job import WRITTEN, AckSink, HadoopFiles, read_results, renames_into_place

    catalog = pg.deploy(work_queue("renamed"))
    options = direct_sink_options(pg, catalog, "renamed", tmp_path, "3b-query")
    other = b'{"query": "3b-query", "batch_id": 1, "attempt": "_attempt-' + b"0" * 32 + b'"}'
    used: list[tuple] = []

    class HdfsLike(HdfsFs):
        def create(self, where: Any, overwrite: bool) -> Any:
            used.append(("create", where.getName()))
            return self.fs.create(where, overwrite)

        def rename(self, source: Any, target: Any, *options: Any) -> Any:
            used.append(("rename", source.getName(), target.getName()))
            if "batch_id=1/" in str(target):             # the other driver's rows and marker come first
                spark.createDataFrame([(2, "t2", "w", None)], frame.schema).write.parquet(
                    str(tmp_path / "out" / "batch_id=1" / ("_attempt-" + "0" * 32)))
                assert plain.create_new(str(target), other)
            if "batch_id=2/" in str(target):
                raise RuntimeError("driver lost at the rename")
            return super().rename(source, target, *options)

    class HdfsFiles(HadoopFiles):
        def _at(self, path: str) -> tuple[Any, Any]:
            where, fs = super()._at(path)
            return where, HdfsLike(fs)

    plain = HadoopFiles(spark)
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink._files = HdfsFiles(spark)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    temporary = r"_tablequeue_written\.[0-9a-f]{32}\.tmp"

    def left(batch_id: int) -> list[str]:
        return sorted(p.name for p in (tmp_path / "out" / f"batch_id={batch_id}").iterdir()
                      if not p.name.startswith("."))

    sink.write(frame, 0)
    attempt = json.loads((tmp_path / "out" / "batch_id=0" / WRITTEN).read_text())["attempt"]
    assert left(0) == sorted([attempt, WRITTEN])
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.renamed: the marker of .*/out/batch_id=1 appeared "
                                            r"while this driver wrote the micro-batch: another driver runs"):
        sink.write(frame, 1)
    assert left(1) == ["_attempt-" + "0" * 32, WRITTEN]
    assert (tmp_path / "out" / "batch_id=1" / WRITTEN).read_bytes() == other
    with pytest.raises(RuntimeError, match="driver lost at the rename"):
        sink.write(frame, 2)
    assert not (tmp_path / "out" / "batch_id=2" / WRITTEN).exists() and sink.written(2) is None
    assert [name for name in left(2) if not name.startswith("_attempt-")][0] == used[-1][1]
    assert sorted(r["id"] for r in read_results(spark, str(tmp_path / "out")).collect()) == [1, 2]
    assert [u[0] for u in used[:2]] == ["create", "rename"] and used[0][1] == used[1][1] and used[1][2] == WRITTEN
    assert re.fullmatch(temporary, used[0][1])

    class Store:
        def __init__(self, scheme: str, namespace: bool) -> None:
            self.scheme, self.namespace = scheme, namespace

        def getScheme(self) -> str:
            return self.scheme

        def hasPathCapability(self, where: Any, capability: str) -> bool:
            return self.namespace and capability == "fs.capability.paths.acls"
    assert [renames_into_place(Store(scheme, namespace), None) for scheme, namespace in (
        ("hdfs", False), ("abfss", True), ("abfs", True), ("abfss", False), ("s3a", True), ("file", True))] == [
        True, True, True, False, False, False]


def test_stream_sink_winner_and_replay_delete_temporary_marker_files_older_than_a_few_minutes(spark, pg, tmp_path,
                                                                                             monkeypatch):
    """On an HDFS-like filesystem (the marker renamed into place), batch_id=0 and 1 hold temporary
    marker files of drivers that died before their rename: one ten minutes old (a driver restarted
    soon after a crash), one just written (a losing driver may be about to rename it). The winner of
    micro-batch 0, once its marker is made, and the replay of micro-batch 1 (marked before) delete the
    old one and keep the new one, the marker and the named attempt (before: only files older than an
    hour were deleted, and the ten-minute-old one stayed)."""
    from pipelines import stream_job
    from pipelines.stream_job import COUNTS, WRITTEN, AckSink

    catalog = pg.deploy(work_queue("temporaries"))
    options = direct_sink_options(pg, catalog, "temporaries", tmp_path, "1d-query")
    out = tmp_path / "out"
    old, new = (f"{WRITTEN}.{digit * 32}.tmp" for digit in "01")
    for batch_id in (0, 1):
        (out / f"batch_id={batch_id}").mkdir(parents=True)
        for name in (old, new):
            (out / f"batch_id={batch_id}" / name).write_text('{"query": "1d-query"}')
        ten_minutes_ago = time.time() - 10 * 60
        os.utime(out / f"batch_id={batch_id}" / old, (ten_minutes_ago, ten_minutes_ago))
    named = "_attempt-" + "a" * 32
    spark.createDataFrame([(2, "t2", "w", None)], "id long, lease_token string, worker string, error string"
                          ).write.parquet(str(out / "batch_id=1" / named))
    (out / "batch_id=1" / WRITTEN).write_text(json.dumps({"query": "1d-query", "batch_id": 1, "attempt": named}))
    renamed: list[str] = []

    class Hdfs(HdfsFs):
        def rename(self, source: Any, target: Any, *options: Any) -> Any:
            renamed.append(target.getName())
            return super().rename(source, target, *options)

    monkeypatch.setattr(stream_job, "HadoopFiles", files_through(Hdfs))
    sink = AckSink(str(out), options, checkpoint=str(tmp_path / "checkpoint"))
    sink.acknowledge = lambda spark_, batch_id, stored=None: dict.fromkeys(COUNTS, 0)
    sink(spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string"), 0)
    sink(spark.createDataFrame([], "id long, lease_token string, worker string, error string"), 1)
    assert renamed == [WRITTEN]                         # micro-batch 0's marker, renamed into place
    attempt = json.loads((out / "batch_id=0" / WRITTEN).read_text())["attempt"]
    for batch_id, kept in ((0, attempt), (1, named)):
        assert sorted(p.name for p in (out / f"batch_id={batch_id}").iterdir() if not p.name.startswith(".")) == (
            sorted([WRITTEN, new, kept]))


def test_stream_sink_loser_whose_temporary_marker_is_deleted_before_its_close_lost_the_race(spark, pg, tmp_path):
    """On an HDFS-like filesystem another driver makes micro-batch 0's marker and then, as its
    cleanup may, deletes this driver's temporary marker file between its create and its close, which
    fails (HDFS: FileNotFoundException, the file is gone). A failure while the marker exists is a
    lost race: the PipelineError "another driver runs the query", this driver's attempt folder
    deleted, the other's marker and attempt kept (before: the close's raw Py4JJavaError)."""
    from py4j.protocol import Py4JJavaError

    from pipelines.stream_job import WRITTEN, AckSink, HadoopFiles

    catalog = pg.deploy(work_queue("deletedtemp"))
    options = direct_sink_options(pg, catalog, "deletedtemp", tmp_path, "1e-query")
    batch = tmp_path / "out" / "batch_id=0"
    other_attempt = "_attempt-" + "0" * 32
    other = json.dumps({"query": "1e-query", "batch_id": 0, "attempt": other_attempt}).encode("utf-8")

    class DeletedBeforeClose(HdfsFs):
        def create(self, where: Any, overwrite: bool) -> Any:
            stream = self.fs.create(where, overwrite)
            fs = self.fs

            class Deleted:                  # the winner's rows, its marker, and its cleanup of this file
                def write(self, data: bytearray) -> None:
                    stream.write(data)

                def close(self) -> None:
                    stream.close()
                    spark.createDataFrame([(2, "t2", "w", None)], frame.schema).write.parquet(str(batch / other_attempt))
                    assert plain.create_new(str(batch / WRITTEN), other)
                    fs.delete(where, False)
                    raise Py4JJavaError("An error occurred while calling o1.close", plain.jvm.java.io.FileNotFoundException(
                        f"File does not exist: {where} (inode 16386) Holder DFSClient_1 does not have any open files."))
            return Deleted()

    plain = HadoopFiles(spark)
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink._files = files_through(DeletedBeforeClose)(spark)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.deletedtemp: the marker of .*/out/batch_id=0 "
                                            r"appeared while this driver wrote the micro-batch: another driver runs"):
        sink.write(frame, 0)
    assert sorted(p.name for p in batch.iterdir() if not p.name.startswith(".")) == [other_attempt, WRITTEN]
    assert (batch / WRITTEN).read_bytes() == other


def test_stream_sink_retried_create_that_made_our_marker_wins(spark, pg, tmp_path):
    """A create whose first try reached the store and whose retry answered "already exists" (ABFS's
    409 after a broken connection, S3's 412) reports a lost race, yet the marker names this
    driver's attempt: the sink reads the marker, keeps its attempt folder and goes on (before: it
    deleted the folder its own marker names, and every replay failed). An empty marker after a
    failed create is refused without deleting anything."""
    from pipelines.stream_job import WRITTEN, AckSink, HadoopFiles

    catalog = pg.deploy(work_queue("retried"))
    options = direct_sink_options(pg, catalog, "retried", tmp_path, "4d-query")

    class RetriedFiles(HadoopFiles):
        """The first try creates the marker (with this content, or empty), the retry answers False."""

        def create_new(self, path: str, data: bytes) -> bool:
            super().create_new(path, b"" if "batch_id=1/" in path else data)
            return False

    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink._files = RetriedFiles(spark)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    assert sorted(sink.write(frame, 0).select("id").collect()) == [(1,)]
    marked = json.loads((tmp_path / "out" / "batch_id=0" / WRITTEN).read_text())
    assert marked["query"] == "4d-query" and attempt_folders(tmp_path / "out", 0) == [marked["attempt"]]
    assert sink.written(0) == f"{sink.folder(0)}/{marked['attempt']}"
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.retried: creating .*/out/batch_id=1/"
                                            r"_tablequeue_written failed and it is now missing, empty or unreadable"):
        sink.write(frame, 1)
    assert len(attempt_folders(tmp_path / "out", 1)) == 1
    assert (tmp_path / "out" / "batch_id=1" / WRITTEN).read_bytes() == b""


def broken_marker(spark: Any, pg: "Postgres", tmp_path: Path, marker: str) -> tuple[Any, Any, Catalog]:
    """An AckSink, a frame of 2 leased messages written to an attempt folder of batch_id=0, and that
    micro-batch's marker holding `marker`."""
    from pipelines.stream_job import WRITTEN, AckSink

    catalog = pg.deploy(work_queue("broken", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "broken", tmp_path, "6e-query")
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    frame = spark.createDataFrame([(*lease, None, "x") for lease in leased(pg, catalog, "broken", 2)], SINK_ROWS)
    frame.write.parquet(str(tmp_path / "out" / "batch_id=0" / ("_attempt-" + "a" * 32)))
    (tmp_path / "out" / "batch_id=0" / WRITTEN).write_text(marker)
    return sink, frame, catalog


def test_stream_sink_empty_marker_is_refused_as_a_dead_drivers_by_the_replay_and_read_results(spark, pg, tmp_path):
    """An empty marker next to an attempt folder (a driver died between create and close) is its own
    PipelineError, "delete it and restart", for the replay and for read_results; nothing is
    acknowledged (before: the replay said "written by another streaming query ... a new checkpoint
    needs a new output folder", and read_results skipped the micro-batch: 0 rows, no error)."""
    from pipelines.stream_job import read_results

    sink, frame, catalog = broken_marker(spark, pg, tmp_path, "")
    empty = r".*/out/batch_id=0/_tablequeue_written is empty or unreadable: a driver is writing it now \(retry\), or " \
            r"one died while writing it; nothing was acknowledged from it: delete it only if it stays empty while " \
            r"no driver of the query runs"
    with pytest.raises(PipelineError, match=empty):
        read_results(spark, str(tmp_path / "out"))
    with pytest.raises(PipelineError, match=empty):
        sink(frame, 0)
    assert attempt_folders(tmp_path / "out", 0) == ["_attempt-" + "a" * 32]       # the replay deleted nothing
    assert sink.counts["completed"] == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'broken', '_history')}") == 0


def test_stream_sink_marker_naming_a_missing_folder_is_refused_naming_the_marker(spark, pg, tmp_path):
    """A marker naming an attempt folder that is gone is a PipelineError naming the marker and the
    folder, for the replay and for read_results (before: Spark's PATH_NOT_FOUND)."""
    from pipelines.stream_job import read_results

    named = json.dumps({"query": "6e-query", "batch_id": 0, "attempt": "_attempt-" + "b" * 32})
    sink, frame, catalog = broken_marker(spark, pg, tmp_path, named)
    gone = r".*/out/batch_id=0/_tablequeue_written names _attempt-b{32}, which is gone"
    with pytest.raises(PipelineError, match=gone):
        read_results(spark, str(tmp_path / "out"))
    with pytest.raises(PipelineError, match=gone):
        sink(frame, 0)
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'broken', '_history')}") == 0


def test_stream_sink_acknowledges_and_reads_a_micro_batch_of_the_layout_before_attempt_folders(spark, pg, tmp_path):
    """A micro-batch written before attempt folders (rows in batch_id=N itself, a marker without
    "attempt") is replayed after the upgrade: its stored rows are acknowledged (the replay's own
    frame is empty), and read_results returns it next to a micro-batch of the new layout, both with
    their batch_id."""
    from pipelines.stream_job import WRITTEN, AckSink, read_results

    catalog = pg.deploy(work_queue("upgraded", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "upgraded", tmp_path, "9d-query")
    output = tmp_path / "out"
    old, new = leased(pg, catalog, "upgraded", 3, worker="w-old"), leased(pg, catalog, "upgraded", 2, 3, "w-new")
    spark.createDataFrame([(*lease, None, "old") for lease in old], SINK_ROWS).write.parquet(str(output / "batch_id=0"))
    (output / "batch_id=0" / WRITTEN).write_text(json.dumps({"query": "9d-query", "batch_id": 0}))
    sink = AckSink(str(output), options, checkpoint=str(tmp_path / "checkpoint"))
    sink(spark.createDataFrame([], SINK_ROWS), 0)
    sink(spark.createDataFrame([(*lease, None, "new") for lease in new], SINK_ROWS), 1)
    assert sink.counts["completed"] == 5
    assert attempt_folders(output, 0) == [] and "attempt" in json.loads((output / "batch_id=1" / WRITTEN).read_text())
    stored = sorted((r["id"], r["written_by"], r["batch_id"]) for r in read_results(spark, str(output)).collect())
    assert stored == sorted([(lease[0], "old", 0) for lease in old] + [(lease[0], "new", 1) for lease in new])
    history = pg.rows(f"SELECT id FROM {table(catalog, 'upgraded', '_history')}")
    assert sorted(r["id"] for r in history) == sorted(lease[0] for lease in old + new)


def test_stream_sink_replay_deletes_the_attempt_folders_its_marker_does_not_name(spark, pg, tmp_path):
    """Micro-batch 0's marker names attempt A; next to it are attempt B (a driver that crashed after
    its write, before its marker) and C (a second driver that lost the marker race and died before
    deleting it). Micro-batch 1 is of the layout before attempt folders (the marker names batch_id=1
    itself) with an attempt folder D beside it. Their replays acknowledge the named rows and delete
    B, C and D, as a first write deletes the attempt folders its marker does not name (before: a
    replay left them forever); A and batch_id=1's own rows stay and read_results returns them."""
    from pipelines.stream_job import WRITTEN, AckSink, read_results

    catalog = pg.deploy(work_queue("leftover", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "leftover", tmp_path, "2a-query")
    output = tmp_path / "out"
    named, old = leased(pg, catalog, "leftover", 3, worker="w-a"), leased(pg, catalog, "leftover", 2, 3, "w-old")
    a, b, c, d = (f"_attempt-{letter * 32}" for letter in "abcd")
    for folder, leases, written_by in (("batch_id=0/" + a, named, "A"), ("batch_id=0/" + b, named, "B"),
                                        ("batch_id=0/" + c, named, "C"), ("batch_id=1", old, "old"),
                                        ("batch_id=1/" + d, old, "D")):
        spark.createDataFrame([(*lease, None, written_by) for lease in leases], SINK_ROWS).write.parquet(
            str(output / folder))
    (output / "batch_id=0" / WRITTEN).write_text(json.dumps({"query": "2a-query", "batch_id": 0, "attempt": a}))
    (output / "batch_id=1" / WRITTEN).write_text(json.dumps({"query": "2a-query", "batch_id": 1}))
    sink = AckSink(str(output), options, checkpoint=str(tmp_path / "checkpoint"))
    sink(spark.createDataFrame([], SINK_ROWS), 0)
    sink(spark.createDataFrame([], SINK_ROWS), 1)
    assert attempt_folders(output, 0) == [a] and attempt_folders(output, 1) == []
    assert sink.counts["completed"] == 5
    stored = sorted((r["id"], r["written_by"], r["batch_id"]) for r in read_results(spark, str(output)).collect())
    assert stored == sorted([(lease[0], "A", 0) for lease in named] + [(lease[0], "old", 1) for lease in old])
    history = pg.rows(f"SELECT id FROM {table(catalog, 'leftover', '_history')}")
    assert sorted(r["id"] for r in history) == sorted(lease[0] for lease in named + old)


def marked_beside(spark: Any, pg: "Postgres", tmp_path: Path, queue: str, query: str, unnamed: str, written_by: str
                  ) -> tuple[dict, Catalog, list[tuple], str]:
    """The reader's options of a new work queue `queue` (checkpoint of query id `query`), and micro-batch
    0 of 3 leased messages stored twice: in attempt folder X (written_by "X"), which its marker names,
    and in attempt folder `unnamed` (written_by `written_by`) beside it. Returns the options, the
    catalog, the leases and X's name."""
    from pipelines.stream_job import WRITTEN

    catalog = pg.deploy(work_queue(queue, lease_seconds=600))
    options = direct_sink_options(pg, catalog, queue, tmp_path, query)
    named = leased(pg, catalog, queue, 3, worker="w-a")
    x = "_attempt-" + "1" * 32
    for folder, by in ((x, "X"), (unnamed, written_by)):
        spark.createDataFrame([(*lease, None, by) for lease in named], SINK_ROWS).write.parquet(
            str(tmp_path / "out" / "batch_id=0" / folder))
    (tmp_path / "out" / "batch_id=0" / WRITTEN).write_text(json.dumps({"query": query, "batch_id": 0, "attempt": x}))
    return options, catalog, named, x


def test_stream_sink_replay_on_a_store_without_an_atomic_create_deletes_no_attempt_folder(spark, pg, tmp_path,
                                                                                           monkeypatch):
    """On a store without an atomic create (HadoopFiles.atomic_create False: S3A without the
    conditional create, gs, a shared mount) a second driver can replace the marker. Here, just after
    the replay read the marker (naming X), a zombie driver that passed written() before the marker
    existed "creates" it by an overwrite naming its own attempt Y, and deletes X as unnamed (its first
    write's cleanup). The replay deletes no attempt folder on such a store: Y, which the marker names
    now, keeps its rows, the replay acknowledges them and read_results returns them (before: the
    replay deleted Y as unnamed, no copy of the micro-batch was left and read_results failed for the
    whole output)."""
    from pipelines import stream_job
    from pipelines.stream_job import WRITTEN, AckSink, read_results

    y = "_attempt-" + "2" * 32
    options, catalog, named, x = marked_beside(spark, pg, tmp_path, "unguarded", "4f-query", y, "Y")
    out = tmp_path / "out"
    replaced: list[str] = []

    class Unguarded(stream_job.HadoopFiles):
        def atomic_create(self, path: str) -> bool:
            return False

        def read_text(self, path: str) -> str:
            text = super().read_text(path)
            if path.endswith(WRITTEN) and not replaced:          # the zombie, right after the replay's read
                replaced.append(text)
                (out / "batch_id=0" / WRITTEN).write_text(json.dumps({"query": "4f-query", "batch_id": 0,
                                                                       "attempt": y}))
                shutil.rmtree(out / "batch_id=0" / x)
            return text

    monkeypatch.setattr(stream_job, "HadoopFiles", Unguarded)
    sink = AckSink(str(out), options, checkpoint=str(tmp_path / "checkpoint"))
    sink(spark.createDataFrame([], SINK_ROWS), 0)
    assert replaced and json.loads(replaced[0])["attempt"] == x
    assert attempt_folders(out, 0) == [y]
    assert sorted(r["written_by"] for r in read_results(spark, str(out)).collect()) == ["Y"] * 3
    assert sink.counts["completed"] == 3
    history = pg.rows(f"SELECT id FROM {table(catalog, 'unguarded', '_history')}")
    assert sorted(r["id"] for r in history) == sorted(lease[0] for lease in named)


def test_stream_sink_replay_acknowledges_before_its_cleanup_and_a_failing_delete_only_warns(spark, pg, tmp_path,
                                                                                            monkeypatch):
    """A replay of micro-batch 0 (marker naming X, an unnamed attempt B beside it) on a store that
    refuses the delete of B (no delete right on the output prefix, an Object Lock bucket, throttling):
    the replay acknowledges X's rows first, and the failing delete logs one WARNING naming the
    queue, the micro-batch and B, and fails nothing; B stays, unread (before: the replay deleted
    before acknowledging, so every restart failed at this micro-batch and acknowledged nothing)."""
    from py4j.protocol import Py4JJavaError

    from pipelines import stream_job
    from pipelines.stream_job import AckSink, read_results

    b = "_attempt-" + "b" * 32
    options, catalog, named, x = marked_beside(spark, pg, tmp_path, "undeletable", "5b-query", b, "B")
    out = tmp_path / "out"

    class NoDelete(stream_job.HadoopFiles):
        def delete(self, path: str) -> None:
            raise Py4JJavaError("An error occurred while calling o1.delete",
                                self.jvm.java.nio.file.AccessDeniedException(f"{path}: 403 Forbidden"))

    monkeypatch.setattr(stream_job, "HadoopFiles", NoDelete)
    sink = AckSink(str(out), options, checkpoint=str(tmp_path / "checkpoint"))
    with logged_by_the_pipelines(logging.WARNING) as logged:
        sink(spark.createDataFrame([], SINK_ROWS), 0)
    history = pg.rows(f"SELECT id FROM {table(catalog, 'undeletable', '_history')}")
    assert sorted(r["id"] for r in history) == sorted(lease[0] for lease in named)
    assert sink.counts["completed"] == 3
    assert attempt_folders(out, 0) == sorted([x, b])
    assert len(logged) == 1 and re.search(rf"stream [a-z0-9_]+\.undeletable: micro-batch 0: not deleted, attempt "
                                          rf"folders its marker does not name .*/out/batch_id=0/{b} \(.*403 Forbidden",
                                          logged[0].getMessage())
    assert sorted(r["written_by"] for r in read_results(spark, str(out)).collect()) == ["X"] * 3


def test_stream_sink_directory_of_the_markers_name_is_refused_naming_it(spark, pg, tmp_path):
    """A directory named _tablequeue_written in batch_id=N (made by hand or by a tool). HDFS's plain
    rename(tmp, marker) would move the temporary file into it and return true, a "won" marker that
    is no file: on HDFS the sink renames with Options.Rename.NONE, which the NameNode refuses with a
    plain IOException for a directory (a RemoteException, not FileAlreadyExistsException: micro-batch
    0); where rename has no such option (an ABFS-like store whose rename moves into the directory,
    micro-batch 1) a true rename whose target is no file is refused; a local create(marker,
    overwrite=false) refuses it too (micro-batch 2). Each: a PipelineError naming the directory and
    saying it is a directory where the marker file belongs and to move or delete it, nothing
    acknowledged, no marker, no temporary file, this attempt's folder deleted and the directory
    keeping nothing of the sink's (before: "creating ... failed and it is now missing, empty or
    unreadable", which sent the reader after another driver)."""
    from py4j.protocol import Py4JJavaError

    from pipelines.stream_job import WRITTEN, AckSink, HadoopFiles

    catalog = pg.deploy(work_queue("renamedir"))
    options = direct_sink_options(pg, catalog, "renamedir", tmp_path, "6a-query")

    renamed: list[tuple] = []

    class Hdfs(HdfsFs):
        def rename(self, source: Any, target: Any, *options: Any) -> Any:
            called = (target.getParent().getName(), len(options))
            try:
                answer = super().rename(source, target, *options)
            except Py4JJavaError as exc:
                renamed.append((*called, exc.java_exception.getClass().getName()))
                raise
            renamed.append((*called, answer))
            return answer

    class AbfsLike(Hdfs):
        def getScheme(self) -> str:
            return "abfss"

        def hasPathCapability(self, where: Any, capability: str) -> bool:
            return capability == "fs.capability.paths.acls"

    class DirectoryFiles(HadoopFiles):
        def _at(self, path: str) -> tuple[Any, Any]:
            where, fs = super()._at(path)
            return where, {"batch_id=0": Hdfs, "batch_id=1": AbfsLike}.get(path.split("/")[-2], FakeFs)(fs)

    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink._files = DirectoryFiles(spark)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    for batch_id in (0, 1, 2):
        batch = tmp_path / "out" / f"batch_id={batch_id}"
        (batch / WRITTEN).mkdir(parents=True)
        marker = rf".*/out/batch_id={batch_id}/{WRITTEN}"
        with pytest.raises(PipelineError, match=rf"stream [a-z0-9_]+\.renamedir: {marker} is a directory, where the "
                                                rf"marker file of micro-batch {batch_id} belongs: the micro-batch "
                                                rf"cannot be marked, and nothing of it was acknowledged: move {marker} "
                                                rf"aside .* or delete "
                                                rf"it, then restart the query"):
            sink.write(frame, batch_id)
        with pytest.raises(PipelineError, match=rf"{marker} is a directory, where the marker file"):
            sink.written(batch_id)
        assert list((batch / WRITTEN).iterdir()) == []
        assert sorted(p.name for p in batch.iterdir() if not p.name.startswith(".")) == [WRITTEN]
    # HDFS: only the rename with the option, refused by the NameNode's IOException; the ABFS-like
    # rename moved the file into the directory (true), and the sink took it back out.
    assert renamed == [("batch_id=0", 1, "org.apache.hadoop.ipc.RemoteException"), ("batch_id=1", 0, True)]


def test_stream_sink_refuses_a_directory_of_the_markers_name_before_writing(spark, pg, tmp_path):
    """A directory named _tablequeue_written in batch_id=0 before micro-batch 0 comes: the sink's
    look-up of the marker (written()) lists it and refuses the micro-batch with the PipelineError
    naming it, before writing anything or acknowledging (before: the whole micro-batch was written
    and checked for duplicates, then refused at the marker and its attempt folder deleted)."""
    from pipelines.stream_job import WRITTEN, AckSink

    catalog = pg.deploy(work_queue("markerdir"))
    options = direct_sink_options(pg, catalog, "markerdir", tmp_path, "6b-query")
    (tmp_path / "out" / "batch_id=0" / WRITTEN).mkdir(parents=True)
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    sink.write = lambda frame, batch_id: pytest.fail(f"micro-batch {batch_id} was written")
    marker = rf".*/out/batch_id=0/{WRITTEN}"
    with pytest.raises(PipelineError, match=rf"^stream [a-z0-9_]+\.markerdir: {marker} is a directory, where the marker "
                                            rf"file of micro-batch 0 belongs: the micro-batch cannot be marked, and "
                                            rf"nothing of it was written or acknowledged: move {marker} aside \(the "
                                            rf"sink put nothing in it\) or delete it, then restart the query$"):
        sink(spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string"), 0)
    assert sink.counts["completed"] == 0
    assert sorted(p.name for p in (tmp_path / "out" / "batch_id=0").iterdir()) == [WRITTEN]


def test_stream_sink_refusals_reach_the_user_when_the_store_refuses_the_attempts_delete(spark, pg, tmp_path):
    """A store that refuses deletes (S3A's AccessDeniedException, 403: no delete right on the output
    prefix) while the sink refuses a micro-batch after writing it and deletes its own attempt folder:
    a directory of the marker's name appeared during the write (micro-batch 0), another driver's
    marker appeared during it (1), a message has two rows (2). Each refusal's PipelineError reaches
    the user, with one WARNING naming the attempt folder left (before: the delete's raw
    Py4JJavaError replaced it). On an HDFS-like store (3), where the marker is a temporary file
    renamed into place, the loser's temporary file is not deleted either: one WARNING more, naming it
    (before: the raw Py4JJavaError of that delete)."""
    from py4j.protocol import Py4JJavaError

    from pipelines.stream_job import WRITTEN, AckSink

    catalog = pg.deploy(work_queue("nodelete"))
    options = direct_sink_options(pg, catalog, "nodelete", tmp_path, "6c-query")
    out = tmp_path / "out"
    other = json.dumps({"query": "6c-query", "batch_id": 1, "attempt": "_attempt-" + "0" * 32})

    class NoDelete(FakeFs):
        def delete(self, where: Any, recursive: bool) -> bool:
            raise Py4JJavaError("An error occurred while calling o1.delete", spark.sparkContext._jvm.java.nio.file
                                .AccessDeniedException(f"{where}: delete on {where}: 403 Forbidden"))

    class AppearingDuringTheWrite(AckSink):
        def refuse_duplicates(self, stored: Any, batch_id: int, folder: str) -> None:
            if batch_id == 0:
                (out / "batch_id=0" / WRITTEN).mkdir()
            if batch_id in (1, 3):
                (out / f"batch_id={batch_id}" / WRITTEN).write_text(other)
                spark.createDataFrame([(2, "t2", "w", None)], frame.schema).write.parquet(
                    str(out / f"batch_id={batch_id}" / ("_attempt-" + "0" * 32)))
            super().refuse_duplicates(stored, batch_id, folder)

    sink = AppearingDuringTheWrite(str(out), options, checkpoint=str(tmp_path / "checkpoint"))
    sink._files = files_through(NoDelete)(spark)
    frame = spark.createDataFrame([(1, "t1", "w", None)], "id long, lease_token string, worker string, error string")
    refused = (r"is a directory, where the marker file of micro-batch 0 belongs",
               r"the marker of .*/out/batch_id=1 appeared while this driver wrote the micro-batch",
               r"micro-batch 2 has more than one row for the message\(s\) with id 1")
    for batch_id, error in enumerate(refused):
        written = frame.unionAll(frame) if batch_id == 2 else frame
        with logged_by_the_pipelines(logging.WARNING) as logged:
            with pytest.raises(PipelineError, match=rf"^stream [a-z0-9_]+\.nodelete: .*{error}"):
                sink.write(written, batch_id)
        mine = [name for name in attempt_folders(out, batch_id) if name != "_attempt-" + "0" * 32]
        assert len(mine) == 1 and len(logged) == 1
        assert re.search(rf"stream [a-z0-9_]+\.nodelete: micro-batch {batch_id}: not deleted, the attempt folder "
                         rf".*/out/batch_id={batch_id}/{mine[0]} of the refused micro-batch \(nothing reads it; .*\): "
                         rf".*403 Forbidden", logged[0].getMessage())
    sink._files = files_through(lambda fs: NoDelete(HdfsFs(fs)))(spark)
    with logged_by_the_pipelines(logging.WARNING) as logged:
        with pytest.raises(PipelineError, match=rf"^stream [a-z0-9_]+\.nodelete: the marker of .*/out/batch_id=3 "
                                                rf"appeared while this driver wrote the micro-batch"):
            sink.write(frame, 3)
    temporary = [p.name for p in (out / "batch_id=3").iterdir() if p.name.endswith(".tmp")]
    assert len(temporary) == 1 and len(logged) == 2
    assert re.search(rf"^not deleted, the temporary marker file .*/out/batch_id=3/{re.escape(temporary[0])} of a race "
                     rf"for the marker this driver lost .*403 Forbidden", logged[0].getMessage())


def test_stream_sink_refuses_a_micro_batch_with_duplicate_rows_of_a_message(spark, pg, tmp_path):
    """A handler or join that gives a message two rows (here 6 of 7 messages, one of them once with
    an error) would complete a message twice, or complete and fail it at once: the micro-batch is
    refused naming the queue, the micro-batch and 5 of the ids; its attempt folder is deleted, no
    marker is written and no message is acknowledged (all still leased)."""
    from pipelines.stream_job import WRITTEN, AckSink

    catalog = pg.deploy(work_queue("exploded", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "exploded", tmp_path, "1b-query")
    output = tmp_path / "out"
    leases = leased(pg, catalog, "exploded", 7)
    rows = [(*lease, None, "x") for lease in leases] + [(*lease, "ValueError: second", "x") for lease in leases[:1]]
    rows += [(*lease, None, "x") for lease in leases[2:]]
    sink = AckSink(str(output), options, checkpoint=str(tmp_path / "checkpoint"))
    with pytest.raises(PipelineError, match=r"stream [a-z0-9_]+\.exploded: micro-batch 3 has more than one row for "
                                            r"the message\(s\) with id [0-9, ]+ \(at most 5 shown\): one row per "
                                            r"message: dedupe before the sink") as refused:
        sink(spark.createDataFrame(rows, SINK_ROWS), 3)
    named = {int(i) for i in re.search(r"with id ([0-9, ]+) ", str(refused.value)).group(1).split(", ")}
    assert len(named) == 5 and named <= {lease[0] for lease in leases if lease != leases[1]}
    assert attempt_folders(output, 3) == [] and not (output / "batch_id=3" / WRITTEN).exists()
    assert sink.counts["completed"] == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'exploded', '_history')}") == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'exploded', '_dead')}") == 0
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'exploded')} "
                     f"WHERE leased_by = 'w' AND last_error IS NULL") == 7


def test_stream_reader_has_a_lease_token_column_only_with_ack_sink(spark, pg, tmp_path):
    """A stream read with the default ack=commit keeps the columns it had before ack=sink existed
    (a schema-enforcing sink does not break); ack=sink adds lease_token for AckSink."""
    from pipelines.common import QueueTarget
    from pipelines.sources import target_options

    catalog = pg.deploy(work_queue("columns"))
    url_file = tmp_path / "url"
    url_file.write_text(pg.url)
    options = target_options(QueueTarget.of(pg.url, catalog, "columns"), str(url_file))
    columns = ["id", "payload", "enqueued_at", "attempts", "worker"]
    for ack, expected in ((None, columns), ("commit", columns), ("sink", [*columns, "lease_token"])):
        reader = spark.readStream.format("tablequeue").options(**options)
        assert (reader.option("ack", ack) if ack else reader).load().columns == expected


class DroppedAfterCommit(Exception):
    """What psycopg raises when the connection drops: is_transient() retries it."""

    sqlstate = "08006"


def test_stream_acknowledgement_counts_lost_after_a_retried_call_as_uncertain(monkeypatch):
    """complete_batch commits, then the connection drops before the answer: the call is tried again
    on a new connection and answers lost for every message (the first try completed them). Those
    are counted as uncertain, not lost; a first try's lost stays lost."""
    import pyarrow as pa

    import pipelines.stream_job as stream_job

    class Client:
        def __init__(self) -> None:
            self.held = {1, 2, 3, 4}

        def complete_batch(self, rows: list, worker: str) -> list:
            answer = [{"id": r["id"], "completed": r["id"] in self.held} for r in rows]
            self.held -= {r["id"] for r in rows}
            if worker == "w-dropped" and any(a["completed"] for a in answer):
                raise DroppedAfterCommit("server closed the connection unexpectedly")
            return answer

        def fail_batch(self, rows: list, worker: str, error: str, retry_after: Any) -> list:
            return [{"id": r["id"], "outcome": "retrying" if r["id"] in self.held else "lost"} for r in rows]

    client = Client()

    class Connection:
        def __init__(self, target: Any) -> None:
            pass

        def client(self) -> Client:
            return client

        def reset(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(stream_job, "Reconnecting", Connection)
    monkeypatch.setattr("pipelines.common.backoff_seconds", lambda attempt: 0.0)
    rows = [{"id": 1, "lease_token": "t", "worker": "w-dropped", "error": None},
            {"id": 2, "lease_token": "t", "worker": "w-dropped", "error": None},
            {"id": 3, "lease_token": "t", "worker": "w-ok", "error": "ValueError: no"},
            {"id": 9, "lease_token": "t", "worker": "w-ok", "error": None}]
    batches = [pa.RecordBatch.from_pylist(rows)]
    counts = next(stream_job.acknowledge_partition(SimpleNamespace(name="s.jobs"), 0, iter(batches))).to_pylist()[0]
    assert counts == {"completed": 0, "retrying": 1, "dead": 0, "lost": 1, "uncertain": 2}


def assert_nothing_leased(pg: "Postgres", catalog: Catalog, queue: str, count: int, checkpoint: Path) -> None:
    """The `count` messages of `queue` were never leased (no holder, no attempt spent: none can run
    out and go to the dead letters), and Spark recorded no micro-batch in `checkpoint`."""
    assert pg.rows(f"SELECT count(*) AS waiting, count(*) FILTER (WHERE leased_by IS NULL AND attempts = 0) AS "
                   f"untouched FROM {table(catalog, queue)}") == [{"waiting": count, "untouched": count}]
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, queue, '_dead')}") == 0
    assert not (checkpoint / "offsets").exists()


def test_stream_sink_refuses_a_new_checkpoint_on_an_output_written_by_another_query(spark, pg, tmp_path):
    """A query drains the queue into `output`; a second query with a new checkpoint (batch_id=0
    again) on the same output is refused before it starts (AckSink.prepare), naming the queue, the
    folder and the checkpoint, with a PipelineError: nothing leased, so nothing can run out and go to
    the dead letters, and no offset in the new checkpoint (before: refused at the first micro-batch,
    a StreamingQueryException, after the reader had leased the 20 messages, which with max_attempts=1
    went to the dead letters once their leases ran out)."""
    from pipelines.stream_job import run_stream

    catalog = pg.deploy(work_queue("reused", lease_seconds=120, max_attempts=1))
    output = str(tmp_path / "output")
    enqueue_numbered(pg, catalog, "reused", 20)
    first = run_stream(spark, pg.url, catalog, "reused", TRANSFORM, output, str(tmp_path / "checkpoint"),
                       partitions=1, messages_per_partition=50)
    assert first["completed"] == 20
    enqueue_numbered(pg, catalog, "reused", 20, first=20)
    with pytest.raises(PipelineError, match=r"^stream [a-z0-9_]+\.reused: .*/output/batch_id=0 was written by "
                                            r"another streaming query .* checkpoint .*/checkpoint-2 .* a new "
                                            r"checkpoint needs a new output folder"):
        run_stream(spark, pg.url, catalog, "reused", TRANSFORM, output, str(tmp_path / "checkpoint-2"),
                   partitions=1, messages_per_partition=50)
    assert_nothing_leased(pg, catalog, "reused", 20, tmp_path / "checkpoint-2")
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'reused', '_history')}") == 20


def test_stream_sink_prepare_checks_the_micro_batch_the_checkpoint_runs_first(spark, pg, tmp_path):
    """AckSink.prepare looks at the micro-batch Spark runs first from the checkpoint: with offsets
    0..2 (and a hidden .2.crc) and commits 0..1 it replays 2, so another query's marker in batch_id=2
    is refused, naming it, before the query starts (one in batch_id=0 is not looked at); once commits/2
    exists the query runs 3 next, and prepare passes, logging nothing for a local output (before: no
    prepare, the refusal came at the first micro-batch, after the reader leased it; and every output
    was logged as "out is file:/.../out")."""
    from pipelines.stream_job import WRITTEN, AckSink

    catalog = pg.deploy(work_queue("firstbatch"))
    options = direct_sink_options(pg, catalog, "firstbatch", tmp_path, "6a-query")
    for folder, names in (("offsets", ["0", "1", "2", ".2.crc"]), ("commits", ["0", "1"])):
        (tmp_path / "checkpoint" / folder).mkdir()
        for name in names:
            (tmp_path / "checkpoint" / folder / name).write_text("v1\n")
    for batch_id in (0, 2):
        (tmp_path / "out" / f"batch_id={batch_id}").mkdir(parents=True)
        (tmp_path / "out" / f"batch_id={batch_id}" / WRITTEN).write_text(json.dumps({"query": "another-query",
                                                                                    "batch_id": batch_id}))
    sink = AckSink(str(tmp_path / "out"), options, checkpoint=str(tmp_path / "checkpoint"))
    with pytest.raises(PipelineError, match=r"^stream [a-z0-9_]+\.firstbatch: .*/out/batch_id=2 was written by another "
                                            r"streaming query \(another-query\), not by the query of checkpoint "
                                            r".*/checkpoint \(6a-query\): a new checkpoint needs a new output"):
        sink.prepare(spark)
    (tmp_path / "checkpoint" / "commits" / "2").write_text("v1\n")
    with logged_by_the_pipelines() as logged:
        sink.prepare(spark)
    assert sink.first_batch() == 3
    assert [r.getMessage() for r in logged] == []      # a local output: no mount table, nothing to log


def test_stream_refuses_an_output_with_glob_characters_before_leasing_anything(spark, pg, tmp_path):
    """run_stream into out[1] (Spark's reader would glob it) is refused before the query starts
    (AckSink.prepare) with the PipelineError naming the output: none of the 5 messages leased, so none
    runs out and goes to the dead letters (max_attempts=1), and no offset in the checkpoint (before:
    a StreamingQueryException FOREACH_BATCH_USER_FUNCTION_ERROR at the first micro-batch, after the
    reader had leased all 5 and Spark had written offsets/0; 3 seconds later they were dead)."""
    from pipelines.stream_job import run_stream

    catalog = pg.deploy(work_queue("globstream", lease_seconds=3, max_attempts=1))
    enqueue_numbered(pg, catalog, "globstream", 5)
    output = str(tmp_path / "out[1]")
    with pytest.raises(PipelineError, match=rf"^stream [a-z0-9_]+\.globstream: output {re.escape(output)} "
                                            rf"\(file:{re.escape(output)}\) holds \[ \]: "):
        run_stream(spark, pg.url, catalog, "globstream", TRANSFORM, output, str(tmp_path / "checkpoint"),
                   partitions=1, messages_per_partition=50, lease_seconds=3)
    assert not (tmp_path / "out[1]").exists()
    assert_nothing_leased(pg, catalog, "globstream", 5, tmp_path / "checkpoint")


# -- the stream reader's driver and task sides, called directly (no Spark job) -----------------------
def stream_reader(pg: "Postgres", catalog: Catalog, queue: str, **options: str) -> Any:
    from pipelines.common import QueueTarget
    from pipelines.sources import QueueStreamReader, SourceOptions

    lowered = {"partitions": "1", "messagesperpartition": "10", "idlewaitseconds": "0",
               **{k.lower(): v for k, v in options.items()}}
    return QueueStreamReader(SourceOptions(QueueTarget.of(pg.url, catalog, queue), lowered))


def enqueue_numbered(pg: "Postgres", catalog: Catalog, queue: str, count: int, first: int = 0,
                     **fields: Any) -> None:
    """Messages first .. first + count - 1 (payload id, dedupe key), with `fields` (priority=...)."""
    from tablequeue.client import QueueClient

    conn = connect(pg.url, autocommit=True)
    try:
        QueueClient.for_catalog(conn, "postgres", catalog, queue).enqueue_batch(
            [{"payload": {"id": i, "name": f"customer {i}"}, "dedupe_key": str(i), **fields}
             for i in range(first, first + count)])
    finally:
        conn.close()


def when_a_session_waits(pg: "Postgres", condition: str, then: Any, done: threading.Event) -> threading.Thread:
    """A thread that runs then() once pg_stat_activity shows a session matching `condition` (or
    when `done` is set: the code under test never got there)."""
    def watch() -> None:
        while not done.wait(0.05):
            if pg.scalar(f"SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND ({condition})"):
                break
        then()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_stream_read_waits_for_a_lease_another_session_has_locked(pg):
    """The driver's heartbeat holds a row lock (extend_lease in its open transaction) while the task
    reads: the task's dequeue skips that row, yet commit() completes every recorded lease, so the
    task must deliver it too, not a subset."""
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("locked"))
    enqueue_numbered(pg, catalog, "locked", 20)
    reader = stream_reader(pg, catalog, "locked", messagesPerPartition="10")
    start = reader.initialOffset()
    end = reader.latestOffset(start)
    worker, acks = end["leases"][0]["worker"], end["leases"][0]["acks"]
    victim, token = acks[3]
    heartbeat = connect(pg.url, autocommit=False)
    done = threading.Event()
    try:
        assert QueueClient.for_catalog(heartbeat, "postgres", catalog, "locked").extend_lease(
            victim, worker, 30, lease_token=token)
        holder = when_a_session_waits(pg, "wait_event_type = 'Lock'", heartbeat.commit, done)
        rows = list(reader.read(reader.partitions(start, end)[0]))
    finally:
        done.set()
        holder.join()
        heartbeat.close()
    assert sorted(r[0] for r in rows) == sorted(int(i) for i, _ in acks)
    reader.commit(end)
    reader.stop()
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'locked', '_history')} WHERE id = %s", int(victim)) == 1
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'locked')}") == 10


def test_stream_driver_reconnects_after_its_connection_is_killed(pg):
    catalog = pg.deploy(work_queue("failover"))
    enqueue_numbered(pg, catalog, "failover", 20)
    reader = stream_reader(pg, catalog, "failover")
    first = reader.latestOffset(reader.initialOffset())
    backend = reader._driver["connection"].client().conn.info.backend_pid
    pg.scalar("SELECT pg_terminate_backend(%s)", backend)
    try:
        second = reader.latestOffset(first)        # completes the first micro-batch, leases the next
    finally:
        reader.stop()
    assert second["seq"] == 2 and len(second["leases"][0]["acks"]) == 10
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'failover', '_history')}") == 10


def test_stream_task_read_rides_out_dropped_connections_and_names_the_worker_when_it_gives_up(pg, monkeypatch):
    """The task's first connect fails, and the first dequeue, release and extend_lease each lose
    their connection (a failover): each is tried again on a new connection under the same worker
    name, and the task delivers the recorded leases. One recorded token is stale, so the task both
    releases (its row came back with the live token) and checks a lease (extend_lease). An error
    that is not transient ends the task naming the queue, the call and the worker."""
    import psycopg

    import pipelines.common as common
    from pipelines.sources import LeasePartition
    from tablequeue.client import QueueClient

    catalog = pg.deploy(work_queue("taskfail"))
    enqueue_numbered(pg, catalog, "taskfail", 10)
    reader = stream_reader(pg, catalog, "taskfail")
    end = reader.latestOffset(reader.initialOffset())
    reader.stop()
    worker, acks = end["leases"][0]["worker"], end["leases"][0]["acks"]
    stale = acks[0][0]
    partition = LeasePartition(worker, [[stale, "00000000-0000-0000-0000-000000000000"], *acks[1:]])

    real_connect, connects = common.connect, []

    def first_connect_fails(*args: Any, **kwargs: Any) -> Any:
        connects.append(1)
        if len(connects) == 1:
            raise psycopg.OperationalError("connection refused: the server is starting up")
        return real_connect(*args, **kwargs)

    dropped: list[str] = []

    def drops_its_connection_first(verb: str) -> Any:
        real = getattr(QueueClient, verb)

        def call(self: QueueClient, *args: Any, **kwargs: Any) -> Any:
            if verb not in dropped:
                dropped.append(verb)
                pg.scalar("SELECT pg_terminate_backend(%s)", self.conn.info.backend_pid)
            return real(self, *args, **kwargs)
        return call

    monkeypatch.setattr(common, "connect", first_connect_fails)
    monkeypatch.setattr(common, "backoff_seconds", lambda attempt: 0.0)
    for verb in ("dequeue", "release", "extend_lease"):
        monkeypatch.setattr(QueueClient, verb, drops_its_connection_first(verb))
    with logged_by_the_pipelines(logging.WARNING) as logged:
        rows = list(reader.read(partition))
    assert sorted(dropped) == ["dequeue", "extend_lease", "release"] and len(connects) == 5
    assert sorted(r[0] for r in rows) == sorted(int(i) for i, _ in acks[1:])
    assert any(f"taskfail: dequeue for {worker}: transient error" in r.getMessage() for r in logged)

    def refused(self: QueueClient, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("queue 'taskfail': field 'batch_size' must be from 1 to 1000")

    monkeypatch.setattr(QueueClient, "dequeue", refused)
    with pytest.raises(PipelineError, match=rf"stream {catalog.schema}.taskfail: dequeue for worker {worker} failed "
                                            r"\(ValueError: queue 'taskfail': field 'batch_size'"):
        list(reader.read(partition))


def test_lease_heartbeat_keeps_its_interval_whatever_a_beat_takes_and_warns_of_a_slow_beat(monkeypatch):
    """Each extend_lease takes 0.1 s, the lease 1 s (a beat every third of it). Two leases: beats
    start every 0.33 s, not every 0.33 s plus the beat's own 0.2 s. Five leases: a beat outlasts the
    interval, and a WARNING names the queue, the leases and how long the beat took."""
    import pipelines.common as common
    from pipelines.common import LeaseHeartbeat

    class SlowClient:
        def __init__(self) -> None:
            self.calls: list[tuple[float, Any]] = []

        def extend_lease(self, message_id: Any, worker: str, lease_seconds: int, lease_token: Any) -> bool:
            self.calls.append((time.monotonic(), message_id))
            time.sleep(0.1)
            return True

    client = SlowClient()

    class Connection:
        def __init__(self, target: Any) -> None:
            pass

        def client(self) -> SlowClient:
            return client

        def reset(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(common, "Reconnecting", Connection)

    def beat_starts(leases: int, beats: int) -> list[float]:
        client.calls.clear()
        heartbeat = LeaseHeartbeat(SimpleNamespace(name="s.beats"), 1)
        heartbeat.hold(1, [{"worker": "w", "acks": [[i, "t"] for i in range(leases)]}])
        deadline = time.monotonic() + 10
        while sum(1 for _, i in client.calls if i == 0) < beats + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        heartbeat.close()
        return [at for at, i in client.calls if i == 0]

    # Two leases (0.2 s a beat, 0.13 s to spare on a busy machine): beats 0.33 s apart, 0.53 when
    # each gap also held the beat before.
    starts = beat_starts(2, 4)
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:])][:4]
    assert len(gaps) == 4 and all(0.25 < gap < 0.47 for gap in gaps), gaps
    # Three slow beats in a row: one warning (then at most one per HEARTBEAT_WARN_EVERY), not three.
    with logged_by_the_pipelines(logging.WARNING) as logged:
        beat_starts(5, 3)
    assert [bool(re.fullmatch(r"s\.beats: lease heartbeat over 5 lease\(s\) took \d+\.\ds, more than a third of "
                              r"the 1s lease: leases may run out .*", r.getMessage())) for r in logged] == [True], \
        [r.getMessage() for r in logged]


def test_stream_replayed_micro_batch_keeps_its_leases_alive(pg):
    """After a restart Spark replays the uncommitted micro-batch through partitions() alone: its
    leases need the heartbeat, or a replay longer than leaseSeconds reads none of them."""
    catalog = pg.deploy(work_queue("replayed"))
    enqueue_numbered(pg, catalog, "replayed", 10)
    before = stream_reader(pg, catalog, "replayed", leaseSeconds="3")
    start = before.initialOffset()
    end = before.latestOffset(start)
    before.stop()                                   # the driver goes away before the batch ran
    after = stream_reader(pg, catalog, "replayed", leaseSeconds="3")
    try:
        partition = after.partitions(start, end)[0]
        time.sleep(4.5)                             # the replay outlasts the lease
        rows = list(after.read(partition))
        after.commit(end)
    finally:
        after.stop()
    assert len(rows) == 10
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'replayed', '_history')} WHERE attempts = 1") == 10


def test_stream_queries_with_the_same_consumer_never_share_leases(pg):
    catalog = pg.deploy(work_queue("shared"))
    enqueue_numbered(pg, catalog, "shared", 30)
    first, second = (stream_reader(pg, catalog, "shared", consumer="nightly") for _ in range(2))
    try:
        ends = [reader.latestOffset(reader.initialOffset()) for reader in (first, second)]
    finally:
        first.stop()
        second.stop()
    ids = [{i for lease in end["leases"] for i, _ in lease["acks"]} for end in ends]
    assert len(ids[0]) == len(ids[1]) == 10 and not ids[0] & ids[1]


def test_stream_idle_latest_offset_waits_for_a_message(pg):
    """Nothing ready: latestOffset waits (idleWaitSeconds) and leases what arrives meanwhile, instead
    of returning at once for Spark to call it again in a tight loop."""
    catalog = pg.deploy(work_queue("idle"))
    reader = stream_reader(pg, catalog, "idle", idleWaitSeconds="20")
    start = reader.initialOffset()
    done = threading.Event()
    arrives = when_a_session_waits(pg, "state = 'active' AND query LIKE '%wait_ms =>%'",
                                   lambda: enqueue_numbered(pg, catalog, "idle", 1), done)
    try:
        end = reader.latestOffset(start)
    finally:
        done.set()
        arrives.join()
        reader.stop()
    assert end["seq"] == 1 and len(end["leases"][0]["acks"]) == 1


def test_stream_available_now_leaves_what_is_enqueued_after_it_started_to_the_next_run(pg):
    """A run of trigger(availableNow=True) reads what was enqueued by the time it started: later
    messages are released at once (no attempt spent) and the run ends (latestOffset returns its
    start) without waiting for more, completing the micro-batch before."""
    catalog = pg.deploy(work_queue("cutoff"))
    enqueue_numbered(pg, catalog, "cutoff", 4)
    reader = stream_reader(pg, catalog, "cutoff", idleWaitSeconds="20")
    try:
        reader.prepareForTriggerAvailableNow()
        time.sleep(0.01)
        enqueue_numbered(pg, catalog, "cutoff", 6, first=100)
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        started = time.monotonic()
        assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end
        assert time.monotonic() - started < 5          # no idle wait for messages of the next run
    finally:
        reader.stop()
    assert sorted(int(i) for lease in end["leases"] for i, _ in lease["acks"]) == [1, 2, 3, 4]
    assert pg.rows(f"SELECT count(*) AS n, count(leased_by) AS held, max(attempts) AS most "
                   f"FROM {table(catalog, 'cutoff')}") == [{"n": 6, "held": 0, "most": 0}]
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'cutoff', '_history')}") == 4


def available_now_run(reader: Any) -> list[list[int]]:
    """The rest of a run of trigger(availableNow=True) prepared on `reader`, as Spark drives it:
    latestOffset until it returns its start, each micro-batch committed before the next is planned;
    the message ids of each."""
    batches, start = [], reader.initialOffset()
    while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
        batches.append(sorted(int(i) for lease in end["leases"] for i, _ in lease["acks"]))
        reader.commit(end)
        start = end
    return batches


@pytest.mark.parametrize("older, newer, partitions, per_partition, batches", [
    (4, 7, 2, 1, [[1, 2], [3, 4]]),
    (5, 3, 2, 2, [[1, 2, 3, 4], [5]]),   # each partition keeps its share, the next partition leases the rest
])
def test_stream_available_now_on_a_priority_queue_reads_the_older_messages_behind_newer_ones(
        pg, older, newer, partitions, per_partition, batches):
    """Messages enqueued after the start come first in priority order: a micro-batch holds them
    while it asks for more, so every older, lower-priority message is read in this run (a
    data-engineer review found the run ending with them unread when they were released at once),
    and the newer ones are left queued, attempt given back."""
    catalog = pg.deploy(work_queue("ranked", priority=True))
    enqueue_numbered(pg, catalog, "ranked", older, first=1)
    reader = stream_reader(pg, catalog, "ranked", partitions=str(partitions), messagesPerPartition=str(per_partition))
    try:
        reader.prepareForTriggerAvailableNow()
        time.sleep(0.01)
        enqueue_numbered(pg, catalog, "ranked", newer, first=100, priority=5)
        read = available_now_run(reader)
    finally:
        reader.stop()
    assert read == batches
    assert pg.rows(f"SELECT count(*) AS n, count(leased_by) AS held, max(attempts) AS most, min(priority) AS low "
                   f"FROM {table(catalog, 'ranked')}") == [{"n": newer, "held": 0, "most": 0, "low": 5}]
    assert pg.scalar(f"SELECT count(*) FROM {table(catalog, 'ranked', '_history')}") == older


def test_stream_available_now_reads_past_a_wall_of_newer_messages_and_stops_where_it_cannot(pg, monkeypatch):
    """More newer messages ahead than the partitions' dequeues hold (MAX_BATCH each): with nothing
    of the run found, pages of MAX_BATCH under their own worker names read past them, and find the
    older messages (a partition's share at a time) or the queue's end; past WALL_PAGES pages the run
    cannot tell whether older messages remain, and stops with an error instead of ending as if it
    had read them all. Nothing stays leased, no attempt is spent."""
    monkeypatch.setattr("pipelines.sources.WALL_PAGES", 2)
    catalog = pg.deploy(work_queue("walled", priority=True))
    enqueue_numbered(pg, catalog, "walled", 3, first=1)
    readers = {1: stream_reader(pg, catalog, "walled", partitions="1", messagesPerPartition="1"),
               2: stream_reader(pg, catalog, "walled", partitions="2", messagesPerPartition="2")}
    try:
        for reader in readers.values():
            reader.prepareForTriggerAvailableNow()
        time.sleep(0.01)
        for first in (10_000, 20_000, 30_000):
            enqueue_numbered(pg, catalog, "walled", MAX_BATCH, first=first, priority=9)
        # One partition's MAX_BATCH and two pages: as many newer messages as it holds, none older.
        with pytest.raises(PipelineError, match=rf"walled: trigger\(availableNow=True\) met {3 * MAX_BATCH} messages "
                                                rf"enqueued or due after the run started and none older ahead of "
                                                rf"them \(its partitions' dequeues, then 2 page\(s\) of {MAX_BATCH};"
                                                rf" .* Use trigger\(processingTime=...\) on this queue$"):
            readers[1].latestOffset(readers[1].initialOffset(), readers[1].getDefaultReadLimit())
        assert pg.scalar(f"SELECT count(leased_by) + coalesce(sum(attempts), 0) FROM {table(catalog, 'walled')}") == 0
        # Two partitions' MAX_BATCH and a page of newer ones, then the second page finds the older
        # ones: a partition's share, the rest in the next micro-batch; the one after, the end.
        assert available_now_run(readers[2]) == [[1, 2], [3]]
    finally:
        for reader in readers.values():
            reader.stop()
    assert pg.rows(f"SELECT count(*) AS n, count(leased_by) AS held, max(attempts) AS most "
                   f"FROM {table(catalog, 'walled')}") == [{"n": 3 * MAX_BATCH, "held": 0, "most": 0}]


def test_stream_available_now_releases_what_it_held_when_a_lease_fails_and_logs_a_release_that_fails(pg, caplog):
    """A dequeue that fails (after its retries) leaves nothing of the call leased, an earlier
    partition's kept rows included (no offset records them), and the error raised is that
    dequeue's; at a release that fails (after its retries: the database is likely gone) the rest
    are left to their leases, with one line logged."""
    catalog = pg.deploy(work_queue("faulty", priority=True))
    enqueue_numbered(pg, catalog, "faulty", 2, first=1)
    reader = stream_reader(pg, catalog, "faulty", partitions="2", messagesPerPartition="1")
    try:
        reader.prepareForTriggerAvailableNow()
        time.sleep(0.01)
        enqueue_numbered(pg, catalog, "faulty", 4, first=100, priority=5)
        calls, call = Counter(), reader._call

        def failing(what: str, at: int) -> Any:
            def wrapped(what_: str, fn: Any) -> Any:
                calls[what_] += 1
                if what_ == what and calls[what_] == at:
                    raise PipelineError(f"injected: {what_} {at}")
                return call(what_, fn)
            return wrapped

        # Partition 0 asks for 1, 2, 4 and 8 (the 4 newer, then both older: it keeps message 1 and
        # releases 2 at once); partition 1's first dequeue, which would lease message 2, fails.
        reader._call = failing("lease", 5)
        with pytest.raises(PipelineError, match=r"^injected: lease 5$"):
            reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
        assert calls["release"] == 1   # the surplus; after the error, released at once, not retried
        assert pg.scalar(f"SELECT count(leased_by) + coalesce(sum(attempts), 0) FROM {table(catalog, 'faulty')}") == 0

        calls.clear()
        reader._call = failing("release", 3)   # the second of the 4 newer ones: the other 2 are left
        with caplog.at_level(logging.WARNING, logger=log().name):
            offset = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
        assert sorted(int(i) for lease in offset["leases"] for i, _ in lease["acks"]) == [1, 2]
        warnings = [r.getMessage() for r in caplog.records if "could not be released" in r.getMessage()]
        assert len(warnings) == 1 and re.fullmatch(
            r"stream \w+\.faulty: 3 of 4 passed-over message\(s\) could not be released \(PipelineError: "
            r"injected: release 3\); left to their leases running out, an attempt spent", warnings[0]), warnings
        assert calls["release"] == 1 + 2
        assert pg.rows(f"SELECT priority, count(leased_by) AS held, count(*) AS n FROM {table(catalog, 'faulty')} "
                       f"GROUP BY priority ORDER BY priority") == [{"priority": 0, "held": 2, "n": 2},
                                                                    {"priority": 5, "held": 3, "n": 4}]
    finally:
        reader.stop()


def test_stream_offsets_are_capped(pg):
    catalog = pg.deploy(work_queue("capped"))
    with pytest.raises(PipelineError, match=r"capped: partitions x messagesPerPartition = 20000 leases per "
                                            r"micro-batch; at most 10000"):
        stream_reader(pg, catalog, "capped", partitions="20", messagesPerPartition="1000")


# -- credentials, options, retries (no Spark job) -------------------------------------------------------
def test_a_url_with_a_password_is_refused_and_taken_from_a_file_or_the_environment(tmp_path, monkeypatch):
    from pipelines.common import URL_ENV, resolve_url

    with pytest.raises(PipelineError, match=r"--url holds a password, which the Spark UI, the event log and `ps`"):
        resolve_url("postgresql://ada:secret@db/queues")
    assert resolve_url("postgresql://ada@db/queues") == "postgresql://ada@db/queues"
    url_file = tmp_path / "url"
    url_file.write_text("\npostgresql://ada:secret@db/queues\n")
    assert resolve_url(None, str(url_file)) == "postgresql://ada:secret@db/queues"
    monkeypatch.setenv(URL_ENV, "postgresql://ada:env@db/queues")
    assert resolve_url() == "postgresql://ada:env@db/queues"
    monkeypatch.delenv(URL_ENV)
    with pytest.raises(PipelineError, match=rf"no database URL: give --url \(without a password\), a URL file, or set \${URL_ENV}"):
        resolve_url()


def test_a_password_in_the_query_string_or_odbc_connect_is_refused_and_masked():
    """A password given as a query parameter (libpq's password, sslpassword; pwd) or as a field of
    odbc_connect shows on a command line as much as one in the user info: refused alike, naming
    where it is, and masked wherever the pipelines describe a target."""
    from urllib.parse import quote_plus

    from pipelines.common import QueueTarget, resolve_url
    from tablequeue.catalog import Queue
    from tablequeue.engines import parse_url

    odbc = "mssql+pyodbc://?odbc_connect=" + quote_plus(
        "DRIVER={ODBC Driver 18 for SQL Server};SERVER=db,1433;UID=ada;PWD={se;c}}ret};Encrypt=yes")
    refused = {"postgresql://ada@db/queues?sslmode=require&password=secret": r"\(query parameter password\)",
               "postgresql://db/queues?sslpassword=secret": r"\(query parameter sslpassword\)",
               "mssql+pyodbc://ada@db/queues?driver=ODBC+Driver+18+for+SQL+Server&PWD=secret": r"\(query parameter PWD\)",
               odbc: r"\(PWD in odbc_connect\)"}
    for url, where in refused.items():
        with pytest.raises(PipelineError, match=rf"option url holds a password {where}, which the Spark UI, the "
                                                r"event log and `ps` would show: put the URL in a file"):
            resolve_url(url, given_as="option url")
    trusted = "mssql+pyodbc://?odbc_connect=" + quote_plus("DRIVER={ODBC Driver 18};SERVER=db;Trusted_Connection=yes")
    assert resolve_url(trusted) == trusted

    queue = Queue("jobs", "work", "json", {})
    described = [QueueTarget(url, parse_url(url).dialect, "s", queue).describe()
                 for url in [*refused, "postgresql://ada:secret@db/queues"]]
    assert not any("secret" in line or "c}ret" in line for line in described), described
    assert described[0] == "queue s.jobs (work) on postgresql://ada@db/queues?sslmode=require&password=***"
    assert "UID=ada;PWD=***;Encrypt=yes" in described[3] and described[4].endswith("postgresql://ada:***@db/queues")


def test_job_options_come_from_spark_conf_and_the_command_line_wins(spark):
    from pipelines.common import conf_arguments
    from pipelines.drain_job import build_parser

    parser = build_parser()
    spark.conf.set("spark.tablequeue.batch-size", "500")
    spark.conf.set("spark.tablequeue.finalize-only", "true")
    spark.conf.set("spark.tablequeue.queue", "emails")
    try:
        args = parser.parse_args(conf_arguments(spark, parser) + ["--queue", "orders"])
    finally:
        for name in ("batch-size", "finalize-only", "queue"):
            spark.conf.unset(f"spark.tablequeue.{name}")
    assert (args.batch_size, args.finalize_only, args.queue) == (500, True, "orders")


def test_transient_errors_are_retried_after_jittered_pauses_and_others_are_not():
    import psycopg

    from pipelines.common import with_retries

    pauses: list[float] = []
    calls: list[int] = []
    reconnects: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return "sent"

    assert with_retries("enqueue", flaky, retries=5, on_retry=lambda: reconnects.append(1), sleep=pauses.append) == "sent"
    assert len(calls) == 3 and len(reconnects) == 2
    assert 0 <= pauses[0] <= 0.5 and 0 <= pauses[1] <= 1.0
    with pytest.raises(ValueError):
        with_retries("enqueue", lambda: (_ for _ in ()).throw(ValueError("bad payload")), retries=5,
                     sleep=pauses.append)
    assert len(pauses) == 2        # a non-transient error is not retried
    with pytest.raises(psycopg.OperationalError):
        with_retries("enqueue", lambda: (_ for _ in ()).throw(psycopg.OperationalError("down")), retries=1,
                     sleep=pauses.append)


def test_stream_two_first_writers_on_a_store_without_an_atomic_create_keep_both_attempts(spark, pg, tmp_path,
                                                                                         monkeypatch):
    """A store whose create is a check and then an unconditional write (the data-engineer re-review's
    y4): driver 2 wrote Y and passed its check; driver 1 then writes X, "creates" the marker and
    acknowledges X; driver 2's write lands, replacing the marker (Y). Where each winner deleted the
    attempt folders its marker does not name, each deleted the other's: no copy left, the marker naming
    a folder that is gone, read_results failing for the whole output. Now nothing is deleted there."""
    from pipelines import stream_job
    from pipelines.stream_job import WRITTEN, AckSink, read_results

    catalog = pg.deploy(work_queue("twowin", lease_seconds=600))
    options = direct_sink_options(pg, catalog, "twowin", tmp_path, "twowin-query")
    named = leased(pg, catalog, "twowin", 3, worker="w-a")
    out = tmp_path / "out"

    class Unguarded(stream_job.HadoopFiles):
        before_put: Any = None

        def atomic_create(self, path: str) -> bool:
            return False

        def create_new(self, path: str, data: bytes) -> bool:      # its check passed before: a plain PUT
            if self.before_put is not None:
                self.before_put()
            where, fs = self._at(path)
            stream = fs.create(where, True)
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()
            return True

    monkeypatch.setattr(stream_job, "HadoopFiles", Unguarded)
    first = AckSink(str(out), options, checkpoint=str(tmp_path / "checkpoint"))
    second = AckSink(str(out), options, checkpoint=str(tmp_path / "checkpoint"))
    frame_x = spark.createDataFrame([(*lease, None, "X") for lease in named], SINK_ROWS)
    frame_y = spark.createDataFrame([(*lease, None, "Y") for lease in named], SINK_ROWS)
    second._files = Unguarded(spark)
    second._files.before_put = lambda: first(frame_x, 0)
    second.write(frame_y, 0)

    assert first.counts["completed"] == 3
    assert len(attempt_folders(out, 0)) == 2
    marker = json.loads((out / "batch_id=0" / WRITTEN).read_text())
    assert marker["attempt"] in attempt_folders(out, 0)
    assert sorted(r["written_by"] for r in read_results(spark, str(out)).collect()) == ["Y"] * 3
