"""Helpers shared by the pipelines: the SparkSession, the queue a job targets, JDBC options, logging.

Nothing here holds global state except the logging handler the first call installs; everything a
Spark task needs travels in a QueueTarget (plain, picklable values), so the same closures run in a
local[*] session and on a cluster.
"""
from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import importlib
import json
import logging
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import parse_qsl, unquote, urlsplit

from tablequeue.catalog import Catalog, Queue, load_catalog
from tablequeue.client import QueueClient
from tablequeue.engines import connect, mssql_connection_string, parse_url, url_secrets

# The folder that holds the pipelines package: the checkout, or site-packages when installed.
PIPELINES_PARENT = Path(__file__).resolve().parents[1]
POSTGRES_JDBC_JAR = Path("/usr/share/java/postgresql.jar")   # Debian: libpostgresql-jdbc-java
LOGGER_NAME = "tablequeue.pipelines"
# Where the jobs and the data sources find the database URL when no file names it (see resolve_url).
URL_ENV = "TABLEQUEUE_URL"
# Job options set with `spark-submit --conf spark.tablequeue.<option>=...` (see options_from_conf).
CONF_PREFIX = "spark.tablequeue."
MAX_BATCH = 1000                 # every verb's batch cap (DESIGN.md §3b)
# A Spark task's tries of each queue call on transient errors (a failover): with the jittered pauses
# of with_retries that is about half a minute before the task gives up and Spark runs it again.
TASK_RETRIES = 8
HEARTBEAT_WARN_EVERY = 300.0     # seconds between two warnings of the same kind from one heartbeat

# Sane defaults for a laptop or a 2-core CI machine; a cluster's spark-submit settings win.
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "1g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    # Queue work is I/O-bound on the database: no speculative duplicates of a consumer task.
    "spark.speculation": "false",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
}


class PipelineError(RuntimeError):
    """A job that must not run as asked (wrong queue kind, missing option, bad argument)."""


def log() -> logging.Logger:
    """The pipelines' logger; installs a stderr handler once per process (driver or Python worker)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(os.environ.get("TABLEQUEUE_PIPELINES_LOG", "INFO"))
        logger.propagate = False
    return logger


# -- credentials ---------------------------------------------------------------------------------
def resolve_url(url: str | None = None, url_file: str | None = None, *, given_as: str = "--url") -> str:
    """The database URL: `url` when it holds no password, else the first line of `url_file`, else
    $TABLEQUEUE_URL. A password in `url` (its user info, a query parameter such as password or PWD,
    a field of odbc_connect) is refused: a command line, a Spark option or a conf value shows in
    `ps`, the Spark UI and the event log; a file or the environment does not."""
    if url:
        secrets_found = url_secrets(url)
        if secrets_found:
            where = ", ".join(w for w in secrets_found if w)
            raise PipelineError(f"{given_as} holds a password{f' ({where})' if where else ''}, which the Spark UI, "
                                f"the event log and `ps` would show: put the URL in a file (--url-file, option "
                                f"urlFile) or in ${URL_ENV}, or leave the password to the driver's own means "
                                f"(PGPASSFILE, Kerberos)")
        return url
    if url_file:
        try:
            lines = Path(url_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise PipelineError(f"cannot read the database URL from {url_file}: {exc.strerror}") from None
        first = next((line.strip() for line in lines if line.strip()), "")
        if not first:
            raise PipelineError(f"{url_file} holds no database URL (expected one line: postgresql://... "
                                f"or mssql+pyodbc://...)")
        return first
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV]
    raise PipelineError(f"no database URL: give {given_as} (without a password), a URL file, or set ${URL_ENV}")


def conf_arguments(spark: Any, parser: Any) -> list[str]:
    """Command-line arguments from the Spark conf: `--conf spark.tablequeue.<option>=<value>` (the
    option as spelled on the command line without its dashes: spark.tablequeue.batch-size=500) gives
    `--<option> <value>`, a flag's value true gives the flag. Put them before the real arguments,
    which then win."""
    found: list[str] = []
    for action in parser._actions:                      # argparse keeps no public list of options
        long = next((o for o in action.option_strings if o.startswith("--")), None)
        if long is None or long == "--help":
            continue
        value = spark.conf.get(CONF_PREFIX + long[2:], None)
        if value is None:
            continue
        if action.nargs == 0:                           # a flag (store_true)
            if value.strip().lower() in ("true", "1", "yes"):
                found.append(long)
        else:
            found += [long, value]
    return found


def add_queue_arguments(parser: Any, queue_help: str | None = None) -> None:
    """The options every job takes to find its queue: --url, --url-file, --catalog, --queue."""
    parser.add_argument("--url", help="postgresql://... or mssql+pyodbc://... without a password "
                                      "(default: --url-file, else $TABLEQUEUE_URL)")
    parser.add_argument("--url-file", help="a file whose first line is the database URL")
    parser.add_argument("--catalog", help="the catalog YAML the queue was deployed from")
    parser.add_argument("--queue", help=queue_help)


def job_main(app_name: str, parser: Any, argv: list[str] | None, required: Any,
             run: Callable[[Any, Any, str], Any]) -> tuple[int, Any]:
    """The body of each job's main(): a session, the arguments (the Spark conf's, then the command
    line's), the required options (a tuple, or a function of the arguments giving one), then
    run(spark, args, url). Returns (0, what run returned), or (2, None) after printing a
    PipelineError; the session is stopped either way."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    spark = build_session(app_name, master=args.master)
    try:
        args = parser.parse_args(conf_arguments(spark, parser) + argv)
        require_options(args, tuple(required(args) if callable(required) else required), parser.prog)
        return 0, run(spark, args, resolve_url(args.url, args.url_file))
    except PipelineError as exc:
        print(f"{parser.prog.rsplit('.', 1)[-1]}: {exc}", file=sys.stderr)
        return 2, None
    finally:
        spark.stop()


def require_options(args: Any, names: tuple[str, ...], prog: str) -> None:
    missing = [f"--{n}" for n in names if getattr(args, n.replace("-", "_")) in (None, "")]
    if missing:
        raise PipelineError(f"{prog}: missing {', '.join(missing)} (on the command line or as "
                            f"--conf {CONF_PREFIX}<option>)")


def is_connect_session(spark: Any) -> bool:
    """A Spark Connect session: a client without a SparkContext (its sparkContext raises)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


@contextlib.contextmanager
def job_description(spark: Any, text: str) -> Iterator[None]:
    """Name the Spark jobs started inside the block in the UI (and the event log). Spark Connect
    sessions have no SparkContext: there the block just runs."""
    if is_connect_session(spark):
        yield
        return
    context = spark.sparkContext
    previous = context.getLocalProperty("spark.job.description")
    context.setJobDescription(text)
    try:
        yield
    finally:
        context.setJobDescription(previous)


# -- transient errors ------------------------------------------------------------------------------
# SQL Server error numbers the contract calls transient (DESIGN.md §4) and SQLSTATE classes of both
# engines that mean "try again": serialization failure, deadlock, lock timeout, connection trouble,
# a server shutting down or not yet accepting connections (a failover).
TRANSIENT_MSSQL_NUMBERS = ("1205", "1222", "3960")
TRANSIENT_SQLSTATES = ("40001", "40P01", "55P03", "57P01", "57P02", "57P03", "08000", "08001", "08003",
                       "08004", "08006", "08S01", "HYT00", "HYT01")


def is_transient(exc: BaseException) -> bool:
    """Would the same call succeed later (deadlock, lock timeout, failover, dropped connection)?"""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is None and getattr(exc, "args", None) and isinstance(exc.args[0], str):
        sqlstate = exc.args[0]                      # pyodbc: args = (SQLSTATE, message)
    if sqlstate in TRANSIENT_SQLSTATES:
        return True
    text = str(exc)
    if any(f"({number})" in text for number in TRANSIENT_MSSQL_NUMBERS):
        return True
    module = type(exc).__module__ or ""
    return type(exc).__name__ == "OperationalError" and module.split(".")[0] in ("psycopg", "pyodbc")


def backoff_seconds(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Full jitter: a random pause up to base * 2**attempt (at most cap), so that the tasks a
    failover interrupted at the same moment do not come back at the same moment."""
    return random.uniform(0.0, min(cap, base * (2 ** attempt)))


def with_retries(what: str, call: Callable[[], Any], retries: int, on_retry: Callable[[], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> Any:
    """call(), again after a jittered pause when it fails with a transient error, up to `retries`
    more times; on_retry runs before each new try (to reconnect). Other errors are raised at once."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - sorted by is_transient below
            if attempt == retries or not is_transient(exc):
                raise
            pause = backoff_seconds(attempt)
            log().warning("%s: transient error (%s), try %s of %s in %.1fs", what,
                          str(exc).splitlines()[0] if str(exc) else type(exc).__name__, attempt + 2,
                          retries + 1, pause)
            sleep(pause)
            if on_retry is not None:
                on_retry()
    raise AssertionError("unreachable")


# -- connections that outlive a failover, leases that outlive a slow batch ---------------------------
class Reconnecting:
    """A QueueClient whose connection is opened on first use and again after reset() (a transient
    error: a failover drops the connection). lock_timeout_seconds: the session's lock timeout (a
    wait for a row lock past it fails with the engine's lock-timeout error, which is transient);
    default the engine's, none."""

    def __init__(self, target: QueueTarget, lock_timeout_seconds: int | None = None) -> None:
        self.target, self._conn, self._client = target, None, None
        self.lock_timeout_seconds = lock_timeout_seconds

    def client(self) -> Any:
        if self._client is None:
            self._conn = connect(self.target.url, autocommit=True)
            if self.lock_timeout_seconds is not None:
                milliseconds = int(self.lock_timeout_seconds * 1000)
                if self.target.dialect == "postgres":
                    self._conn.execute("SELECT pg_catalog.set_config('lock_timeout', %s, false)", (f"{milliseconds}ms",))
                else:
                    self._conn.execute(f"SET LOCK_TIMEOUT {milliseconds}")
            self._client = QueueClient(self._conn, self.target.dialect, self.target.schema, self.target.queue)
        return self._client

    def reset(self) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):   # a dropped connection may not close cleanly
                self._conn.close()
        self._conn, self._client = None, None


class LeaseHeartbeat:
    """Keeps leases alive while their work runs: every third of the lease, extend_lease on each
    lease held (by its worker and token), from a thread with its own connection, so that neither a
    slow transform call nor a slow micro-batch lets a lease run out. Leases are held under a key
    (a batch) as [{"worker": name, "acks": [[id, lease token], ...]}, ...] and dropped when settled."""

    def __init__(self, target: QueueTarget, lease_seconds: int | None) -> None:
        self.target = target
        self.lease_seconds = lease_seconds or int(target.queue.options["lease_seconds"])
        self._held: dict[Any, list] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, key: Any, leases: list) -> None:
        with self._lock:
            self._held[key] = leases
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.target.name}", daemon=True)
            self._thread.start()

    def drop(self, key: Any) -> None:
        with self._lock:
            self._held.pop(key, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        # Beats are timed from the start of the one before: waiting a full interval after each beat
        # would stretch the gap by the beat's own duration, which grows with the leases held.
        interval = self.lease_seconds / 3
        connection = Reconnecting(self.target)
        next_beat = time.monotonic() + interval
        warned_at: dict[str, float] = {}
        unsaid: dict[str, int] = {}

        def warn(kind: str, message: str, *args: Any) -> None:
            # A failing or slow heartbeat is so on every beat (one every few seconds, in every task):
            # said once, then at most once per HEARTBEAT_WARN_EVERY with how often it was so since.
            now = time.monotonic()
            if kind in warned_at and now - warned_at[kind] < HEARTBEAT_WARN_EVERY:
                unsaid[kind] = unsaid.get(kind, 0) + 1
                return
            since = unsaid.pop(kind, 0)
            warned_at[kind] = now
            log().warning(message + (f" (and {since} more beat(s) like it since the last warning)" if since else ""),
                          *args)
        try:
            while not self._stop.wait(max(0.0, next_beat - time.monotonic())):
                started = time.monotonic()
                next_beat = started + interval
                with self._lock:
                    held = [(lease["worker"], ack) for leases in self._held.values() for lease in leases
                            for ack in lease["acks"]]
                try:
                    client = connection.client()
                    for worker, (message_id, token) in held:
                        client.extend_lease(message_id, worker, self.lease_seconds, lease_token=token)
                except Exception as exc:  # noqa: BLE001 - the next beat tries again on a new connection
                    warn("failed", "%s: lease heartbeat failed (%s)%s", self.target.name,
                         str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                         "; reconnecting" if is_transient(exc) else "")
                    connection.reset()
                took = time.monotonic() - started
                if took > interval:
                    # The next beat starts at once, and a lease extended late in this one ran on
                    # with less than two thirds of its time left.
                    warn("slow", "%s: lease heartbeat over %s lease(s) took %.1fs, more than a third of "
                         "the %ss lease: leases may run out before they are extended; hold fewer per batch "
                         "or lease longer", self.target.name, len(held), took, self.lease_seconds)
        finally:
            connection.close()


# -- the SparkSession ---------------------------------------------------------------------------
def under_spark_submit() -> bool:
    """True when spark-submit (or pyspark shell) started this process: it owns master and config."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None,
                  ship_code: bool | None = None) -> Any:
    """A SparkSession for the pipelines.

    Started with plain `python`: master `master` (default local[*]) and LOCAL_DEFAULTS. Started by
    spark-submit: its master and settings stand, only `conf` is added. The PostgreSQL JDBC driver
    from /usr/share/java/postgresql.jar is added to spark.jars when present. Executors get this
    package and tablequeue: through PYTHONPATH in local mode, through addPyFile on a cluster.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    local = not under_spark_submit()
    settings: dict[str, str] = {}
    if local:
        master = master or os.environ.get("TABLEQUEUE_SPARK_MASTER", "local[*]")
        builder = builder.master(master)
        settings.update(LOCAL_DEFAULTS)
        # Python workers must be this interpreter (the venv with psycopg and tablequeue), and must
        # find the pipelines package; both are read when the JVM starts its Python workers.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        paths = [str(PIPELINES_PARENT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if POSTGRES_JDBC_JAR.exists():
        settings["spark.jars"] = str(POSTGRES_JDBC_JAR)
    # Parquet timestamps as UTC-adjusted microseconds (not the legacy INT96), so that pyarrow,
    # pandas and other engines read the output's times as the instants they are.
    settings["spark.sql.parquet.outputTimestampType"] = "TIMESTAMP_MICROS"
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from pipelines.sources import register

    register(spark)
    if is_connect_session(spark):
        # The server owns master, jars and conf; the code reaches its Python workers as artifacts.
        if ship_code:
            add_code_to_executors(spark)
        return spark
    if local and master and "spark.jars" in settings:
        existing = spark.sparkContext.getConf().get("spark.jars", "")
        if str(POSTGRES_JDBC_JAR) not in existing:
            log().warning("a SparkSession already existed without %s; JDBC reads may not find the "
                          "PostgreSQL driver", POSTGRES_JDBC_JAR)
    if ship_code if ship_code is not None else not spark.sparkContext.master.startswith("local"):
        add_code_to_executors(spark)
    return spark


def add_code_to_executors(spark: Any) -> list[str]:
    """Zip the pure-Python packages `pipelines` and `tablequeue` and addPyFile them, so a cluster's
    executors import the same code as the driver. Third-party modules (psycopg, pyodbc, PyYAML,
    Jinja2) must be installed on the nodes or shipped as a packed environment (docs/pipelines.md)."""
    import tablequeue

    shipped = []
    folder = Path(tempfile.mkdtemp(prefix="tablequeue-pyfiles-"))
    for package_dir in (Path(__file__).resolve().parent, Path(tablequeue.__file__).resolve().parent):
        archive = folder / f"{package_dir.name}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(package_dir.rglob("*.py")):
                zf.write(path, path.relative_to(package_dir.parent))
        if is_connect_session(spark):
            spark.addArtifacts(str(archive), pyfile=True)
        else:
            spark.sparkContext.addPyFile(str(archive))
        shipped.append(str(archive))
    return shipped


@contextlib.contextmanager
def progress_monitor(spark: Any, label: str, interval_seconds: float = 10.0) -> Iterator[None]:
    """Log the task progress of the running job every interval (driver side) until the block ends.
    Spark Connect has no status tracker on the client: there the block just runs."""
    if is_connect_session(spark):
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval_seconds):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    log().info("%s: stage %s: %s/%s tasks done, %s running, %s failed", label, stage_id,
                               info.numCompletedTasks, info.numTasks, info.numActiveTasks,
                               info.numFailedTasks)

    thread = threading.Thread(target=watch, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


# -- the queue a job targets ----------------------------------------------------------------------
def resolve_catalog(catalog: Catalog | str | os.PathLike) -> Catalog:
    return catalog if isinstance(catalog, Catalog) else load_catalog(catalog)


@dataclass(frozen=True)
class QueueTarget:
    """Everything a Spark task needs to reach one queue: shipped to executors by pickling."""
    url: str
    dialect: str
    schema: str
    queue: Queue

    @classmethod
    def of(cls, url: str, catalog: Catalog | str | os.PathLike, queue: str) -> "QueueTarget":
        resolved = resolve_catalog(catalog)
        try:
            spec = resolved.queue(queue)
        except KeyError as exc:
            raise PipelineError(str(exc.args[0])) from None
        return cls(url, parse_url(url).dialect, resolved.schema, spec)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.queue.name}"

    def table(self, suffix: str) -> str:
        """Quoted name of one of the queue's tables (suffix '_history' or '_dead')."""
        name = f"{self.queue.name}{suffix}"
        return f'"{self.schema}"."{name}"' if self.dialect == "postgres" else f"[{self.schema}].[{name}]"

    def describe(self) -> str:
        return f"queue {self.name} ({self.queue.kind}) on {parse_url(self.url).describe()}"

    def require_kind(self, *kinds: str) -> None:
        if self.queue.kind not in kinds:
            raise PipelineError(f"{self.name} is a '{self.queue.kind}' queue; this job needs a queue of kind "
                                f"{' or '.join(repr(k) for k in kinds)}")

    @contextlib.contextmanager
    def client(self) -> Iterator[QueueClient]:
        """One autocommit connection and a QueueClient on it, closed (and rolled back) on exit."""
        conn = connect(self.url, autocommit=True)
        try:
            yield QueueClient(conn, self.dialect, self.schema, self.queue)
        finally:
            with contextlib.suppress(Exception):
                conn.close()


@contextlib.contextmanager
def transaction(client: QueueClient) -> Iterator[None]:
    """One explicit transaction on the client's autocommit connection: commit on success, roll back
    on an exception (and, when the process dies, the server rolls back as the connection drops)."""
    conn = client.conn
    if client.dialect == "postgres":
        with conn.transaction():
            yield
        return
    conn.autocommit = False
    try:
        yield
        conn.commit()
    except BaseException:
        with contextlib.suppress(Exception):
            conn.rollback()
        raise
    finally:
        with contextlib.suppress(Exception):
            conn.autocommit = True


def load_callable(dotted: str | Callable) -> Callable:
    """'package.module:function' (or 'package.module.function') -> the function."""
    if callable(dotted):
        return dotted
    module_name, sep, attr = dotted.partition(":")
    if not sep:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise PipelineError(f"{dotted!r} is not a dotted path to a function (package.module:function)")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PipelineError(f"cannot import {module_name!r} for {dotted!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise PipelineError(f"{module_name!r} has no attribute {attr!r} (from {dotted!r})")
        target = getattr(target, part)
    if not callable(target):
        raise PipelineError(f"{dotted!r} is not callable")
    return target


# -- JSON ---------------------------------------------------------------------------------------
def json_default(value: Any) -> Any:
    """How Spark row values that JSON lacks are written: stable, so hashes of rows are stable."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    return str(value)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace: the same row gives the same text in every run and on every node."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=json_default, allow_nan=False)


# -- JDBC ---------------------------------------------------------------------------------------
def jdbc_options(url: str) -> dict[str, str]:
    """The Spark JDBC options (url, user, password, driver) for a tablequeue database URL.

    postgresql://user:pw@host:port/db?sslmode=require -> jdbc:postgresql://host:port/db?sslmode=require
    mssql+pyodbc://user:pw@host:port/db?Encrypt=yes    -> jdbc:sqlserver://host:port;databaseName=db;encrypt=true
    (Microsoft's JDBC driver, mssql-jdbc, must be on spark.jars; see docs/pipelines.md.)
    """
    target = parse_url(url)
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    options: dict[str, str] = {}
    if parts.username:
        options["user"] = unquote(parts.username)
    if parts.password is not None:
        options["password"] = unquote(parts.password)
    host = parts.hostname or "localhost"
    database = unquote(parts.path.strip("/"))
    if target.dialect == "postgres":
        port = f":{parts.port}" if parts.port else ""
        jdbc = f"jdbc:postgresql://{host}{port}/{database}"
        passthrough = {k: v for k, v in query.items() if k in ("sslmode", "sslrootcert", "options",
                                                                "ApplicationName", "application_name")}
        if passthrough:
            jdbc += "?" + "&".join(f"{k}={v}" for k, v in passthrough.items())
        options.update(url=jdbc, driver="org.postgresql.Driver")
        return options
    if "odbc_connect" in query:
        fields = dict(item.split("=", 1) for item in mssql_connection_string(url).split(";") if "=" in item)
        server = fields.get("SERVER", "localhost").replace(",", ":")
        database = fields.get("DATABASE", "")
        options.update({k: v for k, v in (("user", fields.get("UID")),
                                          ("password", (fields.get("PWD") or "").strip("{}"))) if v})
    else:
        server = f"{host}:{parts.port}" if parts.port else host
    lowered = {k.lower(): v for k, v in query.items()}
    props = [f"databaseName={database}"] if database else []
    encrypt = lowered.get("encrypt")
    if encrypt is not None:
        props.append(f"encrypt={'true' if encrypt.lower() in ('yes', 'true', 'mandatory') else 'false'}")
    trust = lowered.get("trustservercertificate")
    if trust is not None:
        props.append(f"trustServerCertificate={'true' if trust.lower() in ('yes', 'true') else 'false'}")
    if "user" not in options:
        props.append("integratedSecurity=true")
    options.update(url=f"jdbc:sqlserver://{server};" + ";".join(props),
                   driver="com.microsoft.sqlserver.jdbc.SQLServerDriver")
    return options


# -- files under a job's output --------------------------------------------------------------------
def filesystem(path: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path within it) for a local path or a URI (file://, hdfs://, s3://, ...)."""
    from pyarrow import fs

    if "://" in path:
        scheme, rest = path.split("://", 1)
        # Spark's Hadoop connectors say s3a:// where Arrow says s3://: the same bucket and key.
        return fs.FileSystem.from_uri(("s3://" + rest) if scheme in ("s3a", "s3n") else path)
    return fs.LocalFileSystem(), os.path.abspath(path)


# Hadoop's glob characters: Spark's reader takes a path holding any of them as a pattern
# (DataSource.checkAndGlobPathIfNecessary, on the qualified path): out[1] reads out1, out{a,b} outa
# and outb. The folders the jobs read back are refused with one (literal_path).
GLOB_CHARACTERS = "{}[]*?\\"
URI_PREFIX = re.compile(r"((?:[A-Za-z][A-Za-z0-9+.-]*:(?://[^/]*)?)?)(.*)", re.DOTALL)    # scheme://authority, path


def literal_path(spark: Any, path: str, what: str) -> str:
    """`path` qualified as Spark's reader qualifies it (by its Hadoop filesystem: the scheme and
    authority, and a relative path made absolute against the filesystem's working directory, for a
    local one the driver's), refused (refuse_glob) if that holds a glob character. A Spark Connect
    session has no JVM on the client: there `path` is checked as given."""
    if is_connect_session(spark):
        qualified = path
    else:
        where = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path)
        qualified = str(where.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).makeQualified(where))
    refuse_glob(qualified, path, what)
    return qualified


def arrow_form(qualified: str) -> str:
    """A Hadoop-qualified location as filesystem() takes it: Hadoop's file:/x (or file:///x) is the
    local folder /x; any other scheme stays a URI."""
    scheme, _, rest = qualified.partition(":")
    return "/" + rest.lstrip("/") if scheme == "file" else qualified


def arrow_location(spark: Any, path: str, what: str) -> str:
    """`path` as Spark's Hadoop filesystem resolves it (literal_path), in the form the jobs' own
    reads and writes through Arrow take (filesystem): one location for both. Hadoop resolves a path
    without a scheme against fs.defaultFS (HDFS on most clusters) and a relative one against the
    JVM's working directory; Arrow would take either as a folder of the local disk, relative to the
    Python process's directory, so Spark and the tasks would write to different places. Refused,
    before anything is leased, when Arrow cannot open that filesystem (a scheme it lacks, no
    libhdfs for hdfs://)."""
    qualified = literal_path(spark, path, what)
    location = arrow_form(qualified)
    try:
        filesystem(location)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for an unusable location
        shown = path if path == qualified else f"{path} ({qualified})"
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise PipelineError(f"{what} {shown}: the tasks read and write it through Arrow's filesystems, which "
                            f"cannot open it ({type(exc).__name__}: {reason}); "
                            f"give a location Arrow reaches (a local or mounted folder, hdfs:// with libhdfs, "
                            f"s3a://, gs://, abfs://)") from None
    return location


def refuse_glob(qualified: str, given: str, what: str) -> None:
    """Refuse folder `given` (qualified: `qualified`), with a PipelineError naming both, if the
    qualified path past its scheme and authority (an IPv6 host's brackets are not globbed) holds a
    glob character: Spark would read other folders or none. Refused rather than escaped: Spark 4's
    FileStreamSink.hasMetadata takes an escaped path as a file name and logs a WARNING with a stack
    trace on every read of it, and an escape must reach every read (see docs/pipelines.md)."""
    found = sorted(set(URI_PREFIX.match(qualified).group(2)) & set(GLOB_CHARACTERS))
    if found:
        shown = given if given == qualified else f"{given} ({qualified})"
        raise PipelineError(f"{what} {shown} holds {' '.join(found)}: Spark's reader takes a path with any of "
                            f"{' '.join(GLOB_CHARACTERS)} as a glob pattern (out[1] reads out1) and would read other "
                            f"folders or none: name the folder without them (a relative path: run from a working "
                            f"directory without them too)")


PROBE_TASKS = 64     # at most this many probe tasks, one per core Spark offers (spread over the executors)


def require_shared_storage(spark: Any, folder: str, *, local: bool | None = None) -> None:
    """On a cluster, refuse a folder the driver cannot see what executors write to: executor tasks
    (one per core Spark offers, at most PROBE_TASKS, so that the executors it places them on are
    probed too, not only the first) each write a probe file under `folder`, and the driver must find
    every one. A folder on each node's own disk, or a mount some nodes lack, would make staged
    results invisible to the driver's finalisation.
    local: whether executors share the driver's filesystem (default: the master is local[...])."""
    import socket

    if local is None:
        local = str(spark.conf.get("spark.master", "local")).startswith("local")
    if local:
        return
    token = secrets.token_hex(8)
    base = f"{folder.rstrip('/')}/_probe-{token}"
    tasks = 1 if is_connect_session(spark) else max(1, min(PROBE_TASKS, spark.sparkContext.defaultParallelism))

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        for _ in batches:
            pass
        probe = f"{base}-{TaskContext.get().partitionId()}"
        filesystem_, inner = filesystem(probe)
        filesystem_.create_dir(inner.rsplit("/", 1)[0], recursive=True)
        with filesystem_.open_output_stream(inner) as stream:
            stream.write(token.encode("ascii"))
        yield pa.RecordBatch.from_pydict({"probe": [probe], "host": [socket.gethostname()]})

    with job_description(spark, f"probe: can the driver see what the executors write to {folder}?"):
        written = spark.range(0, tasks, 1, tasks).mapInArrow(write, "probe string, host string").collect()
    unseen = []
    for row in written:
        filesystem_, inner = filesystem(row["probe"])
        if path_exists(filesystem_, inner):
            filesystem_.delete_file(inner)
        else:
            unseen.append(row)
    if unseen:
        hosts = sorted({row["host"] for row in unseen})
        raise PipelineError(f"an executor on {', '.join(hosts)} wrote {unseen[0]['probe']} and the driver on "
                            f"{socket.gethostname()} cannot see it ({len(unseen)} of {len(written)} probes unseen): "
                            f"the output folder must be on storage both reach (hdfs://, s3a://, a shared mount "
                            f"on every node); a path without a scheme is each node's own disk")


def path_exists(filesystem_: Any, inner: str) -> bool:
    from pyarrow import fs

    return filesystem_.get_file_info(inner).type != fs.FileType.NotFound


def remove_tree(path: str) -> None:
    filesystem_, inner = filesystem(path)
    from pyarrow import fs

    if filesystem_.get_file_info(inner).type != fs.FileType.NotFound:
        if isinstance(filesystem_, fs.LocalFileSystem):
            shutil.rmtree(inner, ignore_errors=True)
        else:
            filesystem_.delete_dir(inner)


def elapsed_since(started: float) -> float:
    return round(time.monotonic() - started, 3)
