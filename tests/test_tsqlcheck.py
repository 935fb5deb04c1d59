"""check-tsql resolves every reference of the rendered T-SQL, and catches a renamed one.

The mutant test renames each identifier reference of the rendered queues and their migrations in
turn (column, table, alias, variable, type, procedure, argument, function, role, schema, index,
constraint) and requires check-tsql to report it; renaming goes through the model (no re-parse per
mutant), and a sample of mutants is re-parsed from edited text to show that this is the same thing.
"""
from __future__ import annotations

import collections
import hashlib
import os
import pickle
import random
import subprocess
import sys

import pytest

from tablequeue import tsqlcheck, tsqltree
from tablequeue.tsqlcheck import check_sources, resolve_batch
from tsql_renders import CATALOGS, checked_sources, report

BASE = """\
EXEC (N'CREATE SCHEMA [s] AUTHORIZATION [dbo];');
GO
CREATE TABLE [s].[t] (
    id bigint NOT NULL,
    a int NULL,
    CONSTRAINT [pk_t] PRIMARY KEY CLUSTERED (id)
);
GO
CREATE TYPE [s].[items] AS TABLE (ordinal int NOT NULL, payload nvarchar(MAX) NULL);
GO
CREATE ROLE [s_admin] AUTHORIZATION [dbo];
GO
CREATE OR ALTER PROCEDURE [s].[p]
    @a int,
    @b int = 1,
    @items [s].[items] READONLY
AS
BEGIN
    SELECT @a AS a, @b AS b;
END;
GO
"""


def findings(sql: str) -> list[str]:
    """check-tsql's unresolved references for BASE followed by ``sql``, as 'line: message'."""
    report_ = check_sources([("t.sql", BASE + sql)])
    base_lines = BASE.count("\n")
    return [f"{f.line - base_lines}: {f.message}" for f in report_.findings]


CASES = {
    # name: (SQL after BASE, the findings: "line: message" counted from the SQL's first line)
    "columns of a table, by alias": (
        "SELECT m.id, m.a FROM [s].[t] AS m WHERE m.id > 0 ORDER BY m.a;", []),
    "a column the table does not have": (
        "SELECT m.id, m.nope FROM [s].[t] AS m;", ["1: unresolved column 'm.nope'"]),
    "an unqualified column": (
        "SELECT nope FROM [s].[t];", ["1: unresolved column 'nope'"]),
    "an alias the query does not have": (
        "SELECT z.id FROM [s].[t] AS m;", ["1: unresolved alias 'z'"]),
    "a table": (
        "SELECT 1 AS one FROM [s].[missing];", ["1: unresolved table '[s].[missing]'"]),
    "CTE columns, named by the list or by the query": (
        "WITH c (x) AS (SELECT m.id FROM [s].[t] AS m), d AS (SELECT c.x AS y FROM c)\n"
        "SELECT d.y FROM d;", []),
    "a CTE column that its list renamed": (
        "WITH c (x) AS (SELECT m.id FROM [s].[t] AS m)\nSELECT c.id FROM c;", ["2: unresolved column 'c.id'"]),
    "a derived table's columns": (
        "SELECT d.n FROM (SELECT m.id AS n FROM [s].[t] AS m) AS d;\n"
        "SELECT d.id FROM (SELECT m.id AS n FROM [s].[t] AS m) AS d;", ["2: unresolved column 'd.id'"]),
    "ORDER BY a select-list alias; a correlated subquery": (
        "SELECT m.id AS k FROM [s].[t] AS m\n"
        "WHERE EXISTS (SELECT 1 AS one FROM [s].[t] AS o WHERE o.id = m.id) ORDER BY k;", []),
    "inserted and deleted in OUTPUT": (
        "DECLARE @out TABLE (id bigint NOT NULL);\n"
        "UPDATE [s].[t] SET a = 1 OUTPUT INSERTED.id INTO @out (id) WHERE id = 1;\n"
        "DELETE FROM [s].[t] OUTPUT DELETED.nope INTO @out (id) WHERE id = 1;",
        ["3: unresolved column 'deleted.nope'"]),
    "OUTPUT INTO column list": (
        "DECLARE @out TABLE (id bigint NOT NULL);\n"
        "DELETE FROM [s].[t] OUTPUT DELETED.id INTO @out (nope) WHERE id = 1;", ["2: unresolved column 'nope'"]),
    "INSERT column list": (
        "INSERT INTO [s].[t] (id, nope) VALUES (1, 2);", ["1: unresolved column 'nope'"]),
    "DELETE alias FROM ... JOIN, OUTPUT of a joined table": (
        "DECLARE @k TABLE (id bigint NOT NULL, why nvarchar(10) NULL);\n"
        "DELETE m OUTPUT DELETED.id, k.why, k.nope FROM [s].[t] AS m INNER JOIN @k AS k ON m.id = k.id;",
        ["2: unresolved column 'k.nope'"]),
    "UPDATE a CTE": (
        "WITH c AS (SELECT TOP (1) m.id, m.a FROM [s].[t] AS m ORDER BY m.id)\n"
        "UPDATE c SET a = 2, nope = 3 OUTPUT INSERTED.id;", ["2: unresolved column 'nope'"]),
    "MERGE": (
        "DECLARE @v [s].[items];\n"
        "MERGE [s].[t] AS tg USING @v AS src ON tg.id = src.ordinal\n"
        "WHEN MATCHED THEN UPDATE SET tg.a = src.nope\n"
        "WHEN NOT MATCHED THEN INSERT (id, bad) VALUES (src.ordinal, 1)\n"
        "OUTPUT $action, INSERTED.id, DELETED.zip;",
        ["3: unresolved column 'src.nope'", "4: unresolved column 'bad'", "5: unresolved column 'deleted.zip'"]),
    "a table variable": (
        "DECLARE @v TABLE (x int NOT NULL);\nSELECT v.x FROM @v AS v;\nSELECT v.y FROM @v AS v;",
        ["3: unresolved column 'v.y'"]),
    "a table variable's key and CHECK name its own columns": (
        "DECLARE @v TABLE (x int NOT NULL, y int NOT NULL CHECK (y > x), PRIMARY KEY (x));\n"
        "DECLARE @w TABLE (x int NOT NULL, PRIMARY KEY (nope));",
        ["2: unresolved column 'nope'"]),
    "a variable used above its DECLARE": (
        "SELECT @late AS late;\nDECLARE @late int = 1;", ["1: unresolved variable '@late'"]),
    "a variable declared twice": (
        "DECLARE @x int;\nDECLARE @x int;", ["2: variable '@x' is declared twice in its batch"]),
    "a table type and its columns": (
        "DECLARE @i [s].[items];\nINSERT INTO @i (ordinal, payload) VALUES (1, N'x');\n"
        "SELECT i.nope FROM @i AS i;\nDECLARE @j [s].[nope];",
        ["3: unresolved column 'i.nope'", "4: unresolved type '[s].[nope]'"]),
    "a procedure": (
        "EXEC [s].[p] @a = 1;\nEXEC [s].[nope];", ["2: unresolved procedure '[s].[nope]'"]),
    "named arguments": (
        "EXEC [s].[p] @a = 1, @zz = 2;\nEXEC [s].[p] @b = 1;",
        ["1: unresolved argument '@zz' of procedure '[s].[p]'",
         "2: missing argument '@a' of procedure '[s].[p]' (it has no default)"]),
    "SELECT INTO a #temp table, then its columns": (
        "SELECT m.id INTO #k FROM [s].[t] AS m;\nSELECT k.id FROM #k AS k;\nSELECT k.a FROM #k AS k;\n"
        "SELECT 1 AS one FROM #later;", ["3: unresolved column 'k.a'", "4: unresolved table '#later'"]),
    "tSQLt's procedures, arguments and the tables they name": (
        "CREATE TABLE #e (id int);\n"
        "EXEC tSQLt.FakeTable @TableName = N'[s].[t]', @Identity = 1;\n"
        "EXEC tSQLt.FakeTable @TableName = N'[s].[x]';\n"
        "EXEC tSQLt.AssertEqualsTable @Expected = N'#e', @Actual = N'#a', @Nope = 1;\n"
        "EXEC tSQLt.ApplyConstraint @TableName = N'[s].[t]', @ConstraintName = N'ck_nope';\n"
        "EXEC tSQLt.Nope;",
        ["3: unresolved table '[s].[x]'", "4: unresolved table '#a'",
         "4: unresolved argument '@Nope' of procedure 'tSQLt.AssertEqualsTable'",
         "5: unresolved constraint 'ck_nope' of table '[s].[t]'", "6: unresolved procedure 'tSQLt.Nope'"]),
    "objects named in strings": (
        "SELECT OBJECT_ID(N'[s].[t]') AS t, OBJECT_ID(N'[s].[x]') AS x, TYPE_ID(N'[s].[items]') AS i,\n"
        "    SCHEMA_ID(N'nope') AS n, DATABASE_PRINCIPAL_ID(N's_admin') AS r;",
        ["1: unresolved table '[s].[x]'", "2: unresolved schema 'nope'"]),
    "built-in functions": (
        "SELECT SYSUTCDATETIME() AS now_utc, NOTAFUNCTION(1) AS nope;", ["1: unresolved function 'NOTAFUNCTION'"]),
    "names that run-time probes look up": (
        "SELECT COL_LENGTH(N'[s].[t]', N'a') AS a, COL_LENGTH(N'[s].[t]', N'nope') AS n,\n"
        "    INDEXPROPERTY(OBJECT_ID(N'[s].[t]'), N'pk_t', 'IndexID') AS i,\n"
        "    INDEXPROPERTY(OBJECT_ID(N'[s].[t]'), N'ix_nope', 'IndexID') AS j,\n"
        "    INDEX_COL(N'[s].[nope]', 1, 1) AS k, OBJECT_ID(N'[s].[pk_t]', N'PK') AS pk,\n"
        "    OBJECT_ID(N'[s].[df_nope]', N'D') AS df, OBJECT_ID(N'[s].[p]', N'P') AS p,\n"
        "    OBJECT_ID(N'[s].[t]', N'P') AS q;",
        ["1: unresolved column 'nope' of table '[s].[t]'", "3: unresolved index 'ix_nope' of table '[s].[t]'",
         "4: unresolved table '[s].[nope]'", "5: unresolved constraint '[s].[df_nope]'",
         "6: unresolved procedure '[s].[t]'"]),
    "index hints": (
        "SELECT m.a FROM [s].[t] AS m WITH (INDEX ([pk_t]), FORCESEEK) WHERE m.a = 1;\n"
        "SELECT m.a FROM [s].[t] AS m WITH (INDEX ([ix_nope]), ROWLOCK);",
        ["2: unresolved index '[ix_nope]' of table '[s].[t]'"]),
    "grants, roles and schemas": (
        "GRANT EXECUTE ON OBJECT::[s].[p] TO [s_admin];\nGRANT EXECUTE ON OBJECT::[s].[q] TO [nobody];\n"
        "GO\nCREATE TABLE [nope].[x] (id int COLLATE Latin1_General_CI_AS);",
        ["2: unresolved object '[s].[q]'", "2: unresolved role '[nobody]'", "4: unresolved schema '[nope]'",
         "4: unresolved collation 'Latin1_General_CI_AS'"]),
    "an index's table and columns": (
        "CREATE INDEX [ix_t] ON [s].[t] (a, nope) WHERE a IS NOT NULL;", ["1: unresolved column 'nope'"]),
}


@pytest.mark.parametrize("name", CASES)
def test_each_kind_of_reference_resolves_or_is_reported(name: str) -> None:
    sql, expected = CASES[name]
    assert sorted(findings(sql)) == sorted(expected)


def test_variables_belong_to_their_batch() -> None:
    assert findings("DECLARE @x int = 1;\nGO\nSELECT @x AS x;") == ["3: unresolved variable '@x'"]


def test_references_known_only_at_run_time_are_listed_as_skipped() -> None:
    result = check_sources([("t.sql", BASE + "DECLARE @name sysname = N's.p';\nEXEC @name @a = 1;\n"
                                              "SELECT OBJECT_ID(@name) AS o;")])
    assert result.findings == []
    assert [f.message for f in result.skipped] == [
        "EXEC @name (a procedure named by a variable): not resolved",
        "OBJECT_ID(@name) (an object named by a variable): not resolved"]


def test_unparsable_sql_is_reported_with_its_line() -> None:
    result = check_sources([("bad.sql", "SELECT 1 AS one;\nGO\n\nSELEC nothing FROM;\n")])
    assert len(result.findings) == 1 and str(result.findings[0]).startswith("bad.sql:4: unparsable T-SQL: ")


# ------------------------------------------------------------------------------------------------
# Schema changes: a migration's are seen after it, in its own file only

MAIN = ("main.sql", BASE + """\
CREATE INDEX [ix_t_a] ON [s].[t] (a);
GO
CREATE OR ALTER PROCEDURE [s].[reader]
AS
BEGIN
    SELECT m.id, m.a FROM [s].[t] AS m;
END;
GO
""")
ADD_K = """\
IF COL_LENGTH(N'[s].[t]', N'k') IS NULL
    BEGIN
        ALTER TABLE [s].[t] ADD k int NULL CONSTRAINT [df_t_k] DEFAULT (0);
    END;
GO
"""


def migration_findings(*migrations: str, main: tuple[str, str] = MAIN) -> list[str]:
    """check-tsql's findings over the main file and migrations m1.sql, m2.sql ... ('file:line: message')."""
    files = [main] + [(f"m{i}.sql", text) for i, text in enumerate(migrations, start=1)]
    return [str(f) for f in sorted(check_sources(files).findings, key=lambda f: (f.file, f.line, f.message))]


def test_a_migration_sees_the_column_it_adds_from_its_next_batch_on() -> None:
    later = ("CREATE UNIQUE INDEX [ux_t_k] ON [s].[t] (k) WHERE k IS NOT NULL;\nGO\n"
             "UPDATE [s].[t] SET k = a WHERE k IS NULL;\nGO\n")
    assert migration_findings(ADD_K + later) == []
    # A column it never adds, in an index and in a query.
    assert migration_findings(ADD_K + later.replace("(k)", "(k2)").replace("SET k =", "SET k3 =")) == [
        "m1.sql:6: unresolved column 'k2'", "m1.sql:8: unresolved column 'k3'"]


def test_a_query_in_the_batch_of_the_alter_does_not_see_the_column() -> None:
    """SQL Server compiles the batch before it runs: error 207 for the query, while the DDL after
    the ALTER runs after it and sees the column."""
    same_batch = ADD_K.replace("    END;\nGO\n", "    END;\nCREATE INDEX [ix_t_k] ON [s].[t] (k);\n"
                                                 "UPDATE [s].[t] SET k = 1;\nGO\n")
    assert migration_findings(same_batch) == ["m1.sql:6: unresolved column 'k'"]
    # Nor does a guard help a query: it is compiled whether the branch runs or not.
    guarded = "IF COL_LENGTH(N'[s].[t]', N'k') IS NOT NULL\n    UPDATE [s].[t] SET k = 1;\n"
    assert migration_findings(guarded, ADD_K) == ["m1.sql:2: unresolved column 'k'"]


def test_the_other_files_do_not_see_what_a_migration_adds() -> None:
    name, text = MAIN
    main = (name, text.replace("SELECT m.id, m.a FROM", "SELECT m.id, m.k FROM"))
    line = main[1].count("\n", 0, main[1].index("m.k FROM")) + 1
    assert migration_findings(ADD_K, main=main) == [f"main.sql:{line}: unresolved column 'm.k'"]
    # Whatever the order of the files.
    report_ = check_sources([("m1.sql", ADD_K), main])
    assert [str(f) for f in report_.findings] == [f"main.sql:{line}: unresolved column 'm.k'"]
    # Nor does a second migration: each starts from the tables as the files create them.
    assert migration_findings(ADD_K, "UPDATE [s].[t] SET k = 1;\n") == ["m2.sql:1: unresolved column 'k'"]


def test_dropped_columns_constraints_indexes_and_tables_are_gone_after_the_drop() -> None:
    drops = ADD_K + """\
ALTER TABLE [s].[t] DROP CONSTRAINT [df_t_k];
ALTER TABLE [s].[t] DROP COLUMN k;
DROP INDEX [ix_t_a] ON [s].[t];
GO
SELECT m.k FROM [s].[t] AS m;
ALTER TABLE [s].[t] DROP CONSTRAINT [df_t_k];
ALTER INDEX [ix_t_a] ON [s].[t] REBUILD;
DROP TABLE [s].[t];
GO
SELECT 1 AS one FROM [s].[t];
"""
    assert migration_findings(drops) == [
        "m1.sql:10: unresolved column 'm.k'", "m1.sql:11: unresolved constraint '[df_t_k]' of table '[s].[t]'",
        "m1.sql:12: unresolved index '[ix_t_a]' of table '[s].[t]'", "m1.sql:15: unresolved table '[s].[t]'"]


def test_a_drop_may_name_what_is_not_there_only_if_it_says_so() -> None:
    """DROP ... IF EXISTS, and DDL under IF COL_LENGTH(...) IS NOT NULL naming that column, for what
    some file creates or adds; anything else dropped must be there. (A migration's steps run again
    after a deploy stopped halfway, on a table that may already have the new shape.)"""
    guarded = """\
DROP INDEX IF EXISTS [ux_t_k] ON [s].[t];
ALTER TABLE [s].[t] DROP CONSTRAINT IF EXISTS [df_t_k];
GO
IF COL_LENGTH(N'[s].[t]', N'k') IS NOT NULL AND OBJECT_ID(N'[s].[df_t_k2]', N'D') IS NULL
    ALTER TABLE [s].[t] ADD CONSTRAINT [df_t_k2] DEFAULT (0) FOR k;
GO
IF COL_LENGTH(N'[s].[t]', N'k') IS NOT NULL
    BEGIN
        ALTER TABLE [s].[t] DROP CONSTRAINT IF EXISTS [df_t_k2];
        ALTER TABLE [s].[t] DROP COLUMN k;
    END;
GO
"""
    elsewhere = ADD_K + "CREATE INDEX [ux_t_k] ON [s].[t] (k);\nGO\n"
    assert migration_findings(guarded, elsewhere) == []
    assert migration_findings(guarded) == [
        "m1.sql:1: unresolved index '[ux_t_k]' of table '[s].[t]'",
        "m1.sql:2: unresolved constraint '[df_t_k]' of table '[s].[t]'",
        "m1.sql:4: unresolved column 'k' of table '[s].[t]'", "m1.sql:5: unresolved column 'k'",
        "m1.sql:7: unresolved column 'k' of table '[s].[t]'", "m1.sql:10: unresolved column 'k' of table '[s].[t]'"]
    # Without the column's guard, ADD CONSTRAINT ... FOR k on a table that has no k any more.
    default_only = guarded.replace("IF COL_LENGTH(N'[s].[t]', N'k') IS NOT NULL AND OBJECT_ID", "IF OBJECT_ID")
    assert migration_findings(default_only, elsewhere) == ["m1.sql:5: unresolved column 'k'"]
    unguarded = "ALTER TABLE [s].[t] DROP COLUMN k;\nDROP INDEX [ux_t_k] ON [s].[t];\n"
    assert migration_findings(unguarded, elsewhere) == [
        "m1.sql:1: unresolved column 'k' of table '[s].[t]'",
        "m1.sql:2: unresolved index '[ux_t_k]' of table '[s].[t]'"]


def test_a_table_dropped_and_created_again_is_the_migrations_own() -> None:
    rebuild = """\
DROP TABLE [s].[t];
GO
CREATE TABLE [s].[t] (id uniqueidentifier NOT NULL, b int NULL, CONSTRAINT [pk_t] PRIMARY KEY (id));
CREATE INDEX [ix_t_b] ON [s].[t] (b);
GO
SELECT m.b FROM [s].[t] AS m;
SELECT m.a FROM [s].[t] AS m;
"""
    assert migration_findings(rebuild) == ["m1.sql:7: unresolved column 'm.a'"]
    # The main file's procedure still reads the table as that file creates it, whatever the order.
    assert [str(f) for f in check_sources([("m1.sql", rebuild), MAIN]).findings] == [
        "m1.sql:7: unresolved column 'm.a'"]


def test_what_a_procedure_does_to_the_schema_stays_in_its_body() -> None:
    """tSQLt's migration tests run a migration's batches in a test, rolled back after it."""
    test = """\
CREATE OR ALTER PROCEDURE [s].[test migration]
AS
BEGIN
    ALTER TABLE [s].[t] ADD k int NULL;
    CREATE INDEX [ix_t_k] ON [s].[t] (k);
    DROP INDEX [ix_t_a] ON [s].[t];
END;
GO
SELECT m.k FROM [s].[t] AS m;
ALTER INDEX [ix_t_a] ON [s].[t] REBUILD;
"""
    assert migration_findings(test) == ["m1.sql:9: unresolved column 'm.k'"]


def test_alter_table_forms_not_modelled_are_listed_as_skipped() -> None:
    result = check_sources([MAIN, ("m1.sql", "ALTER TABLE [s].[t] ALTER COLUMN a bigint NULL;\n")])
    assert result.findings == []
    assert [str(f) for f in result.skipped] == [
        "m1.sql:1: statement not modelled (alter_table_statement (ALTER COLUMN)); only its variables were checked"]


# ------------------------------------------------------------------------------------------------
# The renders


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_every_render_resolves_and_every_identifier_is_modelled(catalog_path) -> None:
    result = report(catalog_path)
    assert [str(f) for f in result.findings] == []
    # What cannot be resolved without a server is listed, not dropped: the handler of each
    # in-database worker (EXEC @handler_name, and its OBJECT_ID check).
    handlers = sum(1 for s in result.signatures if s.name.endswith("_process]"))
    assert handlers and collections.Counter(f.message for f in result.skipped) == {
        "EXEC @handler_name (a procedure named by a variable): not resolved": handlers,
        "OBJECT_ID(@handler_name) (an object named by a variable): not resolved": handlers}
    assert [(m.file, u) for m in result.models for u in m.unclaimed] == []
    # Every migration of every storage unit is among them, its statements modelled.
    assert any(f.startswith("build/lint/") and "-migrations/" in f for f, _ in checked_sources(catalog_path))


# ------------------------------------------------------------------------------------------------
# Mutants

MINIMUM_CAUGHT = 0.95
EXPLAINED_SURVIVORS = {
    # (token kind, why renaming it cannot be caught without a server)
    ("argument", "EXEC @handler_name"): "an argument of a procedure named by a variable: the callee, and so "
                                        "its parameters, are known only at run time",
}


DATE_PART_FUNCTIONS = {"dateadd", "datediff", "datediff_big", "datename", "datepart", "datetrunc", "date_bucket"}


def mutant_name(raw: str) -> str:
    """A name no rendered object has, written as the original was (bracketed, @variable, #temp)."""
    if raw.startswith("[") and raw.endswith("]"):
        return raw[:-1] + "_mutant]"
    return raw + "_mutant"


def mutants(result):
    """Every identifier reference of the report's batches (declarations are not references), with the
    tables the batch began with."""
    for model, schema in result.resolved:
        for index, token in enumerate(model.tokens):
            if not token.declares:
                yield model, schema, index


def reported_for(result, model, schema, rename=None) -> set:
    """What check-tsql reports for one batch of the report (its tokens renamed by ``rename``)."""
    return set(resolve_batch(result.catalog, model, rename, schema).findings)


def test_renamed_references_are_caught() -> None:
    """Every reference of every golden queue, tSQLt class and migration renamed in turn: >= 95%
    reported, and each survivor explained. The golden files, because the option matrix repeats their
    shapes. Caught means a finding the batch did not have before (test_every_render_resolves... says
    whether it had any)."""
    result = report(CATALOGS[0])
    models = [model for model, _ in result.resolved]
    before = {id(model): reported_for(result, model, schema) for model, schema in result.resolved}
    total, survivors = 0, []
    by_kind: collections.Counter = collections.Counter()
    for model, schema, index in mutants(result):
        total += 1
        token = model.tokens[index]
        by_kind[token.what] += 1
        if not reported_for(result, model, schema, {index: mutant_name(token.raw)}) - before[id(model)]:
            survivors.append((model, token))
    # Identifiers the model does not use could not be caught either: they count as survivors.
    unclaimed = [u for m in models for u in m.unclaimed]
    caught_share = (total - len(survivors)) / (total + len(unclaimed))
    print(f"\n{total} mutants ({dict(by_kind)}), {total - len(survivors)} caught ({caught_share:.2%}), "
          f"{len(survivors) + len(unclaimed)} survivors:")
    unexplained = []
    for model, token in survivors:
        line = next(l for l in _file_lines(model) if l[0] == token.line)[1].strip()
        why = next((w for (what, context), w in EXPLAINED_SURVIVORS.items()
                    if token.what == what and context in line), None)
        print(f"  {model.file}:{token.line}: {token.raw} ({token.what}): {why or 'NOT EXPLAINED'}")
        if why is None:
            unexplained.append((model.file, token.line, token.raw))
    assert total > 10000
    assert caught_share >= MINIMUM_CAUGHT and unexplained == [] and unclaimed == []


def _file_lines(model):
    text = dict(checked_sources(CATALOGS[0]))[model.file]
    return list(enumerate(text.splitlines(), start=1))


def test_renaming_in_the_model_equals_renaming_in_the_text() -> None:
    """A sample of mutants, one or two of each kind, re-parsed from edited text: check-tsql reports
    in the batch exactly what renaming the token in the model reported. (A renamed name in a schema
    change may also change what later batches of its file see: the model resolves one batch.)"""
    result = report(CATALOGS[0])
    sources = list(checked_sources(CATALOGS[0]))
    reported = set(result.findings)
    top_level = {id(model) for model in result.models}     # not the EXEC'd literals: no batch of their own
    # A renamed date function is no longer one to the parser: its date part (SECOND) then reads as a
    # column, a change of the text's grammar that renaming the token in the model cannot show.
    sample = [(model, schema, index) for model, schema, index in mutants(result) if id(model) in top_level and (
              model.file.startswith(("database/", "build/")) or "test_emails" in model.file)
              and model.tokens[index].name not in DATE_PART_FUNCTIONS]
    chosen: dict[str, list] = collections.defaultdict(list)
    for model, schema, index in sorted(sample, key=lambda msi: random.Random(f"{msi[0].file}{msi[2]}").random()):
        what = model.tokens[index].what
        if len(chosen[what]) < 2:
            chosen[what].append((model, schema, index))
    assert {"column", "table", "alias", "variable", "type", "procedure", "argument", "schema", "index",
            "constraint"} <= set(chosen)
    for model, schema, index in (msi for triples in chosen.values() for msi in triples):
        token = model.tokens[index]
        expected = reported_for(result, model, schema, {index: mutant_name(token.raw)}) - reported_for(
            result, model, schema)
        batch_text = next(b.text for b in tsqlcheck.split_batches(dict(sources)[model.file])
                          if b.line == model.first_line)
        last_line = model.first_line + batch_text.count("\n")
        mutated = batch_text[:token.start] + mutant_name(token.raw) + batch_text[token.end:]
        edited = [(name, text.replace(batch_text, mutated, 1) if name == model.file else text)
                  for name, text in sources]
        new = set(check_sources(edited).findings) - reported
        in_batch = {f for f in new if f.file == model.file and model.first_line <= f.line <= last_line}
        assert expected and in_batch == expected, (model.file, token)
        assert all(f.file == model.file and f.line > last_line for f in new - in_batch), (model.file, token)


def test_saved_analyses_are_reused_until_their_batch_or_the_checker_changes(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make test` checks the same renders in `make lint` and in pytest: the second run reads what the
    first parsed. Only a batch of the same file, line and text is reused, with its findings; a batch
    moved down a line, copied to another file or edited is parsed again and reported where it now is,
    and the edited batch's old analysis leaves the saved file."""
    saved = tmp_path / "analyses.pickle"
    monkeypatch.setattr(tsqlcheck, "_saved_analyses_path", lambda: saved)
    monkeypatch.setattr(tsqlcheck, "_checker_fingerprint", lambda code=None: saved.stem)
    monkeypatch.setattr(tsqlcheck, "SAVE_AFTER_PARSING", 1)
    parsed: list[str] = []

    def sequential(function, items, size, processes=None):  # noqa: ANN001 - map_batches' signature
        parsed.extend(item[2] for item in items)
        return [function(item) for item in items]

    monkeypatch.setattr(tsqlcheck, "map_batches", sequential)
    batches = [f"CREATE TABLE [dbo].[t{i}] ([id] int NOT NULL);\n" for i in range(3)] + [
        "SELECT [nope] FROM [dbo].[t0];\n"]
    text = "GO\n".join(batches)

    def fresh_process() -> None:
        for name, value in (("_ANALYSES", {}), ("_READ_FILES", set()), ("_USED", set()), ("_LAST_USED", {}),
                            ("_LOADED", False)):
            monkeypatch.setattr(tsqlcheck, name, value)
        parsed.clear()

    def outcome(report: tsqlcheck.Report) -> tuple:
        return (sorted((f.file, f.line, f.message) for f in report.findings), sorted(map(str, report.violations)),
                [(model.file, model.first_line, len(model.tokens)) for model in report.models])

    fresh_process()
    first = check_sources([("x.sql", text)])
    assert len(parsed) == 4 and saved.is_file()
    assert [(f.file, f.line) for f in first.findings] == [("x.sql", 7)]
    fresh_process()
    assert outcome(check_sources([("x.sql", text)])) == outcome(first) and parsed == []
    fresh_process()
    edited = check_sources([("x.sql", "GO\n".join([*batches[:3], "SELECT [id] FROM [dbo].[t0];\n"]))])
    assert parsed == ["SELECT [id] FROM [dbo].[t0];"] and not edited.findings

    def saved_keys() -> set:
        with saved.open("rb") as file:
            return set(pickle.load(file))

    old_key = ("x.sql", 7, hashlib.sha256(batches[3].rstrip("\n").encode("utf-8")).hexdigest())
    assert old_key not in saved_keys() and {key[1] for key in saved_keys()} == {1, 3, 5, 7}
    fresh_process()
    moved = check_sources([("x.sql", "GO\n" + text)])
    assert len(parsed) == 4 and [(f.file, f.line) for f in moved.findings] == [("x.sql", 8)]
    fresh_process()
    copied = check_sources([("y.sql", text)])
    assert len(parsed) == 4 and [(f.file, f.line) for f in copied.findings] == [("y.sql", 7)]
    # the file y.sql's run did not read keeps what the run before it saved
    assert {key[:2] for key in saved_keys()} == {("x.sql", 2), ("x.sql", 4), ("x.sql", 6), ("x.sql", 8),
                                                 ("y.sql", 1), ("y.sql", 3), ("y.sql", 5), ("y.sql", 7)}


def test_the_saved_analyses_are_named_by_the_checker_that_made_them(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tsqlcheck._saved_analyses_path()
    # the same name in another process (make lint's check-tsql, then pytest), from another directory
    program = "from tablequeue import tsqlcheck; print(tsqlcheck._saved_analyses_path())"
    other = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "random"})
    assert other.stdout.strip() == str(path)
    assert path is not None and path.parent.name == "check-tsql-cache"
    assert path.stem == tsqlcheck._checker_fingerprint()
    assert tsqlcheck._checker_fingerprint("other code") != path.stem

    class OtherConfig:
        class config:  # noqa: N801 - stands in for the linter's config
            _configs = {"core": {"max_parse_depth": 1}}

    with monkeypatch.context() as patched:
        patched.setattr(tsqltree, "_linter", lambda: OtherConfig)
        assert tsqlcheck._checker_fingerprint() != path.stem
    # code changed on disk during the run: nothing is saved under the name of the code it started with
    with monkeypatch.context() as patched:
        patched.setattr(tsqlcheck, "_saved_analyses_path", lambda: tmp_path / f"{path.stem}.pickle")
        patched.setattr(tsqlcheck, "_code_digest", lambda: "edited since the import")
        tsqlcheck._save_analyses()
    assert not list(tmp_path.iterdir())
    tsqlcheck._saved_analyses_path.cache_clear()
    try:
        with monkeypatch.context() as patched:
            patched.setenv(tsqlcheck.CACHE_SWITCH, "off")
            assert tsqlcheck._saved_analyses_path() is None
    finally:
        tsqlcheck._saved_analyses_path.cache_clear()
