"""One reviewable script a DBA can run by hand (sqlcmd for SQL Server, psql for PostgreSQL).

It runs a deploy plan (deploy.make_plan) the way `tablequeue deploy` does: under the same deploy
lock, in the same order, each unit and each migration step in its own transaction with the same
lock timeout, each recorded in the deploy history, so `tablequeue status` and later deploys see
what the script did. The plan is printed at its top.

Without a database (`tablequeue script` without --url) the plan is a fresh install: every unit is
created, and running the script again changes nothing. A storage unit the history already records
at another version or shape stops it with error deploy_refused. Planned against a database (--url),
it also holds the migrations that database needs; each checks first that the history still records
the state it starts from, so a script that stopped halfway (a lock timeout: scripts do not retry)
is generated again rather than run again.
"""
from __future__ import annotations

from dataclasses import dataclass

from .distribution import version
from .deploy import CREATE, MIGRATE, RECORD, UPDATE, LockPolicy, Plan, PlanItem
from .engines import (HISTORY_TABLE, INSERT_COLUMNS, MSSQL_OBJECT_CHECKSUM, Part, created_concurrent_index,
                      postgres_object_checksum_sql)
from .errors import QUEUE_ERRORS
from .render import Migration, Step, Storage, Unit

OLD_HISTORY = ("the deploy history in this schema was created by tablequeue 0.1.0, which recorded no storage "
               "versions: generate the script against the database (tablequeue script --url ...), which "
               "migrates it, or deploy with tablequeue deploy. Nothing was applied.")
REGENERATE = "generate the script again against the database (tablequeue script --url ...). Nothing more was applied."


def literal(text: str | None, national: bool = False) -> str:
    if text is None:
        return "NULL"
    return ("N" if national else "") + "'" + text.replace("'", "''") + "'"


def _number(value: int | None) -> str:
    return "NULL" if value is None else str(value)


@dataclass(frozen=True)
class _Row:
    """A deploy-history row the script writes."""
    unit: Unit
    storage: Storage | None
    migration: str | None
    checksum: str


class _Writer:
    """What differs between sqlcmd and psql: statements, guards, transactions, the lock."""
    national = False
    refused = ""

    def __init__(self, schema: str, policy: LockPolicy):
        self.schema, self.policy = schema, policy

    # Conditions on `last_applied`, the unit's latest history row.
    def same_storage(self, storage: Storage) -> str:
        return (f"last_applied.storage_version = {storage.version} AND "
                f"COALESCE(last_applied.storage_shape, '') = {literal(storage.shape_text)}")

    def recorded_as(self, storage: Storage) -> str:
        """The history records the unit at `storage`, or (0.1.0, no version) at version 1 as it was."""
        legacy = "last_applied.storage_version IS NULL" if storage.version == 1 else "1 = 0"
        return f"(({self.same_storage(storage)}) OR {legacy})"

    def same_code(self, unit: Unit) -> str:
        return f"last_applied.unit_checksum = {literal(unit.checksum)}"

    def values(self, row: _Row, object_checksum_sql: str) -> str:
        storage = row.storage
        return ", ".join([literal(row.unit.name, self.national), literal(row.unit.type),
                          literal(row.unit.queue, self.national), literal(version()), literal(row.checksum),
                          object_checksum_sql, "0", _number(storage.version if storage else None),
                          literal(storage.shape_text or None if storage else None), literal(row.migration)])

    def same_row(self, row: _Row) -> str:
        if row.storage is None:
            return self.same_code(row.unit)
        condition = self.same_storage(row.storage)
        return condition if row.migration is None else f"{condition} AND last_applied.migration = {literal(row.migration)}"


class _Mssql(_Writer):
    national = True
    refused = str(QUEUE_ERRORS["deploy_refused"].mssql)

    def history(self) -> str:
        return f"[{self.schema}].[{HISTORY_TABLE}]"

    def latest(self, unit: Unit) -> str:
        return (f"(SELECT TOP (1) h.unit_checksum, h.storage_version, h.storage_shape, h.migration FROM {self.history()} "
                f"AS h WHERE h.unit_name = {literal(unit.name, True)} ORDER BY h.history_id DESC) AS last_applied")

    def throw(self, message: str) -> str:
        return f"    THROW {self.refused}, {literal(message, True)}, 1;"

    def start(self, plan: Plan, source: str, fresh: bool) -> list[str]:
        resource = literal(f"tablequeue:deploy:{self.schema}", True)
        out = [f"-- tablequeue {version()} deploy script for schema {self.schema} ({source})",
               "-- Run with sqlcmd, or SSMS in SQLCMD mode: it stops at the first error.",
               ":on error exit",
               *_plan_comment(plan),
               "SET ANSI_NULLS ON;", "SET QUOTED_IDENTIFIER ON;", "SET XACT_ABORT ON;", "SET NOCOUNT ON;",
               "-- A step waits this long for a lock, then stops the script (error 1222) and gives way to the",
               "-- queues' traffic: generate the script again and run it.",
               f"SET LOCK_TIMEOUT {int(self.policy.timeout_seconds * 1000)};", "GO",
               "-- The deploy lock `tablequeue deploy` takes: this session holds it to the end.",
               "DECLARE @deploy_lock int;",
               f"EXEC @deploy_lock = sys.sp_getapplock @Resource = {resource}, @LockMode = 'Exclusive',",
               "    @LockOwner = 'Session', @LockTimeout = 300000;",
               "IF @deploy_lock < 0",
               self.throw(f"another deploy to schema {self.schema} holds the deploy lock. Nothing was applied."),
               "GO"]
        if fresh:
            history = self.history()
            out += [f"IF OBJECT_ID(N'{history}', N'U') IS NOT NULL AND COL_LENGTH(N'{history}', N'storage_version') IS NULL",
                    self.throw(OLD_HISTORY), "GO"]
        return out

    def end(self) -> list[str]:
        resource = literal(f"tablequeue:deploy:{self.schema}", True)
        return ["", f"EXEC sys.sp_releaseapplock @Resource = {resource}, @LockOwner = 'Session';", "GO"]

    def guard(self, unit: Unit, condition: str, message: str) -> list[str]:
        return [f"IF EXISTS (SELECT 1 / 0 FROM {self.latest(unit)} WHERE NOT ({condition}))", self.throw(message), "GO"]

    def guard_missing(self, unit: Unit, condition: str, message: str) -> list[str]:
        return [f"IF NOT EXISTS (SELECT 1 / 0 FROM {self.latest(unit)} WHERE {condition})", self.throw(message), "GO"]

    def transaction(self, sql: list[str], rows: list[_Row]) -> list[str]:
        # XACT_ABORT again in the batch that opens the transaction, whatever a unit before set: a
        # run-time error (or a deferred name) then rolls the unit back. A compile error (syntax, a
        # missing column of a table that exists) is not covered by XACT_ABORT, and SSMS in SQLCMD mode
        # keeps the connection after `:on error exit`: there, disconnect (or ROLLBACK) after an error,
        # or the open transaction keeps its locks on the queue's table.
        out = ["SET XACT_ABORT ON;", "BEGIN TRANSACTION;", "GO"]
        for text in sql:
            out.append(text.rstrip())
            if not text.rstrip().endswith("GO"):
                out.append("GO")
        for row in rows:
            schema, name = row.unit.name.split(".", 1)
            out += [f"DECLARE @unit_schema sysname = {literal(schema, True)};",
                    f"DECLARE @unit_name sysname = {literal(name, True)};",
                    f"DECLARE @object_checksum varchar(64) = ({MSSQL_OBJECT_CHECKSUM});",
                    f"IF NOT EXISTS (SELECT 1 / 0 FROM {self.latest(row.unit)} WHERE {self.same_row(row)})",
                    f"    INSERT INTO {self.history()}",
                    f"        ({', '.join(INSERT_COLUMNS)})",
                    f"    VALUES ({self.values(row, '@object_checksum')});", "GO"]
        return out + ["COMMIT TRANSACTION;", "GO"]

    def concurrent(self, sql: str, rows: list[_Row], index: tuple[str, str] | None = None) -> list[str]:
        raise ValueError("SQL Server steps are never concurrent: its templates build indexes ONLINE in a transaction")


class _Postgres(_Writer):
    refused = QUEUE_ERRORS["deploy_refused"].postgres

    def history(self) -> str:
        return f'"{self.schema}"."{HISTORY_TABLE}"'

    def latest(self, unit: Unit) -> str:
        return (f"(SELECT h.unit_checksum, h.storage_version, h.storage_shape, h.migration FROM {self.history()} AS h "
                f"WHERE h.unit_name = {literal(unit.name)} ORDER BY h.history_id DESC LIMIT 1) AS last_applied")

    def raise_(self, condition: str, message: str) -> list[str]:
        return ["DO $guard$", "BEGIN", f"    IF {condition} THEN",
                f"        RAISE EXCEPTION USING ERRCODE = '{self.refused}', MESSAGE = {literal(message)};",
                "    END IF;", "END", "$guard$;"]

    def start(self, plan: Plan, source: str, fresh: bool) -> list[str]:
        key = literal(f"tablequeue:deploy:{self.schema}")
        out = [f"-- tablequeue {version()} deploy script for schema {self.schema} ({source})",
               "-- Run with psql: it stops at the first error.", "\\set ON_ERROR_STOP on",
               *_plan_comment(plan),
               "-- The deploy lock `tablequeue deploy` takes: this session holds it to the end.",
               "SET lock_timeout = '300s';",
               f"SELECT pg_advisory_lock(hashtextextended({key}, 0));",
               "-- A step waits this long for a lock, then stops the script and gives way to the queues'",
               "-- traffic: generate the script again and run it.",
               f"SET lock_timeout = '{int(self.policy.timeout_seconds * 1000)}ms';"]
        if fresh:
            history = literal(self.history())
            out += self.raise_(f"to_regclass({history}) IS NOT NULL AND NOT EXISTS (SELECT FROM pg_catalog.pg_attribute "
                               f"AS a WHERE a.attrelid = to_regclass({history}) AND a.attname = 'storage_version')",
                               OLD_HISTORY)
        return out

    def end(self) -> list[str]:
        return ["", f"SELECT pg_advisory_unlock(hashtextextended({literal(f'tablequeue:deploy:{self.schema}')}, 0));"]

    def guard(self, unit: Unit, condition: str, message: str) -> list[str]:
        return self.raise_(f"EXISTS (SELECT FROM {self.latest(unit)} WHERE NOT ({condition}))", message)

    def guard_missing(self, unit: Unit, condition: str, message: str) -> list[str]:
        return self.raise_(f"NOT EXISTS (SELECT FROM {self.latest(unit)} WHERE {condition})", message)

    def _inserts(self, rows: list[_Row]) -> list[str]:
        out = []
        for row in rows:
            schema, name = row.unit.name.split(".", 1)
            checksum = postgres_object_checksum_sql(literal(schema), literal(name))
            out += [f"INSERT INTO {self.history()}", f"    ({', '.join(INSERT_COLUMNS)})",
                    f"SELECT {self.values(row, f'({checksum})')}",
                    f"WHERE NOT EXISTS (SELECT FROM {self.latest(row.unit)} WHERE {self.same_row(row)});"]
        return out

    def transaction(self, sql: list[str], rows: list[_Row]) -> list[str]:
        return ["BEGIN;", *(text.rstrip() for text in sql), *self._inserts(rows), "COMMIT;"]

    def concurrent(self, sql: str, rows: list[_Row], index: tuple[str, str] | None = None) -> list[str]:
        out = [f"SET lock_timeout = '{int(self.policy.retry_for_seconds * 1000)}ms';"]
        if index is not None:   # an INVALID index a failed build left behind is built again
            out += [f"SELECT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS c ON "
                    f"c.oid = i.indexrelid JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace WHERE "
                    f"n.nspname = {literal(index[0])} AND c.relname = {literal(index[1])} AND NOT i.indisvalid) "
                    "AS tablequeue_invalid_index \\gset",
                    "\\if :tablequeue_invalid_index",
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{index[0]}"."{index[1]}";', "\\endif"]
        out += [sql.rstrip(), f"SET lock_timeout = '{int(self.policy.timeout_seconds * 1000)}ms';"]
        return out + (self.transaction([], rows) if rows else [])


def _plan_comment(plan: Plan) -> list[str]:
    return ["--", "-- The plan:", *("--   " + line for line in plan.describe().splitlines()), "--"]


class _Script:
    def __init__(self, writer: _Writer, concurrent_sql, replaced: dict[str, list[str]]):
        self.writer, self.concurrent_sql, self.replaced = writer, concurrent_sql, replaced
        self.out: list[str] = []

    def step(self, step: Step, rows: list[_Row]) -> None:
        if step.mode == "concurrent":
            self.out += self.writer.concurrent(step.sql, rows, created_concurrent_index(step.sql))
        else:
            self.out += self.writer.transaction([step.sql], rows)

    def unit(self, item: PlanItem) -> None:
        unit, writer = item.unit, self.writer
        row = _Row(unit, unit.storage, None, unit.checksum)
        self.out += ["", f"-- {item.action} {unit.type} {unit.name}" + (f" ({item.reason})" if item.reason else "")]
        if unit.storage is not None and unit.queue is not None:
            self.out += writer.guard(unit, writer.same_storage(unit.storage),
                                     f"{unit.name}: the deploy history records this storage unit at another version "
                                     f"or shape than {unit.storage.describe()}, which this script creates; {REGENERATE}")
        if item.concurrent:
            self.out += writer.concurrent(self.concurrent_sql(unit), [row], created_concurrent_index(self.concurrent_sql(unit)))
        else:
            # PostgreSQL: CREATE OR REPLACE cannot change a signature (it would add an overload), and a
            # script cannot know whether it changes: the routines it replaces go first, in its transaction.
            drops = [f"DROP ROUTINE IF EXISTS {signature};" for signature in self.replaced.get(unit.name, [])]
            self.out += writer.transaction(drops + [unit.body], [row])

    def record(self, item: PlanItem) -> None:
        self.out += ["", f"-- record storage {item.unit.name} ({item.reason})"]
        self.out += self.writer.transaction([], [_Row(item.unit, item.recorded, None, item.previous_checksum)])

    def recreate_type(self, item: PlanItem, parts: list[Part]) -> None:
        rows = [_Row(item.unit, item.unit.storage, "recreate_type", item.unit.checksum)]
        rows += [_Row(code, None, None, code.checksum) for code in item.recreates]
        self.out += ["", f"-- migrate storage {item.unit.name}: a type, dropped and created again with "
                         f"{', '.join(code.name for code in item.recreates) or 'no routine'}"]
        self.out += self.writer.transaction([part.sql for part in parts], rows)

    def starts_from(self, item: PlanItem) -> None:
        """Stop unless the history still records the unit where the plan starts (the framework's own
        first migration makes the columns this reads: it runs as it is, and runs again harmlessly)."""
        if item.unit.queue is None:
            return
        writer = self.writer
        self.out += writer.guard_missing(item.unit, writer.recorded_as(item.recorded),
                                         f"{item.unit.name}: the deploy history no longer records it at "
                                         f"{item.recorded.describe()}, where this script's migrations start; "
                                         f"{REGENERATE}")

    def migration(self, item: PlanItem, migration: Migration, after_code: bool, record: bool = True) -> None:
        """The migration's steps before (or after) the code units; the last of them records it, when
        `record`. A migration whose recording waits for the code units with no step left then is
        recorded on its own."""
        unit = item.unit
        steps = [s for s in migration.steps if s.after_code == after_code]
        when = " (after the code units)" if after_code else ""
        self.out += ["", f"-- migrate storage {unit.name}: {migration.name}{when} "
                         f"{migration.before.describe()} -> {migration.after.describe()}"]
        row = _Row(unit, migration.after, migration.name, migration.checksum)
        for position, step in enumerate(steps):
            self.step(step, [row] if record and position == len(steps) - 1 else [])
        if record and not steps:
            self.out += self.writer.transaction([], [row])


def build_script(dialect: str, schema: str, plan: Plan, source: str, fresh: bool,
                 type_parts: dict[str, list[Part]] | None = None, concurrent_sql=None,
                 replaced: dict[str, list[str]] | None = None) -> str:
    """The script of a plan. fresh: planned without a database (a fresh install); type_parts: for each
    type the plan recreates, the statements that drop and create it and its routines; replaced
    (PostgreSQL): for each code unit the plan updates, the signatures of the routines it replaces."""
    writer = _Mssql(schema, plan.lock_policy) if dialect == "mssql" else _Postgres(schema, plan.lock_policy)
    script = _Script(writer, concurrent_sql, replaced or {})
    script.out += writer.start(plan, source, fresh)
    deferred: list[tuple[PlanItem, Migration]] = []
    for item in plan.changes:
        if item.action in (CREATE, UPDATE):
            script.unit(item)
        elif item.action == RECORD:
            script.record(item)
        elif item.action == MIGRATE and (item.recreates or not item.migrations):
            script.recreate_type(item, (type_parts or {})[item.unit.name])
        elif item.action == MIGRATE:
            # As deploy records them: a migration is recorded with its last step; once one waits for
            # the code units, those after it are recorded after it (so the history's last row is the
            # last migration's, never an earlier one's after-code step).
            script.starts_from(item)
            waits = False
            for migration in item.migrations:
                waits = waits or any(step.after_code for step in migration.steps)
                if any(not step.after_code for step in migration.steps):
                    script.migration(item, migration, after_code=False, record=not waits)
                if waits:
                    deferred.append((item, migration))
    for item, migration in deferred:
        script.migration(item, migration, after_code=True)
    script.out += writer.end()
    return "\n".join(script.out) + "\n"
