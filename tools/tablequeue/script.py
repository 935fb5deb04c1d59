"""One reviewable script a DBA can run by hand (sqlcmd for SQL Server, psql for PostgreSQL).

It holds the same units the deploy tool applies, each in its own transaction and each recorded in
the deploy history, so `tablequeue status` and later deploys see what the script did. Storage units
are guarded: a queue table whose recorded definition differs stops the script with error
deploy_refused instead of being skipped silently.
"""
from __future__ import annotations

from .distribution import version
from .engines import HISTORY_TABLE, MSSQL_OBJECT_CHECKSUM, postgres_object_checksum_sql
from .errors import QUEUE_ERRORS
from .render import Unit


def literal(text: str | None, national: bool = False) -> str:
    if text is None:
        return "NULL"
    return ("N" if national else "") + "'" + text.replace("'", "''") + "'"


def _refusal(unit: Unit) -> str:
    return (f"{unit.name}: this storage unit's definition changed since it was deployed; tablequeue never drops "
            "or rebuilds a queue's storage. Nothing after this point was applied.")


def mssql_script(schema: str, units: list[Unit], source: str) -> str:
    history = f"[{schema}].[{HISTORY_TABLE}]"
    out = [f"-- tablequeue {version()} deploy script for schema {schema} (rendered from {source})",
           "-- Run with sqlcmd, or SSMS in SQLCMD mode: it stops at the first error.",
           ":on error exit",
           "SET ANSI_NULLS ON;", "SET QUOTED_IDENTIFIER ON;", "SET XACT_ABORT ON;", "SET NOCOUNT ON;", "GO"]
    for unit in units:
        last_checksum = (f"SELECT TOP (1) h.unit_checksum FROM {history} AS h "
                         f"WHERE h.unit_name = {literal(unit.name, True)} ORDER BY h.history_id DESC")
        out += ["", f"-- unit {unit.name} ({unit.type})"]
        if unit.type == "storage" and unit.queue is not None:
            out += [f"IF EXISTS (SELECT 1 / 0 FROM ({last_checksum}) AS last_applied",
                    f"           WHERE last_applied.unit_checksum <> {literal(unit.checksum)})",
                    f"    THROW {QUEUE_ERRORS['deploy_refused'].mssql}, {literal(_refusal(unit), True)}, 1;",
                    "GO"]
        out += ["BEGIN TRANSACTION;", "GO", unit.body.rstrip()]
        if not unit.body.rstrip().endswith("GO"):
            out.append("GO")
        out += [f"DECLARE @unit_schema sysname = {literal(schema, True)};",
                f"DECLARE @unit_name sysname = {literal(unit.name.split('.', 1)[1], True)};",
                f"DECLARE @object_checksum varchar(64) = ({MSSQL_OBJECT_CHECKSUM});",
                f"IF NOT EXISTS (SELECT 1 / 0 FROM ({last_checksum}) AS last_applied",
                f"               WHERE last_applied.unit_checksum = {literal(unit.checksum)})",
                f"    INSERT INTO {history}",
                "        (unit_name, unit_type, queue_name, tool_version, unit_checksum, object_checksum, duration_ms)",
                f"    VALUES ({literal(unit.name, True)}, {literal(unit.type)}, {literal(unit.queue, True)}, "
                f"{literal(version())}, {literal(unit.checksum)}, @object_checksum, 0);",
                "COMMIT TRANSACTION;", "GO"]
    return "\n".join(out) + "\n"


def postgres_script(schema: str, units: list[Unit], source: str) -> str:
    history = f'"{schema}"."{HISTORY_TABLE}"'
    out = [f"-- tablequeue {version()} deploy script for schema {schema} (rendered from {source})",
           "-- Run with psql: it stops at the first error.", "\\set ON_ERROR_STOP on"]
    for unit in units:
        object_schema, object_name = unit.name.split(".", 1)
        last_checksum = (f"(SELECT h.unit_checksum FROM {history} AS h WHERE h.unit_name = {literal(unit.name)} "
                         "ORDER BY h.history_id DESC LIMIT 1)")
        out += ["", f"-- unit {unit.name} ({unit.type})", "BEGIN;"]
        if unit.type == "storage" and unit.queue is not None:
            out += ["DO $guard$", "BEGIN",
                    f"    IF {last_checksum} <> {literal(unit.checksum)} THEN",
                    f"        RAISE EXCEPTION USING ERRCODE = '{QUEUE_ERRORS['deploy_refused'].postgres}',",
                    f"            MESSAGE = {literal(_refusal(unit))};",
                    "    END IF;", "END", "$guard$;"]
        object_checksum = postgres_object_checksum_sql(literal(object_schema), literal(object_name))
        out += [unit.body.rstrip(),
                f"INSERT INTO {history}",
                "    (unit_name, unit_type, queue_name, tool_version, unit_checksum, object_checksum, duration_ms)",
                f"SELECT {literal(unit.name)}, {literal(unit.type)}, {literal(unit.queue)}, "
                f"{literal(version())}, {literal(unit.checksum)}, ({object_checksum}), 0",
                f"WHERE {last_checksum} IS DISTINCT FROM {literal(unit.checksum)};", "COMMIT;"]
    return "\n".join(out) + "\n"
