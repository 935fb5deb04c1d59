"""`tablequeue check-tsql`: every reference in rendered T-SQL resolves, without a server.

What a database project's build (DacFx's unresolved-reference errors) gives SQL Server teams, on
the sqlfluff parse tree instead: tables, columns (aliases, CTE and derived-table columns, OUTPUT's
inserted/deleted, INSERT column lists, MERGE), variables (declared above their use, in their batch),
table types, procedures and their named arguments, roles and schemas, and objects named in strings
(OBJECT_ID(N'...'), tSQLt's @TableName). They resolve against what the given files create, all
files together (the tSQLt classes use the queues' objects), plus the short list below of what SQL
Server and tSQLt provide. References only known at run time (EXEC @name) are listed as skipped.

Schema changes (storage migrations) are visible in their own file only, from the statement that
makes them on: what a file CREATEs is known to every file, but what it does to a table (ALTER TABLE
ADD / DROP COLUMN or CONSTRAINT, CREATE / DROP INDEX, DROP TABLE, a table it drops and creates
again) is not. A migration's later batches see the column it adds; the main render's procedures
must not (that would hide a reference to a column only a migration adds). Within a batch, SQL
Server compiles the queries before the batch runs: a query sees the tables as they were when the
batch began (a table the batch creates is resolved when the query runs), while DDL statements see
the changes made above them. Changes made in a procedure's body happen when it runs (tSQLt's
migration tests, rolled back after each test): they are seen in the rest of that body only. DROP
... IF EXISTS, and a DDL statement under IF COL_LENGTH(N'<table>', N'<column>') IS NOT NULL naming
that column, may name what is not there at that point, if some file creates or adds it.

Names in strings are looked up at run time, mostly to probe whether something exists yet (IF
OBJECT_ID(...) IS NULL, COL_LENGTH, INDEXPROPERTY): they resolve against everything any file
creates or adds, at any point (a name nothing ever creates makes the probe always NULL: a typo).
sp_rename is not modelled: it is an unresolved procedure, so its use cannot pass unnoticed.

The static rules of tsqlrules run in the same pass, so one command checks everything.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
from importlib import metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from . import tsqlmodel as m
from .gosplit import GoSplitError, split_batches
from . import tsqlrules
from .tsqlrules import Claim, Violation
from .distribution import checkout_root
from . import tsqltree
from .tsqltree import TsqlParseError, fold, map_batches, parse_batch, split_name

# ------------------------------------------------------------------------------------------------
# What SQL Server and tSQLt provide, as far as the rendered files use it. Nothing else of theirs is
# known here: a template that starts using another system view, function, collation or tSQLt
# procedure gets "unresolved ..." from check-tsql and adds it below (with only the columns and
# parameters it uses for system views; tSQLt's parameters as its documentation lists them).

SYSTEM_SCHEMAS = {"dbo", "sys", "tsqlt"}
SYSTEM_PRINCIPALS = {"dbo", "public"}
SYSTEM_TABLES: dict[tuple[str, str], dict[str, str]] = {
    ("sys", "partitions"): {"object_id": "int", "index_id": "int", "rows": "bigint"},
    ("sys", "all_columns"): {"object_id": "int", "column_id": "int"},
    ("sys", "indexes"): {"object_id": "int", "index_id": "int", "name": "sysname", "type": "tinyint",
                         "type_desc": "nvarchar(60)", "is_unique": "bit", "is_primary_key": "bit",
                         "has_filter": "bit", "filter_definition": "nvarchar(MAX)", "is_disabled": "bit"},
    ("sys", "index_columns"): {"object_id": "int", "index_id": "int", "column_id": "int", "key_ordinal": "tinyint",
                               "is_descending_key": "bit"},
    ("sys", "columns"): {"object_id": "int", "column_id": "int", "name": "sysname", "user_type_id": "int",
                         "collation_name": "sysname"},
    ("sys", "default_constraints"): {"object_id": "int", "parent_object_id": "int", "parent_column_id": "int"},
    ("sys", "types"): {"user_type_id": "int", "name": "sysname"},
    ("sys", "parameters"): {"object_id": "int", "parameter_id": "int", "name": "sysname", "user_type_id": "int",
                            "max_length": "smallint", "is_output": "bit"},
    ("sys", "objects"): {"object_id": "int", "name": "sysname", "schema_id": "int", "principal_id": "int",
                         "type": "char(2)"},
}
# System procedures the templates call, with their parameters (the claim index upgrade renames one).
SYSTEM_PROCEDURES: dict[tuple[str, str], tuple[str, ...]] = {
    ("sys", "sp_rename"): ("@objname", "@newname", "@objtype"),
    ("sys", "sp_set_session_context"): ("@key", "@value", "@read_only"),
}
TSQLT_PROCEDURES: dict[str, tuple[str, ...]] = {
    "NewTestClass": ("@ClassName",),
    "FakeTable": ("@TableName", "@SchemaName", "@Identity", "@ComputedColumns", "@Defaults"),
    "ApplyConstraint": ("@TableName", "@ConstraintName", "@SchemaName", "@NoCascade"),
    "AssertEqualsTable": ("@Expected", "@Actual", "@Message", "@FailMsg"),
    "AssertEmptyTable": ("@TableName", "@Message"),
    "AssertEquals": ("@Expected", "@Actual", "@Message"),
    "AssertEqualsString": ("@Expected", "@Actual", "@Message"),
    "AssertLike": ("@ExpectedPattern", "@Actual", "@Message"),
    "ExpectException": ("@ExpectedMessage", "@ExpectedSeverity", "@ExpectedState", "@Message",
                        "@ExpectedMessagePattern", "@ExpectedErrorNumber"),
    "Fail": tuple(f"@Message{i}" for i in range(10)),
    "RemoveObjectIfExists": ("@ObjectName", "@NewName"),
    "RemoveObject": ("@ObjectName", "@NewName", "@IfExists"),
    "SpyProcedure": ("@ProcedureName", "@CommandToExecute"),
    "UndoTestDoubles": ("@Force",),
}
# tSQLt arguments whose string value names a table (or a #temp table); ApplyConstraint's
# @ConstraintName names a constraint of its @TableName.
TSQLT_TABLE_ARGUMENTS = {("faketable", "@tablename"), ("applyconstraint", "@tablename"),
                         ("assertequalstable", "@expected"), ("assertequalstable", "@actual"),
                         ("assertemptytable", "@tablename")}
# Built-in functions sqlfluff does not treat as keywords, with the type they return (None: the type
# of their argument, or not needed). The type is read by the contract parity test.
BUILTIN_FUNCTIONS: dict[str, str | None] = {
    "ABS": None, "CHECKSUM": "int",
    "COL_LENGTH": "smallint", "COLUMNPROPERTY": "int", "CONCAT": "nvarchar(max)", "COUNT": "int", "COUNT_BIG": "bigint",
    "DATABASE_PRINCIPAL_ID": "int", "DATALENGTH": "bigint", "DATEADD": "datetime2(7)", "DATEDIFF": "int",
    "SESSION_CONTEXT": "sql_variant",
    "DATEDIFF_BIG": "bigint", "ERROR_LINE": "int", "ERROR_MESSAGE": "nvarchar(4000)", "ERROR_NUMBER": "int",
    "ERROR_PROCEDURE": "nvarchar(128)", "HAS_PERMS_BY_NAME": "int", "IIF": None, "INDEX_COL": "nvarchar(128)", "INDEXPROPERTY": "int",
    "LEN": "int", "LOWER": None, "MAX": None, "MIN": None, "NEWID": "uniqueidentifier",
    "OBJECT_DEFINITION": "nvarchar(max)", "OBJECT_ID": "int", "OBJECT_NAME": "nvarchar(128)", "OBJECTPROPERTY": "int",
    "REPLACE": None,
    "ORIGINAL_LOGIN": "nvarchar(128)", "QUOTENAME": "nvarchar(258)", "SCHEMA_ID": "int",
    "SCOPE_IDENTITY": "numeric(38,0)", "SERVERPROPERTY": "sql_variant", "SUM": None,
    "SYSUTCDATETIME": "datetime2(7)", "TYPE_ID": "int", "ROW_NUMBER": "bigint", "XACT_STATE": "smallint",
    "SQL_VARIANT_PROPERTY": "sql_variant", "TRANSLATE": None,
}
# Indexes that earlier storage versions of a work queue's table created and that no render creates
# any more, by purpose (ix_<queue>_<purpose>): the migrations that leave those versions still name
# them (work_table_v1_to_v2 renames 0.1.0's claim index, work_table_v2_to_v3 drops v2's), and a name
# in a string or in DROP INDEX IF EXISTS resolves against them as against the indexes a file creates.
# Only on a table with a leased_by column (a work queue table), under exactly these names: a typo in
# a migration is still unresolved.
RETIRED_WORK_INDEXES = ("claim", "claim_priority", "ungrouped")
COLLATIONS = {"latin1_general_100_bin2"}
# Built-in types that sqlfluff reads as names rather than keywords.
# Built-in types, as TYPE_ID(N'<type>') names them (process's handler check compares parameter types).
SYSTEM_TYPES = {"sysname", "bigint", "int", "smallint", "tinyint", "bit", "uniqueidentifier", "nvarchar", "varchar",
                "nchar", "char", "varbinary", "binary", "datetime2", "datetimeoffset", "xml", "json"}


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


# ------------------------------------------------------------------------------------------------
# What the files create


@dataclass
class Relation:
    """A table or table type: its columns (name -> type), constraints and indexes."""

    display: str
    columns: dict[str, str | None]
    constraints: set[str] = field(default_factory=set)
    indexes: set[str] = field(default_factory=set)


@dataclass
class ProcedureInfo:
    display: str
    params: list[tuple[str, str | None, bool]]   # (folded name with @, type, has a default)


@dataclass
class Catalog:
    tables: dict[tuple[str, str], Relation] = field(default_factory=dict)   # as created (every file sees)
    types: dict[tuple[str, str], Relation] = field(default_factory=dict)
    procedures: dict[tuple[str, str], ProcedureInfo] = field(default_factory=dict)
    roles: set[str] = field(default_factory=lambda: set(SYSTEM_PRINCIPALS))
    schemas: set[str] = field(default_factory=lambda: set(SYSTEM_SCHEMAS))
    test_classes: set[str] = field(default_factory=set)    # schemas made by tSQLt.NewTestClass
    # Every table with every column, constraint and index any file gives it, at any point: what a
    # name in a string (a run-time probe) and DROP ... IF EXISTS resolve against.
    anywhere: dict[tuple[str, str], Relation] = field(default_factory=dict)


@dataclass
class Schema:
    """The tables as one file has left them so far: the catalog's, changed by the file's statements
    in order. Copy on write: a copy shares the relations, and either side copies one before it
    changes it."""

    tables: dict[tuple[str, str], Relation]
    owned: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def of(cls, catalog: Catalog) -> "Schema":
        return cls(dict(catalog.tables))

    def copy(self) -> "Schema":
        self.owned = set()
        return Schema(dict(self.tables))

    def changing(self, key: tuple[str, str]) -> Relation:
        """The table ``key`` (which exists), to be changed in this schema only."""
        if key not in self.owned:
            relation = self.tables[key]
            self.tables[key] = Relation(relation.display, dict(relation.columns), set(relation.constraints),
                                        set(relation.indexes))
            self.owned.add(key)
        return self.tables[key]

    def create(self, key: tuple[str, str], relation: Relation) -> None:
        self.tables[key] = relation
        self.owned.add(key)

    def drop(self, key: tuple[str, str]) -> None:
        del self.tables[key]
        self.owned.discard(key)


def _key(names: list[str]) -> tuple[str, str]:
    """(schema, name) of a one- or two-part name; one part means dbo (the default schema)."""
    return (names[-2], names[-1]) if len(names) >= 2 else ("dbo", names[-1])


def build_catalog(models: Iterable[m.BatchModel]) -> Catalog:
    """Everything the files create. An object created twice is taken from its first CREATE (a
    rendered set creates each object once; two versions of one object are not this check's concern).
    A table's indexes are those the file that creates it creates; a table that a file drops and
    creates again is that file's own (a migration rebuilding an empty table)."""
    catalog = Catalog()
    created_by: dict[tuple[str, str], str] = {}
    dropped: set[tuple[str, tuple[str, str]]] = set()       # (file, table)
    pending_indexes: list[tuple[m.BatchModel, m.CreateIndex]] = []
    alters: list[tuple[m.BatchModel, m.AlterTable]] = []
    for model in with_dynamic_sql(models):
        names = [t.name for t in model.tokens]
        for statement in model.statements:
            if isinstance(statement, m.CreateTable) and not names[statement.name[-1]].startswith("#"):
                key = _key([names[i] for i in statement.name])
                relation = _relation(model, statement.name, statement.columns)
                relation.constraints = {names[c] for c in statement.constraints}
                everywhere = catalog.anywhere.setdefault(key, Relation(relation.display, {}))
                everywhere.columns.update(relation.columns)
                everywhere.constraints |= relation.constraints
                if (model.file, key) not in dropped and key not in catalog.tables:
                    catalog.tables[key] = relation
                    created_by[key] = model.file
            elif isinstance(statement, m.DropTable):
                dropped.update((model.file, _key([names[i] for i in t])) for t in statement.tables)
            elif isinstance(statement, m.AlterTable):
                alters.append((model, statement))
            elif isinstance(statement, m.CreateType):
                catalog.types.setdefault(_key([names[i] for i in statement.name]),
                                         _relation(model, statement.name, statement.columns))
            elif isinstance(statement, m.CreateProcedure):
                params = [(names[p.token], p.sql_type or _display(model, p.user_type), p.has_default)
                          for p in statement.params]
                catalog.procedures.setdefault(_key([names[i] for i in statement.name]),
                                              ProcedureInfo(_display(model, statement.name), params))
            elif isinstance(statement, m.CreateNamed):
                (catalog.roles if statement.what == "role" else catalog.schemas).add(names[statement.name])
            elif isinstance(statement, m.CreateIndex):
                pending_indexes.append((model, statement))
            elif isinstance(statement, m.Exec) and statement.procedure is not None:
                procedure = [names[i] for i in statement.procedure]
                if procedure == ["tsqlt", "newtestclass"] and statement.arguments and statement.arguments[0].literal:
                    catalog.schemas.add(fold(statement.arguments[0].literal))
                    catalog.test_classes.add(fold(statement.arguments[0].literal))
    for model, statement in pending_indexes:
        key = _key([model.tokens[i].name for i in statement.table])
        index = model.tokens[statement.name].name
        if key in catalog.anywhere:
            catalog.anywhere[key].indexes.add(index)
        if created_by.get(key) == model.file:
            catalog.tables[key].indexes.add(index)
    for model, statement in alters:
        everywhere = catalog.anywhere.get(_key([model.tokens[i].name for i in statement.table]))
        if everywhere is not None:
            everywhere.columns.update(_relation(model, statement.table, statement.columns).columns)
            everywhere.constraints.update(model.tokens[c].name for c in statement.constraints)
    for (_, name), relation in catalog.anywhere.items():
        if "leased_by" in relation.columns:
            relation.indexes.update(f"ix_{name}_{purpose}" for purpose in RETIRED_WORK_INDEXES)
    return catalog


def _relation(model: m.BatchModel, name: tuple[int, ...], columns: list[m.ColumnDef]) -> Relation:
    return Relation(_display(model, name), {model.tokens[c.token].name: c.sql_type or _display(model, c.user_type)
                                            for c in columns})


def _display(model: m.BatchModel, parts: tuple[int, ...] | None) -> str | None:
    return ".".join(model.tokens[i].raw for i in parts) if parts else None


def with_dynamic_sql(models: Iterable[m.BatchModel]) -> Iterable[m.BatchModel]:
    """The models and, after each, those of the SQL literals it runs (EXEC (N'...'))."""
    for model in models:
        yield model
        yield from with_dynamic_sql(model.dynamic_sql)


# ------------------------------------------------------------------------------------------------
# Resolution of one batch


@dataclass
class Bound:
    """A row source in scope: the name it is known by, and its columns (None: not known)."""

    exposed: str | None
    columns: dict[str, str | None] | None


@dataclass
class Scope:
    parent: "Scope | None"
    bound: list[Bound] = field(default_factory=list)


@dataclass
class Variable:
    sql_type: str | None
    columns: dict[str, str | None] | None     # a table variable's columns


@dataclass
class Signature:
    """A procedure as a caller sees it: parameters and the columns of each result set it returns."""

    file: str
    name: str
    params: list[tuple[str, str | None]]
    results: list[list[tuple[str | None, str | None]]]


@dataclass
class BatchResult:
    findings: list[Finding]
    skipped: list[Finding]
    signature: Signature | None
    schema: Schema                  # the tables as the batch leaves them


def resolve_batch(catalog: Catalog, model: m.BatchModel, rename: dict[int, str] | None = None,
                  schema: Schema | None = None) -> BatchResult:
    """Resolve every reference of one batch, against ``schema`` (the tables as the batch's file has
    left them before it; by default as created); ``rename`` gives tokens another name (a mutant)."""
    return _Resolver(catalog, model, rename or {}, schema or Schema.of(catalog)).run()


class _Resolver:
    def __init__(self, catalog: Catalog, model: m.BatchModel, rename: dict[int, str], schema: Schema) -> None:
        self.catalog, self.model = catalog, model
        self.compiled = schema              # what the batch's queries are compiled against
        self.schema = schema.copy()         # what its DDL statements see, changed as they run
        self.names = [t.name for t in model.tokens]
        self.raws = [t.raw for t in model.tokens]
        for index, new in rename.items():
            self.names[index], self.raws[index] = fold(new), new
        self.findings: list[Finding] = []
        self.skipped: list[Finding] = []
        self.variables: dict[str, Variable] = {}
        self.temps: dict[str, dict[str, str | None]] = {}
        self.ctes: list[dict[str, dict[str, str | None]]] = []
        self.signature: Signature | None = None
        self.savepoints: set[str] = set()    # SAVE TRANSACTION names seen so far in the batch

    # -- reporting -------------------------------------------------------------------------------

    def report(self, line: int, message: str) -> None:
        self.findings.append(Finding(self.model.file, line, message))

    def unresolved(self, line: int, what: str, name: str, of: str = "") -> None:
        self.report(line, f"unresolved {what} '{name}'" + (f" of {of}" if of else ""))

    def line(self, token: int) -> int:
        return self.model.tokens[token].line

    def display(self, parts: tuple[int | str, ...]) -> str:
        return ".".join(p if isinstance(p, str) else self.raws[p] for p in parts)

    def part(self, p: int | str) -> str:
        return p if isinstance(p, str) else self.names[p]

    # -- statements ------------------------------------------------------------------------------

    def run(self) -> BatchResult:
        for statement in self.model.statements:
            getattr(self, "st_" + type(statement).__name__)(statement)
        return BatchResult(self.findings, self.skipped, self.signature, self.schema)

    def st_Uses(self, s: m.Uses) -> None:
        self.refs(s.refs, Scope(None))

    def st_SetOption(self, s: m.SetOption) -> None:
        self.refs(s.refs, Scope(None))

    def st_Skipped(self, s: m.Skipped) -> None:
        self.skipped.append(Finding(self.model.file, s.line, f"statement not modelled ({s.description}); only "
                                                             "its variables were checked"))
        self.refs(s.refs, Scope(None))

    def st_Declare(self, s: m.Declare) -> None:
        self.refs(s.init, Scope(None))
        columns = None
        if s.table is not None:
            columns = self.column_defs(s.table)
            self.refs(s.table_refs, Scope(None, [Bound(None, columns)]))
        elif s.user_type is not None:
            relation = self.type(s.user_type)
            columns = relation.columns if relation else None
        name = self.names[s.variable]
        if name in self.variables:
            self.report(s.line, f"variable '{self.raws[s.variable]}' is declared twice in its batch")
        self.variables[name] = Variable(s.sql_type or self.display_or_none(s.user_type), columns)

    def display_or_none(self, parts: tuple[int, ...] | None) -> str | None:
        return self.display(parts) if parts else None

    def column_defs(self, columns: list[m.ColumnDef]) -> dict[str, str | None]:
        for column in columns:
            if column.user_type is not None:
                self.type(column.user_type)
        return {self.names[c.token]: c.sql_type or self.display_or_none(c.user_type) for c in columns}

    def st_Query(self, s: m.Query) -> None:
        outputs = self.select(s.select, None)
        if self.signature is not None and s.select.into is None and not s.select.assigns:
            self.signature.results.append(outputs)

    def st_Insert(self, s: m.Insert) -> None:
        self.ctes.append({})
        for cte in s.ctes:
            self.define_cte(cte)
        target = self.bind(s.target, None)
        for column in s.columns:
            self.column(column, Scope(None, [target]))
        if s.select is not None:
            self.select(s.select, None)
        self.refs(s.values, Scope(None))
        if s.exec is not None:
            # INSERT ... EXEC proc, or INSERT ... EXEC (N'literal') (modelled as the batch it runs)
            getattr(self, "st_" + type(s.exec).__name__)(s.exec)
        if s.output is not None:
            self.output(s.output, [Bound("inserted", target.columns)])
        self.ctes.pop()

    def dml_target(self, target: m.Source, sources: list[m.Source]) -> tuple[Bound, Scope]:
        """The bound target of UPDATE/DELETE and the scope of its statement (FROM sources, or the target)."""
        scope = Scope(None)
        for source in sources:
            scope.bound.append(self.bind(source, None))
        for source in sources:
            self.refs(source.refs, scope)
        if target.kind == "object" and len(target.name) == 1 and target.alias is None:
            exposed = self.names[target.name[0]]
            match = next((b for b in scope.bound if b.exposed == exposed), None)
            if match is not None:      # UPDATE s SET ... FROM @staged AS s
                return match, scope
        bound = self.bind(target, None)
        scope.bound.insert(0, bound)
        return bound, scope

    def st_Update(self, s: m.Update) -> None:
        self.ctes.append({})
        for cte in s.ctes:
            self.define_cte(cte)
        target, scope = self.dml_target(s.target, s.sources)
        for column, refs in s.sets:
            self.column(column, Scope(None, [target]))
            self.refs(refs, scope)
        self.refs(s.refs, scope)
        if s.output is not None:
            self.output(s.output, [Bound("inserted", target.columns), Bound("deleted", target.columns)]
                        + [b for b in scope.bound if b is not target])
        self.ctes.pop()

    def st_Delete(self, s: m.Delete) -> None:
        self.ctes.append({})
        for cte in s.ctes:
            self.define_cte(cte)
        target, scope = self.dml_target(s.target, s.sources)
        self.refs(s.refs, scope)
        if s.output is not None:
            self.output(s.output, [Bound("deleted", target.columns)] + [b for b in scope.bound if b is not target])
        self.ctes.pop()

    def st_Merge(self, s: m.Merge) -> None:
        self.ctes.append({})
        for cte in s.ctes:
            self.define_cte(cte)
        target = self.bind(s.target, None)
        using = self.bind(s.using, None) if s.using is not None else Bound(None, None)
        if s.using is not None:
            self.refs(s.using.refs, Scope(None))
        scope = Scope(None, [target, using])
        self.refs(s.refs, scope)
        for column, refs in s.sets:
            self.column(column, Scope(None, [target]))
            self.refs(refs, scope)
        for column in s.insert_columns:
            self.column(column, Scope(None, [target]))
        self.refs(s.insert_values, scope)
        if s.output is not None:
            self.output(s.output, [Bound("inserted", target.columns), Bound("deleted", target.columns), using])
        self.ctes.pop()

    def output(self, output: m.Output, pseudo: list[Bound]) -> None:
        self.refs(output.refs, Scope(None, pseudo))
        if output.into is not None:
            into = self.bind(output.into, None)
            for column in output.into_columns:
                self.column(column, Scope(None, [into]))

    def st_Exec(self, s: m.Exec) -> None:
        for argument in s.arguments:
            self.refs(argument.refs, Scope(None))
        if s.dynamic is not None:
            self.skipped.append(Finding(self.model.file, s.line, s.dynamic + ": not resolved"))
            return
        names = [self.names[i] for i in s.procedure]
        key = _key(names)
        tsqlt = {fold(name): name for name in TSQLT_PROCEDURES} if key[0] == "tsqlt" else {}
        if key[1] in tsqlt:
            params = [(fold(p), None, True) for p in TSQLT_PROCEDURES[tsqlt[key[1]]]]
            display = "tSQLt." + tsqlt[key[1]]
        elif key in SYSTEM_PROCEDURES:
            params = [(fold(p), None, True) for p in SYSTEM_PROCEDURES[key]]
            display = ".".join(key)
        elif key in self.catalog.procedures:
            info = self.catalog.procedures[key]
            params, display = info.params, info.display
        else:
            self.unresolved(s.line, "procedure", self.display(s.procedure))
            return
        by_name = {p[0]: p for p in params}
        given: set[str] = set()
        positional = [a for a in s.arguments if a.name is None]
        if len(positional) > len(params):
            self.report(s.line, f"{len(positional)} arguments for procedure '{display}', which takes {len(params)}")
        given.update(p[0] for p in params[:len(positional)])
        for argument in s.arguments:
            if argument.name is None:
                continue
            name = self.names[argument.name]
            if name not in by_name:
                self.unresolved(argument.line, "argument", self.raws[argument.name], of=f"procedure '{display}'")
                continue
            given.add(name)
            if key[0] == "tsqlt" and (key[1], name) in TSQLT_TABLE_ARGUMENTS and argument.literal is not None:
                self.name_in_string(m.NameInString("table", argument.literal, argument.line))
        if key[0] == "tsqlt" and key[1] == "applyconstraint":
            named = {self.names[a.name]: a for a in s.arguments if a.name is not None}
            table, constraint = named.get("@tablename"), named.get("@constraintname")
            if table is not None and constraint is not None and table.literal and constraint.literal:
                self.name_in_string(m.NameInString("constraint", constraint.literal, constraint.line, table.literal))
        missing = [p[0] for p in params if not p[2] and p[0] not in given]
        for name in missing:
            self.report(s.line, f"missing argument '{name}' of procedure '{display}' (it has no default)")

    def st_CreateTable(self, s: m.CreateTable) -> None:
        name = self.names[s.name[-1]]
        columns = self.column_defs(s.columns)
        if name.startswith("#"):
            self.temps[name] = columns
        else:
            self.schema_of(s.name)
            self.schema.create(self.key(s.name), Relation(self.display(s.name), columns,
                                                          {self.names[c] for c in s.constraints}))
        self.refs(s.refs, Scope(None, [Bound(None, columns)]))

    def st_CreateType(self, s: m.CreateType) -> None:
        self.schema_of(s.name)
        self.refs(s.refs, Scope(None, [Bound(None, self.column_defs(s.columns))]))

    def st_CreateIndex(self, s: m.CreateIndex) -> None:
        table = self.table(s.table, ddl=True)
        columns = {**self.asserted(s.table, s.asserted), **table.columns} if table is not None else None
        scope = Scope(None, [Bound(None, columns)])
        for column in s.columns:
            self.column(column, scope)
        self.refs(s.refs, scope)
        if self.key(s.table) in self.schema.tables:
            self.schema.changing(self.key(s.table)).indexes.add(self.names[s.name])

    def st_AlterTable(self, s: m.AlterTable) -> None:
        added = self.column_defs(s.columns)
        key = self.key(s.table)
        if self.table(s.table, ddl=True) is None or key not in self.schema.tables:
            self.refs(s.refs, Scope(None, [Bound(None, None)]))
            return
        table = self.schema.changing(key)
        table.columns.update(added)
        table.constraints.update(self.names[c] for c in s.constraints)
        asserted = self.asserted(s.table, s.asserted)
        self.refs(s.refs, Scope(None, [Bound(None, {**asserted, **table.columns})]))
        everywhere = self.catalog.anywhere.get(key)
        for token in s.dropped_columns:
            name = self.names[token]
            if name in table.columns:
                del table.columns[name]
            elif name not in asserted and not (s.if_exists and everywhere and name in everywhere.columns):
                self.unresolved(self.line(token), "column", self.raws[token], of=f"table '{table.display}'")
        for token in s.dropped_constraints:
            name = self.names[token]
            if name in table.constraints:
                table.constraints.discard(name)
            elif not (s.if_exists and everywhere and name in everywhere.constraints):
                self.unresolved(self.line(token), "constraint", self.raws[token], of=f"table '{table.display}'")

    def asserted(self, table: tuple[int, ...], asserted: tuple[tuple[str, str], ...]) -> dict[str, str | None]:
        """The columns of ``table`` that enclosing COL_LENGTH(...) IS NOT NULL guards assert (if some
        file gives the table that column: a guard naming none is reported where it probes)."""
        key = self.key(table)
        everywhere = self.catalog.anywhere.get(key)
        return {fold(column): None for text, column in asserted
                if _key([fold(p) for p in split_name(text)]) == key and everywhere is not None
                and fold(column) in everywhere.columns}

    def st_DropIndex(self, s: m.DropIndex) -> None:
        table = self.table(s.table, ddl=True)
        if table is None:
            return
        key, name = self.key(s.table), self.names[s.index]
        everywhere = self.catalog.anywhere.get(key)
        if name in table.indexes and key in self.schema.tables:
            self.schema.changing(key).indexes.discard(name)
        elif not (s.if_exists and everywhere and name in everywhere.indexes):
            self.unresolved(self.line(s.index), "index", self.raws[s.index], of=f"table '{table.display}'")

    def st_DropTable(self, s: m.DropTable) -> None:
        for name in s.tables:
            key = self.key(name)
            if key in self.schema.tables:
                self.schema.drop(key)
            elif not (s.if_exists and key in self.catalog.anywhere):
                self.unresolved(self.line(name[0]), "table", self.display(name))

    def st_CreateProcedure(self, s: m.CreateProcedure) -> None:
        self.schema_of(s.name)
        params = []
        for p in s.params:
            columns = None
            if p.user_type is not None:
                relation = self.type(p.user_type)
                columns = relation.columns if relation else None
            self.variables[self.names[p.token]] = Variable(p.sql_type or self.display(p.user_type), columns)
            params.append((self.names[p.token], p.sql_type or self.display_or_none(p.user_type)))
        self.signature = Signature(self.model.file, self.display(s.name), params, [])

    def st_CreateNamed(self, s: m.CreateNamed) -> None:
        if s.owner is not None and self.names[s.owner] not in self.catalog.roles:
            self.unresolved(self.line(s.owner), "role", self.raws[s.owner])

    def st_Grant(self, s: m.Grant) -> None:
        names = [self.names[i] for i in s.name]
        if s.securable == "TYPE":
            self.type(s.name)
        elif s.securable == "SCHEMA":
            if names and names[-1] not in self.catalog.schemas:
                self.unresolved(s.line, "schema", self.display(s.name))
        elif names and _key(names) not in self.catalog.procedures and _key(names) not in self.catalog.tables:
            self.unresolved(s.line, "object", self.display(s.name))
        for role in s.roles:
            if self.names[role] not in self.catalog.roles:
                self.unresolved(self.line(role), "role", self.raws[role])

    def st_Owner(self, s: m.Owner) -> None:
        names = [self.names[i] for i in s.name]
        if _key(names) not in self.catalog.procedures and _key(names) not in self.catalog.tables:
            self.unresolved(s.line, "object", self.display(s.name))
        if self.names[s.principal] not in self.catalog.roles:
            self.unresolved(self.line(s.principal), "role", self.raws[s.principal])

    def st_DropNamed(self, s: m.DropNamed) -> None:
        names = [self.names[i] for i in s.name]
        if s.what == "schema":
            if names[-1] not in self.catalog.schemas:
                self.unresolved(s.line, "schema", self.display(s.name))
        elif _key(names) not in self.catalog.procedures:
            self.unresolved(s.line, "procedure", self.display(s.name))

    def st_Savepoint(self, s: m.Savepoint) -> None:
        if s.saves:
            self.savepoints.add(self.names[s.name])
        elif self.names[s.name] not in self.savepoints:
            self.unresolved(self.line(s.name), "savepoint", self.raws[s.name])

    def st_RoleMembers(self, s: m.RoleMembers) -> None:
        for principal in s.principals:
            if self.names[principal] not in self.catalog.roles:
                self.unresolved(self.line(principal), "role", self.raws[principal])

    def st_TableUse(self, s: m.TableUse) -> None:
        table = self.table(s.table, ddl=True)
        if table is not None and s.index is not None and self.names[s.index] not in table.indexes | table.constraints:
            self.unresolved(self.line(s.index), "index", self.raws[s.index], of=f"table '{table.display}'")

    # -- names -----------------------------------------------------------------------------------

    def schema_of(self, name: tuple[int, ...]) -> None:
        if len(name) >= 2 and self.names[name[-2]] not in self.catalog.schemas:
            self.unresolved(self.line(name[-2]), "schema", self.raws[name[-2]])

    def key(self, name: tuple[int, ...]) -> tuple[str, str]:
        return _key([self.names[i] for i in name])

    def table(self, name: tuple[int, ...], ddl: bool = False) -> Relation | None:
        """A table as a DDL statement sees it (changed by the statements above it), or as a query is
        compiled against it (as the batch began; a table the batch creates, when the query runs)."""
        key = self.key(name)
        relation = (self.compiled if key in self.compiled.tables and not ddl else self.schema).tables.get(key)
        if relation is None and key in SYSTEM_TABLES:
            relation = Relation(".".join(key), dict(SYSTEM_TABLES[key]))
        if relation is None:
            self.unresolved(self.line(name[0]), "table", self.display(name))
        return relation

    def type(self, name: tuple[int, ...]) -> Relation | None:
        relation = self.catalog.types.get(_key([self.names[i] for i in name]))
        if relation is None and len(name) == 1 and self.names[name[0]] in SYSTEM_TYPES:
            return None
        if relation is None:
            self.unresolved(self.line(name[0]), "type", self.display(name))
        return relation

    def bind(self, source: m.Source, outer: Scope | None) -> Bound:
        """A row source in scope. Derived tables see the enclosing query's scopes, not their siblings."""
        exposed = self.names[source.alias] if source.alias is not None else None
        if source.kind == "variable":
            name = self.names[source.name[0]]
            variable = self.variables.get(name)
            if variable is None:
                self.unresolved(self.line(source.name[0]), "variable", self.raws[source.name[0]])
                return Bound(exposed or name, None)
            if variable.columns is None:
                self.report(self.line(source.name[0]), f"variable '{self.raws[source.name[0]]}' is not a table")
            return Bound(exposed or name, variable.columns)
        if source.kind == "object":
            names = [self.names[i] for i in source.name]
            exposed = exposed or names[-1]
            if len(names) == 1:
                for level in reversed(self.ctes):
                    if names[0] in level:
                        return Bound(exposed, level[names[0]])
                if names[0].startswith("#"):
                    if names[0] not in self.temps:
                        self.unresolved(self.line(source.name[0]), "table", self.raws[source.name[0]])
                        return Bound(exposed, None)
                    return Bound(exposed, self.temps[names[0]])
            relation = self.table(source.name)
            return Bound(exposed, relation.columns if relation else None)
        if source.kind == "derived":
            outputs = self.select(source.query, outer)
            return Bound(exposed, self.named_columns(source.columns, outputs))
        if source.kind == "values":
            self.refs(source.refs, Scope(outer))
            return Bound(exposed, {self.names[c]: None for c in source.columns})
        # A table-valued function: OPENJSON ... WITH declares its columns, others are not known.
        if source.columns:
            types = list(source.column_types) + [None] * len(source.columns)
            return Bound(exposed, {self.names[c]: t for c, t in zip(source.columns, types)})
        return Bound(exposed, None)

    def named_columns(self, aliases: tuple[int, ...], outputs: list[tuple[str | None, str | None]]):
        if aliases:
            return {self.names[a]: (outputs[i][1] if i < len(outputs) else None) for i, a in enumerate(aliases)}
        return {name: sql_type for name, sql_type in outputs if name is not None}

    def define_cte(self, cte: m.Cte) -> None:
        outputs = self.select(cte.query, None)
        self.ctes[-1][self.names[cte.name]] = self.named_columns(cte.columns, outputs)

    def select(self, select: m.Select, outer: Scope | None) -> list[tuple[str | None, str | None]]:
        self.ctes.append({})
        for cte in select.ctes:
            self.define_cte(cte)
        scope = Scope(outer)
        for source in select.sources:
            scope.bound.append(self.bind(source, outer))
        for source in select.sources:
            if source.kind == "function":      # CROSS APPLY OPENJSON(x.col): sees the sources before it
                self.refs(source.refs, scope)
        self.refs(select.refs, scope)
        outputs: list[tuple[str | None, str | None]] = []
        for item in select.items:
            if item.star is not None:
                outputs.extend(self.star(item, scope))
                continue
            if item.alias is not None:
                name = self.names[item.alias]
            elif item.column is not None and isinstance(item.column.parts[-1], int):
                name = self.names[item.column.parts[-1]]
            else:
                name = None
            outputs.append((name, self.hint_type(item.type, scope)))
        order_scope = Scope(scope, [Bound(None, {n: t for n, t in outputs if n is not None})])
        self.refs(select.order_by, order_scope)
        for union in select.unions:
            self.select(union, outer)
        if select.into is not None:
            into = select.into
            name = self.names[into.name[-1]] if into.kind == "object" else None
            if name is not None and name.startswith("#") and len(into.name) == 1:
                self.temps[name] = {n: t for n, t in outputs if n is not None}
            else:
                self.bind(into, None)
        self.ctes.pop()
        return outputs

    def star(self, item: m.Item, scope: Scope) -> list[tuple[str | None, str | None]]:
        chosen = scope.bound
        if item.star:
            qualifier = self.names[item.star[-1]]
            chosen = [b for b in scope.bound if b.exposed == qualifier]
            if not chosen:
                self.unresolved(item.line, "alias", self.raws[item.star[-1]])
        return [(n, t) for b in chosen if b.columns for n, t in b.columns.items()]

    # -- references ------------------------------------------------------------------------------

    def refs(self, refs: list[m.Ref], scope: Scope) -> None:
        for ref in refs:
            if isinstance(ref, m.ColumnRef):
                self.column(ref, scope)
            elif isinstance(ref, m.VariableRef):
                if self.names[ref.token] not in self.variables:
                    self.unresolved(self.line(ref.token), "variable", self.raws[ref.token])
            elif isinstance(ref, m.Subquery):
                self.select(ref.select, scope)
            elif isinstance(ref, m.FunctionRef):
                if self.names[ref.token].upper() not in BUILTIN_FUNCTIONS:
                    self.unresolved(self.line(ref.token), "function", self.raws[ref.token])
            elif isinstance(ref, m.TypeRef):
                self.type(ref.parts)
            elif isinstance(ref, m.CollationRef):
                if self.names[ref.token] not in COLLATIONS:
                    self.unresolved(self.line(ref.token), "collation", self.raws[ref.token])
            elif isinstance(ref, m.NameInString):
                self.name_in_string(ref)
            elif isinstance(ref, m.Dynamic):
                self.skipped.append(Finding(self.model.file, ref.line, ref.description + ": not resolved"))

    def column(self, ref: m.ColumnRef, scope: Scope, report: bool = True) -> str | None:
        """Resolve a column reference; its type if known. Unknown sources (unresolved) pass silently."""
        parts = [self.part(p) for p in ref.parts]
        column = parts[-1]
        level: Scope | None = scope
        if len(parts) == 1:
            while level is not None:
                if any(b.columns is None for b in level.bound):
                    return None
                for bound in level.bound:
                    if column in bound.columns:
                        return bound.columns[column]
                level = level.parent
            if report:
                self.unresolved(ref.line, "column", self.display(ref.parts))
            return None
        qualifier = parts[-2]
        while level is not None:
            for bound in level.bound:
                if bound.exposed == qualifier:
                    if bound.columns is None:
                        return None
                    if column in bound.columns:
                        return bound.columns[column]
                    if report:
                        self.unresolved(ref.line, "column", self.display(ref.parts))
                    return None
            level = level.parent
        if report:
            self.unresolved(ref.line, "alias", self.display(ref.parts[-2:-1]))
        return None

    def name_in_string(self, ref: m.NameInString) -> None:
        """A name in a string, looked up when the statement runs: against everything any file
        creates or adds (see the module's docstring)."""
        parts = [fold(p) for p in split_name(ref.text)]
        anywhere = self.catalog.anywhere
        if ref.what == "table":
            if len(parts) == 1 and parts[0].startswith("#"):
                found = parts[0] in self.temps
            else:
                found = _key(parts) in anywhere or _key(parts) in SYSTEM_TABLES
        elif ref.what == "type":
            found = _key(parts) in self.catalog.types or (len(parts) == 1 and parts[0] in SYSTEM_TYPES)
        elif ref.what == "schema":
            found = parts[-1] in self.catalog.schemas
        elif ref.what == "role":
            found = parts[-1] in self.catalog.roles
        elif ref.what == "procedure":
            found = _key(parts) in self.catalog.procedures
        elif ref.what == "object":
            found = any(_key(parts) in known for known in (anywhere, self.catalog.procedures, self.catalog.types))
        elif ref.table is None:     # a constraint: of any table of its schema
            schema = _key(parts)[0]
            found = any(key[0] == schema and parts[-1] in relation.constraints for key, relation in anywhere.items())
        else:                       # a constraint, column or index of a table (an unknown table is reported already)
            table = anywhere.get(_key([fold(p) for p in split_name(ref.table)]))
            names = {"constraint": table.constraints, "column": table.columns,
                     "index": table.indexes | table.constraints}[ref.what] if table is not None else None
            found = names is None or parts[-1] in names
            if not found:
                self.unresolved(ref.line, ref.what, ref.text, of=f"table '{ref.table}'")
                return
        if not found:
            self.unresolved(ref.line, ref.what, ref.text)

    def hint_type(self, hint: m.TypeHint, scope: Scope) -> str | None:
        if hint is None:
            return None
        what, value = hint
        if what == "column":
            return self.column(value, scope, report=False) if value is not None else None
        if what == "variable":
            variable = self.variables.get(self.names[value]) if value is not None else None
            return variable.sql_type if variable else None
        if what == "type":
            return value
        if what == "function":
            return BUILTIN_FUNCTIONS.get(value)
        for option in value:   # "first": the first operand whose type is known
            found = self.hint_type(option, scope)
            if found is not None:
                return found
        return None


# ------------------------------------------------------------------------------------------------
# Files


@dataclass(frozen=True)
class BatchAnalysis:
    """What one batch yields, computed where it was parsed (a worker process)."""

    model: m.BatchModel | None
    violations: tuple[Violation, ...]
    claims: tuple[Claim, ...]
    error: Finding | None
    reads: tuple[tsqlrules.PinnedRead, ...] = ()
    indexes: tuple[tsqlrules.IndexKey, ...] = ()


def analyse_batch(item: tuple[str, int, str]) -> BatchAnalysis:
    file, first_line, text = item
    try:
        tree = parse_batch(text)
    except TsqlParseError as exc:
        return BatchAnalysis(None, (), (), Finding(file, first_line + exc.line - 1, str(exc).split(": ", 1)[1]))
    model = m.extract(tree, file, first_line, parse=parse_batch)
    violations, claims, reads, indexes = tsqlrules.check_batch(tree, file, first_line)
    return BatchAnalysis(model, tuple(violations), tuple(claims), None, tuple(reads), tuple(indexes))


_ANALYSES: dict[tuple[str, int, str], BatchAnalysis] = {}
# A run that parsed this many batches saves what it knows (a few edited batches are not worth a
# rewrite of the whole file: the mutation tests parse one batch at a time).
SAVE_AFTER_PARSING = 50
# A saved analysis no run has used for this long is dropped (file names that come and go: a
# temporary folder checked once).
FORGET_AFTER_SECONDS = 7 * 24 * 3600
# TABLEQUEUE_CHECK_TSQL_CACHE=off parses everything in every run and keeps nothing.
CACHE_SWITCH = "TABLEQUEUE_CHECK_TSQL_CACHE"
_READ_FILES: set[str] = set()
_USED: set[tuple[str, int, str]] = set()
_LAST_USED: dict[tuple[str, int, str], float] = {}
_LOADED = False


def _code_digest() -> str:
    digest = hashlib.sha256()
    for module in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(module.name.encode("utf-8") + b"\0" + module.read_bytes())
    return digest.hexdigest()


# The code this process imported (read now, not when it saves: an edit or a pull during a run must
# not give the old code's analyses the new code's name).
_IMPORTED_CODE = _code_digest()


def _checker_fingerprint(code: str = _IMPORTED_CODE) -> str:
    """Everything an analysis depends on besides its batch: this package's code, the parser's
    effective configuration (every config file sqlfluff read, as _linter holds it), the versions of
    sqlfluff, its optional Rust parser, its regex engine and plugins, and the Python that ran it."""
    digest = hashlib.sha256(f"{sys.version_info!r}\0{code}".encode("utf-8"))
    digest.update(json.dumps(tsqltree._linter().config._configs, sort_keys=True, default=_stable_name).encode("utf-8"))
    for distribution in ("sqlfluff", "sqlfluffrs", "regex"):
        try:
            digest.update(f"{distribution}={metadata.version(distribution)}".encode("utf-8"))
        except metadata.PackageNotFoundError:
            digest.update(f"{distribution}=none".encode("utf-8"))
    for plugin in sorted(str(e) for e in metadata.entry_points(group="sqlfluff")):
        digest.update(plugin.encode("utf-8"))
    return digest.hexdigest()[:32]


def _stable_name(value: object) -> str:
    """A configuration value JSON cannot hold (the dialect and templater objects) by its class and
    name: the same in every process (a repr names a memory address)."""
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}:{getattr(value, 'name', '')}"


@functools.cache
def _saved_analyses_path() -> Path | None:
    """Where a checkout keeps the analyses of earlier runs: `make test` runs check-tsql in `make lint`
    and then again in pytest over the same renders, and parsing is most of either. Named once per
    process, before it parses anything, by the checker that then runs (``_checker_fingerprint``): a
    changed input starts a new file, never reuses an old analysis. None for an installed package (no
    checkout, nowhere of its own to write) and when the cache is switched off."""
    root = checkout_root()
    if root is None or os.environ.get(CACHE_SWITCH, "").lower() in ("off", "0", "no", "false"):
        return None
    return root / "build" / "check-tsql-cache" / f"{_checker_fingerprint()}.pickle"


def _load_saved_analyses() -> None:
    """Once per process: what this process parses after that it knows already."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    path = _saved_analyses_path()
    if path is None or not path.is_file():
        return
    try:
        with path.open("rb") as saved:
            entries = pickle.load(saved)
        _ANALYSES.update({key: analysis for key, (analysis, _) in entries.items() if key not in _ANALYSES})
        _LAST_USED.update({key: used for key, (_, used) in entries.items()})
    except Exception:  # noqa: BLE001 - a damaged or foreign file only costs a parse
        return


def _save_analyses() -> None:
    path = _saved_analyses_path()
    # Not when the code or the configuration changed under this run: its analyses were made by the
    # checker it started with, and must not be saved under the name of another.
    if path is None or _checker_fingerprint(_code_digest()) != path.stem:
        return
    now = time.time()
    # A file this process read keeps only the batches it has now (an edited file's old batches
    # go); the analyses of files it did not read stay for the run that reads them, for a while.
    kept = {key: (analysis, now if key in _USED else _LAST_USED.get(key, now))
            for key, analysis in _ANALYSES.items()
            if key in _USED or (key[0] not in _READ_FILES and now - _LAST_USED.get(key, now) < FORGET_AFTER_SECONDS)}
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for other in (*path.parent.glob("*.pickle"), *path.parent.glob("*.part")):
            # another checker's file (another virtualenv on this checkout) is left for a day
            with contextlib.suppress(OSError):
                if other != path and now - other.stat().st_mtime > 24 * 3600:
                    other.unlink()
        fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".part")
        with os.fdopen(fd, "wb") as out:
            pickle.dump(kept, out, protocol=pickle.HIGHEST_PROTOCOL)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)     # whole or not at all, for a concurrent reader
        temporary = None
    except OSError:
        pass        # a read-only checkout: the next run parses again
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def analyse(sources: Iterable[tuple[str, str]]) -> tuple[list[BatchAnalysis], list[Finding]]:
    """Every batch of every (file name, text), parsed once per process and text (and, in a checkout,
    once per change of code or text: ``_saved_analyses_path``); GO errors apart."""
    items: list[tuple[str, int, str]] = []
    errors: list[Finding] = []
    sources_read = list(sources)
    for file, text in sources_read:
        try:
            items.extend((file, batch.line, batch.text) for batch in split_batches(text))
        except GoSplitError as exc:
            errors.append(Finding(file, exc.line, str(exc).split(": ", 1)[1]))
    keys = [(file, line, hashlib.sha256(text.encode("utf-8")).hexdigest()) for file, line, text in items]
    _READ_FILES.update(file for file, _ in sources_read)
    _USED.update(keys)
    if any(key not in _ANALYSES for key in keys):
        _load_saved_analyses()
    todo = [(key, item) for key, item in zip(keys, items) if key not in _ANALYSES]
    for (key, _), analysis in zip(todo, map_batches(analyse_batch, [item for _, item in todo],
                                                    size=lambda item: len(item[2]))):
        _ANALYSES[key] = analysis
    if len(todo) >= SAVE_AFTER_PARSING:
        _save_analyses()
    return [_ANALYSES[key] for key in keys], errors


@dataclass
class Report:
    files: int
    batches: list[BatchAnalysis]
    catalog: Catalog
    findings: list[Finding]         # unresolved references and unreadable SQL
    violations: list[Violation]     # the static rules
    skipped: list[Finding]          # references known only at run time, statements not modelled
    signatures: list[Signature]
    resolved: list[tuple[m.BatchModel, Schema]]    # every batch (EXEC'd literals too), and the tables it began with

    @property
    def models(self) -> list[m.BatchModel]:
        return [b.model for b in self.batches if b.model is not None]

    @property
    def clean(self) -> bool:
        return not self.findings and not self.violations


def check_sources(sources: list[tuple[str, str]], python: Iterable[Path] = ()) -> Report:
    """check-tsql over in-memory T-SQL files, (file name, text), and the SQL strings of Python modules."""
    python = list(python)
    batches, findings = analyse(sources)
    models = [b.model for b in batches if b.model is not None]
    findings.extend(b.error for b in batches if b.error is not None)
    catalog = build_catalog(models)
    skipped: list[Finding] = []
    signatures: list[Signature] = []
    resolved: list[tuple[m.BatchModel, Schema]] = []
    by_file: dict[str, list[m.BatchModel]] = {}
    for model in models:
        by_file.setdefault(model.file, []).append(model)
    for file_models in by_file.values():
        schema = Schema.of(catalog)
        for model in file_models:
            # A procedure's body changes the schema when it runs, not when the file is applied.
            runs_now = not any(isinstance(s, m.CreateProcedure) for s in model.statements)
            current = schema
            for batch in with_dynamic_sql([model]):
                result = resolve_batch(catalog, batch, schema=current)
                resolved.append((batch, current))
                current = result.schema
                findings.extend(result.findings)
                skipped.extend(result.skipped)
                if result.signature is not None:
                    signatures.append(result.signature)
            if runs_now:
                schema = current
    violations = [v for b in batches for v in b.violations if not _in_test_class(v, catalog)]
    for file_models in by_file.values():
        violations.extend(tsqlrules.check_file(file_models, catalog.test_classes))
    reads = [r for b in batches for r in b.reads]
    pins = tsqlrules.check_pins(reads, [i for b in batches for i in b.indexes])
    violations.extend(v for v in pins if not _in_test_class(v, catalog))
    violations.extend(tsqlrules.check_fakes(models, reads, catalog.test_classes))
    violations.extend(tsqlrules.check_python(python))
    return Report(len(sources) + len(python), batches, catalog, findings, violations, skipped, signatures, resolved)


def _in_test_class(violation: Violation, catalog: Catalog) -> bool:
    if violation.rule not in tsqlrules.PROCEDURE_RULE_NAMES or violation.procedure is None:
        return False
    parts = split_name(violation.procedure)
    return len(parts) == 2 and fold(parts[0]) in catalog.test_classes


def source_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(T-SQL files, Python modules) named, or found in the given directories (*.sql, *.py), sorted.
    FileNotFoundError for a path that does not exist."""
    sql: list[Path] = []
    python: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            sql.extend(sorted(path.glob("*.sql")))
            python.extend(sorted(path.glob("*.py")))
        elif path.is_file():
            (python if path.suffix == ".py" else sql).append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    return sql, python


def check_paths(paths: Iterable[str | Path]) -> Report:
    sql, python = source_files(paths)
    return check_sources([(str(f), f.read_text(encoding="utf-8-sig")) for f in sql], python)
