"""check-tsql resolves every reference of the rendered T-SQL, and catches a renamed one.

The mutant test renames each identifier reference of the rendered queues in turn (column, table,
alias, variable, type, procedure, argument, function, role, schema) and requires check-tsql to
report it; renaming goes through the model (no re-parse per mutant), and a sample of mutants is
re-parsed from edited text to show that this is the same thing.
"""
from __future__ import annotations

import collections
import random

import pytest

from tablequeue import tsqlcheck
from tablequeue.tsqlcheck import check_sources, resolve_batch
from tsql_renders import CATALOGS, golden_sources, report

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
         "5: unresolved constraint 'ck_nope'", "6: unresolved procedure 'tSQLt.Nope'"]),
    "objects named in strings": (
        "SELECT OBJECT_ID(N'[s].[t]') AS t, OBJECT_ID(N'[s].[x]') AS x, TYPE_ID(N'[s].[items]') AS i,\n"
        "    SCHEMA_ID(N'nope') AS n, DATABASE_PRINCIPAL_ID(N's_admin') AS r;",
        ["1: unresolved table '[s].[x]'", "2: unresolved schema 'nope'"]),
    "built-in functions": (
        "SELECT SYSUTCDATETIME() AS now_utc, NOTAFUNCTION(1) AS nope;", ["1: unresolved function 'NOTAFUNCTION'"]),
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


# ------------------------------------------------------------------------------------------------
# Mutants

MINIMUM_CAUGHT = 0.95
EXPLAINED_SURVIVORS = {
    # (token kind, why renaming it cannot be caught without a server)
    ("argument", "EXEC @handler_name"): "an argument of a procedure named by a variable: the callee, and so "
                                        "its parameters, are known only at run time",
}


def mutant_name(raw: str) -> str:
    """A name no rendered object has, written as the original was (bracketed, @variable, #temp)."""
    if raw.startswith("[") and raw.endswith("]"):
        return raw[:-1] + "_mutant]"
    return raw + "_mutant"


def mutants(models):
    """Every identifier reference of the models (declarations are not references)."""
    for model in models:
        for index, token in enumerate(model.tokens):
            if not token.declares:
                yield model, index


def test_renamed_references_are_caught() -> None:
    """Every reference of every golden queue and tSQLt class renamed in turn: >= 95% reported, and
    each survivor explained. The golden files, because the option matrix repeats their shapes."""
    result = report(CATALOGS[0])
    assert result.findings == []
    models = [m for m in tsqlcheck.with_dynamic_sql(result.models)]
    total, survivors = 0, []
    by_kind: collections.Counter = collections.Counter()
    for model, index in mutants(models):
        total += 1
        token = model.tokens[index]
        by_kind[token.what] += 1
        caught = resolve_batch(result.catalog, model, {index: mutant_name(token.raw)}).findings
        if not caught:
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
    text = dict(golden_sources())[model.file]
    return list(enumerate(text.splitlines(), start=1))


def test_renaming_in_the_model_equals_renaming_in_the_text() -> None:
    """A sample of mutants, one or two of each kind, re-parsed from edited text: check-tsql reports
    exactly what renaming the token in the model reported."""
    result = report(CATALOGS[0])
    sources = golden_sources()
    models = [m for m in result.models if m.file.startswith("database/") or "test_emails" in m.file]
    chosen: dict[str, list] = collections.defaultdict(list)
    for model, index in sorted(mutants(models), key=lambda mi: random.Random(f"{mi[0].file}{mi[1]}").random()):
        what = model.tokens[index].what
        if len(chosen[what]) < 2:
            chosen[what].append((model, index))
    assert {"column", "table", "alias", "variable", "type", "procedure", "argument", "schema"} <= set(chosen)
    for model, index in (mi for pairs in chosen.values() for mi in pairs):
        token = model.tokens[index]
        expected = sorted(map(str, resolve_batch(result.catalog, model, {index: mutant_name(token.raw)}).findings))
        batch_text = next(b.text for b in tsqlcheck.split_batches(dict(sources)[model.file])
                          if b.line == model.first_line)
        mutated = batch_text[:token.start] + mutant_name(token.raw) + batch_text[token.end:]
        edited = [(name, text.replace(batch_text, mutated, 1) if name == model.file else text)
                  for name, text in sources]
        assert expected and sorted(map(str, check_sources(edited).findings)) == expected, (model.file, token)
