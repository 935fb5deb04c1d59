"""What one T-SQL batch declares and references: the model that `check-tsql` resolves.

The sqlfluff tree is read once into this model; resolving it (tsqlcheck) never touches the tree
again. Every identifier the model uses is a ``Token`` (with its line and its offset in the batch), and
the model refers to tokens by index, so a name can be swapped for another (``names`` in tsqlcheck)
and the model resolved again: the same as renaming that identifier in the text and parsing anew,
without the parse. Identifiers of the tree that the model does not use are listed (``unclaimed``),
so what the resolver does not check is visible rather than silently passed.

Control flow is flattened: variables are scoped to the batch in T-SQL and must be declared above
their first use in the text, whatever block they sit in, so IF/WHILE/TRY bodies are simply the
statements in text order. One condition is kept with the statements it guards: a DDL statement in
the THEN branch of ``IF COL_LENGTH(N'<table>', N'<column>') IS NOT NULL`` carries that (table,
column) as ``asserted`` (a migration that drops a column only where it still exists).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from sqlfluff.core.parser import BaseSegment

from .tsqltree import (child, children, code, conjuncts, descendants, fold, keywords, kind, line_of, normalised,
                       offset_of, string_value)

# Leaf types that are identifiers: every one of them is either used by the model or listed as unclaimed.
IDENTIFIER_LEAVES = ("naked_identifier", "quoted_identifier", "parameter", "hash_identifier",
                     "function_name_identifier", "data_type_identifier")

# Functions whose first argument, written as a string, names an object: what it names is resolved.
# COL_LENGTH's second argument names a column of that table; OBJECT_ID's second, the object's type
# (OBJECT_TYPES); INDEXPROPERTY(OBJECT_ID(N'<table>'), N'<index>', ...) names an index of that table.
NAMING_FUNCTIONS = {"OBJECT_ID": "table", "TYPE_ID": "type", "SCHEMA_ID": "schema",
                    "DATABASE_PRINCIPAL_ID": "role", "COL_LENGTH": "table", "INDEX_COL": "table"}
# OBJECT_ID(N'<name>', N'<type>'): what the type code makes of the name (U, or no type: a table).
OBJECT_TYPES = {"U": "table", "P": "procedure", "D": "constraint", "C": "constraint", "F": "constraint",
                "PK": "constraint", "UQ": "constraint"}


@dataclass
class Token:
    raw: str
    name: str          # folded: unquoted and case-folded (identifiers compare case-insensitively)
    line: int          # line in the file
    start: int         # offset in the batch text
    end: int
    what: str          # column, table, alias, variable, type, procedure, argument, function, role, ...
    declares: bool     # a declaration (CREATE, DECLARE, AS alias) rather than a reference


# ------------------------------------------------------------------------------------------------
# References (resolved in the scope of the statement that holds them)


@dataclass(eq=False)
class ColumnRef:
    parts: tuple[Union[int, str], ...]   # token indexes; a str is a pseudo-table keyword (inserted/deleted)
    line: int


@dataclass(eq=False)
class VariableRef:
    token: int


@dataclass(eq=False)
class FunctionRef:
    token: int


@dataclass(eq=False)
class TypeRef:
    parts: tuple[int, ...]


@dataclass(eq=False)
class CollationRef:
    token: int


@dataclass(eq=False)
class NameInString:
    """An object named by a string literal: OBJECT_ID(N'[s].[t]'), tSQLt.FakeTable @TableName = N'...'."""

    what: str          # table, type, schema, role, procedure; constraint, column, index (of ``table``;
                       # a constraint without a table: of any table of its schema)
    text: str
    line: int
    table: str | None = None


@dataclass(eq=False)
class Dynamic:
    """A reference that is only known at run time (EXEC @name, OBJECT_ID(@name)): reported as skipped."""

    line: int
    description: str


@dataclass(eq=False)
class Subquery:
    select: "Select"


Ref = Union[ColumnRef, VariableRef, FunctionRef, TypeRef, CollationRef, NameInString, Dynamic, Subquery]

# A result column's type, as far as it can be read without a server: ("column", ColumnRef),
# ("variable", token), ("type", "bigint"), ("function", "SYSUTCDATETIME"), ("first", [hints]) or None.
TypeHint = Union[tuple, None]


@dataclass(eq=False)
class Item:
    """One element of a select list."""

    alias: int | None
    column: ColumnRef | None       # a bare column reference names the output column when there is no alias
    star: tuple[int, ...] | None   # SELECT * (()) or t.* ((t,))
    type: TypeHint
    line: int


@dataclass(eq=False)
class Source:
    """A row source: FROM/JOIN element, DML target, INTO target, MERGE USING."""

    kind: str                       # object (table, view, CTE, #temp), variable, derived, values, function
    name: tuple[int, ...] = ()
    alias: int | None = None
    query: "Select | None" = None
    columns: tuple[int, ...] = ()   # column aliases: AS v (a, b), OPENJSON ... WITH (a int)
    column_types: tuple[str, ...] = ()
    refs: list[Ref] = field(default_factory=list)   # VALUES rows, function arguments
    line: int = 0


@dataclass(eq=False)
class Cte:
    name: int
    columns: tuple[int, ...]
    query: "Select"


@dataclass(eq=False)
class Select:
    line: int
    ctes: list[Cte] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    refs: list[Ref] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    order_by: list[Ref] = field(default_factory=list)
    into: Source | None = None
    assigns: bool = False           # SELECT @x = ...: no result set
    unions: list["Select"] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# Statements (flattened, in text order)


@dataclass(eq=False)
class ColumnDef:
    token: int
    sql_type: str | None            # lower case, as written: bigint, nvarchar(max), datetime2(7)
    user_type: tuple[int, ...] | None = None


@dataclass(eq=False)
class Param:
    token: int
    sql_type: str | None
    user_type: tuple[int, ...] | None
    has_default: bool
    readonly: bool
    output: bool


@dataclass(eq=False)
class Statement:
    line: int


@dataclass(eq=False)
class Uses(Statement):
    """References outside any row source: conditions, SET @x = ..., THROW, RETURN, PRINT."""

    refs: list[Ref]


@dataclass(eq=False)
class SetOption(Statement):
    text: str                       # normalised: SET ANSI_NULLS ON
    refs: list[Ref]


@dataclass(eq=False)
class Declare(Statement):
    variable: int
    sql_type: str | None
    user_type: tuple[int, ...] | None
    table: list[ColumnDef] | None
    init: list[Ref]
    table_refs: list[Ref]           # a table variable's key columns, CHECK and DEFAULT expressions


@dataclass(eq=False)
class Query(Statement):
    select: Select


@dataclass(eq=False)
class Output:
    refs: list[Ref]
    into: Source | None
    into_columns: list[ColumnRef]


@dataclass(eq=False)
class Exec(Statement):
    procedure: tuple[int, ...] | None
    arguments: list["Argument"]
    dynamic: str | None = None      # a procedure named by a variable


@dataclass(eq=False)
class Argument:
    name: int | None
    refs: list[Ref]
    literal: str | None             # the argument's value when it is a string literal
    line: int


@dataclass(eq=False)
class Insert(Statement):
    ctes: list[Cte]
    target: Source
    columns: list[ColumnRef]
    select: Select | None
    values: list[Ref]
    exec: Exec | None
    output: Output | None


@dataclass(eq=False)
class Update(Statement):
    ctes: list[Cte]
    target: Source
    sources: list[Source]
    sets: list[tuple[ColumnRef, list[Ref]]]
    refs: list[Ref]
    output: Output | None


@dataclass(eq=False)
class Delete(Statement):
    ctes: list[Cte]
    target: Source
    sources: list[Source]
    refs: list[Ref]
    output: Output | None


@dataclass(eq=False)
class Merge(Statement):
    ctes: list[Cte]
    target: Source
    using: Source
    refs: list[Ref]
    sets: list[tuple[ColumnRef, list[Ref]]]
    insert_columns: list[ColumnRef]
    insert_values: list[Ref]
    output: Output | None


@dataclass(eq=False)
class CreateTable(Statement):
    name: tuple[int, ...]
    columns: list[ColumnDef]
    refs: list[Ref]                 # CHECK, DEFAULT and computed expressions, key columns
    constraints: list[int]


@dataclass(eq=False)
class CreateType(Statement):
    name: tuple[int, ...]
    columns: list[ColumnDef]
    refs: list[Ref]


@dataclass(eq=False)
class CreateIndex(Statement):
    name: int
    table: tuple[int, ...]
    columns: list[ColumnRef]
    refs: list[Ref]
    asserted: tuple[tuple[str, str], ...] = ()


@dataclass(eq=False)
class AlterTable(Statement):
    """ALTER TABLE t ADD columns and constraints / DROP [COLUMN | CONSTRAINT] [IF EXISTS] names."""

    table: tuple[int, ...]
    columns: list[ColumnDef]            # added
    constraints: list[int]              # added (declarations)
    dropped_columns: list[int]          # references
    dropped_constraints: list[int]      # references
    if_exists: bool
    refs: list[Ref]                     # DEFAULT and CHECK expressions, FOR column, key columns
    asserted: tuple[tuple[str, str], ...] = ()   # (table, column) strings of IF COL_LENGTH(...) IS NOT NULL


@dataclass(eq=False)
class DropIndex(Statement):
    index: int
    table: tuple[int, ...]
    if_exists: bool


@dataclass(eq=False)
class DropTable(Statement):
    tables: list[tuple[int, ...]]
    if_exists: bool


@dataclass(eq=False)
class CreateProcedure(Statement):
    name: tuple[int, ...]
    params: list[Param]


@dataclass(eq=False)
class CreateNamed(Statement):
    """CREATE ROLE / CREATE SCHEMA, with the principal that owns it."""

    what: str                       # role | schema
    name: int
    owner: int | None


@dataclass(eq=False)
class Grant(Statement):
    permission: str                 # EXECUTE, SELECT, ...
    securable: str                  # OBJECT | TYPE | SCHEMA
    name: tuple[int, ...]
    roles: list[int]


@dataclass(eq=False)
class Owner(Statement):
    """ALTER AUTHORIZATION ON OBJECT::x TO p: the object must exist and p be a principal."""

    name: tuple[int, ...]
    principal: int


@dataclass(eq=False)
class TableUse(Statement):
    """A statement about a table that reads no rows: SET IDENTITY_INSERT, ALTER INDEX ... ON."""

    table: tuple[int, ...]
    index: int | None = None


@dataclass(eq=False)
class DropNamed(Statement):
    """DROP PROCEDURE / DROP SCHEMA: what it names must exist (tSQLt clean-ups drop their doubles)."""

    what: str                       # procedure | schema
    name: tuple[int, ...]


@dataclass(eq=False)
class Savepoint(Statement):
    """SAVE TRANSACTION name (declares it) / ROLLBACK TRANSACTION name (names one saved before)."""

    name: int
    saves: bool


@dataclass(eq=False)
class RoleMembers(Statement):
    """ALTER ROLE r ADD|DROP MEMBER p: the principals it names (a user is a principal, as a role)."""

    principals: list[int]


@dataclass(eq=False)
class Skipped(Statement):
    """A statement the model does not read; its variables are still checked (``refs``)."""

    description: str
    refs: list[Ref]


@dataclass
class BatchModel:
    file: str
    first_line: int                 # file line of the batch's first line
    tokens: list[Token]
    statements: list[Statement]
    unclaimed: list[tuple[int, str, str]]   # (line, identifier, parent segment type)
    dynamic_sql: list["BatchModel"] = field(default_factory=list)   # EXEC (N'literal'): a batch of its own


# ------------------------------------------------------------------------------------------------
# Extraction


def extract(tree: BaseSegment, file: str, first_line: int, parse=None) -> BatchModel:
    """The model of one parsed batch. ``parse`` (text -> tree) reads the literal of EXEC (N'...')."""
    return _Extractor(file, first_line, parse).batch(tree)


class _Extractor:
    def __init__(self, file: str, first_line: int, parse) -> None:
        self.file, self.first_line, self.parse = file, first_line, parse
        self.tokens: list[Token] = []
        self.claimed: dict[int, int] = {}     # offset of an identifier -> its token
        self.statements: list[Statement] = []
        self.dynamic_sql: list[BatchModel] = []
        self.asserted: list[tuple[str, str]] = []   # (table, column) of the enclosing COL_LENGTH guards

    # -- tokens ----------------------------------------------------------------------------------

    def line(self, segment: BaseSegment) -> int:
        return self.first_line + line_of(segment) - 1

    def tok(self, segment: BaseSegment, what: str, declares: bool = False) -> int:
        start = offset_of(segment)
        self.claimed[start] = len(self.tokens)
        self.tokens.append(Token(segment.raw, fold(segment.raw), self.line(segment), start,
                                 segment.pos_marker.source_slice.stop, what, declares))
        return len(self.tokens) - 1

    def name_parts(self, segment: BaseSegment, what: str, declares: bool = False) -> tuple[int, ...]:
        """Tokens of a dotted name (object_reference, table_reference, data_type ...)."""
        idents = [c for c in code(segment) if kind(c) in IDENTIFIER_LEAVES]
        # The schema part of a name is a reference to the schema even when the object is declared.
        return tuple(self.tok(c, "schema" if i < len(idents) - 1 else what, declares and i == len(idents) - 1)
                     for i, c in enumerate(idents))

    # -- batch and statements --------------------------------------------------------------------

    def batch(self, tree: BaseSegment) -> BatchModel:
        for statement in descendants(tree, "statement", stop=("statement",)):
            self.statement(statement)
        unclaimed = [(self.line(leaf), leaf.raw, kind(parent))
                     for parent, leaf in _identifier_leaves(tree) if offset_of(leaf) not in self.claimed]
        return BatchModel(self.file, self.first_line, self.tokens, self.statements, unclaimed, self.dynamic_sql)

    def statements_of(self, segment: BaseSegment) -> None:
        for statement in children(segment, "statement"):
            self.statement(statement)

    def statement(self, statement: BaseSegment) -> None:
        body = code(statement)
        if not body:
            return
        segment = body[0]
        handler = getattr(self, "s_" + kind(segment), None)
        if handler is None:
            self.statements.append(Skipped(self.line(segment), kind(segment), self.variables_only(segment)))
        else:
            handler(segment)

    # control flow: the bodies are statements in text order

    def s_begin_end_block(self, segment: BaseSegment) -> None:
        self.statements_of(segment)

    def s_try_catch(self, segment: BaseSegment) -> None:
        self.statements_of(segment)

    def s_if_then_statement(self, segment: BaseSegment) -> None:
        guarded: list[tuple[str, str]] = []
        for c in code(segment):
            if kind(c) == "if_clause":
                condition = child(c, "expression")
                self.statements.append(Uses(self.line(c), self.refs(condition)))
                guarded = _asserted_columns(condition) if condition is not None else []
            elif kind(c) == "statement":     # THEN and ELSE branches, ELSE IF chains flat
                self.asserted.extend(guarded)
                self.statement(c)
                del self.asserted[len(self.asserted) - len(guarded):]
                guarded = []

    def s_while_statement(self, segment: BaseSegment) -> None:
        self.statements.append(Uses(self.line(segment), self.refs(child(segment, "expression"))))
        self.statements_of(segment)

    def s_transaction_statement(self, segment: BaseSegment) -> None:
        names = [i for i in code(segment) if kind(i) in IDENTIFIER_LEAVES]
        if names:
            saves = "SAVE" in keywords(segment)
            self.statements.append(Savepoint(self.line(segment), self.tok(names[0], "savepoint", declares=saves), saves))

    def s_drop_procedure_statement(self, segment: BaseSegment) -> None:
        procedure = self.name_parts(child(segment, "object_reference"), "procedure")
        self.statements.append(DropNamed(self.line(segment), "procedure", procedure))

    def s_drop_schema_statement(self, segment: BaseSegment) -> None:
        schema = self.tok(next(i for i in code(child(segment, "schema_reference")) if kind(i) in IDENTIFIER_LEAVES),
                          "schema")
        self.statements.append(DropNamed(self.line(segment), "schema", (schema,)))

    def s_break_statement(self, segment: BaseSegment) -> None:
        pass

    def s_continue_statement(self, segment: BaseSegment) -> None:
        pass

    def _uses(self, segment: BaseSegment) -> None:
        self.statements.append(Uses(self.line(segment), self.refs(segment)))

    s_throw_statement = s_return_segment = s_return_statement = s_print_statement = s_waitfor_statement = _uses
    s_raiserror_statement = _uses

    def s_set_segment(self, segment: BaseSegment) -> None:
        table = child(segment, "table_reference")
        if table is not None:          # SET IDENTITY_INSERT [s].[t] ON
            self.statements.append(TableUse(self.line(segment), self.name_parts(table, "table")))
        else:                          # SET NOCOUNT ON, SET TRANSACTION ISOLATION LEVEL ...
            self.statements.append(SetOption(self.line(segment), normalised([segment]), self.refs(segment)))

    def s_set_local_variable_segment(self, segment: BaseSegment) -> None:
        self._uses(segment)

    def s_declare_segment(self, segment: BaseSegment) -> None:
        # DECLARE @a int = 1, @b nvarchar(10); DECLARE @t TABLE (...); DECLARE @i [s].[type];
        groups: list[list[BaseSegment]] = [[]]
        for c in code(segment):
            if kind(c) == "comma":
                groups.append([])
            elif not (kind(c) == "keyword" and c.raw.upper() == "DECLARE"):
                groups[-1].append(c)
        for group in groups:
            variable = next((c for c in group if kind(c) == "parameter"), None)
            if variable is None:
                continue
            data_type = next((c for c in group if kind(c) == "data_type"), None)
            table = next((c for c in group if kind(c) == "bracketed"), None)
            is_table = any(kind(c) == "keyword" and c.raw.upper() == "TABLE" for c in group)
            init: list[Ref] = []
            for c in group:
                if kind(c) == "expression":
                    init.extend(self.refs(c))
            columns, refs = (self.column_defs(table) if is_table and table is not None else (None, []))
            sql_type, user_type = self.data_type(data_type)
            self.statements.append(Declare(self.line(variable), self.tok(variable, "variable", declares=True),
                                           sql_type, user_type, columns, init, refs))

    # -- queries ---------------------------------------------------------------------------------

    def s_select_statement(self, segment: BaseSegment) -> None:
        self.statements.append(Query(self.line(segment), self.select(segment)))

    s_set_expression = s_select_statement

    def s_with_compound_statement(self, segment: BaseSegment) -> None:
        ctes = [self.cte(c) for c in children(segment, "common_table_expression")]
        body = next(c for c in code(segment) if kind(c) in (
            "select_statement", "set_expression", "insert_statement", "update_statement", "delete_statement",
            "merge_statement"))
        if kind(body) in ("select_statement", "set_expression"):
            select = self.select(body)
            select.ctes = ctes + select.ctes
            self.statements.append(Query(self.line(segment), select))
        else:
            getattr(self, "s_" + kind(body))(body, ctes)

    def cte(self, segment: BaseSegment) -> Cte:
        name = self.tok(child(segment, "naked_identifier", "quoted_identifier"), "table", declares=True)
        columns: tuple[int, ...] = ()
        column_list = child(segment, "cte_column_list")
        if column_list is not None:
            columns = tuple(self.tok(i, "column", declares=True) for i in descendants(column_list, *IDENTIFIER_LEAVES))
        body = child(segment, "bracketed")
        query = next(c for c in code(body) if kind(c) in ("select_statement", "set_expression"))
        return Cte(name, columns, self.select(query))

    def select(self, segment: BaseSegment) -> Select:
        if kind(segment) == "set_expression":        # a UNION b UNION c ...
            parts = [c for c in code(segment) if kind(c) in ("select_statement", "set_expression")]
            first = self.select(parts[0])
            first.unions.extend(self.select(p) for p in parts[1:])
            order = child(segment, "orderby_clause")
            if order is not None:
                first.order_by.extend(self.refs(order))
            return first
        if kind(segment) == "bracketed":
            return self.select(next(c for c in code(segment) if kind(c) in ("select_statement", "set_expression",
                                                                             "bracketed")))
        select = Select(self.line(segment))
        with_clause = child(segment, "with_compound_statement")
        if with_clause is not None:
            select.ctes = [self.cte(c) for c in children(with_clause, "common_table_expression")]
        for clause in code(segment):
            k = kind(clause)
            if k == "select_clause":
                self.select_clause(clause, select)
            elif k == "from_clause":
                select.sources.extend(self.from_clause(clause, select.refs))
            elif k == "into_table_clause":
                target = next(c for c in code(clause) if kind(c) in ("object_reference", "table_reference"))
                select.into = self.target(target)
            elif k == "orderby_clause":
                select.order_by.extend(self.refs(clause))
            elif k in ("where_clause", "groupby_clause", "having_clause", "option_clause", "for_clause"):
                select.refs.extend(self.refs(clause))
        return select

    def select_clause(self, clause: BaseSegment, select: Select) -> None:
        for element in code(clause):
            k = kind(element)
            if k == "select_clause_modifier":          # TOP (n), DISTINCT
                select.refs.extend(self.refs(element))
            elif k == "select_clause_element":
                parts = code(element)
                assignment = child(element, "select_variable_assignment")
                if assignment is not None:
                    select.assigns = True
                    select.refs.extend(self.refs(assignment))
                    continue
                alias_expression = child(element, "alias_expression")
                alias = None
                if alias_expression is not None:
                    identifier = next(descendants(alias_expression, *IDENTIFIER_LEAVES))
                    alias = self.tok(identifier, "column", declares=True)
                value = [p for p in parts if kind(p) != "alias_expression"]
                wildcard = child(element, "wildcard_expression")
                if wildcard is not None:
                    qualifier = tuple(self.tok(i, "alias") for i in descendants(wildcard, *IDENTIFIER_LEAVES))
                    select.items.append(Item(None, None, qualifier, None, self.line(element)))
                    continue
                refs: list[Ref] = []
                for p in value:
                    refs.extend(self.refs_of(p))
                select.refs.extend(refs)
                column = refs[0] if len(value) == 1 and kind(value[0]) == "column_reference" else None
                hint = self.type_hint(value[0], refs) if len(value) == 1 else None
                select.items.append(Item(alias, column, None, hint, self.line(element)))

    def from_clause(self, clause: BaseSegment, condition_refs: list[Ref]) -> list[Source]:
        """The row sources of a FROM clause; JOIN ... ON conditions go to ``condition_refs``."""
        sources: list[Source] = []
        for expression in descendants(clause, "from_expression", stop=("from_expression", "bracketed")):
            for c in code(expression):
                if kind(c) == "from_expression_element":
                    sources.append(self.from_element(c))
                elif kind(c) == "join_clause":
                    element = child(c, "from_expression_element")
                    if element is not None:
                        sources.append(self.from_element(element))
                    on = child(c, "join_on_condition")
                    if on is not None:
                        condition_refs.extend(self.refs(on))
        return sources

    def from_element(self, element: BaseSegment) -> Source:
        alias_expression = child(element, "alias_expression")
        alias, columns = None, ()
        if alias_expression is not None:
            alias_id = next(c for c in code(alias_expression) if kind(c) in IDENTIFIER_LEAVES)
            alias = self.tok(alias_id, "alias", declares=True)
            column_list = child(alias_expression, "alias_column_list")
            if column_list is not None:
                columns = tuple(self.tok(i, "column", declares=True)
                                for i in descendants(column_list, *IDENTIFIER_LEAVES))
        table_expression = child(element, "table_expression")
        inner = table_expression if table_expression is not None else child(element, "bracketed")
        if inner is not None and kind(inner) == "bracketed":   # (VALUES ...) AS v (a, b) or (SELECT ...)
            inner = next(c for c in code(inner) if kind(c) not in ("start_bracket", "end_bracket"))
        if inner is not None and kind(inner) == "table_expression":
            inner = code(inner)[0]
        source = self.row_source(inner, alias, columns)
        source.line = self.line(element)
        if source.kind == "object":   # WITH (INDEX (ix)): the index must exist on that table
            for reference in descendants(element, "index_reference"):
                index = self.tok(next(i for i in code(reference) if kind(i) in IDENTIFIER_LEAVES), "index")
                self.statements.append(TableUse(self.line(reference), source.name, index))
        return source

    def row_source(self, inner: BaseSegment, alias: int | None, columns: tuple[int, ...]) -> Source:
        k = kind(inner)
        if k == "table_reference":
            return self.target(inner, alias)
        if k == "bracketed":
            query = next((c for c in code(inner) if kind(c) in ("select_statement", "set_expression")), None)
            if query is not None:
                return Source("derived", alias=alias, query=self.select(query), columns=columns)
            return self.row_source(next(c for c in code(inner) if kind(c) not in ("start_bracket", "end_bracket")),
                                   alias, columns)
        if k in ("select_statement", "set_expression"):
            return Source("derived", alias=alias, query=self.select(inner), columns=columns)
        if k == "values_clause":
            return Source("values", alias=alias, columns=columns, refs=self.refs(inner))
        if k == "openjson_segment":
            with_clause = child(inner, "openjson_with_clause")
            names, types = [], []
            if with_clause is not None:
                body = child(with_clause, "bracketed")
                for c in code(body):
                    if kind(c) in IDENTIFIER_LEAVES:
                        names.append(self.tok(c, "column", declares=True))
                    elif kind(c) == "data_type":
                        types.append(self.data_type(c)[0])
            refs = self.refs(child(inner, "bracketed"))
            return Source("function", alias=alias, columns=tuple(names), column_types=tuple(types), refs=refs)
        # A table-valued function or anything else: its columns are not known here.
        return Source("function", alias=alias, columns=columns, refs=self.refs(inner))

    def target(self, reference: BaseSegment, alias: int | None = None) -> Source:
        """A table named by a table_reference / object_reference: @variable, #temp, CTE or object."""
        parts = [c for c in code(reference) if kind(c) in IDENTIFIER_LEAVES]
        if len(parts) == 1 and kind(parts[0]) == "parameter":
            return Source("variable", (self.tok(parts[0], "variable"),), alias, line=self.line(reference))
        return Source("object", self.name_parts(reference, "table"), alias, line=self.line(reference))

    # -- DML -------------------------------------------------------------------------------------

    def s_insert_statement(self, segment: BaseSegment, ctes: list[Cte] | None = None) -> None:
        reference = next(c for c in code(segment) if kind(c) in ("table_reference", "object_reference"))
        target = self.target(reference)
        columns: list[ColumnRef] = []
        column_list = child(segment, "bracketed")
        if column_list is not None:
            columns = [self.column_ref(c) for c in children(column_list, "column_reference")]
        select = exec_ = None
        values: list[Ref] = []
        output = None
        for c in code(segment):
            if kind(c) in ("select_statement", "set_expression", "with_compound_statement"):
                select = self.select(c) if kind(c) != "with_compound_statement" else self._with_select(c)
            elif kind(c) == "values_clause":
                values = self.refs(c)
            elif kind(c) == "execute_script_statement":
                exec_ = self.exec(c)
            elif kind(c) == "output_clause":
                output = self.output(c)
        self.statements.append(Insert(self.line(segment), ctes or [], target, columns, select, values, exec_, output))

    def _with_select(self, segment: BaseSegment) -> Select:
        ctes = [self.cte(c) for c in children(segment, "common_table_expression")]
        body = next(c for c in code(segment) if kind(c) in ("select_statement", "set_expression"))
        select = self.select(body)
        select.ctes = ctes + select.ctes
        return select

    def s_update_statement(self, segment: BaseSegment, ctes: list[Cte] | None = None) -> None:
        reference = child(segment, "table_reference")
        target = self.target(reference)
        alias_expression = child(segment, "alias_expression")
        if alias_expression is not None:
            target.alias = self.tok(next(c for c in code(alias_expression) if kind(c) in IDENTIFIER_LEAVES),
                                    "alias", declares=True)
        refs: list[Ref] = []
        sources: list[Source] = []
        sets: list[tuple[ColumnRef, list[Ref]]] = []
        output = None
        for c in code(segment):
            k = kind(c)
            if k == "set_clause_list":
                sets = [self.set_clause(s) for s in children(c, "set_clause")]
            elif k == "from_clause":
                sources = self.from_clause(c, refs)
            elif k in ("where_clause", "option_clause"):
                refs.extend(self.refs(c))
            elif k == "output_clause":
                output = self.output(c)
            elif k == "select_clause_modifier" or (k == "bracketed"):
                refs.extend(self.refs(c))
        self.statements.append(Update(self.line(segment), ctes or [], target, sources, sets, refs, output))

    def set_clause(self, clause: BaseSegment) -> tuple[ColumnRef, list[Ref]]:
        column = child(clause, "column_reference")
        refs: list[Ref] = []
        for c in code(clause):
            if c is not column and kind(c) not in ("assignment_operator", "comparison_operator"):
                refs.extend(self.refs_of(c))
        return self.column_ref(column), refs

    def s_delete_statement(self, segment: BaseSegment, ctes: list[Cte] | None = None) -> None:
        parts = code(segment)
        refs: list[Ref] = []
        sources: list[Source] = []
        output = None
        target: Source | None = None
        for c in parts:
            k = kind(c)
            if k == "table_reference" and target is None:
                target = self.target(c)
            elif k == "from_clause":
                # DELETE FROM t ...: the FROM names the target; DELETE t FROM t AS x ...: row sources.
                if target is None:
                    elements = list(descendants(c, "from_expression_element"))
                    target = self.from_element(elements[0])
                else:
                    sources = self.from_clause(c, refs)
            elif k in ("where_clause", "option_clause", "select_clause_modifier", "bracketed"):
                refs.extend(self.refs(c))
            elif k == "output_clause":
                output = self.output(c)
        self.statements.append(Delete(self.line(segment), ctes or [], target, sources, refs, output))

    def s_merge_statement(self, segment: BaseSegment, ctes: list[Cte] | None = None) -> None:
        parts = code(segment)
        target = self.target(child(segment, "table_reference"))
        using: Source | None = None
        refs: list[Ref] = []
        sets: list[tuple[ColumnRef, list[Ref]]] = []
        insert_columns: list[ColumnRef] = []
        insert_values: list[Ref] = []
        output = None
        after_using = False
        for c in parts:
            k = kind(c)
            if k == "keyword" and c.raw.upper() == "USING":
                after_using = True
            elif k == "alias_expression":
                alias = self.tok(next(i for i in code(c) if kind(i) in IDENTIFIER_LEAVES), "alias", declares=True)
                if not after_using:
                    target.alias = alias
                elif using is not None:
                    using.alias = alias
                    column_list = child(c, "alias_column_list")
                    if column_list is not None:
                        using.columns = tuple(self.tok(i, "column", declares=True)
                                              for i in descendants(column_list, *IDENTIFIER_LEAVES))
            elif after_using and using is None and k in ("table_reference", "bracketed"):
                using = self.row_source(c, None, ())
                using.line = self.line(c)
            elif k == "join_on_condition":
                refs.extend(self.refs(c))
            elif k == "merge_match":
                for clause in code(c):
                    if kind(clause) == "output_clause":
                        output = self.output(clause)
                        continue
                    for e in code(clause):
                        ke = kind(e)
                        if ke == "expression":
                            refs.extend(self.refs(e))
                        elif ke == "merge_update_clause":
                            sets.extend(self.set_clause(s) for s in descendants(e, "set_clause"))
                        elif ke == "merge_insert_clause":
                            bracketeds = children(e, "bracketed")
                            if bracketeds:
                                insert_columns = [self.column_ref(r) for r in children(bracketeds[0], "column_reference")]
                            for values in bracketeds[1:]:
                                insert_values.extend(self.refs(values))
                            for values in children(e, "values_clause"):
                                insert_values.extend(self.refs(values))
            elif k == "output_clause":
                output = self.output(c)
        self.statements.append(Merge(self.line(segment), ctes or [], target, using, refs, sets, insert_columns,
                                     insert_values, output))

    def output(self, clause: BaseSegment) -> Output:
        """OUTPUT items (flat in sqlfluff: INSERTED . id , expr , ...) [INTO target (columns)]."""
        refs: list[Ref] = []
        into: Source | None = None
        into_columns: list[ColumnRef] = []
        items: list[list[BaseSegment]] = [[]]
        parts = code(clause)[1:]   # after OUTPUT
        for index, c in enumerate(parts):
            if kind(c) == "keyword" and c.raw.upper() == "INTO":
                rest = parts[index + 1:]
                target = rest[0]
                into = self.target(target) if kind(target) != "parameter" else Source(
                    "variable", (self.tok(target, "variable"),), line=self.line(target))
                if len(rest) > 1 and kind(rest[1]) == "bracketed":
                    into_columns = [self.column_ref(r) for r in children(rest[1], "column_reference")]
                break
            if kind(c) == "comma":
                items.append([])
            else:
                items[-1].append(c)
        for item in items:
            refs.extend(self.output_item(item))
        return Output(refs, into, into_columns)

    def output_item(self, item: list[BaseSegment]) -> list[Ref]:
        names = [c for c in item if kind(c) not in ("dot", "alias_expression")]
        if names and all(kind(c) in IDENTIFIER_LEAVES + ("keyword",) for c in names) and len(names) <= 3:
            parts: list[Union[int, str]] = []
            for c in names:
                if kind(c) == "keyword":   # INSERTED / DELETED
                    parts.append(c.raw.casefold())
                else:
                    parts.append(self.tok(c, "column" if c is names[-1] else "alias"))
            if isinstance(parts[-1], int):
                return [ColumnRef(tuple(parts), self.line(names[0]))]
        refs: list[Ref] = []
        for c in item:
            if kind(c) == "alias_expression":
                identifier = next(descendants(c, *IDENTIFIER_LEAVES), None)
                if identifier is not None:
                    self.tok(identifier, "column", declares=True)
            else:
                refs.extend(self.refs_of(c))
        return refs

    # -- EXEC ------------------------------------------------------------------------------------

    def s_execute_script_statement(self, segment: BaseSegment) -> None:
        self.statements.append(self.exec(segment))

    def exec(self, segment: BaseSegment) -> Statement:
        parts = code(segment)
        line = self.line(segment)
        bracketed = child(segment, "bracketed")
        if bracketed is not None and child(segment, "object_reference") is None:
            # EXEC (N'literal'): SQL text fixed in the file; read it as a batch of its own.
            literals = [c for c in code(bracketed) if kind(c) not in ("start_bracket", "end_bracket")]
            value = string_value(literals[0].raw) if len(literals) == 1 else None
            if value is None or self.parse is None:
                return Skipped(line, "EXEC of SQL text built at run time", self.variables_only(segment))
            self.dynamic_sql.append(extract(self.parse(value), self.file, line, self.parse))
            return Uses(line, [])
        reference = child(segment, "object_reference")
        procedure: tuple[int, ...] | None = None
        dynamic = None
        refs_before: list[Ref] = []
        status = None
        for c in parts:
            if c is reference:
                break
            if kind(c) == "parameter":   # EXEC @status = proc
                status = c
        if status is not None:
            refs_before.append(VariableRef(self.tok(status, "variable")))
        names = [c for c in code(reference) if kind(c) in IDENTIFIER_LEAVES]
        if len(names) == 1 and kind(names[0]) == "parameter":
            refs_before.append(VariableRef(self.tok(names[0], "variable")))
            dynamic = f"EXEC {names[0].raw} (a procedure named by a variable)"
        else:
            procedure = self.name_parts(reference, "procedure")
        arguments: list[Argument] = []
        after = parts[parts.index(reference) + 1:]
        groups: list[list[BaseSegment]] = [[]]
        for c in after:
            if kind(c) == "comma":
                groups.append([])
            else:
                groups[-1].append(c)
        for group in groups:
            if not group:
                continue
            name = None
            value = group
            if len(group) >= 2 and kind(group[0]) == "parameter" and kind(group[1]) in (
                    "comparison_operator", "assignment_operator"):
                name = self.tok(group[0], "argument")
                value = group[2:]
            refs: list[Ref] = []
            literal = None
            for v in value:
                if kind(v) == "keyword":     # OUTPUT
                    continue
                refs.extend(self.refs_of(v))
                leaves_ = [leaf for leaf in [v] + list(descendants(v, "quoted_literal"))
                           if kind(leaf) == "quoted_literal"]
                if len(value) == 1 and len(leaves_) == 1:
                    literal = string_value(leaves_[0].raw)
            arguments.append(Argument(name, refs, literal, self.line(group[0])))
        statement = Exec(line, procedure, arguments, dynamic)
        if refs_before:
            self.statements.append(Uses(line, refs_before))
        return statement

    # -- DDL -------------------------------------------------------------------------------------

    def s_create_procedure_statement(self, segment: BaseSegment) -> None:
        name = self.name_parts(child(segment, "object_reference"), "procedure", declares=True)
        params: list[Param] = []
        parameter_list = child(segment, "procedure_parameter_list")
        if parameter_list is not None:
            groups: list[list[BaseSegment]] = [[]]
            for c in code(parameter_list):
                if kind(c) == "comma":
                    groups.append([])
                elif kind(c) not in ("start_bracket", "end_bracket"):
                    groups[-1].append(c)
            defaults: list[Ref] = []
            for group in groups:
                variable = next(c for c in group if kind(c) == "parameter")
                sql_type, user_type = self.data_type(next((c for c in group if kind(c) == "data_type"), None))
                words = {c.raw.upper() for c in group if kind(c) == "keyword"}
                has_default = any(kind(c) in ("comparison_operator", "assignment_operator") for c in group)
                for c in group:
                    if kind(c) == "expression":
                        defaults.extend(self.refs(c))
                # A table-valued parameter left out is an empty table: it never needs an argument.
                params.append(Param(self.tok(variable, "variable", declares=True), sql_type, user_type,
                                    has_default or "READONLY" in words, "READONLY" in words,
                                    bool(words & {"OUTPUT", "OUT"})))
        self.statements.append(CreateProcedure(self.line(segment), name, params))
        body = child(segment, "procedure_statement")
        if body is not None:
            self.statements_of(body)

    def s_create_table_statement(self, segment: BaseSegment) -> None:
        name = self.name_parts(child(segment, "table_reference", "object_reference"), "table", declares=True)
        columns, refs = self.column_defs(child(segment, "bracketed"))
        constraints = [self.tok(i, "constraint", declares=True)
                       for c in descendants(child(segment, "bracketed"), "object_reference")
                       for i in code(c) if kind(i) in IDENTIFIER_LEAVES]
        self.statements.append(CreateTable(self.line(segment), name, columns, refs, constraints))

    def s_create_type_statement(self, segment: BaseSegment) -> None:
        name = self.name_parts(child(segment, "object_reference"), "type", declares=True)
        columns, refs = self.column_defs(child(segment, "bracketed"))
        for c in descendants(child(segment, "bracketed"), "object_reference"):
            for i in code(c):
                if kind(i) in IDENTIFIER_LEAVES:
                    self.tok(i, "constraint", declares=True)
        self.statements.append(CreateType(self.line(segment), name, columns, refs))

    def column_defs(self, bracketed: BaseSegment) -> tuple[list[ColumnDef], list[Ref]]:
        """Column definitions of CREATE TABLE / TYPE / DECLARE @t TABLE, and the references in them."""
        columns: list[ColumnDef] = []
        refs: list[Ref] = []
        for c in code(bracketed):
            k = kind(c)
            if k in ("column_definition", "computed_column_definition"):
                identifier = next(i for i in code(c) if kind(i) in IDENTIFIER_LEAVES)
                sql_type, user_type = self.data_type(child(c, "data_type"))
                columns.append(ColumnDef(self.tok(identifier, "column", declares=True), sql_type, user_type))
                for part in code(c):
                    if part is identifier or kind(part) == "data_type":
                        continue
                    refs.extend(self.constraint_refs(part) if kind(part) == "column_constraint_segment"
                                else self.refs_of(part))
            elif k == "table_constraint":
                refs.extend(self.constraint_refs(c))
        return columns, refs

    def constraint_refs(self, segment: BaseSegment) -> list[Ref]:
        """References inside a column or table constraint: key columns, CHECK / DEFAULT expressions."""
        refs: list[Ref] = []
        for c in code(segment):
            k = kind(c)
            if k == "object_reference":     # the constraint's own name: declared by the caller
                continue
            if k == "index_column_definition":
                identifier = next(i for i in code(c) if kind(i) in IDENTIFIER_LEAVES)
                refs.append(ColumnRef((self.tok(identifier, "column"),), self.line(c)))
            elif k == "collation_reference":
                refs.append(CollationRef(self.tok(next(i for i in code(c) if kind(i) in IDENTIFIER_LEAVES),
                                                  "collation")))
            elif c.segments:
                refs.extend(self.constraint_refs(c) if k in (
                    "column_constraint_segment", "bracketed_index_column_list_grammar", "bracketed",
                    "check_constraint_grammar", "identity_grammar") else self.refs_of(c))
        return refs

    def s_create_index_statement(self, segment: BaseSegment) -> None:
        index = self.tok(next(i for i in code(child(segment, "index_reference")) if kind(i) in IDENTIFIER_LEAVES),
                         "index", declares=True)
        table = self.name_parts(child(segment, "table_reference"), "table")
        columns = [ColumnRef((self.tok(next(i for i in code(c) if kind(i) in IDENTIFIER_LEAVES), "column"),),
                             self.line(c))
                   for c in descendants(segment, "index_column_definition")]
        for include in children(segment, "bracketed"):      # INCLUDE (a, b)
            columns.extend(self.column_ref(c) for c in children(include, "column_reference"))
        refs: list[Ref] = []
        for clause in children(segment, "where_clause"):
            refs.extend(self.refs(clause))
        self.statements.append(CreateIndex(self.line(segment), index, table, columns, refs, tuple(self.asserted)))

    def s_alter_table_statement(self, segment: BaseSegment) -> None:
        parts = code(segment)
        reference = child(segment, "table_reference")
        action = [c.raw.upper() for c in parts[parts.index(reference) + 1:] if kind(c) == "keyword"][:2]
        if action[:1] not in (["ADD"], ["DROP"]):      # ALTER COLUMN, SET (...), SWITCH, WITH CHECK ...
            self.statements.append(Skipped(self.line(segment), f"alter_table_statement ({' '.join(action)})",
                                           self.variables_only(segment)))
            return
        table = self.name_parts(reference, "table")
        columns, refs = self.column_defs(segment)          # ADD column definitions, table constraints
        constraints: list[int] = []
        dropped_columns: list[int] = []
        dropped_constraints: list[int] = []
        verb, dropping = "", "COLUMN"        # ADD / DROP, and what DROP drops (DROP x, CONSTRAINT y, COLUMN z)
        for c in parts[parts.index(reference) + 1:]:
            k = kind(c)
            if k == "keyword" and c.raw.upper() in ("ADD", "DROP"):
                verb = c.raw.upper()
            elif k == "keyword" and c.raw.upper() in ("COLUMN", "CONSTRAINT"):
                dropping = c.raw.upper()
            elif verb == "DROP" and k == "object_reference":
                identifier = next(i for i in code(c) if kind(i) in IDENTIFIER_LEAVES)
                dropped_constraints.append(self.tok(identifier, "constraint"))
            elif verb == "DROP" and k == "column_reference" and dropping == "COLUMN":
                identifier = next(i for i in code(c) if kind(i) in IDENTIFIER_LEAVES)
                dropped_columns.append(self.tok(identifier, "column"))
            elif k == "column_reference":                  # ADD CONSTRAINT name DEFAULT (0) FOR column
                refs.append(self.column_ref(c))
            elif k == "column_constraint_segment":
                refs.extend(self.constraint_refs(c))
            if verb == "ADD" and k in ("column_definition", "table_constraint", "column_constraint_segment"):
                names = children(c, "object_reference") if k == "column_constraint_segment" else \
                    descendants(c, "object_reference")
                constraints.extend(self.tok(next(i for i in code(n) if kind(i) in IDENTIFIER_LEAVES), "constraint",
                                            declares=True) for n in names)
        self.statements.append(AlterTable(self.line(segment), table, columns, constraints, dropped_columns,
                                          dropped_constraints, "EXISTS" in keywords(segment), refs,
                                          tuple(self.asserted)))

    def s_drop_index_statement(self, segment: BaseSegment) -> None:
        reference = child(segment, "index_reference")
        table = child(segment, "table_reference")
        if reference is None or table is None:            # DROP INDEX t.ix (the old form)
            self.statements.append(Skipped(self.line(segment), "drop_index_statement (without ON)",
                                           self.variables_only(segment)))
            return
        index = self.tok(next(i for i in code(reference) if kind(i) in IDENTIFIER_LEAVES), "index")
        self.statements.append(DropIndex(self.line(segment), index, self.name_parts(table, "table"),
                                         "EXISTS" in keywords(segment)))

    def s_drop_table_statement(self, segment: BaseSegment) -> None:
        tables = [self.name_parts(t, "table") for t in children(segment, "table_reference")]
        self.statements.append(DropTable(self.line(segment), tables, "EXISTS" in keywords(segment)))

    def s_alter_index_statement(self, segment: BaseSegment) -> None:
        index = self.tok(next(i for i in code(child(segment, "object_reference", "index_reference"))
                              if kind(i) in IDENTIFIER_LEAVES), "index")
        table = self.name_parts(child(segment, "table_reference"), "table")
        self.statements.append(TableUse(self.line(segment), table, index))

    def s_create_role_statement(self, segment: BaseSegment) -> None:
        roles = children(segment, "role_reference")
        name = self.tok(next(i for i in code(roles[0]) if kind(i) in IDENTIFIER_LEAVES), "role", declares=True)
        owner = (self.tok(next(i for i in code(roles[1]) if kind(i) in IDENTIFIER_LEAVES), "role")
                 if len(roles) > 1 else None)
        self.statements.append(CreateNamed(self.line(segment), "role", name, owner))

    def s_create_user_statement(self, segment: BaseSegment) -> None:
        # A user is a database principal, in the namespace of roles (ALTER ROLE ... ADD MEMBER names it).
        user = child(segment, "role_reference")
        name = self.tok(next(i for i in code(user) if kind(i) in IDENTIFIER_LEAVES), "role", declares=True)
        self.statements.append(CreateNamed(self.line(segment), "role", name, None))

    def s_alter_role_statement(self, segment: BaseSegment) -> None:
        principals = [self.tok(i, "role") for r in children(segment, "role_reference")
                      for i in code(r) if kind(i) in IDENTIFIER_LEAVES]
        self.statements.append(RoleMembers(self.line(segment), principals))

    def s_create_schema_statement(self, segment: BaseSegment) -> None:
        schema = child(segment, "schema_reference")
        name = self.tok(next(i for i in code(schema) if kind(i) in IDENTIFIER_LEAVES), "schema", declares=True)
        role = child(segment, "role_reference")
        owner = self.tok(next(i for i in code(role) if kind(i) in IDENTIFIER_LEAVES), "role") if role else None
        self.statements.append(CreateNamed(self.line(segment), "schema", name, owner))

    def s_grant_statement(self, segment: BaseSegment) -> None:
        securable = child(segment, "securable_segment")
        words = keywords(securable) if securable is not None else []
        reference = child(securable, "object_reference") if securable is not None else None
        what = "type" if "TYPE" in words else "schema" if "SCHEMA" in words else "object"
        name = self.name_parts(reference, what) if reference is not None else ()
        roles = [self.tok(i, "role") for r in children(segment, "role_reference")
                 for i in code(r) if kind(i) in IDENTIFIER_LEAVES]
        permission = normalised([child(segment, "permissions_segment")]) if child(segment, "permissions_segment") else ""
        self.statements.append(Grant(self.line(segment), permission, what.upper(), name, roles))

    def s_alter_authorization_statement(self, segment: BaseSegment) -> None:
        securable = child(segment, "securable_segment")
        reference = child(securable, "object_reference") if securable is not None else None
        principal = child(segment, "role_reference")
        if reference is None or principal is None or keywords(securable)[:1] != ["OBJECT"]:
            self.statements.append(Skipped(self.line(segment), "alter_authorization_statement (not ON OBJECT::)",
                                           self.variables_only(segment)))
            return
        self.statements.append(Owner(self.line(segment), self.name_parts(reference, "object"),
                                     self.tok(next(i for i in code(principal) if kind(i) in IDENTIFIER_LEAVES),
                                              "role")))

    # -- expressions -----------------------------------------------------------------------------

    def refs(self, segment: BaseSegment | None) -> list[Ref]:
        """The references inside ``segment`` (not counting ``segment`` itself if it is a leaf)."""
        if segment is None:
            return []
        out: list[Ref] = []
        for c in code(segment):
            out.extend(self.refs_of(c))
        return out

    def refs_of(self, segment: BaseSegment) -> list[Ref]:
        k = kind(segment)
        if k == "column_reference":
            return [self.column_ref(segment)]
        if k == "parameter":
            return [VariableRef(self.tok(segment, "variable"))]
        if k in ("select_statement", "set_expression", "with_compound_statement"):
            select = self.select(segment) if k != "with_compound_statement" else self._with_select(segment)
            return [Subquery(select)]
        if k == "function":
            return self.function(segment)
        if k == "data_type":
            _, user_type = self.data_type(segment)
            return [TypeRef(user_type)] if user_type else []
        if k == "collation_reference":
            return [CollationRef(self.tok(next(i for i in code(segment) if kind(i) in IDENTIFIER_LEAVES),
                                          "collation"))]
        if k == "alias_expression":     # e.g. in a VALUES derived table: declared by its owner
            return []
        return self.refs(segment) if segment.segments else []

    def column_ref(self, segment: BaseSegment) -> ColumnRef:
        identifiers = [c for c in code(segment) if kind(c) in IDENTIFIER_LEAVES]
        parts = tuple(self.tok(c, "column" if i == len(identifiers) - 1 else "alias")
                      for i, c in enumerate(identifiers))
        return ColumnRef(parts, self.line(segment))

    def function(self, segment: BaseSegment) -> list[Ref]:
        name_segment = child(segment, "function_name")
        identifiers = [c for c in code(name_segment) if kind(c) in IDENTIFIER_LEAVES] if name_segment else []
        refs: list[Ref] = []
        name = name_segment.raw.upper() if name_segment is not None else ""
        if identifiers:
            refs.append(FunctionRef(self.name_parts(name_segment, "function")[-1]))
        contents = child(segment, "function_contents")
        arguments = _arguments(contents)
        line = self.line(segment)
        if name in NAMING_FUNCTIONS and arguments:
            first = code(arguments[0]) if arguments[0].segments else [arguments[0]]
            literal = _literal_argument(arguments[0])
            literals = [_literal_argument(a) for a in arguments[1:]]
            if literal is not None:
                what = NAMING_FUNCTIONS[name]
                if name == "OBJECT_ID" and literals and literals[0] is not None:
                    what = OBJECT_TYPES.get(literals[0].strip().upper(), "object")
                refs.append(NameInString(what, literal, line))
                if name == "COL_LENGTH" and literals and literals[0] is not None:
                    refs.append(NameInString("column", literals[0], line, table=literal))
            elif len(first) == 1 and kind(first[0]) == "parameter":
                refs.append(Dynamic(line, f"{name}({first[0].raw}) (an object named by a variable)"))
        if name == "INDEXPROPERTY" and len(arguments) >= 2:     # INDEXPROPERTY(OBJECT_ID(N't'), N'ix', ...)
            inner = code(arguments[0])[0] if kind(arguments[0]) == "expression" else arguments[0]
            index = _literal_argument(arguments[1])
            if kind(inner) == "function" and child(inner, "function_name").raw.upper() == "OBJECT_ID":
                table = next(iter(_arguments(child(inner, "function_contents"))), None)
                table_name = _literal_argument(table) if table is not None else None
                if table_name is not None and index is not None:
                    refs.append(NameInString("index", index, line, table=table_name))
        for c in code(segment):
            if c is not name_segment:
                refs.extend(self.refs_of(c))
        return refs

    def data_type(self, segment: BaseSegment | None) -> tuple[str | None, tuple[int, ...] | None]:
        """(built-in type as written, lower case) or (None, tokens of a user-defined type's name)."""
        if segment is None:
            return None, None
        identifiers = [c for c in code(segment) if kind(c) in IDENTIFIER_LEAVES]
        if identifiers:
            return None, self.name_parts(segment, "type")
        return normalised([segment]).lower().replace(" (", "(").replace(", ", ","), None

    def type_hint(self, value: BaseSegment, refs: list[Ref]) -> TypeHint:
        """How to find the type of a select-list expression (for the contract parity test)."""
        k = kind(value)
        if k == "column_reference":
            return ("column", refs[0]) if refs and isinstance(refs[0], ColumnRef) else None
        if k == "parameter":
            return ("variable", refs[0].token) if refs and isinstance(refs[0], VariableRef) else None
        if k in ("expression", "bracketed"):
            operands = [c for c in code(value) if kind(c) not in (
                "binary_operator", "start_bracket", "end_bracket", "comparison_operator", "keyword", "sign_indicator")]
            return ("first", [self._hint(o) for o in operands]) if operands else None
        return self._hint(value)

    def _hint(self, value: BaseSegment) -> TypeHint:
        k = kind(value)
        if k == "column_reference":
            tokens = [self.claimed.get(offset_of(c)) for c in code(value) if kind(c) in IDENTIFIER_LEAVES]
            return ("column", ColumnRef(tuple(tokens), self.line(value))) if None not in tokens else None
        if k == "parameter":
            return ("variable", self.claimed[offset_of(value)]) if offset_of(value) in self.claimed else None
        if k in ("expression", "bracketed"):
            return self.type_hint(value, [])
        if k == "integer_literal" or k == "numeric_literal":
            return ("type", "numeric" if "." in value.raw else "int")
        if k == "quoted_literal":
            return ("type", "nvarchar" if value.raw[:1] in "Nn" else "varchar")
        if k == "case_expression":
            branches = [e for w in children(value, "when_clause") for e in children(w, "expression")[1:]]
            return ("first", [self._hint(b) for b in branches]) if branches else None
        if k == "function":
            name = child(value, "function_name").raw.upper()
            arguments = _arguments(child(value, "function_contents"))
            if name in ("CONVERT", "CAST", "TRY_CONVERT", "TRY_CAST"):
                data_type = next(descendants(value, "data_type"), None)
                return ("type", self.data_type(data_type)[0]) if data_type is not None else None
            if name in ("COALESCE", "ISNULL", "MAX", "MIN", "SUM"):
                return ("first", [self._hint(a) for a in arguments])
            if name == "IIF":
                return ("first", [self._hint(a) for a in arguments[1:]])
            return ("function", name)
        return None

    def variables_only(self, segment: BaseSegment) -> list[Ref]:
        return [VariableRef(self.tok(p, "variable")) for p in descendants(segment, "parameter")]


def _literal_argument(argument: BaseSegment) -> str | None:
    """The value of a function argument that is one string literal, else None."""
    parts = code(argument) if argument.segments else [argument]
    return string_value(parts[0].raw) if len(parts) == 1 and kind(parts[0]) == "quoted_literal" else None


def _asserted_columns(condition: BaseSegment) -> list[tuple[str, str]]:
    """(table, column) of each AND-ed ``COL_LENGTH(N'<table>', N'<column>') IS NOT NULL`` in a condition."""
    out = []
    for operand in conjuncts(condition) or []:
        segments = operand.segments
        if len(segments) != 4 or kind(segments[0]) != "function" or \
                [s.raw.upper() for s in segments[1:]] != ["IS", "NOT", "NULL"]:
            continue
        name = child(segments[0], "function_name")
        arguments = _arguments(child(segments[0], "function_contents"))
        if name is not None and name.raw.upper() == "COL_LENGTH" and len(arguments) == 2:
            table, column = (_literal_argument(a) for a in arguments)
            if table is not None and column is not None:
                out.append((table, column))
    return out


def _arguments(contents: BaseSegment | None) -> list[BaseSegment]:
    """The comma-separated arguments inside a function's brackets."""
    if contents is None:
        return []
    bracketed = child(contents, "bracketed")
    if bracketed is None:
        return []
    return [c for c in code(bracketed) if kind(c) not in ("start_bracket", "end_bracket", "comma")]


def _identifier_leaves(segment: BaseSegment):
    for c in segment.segments:
        if not c.segments:
            if kind(c) in IDENTIFIER_LEAVES:
                yield segment, c
        else:
            yield from _identifier_leaves(c)
