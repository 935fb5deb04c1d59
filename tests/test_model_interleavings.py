"""Model-based interleaving tests (issue 16): Hypothesis' stateful testing drives several sessions
against one queue and checks every step against a plain Python model of the contract
(DESIGN.md §3, README "The contract", docs/queue-kinds.md, docs/work-queue.md).

Sessions. Three connections with autocommit off, each with its own thread, so a call that waits for
a lock stays waiting ("parked") while the machine goes on with the other sessions, as a real
caller's would. A step sends one call, then `settle()` waits until every session's call has either
returned or waits for a lock that another session holds (pg_stat_activity says Lock and
pg_blocking_pids names a holder); a wait cycle among the sessions counts as not settled, so the
server's deadlock detector (deadlock_timeout 50 ms here) ends it before the next step. Steps are
therefore deterministic: a statement runs until it returns or blocks, and what it blocks on is what
the other sessions hold. Waiting is not aborted with a short lock_timeout (issue 16 suggested that):
an aborted statement can never be part of a deadlock, and a deadlock needs two statements waiting at
once. Giving up a wait is a rule of its own (`give_up_waiting`: the caller's client cancels, 57014),
after which the session's transaction is rolled back, which the model follows. lock_timeout (20 s)
is only a guard against a harness that forgot a session.

Rules: enqueue / enqueue_batch with dedupe keys (client ids on the client-ids queue) from a small
alphabet, so batches overlap; dequeue; complete, fail, extend_lease, release, complete_batch,
fail_batch, complete_next (work; each message with no lease token, its current lease's token or one
that was never a lease), lease_status (work: leases and messages that left, each with its current, an
earlier or a never-issued token), and the wait verb's probe (work, on a session without an open
transaction);
commit, roll back or leave open the transaction after each call; begin a REPEATABLE READ
transaction; give up a wait; let short leases expire (work, a real sleep of about a second, at most
once per example).

The model. Committed messages, and per session the open transaction's own changes (new messages,
consumed ones, leases, completions), applied on commit, dropped on roll back or on any error (which
aborts the transaction). A call's result is checked when it returns: a parked call is checked
against the state it woke up to, after the transaction it waited for has ended. Times: a work
lease's end is known to lie between the dequeue's send time + lease_seconds and its reply time +
lease_seconds (the server takes now at the start of the call); "definitely live" and "definitely
expired" use those bounds with a margin of LEASE_MARGIN seconds, and anything in between accepts
either outcome.

Invariants (each names its number in its failure message):
(1) Nothing lost. After every step, what an observer (autocommit, plain SELECT: an operator's view of
    the tables) sees equals the model's committed state: the queued messages (destructive kinds:
    exactly the committed enqueues not consumed by a committed dequeue; work: each with its attempts
    and lease holder), the dead letters and the history. A dequeue that hands out fewer than
    batch_size messages leaves none behind that it must have seen (the exceptions the claim position
    documents: a message whose enqueue, or fail, was still uncommitted during one of this session's
    dequeues may wait for the position to expire; rows other transactions hold are skipped; an
    expired lease may wait up to a second for the session's next look for expired leases). At
    the end every transaction is rolled back and a new session drains the queue: it gets all of it.
    The wait verb says ready when such a message is there, and never when every message is leased.
(2) Nothing delivered twice: a dequeue never hands out a message another open transaction holds or a
    committed dequeue consumed; a work message is completed at most once.
(3) Order. Strict FIFO: every dequeue hands out exactly the lowest ids that are committed and not yet
    consumed at that moment (its own transaction's enqueues included), however the producers'
    commits interleave: an uncommitted id is not in the queue yet, and once it commits it comes
    before every higher id. Lax FIFO: ascending, and no eligible (see (1)) lower id skipped. LIFO:
    exactly the highest.
(4) Leases: a live lease is never leased to another worker; a second dequeue by the same worker may
    hand its live leases back ("a worker restarting under the same name gets its own unfinished
    messages back first", with the same lease_token) but must not re-lease them, i.e. count an
    attempt; every new lease has a fresh token; only the holder of a live lease completes, fails,
    extends or releases, alone or in a batch (each item judged as its single verb), and a token that
    is not the lease's changes nothing.
(5) Attempts count real deliveries: a new lease adds one, a hand-back of a live lease adds none, a
    roll back or a release takes the attempt back; the dead-letter table holds a message ('lease expired') only
    after its lease expired max_attempts times.
(6) No deadlock (40P01) between transactions that are each in their first lock-taking call: two
    batches, or a batch and a single enqueue, must queue behind each other whatever the order of
    their keys. A deadlock involving a transaction that already holds locks from an earlier call is
    the caller's lock order, not the queue's, and is accepted (the victim's transaction is rolled
    back, as for any error).
(7) REPEATABLE READ: a dequeue in a REPEATABLE READ transaction is refused with a tablequeue
    SQLSTATE (class TQ), or it hides nothing: the session's later dequeues get no excuse for
    messages committed before it started. SQLSTATE 40001 is a failure, not a refusal.
(8) Groups: one message of a group in flight, handed out in the group's order.
(9) lease_status answers, for each (id, token), what a state it may have read says: the committed
    state at its send or after any other session's transaction ended during the call, with its own
    transaction's changes: held / expired by the lease's end (either near it), lost when the message
    is queued under another lease or none, dead, gone; for a message another session's open
    transaction had changed at the send, only a state after that transaction ended (it waits).
    Together with (4), which judges every acknowledgement, this is what makes lost, dead and gone
    final: a later acknowledgement of that token that succeeded would break (4).

Run: `make test` runs DESTRUCTIVE_EXAMPLES / WORK_EXAMPLES examples per queue (derandomized, so CI sees the same ones every
time); TABLEQUEUE_MODEL_EXAMPLES=n runs n examples per queue with a fresh random seed (make bench).
The regression tests at the bottom replay the minimal failing examples Hypothesis found for the
defects of release 0.1.0 listed in issue 16.
"""
from __future__ import annotations

import collections
import functools
import itertools
import os
import re
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)]

SESSIONS = 3
STEPS = 50
# Examples per queue in make test: about 10 s for a destructive queue, 15 s for a work queue (sleeps).
DESTRUCTIVE_EXAMPLES = 30
WORK_EXAMPLES = 20
LONG_RUN_EXAMPLES = int(os.environ.get("TABLEQUEUE_MODEL_EXAMPLES", "0"))
SAFETY_LOCK_TIMEOUT = "20s"
DEADLOCK_TIMEOUT = "50ms"
SETTLE_LIMIT_SECONDS = 15.0
LEASE_MARGIN = 0.05
# A session whose look for expired leases came up short looks again only this much later
# (docs/work-queue.md, Expired leases; dequeue, complete_next and wait share the look).
LOOK_INTERVAL = 1.0
SHORT_LEASE = 1
LONG_LEASE = 600
MAX_SLEEPS = 1
KEYS = (None, "a", "b", "c")
# Option groups: a message's group follows from its serial (n = 1, 2, 3, ... -> g1, g2, ungrouped,
# ...), so the rules draw nothing more and every group sees messages from every session.
GROUP_KEYS = ("g1", "g2", None)
CLIENT_IDS = {key: uuid.uuid5(uuid.NAMESPACE_URL, f"tablequeue-model/{key}") for key in KEYS if key}
ENDS = (None, "commit", "rollback")
REPEATABLE_READ = "repeatable read"


class ModelViolation(AssertionError):
    """A step broke an invariant of the contract (not a harness error)."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise ModelViolation(message)


# --- sessions: one connection and one thread each ------------------------------------------------

@dataclass
class Call:
    label: str
    value: Any = None
    error: BaseException | None = None
    sent: float = 0.0          # wall clock (the server's clock too: same host) when it was sent
    returned: float = 0.0
    start_seq: int = 0
    end_seq: int = 0
    locks_before: bool = False  # the transaction held locks from an earlier call when it was sent


class Sequence:
    """One logical clock for every session: orders sends, replies and commits."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def tick(self) -> int:
        with self._lock:
            return next(self._counter)


class Session:
    def __init__(self, index: int, deployed: Any, queue: str, clock: Sequence) -> None:
        self.index = index
        self.conn = deployed.connect(autocommit=False)
        try:
            self.conn.execute(f"SET deadlock_timeout = '{DEADLOCK_TIMEOUT}'")
            self.fast_deadlocks = True
        except psycopg.errors.InsufficientPrivilege:
            # Not a superuser (TABLEQUEUE_PG_URL): the detector runs after the server's own
            # deadlock_timeout, and settle() waits for it all the same.
            self.fast_deadlocks = False
        self.conn.rollback()
        self.client = deployed.client(queue, self.conn)
        self.pid = self.conn.info.backend_pid
        self.clock = clock
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-session-{index}")
        self.future: Future | None = None
        self.on_done: Callable[[Call], None] | None = None
        self.last_call: Call | None = None
        self.reset()

    def reset(self) -> None:
        """As a new connection: no transaction, default settings (so no claim position either)."""
        assert self.future is None, f"session {self.index} still has a call in flight"
        self.conn.rollback()
        self.conn.isolation_level = None
        self.conn.execute("RESET ALL")
        self.conn.execute(f"SET lock_timeout = '{SAFETY_LOCK_TIMEOUT}'")
        if self.fast_deadlocks:
            self.conn.execute(f"SET deadlock_timeout = '{DEADLOCK_TIMEOUT}'")
        self.conn.commit()
        self.last_call = None

    @property
    def busy(self) -> bool:
        return self.future is not None

    def send(self, label: str, action: Callable[[Any], Any], on_done: Callable[[Call], None],
             locks_before: bool) -> None:
        assert self.future is None, f"session {self.index} already has a call in flight"
        call = Call(label, sent=time.time(), start_seq=self.clock.tick(), locks_before=locks_before)

        def run() -> Call:
            try:
                call.value = action(self.client)
            except Exception as exc:  # noqa: BLE001 - every error is the model's to judge
                call.error = exc
            call.returned = time.time()
            call.end_seq = self.clock.tick()
            return call

        self.last_call = call
        self.on_done = on_done
        self.future = self.executor.submit(run)

    def close(self) -> None:
        if self.future is not None and not self.future.done():
            self.conn.cancel_safe()
        self.executor.shutdown(wait=True)
        try:
            self.conn.rollback()
        finally:
            self.conn.close()


class Harness:
    """SESSIONS sessions for the rules plus one that drains the queue at the end, and an observer
    (autocommit). Kept for every example of a test (a connection costs about 15 ms); reset() makes
    each example start as on new connections to a freshly deployed queue."""

    def __init__(self, deployed: Any, queue: str) -> None:
        self.deployed, self.queue = deployed, queue
        self.clock = Sequence()
        self.observer = deployed.connect(autocommit=True)
        self.sessions = [Session(index, deployed, queue, self.clock) for index in range(SESSIONS + 1)]

    def reset(self) -> None:
        for session in self.sessions:
            session.reset()
        self.deployed.empty(self.observer)

    def by_pid(self, pid: int) -> Session | None:
        return next((s for s in self.sessions if s.pid == pid), None)

    def settle(self) -> None:
        """Wait until every call in flight has returned (and its result was handed to the model,
        which may send a roll back) or waits for a lock held by another session, with no wait cycle."""
        deadline = time.monotonic() + SETTLE_LIMIT_SECONDS
        while True:
            finished = [s for s in self.sessions if s.future is not None and s.future.done()]
            for session in sorted(finished, key=lambda s: s.future.result().end_seq):
                call, on_done = session.future.result(), session.on_done
                session.future, session.on_done = None, None
                on_done(call)
            in_flight = [s for s in self.sessions if s.future is not None]
            if not in_flight:
                return
            if finished:
                continue
            done, _ = wait([s.future for s in in_flight], timeout=0.005, return_when=FIRST_COMPLETED)
            if done:
                continue
            if self._all_blocked(in_flight) and not any(s.future.done() for s in in_flight):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("harness: calls neither return nor wait for a lock: "
                                   + ", ".join(f"session {s.index}: {s.last_call.label}" for s in in_flight))

    def _all_blocked(self, in_flight: list[Session]) -> bool:
        rows = self.observer.execute(
            "SELECT pid, wait_event_type, pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = ANY(%s)",
            ([s.pid for s in in_flight],)).fetchall()
        waits = {pid: set(blockers) for pid, event, blockers in rows if event == "Lock" and blockers}
        if set(waits) != {s.pid for s in in_flight}:
            return False
        # A cycle among the waiting sessions is a deadlock the detector is about to break.
        for start in waits:
            seen, frontier = set(), set(waits[start])
            while frontier:
                pid = frontier.pop()
                if pid == start:
                    return False
                if pid in waits and pid not in seen:
                    seen.add(pid)
                    frontier |= waits[pid]
        return True

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.observer.close()


# --- the model ------------------------------------------------------------------------------------

@dataclass
class Message:
    serial: int                     # the model's name for it: payload {"n": serial}
    id: Any
    key: str | None                 # dedupe key (client-ids queue: the client id's key)
    state: str = "queued"           # queued | consumed (destructive) | completed | dead (work)
    attempts: int = 0
    leased_by: str | None = None
    token: Any = None               # the current lease's lease_token
    lease: tuple[float, float] = (0.0, 0.0)   # bounds on the lease's end (wall clock seconds)
    short_lease: bool = False
    writer: int = -1                # session whose transaction made it visible (enqueue, fail)
    write_seq: int = 0              # when that call was sent
    commit_seq: int = 0             # when that transaction committed
    visible_write: bool = False     # staged: this transaction makes it visible (again)
    dead_seq: int = 0
    group: str | None = None        # option groups: the message's group_key
    in_flight: bool = False         # work with groups: its group's in-flight message (leased, or
                                    # released or failed to retry, until completed or dead)


@dataclass
class Txn:
    isolation: str = "read committed"
    writes: dict[int, Message] = field(default_factory=dict)
    holds_locks: bool = False
    dequeue_windows: list[tuple[int, int]] = field(default_factory=list)
    buriable: set[int] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)   # groups its enqueues named (a duplicate item too)


def step(method: Callable) -> Callable:
    """Marks the machine broken when a step raises, so teardown only cleans up after a failure."""
    @functools.wraps(method)
    def wrapper(self: "QueueMachine", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.broken = True
            raise
    return wrapper


SESSION = st.integers(min_value=0, max_value=SESSIONS - 1)
KEY = st.sampled_from(KEYS)
BATCH_KEYS = st.lists(KEY, min_size=1, max_size=3)
END = st.sampled_from(ENDS)


class QueueMachine(RuleBasedStateMachine):
    """What every kind shares: sessions, transactions, keys, the observer and the teardown drain.
    A subclass per test sets deployed, queue and options (see machine_for)."""

    deployed: Any = None
    queue: str = "q"
    options: dict[str, Any] = {}
    harnesses: list[Harness] = []   # the test's harness, kept between examples (machine_for)

    def __init__(self) -> None:
        super().__init__()
        self.broken = False
        if not self.harnesses:
            self.harnesses.append(Harness(self.deployed, self.queue))
        self.harness = self.harnesses[0]
        self.harness.reset()
        self.committed: dict[int, Message] = {}
        self.txns: dict[int, Txn] = {}
        self.position_windows: dict[int, list[tuple[int, int]]] = {}
        self.seen_ids: set[Any] = set()
        self.buriable: set[int] = set()   # work: claimed rows a committed dequeue may have buried
        self.serials = itertools.count(1)
        schema = self.deployed.catalog.schema
        self.table = f'"{schema}"."{self.queue}"'

    # -- plumbing --------------------------------------------------------------------------------
    @property
    def client_ids(self) -> bool:
        return bool(self.options.get("client_ids"))

    @property
    def grouped(self) -> bool:
        return bool(self.options.get("groups"))

    def group_of(self, serial: int) -> str | None:
        return GROUP_KEYS[(serial - 1) % len(GROUP_KEYS)] if self.grouped else None

    def group_touched_elsewhere(self, index: int, group: str) -> bool:
        """Another session's open transaction changed a message of the group (enqueued, dequeued or
        acknowledged one): it may hold the group, and a claim then steps over the whole group."""
        return any(other != index and (group in txn.groups or any(m.group == group for m in txn.writes.values()))
                   for other, txn in self.txns.items())

    def check_group_order(self, index: int, label: str, message: Message, queued: list[Message],
                          window: tuple[int, int], exempt: set[int]) -> None:
        """(8) A message of a group is handed out only as its group's head: no other message of the
        group is in flight (work; `exempt`: those the claim may have buried first), and no message of
        the group with a lower id is queued and visible to this session (one that committed during
        the call may still come after it)."""
        same = [m for m in queued if m.group == message.group and m.serial != message.serial]
        busy = [m for m in same if m.in_flight and m.serial not in exempt]
        expect(not busy, f"(8) {label} handed out id {message.id} of group {message.group!r} while "
                         f"{', '.join(f'id {m.id}' for m in busy)} of that group is in flight")
        holders = sorted(other for other, txn in self.txns.items() if other != index and any(
            m.group == message.group and m.serial != message.serial and (m.in_flight or m.state == "consumed")
            for m in txn.writes.values()))
        expect(not holders, f"(8) {label} handed out id {message.id} of group {message.group!r}, which the open "
                            f"transaction of session {holders[0] if holders else None} holds (it took a message of it)")
        if self.client_ids or any(m.in_flight for m in same):
            return                  # client ids: the group's order is insertion order (seq), not id
        older = [m for m in same if m.id < message.id and not self.late(index, m, window)
                 and self.holder(index, m.serial) is None]
        expect(not older, f"(8) {label} handed out id {message.id} of group {message.group!r} before the "
                          f"older {', '.join(f'id {m.id}' for m in older)} of that group")

    def hold_groups(self, index: int, serials: list[int]) -> None:
        """An acknowledgement takes its messages' groups (its lease or not), from the send on: a call
        parked on a later one holds the earlier ones."""
        for serial in serials:
            message = self.view(index, serial)
            if message is not None and message.group is not None:
                self.txn(index).groups.add(message.group)

    def check_one_per_group(self, index: int, label: str, handed_out: list[Message | None]) -> None:
        groups = [m.group for m in handed_out if m is not None and m.group is not None]
        expect(len(groups) == len(set(groups)), f"(8) session {index}: {label} handed out two messages of one "
                                                f"group: groups {groups}")

    def group_heads(self, index: int, queued: list[Message], window: tuple[int, int]) -> set[int] | None:
        """The serials a grouped claim may hand out for certain: ungrouped messages and each group's
        head, of groups no other open transaction touched and with no message whose visibility is
        uncertain for this session (late); None without groups."""
        if not self.grouped:
            return None
        heads = {m.serial for m in queued if m.group is None}
        for group in {m.group for m in queued if m.group is not None}:
            members = sorted((m for m in queued if m.group == group), key=lambda m: m.id)
            if self.group_touched_elsewhere(index, group) or any(self.late(index, m, window) for m in members):
                continue
            in_flight = [m for m in members if m.in_flight]
            heads.add((in_flight or members)[0].serial)
        return heads

    def session(self, index: int) -> Session:
        return self.harness.sessions[index]

    def txn(self, index: int) -> Txn:
        return self.txns.setdefault(index, Txn())

    def idle(self, index: int, repeatable_read_ok: bool = False) -> bool:
        """A rule acts on a session whose last call has returned; calls other than dequeue are not
        made inside a REPEATABLE READ transaction (the machine opens one only to dequeue in it)."""
        if self.session(index).busy:
            return False
        txn = self.txns.get(index)
        return repeatable_read_ok or txn is None or txn.isolation != REPEATABLE_READ

    def view(self, index: int, serial: int) -> Message | None:
        txn = self.txns.get(index)
        if txn is not None and serial in txn.writes:
            return txn.writes[serial]
        return self.committed.get(serial)

    def queued(self, index: int) -> list[Message]:
        """Messages in the queue as session `index` sees them (its own changes included)."""
        txn = self.txns.get(index)
        serials = set(self.committed) | (set(txn.writes) if txn else set())
        found = (self.view(index, serial) for serial in sorted(serials))
        return [m for m in found if m is not None and m.state == "queued"]

    def holder(self, index: int, serial: int) -> int | None:
        """Another session whose open transaction changed this committed message (and so locks it)."""
        for other, txn in self.txns.items():
            if other != index and serial in txn.writes and serial in self.committed:
                return other
        return None

    def late(self, index: int, message: Message, window: tuple[int, int] | None = None) -> bool:
        """Made visible by another session's transaction that was still open during one of this
        session's dequeues (whose claim position may then lie past it until the position expires)."""
        if message.writer == index or message.writer < 0:
            return False
        windows = list(self.position_windows.get(index, ()))
        txn = self.txns.get(index)
        if txn is not None:
            windows += txn.dequeue_windows
        if window is not None:
            windows.append(window)
        commit_seq = message.commit_seq or 1 << 62
        return any(start < commit_seq and message.write_seq < end for start, end in windows)

    def serial_of(self, row: dict) -> int:
        payload = row["payload"]
        return int(payload["n"])

    def send(self, index: int, label: str, action: Callable[[Any], Any],
             on_result: Callable[[Call], None], end: str | None = None) -> None:
        """Send one call on an idle session, settle, and end its transaction when asked and the
        call has returned without an error."""
        txn = self.txn(index)
        outcome: dict[str, bool] = {}

        def on_done(call: Call) -> None:
            if call.error is not None:
                self.on_error(index, call)
                return
            on_result(call)
            outcome["ok"] = True

        self.session(index).send(label, action, on_done, txn.holds_locks)
        self.harness.settle()
        if end is not None and outcome.get("ok") and not self.session(index).busy:
            self.end(index, commit=end == "commit")

    def on_error(self, index: int, call: Call) -> None:
        """Any error aborts the transaction: judge it, then roll the session back (model first)."""
        error = call.error
        sqlstate = getattr(error, "sqlstate", None) or ""
        txn = self.txns.get(index)
        if isinstance(error, psycopg.errors.DeadlockDetected):
            self.judge_deadlock(index, call)
        elif isinstance(error, psycopg.errors.QueryCanceled):
            pass  # give_up_waiting
        elif txn is not None and txn.isolation == REPEATABLE_READ and call.label.startswith("dequeue"):
            expect(sqlstate.startswith("TQ"),
                   f"(7) session {index}: {call.label} in a REPEATABLE READ transaction failed with "
                   f"{sqlstate or type(error).__name__} ({error}); a dequeue there must be refused with a "
                   "tablequeue SQLSTATE (class TQ) or hide nothing")
        else:
            raise AssertionError(f"session {index}: {call.label} failed unexpectedly: {sqlstate} {error}") from error
        self.end(index, commit=False, settle=False)

    def judge_deadlock(self, index: int, call: Call) -> None:
        detail = getattr(call.error.diag, "message_detail", None) or ""
        pids = {int(p) for p in re.findall(r"[Pp]rocess (\d+)", detail)}
        members = [s for s in (self.harness.by_pid(pid) for pid in pids) if s is not None] or [self.session(index)]
        fresh = all(not (s.last_call and s.last_call.locks_before) for s in members)
        calls = "; ".join(f"session {s.index}: {s.last_call.label if s.last_call else '?'}" for s in members)
        expect(not fresh,
               f"(6) deadlock (40P01) between transactions that each were in their first lock-taking "
               f"call: {calls}. Server: {detail}")

    def end(self, index: int, commit: bool, settle: bool = True) -> None:
        """Commit or roll back a session's transaction: the model first (a waiting call that this
        releases is then checked against the state after it), then the server."""
        txn = self.txns.pop(index, None)
        if commit and txn is not None:
            seq = self.harness.clock.tick()
            for serial, message in txn.writes.items():
                if message.visible_write:
                    message = replace(message, commit_seq=seq, visible_write=False)
                if message.state == "dead" and not message.dead_seq:
                    message = replace(message, dead_seq=seq)
                self.committed[serial] = message
            self.position_windows.setdefault(index, []).extend(txn.dequeue_windows)
            self.buriable |= txn.buriable
        self.after_end(index)

        def finish(client: Any) -> None:
            if commit:
                client.conn.commit()
            else:
                client.conn.rollback()
            client.conn.isolation_level = None

        self.session(index).send("commit" if commit else "rollback", finish, self._ended, False)
        if settle:
            self.harness.settle()

    def after_end(self, index: int) -> None:
        """The model has just committed or rolled back session `index`'s transaction."""

    def _ended(self, call: Call) -> None:
        if call.error is not None:
            raise AssertionError(f"{call.label} failed: {call.error}") from call.error

    # -- rules every kind has -------------------------------------------------------------------
    @rule(session=SESSION)
    @step
    def commit(self, session: int) -> None:
        if not self.session(session).busy:
            self.end(session, commit=True)

    @rule(session=SESSION)
    @step
    def rollback(self, session: int) -> None:
        if not self.session(session).busy:
            self.end(session, commit=False)

    # Rules are enabled whatever the sessions are doing and do nothing when they cannot apply: a
    # precondition on what the server did (a call still waiting) would make Hypothesis draw
    # differently when it replays an example, and a found failure would be reported as flaky.
    @rule(session=SESSION)
    @step
    def begin_repeatable_read(self, session: int) -> None:
        """Open a REPEATABLE READ transaction and take its snapshot now; the session's next dequeue
        runs in it, after whatever the other sessions commit meanwhile."""
        if (self.session(session).busy or session in self.txns
                or any(t.isolation == REPEATABLE_READ for t in self.txns.values())):
            return
        self.txns[session] = Txn(isolation=REPEATABLE_READ)

        def begin(client: Any) -> None:
            client.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            client.conn.execute("SELECT 1")

        self.send(session, "begin repeatable read", begin, lambda call: None)

    @rule(session=SESSION)
    @step
    def give_up_waiting(self, session: int) -> None:
        """The caller's client gives up a call that waits (a client-side timeout): it is cancelled
        and the session's transaction rolled back."""
        if self.session(session).busy:
            self.session(session).conn.cancel_safe()
            self.harness.settle()

    @invariant()
    @step
    def observer_sees_the_committed_model(self) -> None:
        self.reconcile()

    # -- the end of an example: roll everything back, then a new session drains the queue --------
    def teardown(self) -> None:
        """After a failure the sessions may still wait or hold locks: the harness is closed and
        the next example opens a new one."""
        clean = False
        try:
            if not self.broken:
                self.finish_example()
                clean = True
        finally:
            if not clean:
                self.harnesses.clear()
                self.harness.close()

    def finish_example(self) -> None:
        # Rolling back a session wakes the calls that waited for it; their transactions are then
        # rolled back in the next round. Calls that wait only for each other are a deadlock, which
        # settle() lets the server break.
        for _ in range(4 * SESSIONS):
            open_idle = [i for i in range(SESSIONS) if not self.session(i).busy and i in self.txns]
            if not open_idle:
                break
            for index in open_idle:
                self.end(index, commit=False)
        assert not any(s.busy for s in self.harness.sessions), "harness: calls still waiting at the end"
        self.reconcile()
        self.drain(SESSIONS)
        self.reconcile()

    # -- per kind ------------------------------------------------------------------------------
    def reconcile(self) -> None:
        raise NotImplementedError

    def drain(self, index: int) -> None:
        raise NotImplementedError

    # -- enqueue, shared: dedupe keys (client ids) and the ids handed back ----------------------------
    def item(self, serial: int, key: str | None) -> dict[str, Any]:
        item: dict[str, Any] = {"payload": {"n": serial}}
        if self.grouped:
            item["group_key"] = self.group_of(serial)
        if key is not None:
            item["id" if self.client_ids else "dedupe_key"] = CLIENT_IDS[key] if self.client_ids else key
        return item

    def check_enqueued(self, index: int, call: Call, keys: list[str | None], serials: list[int],
                       results: list[dict]) -> None:
        """Results in item order: an item whose key (client id) is queued already, or was used by an
        earlier item, is a duplicate with that message's id; any other item is a new message."""
        label = call.label
        expect(len(results) == len(keys), f"session {index}: {label} returned {len(results)} rows for {len(keys)} items")
        queued = {m.key: m for m in self.queued(index) if m.key is not None}
        txn = self.txn(index)
        new_ids = []
        for key, serial, result in zip(keys, serials, results):
            existing = queued.get(key) if key is not None else None
            if existing is not None and not result["duplicate"] and existing.serial in self.buriable | txn.buriable:
                # A committed claim moved it to the dead-letter table meanwhile (reconcile checks it).
                self.committed[existing.serial] = replace(existing, state="dead", dead_seq=self.harness.clock.tick())
                existing = None
            if existing is not None:
                expect(result["duplicate"] and result["id"] == existing.id,
                       f"(1) session {index}: {label}: key {key!r} is queued as id {existing.id} "
                       f"(n={existing.serial}), the call reported id {result['id']} duplicate={result['duplicate']}")
                continue
            expect(not result["duplicate"],
                   f"(1) session {index}: {label}: key {key!r} is not queued, yet the call reported "
                   f"id {result['id']} as a duplicate")
            if self.client_ids and key is not None:
                expect(result["id"] == CLIENT_IDS[key], f"session {index}: {label}: client id {key!r} came back as {result['id']}")
            else:
                expect(result["id"] not in self.seen_ids,
                       f"(2) session {index}: {label}: new message got id {result['id']}, which an earlier message had")
                new_ids.append(result["id"])
            self.seen_ids.add(result["id"])
            message = Message(serial, result["id"], key, writer=index, write_seq=call.start_seq, visible_write=True,
                              group=self.group_of(serial))
            txn.writes[serial] = message
            if key is not None:
                queued[key] = message
        if not self.client_ids:
            expect(new_ids == sorted(new_ids), f"session {index}: {label}: ids not in item order: {new_ids}")
        if any(key is not None for key in keys):
            txn.holds_locks = True

    def enqueue_call(self, index: int, keys: list[str | None], end: str | None, batch: bool) -> None:
        serials = [next(self.serials) for _ in keys]
        # From the send on: a call parked on a later item (a dedupe key) already holds the groups of
        # the items before it.
        self.txn(index).groups.update(g for g in map(self.group_of, serials) if g is not None)
        items = [self.item(serial, key) for serial, key in zip(serials, keys)]
        if batch:
            label = f"enqueue_batch(keys={keys})"

            def action(client: Any) -> list[dict]:
                return client.enqueue_batch(items)
        else:
            label = f"enqueue(key={keys[0]!r})"

            def action(client: Any) -> list[dict]:
                return [client.enqueue(**items[0])]

        self.send(index, label, action,
                  lambda call: self.check_enqueued(index, call, keys, serials, call.value), end)

    @rule(session=SESSION, key=KEY, end=END)
    @step
    def enqueue(self, session: int, key: str | None, end: str | None) -> None:
        if self.idle(session):
            self.enqueue_call(session, [key], end, batch=False)

    @rule(session=SESSION, keys=BATCH_KEYS, end=END)
    @step
    def enqueue_batch(self, session: int, keys: list[str | None], end: str | None) -> None:
        if self.idle(session):
            self.enqueue_call(session, keys, end, batch=True)

    def observe(self, sql: str) -> list[tuple]:
        return self.harness.observer.execute(sql).fetchall()


# --- destructive kinds ----------------------------------------------------------------------------

class DestructiveMachine(QueueMachine):
    """heap, fifo (lax and strict), lifo, pending: a dequeue deletes in the caller's transaction."""

    @property
    def order(self) -> str:
        kind = self.deployed.catalog.queue(self.queue).kind
        if kind == "fifo":
            return "strict" if self.options.get("strict") else "lax"
        return {"lifo": "lifo"}.get(kind, "none")

    @rule(session=SESSION, batch_size=st.integers(min_value=1, max_value=3), end=END)
    @step
    def dequeue(self, session: int, batch_size: int, end: str | None) -> None:
        if self.idle(session, repeatable_read_ok=True):
            self.send(session, f"dequeue(batch_size={batch_size})",
                      lambda client: client.dequeue(batch_size=batch_size),
                      lambda call: self.check_dequeued(session, batch_size, call), end)

    def check_dequeued(self, index: int, batch_size: int, call: Call, draining: bool = False) -> None:
        txn = self.txn(index)
        label = call.label
        got = [row["id"] for row in call.value]
        queued = self.queued(index)
        available = [m for m in queued if self.holder(index, m.serial) is None]
        window = (call.start_seq, call.end_seq)
        for row in call.value:
            serial = self.serial_of(row)
            message = self.view(index, serial)
            holder = self.holder(index, serial)
            expect(holder is None, f"(2) session {index}: {label} handed out id {row['id']}, which the open "
                                   f"transaction of session {holder} has dequeued")
            expect(message is not None and message.state == "queued",
                   f"(2) session {index}: {label} handed out id {row['id']} (n={serial}), "
                   + ("consumed by a committed dequeue already" if message else "which no committed enqueue made"))
            expect(row["id"] == message.id, f"session {index}: {label}: n={serial} came back as id {row['id']}, enqueued as {message.id}")
            if message.group is not None and txn.isolation != REPEATABLE_READ:
                self.check_group_order(index, f"session {index}: {label}", message, queued, window, set())
        expect(len(got) <= batch_size, f"session {index}: {label} handed out {len(got)} messages")
        self.check_one_per_group(index, label, [self.view(index, self.serial_of(row)) for row in call.value])
        heads = self.group_heads(index, queued, window)
        if heads is not None:
            # The grouped claim takes its two sources (ungrouped, group heads) one after the other:
            # no id order across them; what it may leave behind is judged on the heads.
            available = [m for m in available if m.serial in heads]
        if txn.isolation != REPEATABLE_READ:
            self.check_order(index, label, batch_size, got, available, window)
        for row in call.value:
            serial = self.serial_of(row)
            txn.writes[serial] = replace(self.view(index, serial), state="consumed")
        txn.holds_locks = txn.holds_locks or bool(got) or self.order == "strict"
        txn.dequeue_windows.append(window)

    def check_order(self, index: int, label: str, batch_size: int, got: list[int], available: list[Message],
                    window: tuple[int, int]) -> None:
        ids = sorted(m.id for m in available)
        if self.order == "strict":
            expect(got == ids[:batch_size],
                   f"(3) strict FIFO: session {index}: {label} handed out {got}; the lowest committed, "
                   f"not yet consumed ids were {ids[:batch_size]} (queued: {ids})")
            return
        if self.order == "lifo":
            newest = sorted(ids, reverse=True)[:batch_size]
            expect(got == newest, f"(3) LIFO: session {index}: {label} handed out {got}; the newest were {newest}")
            return
        eligible = sorted(m.id for m in available if not self.late(index, m, window))
        if self.order == "lax" and not self.grouped:
            expect(got == sorted(got), f"(3) lax FIFO: session {index}: {label} handed out {got}, not in id order")
            skipped = [i for i in eligible if got and i < max(got) and i not in got]
            expect(not skipped, f"(3) lax FIFO: session {index}: {label} handed out {got} and skipped the older "
                                f"{skipped}, committed before any of this session's dequeues")
        if len(got) < batch_size:
            behind = [i for i in eligible if i not in got]
            expect(not behind, f"(1) session {index}: {label} handed out {got} and left {behind} behind, "
                               "committed before any of this session's dequeues")

    def reconcile(self) -> None:
        seen = dict(self.observe(f"SELECT (m.payload ->> 'n')::bigint, m.id FROM {self.table} AS m"))
        expected = {m.serial: m.id for m in self.committed.values() if m.state == "queued"}
        missing = {n: i for n, i in expected.items() if seen.get(n) != i}
        extra = {n: i for n, i in seen.items() if n not in expected}
        expect(not missing and not extra,
               f"(1) the committed queue differs from the model: missing (n: id) {missing}, unexpected {extra}")

    def drain(self, index: int) -> None:
        left = sorted(m.id for m in self.committed.values() if m.state == "queued")
        # With groups a dequeue hands out one message per group: a group's next comes in the next call.
        for _ in range(len(left) if self.grouped else 1):
            self.send(index, "dequeue(batch_size=1000)", lambda client: client.dequeue(batch_size=1000),
                      lambda call: self.check_dequeued(index, 1000, call, draining=True), "commit")
        expect(not [m for m in self.committed.values() if m.state == "queued"],
               f"(1) a new session's dequeue did not drain the queue (it held {left})")


# --- work ------------------------------------------------------------------------------------------

PICK = st.integers(min_value=0, max_value=7)
HELD_PICKS = 6
PICKS = st.lists(PICK, min_size=1, max_size=3)
LEASE = st.sampled_from((SHORT_LEASE, LONG_LEASE))
# The lease_token a holder verb sends: none (0.1.0's check by worker name), the message's current
# lease's (whoever holds it), or one that was never a lease.
TOKEN = st.sampled_from(("none", "current", "stale"))
TOKENS = st.lists(TOKEN, min_size=3, max_size=3)


STATUS_TOKEN = st.sampled_from(("current", "current", "past", "stale"))
STATUS_TOKENS = st.lists(STATUS_TOKEN, min_size=3, max_size=3)
LEASE_STATUSES = ("held", "expired", "lost", "dead", "gone")


@dataclass
class StatusWatch:
    """A lease_status call in flight: the committed states it may have read (the one at the send,
    then one after each transaction of another session ended), and for each asked message another
    session's open transaction had changed at the send, that session (the call must wait for it)."""
    worlds: list[tuple[int | None, dict[int, Message], frozenset[int]]]   # (session that ended, committed, buriable)
    waits_for: dict[int, int]


class WorkMachine(QueueMachine):
    """The work kind: leases, attempts, complete / fail / extend by the holder of a live lease, dead
    letters. Worker name = session: w0, w1, w2 (a worker name is one consumer at a time)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps = 0
        self.seen_tokens: set[Any] = set()
        self.tokens_of: dict[int, list[Any]] = {}      # every lease token a dequeue handed out, per message
        # lease_status calls in flight, per session: what the other sessions' transactions ending
        # during the call made of the committed state (see lease_status).
        self.status_watches: dict[int, StatusWatch] = {}
        self.statuses_seen: collections.Counter[str] = collections.Counter()   # answers, and waits
        # Per session, its calls that looked for expired leases: (sent, returned, the messages
        # another transaction may have held then).
        self.looks: dict[int, list[tuple[float, float, frozenset[int]]]] = {}
        # Messages an in-flight batch acknowledgement may have locked already (it locks in id order
        # and may wait for a later one): another session cannot be sure to see them free.
        self.batch_targets: dict[int, set[int]] = {}
        schema = self.deployed.catalog.schema
        self.dead_table = f'"{schema}"."{self.queue}_dead"'
        self.history_table = f'"{schema}"."{self.queue}_history"' if self.options.get("history") else None
        self.max_attempts = self.options["max_attempts"]

    @staticmethod
    def worker(index: int) -> str:
        return f"w{index}"

    def lease_state(self, message: Message, call: Call) -> str:
        """'live', 'expired' or 'unknown' for the server's now during the call."""
        low, high = message.lease
        if call.returned + LEASE_MARGIN < low:
            return "live"
        if high + LEASE_MARGIN < call.sent:
            return "expired"
        return "unknown"

    def pick(self, index: int, pick: int) -> Message | None:
        """Mostly (pick < HELD_PICKS) one of the messages this session's worker holds, whose
        outcomes depend on the lease and the token; otherwise any queued message."""
        queued = self.queued(index)
        held = [m for m in queued if m.leased_by == self.worker(index)]
        pool = held if held and pick < HELD_PICKS else queued
        return pool[pick % len(pool)] if pool else None

    def on_error(self, index: int, call: Call) -> None:
        self.batch_targets.pop(index, None)
        self.status_watches.pop(index, None)
        super().on_error(index, call)

    def behind_the_look(self, index: int, message: Message, call: Call) -> bool:
        """An expired lease that this session's look, within the last LOOK_INTERVAL, could not see:
        it ran out after the look, or another transaction held its row then. It waits for the next."""
        if message.leased_by is None:
            return False
        return any(call.sent < returned + LOOK_INTERVAL + LEASE_MARGIN
                   and (message.serial in held or message.lease[1] + LEASE_MARGIN > sent)
                   for sent, returned, held in self.looks.get(index, ()))

    def looked(self, index: int, call: Call, queued: list[Message]) -> None:
        held = frozenset(m.serial for m in queued if self.maybe_locked(index, m.serial))
        self.looks.setdefault(index, []).append((call.sent, call.returned, held))

    def maybe_locked(self, index: int, serial: int) -> bool:
        return self.holder(index, serial) is not None or any(
            serial in targets for other, targets in self.batch_targets.items() if other != index)

    def token(self, message: Message, kind: str) -> Any:
        return {"none": None, "current": message.token, "stale": uuid.uuid4()}[kind]

    # -- dequeue -----------------------------------------------------------------------------------
    @rule(session=SESSION, batch_size=st.integers(min_value=1, max_value=3), lease_seconds=LEASE, end=END)
    @step
    def dequeue(self, session: int, batch_size: int, lease_seconds: int, end: str | None) -> None:
        if self.idle(session, repeatable_read_ok=True):
            worker = self.worker(session)
            self.send(session, f"dequeue(batch_size={batch_size}, worker={worker!r}, lease_seconds={lease_seconds})",
                      lambda client: client.dequeue(batch_size=batch_size, worker=worker, lease_seconds=lease_seconds),
                      lambda call: self.check_dequeued(session, worker, batch_size, lease_seconds, call), end)

    def check_dequeued(self, index: int, worker: str, batch_size: int, lease_seconds: int, call: Call) -> None:
        txn = self.txn(index)
        label = f"session {index}: {call.label}"
        rows = call.value
        expect(len(rows) <= batch_size, f"{label} handed out {len(rows)} messages")
        before = {m.serial: m for m in self.queued(index)}
        window = (call.start_seq, call.end_seq)
        # In flight, expired, attempts used: a claim may bury it and then hand out its group's next.
        buried_first = {m.serial for m in before.values() if m.in_flight and m.attempts >= self.max_attempts
                        and (m.leased_by is None or self.lease_state(m, call) != "live")}
        got = []
        for row in rows:
            serial = self.serial_of(row)
            message = before.get(serial)
            expect(message is not None, f"(2) {label} handed out n={serial} (id {row['id']}), which is not in the queue "
                                        f"(state: {self.view(index, serial).state if self.view(index, serial) else 'never enqueued'})")
            holder = self.holder(index, serial)
            expect(holder is None, f"(2) {label} handed out id {row['id']}, which the open transaction of session {holder} holds")
            expect(row["id"] == message.id, f"{label}: n={serial} came back as id {row['id']}, enqueued as {message.id}")
            if message.group is not None and txn.isolation != REPEATABLE_READ:
                self.check_group_order(index, label, message, list(before.values()), window, buried_first)
            lease = self.lease_state(message, call)
            attempts = row["attempts"]
            if message.leased_by is not None and lease != "expired":
                if message.leased_by != worker:
                    expect(lease != "live", f"(4) {label} leased id {row['id']} while {message.leased_by}'s lease on it "
                                            f"was live (ends after {time.strftime('%X', time.localtime(message.lease[0]))})")
                elif attempts == message.attempts + 1:
                    expect(lease != "live", f"(4)(5) {label} re-leased id {row['id']}, which {worker} already held "
                                            f"under a live lease, and counted attempt {attempts}: a second dequeue by "
                                            "the same worker may hand its live leases back but must not count an attempt")
            handed_back = message.leased_by == worker and attempts == message.attempts and lease != "expired"
            expect(handed_back or attempts == message.attempts + 1,
                   f"(5) {label} handed out id {row['id']} with attempts={attempts}; the model counts "
                   f"{message.attempts} deliveries before this one (lease {lease}, held by {message.leased_by})")
            if handed_back:
                expect(row["lease_token"] == message.token,
                       f"(4) {label} handed id {row['id']} back to its holder with lease_token {row['lease_token']}; "
                       f"the live lease's token is {message.token} (a hand-back is the same lease)")
            else:
                expect(row["lease_token"] is not None and row["lease_token"] not in self.seen_tokens,
                       f"(4) {label} leased id {row['id']} with lease_token {row['lease_token']}, which is not "
                       "fresh (every lease gets a new token)")
                self.seen_tokens.add(row["lease_token"])
                self.tokens_of.setdefault(serial, []).append(row["lease_token"])
            if handed_back:
                # Whether a hand-back renews the lease is the template's choice: either end holds.
                low, high = message.lease
                new_lease = (min(low, call.sent + lease_seconds), max(high, call.returned + lease_seconds))
                short = message.short_lease and lease_seconds == SHORT_LEASE
            else:
                new_lease = (call.sent + lease_seconds, call.returned + lease_seconds)
                short = lease_seconds == SHORT_LEASE
            txn.writes[serial] = replace(message, attempts=attempts, leased_by=worker, token=row["lease_token"],
                                         lease=new_lease, short_lease=short, in_flight=self.grouped)
            got.append(serial)
        self.check_one_per_group(index, call.label, [before.get(serial) for serial in got])
        heads = self.group_heads(index, list(before.values()), window)
        served = {before[serial].group for serial in got}
        claimable = []
        for message in before.values():
            if message.serial in got or self.maybe_locked(index, message.serial):
                continue
            if heads is not None and (message.serial not in heads or message.group in served - {None}):
                continue
            lease = "expired" if message.leased_by is None else self.lease_state(message, call)
            if message.attempts >= self.max_attempts and lease != "live":
                txn.buriable.add(message.serial)   # a claim may move it to the dead-letter table
            elif lease == "expired" and not self.late(index, message, window) and not self.behind_the_look(
                    index, message, call):
                claimable.append(message)
        if txn.isolation != REPEATABLE_READ and len(got) < batch_size:
            expect(not claimable, f"(1) {label} handed out {len(got)} and left ready messages behind: "
                                  + ", ".join(f"id {m.id} (n={m.serial})" for m in claimable))
        self.looked(index, call, list(before.values()))
        txn.holds_locks = True
        txn.dequeue_windows.append(window)

    # -- complete, fail, extend, release, the batch acknowledgements, complete_next ------------------
    def target(self, index: int, pick: int, token_kind: str) -> tuple[str, int, Any, Any] | None:
        """(worker, serial, id, lease_token) of the message a holder verb of an idle session acts on."""
        message = self.pick(index, pick) if self.idle(index) else None
        if message is None:
            return None
        return self.worker(index), message.serial, message.id, self.token(message, token_kind)

    def holder_verb(self, index: int, pick: int, verb: str, token_kind: str, end: str | None,
                    lease_seconds: int | None = None) -> None:
        target = self.target(index, pick, token_kind)
        if target is None:
            return
        worker, serial, message_id, token = target
        self.hold_groups(index, [serial])
        arguments = f"id={message_id!r}, worker={worker!r}, lease_token={token_kind}"
        if verb == "complete":
            label, action = f"complete({arguments})", lambda c: c.complete(message_id, worker, lease_token=token)
        elif verb == "fail":
            label, action = (f"fail({arguments})",
                             lambda c: c.fail(message_id, worker, "model: failed", retry_after_seconds=0,
                                              lease_token=token))
        elif verb == "release":
            label, action = f"release({arguments})", lambda c: c.release(message_id, worker, lease_token=token)
        else:
            label, action = (f"extend_lease({arguments}, lease_seconds={lease_seconds})",
                             lambda c: c.extend_lease(message_id, worker, lease_seconds, lease_token=token))
        self.send(index, label, action, lambda call: self.check_holder_verb(
            index, serial, verb, token_kind, lease_seconds, call, call.value, call.label), end)

    def check_holder_verb(self, index: int, serial: int, verb: str, token_kind: str, lease_seconds: int | None,
                          call: Call, value: Any, label: str) -> None:
        """value: what the verb answered for this message (completed, outcome, extended, released)."""
        txn = self.txn(index)
        label = f"session {index}: {label}"
        message = self.view(index, serial)
        mine = (message is not None and message.state == "queued" and message.leased_by == self.worker(index)
                and self.holder(index, serial) is None)
        lease = self.lease_state(message, call) if mine else "none"
        fenced_out = token_kind == "stale"
        may_change, must_change = mine and lease != "expired" and not fenced_out, mine and lease == "live" and not fenced_out
        changed = value != "lost" if verb == "fail" else value
        expect(not changed or may_change,
               f"(4) {label} returned {value!r}, but {self.worker(index)} does not hold a live lease on n={serial} "
               f"with that token (state {message.state if message else None}, leased by "
               f"{message.leased_by if message else None}, lease {lease}, token {token_kind}, changed in the open "
               f"transaction of session {self.holder(index, serial)})")
        expect(changed or not must_change,
               f"(4) {label} returned {value!r}, but {self.worker(index)} holds a live lease on n={serial}")
        if not changed:
            return
        if verb == "complete":
            txn.writes[serial] = replace(message, state="completed")
        elif verb == "fail":
            outcome = "dead" if message.attempts >= self.max_attempts else "retrying"
            expect(value == outcome, f"(5) {label} returned {value!r} after {message.attempts} of "
                                     f"{self.max_attempts} attempts; expected {outcome!r}")
            if outcome == "dead":
                txn.writes[serial] = replace(message, state="dead")
            else:
                txn.writes[serial] = replace(message, leased_by=None, token=None, lease=(0.0, 0.0), writer=index,
                                             write_seq=call.start_seq, visible_write=True)
        elif verb == "release":
            # Visible at once and the attempt given back (a graceful shutdown spends none).
            txn.writes[serial] = replace(message, leased_by=None, token=None, lease=(0.0, 0.0),
                                         attempts=max(message.attempts - 1, 0), writer=index,
                                         write_seq=call.start_seq, visible_write=True)
        else:
            txn.writes[serial] = replace(message, lease=(call.sent + lease_seconds, call.returned + lease_seconds),
                                         short_lease=lease_seconds == SHORT_LEASE)
        txn.holds_locks = True

    # One rule per shape of call, the verb drawn: more rules would make dequeue, which gives a
    # worker the leases these verbs act on, rarer in each example.
    @rule(session=SESSION, verb=st.sampled_from(("complete", "fail", "extend_lease", "release")), pick=PICK,
          token=TOKEN, lease_seconds=LEASE, end=END)
    @step
    def settle_a_lease(self, session: int, verb: str, pick: int, token: str, lease_seconds: int,
                       end: str | None) -> None:
        self.holder_verb(session, pick, verb, token, end, lease_seconds if verb == "extend_lease" else None)

    def batch_verb(self, index: int, picks: list[int], tokens: list[str], verb: str, end: str | None) -> None:
        """complete_batch / fail_batch over distinct messages, each item with its own kind of token;
        every item is judged as the single verb would be."""
        if not self.idle(index):
            return
        chosen: dict[int, Message] = {}
        for pick in picks:
            message = self.pick(index, pick)
            if message is not None:
                chosen.setdefault(message.serial, message)
        if not chosen:
            return
        worker = self.worker(index)
        items = [(m.serial, m.id, kind, self.token(m, kind)) for m, kind in zip(chosen.values(), tokens)]
        acks = [{"id": message_id, "lease_token": token} for _, message_id, _, token in items]
        label = f"{verb}(ids={[i for _, i, _, _ in items]}, lease_tokens={[k for _, _, k, _ in items]}, worker={worker!r})"
        if verb == "complete_batch":
            action, answer = (lambda c: c.complete_batch(acks, worker)), "completed"
        else:
            action, answer = (lambda c: c.fail_batch(acks, worker, "model: failed", retry_after_seconds=0)), "outcome"
        single = {"complete_batch": "complete", "fail_batch": "fail"}[verb]

        def check(call: Call) -> None:
            self.batch_targets.pop(index, None)
            rows = {row["id"]: row[answer] for row in call.value}
            expect(len(call.value) == len(items) and set(rows) == {i for _, i, _, _ in items},
                   f"session {index}: {label} answered {call.value}: one row per item, by id")
            for serial, message_id, kind, _ in items:
                self.check_holder_verb(index, serial, single, kind, None, call, rows[message_id],
                                       f"{label}, item id={message_id!r}")

        self.batch_targets[index] = set(chosen)
        self.hold_groups(index, list(chosen))
        self.send(index, label, action, check, end)

    @rule(session=SESSION, verb=st.sampled_from(("complete_batch", "fail_batch")), picks=PICKS, tokens=TOKENS,
          end=END)
    @step
    def acknowledge_a_batch(self, session: int, verb: str, picks: list[int], tokens: list[str],
                            end: str | None) -> None:
        self.batch_verb(session, picks, tokens, verb, end)

    @rule(session=SESSION, pick=PICK, token=TOKEN, batch_size=st.integers(min_value=1, max_value=2),
          lease_seconds=LEASE, end=END)
    @step
    def complete_next(self, session: int, pick: int, token: str, batch_size: int, lease_seconds: int,
                      end: str | None) -> None:
        """complete, then dequeue, in one call: judged as the two calls would be, one after the other."""
        target = self.target(session, pick, token)
        if target is None:
            return
        worker, serial, message_id, lease_token = target
        self.hold_groups(session, [serial])
        label = (f"complete_next(id={message_id!r}, worker={worker!r}, lease_token={token}, "
                 f"batch_size={batch_size}, lease_seconds={lease_seconds})")

        def check(call: Call) -> None:
            completed, rows = call.value
            self.check_holder_verb(session, serial, "complete", token, None, call, completed, label)
            self.check_dequeued(session, worker, batch_size, lease_seconds, replace(call, value=rows))

        self.send(session, label, lambda c: c.complete_next(message_id, worker, lease_token, batch_size, lease_seconds),
                  check, end)

    @rule(session=SESSION)
    @step
    def wait_verb(self, session: int) -> None:
        """wait(wait_ms => 0): one probe. It runs in autocommit (it commits between its steps), so
        only on a session without an open transaction. Ready means a message this session's dequeue
        would hand out is there: visible (new, retried, released, or its lease expired) and not
        locked by another open transaction; a message made visible by a transaction that was open
        during one of this session's dequeues (or waits) may wait for the claim position to expire."""
        if self.session(session).busy or session in self.txns:
            return

        def probe(client: Any) -> bool:
            client.conn.autocommit = True
            try:
                return client.wait(0)
            finally:
                client.conn.autocommit = False

        def check(call: Call) -> None:
            self.txns.pop(session, None)          # autocommit: nothing stays open
            window = (call.start_seq, call.end_seq)
            self.position_windows.setdefault(session, []).append(window)
            queued = [m for m in self.committed.values() if m.state == "queued"]
            lease = {m.serial: "expired" if m.leased_by is None else self.lease_state(m, call) for m in queued}
            others_waiting = any(self.session(i).busy for i in range(SESSIONS) if i != session)
            heads = self.group_heads(session, queued, window)
            ready_for_sure = [m.serial for m in queued if lease[m.serial] == "expired" and not others_waiting
                              and not self.maybe_locked(session, m.serial) and not self.late(session, m, window)
                              and not self.behind_the_look(session, m, call) and (heads is None or m.serial in heads)]
            self.looked(session, call, queued)
            maybe_ready = [m.serial for m in queued if lease[m.serial] != "live"]
            label = f"session {session}: {call.label}"
            expect(call.value or not ready_for_sure,
                   f"(1) {label} said nothing is ready; ready and free: n={ready_for_sure}")
            expect(not call.value or maybe_ready,
                   f"{label} said ready; no committed message is visible (every one is leased: "
                   f"{[(m.serial, m.leased_by) for m in queued]})")

        self.send(session, "wait(wait_ms=0)", probe, check)

    def status_token(self, index: int, message: Message, kind: str) -> Any:
        """The lease token lease_status asks about: the message's lease's (current; its last one when it
        has none now), one of its earlier leases' (past), or one that was never a lease (stale)."""
        issued = self.tokens_of.get(message.serial, [])
        if kind == "current" and (message.token or issued):
            return message.token or issued[-1]
        if kind == "past" and issued:
            return issued[0]
        return uuid.uuid4()

    def world(self, index: int, committed: dict[int, Message]) -> dict[int, Message]:
        txn = self.txns.get(index)
        return {**committed, **(txn.writes if txn else {})}

    def statuses_in(self, world: dict[int, Message], buriable: frozenset[int], message_id: Any, token: Any,
                    call: Call) -> set[str]:
        """What lease_status may answer for (id, token) when `world` is the state it reads."""
        same = [m for m in world.values() if m.id == message_id]
        queued = next((m for m in same if m.state == "queued"), None)
        if queued is None:
            return {"dead"} if any(m.state == "dead" for m in same) else {"gone"}
        if queued.leased_by is None or queued.token != token:
            found = {"lost"}
        else:
            found = {"live": {"held"}, "expired": {"expired"}, "unknown": {"held", "expired"}}[
                self.lease_state(queued, call)]
        if queued.serial in buriable:
            found.add("dead")      # a committed dequeue (or this session's) may have buried it
        return found

    def after_end(self, index: int) -> None:
        for watcher, watch in self.status_watches.items():
            if watcher != index:
                watch.worlds.append((index, dict(self.committed), frozenset(self.buriable)))

    @rule(session=SESSION, picks=PICKS, tokens=STATUS_TOKENS, end=END)
    @step
    def lease_status(self, session: int, picks: list[int], tokens: list[str], end: str | None) -> None:
        """(9) lease_status of up to three leases, each named by a message (mostly one this worker holds,
        or one that left the queue) and a token: its current lease's, an earlier lease's, or never one.
        It answers what the state it reads after its waits says (held or expired by the lease's end,
        lost for another lease or none, dead, gone); a message another session's open transaction had
        changed when it was sent is answered only after that transaction ended; it changes nothing
        (the observer's invariant checks that)."""
        if not self.idle(session):
            return
        queued = self.queued(session)
        own = [m for m in queued if m.leased_by == self.worker(session)]
        leased = [m for m in queued if m.leased_by is not None]
        ever = [m for m in queued if m.serial in self.tokens_of]     # leased once: released, failed...
        changed = [m for m in queued if self.holder(session, m.serial) is not None]
        left = [m for m in self.committed.values() if m.state in ("completed", "dead")]
        chosen: dict[Any, tuple[Message, str]] = {}
        # By pick (0..7): this worker's leases, anyone's, a message leased before, one another
        # session's open transaction changed, one that left; an empty pool falls back to the next.
        for pick, kind in zip(picks, tokens):
            pool = [own, own, own, leased, ever, changed, left, left][pick]
            pool = pool or own or leased or ever or queued
            if pool:
                message = pool[pick % len(pool)]
                chosen.setdefault(message.id, (message, kind))
        if not chosen:
            return
        asked = [(message.serial, message_id, kind, self.status_token(session, message, kind))
                 for message_id, (message, kind) in chosen.items()]
        txn = self.txn(session)
        waits_for = {}
        for serial, _, _, _ in asked:
            other = self.holder(session, serial)
            if other is not None:
                before, after = self.committed[serial], self.txns[other].writes[serial]
                if (before.state, before.token, before.leased_by, before.attempts) != (
                        after.state, after.token, after.leased_by, after.attempts):
                    waits_for[serial] = other
        self.status_watches[session] = StatusWatch(
            [(None, dict(self.committed), frozenset(self.buriable | txn.buriable))], waits_for)
        label = f"lease_status(ids={[i for _, i, _, _ in asked]}, lease_tokens={[k for _, _, k, _ in asked]})"

        def check(call: Call) -> None:
            watch = self.status_watches.pop(session)
            worlds = watch.worlds + [(None, dict(self.committed), frozenset(self.buriable | txn.buriable))]
            answers = {row["id"]: row["status"] for row in call.value}
            self.statuses_seen.update(answers.values())
            self.statuses_seen.update("waited" for _ in watch.waits_for)
            expect([row["id"] for row in call.value] == sorted(answers) and set(answers) == set(chosen),
                   f"(9) session {session}: {label} answered {call.value}: one row per item, in id order")
            for serial, message_id, kind, token in asked:
                other = watch.waits_for.get(serial)
                ended = next((at for at, (who, _, _) in enumerate(worlds) if who == other), None)
                expect(other is None or ended is not None,
                       f"(9) session {session}: {label} answered {answers[message_id]!r} for id {message_id} "
                       f"(n={serial}) while session {other}'s open transaction still held its change to it: "
                       "lease_status waits for a transaction that changed the row when it looked")
                allowed = set().union(*(self.statuses_in(self.world(session, committed), buriable, message_id,
                                                         token, call)
                                        for _, committed, buriable in worlds[ended or 0:]))
                expect(answers[message_id] in allowed,
                       f"(9) session {session}: {label} answered {answers[message_id]!r} for id {message_id} "
                       f"(n={serial}, token {kind}); the model allows {sorted(allowed)} (state "
                       f"{self.view(session, serial).state}, leased by {self.view(session, serial).leased_by})")

        self.send(session, label, lambda c: c.lease_status([{"id": i, "lease_token": t} for _, i, _, t in asked]),
                  check, end)

    @precondition(lambda self: self.sleeps < MAX_SLEEPS and any(
        m.short_lease and m.leased_by for m in self.committed.values() if m.state == "queued"))
    @rule()
    @step
    def let_short_leases_expire(self) -> None:
        """The lease clock: wait until every committed short lease has certainly expired."""
        self.sleeps += 1
        ends = [m.lease[1] for m in self.committed.values() if m.state == "queued" and m.short_lease and m.leased_by]
        wait_seconds = max(ends) + 2 * LEASE_MARGIN - time.time()
        assert wait_seconds <= SHORT_LEASE + 2 * LEASE_MARGIN, f"harness: a short lease ends in {wait_seconds:.1f} s"
        time.sleep(max(0.0, wait_seconds))

    # -- observer and drain ------------------------------------------------------------------------
    def reconcile(self) -> None:
        queued = {n: (i, a, w) for n, i, a, w in self.observe(
            f"SELECT (m.payload ->> 'n')::bigint, m.id, m.attempts, m.leased_by FROM {self.table} AS m")}
        dead = {n: (a, e) for n, a, e in self.observe(
            f"SELECT (d.payload ->> 'n')::bigint, d.attempts, d.last_error FROM {self.dead_table} AS d")}
        for serial in sorted(set(dead) - set(queued)):
            message = self.committed.get(serial)
            if message is not None and message.state == "queued":
                attempts, error = dead[serial]
                expect(serial in self.buriable and message.attempts >= self.max_attempts,
                       f"(5) id {message.id} (n={serial}) went to the dead-letter table ({error!r}, attempts "
                       f"{attempts}) while the model has it queued with {message.attempts} of {self.max_attempts} "
                       f"attempts and lease held by {message.leased_by}")
                expect(attempts == message.attempts and error == "lease expired",
                       f"(5) id {message.id} (n={serial}) buried with attempts={attempts}, error {error!r}; "
                       f"the model counts {message.attempts} deliveries")
                self.committed[serial] = replace(message, state="dead", dead_seq=self.harness.clock.tick())
        expected_queue = {m.serial: (m.id, m.attempts, m.leased_by) for m in self.committed.values() if m.state == "queued"}
        differ = {n: (queued.get(n), want) for n, want in expected_queue.items() if queued.get(n) != want}
        extra = sorted(set(queued) - set(expected_queue))
        expect(not differ and not extra,
               f"(1)(5) the queue table differs from the model: (n: (seen id, attempts, leased_by), (model)) "
               f"{differ}; unexpected n {extra}")
        latest_dead: dict[Any, Message] = {}
        for message in self.committed.values():
            if message.state == "dead" and message.dead_seq >= getattr(latest_dead.get(message.id), "dead_seq", -1):
                latest_dead[message.id] = message   # client ids: a later death of the id replaces the row
        expected_dead = {m.serial: m.attempts for m in latest_dead.values()}
        seen_dead = {n: a for n, (a, _) in dead.items()}
        expect(seen_dead == expected_dead, f"(1)(5) dead letters (n: attempts) {seen_dead}, model {expected_dead}")
        if self.history_table:
            history = sorted(self.observe(f"SELECT (h.payload ->> 'n')::bigint, h.attempts FROM {self.history_table} AS h"))
            expected_history = sorted((m.serial, m.attempts) for m in self.committed.values() if m.state == "completed")
            expect(history == expected_history, f"(1)(2) history (n, attempts) {history}, model {expected_history}")

    def drain(self, index: int) -> None:
        self.send(index, "dequeue(batch_size=1000, worker='drain')",
                  lambda client: client.dequeue(batch_size=1000, worker="drain", lease_seconds=LONG_LEASE),
                  lambda call: self.check_dequeued(index, "drain", 1000, LONG_LEASE, call), "commit")


# --- running the machines -------------------------------------------------------------------------

def machine_for(deployed: Any, base: type[QueueMachine], name: str) -> type[QueueMachine]:
    queue = deployed.catalog.queue("q")
    return type(name, (base,), {"deployed": deployed, "queue": "q", "options": dict(queue.options),
                                "harnesses": []})


def close_harness(machine: type[QueueMachine]) -> None:
    while machine.harnesses:
        machine.harnesses.pop().close()


def run_model(machine: type[QueueMachine], examples: int) -> None:
    long_run = LONG_RUN_EXAMPLES > 0
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=LONG_RUN_EXAMPLES or examples,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=not long_run,
            database=None,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        ))
    finally:
        close_harness(machine)


DESTRUCTIVE_QUEUES = {
    "fifo_strict": {"kind": "fifo", "options": {"strict": True, "dedupe": True}},
    "fifo_lax": {"kind": "fifo", "options": {"dedupe": True}},
    "lifo": {"kind": "lifo", "options": {"dedupe": True}},
    "heap": {"kind": "heap", "options": {"dedupe": True}},
    "pending": {"kind": "pending", "options": {"dedupe": True}},
    "fifo_groups": {"kind": "fifo", "options": {"groups": True, "dedupe": True}},
}
WORK_QUEUES = {
    "work_dedupe": {"kind": "work", "options": {"dedupe": True, "max_attempts": 3, "lease_seconds": LONG_LEASE}},
    "work_client_ids": {"kind": "work", "options": {"client_ids": True, "max_attempts": 2, "history": True,
                                                    "lease_seconds": LONG_LEASE}},
    "work_groups": {"kind": "work", "options": {"groups": True, "dedupe": True, "max_attempts": 2,
                                                "lease_seconds": LONG_LEASE}},
}


def deploy_model_queue(deploy_queues: Callable[..., Any], spec: dict[str, Any]) -> Any:
    return deploy_queues({"name": "q", "payload": "json", **spec})


@pytest.mark.parametrize("name", sorted(DESTRUCTIVE_QUEUES))
def test_destructive_kinds_keep_the_contract_in_every_interleaving(deploy_queues, name) -> None:
    deployed = deploy_model_queue(deploy_queues, DESTRUCTIVE_QUEUES[name])
    run_model(machine_for(deployed, DestructiveMachine, f"{name.title().replace('_', '')}Machine"), DESTRUCTIVE_EXAMPLES)


@pytest.mark.parametrize("name", sorted(WORK_QUEUES))
def test_work_keeps_the_contract_in_every_interleaving(deploy_queues, name) -> None:
    deployed = deploy_model_queue(deploy_queues, WORK_QUEUES[name])
    run_model(machine_for(deployed, WorkMachine, f"{name.title().replace('_', '')}Machine"), WORK_EXAMPLES)



# --- regressions: the minimal failing examples of issue 16's defects, replayed -----------------------
# Each is the example Hypothesis printed for a defect of release 0.1.0 (the deadlock: reduced by
# hand, see its docstring), replayed step by step with the invariants checked after every step and
# the teardown's drain at the end, exactly as run_state_machine_as_test runs it.

Step = tuple[str, dict[str, Any]]


def replay(deploy_queues: Callable[..., Any], name: str, steps: list[Step]) -> QueueMachine:
    spec = {**DESTRUCTIVE_QUEUES, **WORK_QUEUES}[name]
    base = WorkMachine if spec["kind"] == "work" else DestructiveMachine
    machine = machine_for(deploy_model_queue(deploy_queues, spec), base, f"{name.title().replace('_', '')}Machine")
    try:
        state = machine()
        try:
            state.observer_sees_the_committed_model()
            for rule_name, arguments in steps:
                getattr(state, rule_name)(**arguments)
                state.observer_sees_the_committed_model()
        finally:
            state.teardown()
    finally:
        close_harness(machine)
    return state


def test_strict_fifo_hands_out_an_id_its_producer_committed_late_before_later_ones(deploy_queues) -> None:
    """0.1.0 stored a claim position past the uncommitted id 1 (the sequence's last_value + 1), so
    after the producer committed, the consumer found nothing for up to a second (invariant 3)."""
    replay(deploy_queues, "fifo_strict", [
        ("enqueue_batch", {"session": 0, "keys": [None], "end": None}),
        ("dequeue", {"session": 2, "batch_size": 1, "end": None}),
        ("commit", {"session": 0}),
        ("dequeue", {"session": 2, "batch_size": 1, "end": None}),
    ])


def test_strict_fifo_hands_out_a_late_commit_before_a_later_enqueue(deploy_queues) -> None:
    """The issue's own account: the late id 1 must come before id 2, enqueued after it committed."""
    replay(deploy_queues, "fifo_strict", [
        ("enqueue", {"session": 0, "key": None, "end": None}),
        ("dequeue", {"session": 1, "batch_size": 1, "end": "commit"}),
        ("commit", {"session": 0}),
        ("enqueue", {"session": 2, "key": None, "end": "commit"}),
        ("dequeue", {"session": 1, "batch_size": 1, "end": "commit"}),
    ])


@pytest.mark.parametrize("name", sorted(WORK_QUEUES))
def test_work_batches_sharing_keys_in_opposite_orders_wait_instead_of_deadlocking(deploy_queues, name) -> None:
    """Session 0 holds key b; session 1's batch [a, b, c] inserts a and waits for b; session 2's
    batch [c, a] inserts c and waits for a. When session 0 rolls back, session 1 inserts b and goes
    on to c, which session 2 holds: with items inserted in input order (0.1.0) that is a deadlock
    between two transactions in their first call (invariant 6). Taken in key order, session 2 waits
    for a before it inserts anything, and session 1 finishes. Only one session wakes at each step,
    so the schedule is deterministic. Hypothesis found such deadlocks (its own examples had two
    batches wake at once, which races, so they do not replay exactly); on the client-ids queue the
    keys are client ids."""
    replay(deploy_queues, name, [
        ("enqueue", {"session": 0, "key": "b", "end": None}),
        ("enqueue_batch", {"session": 1, "keys": ["a", "b", "c"], "end": None}),
        ("enqueue_batch", {"session": 2, "keys": ["c", "a"], "end": None}),
        ("rollback", {"session": 0}),
    ])


def test_a_second_dequeue_by_the_same_worker_counts_no_attempt_for_its_live_lease(deploy_queues) -> None:
    """0.1.0's own-messages claim re-leased w0's live lease and counted attempt 2 (invariants 4, 5);
    four such dequeues buried the message ('lease expired') on a 600 s lease. Hypothesis' example
    used 1 s leases; 600 s keeps the lease certainly live on a slow machine."""
    replay(deploy_queues, "work_dedupe", [
        ("enqueue", {"session": 0, "key": None, "end": None}),
        ("dequeue", {"session": 0, "batch_size": 1, "lease_seconds": LONG_LEASE, "end": None}),
        ("dequeue", {"session": 0, "batch_size": 1, "lease_seconds": LONG_LEASE, "end": None}),
    ])


def test_a_dequeue_under_repeatable_read_is_refused_not_a_serialization_failure(deploy_queues) -> None:
    """0.1.0 claimed in the REPEATABLE READ snapshot and failed with 40001 on the row session 1 had
    consumed since (invariant 7)."""
    replay(deploy_queues, "fifo_lax", [
        ("enqueue_batch", {"session": 0, "keys": [None], "end": None}),
        ("commit", {"session": 0}),
        ("begin_repeatable_read", {"session": 0}),
        ("dequeue", {"session": 1, "batch_size": 1, "end": "commit"}),
        ("dequeue", {"session": 0, "batch_size": 1, "end": None}),
    ])


@pytest.mark.parametrize("name", ["fifo_lax", "fifo_strict", "work_dedupe"])
def test_a_dequeue_under_repeatable_read_hides_nothing_from_the_session_s_next_dequeues(deploy_queues, name) -> None:
    """0.1.0: a dequeue in a REPEATABLE READ transaction whose snapshot predates id 1's commit found
    nothing and stored a claim position past it (fifo: the next id; work: now), which the session
    kept after the commit, so its next dequeue left id 1 behind (invariants 7 and 1)."""
    lease = {"lease_seconds": LONG_LEASE} if name.startswith("work") else {}
    replay(deploy_queues, name, [
        ("begin_repeatable_read", {"session": 0}),
        ("enqueue", {"session": 1, "key": None, "end": "commit"}),
        ("dequeue", {"session": 0, "batch_size": 1, "end": "commit", **lease}),
        ("dequeue", {"session": 0, "batch_size": 1, "end": "commit", **lease}),
    ])


def test_the_consumers_v2_verbs_keep_the_model_in_a_scripted_example(deploy_queues) -> None:
    """The random examples make test runs reach a worker's own live lease only now and then; this
    one does for each verb of consumers v2, so a wrong outcome of any fails every run: wait on a
    free and on an all-leased queue, release (the attempt given back), a stale token fenced out,
    complete_batch with a current and a stale token, complete_next, fail_batch."""
    long = {"lease_seconds": LONG_LEASE}
    replay(deploy_queues, "work_dedupe", [
        *[("enqueue", {"session": 0, "key": None, "end": "commit"})] * 3,
        ("wait_verb", {"session": 2}),
        ("dequeue", {"session": 0, "batch_size": 3, "end": "commit", **long}),
        ("wait_verb", {"session": 2}),
        ("settle_a_lease", {"session": 0, "verb": "release", "pick": 0, "token": "current", "end": "commit", **long}),
        ("settle_a_lease", {"session": 0, "verb": "complete", "pick": 0, "token": "stale", "end": "commit", **long}),
        ("acknowledge_a_batch", {"session": 0, "verb": "complete_batch", "picks": [0, 1],
                                 "tokens": ["current", "stale", "none"], "end": "commit"}),
        ("wait_verb", {"session": 1}),
        ("complete_next", {"session": 0, "pick": 0, "token": "current", "batch_size": 1, "end": "commit", **long}),
        ("acknowledge_a_batch", {"session": 0, "verb": "fail_batch", "picks": [0],
                                 "tokens": ["current", "none", "none"], "end": "commit"}),
    ])


def test_a_producer_parked_on_a_later_item_holds_the_groups_of_the_items_before_it(deploy_queues) -> None:
    """Found by a CI run of the groups model: session 1's batch joined group g2 for its second item and
    then waited for key 'a' (session 0's open dequeue consumed it), so session 0's dequeue stepped
    over g2's head; the model recorded a producer's groups only when its call returned, and took the
    skipped head for one left behind. A call holds its items' groups from the send on."""
    replay(deploy_queues, "fifo_groups", [
        ("enqueue", {"session": 0, "key": "a", "end": "commit"}),
        ("enqueue_batch", {"session": 0, "keys": [None, None], "end": "commit"}),
        ("dequeue", {"session": 0, "batch_size": 1, "end": None}),
        ("enqueue_batch", {"session": 1, "keys": [None, "a"], "end": None}),
        ("dequeue", {"session": 0, "batch_size": 2, "end": None}),
    ])


def test_lease_status_keeps_the_model_in_a_scripted_example(deploy_queues) -> None:
    """The random examples ask lease_status mostly about messages never leased; this one reaches each
    answer and the wait, so a wrong word or a call that does not wait fails every run: w0 leases three
    messages, w1 sees them held; w0 completes one in an open transaction, which w1's question waits
    for (gone after the commit); w0 releases one (lost under its old token) and keeps one (held); w1
    leases the released one for a second, which then reads expired; w1 leases it again on its last
    attempt and fails it (dead)."""
    long, short = {"lease_seconds": LONG_LEASE}, {"lease_seconds": SHORT_LEASE}
    state = replay(deploy_queues, "work_client_ids", [
        *[("enqueue", {"session": 0, "key": key, "end": "commit"}) for key in ("a", "b", "c")],
        ("dequeue", {"session": 0, "batch_size": 3, "end": "commit", **long}),
        ("lease_status", {"session": 1, "picks": [3, 4], "tokens": ["current", "past", "current"], "end": None}),
        ("settle_a_lease", {"session": 0, "verb": "complete", "pick": 0, "token": "current", "end": None, **long}),
        ("lease_status", {"session": 1, "picks": [5], "tokens": ["current", "current", "current"], "end": None}),
        ("commit", {"session": 0}),
        ("settle_a_lease", {"session": 0, "verb": "release", "pick": 0, "token": "current", "end": "commit", **long}),
        ("lease_status", {"session": 2, "picks": [6, 4, 3], "tokens": ["current", "past", "current"], "end": None}),
        ("dequeue", {"session": 1, "batch_size": 1, "end": "commit", **short}),
        ("let_short_leases_expire", {}),
        ("lease_status", {"session": 2, "picks": [0], "tokens": ["current", "current", "current"], "end": None}),
        ("dequeue", {"session": 1, "batch_size": 1, "end": "commit", **long}),
        ("settle_a_lease", {"session": 1, "verb": "fail", "pick": 0, "token": "current", "end": "commit", **long}),
        ("lease_status", {"session": 2, "picks": [6, 7], "tokens": ["current", "current", "current"], "end": "commit"}),
    ])
    assert set(state.statuses_seen) == {*LEASE_STATUSES, "waited"}, state.statuses_seen


def test_an_expired_lease_held_during_a_look_waits_for_the_next_look(deploy_queues) -> None:
    """Found by a long run of the model (TABLEQUEUE_MODEL_EXAMPLES): w1's lease ran out, and w1 took it
    again in an open transaction; session 0's complete_next looked for expired leases then (the row
    held: skipped) and came up short, so its next call, after w1 rolled back, did not look again
    within the second (docs/work-queue.md, Expired leases). The model expected the message at once."""
    short = {"lease_seconds": SHORT_LEASE}
    replay(deploy_queues, "work_client_ids", [
        ("enqueue", {"session": 0, "key": "a", "end": "commit"}),
        ("complete_next", {"session": 1, "pick": 0, "token": "none", "batch_size": 1, "end": "commit", **short}),
        ("let_short_leases_expire", {}),
        ("complete_next", {"session": 1, "pick": 0, "token": "none", "batch_size": 2, "end": None, **short}),
        ("complete_next", {"session": 0, "pick": 0, "token": "none", "batch_size": 1, "end": None, **short}),
        ("rollback", {"session": 1}),
        ("complete_next", {"session": 0, "pick": 0, "token": "none", "batch_size": 1, "end": None, **short}),
    ])
