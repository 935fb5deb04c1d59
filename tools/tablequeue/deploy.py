"""The migration tool: plan what changed since the last deploy, refuse what would lose data, apply the rest.

Code units (procedures, functions, grants) are replaced when their text changes. A storage unit
(table, index, sequence, type) is identified by its storage version and shape, never by its text
(render.py): a unit recorded at the version and shape the templates render is unchanged whatever
its comments say; a lower version or a changed option is migrated, in order, by the migration
templates (database/templates/<dialect>/migrations/); a type is dropped and created again around
the procedures that use it. What no migration can do without losing messages (a kind change, a
payload type change, client ids on a queue that holds messages) is refused, naming the queue, the
change and how many messages it holds, and then nothing at all is applied.

Every step runs in its own transaction with a short lock timeout and is retried with backoff until
a deadline (LockPolicy), so a DDL statement queued behind a long transaction never holds up the
queue's traffic for longer than the lock timeout; PostgreSQL builds indexes on existing tables
CONCURRENTLY, outside any transaction.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .distribution import version
from .engines import Dialect, EngineError, LockTimeout, Part, Record
from .gosplit import mask_comments_and_strings
from .render import (BOOLEAN_SHAPE_KEYS, Migration, MigrationSource, RenderError, Storage, Unit,
                     migration_candidates)

CREATE, UPDATE, UNCHANGED, MIGRATE, RECORD, REFUSED = "create", "update", "unchanged", "migrate", "record", "refused"
APPLIED_ACTIONS = (CREATE, UPDATE, MIGRATE, RECORD)
# What 0.1.0's history rows stand for: it recorded no storage version, and all its storage was v1.
FIRST_STORAGE_VERSION = 1
COUNT_LIMIT = 1_000_000


class DeployRefused(RuntimeError):
    """The catalog asks for a change the tool will not make. Nothing was applied."""


@dataclass(frozen=True)
class LockPolicy:
    """How a step takes its locks: each attempt waits at most timeout_seconds for a lock (so the
    queue's traffic queued behind the waiting DDL waits no longer than that), then it is rolled
    back and retried, with backoff, for up to retry_for_seconds."""
    timeout_seconds: float = 2.0
    retry_for_seconds: float = 600.0

    def describe(self) -> str:
        return (f"every step takes its locks with a {self.timeout_seconds:g} s lock timeout and is retried "
                f"for up to {self.retry_for_seconds:g} s; a concurrent index build blocks no reads or writes "
                f"and may wait up to {self.retry_for_seconds:g} s for older transactions")


class PlanProbe(Protocol):
    """What the planner may ask the database (tests pass a fake)."""

    def count_messages(self, table: str) -> int | None: ...
    def deployed_facts(self, unit: Unit) -> dict[str, str]: ...
    def type_dependents(self, unit: Unit) -> list[str]: ...


class _NoProbe:
    def count_messages(self, table: str) -> int | None:
        return None

    def deployed_facts(self, unit: Unit) -> dict[str, str]:
        return {}

    def type_dependents(self, unit: Unit) -> list[str]:
        return []


@dataclass(frozen=True)
class PlanItem:
    unit: Unit
    action: str
    reason: str = ""
    recorded: Storage | None = None          # storage: as the history says (0.1.0: as deployed)
    migrations: tuple[Migration, ...] = ()   # storage, MIGRATE: in the order they run
    concurrent: bool = False                 # PostgreSQL index unit on an existing table
    recreates: tuple[Unit, ...] = ()         # a type's MIGRATE: the code units dropped and recreated with it
    with_unit: str | None = None             # a code unit recreated inside this type unit's transaction
    previous_checksum: str | None = None     # RECORD: the checksum of what 0.1.0 applied

    def describe(self) -> list[str]:
        head = f"{self.action:<9} {self.unit.type:<7} {self.unit.name}"
        if self.unit.storage is not None and self.action in (CREATE, UNCHANGED):
            head += f"  {self.unit.storage.describe()}"
        if self.recorded is not None and self.action in (MIGRATE, RECORD):
            head += f"  {self.recorded.describe()} -> {self.unit.storage.describe()}"
        lines = [head + (f"  ({self.reason})" if self.reason else "")]
        for migration in self.migrations:
            for number, step in enumerate(migration.steps, start=1):
                when = ", after the code units" if step.after_code else ""
                lines.append(f"            {migration.name} {number}/{len(migration.steps)} [{step.mode}{when}] "
                             f"{step.what}; locks: {step.locks}")
        for unit in self.recreates:
            lines.append(f"            drops and recreates {unit.name} in the same transaction")
        return lines


@dataclass
class Plan:
    items: list[PlanItem] = field(default_factory=list)
    lock_policy: LockPolicy = field(default_factory=LockPolicy)

    @property
    def changes(self) -> list[PlanItem]:
        """What deploy runs, in order (code units recreated with their type run inside its item)."""
        return [item for item in self.items if item.action in APPLIED_ACTIONS and item.with_unit is None]

    @property
    def refused(self) -> list[PlanItem]:
        return [item for item in self.items if item.action == REFUSED]

    def describe(self) -> str:
        lines = [line for item in self.items for line in item.describe()]
        applied = [item for item in self.items if item.action in APPLIED_ACTIONS]
        summary = (f"{len(applied)} to apply, "
                   f"{sum(1 for i in self.items if i.action == UNCHANGED)} unchanged, "
                   f"{len(self.refused)} refused")
        if applied:
            summary += f"\n{self.lock_policy.describe()}"
        return "\n".join(lines + [summary])


def latest_rows(history: list[dict]) -> dict[str, dict]:
    latest: dict[str, dict] = {}
    for row in history:  # ordered by history_id: the last row of a unit wins
        latest[row["unit_name"]] = row
    return latest


def recorded_storage(row: dict) -> Storage | None:
    """The version and shape a history row gives its storage unit; None for a 0.1.0 row."""
    if row.get("storage_version") is None:
        return None
    return Storage(int(row["storage_version"]), Storage.parse_shape(row.get("storage_shape")))


_INDEX_TARGET = re.compile(r"\bCREATE\s+(?:UNIQUE\s+)?(?:NONCLUSTERED\s+)?INDEX\b.*?\bON\s+"
                           r"(?:\"(?P<pg_schema>[^\"]+)\"\.\"(?P<pg_table>[^\"]+)\"|"
                           r"\[(?P<ms_schema>[^\]]+)\]\.\[(?P<ms_table>[^\]]+)\])", re.IGNORECASE | re.DOTALL)


def index_table(unit: Unit) -> str | None:
    """schema.table an index unit is built on (as the history names units)."""
    match = _INDEX_TARGET.search(mask_comments_and_strings(unit.body))
    if match is None:
        return None
    return ".".join(part for part in (match["pg_schema"] or match["ms_schema"],
                                      match["pg_table"] or match["ms_table"]))


def _queue_shapes(units: list[Unit]) -> dict[str, dict[str, str]]:
    """Each queue's whole storage shape as the templates render it (the union of its units')."""
    shapes: dict[str, dict[str, str]] = {}
    for unit in units:
        if unit.storage is not None and unit.queue is not None:
            shapes.setdefault(unit.queue, {}).update(dict(unit.storage.shape))
    return shapes


def _held(messages: int | None, what: str = "message") -> str:
    if messages is None:
        return "its table does not exist"
    more = "+" if messages >= COUNT_LIMIT else ""
    return f"holds {messages}{more} {what}(s)"


class _Planner:
    def __init__(self, units: list[Unit], history: list[dict], probe: PlanProbe, source: MigrationSource | None,
                 concurrent_indexes: bool):
        self.units = units
        self.by_name = {unit.name: unit for unit in units}
        self.latest = latest_rows(history)
        self.probe = probe
        self.source = source
        self.concurrent_indexes = concurrent_indexes
        self.queue_shapes = _queue_shapes(units)
        self.rebuilt: set[str] = set()            # tables dropped and created again in this plan
        self.recreated_with: dict[str, str] = {}  # code unit -> the type unit it is recreated with

    def plan(self) -> list[PlanItem]:
        return [self._code(unit) if unit.type == "code" else self._storage(unit) for unit in self.units]

    # -- code ---------------------------------------------------------------------------------
    def _code(self, unit: Unit) -> PlanItem:
        row = self.latest.get(unit.name)
        with_unit = self.recreated_with.get(unit.name)
        if with_unit is not None:
            return PlanItem(unit, UPDATE, f"dropped and recreated with its type {with_unit}", with_unit=with_unit)
        if row is None:
            return PlanItem(unit, CREATE)
        if row["unit_checksum"] == unit.checksum:
            return PlanItem(unit, UNCHANGED)
        return PlanItem(unit, UPDATE, "definition changed")

    # -- storage ------------------------------------------------------------------------------
    def _queue_table(self, unit: Unit) -> str:
        return f"{unit.name.split('.', 1)[0]}.{unit.queue}" if unit.queue else unit.name

    def _refuse(self, unit: Unit, change: str, table: str | None = None, what: str = "message") -> PlanItem:
        table = table or self._queue_table(unit)
        held = _held(self.probe.count_messages(table), what)
        queue = f"queue '{unit.queue}'" if unit.queue else f"'{unit.name}'"
        return PlanItem(unit, REFUSED, (
            f"{queue}: {change}: no migration keeps the data, and tablequeue never drops or rebuilds "
            f"storage that holds messages. {table} {held} and is left as it is: drain it and drop it by "
            f"hand, or deploy the change under a new queue name"))

    def _create(self, unit: Unit) -> PlanItem:
        if unit.object == "index":
            table = index_table(unit)
            if table is not None and table in self.rebuilt:
                return PlanItem(unit, CREATE, f"its table {table} was created again")
            if self.concurrent_indexes and table is not None and table in self.latest:
                return PlanItem(unit, CREATE, f"a new index on the existing table {table}: built CONCURRENTLY",
                                concurrent=True)
        return PlanItem(unit, CREATE)

    def _recorded(self, unit: Unit, row: dict) -> tuple[Storage, bool]:
        """The unit's storage as recorded; for a 0.1.0 row (no version), version 1 with the shape the
        deployed objects show. Facts the objects cannot tell apart come as 'a|b' (heap, fifo and lifo
        tables are identical): the wanted value is taken when it is one of them."""
        recorded = recorded_storage(row)
        if recorded is not None:
            return recorded, False
        facts = self.probe.deployed_facts(unit)
        shape = []
        for key, wanted in unit.storage.shape:
            found = facts.get(key)
            shape.append((key, wanted if found is None or wanted in found.split("|") else found))
        return Storage(FIRST_STORAGE_VERSION, tuple(shape)), True

    def _storage(self, unit: Unit) -> PlanItem:
        row = self.latest.get(unit.name)
        if row is None:
            return self._create(unit)
        if unit.object == "index":
            table = index_table(unit)
            if table is not None and table in self.rebuilt:
                return PlanItem(unit, CREATE, f"its table {table} was created again")
        wanted = unit.storage
        recorded, legacy = self._recorded(unit, row)
        if recorded.kind != wanted.kind:
            return self._refuse(unit, f"a kind change from {recorded.kind} to {wanted.kind}")
        if recorded.version > wanted.version:
            return PlanItem(unit, REFUSED, (
                f"{unit.name} is at storage v{recorded.version} (recorded by tablequeue {row['tool_version']}), "
                f"newer than the v{wanted.version} this tablequeue {version()} renders; it does not downgrade "
                "storage: deploy with the newer tablequeue"))
        if recorded.matches(wanted):
            if legacy:
                return PlanItem(unit, RECORD, f"deployed by tablequeue {row['tool_version']}, which recorded no "
                                "storage version: recorded as it is", recorded=recorded,
                                previous_checksum=row["unit_checksum"])
            return PlanItem(unit, UNCHANGED)
        if unit.object == "type":
            return self._recreate_type(unit, recorded)
        if recorded.value("payload") != wanted.value("payload"):
            return self._refuse(unit, f"a payload type change from {recorded.value('payload')} to "
                                      f"{wanted.value('payload')}", table=unit.name)
        if recorded.value("client_ids") != wanted.value("client_ids"):
            return self._rebuild(unit, recorded)
        return self._migrate(unit, recorded)

    def _source(self) -> MigrationSource:
        if self.source is None:
            raise RenderError("storage changed but the planner was given no migration templates")
        return self.source

    def _migrate(self, unit: Unit, recorded: Storage) -> PlanItem:
        source = self._source()
        wanted = unit.storage
        queue_shape = self.queue_shapes.get(unit.queue or "", {})
        # Keys the recorded shape lacks were added to the unit's shape later: at their default then.
        # A boolean key the recorded shape names and the wanted one omits is off now (groups).
        omitted = tuple((key, "off") for key, _ in recorded.shape
                        if key in BOOLEAN_SHAPE_KEYS and key not in dict(wanted.shape))
        wanted = Storage(wanted.version, wanted.shape + omitted)
        shape = [(key, recorded.value(key) or value) for key, value in wanted.shape]
        migrations: list[Migration] = []
        for version in range(recorded.version, wanted.version):
            change = f"v{version}_to_v{version + 1}"
            name = source.find(unit, change)
            if name is None:
                raise RenderError(f"{unit.name} is v{wanted.version} but there is no {source.dialect} migration "
                                  f"from v{version}: expected migrations/{' or '.join(migration_candidates(unit, change))}.sql")
            migrations.append(source.render(name, unit, Storage(version, tuple(shape)),
                                            Storage(version + 1, tuple(shape)), queue_shape))
        # Options turned on first, then off: a removal may finish after the code units (after-code
        # steps), and nothing that the new code units need may wait behind it.
        changed = [(index, key, value) for index, (key, value) in enumerate(wanted.shape)
                   if key in BOOLEAN_SHAPE_KEYS and shape[index][1] != value]
        for index, key, value in sorted(changed, key=lambda change: change[2] != "on"):
            change = f"{'add' if value == 'on' else 'drop'}_{key}"
            name = source.find(unit, change)
            if name is None:
                return self._refuse(unit, f"turning {key} {value}", table=unit.name)
            before = Storage(wanted.version, tuple(shape))
            shape[index] = (key, value)
            # Recorded as rendered: without the keys the unit's shape omits.
            after = tuple((k, v) for k, v in shape if (k, v) not in omitted)
            migrations.append(source.render(name, unit, before, Storage(wanted.version, after), queue_shape))
        return PlanItem(unit, MIGRATE, recorded=recorded, migrations=tuple(migrations))

    def _rebuild(self, unit: Unit, recorded: Storage) -> PlanItem:
        """Client ids change the id column's type: only an empty table is dropped and created again."""
        change = f"client_ids {recorded.value('client_ids')} -> {unit.storage.value('client_ids')}"
        messages = self.probe.count_messages(unit.name)
        if messages != 0:
            what = "row" if unit.role != "table" else "message"
            return self._refuse(unit, f"{change} changes the id type, which only an empty queue can take",
                                table=unit.name, what=what)
        migration = self._source().render("drop_empty_table", unit, recorded, unit.storage,
                                          self.queue_shapes.get(unit.queue or "", {}),
                                          context={"create_sql": unit.body.rstrip()})
        self.rebuilt.add(unit.name)
        return PlanItem(unit, MIGRATE, f"{change}: the table is empty, created again",
                        recorded=recorded, migrations=(migration,))

    def _recreate_type(self, unit: Unit, recorded: Storage) -> PlanItem:
        """A type holds no data: drop it and create it again, with the routines that use it."""
        dependents = self.probe.type_dependents(unit)
        foreign = [name for name in dependents if self.by_name.get(name, None) is None
                   or self.by_name[name].type != "code"]
        if foreign:
            return PlanItem(unit, REFUSED, (
                f"type {unit.name} changes ({recorded.describe()} -> {unit.storage.describe()}) and is used by "
                f"{', '.join(sorted(foreign))}, which tablequeue does not deploy: drop them, deploy, and create "
                "them again"))
        for name in dependents:
            self.recreated_with[name] = unit.name
        return PlanItem(unit, MIGRATE, "a type: dropped and created again", recorded=recorded,
                        recreates=tuple(self.by_name[name] for name in sorted(dependents)))


def make_plan(units: list[Unit], history: list[dict], probe: PlanProbe | None = None,
              migrations: MigrationSource | None = None, concurrent_indexes: bool = False,
              lock_policy: LockPolicy | None = None) -> Plan:
    """Compare rendered units with the history: what to create, replace, migrate, record or refuse."""
    items = _Planner(units, history, probe or _NoProbe(), migrations, concurrent_indexes).plan()
    return Plan(items, lock_policy or LockPolicy())


@dataclass
class DeployResult:
    plan: Plan
    applied: list[tuple[str, float]] = field(default_factory=list)


class _DatabaseProbe:
    def __init__(self, conn: Any, dialect: Dialect):
        self.conn, self.dialect = conn, dialect

    def count_messages(self, table: str) -> int | None:
        return self.dialect.count_messages(self.conn, table, COUNT_LIMIT)

    def deployed_facts(self, unit: Unit) -> dict[str, str]:
        return self.dialect.deployed_facts(self.conn, unit)

    def type_dependents(self, unit: Unit) -> list[str]:
        return self.dialect.type_dependents(self.conn, unit.name)


def plan_against(conn: Any, dialect: Dialect, schema: str, units: list[Unit], lock_policy: LockPolicy | None = None,
                 migrations: MigrationSource | None = None) -> Plan:
    """The plan for a database: its deploy history and, where the planner asks, its objects."""
    history = dialect.read_history(conn, schema) if dialect.history_exists(conn, schema) else []
    return make_plan(units, history, _DatabaseProbe(conn, dialect), migrations or MigrationSource(dialect.name),
                     concurrent_indexes=dialect.name == "postgres", lock_policy=lock_policy)


class _Runner:
    """Runs steps: each transactional step with the lock policy's timeout, retried with backoff."""

    def __init__(self, conn: Any, dialect: Dialect, schema: str, policy: LockPolicy,
                 progress: Callable[[str], None]):
        self.conn, self.dialect, self.schema, self.policy, self.progress = conn, dialect, schema, policy, progress

    def transaction(self, label: str, parts: list[Part], records: list[Record]) -> None:
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                self.dialect.run_transaction(self.conn, self.schema, parts, records, self.policy.timeout_seconds)
                return
            except LockTimeout as exc:
                waited = time.monotonic() - started
                pause = min(0.5 * 2 ** (attempt - 1), 10.0)
                if waited + pause > self.policy.retry_for_seconds:
                    raise EngineError(
                        f"{label}: a lock was not granted within {self.policy.timeout_seconds:g} s in {attempt} "
                        f"attempts over {waited:.0f} s ({exc}); a long transaction holds it: find it "
                        f"({self.dialect.blocker_hint}), then deploy again: what was applied stays applied") from exc
                self.progress(f"  waiting: {label}: lock not granted within {self.policy.timeout_seconds:g} s "
                              f"(attempt {attempt}, {waited:.0f} s of {self.policy.retry_for_seconds:g} s); "
                              f"retrying in {pause:g} s")
                time.sleep(pause)

    def concurrent(self, label: str, sql: str) -> None:
        try:
            self.dialect.run_concurrent(self.conn, sql, self.policy.retry_for_seconds)
        except LockTimeout as exc:
            raise EngineError(f"{label}: the concurrent index build waited {self.policy.retry_for_seconds:g} s for "
                              f"older transactions ({exc}); the next deploy drops the invalid index it left and "
                              "builds it again") from exc

    def record(self, records: list[Record]) -> None:
        self.transaction("record in the deploy history", [], records)


@dataclass
class _Deferred:
    """An item's migrations whose after-code steps (and so whose history rows) wait for the code units."""
    item: PlanItem
    label: str
    records: dict[int, Record]   # migration index -> its history row (its duration counts from its first step)


def _apply(runner: _Runner, dialect: Dialect, conn: Any, item: PlanItem, label: str,
           progress: Callable[[str], None]) -> _Deferred | None:
    unit = item.unit
    started = time.monotonic()
    if item.action == RECORD:
        runner.record([Record(unit, item.recorded, None, item.previous_checksum or unit.checksum, started)])
        return
    if item.action in (CREATE, UPDATE):
        record = Record(unit, unit.storage, None, unit.checksum, started)
        if item.concurrent:
            runner.concurrent(label, dialect.concurrent_index_sql(unit))
            runner.record([record])
        else:
            runner.transaction(label, [Part(unit.body, routine=unit.name if unit.type == "code" else None)],
                               [record])
        return
    if item.recreates or not item.migrations:   # a type, with the routines that use it
        parts = dialect.type_recreate_parts(conn, unit, list(item.recreates))
        records = [Record(unit, unit.storage, "recreate_type", unit.checksum, started)]
        records += [Record(code, None, None, code.checksum, started) for code in item.recreates]
        runner.transaction(label, parts, records)
        return
    return _before_code(runner, item, label, progress)


def _run_step(runner: _Runner, label: str, migration: Migration, index: int, records: list[Record],
              progress: Callable[[str], None]) -> None:
    """One step; records go in its transaction (or right after it, when the step is concurrent)."""
    step = migration.steps[index]
    number = f"{index + 1}/{len(migration.steps)}"
    started = time.monotonic()
    if step.mode == "concurrent":
        runner.concurrent(f"{label}: {migration.name} {number} {step.what}", step.sql)
        if records:
            runner.record(records)
    else:
        runner.transaction(f"{label}: {migration.name} {number} {step.what}", [Part(step.sql)], records)
    progress(f"      {migration.name} {number} {step.what} ({(time.monotonic() - started) * 1000:.0f} ms)")


def _before_code(runner: _Runner, item: PlanItem, label: str, progress: Callable[[str], None]) -> _Deferred | None:
    """Every migration's steps that run before the code units, in order. A migration is recorded with
    its last step; once one waits for the code units, those after it are recorded after it."""
    deferred: dict[int, Record] = {}
    for index, migration in enumerate(item.migrations):
        record = Record(item.unit, migration.after, migration.name, migration.checksum, time.monotonic())
        before = [i for i, step in enumerate(migration.steps) if not step.after_code]
        waits = deferred or len(before) < len(migration.steps)
        for position, step_index in enumerate(before):
            last = position == len(before) - 1 and not waits
            _run_step(runner, label, migration, step_index, [record] if last else [], progress)
        if waits:
            deferred[index] = record
    return _Deferred(item, label, deferred) if deferred else None


def _after_code(runner: _Runner, rest: _Deferred, progress: Callable[[str], None]) -> None:
    for index, record in rest.records.items():
        migration = rest.item.migrations[index]
        after = [i for i, step in enumerate(migration.steps) if step.after_code]
        for position, step_index in enumerate(after):
            _run_step(runner, rest.label, migration, step_index, [record] if position == len(after) - 1 else [],
                      progress)
        if not after:
            runner.record([record])


def deploy(conn: Any, dialect: Dialect, schema: str, units: list[Unit], dry_run: bool = False,
           lock_timeout_seconds: int = 300, progress: Callable[[str], None] = lambda line: None,
           lock_policy: LockPolicy | None = None, migrations: MigrationSource | None = None,
           share_roles: bool = False) -> DeployResult:
    """Plan and apply under the schema's deploy lock; each step in its own transaction.
    lock_timeout_seconds: how long to wait for another deploy; lock_policy: how each step takes
    its locks; migrations: where migration templates come from (tests add a template root);
    share_roles: let the schema's roles serve another database of the cluster too (PostgreSQL)."""
    policy = lock_policy or LockPolicy()
    dialect.lock(conn, schema, lock_timeout_seconds)
    try:
        claimed = dialect.roles_serving_elsewhere(conn, schema)
        if claimed and not share_roles:
            raise DeployRefused("\n".join(
                f"role {role} already serves {claim}: roles belong to the whole cluster, and its members would "
                f"reach this database's queues too. Deploy under another schema name, or share the roles on "
                f"purpose with --share-roles." for role, claim in claimed))
        dialect.share_roles(conn, share_roles)
        # Read the history only once the lock is ours, so a deploy that waited sees what the
        # previous one applied and does not apply it again.
        plan = plan_against(conn, dialect, schema, units, policy, migrations)
        result = DeployResult(plan)
        if plan.refused:   # (a queue's table and its type refuse a kind change with the same words)
            raise DeployRefused("\n".join(dict.fromkeys(item.reason for item in plan.refused)))
        if dry_run:
            return result
        runner = _Runner(conn, dialect, schema, policy, progress)
        changes = plan.changes
        deferred: list[_Deferred] = []
        for position, item in enumerate(changes, start=1):
            label = f"{item.action} {item.unit.type} {item.unit.name}"
            started = time.monotonic()
            rest = _apply(runner, dialect, conn, item, label, progress)
            seconds = time.monotonic() - started
            if rest is not None:
                deferred.append(rest)
            result.applied.append((item.unit.name, seconds))
            progress(f"[{position}/{len(changes)}] {label} ({seconds * 1000:.0f} ms)"
                     + (": the rest after the code units" if rest is not None else ""))
        for rest in deferred:
            started = time.monotonic()
            _after_code(runner, rest, progress)
            progress(f"[after the code units] {rest.label} ({(time.monotonic() - started) * 1000:.0f} ms)")
        return result
    finally:
        dialect.unlock(conn, schema)


@dataclass(frozen=True)
class StatusRow:
    unit_name: str
    unit_type: str
    state: str          # ok | drift | missing | not tracked | pending | not in catalog
    applied_at: Any = None
    applied_by: str | None = None
    tool_version: str | None = None


def _catalog_differs(unit: Unit, row: dict) -> bool:
    if unit.storage is None:
        return unit.checksum != row["unit_checksum"]
    recorded = recorded_storage(row)
    return recorded is not None and not recorded.matches(unit.storage)


def status(conn: Any, dialect: Dialect, schema: str, units: list[Unit] | None = None) -> list[StatusRow]:
    """What is deployed, and whether each object still matches what the tool applied."""
    if not dialect.history_exists(conn, schema):
        return []
    latest = latest_rows(dialect.read_history(conn, schema))
    wanted = {unit.name: unit for unit in units} if units is not None else None
    rows = []
    for name, row in latest.items():
        current = dialect.object_checksum(conn, name)
        if row["object_checksum"] is None:
            state = "ok" if current is None else "drift"
            if current is None and row["unit_type"] == "code":
                state = "ok (no single object to check)"
        elif current is None:
            state = "missing"
        elif current != row["object_checksum"]:
            state = "drift"
        else:
            state = "ok"
        if row["unit_type"] == "storage" and recorded_storage(row) is None:
            state += ", storage version not recorded (tablequeue 0.1.0: the next deploy records it)"
        if wanted is not None:
            if name not in wanted:
                state += ", not in catalog"
            elif _catalog_differs(wanted[name], row):
                state += ", catalog differs (deploy pending)"
        rows.append(StatusRow(name, row["unit_type"], state, row["applied_at"], row["applied_by"],
                              row["tool_version"]))
    if wanted is not None:
        for name, unit in wanted.items():
            if name not in latest:
                rows.append(StatusRow(name, unit.type, "not deployed"))
    return rows
