"""Connections and the few dialect-specific statements the deploy tool itself needs.

Everything else the tool runs is rendered SQL; this module only connects, locks, runs a step
(rendered SQL in a transaction with a lock timeout, or a concurrent index build) and reads back
what is deployed.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus, urlencode, urlsplit, urlunsplit

from .distribution import version
from .gosplit import mask_comments_and_strings, split_batches
from .render import Storage, Unit


class EngineError(RuntimeError):
    pass


class LockTimeout(EngineError):
    """A statement did not get its lock within the step's lock timeout; the step was rolled back."""


@dataclass(frozen=True)
class Part:
    """SQL a step runs. routine: a code unit's routine, whose stale overloads PostgreSQL drops
    when the unit changes its signature."""
    sql: str
    routine: str | None = None


@dataclass(frozen=True)
class Record:
    """One deploy-history row, written in the transaction of the step that completes it."""
    unit: Unit
    storage: Storage | None       # the storage unit's version and shape from this row on
    migration: str | None         # the migration that made it so (None: created or replaced)
    checksum: str                 # of what was applied
    started: float                # time.monotonic() when its work began: the recorded duration


@dataclass(frozen=True)
class Target:
    dialect: str   # mssql | postgres
    url: str       # as given, for messages (password masked by describe())

    def describe(self) -> str:
        """The URL for a message or a log line: every password (user info, a query parameter, a field
        of odbc_connect) as ***."""
        scheme, slashes, after = self.url.partition("://")
        netloc_end = min((i for i in (after.find(c) for c in "/?#") if i >= 0), default=len(after))
        userinfo, at, host = after[:netloc_end].rpartition("@")   # a password may hold '@'
        if at and ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        base, question, rest = (scheme + slashes + userinfo + at + host + after[netloc_end:]).partition("?")
        query, hash_, fragment = rest.partition("#")
        pieces = []
        for piece in query.split("&") if query else []:
            key, sep, value = piece.partition("=")
            name = unquote_plus(key).lower()
            if name in SECRET_PARAMETERS:
                value = "***"
            elif name == "odbc_connect":
                try:
                    fields = _odbc_fields(unquote_plus(value))
                except EngineError:   # unreadable: shown as nothing rather than perhaps a password
                    fields = [("odbc_connect", "(not readable)")]
                value = quote_plus(";".join(f"{k}={'***' if k.strip().lower() in SECRET_PARAMETERS else v}"
                                            for k, v in fields), safe="{}=;,*()")
            pieces.append(key + sep + value)
        return base + question + "&".join(pieces) + hash_ + fragment


# Connection parameters that hold a secret: in a URL's query string (libpq takes password and
# sslpassword there) or in the ODBC string of mssql+pyodbc's odbc_connect (PWD; Password for some
# drivers). Compared case-insensitively, as libpq's are not but ODBC's are: refusing more is safe.
SECRET_PARAMETERS = frozenset({"password", "pwd", "sslpassword"})


def url_secrets(url: str) -> list[str]:
    """Where `url` holds a password: '' for its user info, 'query parameter <name>', '<name> in
    odbc_connect'; empty when it holds none."""
    parts = urlsplit(url)
    found = [""] if parts.password is not None else []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() in SECRET_PARAMETERS:
            found.append(f"query parameter {key}")
        elif key.lower() == "odbc_connect":
            found += [f"{field} in odbc_connect" for field, _ in _odbc_fields(value)
                      if field.strip().lower() in SECRET_PARAMETERS]
    return found


def parse_url(url: str) -> Target:
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return Target("postgres", url)
    if scheme in ("mssql+pyodbc", "mssql"):
        return Target("mssql", url)
    raise EngineError(f"unsupported database URL scheme {scheme!r}: use postgresql://... or mssql+pyodbc://...")


def mssql_connection_string(url: str) -> str:
    """mssql+pyodbc://user:password@host:port/database?driver=...&Encrypt=yes -> ODBC string.

    ?odbc_connect=<url-encoded ODBC string> passes a complete ODBC connection string through.
    """
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "odbc_connect" in query:
        return query["odbc_connect"]
    import pyodbc

    driver = query.pop("driver", None)
    if driver is None:
        installed = pyodbc.drivers()
        preferred = [d for d in installed if d.startswith("ODBC Driver") and "SQL Server" in d]
        driver = sorted(preferred)[-1] if preferred else ("FreeTDS" if "FreeTDS" in installed else None)
        if driver is None:
            raise EngineError("no SQL Server ODBC driver installed (msodbcsql18 or tdsodbc); "
                              f"installed drivers: {installed or 'none'}")
    server = parts.hostname or "localhost"
    if parts.port:
        server = f"{server},{parts.port}"
    fields = {"DRIVER": "{" + driver + "}", "SERVER": server}
    if parts.path.strip("/"):
        fields["DATABASE"] = unquote(parts.path.strip("/"))
    if parts.username:
        fields["UID"] = unquote(parts.username)
        fields["PWD"] = "{" + unquote(parts.password or "").replace("}", "}}") + "}"
    else:
        fields["Trusted_Connection"] = "yes"
    if driver == "FreeTDS":
        fields.setdefault("TDS_Version", "7.4")
    fields.update(query)
    return ";".join(f"{k}={v}" for k, v in fields.items())


def _odbc_fields(text: str) -> list[tuple[str, str]]:
    """key=value pairs of an ODBC connection string, values as written ({braced} ones may hold ';')."""
    fields: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        equals = text.find("=", position)
        if equals < 0:
            if text[position:].strip(" ;"):
                raise EngineError(f"cannot read the ODBC connection string near {text[position:]!r}")
            break
        key = text[position:equals].strip(" ;")
        end = equals + 1
        if text[end:end + 1] == "{":
            end += 1
            while True:
                close = text.find("}", end)
                if close < 0:
                    raise EngineError(f"unterminated {{ in the ODBC connection string, field {key!r}")
                if text[close + 1:close + 2] == "}":  # '}}' is an escaped brace inside the value
                    end = close + 2
                    continue
                end = close + 1
                break
        semicolon = text.find(";", end)
        end = len(text) if semicolon < 0 else semicolon
        fields.append((key, text[equals + 1:end]))
        position = end + 1
    return fields


def with_database(url: str, database: str) -> str:
    """The same URL, connecting to another database of the same server.

    For ?odbc_connect= the DATABASE field of the ODBC string is replaced (or added)."""
    parts = urlsplit(url)
    if parse_url(url).dialect == "mssql":
        query = parse_qsl(parts.query, keep_blank_values=True)
        if any(key == "odbc_connect" for key, _ in query):
            query = [(key, _odbc_with_database(value, database) if key == "odbc_connect" else value)
                     for key, value in query]
            return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
    return urlunsplit(parts._replace(path="/" + quote(database, safe="")))


def _odbc_with_database(odbc: str, database: str) -> str:
    kept = [(key, value) for key, value in _odbc_fields(odbc) if key.casefold() != "database"]
    return ";".join(f"{key}={value}" for key, value in kept + [("DATABASE", "{" + database.replace("}", "}}") + "}")])


def connect(url: str, autocommit: bool = True, connect_timeout: int | None = None) -> Any:
    """connect_timeout: seconds a login may take (None: the driver's default), for callers that must
    answer in time (a metrics scrape) or notice a server that is down (a worker reconnecting)."""
    target = parse_url(url)
    if target.dialect == "postgres":
        import psycopg

        return psycopg.connect(url, autocommit=autocommit,
                               **({"connect_timeout": connect_timeout} if connect_timeout else {}))
    import pyodbc

    conn = pyodbc.connect(mssql_connection_string(url), autocommit=autocommit,
                          **({"timeout": connect_timeout} if connect_timeout else {}))
    cursor = conn.cursor()
    # Filtered indexes need both when the procedures that write the table are created.
    cursor.execute("SET ANSI_NULLS ON; SET QUOTED_IDENTIFIER ON; SET XACT_ABORT ON;")
    cursor.close()
    return conn


class Dialect(Protocol):
    name: str

    def lock(self, conn: Any, schema: str, timeout_seconds: int) -> None: ...
    def unlock(self, conn: Any, schema: str) -> None: ...
    def history_exists(self, conn: Any, schema: str) -> bool: ...
    def read_history(self, conn: Any, schema: str) -> list[dict]:
        """Every row in history_id order, with every key of HISTORY_COLUMNS + STORAGE_HISTORY_COLUMNS
        (None where a 0.1.0 history table has no such column yet)."""
        ...
    def object_checksum(self, conn: Any, unit_name: str) -> str | None: ...
    def count_messages(self, conn: Any, table: str, limit: int) -> int | None:
        """Up to `limit` rows of the table; None when there is no table of that name."""
        ...
    blocker_hint: str
    def run_transaction(self, conn: Any, schema: str, parts: list[Part], records: list[Record],
                        lock_timeout: float) -> None:
        """One attempt: the parts and the history rows in one transaction, every lock waited for at
        most lock_timeout seconds; raises LockTimeout (rolled back) when one was not granted."""
        ...
    def run_concurrent(self, conn: Any, sql: str, lock_timeout: float) -> None:
        """A CREATE/DROP INDEX CONCURRENTLY outside any transaction (PostgreSQL)."""
        ...
    def concurrent_index_sql(self, unit: Unit) -> str: ...
    def deployed_facts(self, conn: Any, unit: Unit) -> dict[str, str]:
        """What the deployed objects of a 0.1.0 storage unit show of its shape (kind, payload,
        options); 'a|b' where they cannot tell a from b."""
        ...
    def type_dependents(self, conn: Any, type_name: str) -> list[str]:
        """schema.name of every routine that uses the type."""
        ...
    def routines(self, conn: Any, unit_name: str) -> list[str]:
        """The signatures a replaced code unit's routines have (to drop first where needed)."""
        ...
    def type_recreate_parts(self, conn: Any, type_unit: Unit, dependents: list[Unit]) -> list[Part]:
        """Drop the dependents and the type, create the type, create the dependents."""
        ...
    def drop_schema(self, conn: Any, schema: str) -> None:
        """Drop a deployed schema with everything in it, and its roles (for tests and scratch copies)."""
        ...
    def roles_serving_elsewhere(self, conn: Any, schema: str) -> list[tuple[str, str]]:
        """(role, what it serves) for each of the schema's roles that another database claimed."""
        ...
    def share_roles(self, conn: Any, share: bool) -> None:
        """Tell the framework's role unit whether this session may share roles with another database."""
        ...


HISTORY_TABLE = "tablequeue_deploy_history"
# The roles every schema gets (PostgreSQL also creates <schema>_owner, which owns the queues).
SCHEMA_ROLES = ("producer", "consumer", "admin", "owner")
# The fingerprint `status` compares for drift: the module text of a procedure, or the column list of a
# table (on PostgreSQL also of a sequence, and the definition of an index that is a unit of its own).
# Used by the deploy tool and by the hand-run script, so both record the same value.
MSSQL_OBJECT_CHECKSUM = """SELECT COALESCE(
    (SELECT CONVERT(varchar(64), HASHBYTES('SHA2_256', m.definition), 2)
     FROM sys.sql_modules AS m
     WHERE m.object_id = OBJECT_ID(QUOTENAME(@unit_schema) + N'.' + QUOTENAME(@unit_name))),
    (SELECT CONVERT(varchar(64), HASHBYTES('SHA2_256', STRING_AGG(CONVERT(nvarchar(max), CONCAT(
         c.name, N' ', TYPE_NAME(c.user_type_id), N' ', c.max_length, N' ', c.is_nullable)), N', ')
         WITHIN GROUP (ORDER BY c.column_id)), 2)
     FROM sys.columns AS c
     WHERE c.object_id = OBJECT_ID(QUOTENAME(@unit_schema) + N'.' + QUOTENAME(@unit_name), N'U')))"""
MSSQL_DROP_SCHEMA = """
DECLARE @sql nvarchar(max) = N'';
SELECT @sql += N'DROP PROCEDURE ' + QUOTENAME(SCHEMA_NAME(schema_id)) + N'.' + QUOTENAME(name) + N';'
FROM sys.procedures WHERE SCHEMA_NAME(schema_id) = ?;
SELECT @sql += N'DROP TABLE ' + QUOTENAME(SCHEMA_NAME(schema_id)) + N'.' + QUOTENAME(name) + N';'
FROM sys.tables WHERE SCHEMA_NAME(schema_id) = ?;
SELECT @sql += N'DROP TYPE ' + QUOTENAME(SCHEMA_NAME(schema_id)) + N'.' + QUOTENAME(name) + N';'
FROM sys.types WHERE is_user_defined = 1 AND SCHEMA_NAME(schema_id) = ?;
SELECT @sql += N'DROP ROLE ' + QUOTENAME(name) + N';'
FROM sys.database_principals WHERE type = 'R' AND name IN (? + N'_producer', ? + N'_consumer', ? + N'_admin');
IF SCHEMA_ID(?) IS NOT NULL SET @sql += N'DROP SCHEMA ' + QUOTENAME(?) + N';';
EXEC sys.sp_executesql @sql;
"""
HISTORY_COLUMNS = ("unit_name", "unit_type", "queue_name", "tool_version", "unit_checksum",
                   "object_checksum", "applied_at", "applied_by", "duration_ms")
# Added by the deploy history's storage v2 (framework migration v1 -> v2); 0.1.0's table lacks them.
STORAGE_HISTORY_COLUMNS = ("storage_version", "storage_shape", "migration")
INSERT_COLUMNS = ("unit_name", "unit_type", "queue_name", "tool_version", "unit_checksum", "object_checksum",
                  "duration_ms") + STORAGE_HISTORY_COLUMNS


def _history_values(record: Record, version: str, object_checksum: str | None) -> tuple:
    storage = record.storage
    return (record.unit.name, record.unit.type, record.unit.queue, version, record.checksum, object_checksum,
            int((time.monotonic() - record.started) * 1000),
            storage.version if storage else None, (storage.shape_text or None) if storage else None,
            record.migration)


def _rows(columns: list[str], rows: list) -> list[dict]:
    wanted = HISTORY_COLUMNS + STORAGE_HISTORY_COLUMNS
    return [{key: dict(zip(columns, row)).get(key) for key in wanted} for row in rows]


def facts_from_columns(unit: Unit, columns: dict[str, str] | None, payload: str | None) -> dict[str, str]:
    """The shape a 0.1.0 table shows through its columns (names -> lower-case type names). payload:
    what the payload column's type (and, on SQL Server, a JSON check) says."""
    if unit.object != "table" or unit.queue is None or not columns:
        return {}
    facts = {"dedupe": "on" if "dedupe_key" in columns else "off",
             "priority": "on" if "priority" in columns else "off",
             "client_ids": "on" if columns.get("id") in ("uuid", "uniqueidentifier") else "off"}
    if payload is not None:
        facts["payload"] = payload
    if "visible_at" in columns or unit.role in ("dead", "history"):
        facts["kind"] = "work"
    else:  # heap, fifo and lifo tables are identical; pending's has due_at
        facts["kind"] = "pending" if "due_at" in columns else "heap|fifo|lifo"
    return facts


_CONCURRENT_INDEX = re.compile(r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+\"(?P<index>[^\"]+)\""
                               r"\s+ON\s+(?:ONLY\s+)?\"(?P<schema>[^\"]+)\"\.", re.IGNORECASE)


def created_concurrent_index(sql: str) -> tuple[str, str] | None:
    """(schema, index) of the CREATE INDEX CONCURRENTLY in sql, if there is one."""
    match = _CONCURRENT_INDEX.search(mask_comments_and_strings(sql))
    return (match["schema"], match["index"]) if match else None


_PLAIN_INDEX = re.compile(r"\bCREATE(?P<unique>\s+UNIQUE)?\s+INDEX\s+IF\s+NOT\s+EXISTS\b", re.IGNORECASE)


def postgres_object_checksum_sql(schema_expr: str, name_expr: str) -> str:
    """The PostgreSQL twin of MSSQL_OBJECT_CHECKSUM, for a schema and name given as SQL expressions."""
    return f"""SELECT coalesce(
    (SELECT md5(string_agg(pg_get_functiondef(p.oid), E'\\n' ORDER BY p.oid))
     FROM pg_catalog.pg_proc AS p
     JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
     WHERE n.nspname = {schema_expr} AND p.proname = {name_expr}),
    (SELECT md5(string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum))
     FROM pg_catalog.pg_attribute AS a
     JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
     JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE n.nspname = {schema_expr} AND c.relname = {name_expr} AND c.relkind IN ('r', 'p', 'S')
       AND a.attnum > 0 AND NOT a.attisdropped),
    (SELECT md5(pg_get_indexdef(c.oid))
     FROM pg_catalog.pg_class AS c
     JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE n.nspname = {schema_expr} AND c.relname = {name_expr} AND c.relkind = 'i'))"""


def _split_name(unit_name: str) -> tuple[str, str]:
    schema, _, name = unit_name.partition(".")
    return schema, name


class PostgresDialect:
    name = "postgres"

    def _lock_key(self, schema: str) -> str:
        return f"tablequeue:deploy:{schema}"

    def lock(self, conn: Any, schema: str, timeout_seconds: int) -> None:
        deadline = time.monotonic() + timeout_seconds
        while True:
            got = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                               (self._lock_key(schema),)).fetchone()[0]
            if got:
                return
            if time.monotonic() > deadline:
                raise EngineError(f"another deploy to schema '{schema}' held the deploy lock for "
                                  f"{timeout_seconds}s; giving up")
            time.sleep(0.2)

    def unlock(self, conn: Any, schema: str) -> None:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self._lock_key(schema),))

    def history_exists(self, conn: Any, schema: str) -> bool:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                            (f'"{schema}"."{HISTORY_TABLE}"',)).fetchone()[0]

    blocker_hint = "SELECT pid, xact_start, query FROM pg_stat_activity ORDER BY xact_start"

    def read_history(self, conn: Any, schema: str) -> list[dict]:
        present = {row[0] for row in conn.execute(
            "SELECT a.attname FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = to_regclass(%s) "
            "AND a.attnum > 0 AND NOT a.attisdropped", (f'"{schema}"."{HISTORY_TABLE}"',)).fetchall()}
        columns = [c for c in HISTORY_COLUMNS + STORAGE_HISTORY_COLUMNS if c in present]
        cursor = conn.execute(f'SELECT {", ".join(columns)} FROM "{schema}"."{HISTORY_TABLE}" ORDER BY history_id')
        return _rows(columns, cursor.fetchall())

    def routines(self, conn: Any, unit_name: str) -> list[str]:
        """Signatures of the routines a code unit created (PostgreSQL: every overload of its name)."""
        schema, name = _split_name(unit_name)
        rows = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc AS p "
            "JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname = %s ORDER BY p.oid", (schema, name)).fetchall()
        return [row[0] for row in rows]

    def run_transaction(self, conn: Any, schema: str, parts: list[Part], records: list[Record],
                        lock_timeout: float) -> None:
        import psycopg

        try:
            with conn.transaction():
                # SET takes no parameters; the value is a number the tool computed.
                conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(lock_timeout * 1000))}ms'")
                for part in parts:
                    self._execute(conn, part)
                for record in records:
                    self._insert(conn, schema, record)
        except psycopg.errors.LockNotAvailable as exc:
            raise LockTimeout(str(exc).strip().splitlines()[0]) from exc

    def _execute(self, conn: Any, part: Part) -> None:
        import psycopg

        if part.routine is None:
            conn.execute(part.sql)
            return
        before = self.routines(conn, part.routine)
        try:
            with conn.transaction():  # savepoint
                conn.execute(part.sql)
                if len(self.routines(conn, part.routine)) > len(before):
                    raise _SignatureChanged()
        except (_SignatureChanged, psycopg.errors.InvalidFunctionDefinition,
                psycopg.errors.AmbiguousFunction):
            # CREATE OR REPLACE cannot change a signature; it adds an overload instead. Drop
            # the old definitions in this same transaction, then create afresh.
            for signature in before:
                conn.execute(f"DROP ROUTINE {signature}")
            conn.execute(part.sql)

    def _insert(self, conn: Any, schema: str, record: Record) -> None:
        values = _history_values(record, version(), self.object_checksum(conn, record.unit.name))
        conn.execute(f'INSERT INTO "{schema}"."{HISTORY_TABLE}" ({", ".join(INSERT_COLUMNS)}) '
                     f'VALUES ({", ".join(["%s"] * len(INSERT_COLUMNS))})', values)

    def concurrent_index_sql(self, unit: Unit) -> str:
        """An index unit's one CREATE INDEX, built CONCURRENTLY (for an index added to a table that
        already exists: a plain build would block the queue's writes for as long as it takes)."""
        code = mask_comments_and_strings(unit.body)
        if code.count(";") != 1 or len(_PLAIN_INDEX.findall(code)) != 1:
            raise EngineError(f"index unit {unit.name} must be exactly one CREATE [UNIQUE] INDEX IF NOT EXISTS "
                              "statement, so that it can be built CONCURRENTLY on an existing table")
        return _PLAIN_INDEX.sub(lambda m: f"CREATE{m['unique'] or ''} INDEX CONCURRENTLY IF NOT EXISTS",
                                unit.body, count=1)

    def run_concurrent(self, conn: Any, sql: str, lock_timeout: float) -> None:
        import psycopg

        if not conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise EngineError("a concurrent index build needs an autocommit connection outside any transaction")
        # A build that failed (a lock timeout, a cancel) leaves its index behind, INVALID: IF NOT EXISTS
        # would keep it, so drop it and build it again.
        created = created_concurrent_index(sql)
        conn.execute(f"SET lock_timeout = '{max(1, int(lock_timeout * 1000))}ms'")
        try:
            if created is not None:
                schema, index = created
                invalid = conn.execute(
                    "SELECT NOT i.indisvalid FROM pg_catalog.pg_index AS i "
                    "JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid "
                    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s", (schema, index)).fetchone()
                if invalid is not None and invalid[0]:
                    conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{schema}"."{index}"')
            conn.execute(sql)
        except psycopg.errors.LockNotAvailable as exc:
            raise LockTimeout(str(exc).strip().splitlines()[0]) from exc
        finally:
            if not conn.closed:
                conn.execute("RESET lock_timeout")

    def deployed_facts(self, conn: Any, unit: Unit) -> dict[str, str]:
        schema, name = _split_name(unit.name)
        rows = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute AS a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
            (f'"{schema}"."{name}"',)).fetchall()
        columns = {column: type_name for column, type_name in rows}
        payload = {"bytea": "binary", "text": "text", "jsonb": "json"}.get(columns.get("payload", ""))
        return facts_from_columns(unit, columns, payload)

    def type_dependents(self, conn: Any, type_name: str) -> list[str]:
        schema, name = _split_name(type_name)
        rows = conn.execute(
            "SELECT DISTINCT n.nspname || '.' || p.proname FROM pg_catalog.pg_depend AS d "
            "JOIN pg_catalog.pg_proc AS p ON d.classid = 'pg_catalog.pg_proc'::regclass AND p.oid = d.objid "
            "JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace "
            "WHERE d.refclassid = 'pg_catalog.pg_type'::regclass AND d.refobjid = to_regtype(%s)",
            (f'"{schema}"."{name}"',)).fetchall()
        return sorted(row[0] for row in rows)

    def type_recreate_parts(self, conn: Any, type_unit: Unit, dependents: list[Unit]) -> list[Part]:
        schema, name = _split_name(type_unit.name)
        drops = [f"DROP ROUTINE {signature};" for unit in dependents for signature in self.routines(conn, unit.name)]
        return ([Part("\n".join(drops + [f'DROP TYPE IF EXISTS "{schema}"."{name}";']))]
                + [Part(type_unit.body)] + [Part(unit.body) for unit in dependents])

    def object_checksum(self, conn: Any, unit_name: str) -> str | None:
        schema, name = _split_name(unit_name)
        return conn.execute(postgres_object_checksum_sql("%(schema)s", "%(name)s"),
                            {"schema": schema, "name": name}).fetchone()[0]

    def count_messages(self, conn: Any, table: str, limit: int) -> int | None:
        schema, name = _split_name(table)
        is_table = conn.execute("SELECT coalesce((SELECT c.relkind IN ('r', 'p') FROM pg_catalog.pg_class AS c "
                                "WHERE c.oid = to_regclass(%s)), false)", (f'"{schema}"."{name}"',)).fetchone()[0]
        if not is_table:
            return None
        return conn.execute(f'SELECT count(*) FROM (SELECT 1 FROM "{schema}"."{name}" LIMIT %s) AS m',
                            (limit,)).fetchone()[0]


    def drop_schema(self, conn: Any, schema: str) -> None:
        # Roles are objects of the cluster, not of the schema: CASCADE leaves them behind.
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for role in SCHEMA_ROLES:
            conn.execute(f'DROP ROLE IF EXISTS "{schema}_{role}"')

    def roles_serving_elsewhere(self, conn: Any, schema: str) -> list[tuple[str, str]]:
        # The framework's role unit writes 'tablequeue: schema <s> of database <d>' on each role.
        rows = conn.execute(
            "SELECT r.rolname, substr(shobj_description(r.oid, 'pg_authid'), 13) FROM pg_catalog.pg_roles AS r "
            "WHERE r.rolname = ANY(%s) AND shobj_description(r.oid, 'pg_authid') LIKE 'tablequeue: %%' "
            "AND shobj_description(r.oid, 'pg_authid') <> format('tablequeue: schema %%s of database %%s', "
            "%s::text, current_database()) ORDER BY r.rolname",
            ([f"{schema}_{role}" for role in SCHEMA_ROLES], schema)).fetchall()
        return [(row[0], row[1]) for row in rows]

    def share_roles(self, conn: Any, share: bool) -> None:
        conn.execute("SELECT set_config('tablequeue.share_roles', %s, false)", ("on" if share else "off",))


class _SignatureChanged(Exception):
    pass


class MssqlDialect:
    name = "mssql"

    def _resource(self, schema: str) -> str:
        return f"tablequeue:deploy:{schema}"

    def _scalar(self, conn: Any, sql: str, *params: Any) -> Any:
        cursor = conn.cursor()
        cursor.execute(sql, *params)
        row = cursor.fetchone()
        cursor.close()
        return row[0] if row else None

    def lock(self, conn: Any, schema: str, timeout_seconds: int) -> None:
        status = self._scalar(
            conn,
            "SET NOCOUNT ON; DECLARE @status int; "
            "EXEC @status = sys.sp_getapplock @Resource = ?, @LockMode = 'Exclusive', "
            "@LockOwner = 'Session', @LockTimeout = ?; SELECT @status;",
            self._resource(schema), timeout_seconds * 1000)
        conn.commit()
        if status is None or status < 0:
            raise EngineError(f"could not take the deploy lock for schema '{schema}' "
                              f"(sp_getapplock returned {status}); another deploy is running")

    def unlock(self, conn: Any, schema: str) -> None:
        cursor = conn.cursor()
        cursor.execute("EXEC sys.sp_releaseapplock @Resource = ?, @LockOwner = 'Session';",
                       self._resource(schema))
        cursor.close()
        conn.commit()

    def history_exists(self, conn: Any, schema: str) -> bool:
        return self._scalar(conn, "SELECT CASE WHEN OBJECT_ID(?, N'U') IS NULL THEN 0 ELSE 1 END",
                            f"[{schema}].[{HISTORY_TABLE}]") == 1

    blocker_hint = ("SELECT session_id, blocking_session_id, wait_type, wait_time FROM sys.dm_exec_requests "
                    "WHERE blocking_session_id <> 0")

    def read_history(self, conn: Any, schema: str) -> list[dict]:
        cursor = conn.cursor()
        try:
            cursor.execute("SELECT c.name FROM sys.columns AS c WHERE c.object_id = OBJECT_ID(?, N'U')",
                           f"[{schema}].[{HISTORY_TABLE}]")
            present = {row[0] for row in cursor.fetchall()}
            columns = [c for c in HISTORY_COLUMNS + STORAGE_HISTORY_COLUMNS if c in present]
            cursor.execute(f"SELECT {', '.join(columns)} FROM [{schema}].[{HISTORY_TABLE}] ORDER BY history_id")
            return _rows(columns, cursor.fetchall())
        finally:
            cursor.close()

    def run_transaction(self, conn: Any, schema: str, parts: list[Part], records: list[Record],
                        lock_timeout: float) -> None:
        import pyodbc

        cursor = conn.cursor()
        try:
            # SET LOCK_TIMEOUT takes no variable; the value is a number the tool computed.
            cursor.execute(f"SET LOCK_TIMEOUT {max(1, int(lock_timeout * 1000))};")
            for part in parts:
                for batch in split_batches(part.sql):
                    for _ in range(batch.repeat):
                        cursor.execute(batch.text)
                        while cursor.nextset():
                            pass
            for record in records:
                values = _history_values(record, version(), self.object_checksum(conn, record.unit.name))
                cursor.execute(f"INSERT INTO [{schema}].[{HISTORY_TABLE}] ({', '.join(INSERT_COLUMNS)}) "
                               f"VALUES ({', '.join(['?'] * len(INSERT_COLUMNS))})", *values)
            conn.commit()
        except pyodbc.Error as exc:
            conn.rollback()
            if re.search(r"\(1222\)", str(exc)):  # Lock request time out period exceeded
                raise LockTimeout(" ".join(str(exc).split())) from exc
            raise
        except Exception:
            conn.rollback()
            raise
        finally:
            try:
                cursor.execute("SET LOCK_TIMEOUT -1;")
            except pyodbc.Error:
                pass   # the connection is gone: the error that ended the step is the one to report
            cursor.close()

    def routines(self, conn: Any, unit_name: str) -> list[str]:
        """SQL Server has no overloads: CREATE OR ALTER replaces a procedure whatever its parameters."""
        return []

    def run_concurrent(self, conn: Any, sql: str, lock_timeout: float) -> None:
        raise EngineError("SQL Server has no concurrent steps: its templates build indexes WITH (ONLINE = ON) "
                          "where the edition allows, inside a transaction step")

    def concurrent_index_sql(self, unit: Unit) -> str:
        raise EngineError(f"{unit.name}: SQL Server index units are built as their template says (ONLINE where "
                          "the edition allows), never rewritten")

    def deployed_facts(self, conn: Any, unit: Unit) -> dict[str, str]:
        schema, name = _split_name(unit.name)
        cursor = conn.cursor()
        try:
            cursor.execute("SELECT c.name, LOWER(TYPE_NAME(c.user_type_id)) FROM sys.columns AS c "
                           "WHERE c.object_id = OBJECT_ID(?, N'U')", f"[{schema}].[{name}]")
            columns = {column: type_name for column, type_name in cursor.fetchall()}
            cursor.execute("SELECT COUNT(*) FROM sys.check_constraints AS k "
                           "WHERE k.parent_object_id = OBJECT_ID(?, N'U') AND k.name = ?",
                           f"[{schema}].[{name}]", f"ck_{unit.queue}_payload_json")
            json_checked = cursor.fetchone()[0] > 0
        finally:
            cursor.close()
        payload_type = columns.get("payload")
        if payload_type == "varbinary":
            payload = "binary"
        elif payload_type == "nvarchar":
            # Only the queue table checks its JSON; dead letters and history hold either.
            payload = "json" if json_checked else ("text" if unit.role == "table" else "json|text")
        else:
            payload = None
        return facts_from_columns(unit, columns, payload)

    def type_dependents(self, conn: Any, type_name: str) -> list[str]:
        cursor = conn.cursor()
        try:
            cursor.execute("SELECT DISTINCT r.referencing_schema_name + N'.' + r.referencing_entity_name "
                           "FROM sys.dm_sql_referencing_entities(?, N'TYPE') AS r", type_name)
            return sorted(row[0] for row in cursor.fetchall())
        finally:
            cursor.close()

    def type_recreate_parts(self, conn: Any, type_unit: Unit, dependents: list[Unit]) -> list[Part]:
        schema, name = _split_name(type_unit.name)
        drops = [f"DROP PROCEDURE [{_split_name(unit.name)[0]}].[{_split_name(unit.name)[1]}];" for unit in dependents]
        return ([Part("\n".join(drops + [f"DROP TYPE [{schema}].[{name}];"]))]
                + [Part(type_unit.body)] + [Part(unit.body) for unit in dependents])

    def object_checksum(self, conn: Any, unit_name: str) -> str | None:
        schema, name = _split_name(unit_name)
        return self._scalar(conn, "DECLARE @unit_schema sysname = ?, @unit_name sysname = ?;\n"
                            + MSSQL_OBJECT_CHECKSUM + ";", schema, name)

    def count_messages(self, conn: Any, table: str, limit: int) -> int | None:
        schema, name = _split_name(table)
        if self._scalar(conn, "SELECT OBJECT_ID(?, N'U')", f"[{schema}].[{name}]") is None:
            return None
        # READCOMMITTEDLOCK: under READ_COMMITTED_SNAPSHOT (the Azure SQL default) READPAST alone is
        # refused (error 650) and the deploy would fail instead of refusing with exit code 3.
        return self._scalar(conn, f"SELECT COUNT_BIG(*) FROM (SELECT TOP (?) 1 AS one FROM "
                                  f"[{schema}].[{name}] WITH (READPAST, READCOMMITTEDLOCK)) AS m", limit)

    def drop_schema(self, conn: Any, schema: str) -> None:
        # Procedures first (they reference the types), then tables, types, roles and the schema.
        cursor = conn.cursor()
        try:
            cursor.execute(MSSQL_DROP_SCHEMA, *([schema] * 8))
            conn.commit()
        finally:
            cursor.close()

    def roles_serving_elsewhere(self, conn: Any, schema: str) -> list[tuple[str, str]]:
        return []    # SQL Server's roles belong to one database

    def share_roles(self, conn: Any, share: bool) -> None:
        pass


def dialect_for(name: str) -> Dialect:
    return {"postgres": PostgresDialect(), "mssql": MssqlDialect()}[name]
