"""Static checks of DESIGN.md's rules on every rendered object of every kind and option.

No SQL Server runs here, so what a reviewer would check by eye is checked by machine, on the sqlfluff
parse tree (tablequeue.tsqlrules; `check-tsql` runs the same rules): each rule over every rendered
procedure of both catalogs; the exact shape each rule accepts, written out; and each rule firing on
a real rendered procedure with the defect seeded into its text. The PostgreSQL twin's security
settings are checked here too.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tablequeue.catalog import load_catalog
from tablequeue.gosplit import split_batches
from tablequeue.render import render_catalog
from tablequeue.tsqlcheck import check_sources
from tablequeue.tsqlrules import check_python, rule_batch_cap, procedures
from tablequeue.tsqltree import child, descendants, parse_batch
from tsql_renders import CATALOGS, MATRIX, REPO, report

RULES = ["readpast", "nolock", "transaction-guard", "xact-abort", "updlock", "table-order", "batch-cap",
         "transient-retry", "bury-guard", "select-star", "update-payload", "dynamic-sql", "abs-checksum", "options", "grants",
         "claim-pin", "fake-pin"]
TOOL_MODULES = sorted((REPO / "tools" / "tablequeue").glob("*.py")) + sorted((REPO / "pipelines").glob("*.py"))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_every_rendered_procedure_follows_the_rule(catalog_path: Path, rule: str) -> None:
    found = [str(v) for v in report(catalog_path).violations if v.rule == rule]
    if rule == "readpast":     # the tool's own queries too (deploy's message counts)
        found += [str(v) for v in check_python(TOOL_MODULES)]
    assert found == []


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_every_dequeue_claims_with_the_lock_hints(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    claims = [c for b in report(catalog_path).batches for c in b.claims]
    for queue in catalog.queues:
        procedure = f"[{catalog.schema}].[{queue.name}_dequeue]"
        mine = [c for c in claims if c.procedure == procedure]
        assert mine, f"{procedure}: no claim"
        for claim in mine:
            assert {"ROWLOCK", "UPDLOCK", "READCOMMITTEDLOCK"} <= set(claim.hints), claim
            # Strict FIFO waits for the head instead of skipping it (docs: the order is exact).
            assert ("READPAST" in claim.hints) != bool(queue.options.get("strict")), claim


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_grants_go_to_the_schema_roles_and_names_are_quoted(catalog_path: Path) -> None:
    schema = load_catalog(catalog_path).schema
    for model in report(catalog_path).models:
        for statement in model.statements:
            for role in getattr(statement, "roles", []):
                # Deployed code grants to the schema roles only; a tSQLt test may also grant to a user
                # it creates for the test (test_...), never to a principal of the database.
                allowed = rf"\[{schema}_(producer|consumer|admin)\]"
                if Path(model.file).name.startswith("test_"):      # a tSQLt class
                    allowed += r"|\[test_\w+\]"
                assert re.fullmatch(allowed, model.tokens[role].raw), (model.file, model.tokens[role])
        tokens = model.tokens
        for index, token in enumerate(tokens):
            # A catalog name is always quoted, so that no name can change the meaning of the SQL.
            if token.what == "schema" and token.name == schema:
                assert token.raw == f"[{schema}]" and tokens[index + 1].raw.startswith("["), (model.file, token)


# ------------------------------------------------------------------------------------------------
# What each rule accepts, exactly as DESIGN.md §4 and the issue define it

ACCEPTED = """\
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO
CREATE TABLE [s].[q] (
    id bigint NOT NULL,
    priority int NOT NULL,
    CONSTRAINT [pk_q] PRIMARY KEY CLUSTERED (id)
);
CREATE NONCLUSTERED INDEX [ix_q_claim] ON [s].[q] (priority DESC, id);
GO
CREATE OR ALTER PROCEDURE [s].[q_take]
    @batch_size int = 1,
    @items [s].[q_items] READONLY
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT OFF;
    DECLARE @error_message nvarchar(2048);
    IF @batch_size IS NULL OR @batch_size NOT BETWEEN 1 AND 1000
        BEGIN
            SET @error_message = N's.q_take: batch_size must be between 1 and 1000.';
            THROW 51001, @error_message, 1;
        END;
    IF (SELECT COUNT(*) FROM @items) > 1000
        THROW 51001, N's.q_take: at most 1000 items.', 1;
    SET XACT_ABORT ON;
    DECLARE @key_holder bigint;
    DECLARE @priority int;
    DECLARE @started_transaction bit = 0;
    BEGIN TRY
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0 AND @batch_size > 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;
        WITH head AS (
            SELECT TOP (@batch_size) m.id
            FROM [s].[q] AS m WITH (INDEX ([pk_q]), ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK)
            ORDER BY m.id
        )
        DELETE FROM head
        OUTPUT DELETED.id INTO [s].[q_history] (id);
        SET @priority = (
            SELECT TOP (1) m.priority FROM [s].[q] AS m WITH (INDEX ([ix_q_claim]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK)
            WHERE m.priority < @priority
            ORDER BY m.priority DESC
        );
        SELECT @key_holder = m.id FROM [s].[q] AS m WITH (UPDLOCK, HOLDLOCK) WHERE m.id = 0;
        IF @@ROWCOUNT = 0
            THROW 51004, N's.q_take: a state error, in the procedure's own unit of work.', 1;
        INSERT INTO [s].[q_dead] (id) SELECT i.ordinal FROM @items AS i;
        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
GRANT EXECUTE ON OBJECT::[s].[q_take] TO [s_consumer];
GO
-- The in-database worker commits per message: it refuses a caller's transaction, then owns its own,
-- each in the lock order (a claim burying a message, then its completion).
CREATE OR ALTER PROCEDURE [s].[q_process]
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT OFF;
    IF @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0
        THROW 51003, N's.q_process: cannot run inside an open transaction.', 1;
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    WITH head AS (
        SELECT TOP (1) m.id
        FROM [s].[q] AS m WITH (INDEX ([ix_q_claim]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK)
        WHERE m.priority = 1
        ORDER BY m.id
    )
    DELETE FROM head
    OUTPUT DELETED.id INTO [s].[q_dead] (id);
    COMMIT TRANSACTION;
    BEGIN TRANSACTION;
    DELETE FROM [s].[q] OUTPUT DELETED.id INTO [s].[q_history] (id) WHERE id = 1;
    COMMIT TRANSACTION;
END;
GO
GRANT EXECUTE ON OBJECT::[s].[q_process] TO [s_admin];
GO
"""


def violations(text: str, rule: str, file: str = "seeded.sql", procedure: str | None = None) -> list[str]:
    """The rule's violations in one file, as check-tsql prints them; of one procedure (of any schema)
    if given."""
    return [str(v) for v in check_sources([(file, text)]).violations
            if v.rule == rule and (procedure is None or (v.procedure or "").endswith(f"].[{procedure}]"))]


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_accepts_the_prescribed_shape(rule: str) -> None:
    assert violations(ACCEPTED, rule) == []


# ------------------------------------------------------------------------------------------------
# Seeded defects: a real rendered procedure, the defect written into its text, the rule firing with
# the file, procedure and line. Seeds keep the line count, so the other batches stay as rendered.

GOLDEN = REPO / "database" / "rendered" / "mssql"


def golden(name: str) -> tuple[str, str]:
    path = GOLDEN / name
    return str(path.relative_to(REPO)), path.read_text(encoding="utf-8")


def matrix(name: str) -> tuple[str, str]:
    """A file of the option matrix, named as `make lint` writes it."""
    rendered = next(f for f in render_catalog(load_catalog(MATRIX), "mssql") if f.name == name)
    return f"build/lint/mssql/{name}", rendered.text


def procedure_batch(text: str, procedure: str) -> str:
    return next(b.text for b in split_batches(text) if re.search(rf"PROCEDURE \[\w+\]\.\[{procedure}\]", b.text))


def seed(text: str, procedure: str, edit) -> str:
    """``text`` with ``edit(batch) -> batch`` applied to one procedure's batch, lines kept."""
    batch = procedure_batch(text, procedure)
    seeded = edit(batch)
    assert seeded.count("\n") == batch.count("\n"), "a seed keeps the lines where they were"
    return text.replace(batch, seeded, 1)


def replace(old: str, new: str, count: int = 1):
    def edit(batch: str) -> str:
        assert old in batch, f"seed text not found: {old!r}"
        return batch.replace(old, new, count)
    return edit


def on_line_of(anchor: str, transform):
    """Rewrite the (first) line containing ``anchor``: transform(indent, line) -> new line."""
    def edit(batch: str) -> str:
        lines = batch.split("\n")
        index = next(i for i, line in enumerate(lines) if anchor in line)
        indent = lines[index][:len(lines[index]) - len(lines[index].lstrip())]
        lines[index] = transform(indent, lines[index])
        return "\n".join(lines)
    return edit


def before_line_of(anchor: str, old: str, new: str):
    """Replace ``old`` by ``new`` on the line before the (first) line containing ``anchor``."""
    def edit(batch: str) -> str:
        lines = batch.split("\n")
        index = next(i for i, line in enumerate(lines) if anchor in line) - 1
        assert old in lines[index], f"seed text not found: {old!r}"
        lines[index] = lines[index].replace(old, new)
        return "\n".join(lines)
    return edit


def line_of(text: str, procedure: str, anchor: str, occurrence: int = 1) -> int:
    """The file line of the ``occurrence``-th line with ``anchor`` in the procedure's batch."""
    batch = procedure_batch(text, procedure)
    start = text.index(batch)
    at = -1
    for _ in range(occurrence):
        at = batch.index(anchor, at + 1)
    return text[:start + at].count("\n") + 1


STATS_PROBE = "FROM [queue].[emails_dead] AS d WITH (READPAST, READCOMMITTEDLOCK)"
PROBE_DEFECTS = {   # rule: (the probe's hints, the violation)
    "readpast": ("READPAST", "READPAST without READCOMMITTEDLOCK (WITH (READPAST)) is refused under "
                             "READ_COMMITTED_SNAPSHOT"),
    "nolock": ("NOLOCK", "WITH (NOLOCK) reads uncommitted rows"),
    "updlock": ("READPAST, UPDLOCK, READCOMMITTEDLOCK",
                "UPDLOCK outside a claim (WITH (READPAST, UPDLOCK, READCOMMITTEDLOCK)): a look-up holds U locks to "
                "the end of the transaction; probe with READPAST, READCOMMITTEDLOCK, or lock a key with UPDLOCK, "
                "HOLDLOCK"),
}


# The priority probe of a claim (a loose index scan: which level to claim from next) skips locked
# rows and takes none it keeps: ROWLOCK so that READPAST skips row locks reliably, never UPDLOCK.
PRIORITY_PROBE = re.compile(r"(SELECT TOP \(1\) m\.priority\s+FROM \[queue\]\.\[thumbnails\] AS m WITH \()"
                            r"(?:[^()]|\([^()]*\))*\)")


def test_the_priority_probe_reads_past_with_row_locks_and_never_updlock() -> None:
    file, text = golden("thumbnails.sql")
    batch = procedure_batch(text, "thumbnails_dequeue")
    probes = [text[:text.index(batch) + match.start()].count("\n") + 2 for match in PRIORITY_PROBE.finditer(batch)]
    assert probes

    def probe_hints(hints: str):
        return lambda b: PRIORITY_PROBE.sub(lambda match: f"{match.group(1)}{hints})", b)

    rowlock = seed(text, "thumbnails_dequeue", probe_hints("ROWLOCK, READPAST, READCOMMITTEDLOCK"))
    assert [v for rule in ("updlock", "readpast", "nolock")
            for v in violations(rowlock, rule, file, "thumbnails_dequeue")] == []
    claims = [c for b in check_sources([(file, rowlock)]).batches for c in b.claims
              if c.procedure == "[queue].[thumbnails_dequeue]"]
    assert claims and all({"ROWLOCK", "READPAST", "UPDLOCK", "READCOMMITTEDLOCK"} <= set(c.hints) for c in claims)
    updlock = seed(text, "thumbnails_dequeue", probe_hints("ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK"))
    assert violations(updlock, "updlock", file, "thumbnails_dequeue") == [
        f"{file}:{line}: updlock: UPDLOCK outside a claim (WITH (ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK)): a "
        "look-up holds U locks to the end of the transaction; probe with READPAST, READCOMMITTEDLOCK, or lock a key "
        "with UPDLOCK, HOLDLOCK (procedure [queue].[thumbnails_dequeue])" for line in probes]


@pytest.mark.parametrize("rule", PROBE_DEFECTS)
def test_a_wrong_hint_on_a_probe_is_refused(rule: str) -> None:
    hints, message = PROBE_DEFECTS[rule]
    file, text = golden("emails.sql")
    seeded = seed(text, "emails_stats", replace(STATS_PROBE, f"FROM [queue].[emails_dead] AS d WITH ({hints})"))
    assert violations(seeded, rule, file, "emails_stats") == [
        f"{file}:{line_of(text, 'emails_stats', STATS_PROBE)}: {rule}: {message} (procedure [queue].[emails_stats])"]


def test_readpast_in_the_tool_queries_is_checked(tmp_path: Path) -> None:
    module = tmp_path / "counts.py"
    module.write_text('def count(cursor, schema, name, limit):\n'
                      '    return cursor.execute(f"SELECT COUNT_BIG(*) FROM (SELECT TOP (?) 1 AS one FROM "\n'
                      '                          f"[{schema}].[{name}] WITH (READPAST)) AS m", limit)\n'
                      'FIXED = "SELECT COUNT_BIG(*) FROM [s].[t] WITH (READPAST, READCOMMITTEDLOCK)"\n'
                      'PROSE = "READPAST skips locked rows"\n')
    assert [str(v) for v in check_python([module])] == [
        f"{module}:2: readpast: READPAST without READCOMMITTEDLOCK (WITH (READPAST)) is refused under "
        "READ_COMMITTED_SNAPSHOT"]


def test_begin_transaction_without_the_implicit_transactions_check_is_refused() -> None:
    file, text = golden("emails.sql")
    guard = "IF @@TRANCOUNT = 0"
    line = line_of(text, "emails_fail", "BEGIN TRANSACTION;")
    message = (f"{file}:{line}: transaction-guard: BEGIN TRANSACTION outside IF @@TRANCOUNT = 0 AND "
               "(@@OPTIONS & 2) = 0: a caller with IMPLICIT_TRANSACTIONS ON gets two levels (error 266) "
               "(procedure [queue].[emails_fail])")
    # The guard as it was before IMPLICIT_TRANSACTIONS was known, and the two checks OR-ed.
    for condition in ("IF @@TRANCOUNT = 0", "IF @@TRANCOUNT = 0 OR (@@OPTIONS & 2) = 0"):
        seeded = seed(text, "emails_fail", on_line_of(guard, lambda indent, _, c=condition: indent + c))
        assert message in violations(seeded, "transaction-guard", file, "emails_fail"), condition


def test_commit_outside_started_transaction_is_refused() -> None:
    file, text = golden("emails.sql")
    commit = "IF @started_transaction = 1 COMMIT TRANSACTION;"
    seeded = seed(text, "emails_fail", replace(commit, "COMMIT TRANSACTION;"))
    assert (f"{file}:{line_of(text, 'emails_fail', commit)}: transaction-guard: COMMIT outside IF "
            "@started_transaction = 1: it would end a transaction the procedure did not begin (procedure "
            "[queue].[emails_fail])") in violations(seeded, "transaction-guard", file, "emails_fail")


def test_the_worker_owns_its_transactions_only_when_it_refuses_implicit_ones() -> None:
    file, text = golden("thumbnails.sql")
    refusal = "IF @@TRANCOUNT > 0"
    seeded = seed(text, "thumbnails_process", on_line_of(refusal, lambda indent, _: indent + "IF @@TRANCOUNT > 0 "))
    found = violations(seeded, "transaction-guard", file, "thumbnails_process")
    assert found
    assert any("COMMIT outside IF @started_transaction = 1" in v for v in found)


def test_argument_checks_without_xact_abort_off_are_refused() -> None:
    """THROW honours the session's XACT_ABORT: a caller whose session has it ON (engines.connect sets
    it) would have its transaction doomed by an argument check, unless the procedure sets it OFF."""
    file, text = golden("emails.sql")
    assert violations(text, "xact-abort", file, "emails_dequeue") == []
    seeded = seed(text, "emails_dequeue", replace("SET XACT_ABORT OFF;", ""))
    first_throw = line_of(text, "emails_dequeue", "THROW 51001")
    assert violations(seeded, "xact-abort", file, "emails_dequeue") == [
        f"{file}:{first_throw}: xact-abort: argument check THROW without SET XACT_ABORT OFF before it: a caller "
        "whose session has XACT_ABORT ON would have its transaction doomed; start with SET NOCOUNT ON; SET "
        "XACT_ABORT OFF; (procedure [queue].[emails_dequeue])"]


def test_xact_abort_off_only_around_one_insert_that_retries_a_duplicate_key() -> None:
    """The grouped producer's new group row: one INSERT ... VALUES under XACT_ABORT OFF (a duplicate
    key leaves the transaction committable), ON again in both the TRY and the CATCH, and only a
    duplicate key is swallowed. Any other shape of the window is the old violation."""
    file, text = matrix("fifo_groups_plain.sql")
    proc = "fifo_groups_plain_enqueue"
    assert violations(text, "xact-abort", file, proc) == []
    off = line_of(text, proc, "SET XACT_ABORT OFF;", 2)
    message = (f"{file}:{off}: xact-abort: SET XACT_ABORT OFF after SET XACT_ABORT ON (line "
               f"{line_of(text, proc, 'SET XACT_ABORT ON;')}): the procedure's work must run under XACT_ABORT ON "
               f"(procedure [matrix].[{proc}])")
    defects = [
        # Every error swallowed, not only a duplicate key.
        replace("IF ERROR_NUMBER() NOT IN (2601, 2627) OR XACT_STATE() <> 1 THROW;",
                "IF XACT_STATE() <> 1 THROW;"),
        # The CATCH forgets to turn XACT_ABORT back ON.
        before_line_of("IF ERROR_NUMBER() NOT IN (2601, 2627)", "SET XACT_ABORT ON;", "PRINT 1;"),
        # A second statement runs under XACT_ABORT OFF.
        on_line_of("VALUES (@group);", lambda indent, line: line + " SET @group_head = 0;"),
        # The duplicate check reads a table (SELECT) under XACT_ABORT OFF.
        on_line_of("VALUES (@group);",
                   lambda indent, line: line.replace("VALUES (@group);", "SELECT @group;")),
    ]
    for defect in defects:
        assert message in violations(seed(text, proc, defect), "xact-abort", file, proc), defect


def test_xact_abort_off_only_around_the_looks_record_in_the_session_context() -> None:
    """The look for expired leases records itself with sys.sp_set_session_context under XACT_ABORT OFF
    (a read-only key, 15664, or a full session context, 15665, would otherwise roll back the caller's
    transaction): the same window as the duplicate key's, for that EXEC and those two numbers only."""
    file, text = golden("emails.sql")
    proc = "emails_dequeue"
    assert violations(text, "xact-abort", file, proc) == []
    off = line_of(text, proc, "SET XACT_ABORT OFF;", 2)
    message = (f"{file}:{off}: xact-abort: SET XACT_ABORT OFF after SET XACT_ABORT ON (line "
               f"{line_of(text, proc, 'SET XACT_ABORT ON;')}): the procedure's work must run under XACT_ABORT ON "
               f"(procedure [queue].[{proc}])")
    defects = [
        # Every error swallowed, not only the session context's refusals.
        replace("IF ERROR_NUMBER() NOT IN (15664, 15665) OR XACT_STATE() = -1 THROW;", "IF XACT_STATE() = -1 THROW;"),
        # A duplicate key's numbers: not what this EXEC meets.
        replace("IF ERROR_NUMBER() NOT IN (15664, 15665)", "IF ERROR_NUMBER() NOT IN (2601, 2627)"),
        # Another procedure called under XACT_ABORT OFF.
        replace("EXEC sys.sp_set_session_context", "EXEC sys.sp_rename"),
        # A procedure whose name only starts with it.
        replace("EXEC sys.sp_set_session_context", "EXEC sys.sp_set_session_context_x"),
        # The key made read-only: every later write would be refused.
        replace("@value = @look_after;", "@value = @look_after, @read_only = 1;"),
        # A second statement runs under XACT_ABORT OFF.
        on_line_of("@value = @look_after;", lambda indent, line: line + " SET @look_after = @now;"),
    ]
    for defect in defects:
        assert message in violations(seed(text, proc, defect), "xact-abort", file, proc), defect


def test_argument_throw_after_xact_abort_is_refused() -> None:
    file, text = golden("emails.sql")

    def xact_abort_before_the_checks(batch: str) -> str:     # SET XACT_ABORT ON right after the OFF
        lines = ["" if line.strip() == "SET XACT_ABORT ON;" else line for line in batch.split("\n")]
        index = next(i for i, line in enumerate(lines) if "SET XACT_ABORT OFF;" in line)
        lines[index] += " SET XACT_ABORT ON;"
        return "\n".join(lines)

    seeded = seed(text, "emails_dequeue", xact_abort_before_the_checks)
    xact = line_of(text, "emails_dequeue", "SET XACT_ABORT OFF;")
    first_throw = line_of(text, "emails_dequeue", "THROW 51001")
    assert (f"{file}:{first_throw}: xact-abort: THROW outside BEGIN TRY after SET XACT_ABORT ON (line {xact}): it "
            "dooms the caller's transaction; check arguments before SET XACT_ABORT ON, raise state errors in TRY "
            "(procedure [queue].[emails_dequeue])") in violations(seeded, "xact-abort", file, "emails_dequeue")
    # And XACT_ABORT turned OFF again once the work has begun.
    off_again = seed(text, "emails_dequeue",
                     on_line_of("BEGIN TRY", lambda indent, line: line + " SET XACT_ABORT OFF;"))
    assert (f"{file}:{line_of(text, 'emails_dequeue', 'BEGIN TRY')}: xact-abort: SET XACT_ABORT OFF after SET "
            f"XACT_ABORT ON (line {line_of(text, 'emails_dequeue', 'SET XACT_ABORT ON;')}): the procedure's work "
            "must run under XACT_ABORT ON (procedure [queue].[emails_dequeue])") in violations(
        off_again, "xact-abort", file, "emails_dequeue")


def test_xact_abort_after_the_first_table_access_is_refused() -> None:
    file, text = golden("emails.sql")

    def xact_abort_last(batch: str) -> str:
        lines = ["" if line.strip() == "SET XACT_ABORT ON;" else line for line in batch.split("\n")]
        lines[-1] = "SET XACT_ABORT ON; " + lines[-1]     # before the closing END;
        return "\n".join(lines)

    batch = procedure_batch(text, "emails_complete")
    found = violations(text.replace(batch, xact_abort_last(batch), 1), "xact-abort", file, "emails_complete")
    delete = line_of(text, "emails_complete", "DELETE FROM [queue].[emails]")
    assert any(v.startswith(f"{file}:{delete}: xact-abort: reads or writes a table or begins a transaction before "
                            "SET XACT_ABORT ON") for v in found), found


def test_nocount_must_come_first() -> None:
    file, text = golden("emails.sql")
    seeded = seed(text, "emails_purge", on_line_of("SET NOCOUNT ON;", lambda i, l: i + "DECLARE @first int;" + l))
    assert violations(seeded, "xact-abort", file, "emails_purge") == [
        f"{file}:{line_of(text, 'emails_purge', 'SET NOCOUNT ON;')}: xact-abort: the first statement is not SET "
        "NOCOUNT ON (procedure [queue].[emails_purge])"]


def test_a_claim_needs_readpast_unless_it_is_the_strict_delete() -> None:
    file, text = golden("emails.sql")
    claim = "ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK)"
    line = line_of(text, "emails_dequeue", claim)
    seeded = seed(text, "emails_dequeue", replace(claim, "ROWLOCK, UPDLOCK, READCOMMITTEDLOCK)"))
    assert violations(seeded, "updlock", file, "emails_dequeue") == [
        f"{file}:{line}: updlock: a claim without READPAST is only the strict FIFO's CTE-then-DELETE "
        "(procedure [queue].[emails_dequeue])"]
    seeded = seed(text, "emails_dequeue", replace(claim, "READPAST, UPDLOCK)"))
    assert violations(seeded, "updlock", file, "emails_dequeue") == [
        f"{file}:{line}: updlock: a claim without ROWLOCK and READCOMMITTEDLOCK (procedure [queue].[emails_dequeue])"]
    # The real claims, the strict FIFO's and the key checks WITH (UPDLOCK, HOLDLOCK) are accepted.
    for name in ("emails.sql", "ledger.sql"):
        path, original = golden(name)
        assert [v for v in violations(original, "updlock", path) if "_dequeue]" in v or "_enqueue]" in v] == []


# Each claim and probe names its index (docs/queue-kinds.md, "Plans at depth"): the pin removed, or
# made to disagree with its index, in a real rendered procedure.
NO_INDEX = ("a {what} of queue.{queue} without INDEX (ix): a plan compiled on an empty queue may scan it at depth; "
            "name the index whose key is its WHERE and ORDER BY")
PIN_DEFECTS = {  # name: (file, procedure, the hint list's line, seeded (old, new), the violation)
    "a claim without its hints": (
        "emails.sql", "emails_dequeue", "INDEX ([ix_emails_ready])",
        ("INDEX ([ix_emails_ready]), FORCESEEK, ", ""), NO_INDEX.format(what="claim", queue="emails")),
    "a wait probe without its hints": (
        "emails.sql", "emails_wait", "INDEX ([ix_emails_ready])",
        ("INDEX ([ix_emails_ready]), FORCESEEK, ", ""), NO_INDEX.format(what="probe", queue="emails")),
    "a strict FIFO claim without its hint": (
        "ledger.sql", "ledger_dequeue", "INDEX ([pk_ledger])", ("INDEX ([pk_ledger]), ", ""),
        NO_INDEX.format(what="claim", queue="ledger")),
    "a range seek without FORCESEEK": (
        "reminders.sql", "reminders_dequeue", "INDEX ([pk_reminders])", ("FORCESEEK, ", ""),
        "a claim that compares due_at, the first key column of pk_reminders, without FORCESEEK: a plan compiled on an "
        "empty queue may scan the index at depth"),
    "the next priority level without FORCESEEK": (
        "thumbnails.sql", "thumbnails_dequeue", "WHERE m.priority < @priority",
        # The first such hint list of the procedure: the claim's has UPDLOCK, the first level's no FORCESEEK.
        ("INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK)",
         "INDEX ([ix_thumbnails_ready_priority]), ROWLOCK, READPAST, READCOMMITTEDLOCK)"),
        "a probe that compares priority, the first key column of ix_thumbnails_ready_priority, without FORCESEEK: a plan "
        "compiled on an empty queue may scan the index at depth"),
    "FORCESEEK with nothing to seek on": (
        "orders.sql", "orders_dequeue", "INDEX ([pk_orders])", ("INDEX ([pk_orders]), ", "INDEX ([pk_orders]), FORCESEEK, "),
        "FORCESEEK on a claim that does not compare id, the first key column of pk_orders: no seek plan exists (8622)"),
    "an index the file does not create": (
        "emails.sql", "emails_dequeue", "INDEX ([ix_emails_ready])", ("[ix_emails_ready]", "[ix_emails_visible]"),
        "INDEX (ix_emails_visible) names no index created on queue.emails"),
    "an index whose key is not the ORDER BY": (
        "emails.sql", "emails_dequeue", "INDEX ([ix_emails_ready])", ("INDEX ([ix_emails_ready]), FORCESEEK", "INDEX ([pk_emails])"),
        "INDEX (pk_emails): its key (id) is not, after the =-compared columns, the ORDER BY visible_at, id in one "
        "direction: a sort of every matching row"),
    "an ORDER BY the index does not serve": (
        "undo.sql", "undo_dequeue", "INDEX ([pk_undo])", ("ORDER BY m.id DESC", "ORDER BY m.enqueued_at DESC"),
        "INDEX (pk_undo): its key (id) is not, after the =-compared columns, the ORDER BY enqueued_at DESC in one "
        "direction: a sort of every matching row"),
    "the look for expired leases without FORCESEEK": (
        # One lease holder at a time: an equality and a range seek, pinned like every claim.
        "emails.sql", "emails_dequeue", "m.leased_by = @look_worker AND m.leased_by IS NOT NULL",
        ("INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05\n"
         "                                    WHERE\n                                        m.leased_by = @look_worker",
         "INDEX ([ix_emails_lease]), ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05\n"
         "                                    WHERE\n                                        m.leased_by = @look_worker"),
        "a claim that compares leased_by, the first key column of ix_emails_lease, without FORCESEEK: a plan compiled "
        "on an empty queue may scan the index at depth"),
    "the look for expired leases over every lease": (
        # The walk of the whole lease index with a residual expiry test: no range seek (the first
        # version of the look, which a senior-DBA review refused).
        "emails.sql", "emails_dequeue", "m.leased_by = @look_worker AND m.leased_by IS NOT NULL",
        ("m.leased_by = @look_worker AND m.leased_by IS NOT NULL\n"
         "                                        AND m.visible_at <= @now\n"
         "                                    ORDER BY m.visible_at, m.id",
         "m.leased_by IS NOT NULL\n"
         "                                        AND m.visible_at <= @now\n"
         "                                    ORDER BY m.leased_by, m.visible_at, m.id"),
        "INDEX (ix_emails_lease): its key (leased_by, visible_at, id) does not have the range column visible_at next "
        "after the =-compared columns: no range seek"),
    "a filtered index whose filter the claim does not repeat": (
        "emails.sql", "emails_dequeue", "INDEX ([ix_emails_lease])",
        ("m.leased_by = @worker AND m.leased_by IS NOT NULL", "m.leased_by = @worker"),
        "INDEX (ix_emails_lease): its key (leased_by, visible_at, id) is filtered (WHERE LEASED_BY IS NOT NULL) and "
        "the claim does not repeat LEASED_BY IS NOT NULL: the optimizer cannot use the index (8622)"),
}


@pytest.mark.parametrize("defect", PIN_DEFECTS)
def test_a_claim_or_probe_without_its_pin_is_refused(defect: str) -> None:
    name, procedure, anchor, (old, new), message = PIN_DEFECTS[defect]
    file, text = golden(name)
    assert violations(text, "claim-pin", file) == []
    seeded = seed(text, procedure, replace(old, new))
    line = line_of(text, procedure, anchor)
    if anchor.startswith("WHERE"):          # the hint list is on the line above its WHERE
        line -= 1
    elif anchor.startswith("m.leased_by = @look_worker"):   # ... and above the look's WHERE line
        line -= 2
    assert violations(seeded, "claim-pin", file) == [
        f"{file}:{line}: claim-pin: {message} (procedure [queue].[{procedure}])"]


@pytest.mark.parametrize("queue, verb, index, table, faked", [
    ("reminders", "reminders_dequeue", "pk_reminders", "reminders", "queue"),
    ("emails", "emails_dequeue", "ix_emails_ready", "emails", "queue"),
    ("emails", "emails_dead_list", "pk_emails_dead", "emails_dead", "dead-letter"),
    # lease_status seeks the message by its key, then the dead-letter table by its key (DBA review:
    # FORCESEEK on a fake without them is Msg 8622; pinned by name, this rule sees them).
    ("emails", "emails_lease_status", "pk_emails", "emails", "queue"),
    ("emails", "emails_lease_status", "pk_emails_dead", "emails_dead", "dead-letter"),
    ("thumbnails", "thumbnails_lease_status", "ux_thumbnails_seq", "thumbnails", "queue")])
def test_a_tsqlt_test_that_fakes_a_pinned_table_without_its_indexes_is_refused(queue: str, verb: str, index: str,
                                                                               table: str, faked: str) -> None:
    """tSQLt.FakeTable leaves a heap: a test that then runs a pinned verb gets Msg 308 unless it builds
    the index on the fake (the class's helper does, right after every FakeTable of the queue table).
    A plain read that names an index counts too (dead_list's pages, pinned to the dead table's key)."""
    file, sql = golden(f"{queue}.sql")
    tests_file = f"tests_tsql/rendered/test_{queue}.sql"
    tests = (REPO / tests_file).read_text(encoding="utf-8")
    helper = f"    EXEC [test_queue_{queue}].[index the faked {faked} table];\n"
    test = next(b.text for b in split_batches(tests) if helper in b.text and f"[queue].[{verb}]" in b.text)
    name = re.search(r"CREATE PROCEDURE (\S+\.\[[^\]]+\])", test).group(1)
    assert [str(v) for v in check_sources([(file, sql), (tests_file, tests)]).violations if v.rule == "fake-pin"] == []
    seeded = tests.replace(test, test.replace(helper, "\n", 1), 1)
    found = [v for v in check_sources([(file, sql), (tests_file, seeded)]).violations if v.rule == "fake-pin"]
    assert {(v.procedure, v.file) for v in found} == {(name, tests_file)}
    assert any(f"pin INDEX ({index}) on queue.{table}, after tSQLt.FakeTable of queue.{table}" in v.message
               for v in found)


def test_a_claim_that_cannot_carry_an_index_hint_is_refused() -> None:
    """DELETE TOP (n) FROM t WITH (...): the target of a DELETE takes only the limited table hints."""
    file, text = golden("events.sql")
    cte = procedure_batch(text, "events_dequeue")
    start = cte.index("    WITH next_messages AS (")
    end = cte.index("    DELETE FROM next_messages\n") + len("    DELETE FROM next_messages\n")
    delete_top = ("    DELETE TOP (@batch_size)\n"
                  "    FROM [queue].[events] WITH (ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK)\n")
    seeded_batch = cte[:start] + delete_top + "\n" * (cte[start:end].count("\n") - 2) + cte[end:]
    seeded = seed(text, "events_dequeue", lambda batch: seeded_batch)
    line = text[:text.index(cte)].count("\n") + cte[:start].count("\n") + 2
    assert violations(seeded, "claim-pin", file) == [
        f"{file}:{line}: claim-pin: {NO_INDEX.format(what='claim', queue='events')} (procedure [queue].[events_dequeue])"]


def test_a_procedure_touching_dead_before_queue_is_refused() -> None:
    file, text = golden("emails.sql")
    peek = " DECLARE @peek bigint = (SELECT d.id FROM [queue].[emails_dead] AS d WHERE d.id = @id);"
    seeded = seed(text, "emails_fail", on_line_of("BEGIN TRY", lambda indent, line: line + peek))
    line = line_of(text, "emails_fail", "BEGIN TRY")
    update = line_of(text, "emails_fail", "UPDATE [queue].[emails]")
    assert violations(seeded, "table-order", file, "emails_fail") == [
        f"{file}:{line}: table-order: touches queue.emails_dead before queue.emails (line {update}): the lock order "
        "is queue -> history -> dead-letter (procedure [queue].[emails_fail])"]
    # As rendered, fail's DELETE ... OUTPUT INTO the dead table FROM the queue touches the queue first.
    assert violations(text, "table-order", file, "emails_fail") == []


def test_the_worker_keeps_the_lock_order_in_each_transaction_it_owns() -> None:
    """The worker's claim buries (queue -> dead), then completes (queue -> history) in another
    transaction: in text order dead comes before history, per transaction the order holds."""
    file, text = matrix("work_all.sql")
    procedure = "work_all_process"
    assert violations(text, "table-order", file, procedure) == []
    # Not recognised as owning its transactions (no refusal of the caller's): the literal text order.
    literal = seed(text, procedure, on_line_of("IF @@TRANCOUNT > 0", lambda indent, _: indent + "IF @@TRANCOUNT > 0 "))
    assert [v.split(" (line ")[0] for v in violations(literal, "table-order", file, procedure)] == [
        f"{file}:{line_of(text, procedure, 'FROM [matrix].[work_all_dead] AS d')}: table-order: touches "
        "matrix.work_all_dead before matrix.work_all_history"]

    def peek_at_the_dead_first(batch: str) -> str:      # in the fail step's transaction, the last one
        lines = batch.split("\n")
        index = max(i for i, line in enumerate(lines) if line.strip() == "BEGIN TRANSACTION;")
        lines[index] += " DECLARE @peek bigint = (SELECT COUNT(*) FROM [matrix].[work_all_dead] AS p);"
        return "\n".join(lines)

    batch = procedure_batch(text, procedure)
    last_begin = batch.rindex("BEGIN TRANSACTION;")
    begin_line = text[:text.index(batch) + last_begin].count("\n") + 1
    update_line = text[:text.index(batch) + batch.index("UPDATE [matrix].[work_all]", last_begin)].count("\n") + 1
    assert violations(seed(text, procedure, peek_at_the_dead_first), "table-order", file, procedure) == [
        f"{file}:{begin_line}: table-order: touches matrix.work_all_dead before matrix.work_all (line {update_line}): "
        f"the lock order is queue -> history -> dead-letter (procedure [matrix].[{procedure}])"]


def test_an_uncapped_batch_size_is_refused() -> None:
    file, text = golden("emails.sql")
    procedure = "[queue].[emails_dequeue]"
    header = line_of(text, "emails_dequeue", "CREATE OR ALTER PROCEDURE")
    not_capped = (f"{file}:{header}: batch-cap: @batch_size is not checked BETWEEN 1 AND 1000 (THROW 51001) "
                  f"(procedure {procedure})")
    assert violations(seed(text, "emails_dequeue", replace("@batch_size NOT BETWEEN 1 AND 1000",
                                                           "@batch_size NOT BETWEEN 1 AND 5000")),
                      "batch-cap", file, "emails_dequeue") == [not_capped]
    assert violations(seed(text, "emails_dequeue", replace("THROW 51001", "THROW 51009")),
                      "batch-cap", file, "emails_dequeue") == [not_capped]
    early = seed(text, "emails_dequeue", on_line_of("SET NOCOUNT ON;", lambda i, l: l + " DECLARE @n int = @batch_size;"))
    check = line_of(text, "emails_dequeue", "@batch_size NOT BETWEEN 1 AND 1000")
    assert violations(early, "batch-cap", file, "emails_dequeue") == [
        f"{file}:{line_of(text, 'emails_dequeue', 'SET NOCOUNT ON;')}: batch-cap: @batch_size is used before its "
        f"check (line {check}) (procedure {procedure})"]


def _without_item_count_checks(batch: str) -> str:
    """The batch with any IF that counts @items blanked out (lines kept): the seeds add their own."""
    tree = parse_batch(batch)
    procedure = procedures(tree, "seeded.sql", 1)[0]
    spans = []
    for statement in descendants(procedure.segment, "if_then_statement"):
        condition = child(statement, "if_clause").raw
        if "@items" in condition and "COUNT" in condition.upper():
            spans.append((statement.pos_marker.source_slice.start, statement.pos_marker.source_slice.stop))
    for start, stop in reversed(spans):
        batch = batch[:start] + "".join(c if c == "\n" else " " for c in batch[start:stop]) + batch[stop:]
    assert rule_batch_cap(procedures(parse_batch(batch), "seeded.sql", 1)[0]), "a count check is left"
    return batch


def test_an_uncapped_table_valued_parameter_is_refused() -> None:
    file, text = golden("emails.sql")
    procedure = "[queue].[emails_enqueue_batch]"
    batch = _without_item_count_checks(procedure_batch(text, "emails_enqueue_batch"))
    base = text.replace(procedure_batch(text, "emails_enqueue_batch"), batch, 1)
    nocount = line_of(base, "emails_enqueue_batch", "SET NOCOUNT ON;")
    header = line_of(base, "emails_enqueue_batch", "CREATE OR ALTER PROCEDURE")

    def check(limit: int = 1000, error: int = 51001) -> str:
        return f" IF (SELECT COUNT(*) FROM @items) > {limit} THROW {error}, N'at most 1000 items', 1;"

    capped = seed(base, "emails_enqueue_batch", on_line_of("SET NOCOUNT ON;", lambda i, l: l + check()))
    assert violations(capped, "batch-cap", file, "emails_enqueue_batch") == []
    not_refused = (f"{file}:{header}: batch-cap: @items READONLY is not refused above 1000 rows (IF (SELECT "
                   f"COUNT(*) FROM @items) > 1000 THROW 51001) (procedure {procedure})")
    for wrong in (check(limit=5000), check(error=51009)):
        seeded = seed(base, "emails_enqueue_batch", on_line_of("SET NOCOUNT ON;", lambda i, l, w=wrong: l + w))
        assert violations(seeded, "batch-cap", file, "emails_enqueue_batch") == [not_refused], wrong
    late = seed(base, "emails_enqueue_batch", on_line_of("END CATCH;", lambda i, l: l + check()))
    first_write = line_of(base, "emails_enqueue_batch", "INSERT INTO @staged")
    assert violations(late, "batch-cap", file, "emails_enqueue_batch") == [
        f"{file}:{first_write}: batch-cap: @items feeds a write before its row count is checked (line "
        f"{line_of(base, 'emails_enqueue_batch', 'END CATCH;')}) (procedure {procedure})"]
    assert nocount < first_write


@pytest.mark.parametrize("procedure", ["emails_purge", "emails_history_purge", "events_purge"])
def test_a_purge_chunk_above_1000_rows_is_refused(procedure: str) -> None:
    file, text = golden(f"{procedure.split('_')[0]}.sql")
    chunk = "IIF(@max_rows IS NULL OR @max_rows - @purged > 1000, 1000, @max_rows - @purged)"
    line = line_of(text, procedure, chunk)
    assert violations(text, "batch-cap", file, procedure) == []
    for wrong in (chunk.replace("1000", "5000"), chunk.replace("> 1000,", "> 5000,"), "@max_rows"):
        seeded = seed(text, procedure, replace(chunk, wrong))
        assert violations(seeded, "batch-cap", file, procedure) == [
            f"{file}:{line}: batch-cap: the purge chunk TOP (@chunk) is set to {wrong}: it must stay at most "
            f"1000 rows (every number in it at most 1000) (procedure [queue].[{procedure}])"], wrong
    top = seed(text, procedure, replace("TOP (@chunk)", "TOP (5000)"))
    assert violations(top, "batch-cap", file, procedure) == [
        f"{file}:{line_of(text, procedure, 'TOP (@chunk)')}: batch-cap: a purge chunk of TOP (5000): at most 1000 "
        f"rows per chunk (procedure [queue].[{procedure}])"]


def test_abs_of_a_checksum_is_refused() -> None:
    file, text = golden("thumbnails.sql")
    pause = "ABS(CHECKSUM(NEWID()) % 180)"
    seeded = seed(text, "thumbnails_process", replace(pause, "ABS(CHECKSUM(NEWID())) % 180", count=3))
    assert violations(seeded, "abs-checksum", file, "thumbnails_process") == [
        f"{file}:{line_of(text, 'thumbnails_process', pause, n)}: abs-checksum: ABS(CHECKSUM(NEWID())) overflows "
        "(8115) when CHECKSUM returns -2147483648: take the remainder first, ABS(CHECKSUM(...) % n) (procedure "
        "[queue].[thumbnails_process])" for n in (1, 2, 3)]


def test_a_worker_that_rethrows_a_transient_error_is_refused() -> None:
    file, text = golden("thumbnails.sql")
    retry = "IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @claim_retries >= 3 THROW;"
    seeded = seed(text, "thumbnails_process", replace(retry, "THROW;"))
    assert violations(seeded, "transient-retry", file, "thumbnails_process") == [
        f"{file}:{line_of(text, 'thumbnails_process', retry)}: transient-retry: THROW in the outermost CATCH without "
        "IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR ...: a deadlock, lock timeout or snapshot conflict of the "
        "worker's own transaction must be retried (procedure [queue].[thumbnails_process])"]


@pytest.mark.parametrize("wrong", ["IF ERROR_NUMBER() <> 1205 OR @deadlock_retries >= 3 THROW;", "THROW;"])
def test_a_requeue_that_does_not_retry_its_own_deadlock_or_retries_a_callers_is_refused(wrong: str) -> None:
    file, text = golden("emails.sql")
    retry = "IF ERROR_NUMBER() <> 1205 OR @started_transaction = 0 OR @deadlock_retries >= 3 THROW;"
    seeded = seed(text, "emails_dead_requeue", replace(retry, wrong))
    assert violations(seeded, "transient-retry", file, "emails_dead_requeue") == [
        f"{file}:{line_of(text, 'emails_dead_requeue', retry)}: transient-retry: THROW in the outermost CATCH "
        "without IF ERROR_NUMBER() <> 1205 OR @STARTED_TRANSACTION = 0 OR ...: a deadlock of the procedure's own "
        "transaction must be retried (and only of its own) (procedure [queue].[emails_dead_requeue])"]


def test_burying_a_claimed_row_without_the_expired_lease_guard_is_refused() -> None:
    file, text = golden("emails.sql")
    seeded = seed(text, "emails_dequeue", replace(" AND c.previous_visible_at <= @now", "", count=-1))
    assert violations(seeded, "bury-guard", file, "emails_dequeue") == [
        f"{file}:{line_of(text, 'emails_dequeue', 'DELETE m', n)}: bury-guard: claimed rows moved to the dead-letter "
        "table without previous_visible_at <= @now: a worker's own live lease would be buried (procedure "
        "[queue].[emails_dequeue])" for n in (1, 2, 3)]   # own messages, the look for expired leases, the claim


def test_dynamic_sql_and_select_star_are_refused() -> None:
    file, text = golden("emails.sql")
    line = line_of(text, "emails_purge", "SET NOCOUNT ON;")
    for statement, rule, message in (
            (" DECLARE @sql nvarchar(100) = N'SELECT 1'; EXEC (@sql);", "dynamic-sql",
             "EXEC (...) of text built at run time"),
            (" DECLARE @sql nvarchar(100) = N'SELECT 1'; EXEC sp_executesql @sql;", "dynamic-sql",
             "sp_executesql runs text built at run time"),
            (" SELECT * FROM [queue].[emails_dead];", "select-star", "SELECT *: a procedure names the columns it "
                                                                    "returns")):
        seeded = seed(text, "emails_purge", on_line_of("SET NOCOUNT ON;", lambda i, l, s=statement: l + s))
        assert violations(seeded, rule, file, "emails_purge") == [f"{file}:{line}: {rule}: {message} (procedure "
                                                  "[queue].[emails_purge])"]


def test_an_update_that_sets_payload_is_refused() -> None:
    # Storage v4 kept SQL Server's ck_<queue>_payload_json because no UPDATE writes payload: SQL Server
    # compiles a CHECK into an UPDATE only when its SET list names the constraint's column.
    file, text = golden("emails.sql")
    line = line_of(text, "emails_purge", "SET NOCOUNT ON;")
    for statement in (" UPDATE [queue].[emails] SET payload = payload WHERE id = 0;",
                      " UPDATE m SET m.attempts = 0, m.[Payload] = m.payload FROM [queue].[emails] AS m WHERE m.id = 0;"):
        seeded = seed(text, "emails_purge", on_line_of("SET NOCOUNT ON;", lambda i, l, s=statement: l + s))
        assert violations(seeded, "update-payload", file, "emails_purge") == [
            f"{file}:{line}: update-payload: an UPDATE sets payload: SQL Server then checks ck_<queue>_payload_json "
            "(an ISJSON parse) on every row it updates, and a queue never changes a message's payload (procedure "
            "[queue].[emails_purge])"]


def test_a_file_without_its_session_options_is_refused() -> None:
    file, text = golden("emails.sql")
    seeded = text.replace("SET QUOTED_IDENTIFIER ON;\n", "\n", 1)
    first_create = text[:text.index("CREATE TABLE")].count("\n") + 1
    assert violations(seeded, "options", file) == [
        f"{file}:{first_create}: options: no SET QUOTED_IDENTIFIER ON before the first CREATE (filtered indexes "
        "need it when the procedures that write the table are created)"]


def test_a_procedure_granted_never_or_twice_is_refused() -> None:
    file, text = golden("emails.sql")
    grant = "GRANT EXECUTE ON OBJECT::[queue].[emails_complete] TO [queue_consumer];"
    line = line_of(text, "emails_complete", "CREATE OR ALTER PROCEDURE")
    for seeded, times in ((text.replace(grant, "", 1), 0), (text.replace(grant, grant + " " + grant, 1), 2)):
        assert violations(seeded, "grants", file, "emails_complete") == [
            f"{file}:{line}: grants: granted EXECUTE {times} times in its file (once, to one role, is the contract) "
            "(procedure [queue].[emails_complete])"]


# ------------------------------------------------------------------------------------------------
# PostgreSQL


def _mask_pg(text: str) -> str:
    """Comments and single-quoted strings blanked (function bodies are dollar-quoted and kept)."""
    text = re.sub(r"--[^\n]*", "", text)
    return re.sub(r"'(?:[^']|'')*'", "''", text)


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_postgres_objects_are_referenced_quoted(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    bare = re.compile(rf"(?<![\[\"'.\w]){re.escape(catalog.schema)}\.(?=[a-z])")
    for rendered in render_catalog(catalog, "postgres"):
        offenders = [line for line in _mask_pg(rendered.text).splitlines() if bare.search(line)]
        assert offenders == [], (rendered.name, offenders[:3])


@pytest.mark.parametrize("catalog_path", CATALOGS, ids=lambda p: p.name)
def test_postgres_functions_are_pinned_definers_revoked_from_public(catalog_path: Path) -> None:
    catalog = load_catalog(catalog_path)
    for rendered in render_catalog(catalog, "postgres"):
        for unit in rendered.units:
            if unit.type != "code" or unit.name.endswith(("tablequeue_roles", "_ownership")):
                continue
            if unit.name.endswith(("_process", "_wait")):
                # The in-database worker and wait COMMIT, which PostgreSQL refuses in a procedure
                # with SECURITY DEFINER or a SET clause (2D000): they run as their caller and reach
                # the tables only through the definer functions (docs/work-queue.md).
                code = _mask_pg(unit.body)
                assert "SECURITY DEFINER" not in code and "SET search_path" not in code, unit.name
                assert re.search(r"REVOKE ALL ON PROCEDURE .* FROM public;", unit.body), unit.name
                continue
            assert "SECURITY DEFINER" in unit.body, unit.name
            assert "SET search_path = pg_catalog, pg_temp" in unit.body, unit.name
            assert re.search(r"REVOKE ALL ON (FUNCTION|PROCEDURE) .* FROM public;", unit.body), unit.name
            # Owned by the schema's owner role, never by whoever deployed (a superuser, often).
            assert re.search(rf'ALTER (FUNCTION|PROCEDURE) .* OWNER TO "{catalog.schema}_owner";', unit.body), unit.name


@pytest.mark.parametrize("verb", ["complete_batch", "fail_batch"])
def test_an_uncapped_acks_table_is_refused(verb: str) -> None:
    """The batch acknowledgements' table-valued parameter (S.Q_acks) is held to the same cap as
    enqueue_batch's items: a cap above 1000, or one that throws another error, is no cap."""
    file, text = golden("emails.sql")
    procedure = f"emails_{verb}"
    header = line_of(text, procedure, "CREATE OR ALTER PROCEDURE")
    assert violations(text, "batch-cap", file, procedure) == []
    not_refused = (f"{file}:{header}: batch-cap: @acks READONLY is not refused above 1000 rows (IF (SELECT "
                   f"COUNT(*) FROM @acks) > 1000 THROW 51001) (procedure [queue].[{procedure}])")
    for old, new in (("FROM @acks) > 1000", "FROM @acks) > 5000"),
                     (f"THROW 51001, N'queue.{procedure}: at most", f"THROW 51009, N'queue.{procedure}: at most")):
        assert violations(seed(text, procedure, replace(old, new)), "batch-cap", file, procedure) == [not_refused]


# The comparisons the rule once read only one way: a column on the right of its operator, BETWEEN,
# and the predicates that are several seek ranges (OR, IN (a, b), NOT BETWEEN), seeded into real claims.
SEEK = ("a {what} that compares {column}, the first key column of {index}, without FORCESEEK: a plan compiled on an "
        "empty queue may scan the index at depth")
SEVERAL = ("a claim of queue.{queue} whose WHERE has {where}: OR, IN (a, b) and NOT BETWEEN are several seek ranges, "
           "whose rows come back in no index order (a sort of every matching row); claim each in a statement of "
           "its own")
GAP_DEFECTS = {  # name: (file, procedure, the hint list's line, seeded [(old, new)], the violation)
    "the next priority level, its column on the right, without FORCESEEK": (
        "thumbnails.sql", "thumbnails_dequeue", "INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, "
                                                "READCOMMITTEDLOCK)",
        [("INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK)",
          "INDEX ([ix_thumbnails_ready_priority]), ROWLOCK, READPAST, READCOMMITTEDLOCK)"),
         ("WHERE m.priority < @priority", "WHERE @priority > m.priority")],
        SEEK.format(what="probe", column="priority", index="ix_thumbnails_ready_priority")),
    "a BETWEEN range without FORCESEEK": (
        "reminders.sql", "reminders_dequeue", "INDEX ([pk_reminders])",
        [("FORCESEEK, ", ""), ("WHERE m.due_at <= SYSUTCDATETIME()", "WHERE m.due_at BETWEEN @batch_size AND SYSUTCDATETIME()")],
        SEEK.format(what="claim", column="due_at", index="pk_reminders")),
    "a due time on the right without FORCESEEK": (
        "reminders.sql", "reminders_dequeue", "INDEX ([pk_reminders])",
        [("FORCESEEK, ", ""), ("WHERE m.due_at <= SYSUTCDATETIME()", "WHERE SYSUTCDATETIME() >= m.due_at")],
        SEEK.format(what="claim", column="due_at", index="pk_reminders")),
    "an OR": (
        "reminders.sql", "reminders_dequeue", "INDEX ([pk_reminders])",
        [("WHERE m.due_at <= SYSUTCDATETIME()", "WHERE m.due_at <= SYSUTCDATETIME() OR m.id = @batch_size")],
        SEVERAL.format(queue="reminders", where="DUE_AT <= SYSUTCDATETIME () OR ID = @BATCH_SIZE")),
    "an OR in brackets": (
        "reminders.sql", "reminders_dequeue", "INDEX ([pk_reminders])",
        [("WHERE m.due_at <= SYSUTCDATETIME()", "WHERE m.due_at <= SYSUTCDATETIME() AND (m.id = 1 OR m.id = 2)")],
        SEVERAL.format(queue="reminders", where="(ID = 1 OR ID = 2)")),
    "an IN list": (
        "emails.sql", "emails_dequeue", "INDEX ([ix_emails_lease])",
        [("m.leased_by = @worker AND", "m.leased_by IN (@worker, N'') AND")],
        SEVERAL.format(queue="emails", where="LEASED_BY IN (@WORKER , N'')")),
    "a NOT BETWEEN": (
        "reminders.sql", "reminders_dequeue", "INDEX ([pk_reminders])",
        [("WHERE m.due_at <= SYSUTCDATETIME()", "WHERE m.due_at NOT BETWEEN @batch_size AND SYSUTCDATETIME()")],
        SEVERAL.format(queue="reminders", where="DUE_AT NOT BETWEEN @BATCH_SIZE AND SYSUTCDATETIME ()")),
}


@pytest.mark.parametrize("defect", GAP_DEFECTS)
def test_a_claim_pin_defect_in_a_comparison_the_rule_once_missed_is_refused(defect: str) -> None:
    name, procedure, anchor, edits, message = GAP_DEFECTS[defect]
    file, text = golden(name)
    assert violations(text, "claim-pin", file) == []
    seeded = text
    for old, new in edits:
        seeded = seed(seeded, procedure, replace(old, new))
    assert violations(seeded, "claim-pin", file) == [
        f"{file}:{line_of(text, procedure, anchor)}: claim-pin: {message} (procedure [queue].[{procedure}])"]


def test_a_single_value_in_and_a_column_on_the_right_are_accepted_where_they_seek() -> None:
    file, text = golden("reminders.sql")
    for old, new in (("WHERE m.due_at <= SYSUTCDATETIME()", "WHERE SYSUTCDATETIME() >= m.due_at"),
                     ("WHERE m.due_at <= SYSUTCDATETIME()", "WHERE m.due_at BETWEEN @batch_size AND SYSUTCDATETIME()")):
        assert violations(seed(text, "reminders_dequeue", replace(old, new)), "claim-pin", file) == []
    file, text = golden("emails.sql")
    seeded = seed(text, "emails_dequeue", replace("m.leased_by = @worker AND", "m.leased_by IN (@worker) AND"))
    assert violations(seeded, "claim-pin", file) == []


def test_a_read_only_procedure_keeps_xact_abort_off_only_with_every_read_in_try() -> None:
    """lease_status changes nothing: under XACT_ABORT OFF a lock timeout leaves a caller's transaction
    as it was (DBA review S1). That holds only while it writes nothing, and while every read is in a
    TRY whose CATCH rethrows: under OFF a failed statement does not end the batch, and the procedure
    would answer from half its reads."""
    file, text = golden("thumbnails.sql")
    proc = "thumbnails_lease_status"
    assert violations(text, "xact-abort", file, proc) == []
    defects = {
        "it writes a table": on_line_of("BEGIN TRY", lambda indent, line: line + " DELETE FROM [queue].[thumbnails] "
                                                                                 "WHERE id = NULL;"),
        "it reads a table outside BEGIN TRY": replace("    LEFT JOIN @requeued AS r ON a.id = r.id\n",
                                                      "    LEFT JOIN @requeued AS r ON a.id = r.id WHERE EXISTS (SELECT 1 "
                                                      "FROM [queue].[thumbnails_dead] AS d)\n"),
        "its CATCH does more than THROW;": replace("        THROW;\n    END CATCH;",
                                                   "        PRINT 1; THROW;\n    END CATCH;"),
        "its CATCH does more than THROW; (or less": replace("        THROW;\n    END CATCH;",
                                                            "\n    END CATCH;"),
        "it begins or ends a transaction": on_line_of("BEGIN TRY", lambda indent, line: line + " BEGIN TRANSACTION;"),
        "SET XACT_ABORT OFF is not its second statement": replace("SET XACT_ABORT OFF;", "SET ANSI_WARNINGS ON;"),
        # DBA review, round 2: a read that would not wait under RCSI, or would keep its lock.
        "a table read without READCOMMITTEDLOCK": replace("FORCESEEK, ROWLOCK, READCOMMITTEDLOCK)",
                                                          "FORCESEEK, ROWLOCK)"),
        "a table read without READCOMMITTEDLOCK (under": replace("FORCESEEK, ROWLOCK, READCOMMITTEDLOCK)",
                                                                 "FORCESEEK, ROWLOCK, READCOMMITTEDLOCK, HOLDLOCK)"),
        "it does not SET TRANSACTION ISOLATION LEVEL READ COMMITTED": replace(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE;"),
    }
    for why, defect in defects.items():
        found = violations(seed(text, proc, defect), "xact-abort", file, proc)
        assert any(f"no SET XACT_ABORT ON, and not read-only under TRY: {why}" in v for v in found), (why, found)


def test_a_pinned_join_is_judged_by_its_on_comparisons() -> None:
    """lease_status's two reads on a client-ids queue are joins pinned to an index: the ON compares the
    index's first key column, as a WHERE would (DBA review S3: FORCESEEK whatever the estimate)."""
    file, text = golden("thumbnails.sql")
    proc = "thumbnails_lease_status"
    assert violations(text, "claim-pin", file, proc) == []
    anchor = "INDEX ([ux_thumbnails_seq]), FORCESEEK"
    line = line_of(text, proc, anchor)
    without_seek = seed(text, proc, replace(anchor, "INDEX ([ux_thumbnails_seq])"))
    assert violations(without_seek, "claim-pin", file, proc) == [
        f"{file}:{line}: claim-pin: a read that compares seq, the first key column of ux_thumbnails_seq, without "
        f"FORCESEEK: a plan compiled on an empty queue may scan the index at depth (procedure [queue].[{proc}])"]
    off_key = seed(text, proc, replace("ON l.seq = m.seq", "ON l.id = m.id"))
    assert violations(off_key, "claim-pin", file, proc) == [
        f"{file}:{line}: claim-pin: INDEX (ux_thumbnails_seq): its key (seq) does not start with the columns the "
        f"read compares with = (id) (procedure [queue].[{proc}])"]
