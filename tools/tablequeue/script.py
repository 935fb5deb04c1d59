"""One reviewable script a DBA can run by hand (sqlcmd for SQL Server, psql for PostgreSQL).

It holds the same units the deploy tool applies, each in its own transaction and each recorded in
the deploy history, so `tablequeue status` and later deploys see what the script did. Running it
again changes nothing. Storage units are guarded: a storage unit the history records at another
version or shape stops the script with error deploy_refused instead of being skipped silently.
"""
from __future__ import annotations

from . import __version__
from .engines import HISTORY_TABLE, INSERT_COLUMNS, MSSQL_OBJECT_CHECKSUM, postgres_object_checksum_sql
from .errors import QUEUE_ERRORS
from .render import Unit

OLD_HISTORY = ("the deploy history in this schema was created by tablequeue 0.1.0, which recorded no storage "
               "versions: deploy with `tablequeue deploy` once, which migrates it. Nothing was applied.")


def literal(text: str | None, national: bool = False) -> str:
    if text is None:
        return "NULL"
    return ("N" if national else "") + "'" + text.replace("'", "''") + "'"


def _number(value: int | None) -> str:
    return "NULL" if value is None else str(value)


def _refusal(unit: Unit) -> str:
    return (f"{unit.name}: the deploy history records this storage unit at another version or shape than "
            f"{unit.storage.describe()}, which this script creates; deploy with `tablequeue deploy`, which "
            "migrates it. Nothing after this point was applied.")


def _insert_values(unit: Unit, object_checksum_sql: str, national: bool) -> str:
    storage = unit.storage
    return ", ".join([literal(unit.name, national), literal(unit.type), literal(unit.queue, national),
                      literal(__version__), literal(unit.checksum), object_checksum_sql, "0",
                      _number(storage.version if storage else None),
                      literal(storage.shape_text or None if storage else None), "NULL"])


def mssql_script(schema: str, units: list[Unit], source: str) -> str:
    history = f"[{schema}].[{HISTORY_TABLE}]"
    refused = QUEUE_ERRORS["deploy_refused"].mssql
    out = [f"-- tablequeue {__version__} deploy script for schema {schema} (rendered from {source})",
           "-- Run with sqlcmd, or SSMS in SQLCMD mode: it stops at the first error.",
           ":on error exit",
           "SET ANSI_NULLS ON;", "SET QUOTED_IDENTIFIER ON;", "SET XACT_ABORT ON;", "SET NOCOUNT ON;", "GO",
           f"IF OBJECT_ID(N'{history}', N'U') IS NOT NULL AND COL_LENGTH(N'{history}', N'storage_version') IS NULL",
           f"    THROW {refused}, {literal(OLD_HISTORY, True)}, 1;", "GO"]
    for unit in units:
        latest = (f"SELECT TOP (1) h.unit_checksum, h.storage_version, h.storage_shape FROM {history} AS h "
                  f"WHERE h.unit_name = {literal(unit.name, True)} ORDER BY h.history_id DESC")
        if unit.storage is not None:
            same = (f"last_applied.storage_version = {unit.storage.version} AND "
                    f"COALESCE(last_applied.storage_shape, '') = {literal(unit.storage.shape_text)}")
        else:
            same = f"last_applied.unit_checksum = {literal(unit.checksum)}"
        out += ["", f"-- unit {unit.name} ({unit.type})"]
        if unit.storage is not None and unit.queue is not None:
            out += [f"IF EXISTS (SELECT 1 / 0 FROM ({latest}) AS last_applied",
                    f"           WHERE NOT ({same}))",
                    f"    THROW {refused}, {literal(_refusal(unit), True)}, 1;",
                    "GO"]
        out += ["BEGIN TRANSACTION;", "GO", unit.body.rstrip()]
        if not unit.body.rstrip().endswith("GO"):
            out.append("GO")
        out += [f"DECLARE @unit_schema sysname = {literal(schema, True)};",
                f"DECLARE @unit_name sysname = {literal(unit.name.split('.', 1)[1], True)};",
                f"DECLARE @object_checksum varchar(64) = ({MSSQL_OBJECT_CHECKSUM});",
                f"IF NOT EXISTS (SELECT 1 / 0 FROM ({latest}) AS last_applied WHERE {same})",
                f"    INSERT INTO {history}",
                f"        ({', '.join(INSERT_COLUMNS)})",
                f"    VALUES ({_insert_values(unit, '@object_checksum', True)});",
                "COMMIT TRANSACTION;", "GO"]
    return "\n".join(out) + "\n"


def postgres_script(schema: str, units: list[Unit], source: str) -> str:
    history = f'"{schema}"."{HISTORY_TABLE}"'
    refused = QUEUE_ERRORS["deploy_refused"].postgres
    out = [f"-- tablequeue {__version__} deploy script for schema {schema} (rendered from {source})",
           "-- Run with psql: it stops at the first error.", "\\set ON_ERROR_STOP on",
           "DO $guard$", "BEGIN",
           f"    IF to_regclass({literal(history)}) IS NOT NULL AND NOT EXISTS (",
           "        SELECT FROM pg_catalog.pg_attribute AS a",
           f"        WHERE a.attrelid = to_regclass({literal(history)}) AND a.attname = 'storage_version') THEN",
           f"        RAISE EXCEPTION USING ERRCODE = '{refused}', MESSAGE = {literal(OLD_HISTORY)};",
           "    END IF;", "END", "$guard$;"]
    for unit in units:
        object_schema, object_name = unit.name.split(".", 1)
        last_applied = (f"(SELECT h.unit_checksum, h.storage_version, h.storage_shape FROM {history} AS h "
                        f"WHERE h.unit_name = {literal(unit.name)} ORDER BY h.history_id DESC LIMIT 1) AS last_applied")
        if unit.storage is not None:
            same = (f"(last_applied.storage_version, coalesce(last_applied.storage_shape, '')) = "
                    f"({unit.storage.version}, {literal(unit.storage.shape_text)})")
        else:
            same = f"last_applied.unit_checksum = {literal(unit.checksum)}"
        out += ["", f"-- unit {unit.name} ({unit.type})", "BEGIN;"]
        if unit.storage is not None and unit.queue is not None:
            out += ["DO $guard$", "BEGIN",
                    f"    IF EXISTS (SELECT FROM {last_applied} WHERE NOT {same}) THEN",
                    f"        RAISE EXCEPTION USING ERRCODE = '{refused}',",
                    f"            MESSAGE = {literal(_refusal(unit))};",
                    "    END IF;", "END", "$guard$;"]
        object_checksum = postgres_object_checksum_sql(literal(object_schema), literal(object_name))
        out += [unit.body.rstrip(),
                f"INSERT INTO {history}",
                f"    ({', '.join(INSERT_COLUMNS)})",
                f"SELECT {_insert_values(unit, f'({object_checksum})', False)}",
                f"WHERE NOT EXISTS (SELECT FROM {last_applied} WHERE {same});", "COMMIT;"]
    return "\n".join(out) + "\n"
