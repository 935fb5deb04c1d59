"""A work queue drained by a streaming query: the stream reader (ack=sink), a handler, and a sink
that writes each micro-batch's results before it completes or fails their messages.

    stream = spark.readStream.format("tablequeue").options(**source).load()    # source holds ack=sink
    results = handle(stream, "pipelines.transforms:uppercase_name", payload_type="json")
    sink = AckSink("hdfs:///out/emails", source, checkpoint="hdfs:///chk/emails")
    sink.prepare(spark)          # before start(): a refused output is refused before anything is leased
    results.writeStream.foreachBatch(sink).option("checkpointLocation", "hdfs:///chk/emails").start()

The stream's rows carry (id, lease_token, worker) from the reader and an `error` column (NULL when
the handler succeeded). AckSink, for micro-batch N:
1. unless <output>/batch_id=N/_tablequeue_written exists, writes the micro-batch (every column) to a
   new folder of its own, <output>/batch_id=N/_attempt-<uuid>, refuses it (deleted) if a message has
   more than one row, then creates the marker only if it is absent, naming that attempt folder (a
   second driver that loses the race deletes its own attempt and stops), and, where that create is
   atomic, deletes the other, never acknowledged, attempt folders of batch_id=N;
2. reads back (id, lease_token, worker, error) from the folder the marker names (a marker written
   before attempt folders names none: its rows are in batch_id=N itself), and each task acknowledges
   its rows by worker: complete_batch for rows without an error, fail_batch for rows with one (the
   queue retries them, or moves them to the dead letters at max_attempts); a replay then deletes the
   attempt folders the marker does not name, as the first write did, best effort and only where the
   marker's create is atomic. The acknowledgements are fenced by the
   lease token: an acknowledgement repeated after a restart answers lost and changes nothing.

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
import re
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NoReturn

if __package__ in (None, ""):  # `spark-submit pipelines/stream_job.py` without --py-files
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.common import (PipelineError, QueueTarget, Reconnecting, add_queue_arguments, arrow_form,  # noqa: E402
                              elapsed_since, job_description, job_main, literal_path, load_callable, log,
                              refuse_glob, require_shared_storage, with_retries)
from pipelines.drain_job import _takes_message as takes_message  # noqa: E402
from pipelines.sources import FORMAT, MAX_BATCH, SourceOptions, target_options  # noqa: E402

ACK_COLUMNS = ("id", "lease_token", "worker", "error")
WRITTEN = "_tablequeue_written"      # Spark's readers skip names starting with "_"
ATTEMPT = "_attempt-"                # and so a raw read of <output> skips every attempt folder
ATTEMPT_NAME = re.compile(r"_attempt-[0-9a-f]{32}")
TEMPORARY_MARKER = re.compile(rf"{WRITTEN}\.[0-9a-f]{{32}}\.tmp")     # the marker's, by rename_into_place
# A temporary marker lives for one write and rename (milliseconds): one older than this is a dead
# driver's, and a driver restarted minutes after a crash deletes it. Safety does not hang on the age
# (the store's modification time against the driver's clock, skew included): the cleanup runs only
# once the marker exists, and then no temporary file can become it (its rename is refused, and a
# loser whose file is deleted under it takes the failure as a lost race: rename_into_place).
TEMPORARY_MARKER_STALE_SECONDS = 300
# Hadoop's builder option of an atomic create-if-absent (S3A: an If-None-Match PUT, checked at close).
CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"
# S3A's probe (Constants.CONDITIONAL_CREATE_ENABLED, also its setting): on, create(path, false) is
# that conditional PUT as well (HADOOP-19256's release note).
# Schemes whose create(path, overwrite=false) is one exclusive step; "file" only on one host (a local
# master): it checks, then creates.
ATOMIC_CREATE_SCHEMES = ("hdfs", "abfs", "abfss")
# Where rename(src, dst) is one atomic step that refuses an existing dst (returns false): HDFS, and
# ABFS on an account with a hierarchical namespace (its DFS rename sends If-None-Match: *; without
# the namespace a rename is a copy and a delete). ABFS reports the namespace as this capability.
NAMESPACE_CAPABILITY = "fs.capability.paths.acls"      # CommonPathCapabilities.FS_ACLS
# Filesystems that answer through a client-side mount table, and their subclasses: viewfs://, and
# ViewFileSystemOverloadScheme in place of another scheme's impl; HDFS's own stand-in for the
# overload scheme. Only these are asked to resolve a path: elsewhere resolvePath is one more round
# trip, and a vendor's wrapper (a mount of DBFS) might answer a physical path that loses the mount's
# credentials. By name, not by loading the classes: a Hadoop without hdfs-client has no second one.
MOUNT_TABLE_FILESYSTEMS = ("org.apache.hadoop.fs.viewfs.ViewFileSystem", "org.apache.hadoop.hdfs.ViewDistributedFileSystem")
# A mount's target can be under a mount table again (under the overload scheme, hdfs://<other
# nameservice>/... goes through fs.hdfs.impl once more): resolved until it stays, at most this often.
MOUNT_HOPS = 8
LOST_CREATE = ("FileAlreadyExistsException", "RemoteFileChangedException", "Precondition Failed", "Status Code: 412")
DUPLICATES_SHOWN = 5
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


def renames_into_place(fs: Any, where: Any) -> bool:
    """Whether Hadoop filesystem `fs` renames atomically, refusing an existing target: HDFS, and ABFS
    on an account with a hierarchical namespace (it reports NAMESPACE_CAPABILITY at `where`)."""
    scheme = fs.getScheme()
    return scheme == "hdfs" or (scheme in ("abfs", "abfss") and bool(fs.hasPathCapability(where, NAMESPACE_CAPABILITY)))


def lost_create(exc: Any) -> bool:
    """Whether a Py4JJavaError of a create-if-absent says the file existed: FileAlreadyExists (at
    create, or at close for a conditional create), or S3's 412 Precondition Failed."""
    text = f"{exc.java_exception.getClass().getName()}: {exc.java_exception.getMessage()}"
    return any(sign in text for sign in LOST_CREATE)


class HadoopFiles:
    """The sink's small files (markers, the checkpoint's metadata, the listing of batch folders)
    through Spark's own Hadoop FileSystem on the driver (JVM), so that they go where Spark writes the
    Parquet: the same spark.hadoop.fs.* settings (s3a credentials, endpoints) and schemes (abfss,
    gs, dbfs) as the micro-batch's rows. Not for Spark Connect (no JVM on the client)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.jvm = spark.sparkContext._jvm
        self.gateway = spark.sparkContext._gateway
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.one_host = spark.sparkContext.master.startswith("local")

    def _at(self, path: str) -> tuple[Any, Any]:
        where = self.jvm.org.apache.hadoop.fs.Path(path)
        return where, where.getFileSystem(self.conf)

    def resolved(self, path: str, what: str) -> str:
        """Folder `path`, made if missing, as the filesystem that stores it names it: qualified, and
        on a filesystem with a client-side mount table (mounts) the mounted filesystem's URI
        (through_mount_table: ViewFileSystem, for viewfs:// and as ViewFileSystemOverloadScheme
        standing in for fs.hdfs.impl, answers file:, s3a://, hdfs://<nameservice>...). The sink
        decides and does everything there, not through the mount: ViewFileSystem passes
        hasPathCapability on but rejects the builder's conditional create ("Unknown mandatory key"),
        and the overload scheme says "hdfs" whatever it mounts. A target under a mount table again
        is resolved again, until it stays (a mount onto its own store) or is on a filesystem without
        one, at most MOUNT_HOPS times: under ViewFileSystemOverloadScheme a mount onto hdfs://<other
        nameservice> is reached through the HDFS client, but that path, given to Spark, goes through
        fs.hdfs.impl and that nameservice's mount table once more. Refused (literal_path), and if the
        last target holds a glob character, before anything is made (but a new folder beside mount
        points: through_mount_table)."""
        hops = [literal_path(self.spark, path, what)]
        where, fs = self._at(hops[0])
        while self.mounts(fs):
            target = self.through_mount_table(fs, where, path, what)
            if target == hops[-1]:
                break
            if len(hops) > MOUNT_HOPS:
                raise PipelineError(f"{what} {path} resolves through more than {MOUNT_HOPS} mount tables "
                                    f"({' -> '.join(hops)} -> ...): mounts that lead into each other? mount the "
                                    f"output onto a store")
            hops.append(target)
            where, fs = self._at(target)
        refuse_glob(hops[-1], path, what)
        fs.mkdirs(where)
        if len(hops) > 1:
            log().info("%s %s resolves through its mount table to %s: written, marked and read there", what, path,
                       " -> ".join(hops[1:]))
        return hops[-1]

    def through_mount_table(self, fs: Any, where: Any, path: str, what: str) -> str:
        """The path that `where` stands for on the store that the mount table of filesystem `fs`
        mounts there (resolvePath). A folder not made yet is its nearest existing parent's target
        with the rest of the path appended, so that nothing is made before the target is known and
        checked. Except beside mount points: a folder of the mount table itself (a parent of mount
        points, the root) answers resolvePath with its own path, and a new folder in it goes where
        only the mount table knows (its fallback, if it has one: made through it, then resolved;
        else refused). A folder of the mount table itself as the output is refused: nothing can be
        written there. `path` and `what` name the output in a refusal."""
        at, missing = where, []
        while True:
            found = fs.resolvePath(at) if at.isRoot() else self.unless_missing(lambda: fs.resolvePath(at), None)
            if found is not None:
                break
            missing.insert(0, str(at.getName()))
            at = at.getParent()
        mounted = self.mounted_under(fs, at) if found.equals(at) else []
        if not mounted:
            return "/".join([str(found).rstrip("/"), *missing])
        if not missing:
            raise PipelineError(f"{what} {path} resolves into the mount table of {fs.getUri()} itself: "
                                f"{at.toUri().getPath()} is a folder of its mount points ({', '.join(mounted)}), on no "
                                f"mounted store, and nothing can be written there: name a folder under one of them")
        from py4j.protocol import Py4JJavaError

        try:
            fs.mkdirs(where)
        except Py4JJavaError as exc:
            raise PipelineError(f"{what} {path} is a new folder in {at.toUri().getPath()}, a folder of the mount "
                                f"points ({', '.join(mounted)}) of the mount table of {fs.getUri()}, which did not "
                                f"make it ({exc.java_exception.getMessage()}): without a fallback (linkFallback) "
                                f"name a folder under one of the mount points") from None
        return str(fs.resolvePath(where))

    @staticmethod
    def mounted_under(fs: Any, folder: Any) -> list[str]:
        """The mount points of filesystem `fs`'s mount table strictly under `folder` (whose own path
        is then a folder of the mount table itself, not on a mounted store): [] for a folder under a
        mount point or beside them all (a fallback's)."""
        inside = folder.toUri().getPath().rstrip("/") + "/"
        points = [str(point.getMountedOnPath().toUri().getPath()) for point in fs.getMountPoints() or []]
        return sorted(point for point in points if point.startswith(inside) and point.rstrip("/") + "/" != inside)

    @staticmethod
    def mounts(fs: Any) -> bool:
        """Whether Hadoop filesystem `fs` answers through a client-side mount table: one of
        MOUNT_TABLE_FILESYSTEMS or a subclass, by the names of its class and superclasses."""
        kind = fs.getClass()
        while kind is not None:
            if kind.getName() in MOUNT_TABLE_FILESYSTEMS:
                return True
            kind = kind.getSuperclass()
        return False

    def kind(self, path: str) -> str | None:
        """What is at `path`: "file", "folder", or None (nothing)."""
        where, fs = self._at(path)
        status = self.unless_missing(lambda: fs.getFileStatus(where), None)
        return None if status is None else "file" if status.isFile() else "folder"

    def unless_missing(self, call: Callable[[], Any], missing: Any) -> Any:
        """call() (one filesystem call on a path), or `missing` if it raised the filesystem's
        FileNotFoundException: one call, not an exists() first (a round trip on an object store)."""
        from py4j.java_gateway import is_instance_of
        from py4j.protocol import Py4JJavaError

        try:
            return call()
        except Py4JJavaError as exc:
            if is_instance_of(self.gateway, exc.java_exception, "java.io.FileNotFoundException"):
                return missing
            raise

    def read_text(self, path: str) -> str:
        where, fs = self._at(path)
        stream = fs.open(where)
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def atomic_create(self, path: str) -> bool:
        """Whether create_new at `path` is an atomic create-if-absent: the store's conditional create,
        which create_new then uses (the filesystem reports fs.option.create.conditional.overwrite), or
        plain create(overwrite=false) on a filesystem whose create is one exclusive step (HDFS, ABFS;
        where rename is atomic, create_new renames a temporary file into place instead), or local
        under a local master (one host). S3A's own fs.s3a.create.conditional.enabled is not
        asked: it can be on while a plain create is still a check and then a PUT (see
        docs/pipelines.md)."""
        where, fs = self._at(path)
        scheme = fs.getScheme()
        return (scheme in ATOMIC_CREATE_SCHEMES or (scheme == "file" and self.one_host)
                or bool(fs.hasPathCapability(where, CONDITIONAL_CREATE)))

    def create_new(self, path: str, data: bytes) -> bool:
        """Write a file that must not exist yet; False if it existed (at create or at close: a
        conditional create checks at close), or if the create failed and the file exists afterwards
        (the caller reads it: a retried create may have made it). The content goes in one write, so a
        conditional create (one PUT at close) is never seen empty. Where rename is atomic and refuses
        an existing target (renames_into_place: HDFS, ABFS with a hierarchical namespace) the file is
        never seen empty either: see rename_into_place. Elsewhere it may be empty until close."""
        from py4j.protocol import Py4JJavaError

        where, fs = self._at(path)
        conditional = bool(fs.hasPathCapability(where, CONDITIONAL_CREATE))
        if not conditional and renames_into_place(fs, where):
            return self.rename_into_place(path, data)
        try:
            if conditional:
                builder = fs.createFile(where).overwrite(False)
                builder.must(CONDITIONAL_CREATE, True)
                stream = builder.build()
            else:
                stream = fs.create(where, False)
        except Py4JJavaError as exc:
            if lost_create(exc) or fs.exists(where):
                return False
            raise
        try:
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()
        except Py4JJavaError as exc:
            if lost_create(exc):
                return False
            raise
        return True

    def entries(self, path: str) -> dict[str, tuple[bool, float]]:
        """What folder `path` holds, {name: (is a folder, modification time in seconds since the epoch,
        the store's clock)}; {} if it is missing."""
        where, fs = self._at(path)
        return {str(status.getPath().getName()): (bool(status.isDirectory()), status.getModificationTime() / 1000)
                for status in self.unless_missing(lambda: fs.listStatus(where), [])}

    def rename_into_place(self, path: str, data: bytes) -> bool:
        """create_new by a temporary file: `data` written whole to <path>.<uuid hex>.tmp, then renamed
        to `path` (rename_refusing); False if the rename was refused (the file existed, or a directory
        of its name) or if writing or renaming the temporary file failed while something is at `path`
        afterwards (a winner's cleanup may have deleted this loser's file before its close or its
        rename: delete_leftovers), and the temporary file is deleted then (delete_temporary). A driver
        that dies before the rename leaves only its temporary file, never an empty `path`."""
        from py4j.protocol import Py4JJavaError

        where, fs = self._at(path)
        temp = self.jvm.org.apache.hadoop.fs.Path(f"{path}.{uuid.uuid4().hex}.tmp")
        try:
            stream = fs.create(temp, False)
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()
            if self.rename_refusing(fs, temp, where):
                return True
        except Py4JJavaError as exc:
            self.delete_temporary(fs, temp)
            # HDFS refuses an existing file with FileAlreadyExistsException, but a directory with a
            # plain IOException (rename_refusing), and a temporary file the winner deleted fails its
            # close or rename: what is at `path` now decides.
            if lost_create(exc) or fs.exists(where):
                return False
            raise
        self.delete_temporary(fs, temp)
        return False

    @staticmethod
    def delete_temporary(fs: Any, temp: Any) -> None:
        """Delete rename_into_place's temporary file `temp` after a lost race, best effort, as the
        sink's other deletes: it can no longer become the marker and nothing reads it, so a delete the
        store refuses (no delete right, throttling) logs one WARNING naming it, and the lost race is
        still answered; the winner's or a replay's cleanup deletes it once it is old
        (delete_leftovers)."""
        try:
            fs.delete(temp, False)
        except Exception as exc:  # noqa: BLE001 - best effort: see the docstring
            log().warning("not deleted, the temporary marker file %s of a race for the marker this driver lost "
                          "(nothing reads it; the winner or a replay deletes it when it is old, see "
                          "docs/pipelines.md): %s", temp, exc)

    def rename_refusing(self, fs: Any, source: Any, target: Any) -> bool:
        """rename(source, target) that never moves `source` into a directory named `target`: True if
        `target` is now the renamed file. HDFS's rename(src, dst) onto an existing directory moves src
        inside it and returns true; on HDFS the NameNode's rename(src, dst, Options.Rename.NONE)
        (public on DistributedFileSystem) is used instead, which refuses any existing dst by raising:
        FileAlreadyExistsException ("rename destination ... already exists") for a file, and for a
        directory a plain IOException ("Source ... and destination ... must both be directories",
        FSDirRenameOp.validateOverwrite), which reaches the client as a RemoteException: DFSClient
        unwraps only FileAlreadyExistsException and a few others. Elsewhere (ABFS with a hierarchical
        namespace) a true rename(src, dst) whose target is not a file is refused: the file moved
        inside is deleted."""
        from py4j.protocol import Py4JError, Py4JJavaError

        if fs.getScheme() == "hdfs":
            rename = self.jvm.org.apache.hadoop.fs.Options.Rename
            options = self.gateway.new_array(rename, 1)
            options[0] = rename.NONE
            try:
                fs.rename(source, target, options)
                return True
            except Py4JJavaError:
                raise
            except Py4JError:               # a filesystem without that rename: the check below
                pass
        if not fs.rename(source, target):
            return False
        if fs.getFileStatus(target).isFile():
            return True
        fs.delete(self.jvm.org.apache.hadoop.fs.Path(target, source.getName()), False)
        return False

    def listing(self, pattern: str) -> dict[str, dict[str, bool]]:
        """What Hadoop glob `pattern` matches, by parent folder name: {parent: {name: is a folder}};
        {} when nothing matches (also when a folder on the way is missing). One py4j call; in the JVM
        Hadoop's glob lists each folder a wildcard goes through, one after another (HDFS: one NameNode
        call each; object stores: one LIST each), and the default glob also takes the status of a
        folder whose listing holds exactly one entry: about one or two store requests per folder."""
        where, fs = self._at(pattern)
        found: dict[str, dict[str, bool]] = defaultdict(dict)
        for status in fs.globStatus(where) or []:
            path = status.getPath()
            found[str(path.getParent().getName())][str(path.getName())] = bool(status.isDirectory())
        return dict(found)

    def children(self, folder: str) -> dict[str, bool]:
        """What folder `folder` holds, {name: is a folder}; {} if it is missing or empty."""
        return self.listing(f"{folder}/*").get(folder.rstrip("/").rsplit("/", 1)[-1], {})

    def delete(self, path: str) -> None:
        """Delete folder `path` and what it holds; nothing if it is gone already."""
        where, fs = self._at(path)
        fs.delete(where, True)


def read_marker(files: HadoopFiles, batch: str, entries: Mapping[str, bool] | None = None
                ) -> tuple[str | None, str] | None:
    """The marker of micro-batch folder `batch` (<output>/batch_id=N): None without one, else (the
    query id it holds, or None; the folder of the stored rows): the attempt folder it names, or
    `batch` itself for a marker written before attempt folders existed (no "attempt"). An empty or
    unparsable marker next to attempt folders, and a marker naming a folder that is gone, raise.
    `entries`: what `batch` holds ({name: is a folder}) if the caller listed it (read_results lists
    every batch folder at once), else listed here; then only the marker itself is read."""
    marker = f"{batch}/{WRITTEN}"
    if entries is None:
        entries = files.children(batch)
    if entries.get(WRITTEN, True):      # no marker, or a folder of its name: never marked (AckSink refuses it)
        return None
    content = marker_content(files.read_text(marker))
    if content is None and any(name.startswith(ATTEMPT) and folder for name, folder in entries.items()):
        raise PipelineError(f"{marker} is empty or unreadable: a driver is writing it now (retry), or one died while "
                            f"writing it; nothing was acknowledged from it: delete it only if it stays empty while no "
                            f"driver of the query runs, then restart the query")
    content = content or {}
    attempt = content.get("attempt")
    if attempt is None:
        return content.get("query"), batch
    if not isinstance(attempt, str) or not ATTEMPT_NAME.fullmatch(attempt):
        raise PipelineError(f"{marker} names {attempt!r} as the folder of the micro-batch's rows: not one of "
                            f"AckSink's attempt folders ({ATTEMPT}<32 hex digits>)")
    if attempt not in entries:
        raise PipelineError(f"{marker} names {attempt}, which is gone: the micro-batch's rows were deleted (by hand, "
                            f"or by a second driver of the query on a store without an atomic create)")
    return content.get("query"), f"{batch}/{attempt}"


def marker_content(text: str) -> dict | None:
    """The marker's JSON object, None if it is empty or not one."""
    try:
        content = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return content if isinstance(content, dict) else None


def read_stored(spark: Any, folder: str, schema: Any = None) -> Any:
    """The rows of a stored folder, read by its name (no listing of its files through py4j, no
    parallel listing job): with `schema` (the written frame's), Spark infers nothing either. The
    name holds no glob character (the output was refused with one: literal_path). For an attempt
    folder Spark logs a WARNING "All paths were ignored: .../_attempt-..." (its check of hidden names,
    DataSource.checkAndGlobPathIfNecessary); it only logs: the folder is still read, all its rows (see
    docs/pipelines.md)."""
    reader = spark.read if schema is None else spark.read.schema(schema)
    return reader.parquet(folder)


class AckSink:
    """foreachBatch(AckSink(output, options, checkpoint=...)), prepare(spark) called before the query's
    start() (see there): options name the queue as the reader's
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
        self._prepared = False
        self._atomic_create = False         # HadoopFiles.atomic_create(output), asked by prepare()
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

    def prepare(self, spark: Any) -> None:
        """Settle, once, what the sink's refusals before any write depend on, and refuse there: call it
        before the query's start() (run_stream does). The first micro-batch calls it otherwise, but by
        then the reader has leased that micro-batch and Spark has logged the leases in the checkpoint,
        so a refusal leaves them to run out (and at max_attempts to go to the dead letters).
        The output resolved (HadoopFiles.resolved: qualified, so that a relative output is the same
        folder for Spark and for the marker; through a mount table, the mounted store's path, whose
        store decides how the marker is made; refused with a glob character), on a cluster checked to
        be storage the executors share (require_shared_storage), how the marker is made
        (atomic_create), and the micro-batch the query runs first refused if another query marked it
        (a new checkpoint on an output written before) or a directory is where its marker belongs."""
        if self._prepared:
            return
        self._files = HadoopFiles(spark)
        output = self._files.resolved(self.output, f"stream {self.target.name}: output")
        require_shared_storage(spark, arrow_form(output))
        self.output = output
        self._atomic_create = self._files.atomic_create(self.output)
        if not self._atomic_create:
            log().warning("stream %s: %s has no atomic create-if-absent (S3A needs Hadoop 3.4.2+ with "
                          "conditional create; other stores: see docs/pipelines.md): a second driver of the "
                          "query is then not guarded against, and may replace the marker and delete the "
                          "acknowledged rows: run one driver per checkpoint", self.target.name, self.output)
        first = self.first_batch()
        marked = self.marked(first)
        if marked is not None:
            # A checkpoint without metadata is a new query's: Spark gives it an id at start().
            started = self._files.kind(f"{self.checkpoint}/metadata") is not None
            self.refuse_another_query(first, marked[0], self.query_id() if started else None)
        self._prepared = True

    def first_batch(self) -> int:
        """The micro-batch the query runs first from its checkpoint, as Spark decides at start: 0
        for a new checkpoint; else the last one in <checkpoint>/offsets, replayed if
        <checkpoint>/commits does not hold it, or the one after it. Hidden files (.N.crc, .N.<uuid>.tmp)
        are no micro-batch."""
        def logged(folder: str) -> list[int]:
            return [int(name) for name, (is_folder, _) in self._files.entries(f"{self.checkpoint}/{folder}").items()
                    if not is_folder and name.isdigit()]
        offsets = logged("offsets")
        if not offsets:
            return 0
        last = max(offsets)
        return last if max(logged("commits"), default=-1) < last else last + 1

    def __call__(self, frame: Any, batch_id: int) -> None:
        missing = [c for c in ACK_COLUMNS if c not in frame.columns]
        if missing:
            raise PipelineError(f"stream {self.target.name}: the sink acknowledges each row by {', '.join(ACK_COLUMNS)} "
                                f"(error NULL: completed, else failed); the stream lacks {missing}: keep the "
                                f"reader's id, lease_token and worker, and add error (handle() does)")
        self.prepare(frame.sparkSession)
        self._files = HadoopFiles(frame.sparkSession)
        with job_description(frame.sparkSession, f"stream {self.target.name}: micro-batch {batch_id}"):
            stored = self.written(batch_id)
            replay = stored is not None
            if replay:
                log().info("stream %s: micro-batch %s was written before (a replay): acknowledging its stored "
                           "rows in %s again", self.target.name, batch_id, stored)
                # The stored schema, inferred: a query restarted with changed code may project other
                # columns or types than the rows were written with.
                counts = self.acknowledge(frame.sparkSession, batch_id, self.stored_rows(frame.sparkSession, batch_id))
                # Only where the marker cannot be replaced: elsewhere a second driver may have replaced it
                # since it was read above, and the folder it names now would be "unnamed" here.
                if self._atomic_create:
                    self.delete_leftovers(batch_id, stored)
            else:
                counts = self.acknowledge(frame.sparkSession, batch_id, self.write(frame, batch_id))
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

    def written(self, batch_id: int) -> str | None:
        """The folder of micro-batch batch_id's stored rows if this query wrote it before (the folder
        its marker names), else None. A marker of another query is refused (refuse_another_query), and
        so is a directory of the marker's name, before anything is written (marked)."""
        marked = self.marked(batch_id)
        if marked is None:
            return None
        written_by, stored = marked
        self.refuse_another_query(batch_id, written_by, self.query_id())
        return stored

    def marked(self, batch_id: int) -> tuple[str | None, str] | None:
        """Micro-batch batch_id's marker (read_marker: None without one, else the query id it holds
        and the folder of its stored rows), one listing of batch_id=N; a directory of the marker's
        name is refused there (refuse_marker_folder): no marker can be made."""
        batch = self.folder(batch_id)
        entries = self._files.children(batch)
        if entries.get(WRITTEN) is True:
            self.refuse_marker_folder(batch_id)
        return read_marker(self._files, batch, entries)

    def refuse_another_query(self, batch_id: int, written_by: str | None, query: str | None) -> None:
        """Refuse micro-batch batch_id, marked by the query `written_by`, unless that is `query`, the
        checkpoint's (None: a new checkpoint, whose query Spark has yet to start, so any marker is
        another query's): the stored rows hold the other query's leases, and this query's micro-batch
        would never be written."""
        if query is not None and written_by == query:
            return
        raise PipelineError(
            f"stream {self.target.name}: {self.folder(batch_id)} was written by another streaming query "
            f"({written_by or 'no query id'}), not by the query of checkpoint {self.checkpoint} "
            f"({query or 'a new query'}): a new checkpoint needs a new output folder (or keep the old checkpoint)")

    def write(self, frame: Any, batch_id: int) -> Any:
        """The micro-batch's rows to a new attempt folder of batch_id=N, checked for one row per
        message, then published by the marker naming the query, the micro-batch and the attempt
        (created only if absent). Nothing is ever overwritten: a second
        (zombie) driver of the query that passed written() too writes its own attempt, loses the
        marker race and deletes only that attempt; an attempt folder without the marker naming it
        was never acknowledged from, and where the marker's create is atomic the winner deletes those
        (a crash before the marker), as does a replay of the micro-batch (delete_leftovers).
        Returns the rows as stored (the attempt folder, read with the frame's schema)."""
        attempt = f"{ATTEMPT}{uuid.uuid4().hex}"
        folder = f"{self.folder(batch_id)}/{attempt}"
        frame.write.parquet(folder)                  # a new folder: nothing to overwrite
        stored = read_stored(frame.sparkSession, folder, frame.schema)
        self.refuse_duplicates(stored, batch_id, folder)
        self.mark(batch_id, attempt)
        # Only where the marker cannot be replaced: elsewhere two drivers can both "win" it, and each
        # would delete the other's attempt, leaving the marker naming a folder that is gone.
        if self._atomic_create:
            self.delete_leftovers(batch_id, folder)
        return stored

    def delete_leftovers(self, batch_id: int, named: str) -> None:
        """Delete what other attempts left in micro-batch batch_id's folder: the attempt folders other
        than `named`, the folder its marker names (batch_id=N itself for a marker written before
        attempt folders: then every attempt folder), and the temporary marker files
        (_tablequeue_written.<hex>.tmp) older than TEMPORARY_MARKER_STALE_SECONDS. No marker named those
        folders, so nothing was acknowledged from them (a driver that crashed before its marker, or a
        second driver that lost the race); a temporary file can no longer become the marker (a driver
        that died before its rename: a live one renames within milliseconds, and is refused anyway).
        Never the marker. Called only once the marker was read and names `named`: never while it is
        empty or unreadable (read_marker raises then); only where the marker's create is atomic
        (nothing can replace it). Best effort: nothing reads a leftover, so a listing or delete the
        store refuses (no delete right, a locked bucket, throttling) logs one WARNING naming what was
        left and fails nothing."""
        batch = self.folder(batch_id)
        failed: dict[str, Exception] = {}
        stale = time.time() - TEMPORARY_MARKER_STALE_SECONDS
        try:
            leftovers = [f"{batch}/{name}" for name, (folder, modified) in sorted(self._files.entries(batch).items())
                         if (folder and name.startswith(ATTEMPT) and f"{batch}/{name}" != named)
                         or (not folder and TEMPORARY_MARKER.fullmatch(name) and modified < stale)]
        except Exception as exc:  # noqa: BLE001 - best effort: see the docstring
            leftovers, failed[batch] = [], exc
        for leftover in leftovers:
            try:
                self._files.delete(leftover)
            except Exception as exc:  # noqa: BLE001 - best effort: see the docstring
                failed[leftover] = exc
        if failed:
            log().warning("stream %s: micro-batch %s: not deleted, attempt folders its marker does not name or old "
                          "temporary marker files (nothing reads them; delete them by hand or with retention, see "
                          "docs/pipelines.md): %s",
                          self.target.name, batch_id, "; ".join(f"{path} ({exc})" for path, exc in failed.items()))

    def discard(self, batch_id: int, folder: str) -> None:
        """Delete `folder`, this driver's attempt folder of micro-batch batch_id, which the caller
        refuses next. Best effort, as delete_leftovers, so that the refusal's PipelineError reaches
        the user: no marker names the folder, so nothing reads it, and one the store will not delete
        (no delete right, a locked bucket, throttling) gets one WARNING naming it and stays."""
        try:
            self._files.delete(folder)
        except Exception as exc:  # noqa: BLE001 - best effort: see the docstring
            log().warning("stream %s: micro-batch %s: not deleted, the attempt folder %s of the refused micro-batch "
                          "(nothing reads it; delete it by hand or with retention, see docs/pipelines.md): %s",
                          self.target.name, batch_id, folder, exc)

    def refuse_duplicates(self, stored: Any, batch_id: int, folder: str) -> None:
        """Refuse (and discard) a written attempt with more than one row for a message (a handler or
        a join that adds rows): two results for one message, or a complete and a fail of it racing."""
        doubled = (stored.select("id").groupBy("id").count()
                   .where("count > 1").limit(DUPLICATES_SHOWN).collect())
        if doubled:
            self.discard(batch_id, folder)
            ids = ", ".join(str(row["id"]) for row in doubled)
            raise PipelineError(f"stream {self.target.name}: micro-batch {batch_id} has more than one row for the "
                                f"message(s) with id {ids} (at most {DUPLICATES_SHOWN} shown): one row per message: "
                                f"dedupe before the sink; nothing of the micro-batch was acknowledged")

    def mark(self, batch_id: int, attempt: str) -> None:
        """Create micro-batch batch_id's marker naming `attempt`, only if absent. If the create was
        not a clear win, the marker decides: naming `attempt`, this driver won (a retried create
        whose first try reached the store); naming another attempt, a second driver of this query
        created it since written() said no: this driver's attempt folder is deleted and the
        micro-batch refused; empty or unreadable: refused, deleting nothing. A folder of the marker's
        name that appeared since written() (HDFS's rename, a local create(path, overwrite=false) and a
        rename that moved the file into it were each refused there) is refused naming it
        (refuse_marker_folder)."""
        marker = f"{self.folder(batch_id)}/{WRITTEN}"
        content = json.dumps({"query": self.query_id(), "batch_id": batch_id, "attempt": attempt}).encode("utf-8")
        if self._files.create_new(marker, content):
            return
        kind = self._files.kind(marker)
        if kind == "folder":
            self.refuse_marker_folder(batch_id, attempt)
        found = marker_content(self._files.read_text(marker)) if kind == "file" else None
        if found is None:
            raise PipelineError(f"stream {self.target.name}: creating {marker} failed and it is now missing, empty or "
                                f"unreadable: another driver may be writing it, or one died while writing it; "
                                f"nothing was acknowledged: stop other drivers of checkpoint {self.checkpoint}, "
                                f"delete {marker} if it is empty, and restart")
        if found.get("query") == self.query_id() and found.get("attempt") == attempt:
            return
        self.discard(batch_id, f"{self.folder(batch_id)}/{attempt}")
        raise PipelineError(f"stream {self.target.name}: the marker of {self.folder(batch_id)} appeared while "
                            f"this driver wrote the micro-batch: another driver runs the query of checkpoint "
                            f"{self.checkpoint}; stop one of them")

    def refuse_marker_folder(self, batch_id: int, attempt: str | None = None) -> NoReturn:
        """Refuse micro-batch batch_id, a directory standing where its marker file belongs (made by
        hand or by a tool): no marker can be made there. `attempt`: this driver's attempt folder, if
        the directory appeared while it was written; no marker can name it, so it is deleted."""
        marker = f"{self.folder(batch_id)}/{WRITTEN}"
        if attempt is None:
            done = "nothing of it was written or acknowledged"
        else:
            self.discard(batch_id, f"{self.folder(batch_id)}/{attempt}")
            done = "nothing of it was acknowledged"
        raise PipelineError(f"stream {self.target.name}: {marker} is a directory, where the marker file of "
                            f"micro-batch {batch_id} belongs: the micro-batch cannot be marked, and {done}: move "
                            f"{marker} aside (the sink put nothing in it) or delete it, then restart the query")

    def stored_rows(self, spark: Any, batch_id: int, schema: Any = None) -> Any:
        """The rows of micro-batch batch_id as written (every column), from the folder its marker names;
        read with `schema` (a replay's frame: the same query's columns) nothing is inferred."""
        stored = self.written(batch_id)
        if stored is None:
            raise PipelineError(f"stream {self.target.name}: micro-batch {batch_id} has no marker in "
                                f"{self.folder(batch_id)}: nothing was written to acknowledge")
        return read_stored(spark, stored, schema)

    def acknowledge(self, spark: Any, batch_id: int, stored: Any = None) -> dict[str, int]:
        """Acknowledge micro-batch batch_id's stored rows: `stored` (every column, as __call__ passes
        them: what write() just marked, or a replay's stored_rows), else read from the folder its
        marker names."""
        from functools import partial

        from pyspark.sql import functions as F

        stored = (self.stored_rows(spark, batch_id) if stored is None else stored).select(
            F.col("id"), F.col("lease_token"), F.col("worker"), F.col("error"))
        ack = partial(acknowledge_partition, self.target, self.retry_after_seconds)
        # One row of four counts per task comes back: one stage, no shuffle for the sum.
        per_task = stored.mapInArrow(ack, ", ".join(f"{c} long" for c in COUNTS)).collect()
        return {c: sum(int(row[c]) for row in per_task) for c in COUNTS}


def read_results(spark: Any, output: str) -> Any:
    """The rows of every acknowledged micro-batch under `output` (AckSink's folders): of each
    batch_id=N folder with a marker, the attempt folder the marker names (or the folder itself for
    a marker written before attempt folders), with their batch_id column. spark.read.parquet(output)
    skips the attempt folders (their names start with "_") and would read an old folder without a
    marker (a crash before the marker), whose rows were never acknowledged: a message's second
    result row. Rows with error NULL are the results."""
    files, root = HadoopFiles(spark), literal_path(spark, output, "read_results: output")
    # One glob of every batch folder's entries (markers and attempt folders; the store still lists
    # each folder, see HadoopFiles.listing), then one read per marker.
    listed = files.listing(f"{root}/batch_id=*/*")
    stored = [marked[1] for marked in (read_marker(files, f"{root}/{name}", listed[name]) for name in sorted(listed))
              if marked is not None]
    if not stored:
        raise PipelineError(f"{output}: no acknowledged micro-batch (batch_id=N folder with {WRITTEN}) to read")
    # The folders by name: one listing each in Spark, no py4j listing of their files here.
    return spark.read.option("basePath", root).parquet(*stored)


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
        sink.prepare(spark)         # before the query starts: once it does, the reader leases a micro-batch
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
