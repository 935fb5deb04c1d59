"""One contract, two dialects: every T-SQL procedure takes the parameters and returns the columns of
its PostgreSQL function (DESIGN.md §3), by name, order and type, read from both renders of every
kind and option.

SQL Server's side is what check-tsql reads: the procedure's parameters and the columns of the result
sets it returns (their types followed through variables, table columns and CONVERTs). PostgreSQL's
side is the function header: its parameters and RETURNS TABLE (or the composite type of RETURNS
SETOF). The differences that are deliberate are listed below with their reason; everything else
must match.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tablequeue.catalog import load_catalog
from tablequeue.render import render_catalog
from tablequeue.tsqlrules import INTERNAL_PROCEDURE_SUFFIXES
from tablequeue.tsqltree import split_name
from tsql_renders import CATALOGS, report

# SQL Server type (without its length) -> the PostgreSQL type the contract pairs it with.
TYPES = {"bigint": "bigint", "int": "integer", "bit": "boolean", "uniqueidentifier": "uuid", "float": "double precision",
         "datetime2": "timestamptz", "nvarchar": "text", "varchar": "text", "varbinary": "bytea"}
# A JSON payload is nvarchar(MAX) with an ISJSON check in SQL Server, jsonb in PostgreSQL.
JSON_PAYLOAD = ("nvarchar(max)", "jsonb")

# Deliberate differences, by verb:
# - enqueue_batch (and any procedure taking a READONLY table-valued parameter): SQL Server takes
#   one table of items (type S.Q_items); PostgreSQL takes one array per column, named in the plural
#   (payloads, due_ats, dedupe_keys, priorities, ids, enqueued_ats), in the table type's column order
#   and of the mapped type, except `ordinal`, which numbers the items in SQL Server (PostgreSQL
#   numbers them by array position).
#   The same holds for complete_batch and fail_batch: one table of acks (type S.Q_acks: id,
#   lease_token) in SQL Server, the arrays ids and lease_tokens in PostgreSQL.
# - process, wait: PostgreSQL's are PROCEDUREs, run with CALL, that report their result in INOUT
#   parameters (a procedure returns no rows; processed/completed/failed, ready); SQL Server's return
#   them as their result set.
# - wait_step: PostgreSQL only. wait commits between its steps, which PostgreSQL refuses in a
#   definer procedure, so wait runs with the caller's rights and does each step in this definer
#   function; SQL Server's wait reads the table itself (ownership chaining).
TABLE_TYPE_ONLY_COLUMNS = {"ordinal"}
INOUT_AS_RESULT = {"process", "wait"}
POSTGRES_ONLY = {"wait_step"}


def plural(name: str) -> str:
    """priority -> priorities, dedupe_key -> dedupe_keys, due_at -> due_ats."""
    return name[:-1] + "ies" if name.endswith("y") and name[-2:-1] not in "aeiou" else name + "s"


# ------------------------------------------------------------------------------------------------
# PostgreSQL function headers


def _outside_quotes(text: str, start: int = 0):
    """(index, character, parenthesis depth after it) for each character of ``text`` from ``start``
    that is not inside a quoted string or identifier."""
    depth, quote = 0, None
    for index in range(start, len(text)):
        ch = text[index]
        if quote:
            quote = None if ch == quote else quote
            continue
        if ch in "'\"":
            quote = ch
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        yield index, ch, depth


def _bracketed(text: str, start: int) -> tuple[str, int]:
    """The text inside the parentheses opening at ``start`` and the index of the closing one."""
    end = next(index for index, ch, depth in _outside_quotes(text, start) if ch == ")" and depth == 0)
    return text[start + 1:end], end


def _top_level_split(text: str) -> list[str]:
    cuts = [index for index, ch, depth in _outside_quotes(text) if ch == "," and depth == 0]
    bounds = zip([-1] + cuts, cuts + [len(text)])
    return [text[a + 1:b].strip() for a, b in bounds if text[a + 1:b].strip()]


def _columns(text: str) -> list[tuple[str, str]]:
    """``name type, ...`` -> [(name, type)]; modes (INOUT) and DEFAULTs are the caller's business."""
    return [(part.split(None, 1)[0], part.split(None, 1)[1]) for part in _top_level_split(text)]


def postgres_signatures(text: str) -> dict[str, tuple[list[tuple[str, str, str]], list[tuple[str, str]] | None]]:
    """function name -> ([(parameter, type, mode)], result columns or None) of every routine in ``text``."""
    code = re.sub(r"--[^\n]*", "", text)
    types = {}
    for match in re.finditer(r'CREATE TYPE ("[^"]+"\."[^"]+") AS \(', code):
        types[match[1]] = _columns(_bracketed(code, match.end() - 1)[0])
    routines = {}
    for match in re.finditer(r'CREATE OR REPLACE (?:FUNCTION|PROCEDURE) "[^"]+"\."([^"]+)"\(', code):
        inside, end = _bracketed(code, match.end() - 1)
        params = []
        for part in _top_level_split(inside):
            part = re.split(r"\s+DEFAULT\s+", part, maxsplit=1)[0]
            mode, _, rest = part.partition(" ") if part.split(None, 1)[0] in ("IN", "OUT", "INOUT") else ("IN", "", part)
            name, type_ = rest.split(None, 1)
            params.append((name, type_.strip(), mode))
        after = code[end + 1:]
        table = re.match(r"\s*RETURNS\s+TABLE\s*\(", after)
        setof = re.match(r'\s*RETURNS\s+SETOF\s+("[^"]+"\."[^"]+")', after)
        results = (_columns(_bracketed(after, table.end() - 1)[0]) if table else types[setof[1]] if setof else None)
        routines[match[1]] = (params, results)
    return routines


# ------------------------------------------------------------------------------------------------
# The comparison


def same_type(mssql: str | None, postgres: str, name: str, json_payload: bool) -> bool:
    if mssql is None:
        return False
    if json_payload and name.rstrip("s") == "payload" and (mssql, postgres) == JSON_PAYLOAD:
        return True
    return TYPES.get(mssql.split("(")[0]) == postgres


def compare(procedure: str, signature, table_types, routine, json_payload: bool) -> list[str]:
    """What differs between one T-SQL procedure and its PostgreSQL function, one line per difference."""
    pg_params, pg_results = routine
    verb = procedure.split("_", 1)[1] if "_" in procedure else procedure
    out = []
    results = [list(r) for r in signature.results]
    if any(r != results[0] for r in results[1:]):
        out.append(f"{procedure}: its result sets differ: {results}")
    mssql_results = results[0] if results else []
    pg_in = [(n, t) for n, t, mode in pg_params if mode != "INOUT" or not any(verb.endswith(v) for v in INOUT_AS_RESULT)]
    if any(verb.endswith(v) for v in INOUT_AS_RESULT):
        pg_results = [(n, t) for n, t, mode in pg_params if mode == "INOUT"]
    expected_params: list[tuple[str, str | None, str]] = []     # (name, SQL Server type, where it comes from)
    for name, type_ in signature.params:
        columns = table_types.get(type_) if type_ and type_.startswith("[") else None
        if columns is None:
            expected_params.append((name.lstrip("@"), type_, f"parameter {name}"))
            continue
        for column, column_type in columns.items():     # a table-valued parameter: one array per column
            if column not in TABLE_TYPE_ONLY_COLUMNS:
                expected_params.append((plural(column), column_type, f"column {column} of {name} {type_}"))
    names = [n for n, _, _ in expected_params]
    if names != [n for n, _ in pg_in]:
        out.append(f"{procedure}: parameters {names} in SQL Server, {[n for n, _ in pg_in]} in PostgreSQL")
    for (name, mssql_type, where), (pg_name, pg_type) in zip(expected_params, pg_in):
        element = pg_type[:-2] if pg_type.endswith("[]") and where.startswith("column") else pg_type
        if name == pg_name and not same_type(mssql_type, element, name, json_payload):
            out.append(f"{procedure}: {where} is {mssql_type}, PostgreSQL's {pg_name} is {pg_type}")
    pg_results = pg_results or []
    if [n for n, _ in mssql_results] != [n for n, _ in pg_results]:
        out.append(f"{procedure}: result columns {[n for n, _ in mssql_results]} in SQL Server, "
                   f"{[n for n, _ in pg_results]} in PostgreSQL")
    for (name, mssql_type), (pg_name, pg_type) in zip(mssql_results, pg_results):
        if name == pg_name and not same_type(mssql_type, pg_type, name, json_payload):
            out.append(f"{procedure}: result column {name} is {mssql_type}, {pg_type} in PostgreSQL")
    return out


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_every_procedure_has_the_contract_of_its_postgres_function(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    checked = report(catalog_path)
    table_types = {relation.display: relation.columns for relation in checked.catalog.types.values()}
    # Not the contract: process's handler check (internal, no role may call it) and the handlers,
    # which tSQLt replaces with doubles in the queue's schema.
    handlers = {q.options["handler"].split(".")[-1] for q in catalog.queues if q.options.get("handler")}
    procedures = {split_name(s.name)[1]: s for s in checked.signatures
                  if split_name(s.name)[0] == catalog.schema and split_name(s.name)[1] not in handlers
                  and not split_name(s.name)[1].endswith(INTERNAL_PROCEDURE_SUFFIXES)}
    routines = {}
    for rendered in render_catalog(catalog, "postgres"):
        routines.update(postgres_signatures(rendered.text))
    routines = {n: r for n, r in routines.items() if not any(n.endswith("_" + verb) for verb in POSTGRES_ONLY)}
    assert sorted(procedures) == sorted(routines)
    payload = {queue.name: queue.payload for queue in catalog.queues}
    differences = []
    for name in sorted(procedures):
        queue = max((q for q in payload if name.startswith(q + "_")), key=len)
        differences += compare(name, procedures[name], table_types, routines[name], payload[queue] == "json")
    assert differences == []


def test_the_comparison_finds_a_renamed_parameter_a_reordered_column_and_a_changed_type() -> None:
    """The parity check itself: a difference in each part of a signature is reported."""
    catalog = load_catalog(CATALOGS[0])
    checked = report(CATALOGS[0])
    table_types = {relation.display: relation.columns for relation in checked.catalog.types.values()}
    signature = next(s for s in checked.signatures if s.name == "[queue].[emails_fail]")
    routines = {}
    for rendered in render_catalog(catalog, "postgres"):
        routines.update(postgres_signatures(rendered.text))
    params, results = routines["emails_fail"]
    assert compare("emails_fail", signature, table_types, (params, results), True) == []
    renamed = [("worker_name" if n == "worker" else n, t, m) for n, t, m in params]
    assert compare("emails_fail", signature, table_types, (renamed, results), True) == [
        "emails_fail: parameters ['id', 'worker', 'error', 'retry_after_seconds', 'lease_token'] in SQL Server, "
        "['id', 'worker_name', 'error', 'retry_after_seconds', 'lease_token'] in PostgreSQL"]
    retyped = [(n, "integer" if n == "retry_after_seconds" else t, m) for n, t, m in params]
    assert compare("emails_fail", signature, table_types, (retyped, [("outcome", "boolean")]), True) == [
        "emails_fail: result column outcome is varchar(8), boolean in PostgreSQL"]
    batch = next(s for s in checked.signatures if s.name == "[queue].[emails_enqueue_batch]")
    params, results = routines["emails_enqueue_batch"]
    swapped = [params[1], params[0]] + params[2:]
    assert compare("emails_enqueue_batch", batch, table_types, (swapped, results[::-1]), True) == [
        "emails_enqueue_batch: parameters ['payloads', 'due_ats', 'dedupe_keys', 'priorities', 'ids', "
        "'enqueued_ats'] in SQL Server, ['due_ats', 'payloads', 'dedupe_keys', 'priorities', 'ids', "
        "'enqueued_ats'] in PostgreSQL",
        "emails_enqueue_batch: result columns ['ordinal', 'id', 'duplicate'] in SQL Server, "
        "['duplicate', 'id', 'ordinal'] in PostgreSQL"]


def test_the_acks_table_maps_to_id_and_token_arrays_and_wait_reports_ready_in_an_inout() -> None:
    """The two mappings of the consumers v2 verbs, on the SQL Server side as rendered and the
    PostgreSQL headers the contract gives them (contract-v2): complete_batch's S.Q_acks is the
    arrays ids and lease_tokens, and wait, a PostgreSQL PROCEDURE, reports ready in an INOUT."""
    checked = report(CATALOGS[0])
    table_types = {relation.display: relation.columns for relation in checked.catalog.types.values()}
    signatures = {s.name: s for s in checked.signatures}
    batch = signatures["[queue].[emails_complete_batch]"]
    params = [("ids", "bigint[]", "IN"), ("lease_tokens", "uuid[]", "IN"), ("worker", "text", "IN")]
    results = [("id", "bigint"), ("completed", "boolean")]
    assert compare("emails_complete_batch", batch, table_types, (params, results), True) == []
    assert compare("emails_complete_batch", batch, table_types, (params[1::-1] + params[2:], results), True) == [
        "emails_complete_batch: parameters ['ids', 'lease_tokens', 'worker'] in SQL Server, "
        "['lease_tokens', 'ids', 'worker'] in PostgreSQL"]
    wait = signatures["[queue].[emails_wait]"]
    assert compare("emails_wait", wait, table_types, ([("wait_ms", "integer", "IN"), ("ready", "boolean", "INOUT")],
                                                      None), True) == []
    assert compare("emails_wait", wait, table_types, ([("wait_ms", "integer", "IN"), ("ready", "integer", "INOUT")],
                                                      None), True) == [
        "emails_wait: result column ready is bit, integer in PostgreSQL"]
