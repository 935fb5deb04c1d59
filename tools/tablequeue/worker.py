"""A consumer process for a work queue: `tablequeue worker` and the class it runs, Worker.

N slots, each a thread with its own connection and its own stable worker name (NAME/1 .. NAME/N), so
that a restarted worker gets its own unfinished messages back first and two slots never share a
lease. A slot waits for messages (the client's dequeue(wait=...): LISTEN or the wait verb), leases up
to batch_size, runs the handler on each, then acknowledges the batch: complete_batch for those that
succeeded, fail (with a growing, jittered retry_after_seconds) for those that raised. In transactional
mode the handler runs in a transaction of the slot's connection that also completes the message: its
writes and the ack commit together, or neither does. A lease keeper extends every message a slot holds
at a third of the lease. Connection loss (a server restart, a failover) makes the slot reconnect and
carry on with what it held; every acknowledgement is fenced by the lease token, so a repeated one
changes nothing. stop() (SIGTERM, SIGINT) stops the claiming, lets running handlers finish within the
grace period, acknowledges what is done and releases the rest (no attempt spent).

Everything goes through tablequeue.client.QueueClient: the worker reads no table.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .catalog import Catalog
from .client import QueueClient
from .engines import connect, parse_url
from .errors import DISCONNECT, TRANSIENT, retry_kind
from .stats import set_statement_timeout

LOG = logging.getLogger("tablequeue.worker")

# How long one idle dequeue waits for a message: also how soon an idle slot notices stop().
IDLE_WAIT_SECONDS = 1.0
# Reconnecting: the first pause, doubled (with jitter) up to the last; and how long a login may take.
RECONNECT_FIRST_SECONDS, RECONNECT_MAX_SECONDS = 0.2, 10.0
CONNECT_TIMEOUT_SECONDS = 10
# A deadlock or lock timeout of a dequeue or an acknowledgement: the call is tried again on the same
# connection (acknowledgements are fenced by the lease token), after a pause from the first, doubled
# (with jitter) up to the last.
CALL_RETRY_FIRST_SECONDS, CALL_RETRY_MAX_SECONDS = 0.05, 2.0
# A transactional handler whose run lost the slot's own connection is run again after the reconnect
# without spending an attempt, this often; the next loss fails the attempt (a handler that breaks the
# connection every time must reach max_attempts and the dead letters).
DISCONNECT_RERUNS = 3
# The end of the grace period: the connection that acknowledges or gives back what busy slots held,
# and each of its statements, get this long (docs/operations.md adds it to --grace-seconds).
HAND_BACK_TIMEOUT_SECONDS = 5
# A transient error (deadlock, lock timeout, serialization failure) of the handler's transaction is
# retried this often at once, keeping the lease and spending no attempt, before it counts as a failure.
TRANSIENT_RETRIES = 3
PROGRESS_SECONDS = 60.0
# fail's retry_after_seconds for attempt n: base * 2^(n-1), at most the cap, plus up to half of it at
# random so that messages that failed together do not come back together.
RETRY_BASE_SECONDS, RETRY_CAP_SECONDS = 1, 900
OUTCOMES = ("completed", "retrying", "dead", "lost", "released")

# What a slot holds: NEW (to handle), DONE (handled, to complete), FAILED (to fail), BUSY (a call
# about it is running: the keeper leaves it alone), HANDED_OVER (the grace period ended: stop()'s
# caller acknowledges or releases it, the slot may no longer).
NEW, DONE, FAILED, BUSY, HANDED_OVER = "new", "done", "failed", "busy", "handed over"


class WorkerError(RuntimeError):
    """A worker that cannot start (bad arguments) or that stopped on an error it cannot retry."""


@dataclass
class Message:
    """What the handler gets. connection: in transactional mode the slot's connection, inside the
    transaction that completes the message (write through it and the writes commit with the ack);
    None otherwise."""
    id: Any
    payload: Any
    attempts: int
    lease_token: Any
    row: dict                         # every column dequeue returned (enqueued_at, due_at, priority, ...)
    connection: Any = None


@dataclass(eq=False)
class _Held:
    message: Message
    state: str = NEW
    error: str | None = None
    retry_after: int | None = None
    extended_at: float | None = None  # time.monotonic() of the lease's start or last extension; None: unknown
    lease_lost: bool = False          # an extension was refused: its ack will say so, no use extending it
    duration: float = 0.0
    started_at: float | None = None   # time.monotonic() the handler started; None: no handler runs on it now
    timed_out: bool = False           # the handler ran past handler_timeout: the keeper lets the lease expire
    reruns: int = 0                   # transactional runs that lost the slot's connection (no attempt spent)


@dataclass(eq=False)
class _Slot:
    number: int
    name: str
    conn: Any = None
    client: QueueClient | None = None
    held: list[_Held] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    fresh: bool = True                # no claim since (re)connecting: a live lease may be an old one
    abandoned: bool = False
    failures: int = 0                 # database errors retried since the last dequeue that worked


class _Abandoned(Exception):
    """The grace period ended while the slot was busy: what it held was handed over."""


class _GiveUp(Exception):
    """Stopping, and the database did not answer before the grace period ended."""


class _LeaseLost(Exception):
    """complete said the lease is no longer ours: roll the handler's writes back."""


class _NameInUse(Exception):
    """Another session holds the slot's worker name."""


def load_handler(spec: str) -> Callable[[Message], Any]:
    """package.module:function (the function may be an attribute path, module:Class.method)."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise WorkerError(f"--handler {spec!r}: expected package.module:function")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkerError(f"--handler {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise WorkerError(f"--handler {spec!r}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise WorkerError(f"--handler {spec!r}: {attribute!r} is not callable")
    return target


def retry_after_seconds(attempts: int, rng: random.Random, base: int = RETRY_BASE_SECONDS,
                        cap: int = RETRY_CAP_SECONDS) -> int:
    """The delay fail asks for after attempt number `attempts` (1, 2, ...): at least base * 2^(n-1)
    (at most cap), plus up to half of that at random; every attempt waits longer than the last."""
    delay = min(cap, base * 2 ** (max(1, attempts) - 1))
    return int(delay + rng.uniform(0, delay / 2))


class WorkerMetrics:
    """The worker's own counters, in a registry of its own (served on --metrics-port)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.messages = Counter("tablequeue_worker_messages", "Messages the worker finished with, by outcome",
                                ["outcome"], registry=self.registry)
        for outcome in OUTCOMES:
            self.messages.labels(outcome=outcome)
        self.handler_duration = Histogram("tablequeue_worker_handler_duration_seconds",
                                          "Time the handler took per message", registry=self.registry)
        self.handler_timeouts = Counter("tablequeue_worker_handler_timeouts",
                                        "Handlers that ran past --handler-timeout: their leases were left to expire",
                                        registry=self.registry)


class Worker:
    def __init__(self, url: str, catalog: Catalog, queue: str, handler: Callable[[Message], Any] | str,
                 concurrency: int = 1, batch_size: int = 10, worker_name: str | None = None,
                 grace_seconds: float = 30.0, transactional: bool = False, metrics_port: int | None = None,
                 progress_seconds: float = PROGRESS_SECONDS, retry_base_seconds: int = RETRY_BASE_SECONDS,
                 retry_cap_seconds: int = RETRY_CAP_SECONDS, rng: random.Random | None = None,
                 handler_timeout_seconds: float | None = None):
        """handler_timeout_seconds: once a handler has run this long, its lease is no longer extended:
        it expires, the attempt counts, and the message goes to another consumer (or, at
        max_attempts, to the dead letters). None: a handler may run as long as it likes."""
        try:
            self.queue = catalog.queue(queue)
        except KeyError:
            raise WorkerError(f"{catalog.path}: no queue named '{queue}' (--queue)") from None
        if self.queue.kind != "work":
            raise WorkerError(f"{catalog.path}: queue '{queue}': field 'kind': the worker runs work queues, "
                              f"this one is {self.queue.kind}")
        if concurrency < 1:
            raise WorkerError(f"queue '{queue}': --concurrency must be at least 1, got {concurrency}")
        if not 1 <= batch_size <= 1000:
            raise WorkerError(f"queue '{queue}': --batch-size must be 1..1000 (the contract's batch cap), got {batch_size}")
        if grace_seconds < 0:
            raise WorkerError(f"queue '{queue}': --grace-seconds must be 0 or more, got {grace_seconds}")
        if handler_timeout_seconds is not None and handler_timeout_seconds <= 0:
            raise WorkerError(f"queue '{queue}': --handler-timeout must be above 0, got {handler_timeout_seconds}")
        self.url, self.catalog, self.dialect = url, catalog, parse_url(url).dialect
        self.handler = load_handler(handler) if isinstance(handler, str) else handler
        self.batch_size, self.grace_seconds, self.transactional = batch_size, grace_seconds, transactional
        self.handler_timeout_seconds = handler_timeout_seconds
        self.lease_seconds: int = self.queue.options["lease_seconds"]
        self.name = worker_name or socket.gethostname()
        self.slots = [_Slot(n, f"{self.name}/{n}") for n in range(1, concurrency + 1)]
        self.metrics_port, self.progress_seconds = metrics_port, progress_seconds
        self.retry_base_seconds, self.retry_cap_seconds = retry_base_seconds, retry_cap_seconds
        self.rng = rng or random.Random()
        self.metrics = WorkerMetrics()
        self.metrics_server: Any = None
        self.counts = {outcome: 0 for outcome in OUTCOMES}
        self._counts_lock = threading.Lock()
        self._stop = threading.Event()
        self._give_up_at = float("inf")
        self._fatal: BaseException | None = None
        self.label = f"{catalog.schema}.{self.queue.name}"

    # -- running ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; run() lets handlers finish within the grace period, then releases the rest.
        Safe to call from a signal handler or another thread, more than once."""
        if not self._stop.is_set():
            self._give_up_at = time.monotonic() + self.grace_seconds
            self._stop.set()

    def run(self) -> dict[str, int]:
        """Work until stop(); returns how many messages ended in each outcome. Raises WorkerError when
        a slot stopped on an error it cannot retry (the other slots stop gracefully first)."""
        if self.metrics_port is not None:
            from prometheus_client import start_http_server

            try:
                self.metrics_server, _ = start_http_server(self.metrics_port, registry=self.metrics.registry)
            except OSError as exc:
                raise WorkerError(f"{self.label}: --metrics-port {self.metrics_port}: cannot serve the worker's "
                                  f"metrics: {exc.strerror or exc}") from exc
            LOG.info("%s: worker metrics on port %d", self.label, self.metrics_server.server_port)
        keeper_stop = threading.Event()
        keeper = threading.Thread(target=self._keep_leases, args=(keeper_stop,), name="lease-keeper", daemon=True)
        threads = [threading.Thread(target=self._slot_main, args=(slot,), name=slot.name, daemon=True)
                   for slot in self.slots]
        LOG.info("%s: worker %s started: %d slot(s), batch %d, lease %ds%s", self.label, self.name,
                 len(self.slots), self.batch_size, self.lease_seconds, ", transactional" if self.transactional else "")
        keeper.start()
        for thread in threads:
            thread.start()
        last = dict(self.counts)
        try:
            while not self._stop.wait(self.progress_seconds):
                last = self._log_progress(last)
        except KeyboardInterrupt:
            # run() called without signal handlers (a library user's Ctrl-C): stop gracefully all
            # the same, so that what the slots hold is acknowledged or released, not left to expire.
            LOG.warning("%s: interrupted: stopping", self.label)
            self.stop()
        for thread in threads:
            thread.join(max(0.0, self._give_up_at - time.monotonic()))
        late = [(slot, thread) for slot, thread in zip(self.slots, threads) if thread.is_alive()]
        if late:
            self._hand_back([slot for slot, _ in late])
            # An idle slot returns from its wait within IDLE_WAIT_SECONDS and gives back what that
            # claimed; one still inside a handler is left to its daemon thread.
            settle_until = time.monotonic() + IDLE_WAIT_SECONDS + 1
            for _, thread in late:
                thread.join(max(0.0, settle_until - time.monotonic()))
        keeper_stop.set()
        keeper.join(CONNECT_TIMEOUT_SECONDS)
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        LOG.info("%s: worker %s stopped: %s", self.label, self.name,
                 ", ".join(f"{self.counts[o]} {o}" for o in OUTCOMES))
        if self._fatal is not None:
            raise WorkerError(f"{self.label}: a slot stopped on an error it cannot retry: "
                              f"{type(self._fatal).__name__}: {' '.join(str(self._fatal).split())}") from self._fatal
        return dict(self.counts)

    def _log_progress(self, last: dict[str, int]) -> dict[str, int]:
        now = dict(self.counts)
        held = sum(len(slot.held) for slot in self.slots)
        LOG.info("%s: progress in the last %gs: %s; %d message(s) held", self.label, self.progress_seconds,
                 ", ".join(f"{now[o] - last[o]} {o}" for o in OUTCOMES), held)
        return now

    def _stopping(self) -> bool:
        return self._stop.is_set()

    # -- one slot -----------------------------------------------------------------------------
    def _slot_main(self, slot: _Slot) -> None:
        try:
            if not self._connect(slot, first=True):
                return
            while True:
                try:
                    self._slot_loop(slot)
                    return
                except Exception as exc:  # noqa: BLE001 - sorted by retry_kind; the rest is fatal
                    kind = None if isinstance(exc, (_Abandoned, _GiveUp)) else retry_kind(exc)
                    if kind is None:
                        raise
                    slot.failures += 1
                    pause = self._pause(CALL_RETRY_FIRST_SECONDS if kind == TRANSIENT else RECONNECT_FIRST_SECONDS,
                                        CALL_RETRY_MAX_SECONDS if kind == TRANSIENT else RECONNECT_MAX_SECONDS,
                                        slot.failures)
                    if kind == TRANSIENT and not _broken(slot.conn, self.dialect):
                        # A deadlock or lock timeout of a dequeue or an acknowledgement: the statement
                        # rolled back and the connection is fine; what the slot holds is as it was.
                        LOG.warning("%s %s: %s; trying again in %.2fs, holding %d message(s)", self.label,
                                    slot.name, _one_line(exc), pause, len(slot.held))
                        time.sleep(min(pause, max(0.0, self._give_up_at - time.monotonic())))
                        continue
                    LOG.warning("%s %s: connection lost (%s); reconnecting in %.1fs, holding %d message(s)",
                                self.label, slot.name, _one_line(exc), pause, len(slot.held))
                    self._stop.wait(pause)
                    if not self._connect(slot):
                        return
        except _Abandoned:
            pass
        except _GiveUp:
            LOG.error("%s %s: the database did not answer within the grace period: %d message(s) stay leased "
                      "until their leases expire", self.label, slot.name, len(slot.held))
        except Exception as exc:  # noqa: BLE001 - reported by run()
            LOG.exception("%s %s: stopped on an error it cannot retry", self.label, slot.name)
            self._fatal = self._fatal or exc
            self.stop()
            _close(slot.conn)
            slot.conn = None
            # What it holds would otherwise wait for its leases to expire and be handled again.
            self._hand_back([slot], handlers_running=False)
        finally:
            _close(slot.conn)

    def _pause(self, first: float, last: float, tries: int) -> float:
        """first, doubled per try up to last, plus up to as much again at random."""
        return min(last, first * 2 ** (max(1, tries) - 1)) * (1 + self.rng.random())

    def _connect(self, slot: _Slot, first: bool = False) -> bool:
        """(Re)connect the slot and take its worker name, pausing between tries, until it works or,
        once stopping, the grace period ends (_GiveUp). False: stop() came while the slot, holding
        nothing, could not connect: there is nothing left for it to do."""
        _close(slot.conn)
        slot.conn = slot.client = None
        pause = RECONNECT_FIRST_SECONDS
        while True:
            if self._stopping() and not slot.held:
                return False
            try:
                conn = connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)
                try:
                    _take_name(conn, self.dialect, f"tablequeue:{self.label}/{slot.name}")
                except BaseException:
                    _close(conn)
                    raise
                slot.conn = conn
                slot.client = QueueClient(slot.conn, self.dialect, self.catalog.schema, self.queue)
                slot.fresh = True
                return True
            except _NameInUse:
                if first:
                    raise WorkerError(f"{self.label}: worker name {slot.name} is in use by another process: give each "
                                      f"process a --worker-name of its own") from None
                # Our own session from before the reconnect, which the server has not noticed is gone.
                problem = "its worker name is still held by the session it lost"
            except Exception as exc:  # noqa: BLE001 - only a lost connection is retried
                if retry_kind(exc) != DISCONNECT:
                    raise
                problem = f"cannot connect ({_one_line(exc)})"
            remaining = self._give_up_at - time.monotonic()
            if remaining <= 0:
                raise _GiveUp()
            delay = min(remaining, pause * (1 + self.rng.random()))
            LOG.warning("%s %s: %s; trying again in %.1fs", self.label, slot.name, problem, delay)
            if self._stopping():
                time.sleep(delay)        # bounded by the grace period: it has messages to hand back
            else:
                self._stop.wait(delay)   # stop() ends the pause: a slot holding nothing then returns
            pause = min(RECONNECT_MAX_SECONDS, pause * 2)

    def _slot_loop(self, slot: _Slot) -> None:
        while True:
            if self._stopping():
                self._settle(slot)
                self._release_unhandled(slot)
                return
            with slot.lock:
                if slot.abandoned:
                    raise _Abandoned()
                # Another consumer may hold these by now (the keeper could not extend them): running
                # the handler would only double its side effects.
                lost = [held for held in slot.held if held.state == NEW and held.lease_lost]
                pending = next((held for held in slot.held if held.state == NEW and not held.lease_lost), None)
            for held in lost:
                LOG.warning("%s %s: message %s: not handled, its lease was lost first", self.label, slot.name,
                            held.message.id)
                self._finish(slot, held, "lost")
            if pending is not None:
                self._handle(slot, pending)
                continue
            self._settle(slot)
            # The slot holds nothing now, as dequeue requires of a worker name.
            claimed_at = time.monotonic()
            rows = slot.client.dequeue(batch_size=self.batch_size, worker=slot.name,
                                       lease_seconds=self.lease_seconds, wait=IDLE_WAIT_SECONDS)
            slot.failures = 0
            with slot.lock:
                abandoned = slot.abandoned
                if not abandoned:
                    # After a (re)connect a row may be a live lease from before, with its old expiry:
                    # the keeper extends those at once.
                    extended_at = None if slot.fresh else claimed_at
                    slot.held.extend(_Held(Message(row["id"], row["payload"], int(row["attempts"]),
                                                   row["lease_token"], row), extended_at=extended_at) for row in rows)
                    if rows:
                        slot.fresh = False
            if abandoned:
                # The grace period ended during this dequeue: what it claimed is nobody else's to give back.
                for row in rows:
                    held = _Held(Message(row["id"], row["payload"], int(row["attempts"]), row["lease_token"], row))
                    released = slot.client.release(row["id"], slot.name, row["lease_token"])
                    self._count("released" if released else "lost")
                    self._log_outcome(slot.name, held, "released" if released else "lost")
                raise _Abandoned()

    def _handle(self, slot: _Slot, held: _Held) -> None:
        if self.transactional:
            self._handle_in_transaction(slot, held)
            return
        started = self._started(slot, held)
        try:
            self.handler(held.message)
            error = None
        except Exception as exc:  # noqa: BLE001 - any handler error is a failed attempt
            error = _one_line(exc)
        finally:
            held.started_at = None
        self._handled(slot, held, started, error)

    @staticmethod
    def _started(slot: _Slot, held: _Held) -> float:
        """Mark the handler as running on held (the keeper times it, the hand-back fails it)."""
        with slot.lock:
            held.started_at = time.monotonic()
            return held.started_at

    def _handled(self, slot: _Slot, held: _Held, started: float, error: str | None) -> None:
        held.duration = time.monotonic() - started
        self.metrics.handler_duration.observe(held.duration)
        with slot.lock:
            if slot.abandoned:
                raise _Abandoned()
            if error is None:
                held.state = DONE
            else:
                held.state, held.error = FAILED, error
                held.retry_after = retry_after_seconds(held.message.attempts, self.rng, self.retry_base_seconds,
                                                       self.retry_cap_seconds)

    def _handle_in_transaction(self, slot: _Slot, held: _Held) -> None:
        message = held.message
        for transient_try in range(TRANSIENT_RETRIES + 1):
            started = self._started(slot, held)
            try:
                with _transaction(slot.conn, self.dialect):
                    message.connection = slot.conn
                    try:
                        self.handler(message)
                    finally:
                        message.connection = None
                    with slot.lock:
                        if slot.abandoned:
                            raise _Abandoned()
                        held.state = BUSY
                        held.started_at = None
                    if not slot.client.complete(message.id, slot.name, message.lease_token):
                        raise _LeaseLost()
            except _LeaseLost:
                held.duration = time.monotonic() - started
                self._finish(slot, held, "lost")
                return
            except _Abandoned:
                raise
            except Exception as exc:  # noqa: BLE001 - sorted by retry_kind below
                with slot.lock:
                    held.started_at = None
                    if held.state == BUSY:
                        held.state = NEW
                kind = retry_kind(exc)
                if kind is not None and _broken(slot.conn, self.dialect):
                    held.reruns += 1
                    if held.reruns > DISCONNECT_RERUNS:
                        # Failed through the next connection (the slot settles before it claims again).
                        self._handled(slot, held, started, f"{_one_line(exc)} (the connection was lost in "
                                                          f"{held.reruns} runs of the handler)")
                    raise          # the slot reconnects and runs the handler again
                if kind == DISCONNECT:
                    # The handler's own connection elsewhere (another database, a service) went away,
                    # not the slot's: a failure of the handler, retried through fail like any other.
                    kind = None
                if kind == TRANSIENT and transient_try < TRANSIENT_RETRIES:
                    LOG.info("%s %s: message %s: %s; transaction rolled back, running it again (the lease is kept, "
                             "no attempt spent)", self.label, slot.name, message.id, _one_line(exc))
                    time.sleep(0.05 * (1 + self.rng.random()) * (transient_try + 1))
                    continue
                self._handled(slot, held, started, _one_line(exc))
                return
            held.duration = time.monotonic() - started
            self.metrics.handler_duration.observe(held.duration)
            self._finish(slot, held, "completed")
            return

    def _take(self, slot: _Slot, state: str) -> list[_Held]:
        with slot.lock:
            if slot.abandoned:
                raise _Abandoned()
            taken = [held for held in slot.held if held.state == state]
            for held in taken:
                held.state = BUSY
            return taken

    def _put_back(self, slot: _Slot, items: list[_Held], state: str) -> None:
        with slot.lock:
            for held in items:
                if held.state == BUSY:
                    held.state = state

    def _settle(self, slot: _Slot) -> None:
        """complete_batch what the handler finished, fail what it raised on."""
        done = self._take(slot, DONE)
        if done:
            try:
                rows = slot.client.complete_batch([{"id": h.message.id, "lease_token": h.message.lease_token}
                                                   for h in done], slot.name)
            except BaseException:
                self._put_back(slot, done, DONE)
                raise
            completed = {_key(row["id"]) for row in rows if row["completed"]}
            for held in done:
                self._finish(slot, held, "completed" if _key(held.message.id) in completed else "lost")
        failed = self._take(slot, FAILED)
        for position, held in enumerate(failed):
            try:
                outcome = slot.client.fail(held.message.id, slot.name, held.error, held.retry_after,
                                           held.message.lease_token)
            except BaseException:
                self._put_back(slot, failed[position:], FAILED)
                raise
            self._finish(slot, held, outcome)

    def _release_unhandled(self, slot: _Slot) -> None:
        unhandled = self._take(slot, NEW)
        for position, held in enumerate(unhandled):
            try:
                released = slot.client.release(held.message.id, slot.name, held.message.lease_token)
            except BaseException:
                self._put_back(slot, unhandled[position:], NEW)
                raise
            self._finish(slot, held, "released" if released else "lost")

    def _finish(self, slot: _Slot, held: _Held, outcome: str) -> None:
        with slot.lock:
            if held in slot.held:
                slot.held.remove(held)
        self._count(outcome)
        self._log_outcome(slot.name, held, outcome)

    def _count(self, outcome: str) -> None:
        with self._counts_lock:
            self.counts[outcome] += 1
        self.metrics.messages.labels(outcome=outcome).inc()

    def _log_outcome(self, worker: str, held: _Held, outcome: str) -> None:
        message = held.message
        what = {
            "completed": f"completed in {held.duration:.3f}s",
            "retrying": f"failed: {held.error}; visible again in {held.retry_after}s",
            "dead": f"failed: {held.error}; dead after attempt {message.attempts}",
            "lost": "not acknowledged: the lease is no longer this worker's (expired, released, or completed by "
                    "an earlier call whose answer was lost)",
            "released": "released unhandled (attempt given back)",
        }[outcome]
        LOG.info("%s %s: message %s attempt %d: %s", self.label, worker, message.id, message.attempts, what)

    # -- the lease keeper ---------------------------------------------------------------------
    def _keep_leases(self, stop: threading.Event) -> None:
        """Extend every message a slot holds once a third of its lease has passed, on a connection of
        its own, until stop is set."""
        interval = self.lease_seconds / 3
        tick = max(0.05, min(1.0, interval / 4))
        conn = client = None
        pause = RECONNECT_FIRST_SECONDS
        while not stop.wait(tick):
            try:
                if client is None:
                    conn = connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)
                    client = QueueClient(conn, self.dialect, self.catalog.schema, self.queue)
                    pause = RECONNECT_FIRST_SECONDS
                for slot in self.slots:
                    now = time.monotonic()
                    with slot.lock:
                        self._time_out_handlers(slot, now)
                        due = [h for h in slot.held if h.state in (NEW, DONE, FAILED) and not h.lease_lost
                               and not h.timed_out and (h.extended_at is None or now - h.extended_at >= interval)]
                    for held in due:
                        extended = client.extend_lease(held.message.id, slot.name, self.lease_seconds,
                                                       held.message.lease_token)
                        with slot.lock:
                            if extended:
                                held.extended_at = now
                            elif held.state in (NEW, DONE, FAILED):
                                held.lease_lost = True
                                LOG.warning("%s %s: message %s: the lease could not be extended (expired or taken)",
                                            self.label, slot.name, held.message.id)
            except Exception as exc:  # noqa: BLE001 - the keeper must outlive a lost connection
                if retry_kind(exc) != DISCONNECT:
                    LOG.exception("%s: lease keeper: extending failed", self.label)
                _close(conn)
                conn = client = None
                stop.wait(pause * (1 + self.rng.random()))
                pause = min(RECONNECT_MAX_SECONDS, pause * 2)
        _close(conn)

    def _time_out_handlers(self, slot: _Slot, now: float) -> None:
        """Under slot.lock: stop extending the leases of handlers running past handler_timeout."""
        if self.handler_timeout_seconds is None:
            return
        for held in slot.held:
            if (held.started_at is not None and not held.timed_out
                    and now - held.started_at > self.handler_timeout_seconds):
                held.timed_out = True
                self.metrics.handler_timeouts.inc()
                LOG.warning("%s %s: message %s attempt %d: the handler has run past --handler-timeout (%gs): its "
                            "lease is no longer extended and expires, spending the attempt", self.label, slot.name,
                            held.message.id, held.message.attempts, self.handler_timeout_seconds)

    # -- the end of the grace period, or of a slot that stopped on an error -------------------
    def _hand_back(self, slots: list[_Slot], handlers_running: bool = True) -> None:
        """What slots that can no longer acknowledge still hold: complete what their handlers
        finished, fail what raised, and release what no handler ran on. A message whose handler
        still runs (the grace period is over) is failed, spending its attempt: a message that hangs
        the handler every time must reach max_attempts. A late ack of the handler is then refused
        by its lease token, and a transactional handler's writes roll back."""
        taken: dict[str, list[tuple[_Slot, _Held]]] = {NEW: [], DONE: [], FAILED: []}
        for slot in slots:
            with slot.lock:
                slot.abandoned = True
                handed_over = [held for held in slot.held if held.state in taken]
                for held in handed_over:
                    if handlers_running and held.state == NEW and held.started_at is not None:
                        held.state, held.error = FAILED, ("the worker stopped: the handler was still running when "
                                                          "the grace period ended")
                        held.retry_after = retry_after_seconds(held.message.attempts, self.rng,
                                                               self.retry_base_seconds, self.retry_cap_seconds)
                    taken[held.state].append((slot, held))
                    held.state = HANDED_OVER
            if handed_over:
                LOG.warning("%s %s: %s: acknowledging or releasing its %d message(s)%s", self.label, slot.name,
                            "the grace period is over" if handlers_running else "stopped on an error",
                            len(handed_over), ", a handler may still be running" if handlers_running else "")
        if not any(taken.values()):
            return
        try:
            conn = connect(self.url, autocommit=True, connect_timeout=HAND_BACK_TIMEOUT_SECONDS)
            set_statement_timeout(conn, self.dialect, HAND_BACK_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - nothing left to do but say so
            LOG.error("%s: cannot reach the database to release %d message(s): their leases will expire (%s)",
                      self.label, sum(map(len, taken.values())), _one_line(exc))
            return
        client = QueueClient(conn, self.dialect, self.catalog.schema, self.queue)
        try:
            for slot, held in taken[DONE]:
                completed = client.complete(held.message.id, slot.name, held.message.lease_token)
                self._finish(slot, held, "completed" if completed else "lost")
            for slot, held in taken[FAILED]:
                self._finish(slot, held, client.fail(held.message.id, slot.name, held.error, held.retry_after,
                                                     held.message.lease_token))
            for slot, held in taken[NEW]:
                released = client.release(held.message.id, slot.name, held.message.lease_token)
                self._finish(slot, held, "released" if released else "lost")
        except Exception as exc:  # noqa: BLE001 - the rest waits for its leases to expire
            LOG.error("%s: giving back the messages failed (%s): the rest stay leased until their leases expire",
                      self.label, _one_line(exc))
        finally:
            _close(conn)


@contextlib.contextmanager
def _transaction(conn: Any, dialect: str) -> Iterator[None]:
    """One transaction on an autocommit connection: committed when the block ends, rolled back when
    it raises."""
    if dialect == "postgres":
        with conn.transaction():
            yield
        return
    conn.autocommit = False
    try:
        yield
        conn.commit()
    except BaseException:
        with contextlib.suppress(Exception):   # a lost connection has nothing left to roll back
            conn.rollback()
        raise
    finally:
        with contextlib.suppress(Exception):
            conn.autocommit = True


def _take_name(conn: Any, dialect: str, resource: str) -> None:
    """Hold resource (a slot's worker name) for as long as the session lives, or raise _NameInUse:
    two processes with one worker name would get each other's leases, tokens included, from dequeue."""
    if dialect == "postgres":
        taken = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (resource,)).fetchone()[0]
    else:
        cursor = conn.cursor()
        try:
            cursor.execute("SET NOCOUNT ON; DECLARE @result int; EXEC @result = sp_getapplock @Resource = ?, "
                           "@LockMode = 'Exclusive', @LockOwner = 'Session', @LockTimeout = 0; SELECT @result;",
                           resource[:255])
            taken = cursor.fetchone()[0] >= 0
        finally:
            cursor.close()
    if not taken:
        raise _NameInUse(resource)


def _broken(conn: Any, dialect: str) -> bool:
    """Whether conn itself is lost (and not, say, a connection a handler opened elsewhere)."""
    if conn is None:
        return True
    if dialect == "postgres":
        return bool(conn.broken or conn.closed)
    try:
        cursor = conn.cursor()
        try:
            cursor.execute("SELECT 1")
            cursor.fetchall()
        finally:
            cursor.close()
        return False
    except Exception:  # noqa: BLE001 - any failure of the probe is a connection we cannot use
        return True


def _key(message_id: Any) -> str:
    """An id as complete_batch's rows and dequeue's rows both spell it (a UUID may come back as str)."""
    return str(message_id).lower()


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
