"""Message groups on SQL Server (issue 21; docs/queue-kinds.md, "Message groups"), proven without a
server: the fifo and work templates render option groups, the render passes check-tsql (every claim and probe
pinned to the index whose key it seeks, UPDLOCK only in claims, lock order, batch caps), and the lock
shapes the design rests on are the ones written. What they do under concurrency is the conformance
suite's (tests/conformance/test_groups.py), which runs against a configured SQL Server.
"""
from __future__ import annotations

import re

from tablequeue.catalog import parse_catalog
from tablequeue.render import render_catalog, render_migrations, render_tsqlt
from tablequeue.tsqlcheck import check_sources

QUEUES = [
    {"name": "orders", "kind": "fifo", "payload": "json", "options": {"groups": True, "dedupe": True}},
    {"name": "plain", "kind": "fifo", "payload": "binary", "options": {"groups": True}},
    {"name": "ledger", "kind": "fifo", "payload": "json"},
]


def _render() -> dict[str, str]:
    catalog = parse_catalog({"schema": "s", "queues": QUEUES})
    return {f.name: f.text for f in render_catalog(catalog, "mssql")}


def _procedure(text: str, verb: str, queue: str = "orders") -> str:
    start = text.index(f"CREATE OR ALTER PROCEDURE [s].[{queue}_{verb}]")
    return text[start:text.index("\nGO\n", start)]


def test_fifo_with_groups_renders_on_sql_server_and_passes_check_tsql() -> None:
    files = _render()
    report = check_sources(sorted((name, text) for name, text in files.items() if name != "ledger.sql"))
    assert report.clean, "\n".join(map(str, report.findings + report.violations))


def test_fifo_with_groups_has_the_contract_names() -> None:
    text = _render()["orders.sql"]
    assert "@group_key nvarchar(MAX) = NULL" in _procedure(text, "enqueue")
    assert re.search(r"CREATE TYPE \[s\]\.\[orders_items\] AS TABLE \([^;]*group_key nvarchar\(MAX\)", text)
    dequeue = _procedure(text, "dequeue")
    # dequeue returns group_key as its last column.
    assert re.search(r"SELECT\s+c\.id,\s+c\.payload,\s+c\.enqueued_at,\s+c\.group_key\s+FROM @claimed AS c", dequeue)
    assert "CREATE TABLE [s].[orders_groups]" in text
    assert "PRIMARY KEY NONCLUSTERED (group_key)" in text


def test_the_grouped_claim_reads_only_head_candidates_and_never_waits() -> None:
    dequeue = _procedure(_render()["orders.sql"], "dequeue")
    # Grouped messages are found on the head index, never by walking the clustered key (a held
    # group's backlog is not in the head index), and with no OR in any claim's WHERE.
    assert "INDEX ([ix_orders_heads]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK" in dequeue
    assert "INDEX ([ix_orders_ungrouped]), ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK" in dequeue
    # Every read of the groups table skips a held group instead of waiting for it.
    for hints in re.findall(r"\[s\]\.\[orders_groups\] AS g WITH \(([^)]*\)[^)]*)\)", dequeue):
        assert "READPAST" in hints, hints
    wheres = re.findall(r"WHERE\s(.*?)(?:\n\s*(?:ORDER BY|\)|$))", dequeue, flags=re.S)
    assert wheres and not any(re.search(r"\bOR\b", w) for w in wheres)


def test_a_producer_never_takes_a_lock_a_consumer_holds() -> None:
    enqueue = _procedure(_render()["orders.sql"], "enqueue")
    groups_reads = re.findall(r"\[s\]\.\[orders_groups\] AS g WITH \((.*?)\) --", enqueue)
    # The try (READPAST: skip a held group) and the pin (S to the end of the transaction: compatible
    # with a holder's U on the key); no key-range lock anywhere (a new key's RangeS-U on the next key
    # would wait for the consumer holding that neighbouring group).
    assert len(groups_reads) == 2
    assert "READPAST, UPDLOCK" in groups_reads[0]
    assert "REPEATABLEREAD" in groups_reads[1] and "UPDLOCK" not in groups_reads[1]
    for procedure in ("enqueue", "enqueue_batch"):
        body = re.sub(r"--[^\n]*", "", _procedure(_render()["plain.sql"], procedure, "plain"))
        assert "HOLDLOCK" not in body and "SERIALIZABLE" not in body and "IGNORE_DUP_KEY" not in body
        # A new key: a plain insert whose duplicate (a racing producer's) is retried, only it under
        # XACT_ABORT OFF.
        window = re.findall(r"SET XACT_ABORT OFF;\s*BEGIN TRY\s*INSERT INTO \[s\]\.\[plain_groups\] \(group_key\)\s*"
                            r"VALUES \(@group\);\s*SET XACT_ABORT ON;\s*END TRY\s*BEGIN CATCH\s*SET XACT_ABORT ON;"
                            r"\s*IF ERROR_NUMBER\(\) NOT IN \(2601, 2627\) OR XACT_STATE\(\) <> 1 THROW;", body)
        assert len(window) == 1, procedure
    # The groups row before the message (the fixed lock order).
    assert enqueue.index("[s].[orders_groups]") < enqueue.index("INSERT INTO [s].[orders] (")


def test_queues_without_groups_render_without_them() -> None:
    text = _render()["ledger.sql"]
    assert "group_key" not in text and "_groups" not in text


def test_the_add_groups_migration_builds_the_indexes_a_fresh_install_has() -> None:
    # Upgraded must equal fresh (DESIGN.md §3c): the same columns and the same index statements.
    catalog = parse_catalog({"schema": "s", "queues": QUEUES[:1]})
    migrations = {f.name: f.text for f in render_migrations(catalog, "mssql")}
    added = migrations["s.orders.fifo_table_add_groups.sql"]
    dropped = migrations["s.orders.fifo_table_drop_groups.sql"]
    fresh = _render()["orders.sql"]

    def indexes(text: str) -> set[str]:
        return {" ".join(i.split()) for i in re.findall(r"CREATE NONCLUSTERED INDEX \[ix_orders_\w+\][^;]*?WHERE [^;\n]*", text)}

    assert indexes(fresh) == indexes(added) and len(indexes(fresh)) == 3
    for column in ("group_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL", "group_head bit NULL"):
        assert column in fresh and column in added
    assert "tablequeue:step transaction after-code" in dropped
    assert all(f"DROP INDEX IF EXISTS [ix_orders_{p}]" in dropped for p in ("heads", "group", "ungrouped"))


def _code(text: str) -> str:
    """The text without its -- comments."""
    return re.sub(r"--[^\n]*", "", text)


def test_a_group_whose_claim_failed_is_tried_once_a_call_and_demotions_are_bounded() -> None:
    dequeue = _code(_procedure(_render()["plain.sql"], "dequeue", "plain"))
    # The candidate probe steps over every group this call has tried, taken or not (a held group's
    # spurious candidates are not tried one by one).
    probe = dequeue[dequeue.index("@candidate_id = m.id"):]
    probe = probe[:probe.index("ORDER BY m.id;")]
    assert re.search(r"AND NOT EXISTS \(\s*SELECT 1\s*FROM @visited AS v\s*WHERE v\.group_key = m\.group_key\s*\)",
                     probe)
    claim = dequeue[dequeue.index("WITH held_group AS", dequeue.index("@candidate_id = m.id")):]
    assert claim.index("INSERT INTO @visited (group_key) VALUES (@group);") < claim.index("IF @taken = 0 CONTINUE;")
    # Demotions a statement stay far below lock escalation, in dequeue and purge alike.
    for verb in ("dequeue", "purge"):
        body = _code(_procedure(_render()["plain.sql"], verb, "plain"))
        assert "UPDATE TOP (1000) other_candidates" in body and "UPDATE other_candidates" not in body


def test_wait_counts_only_candidates_of_groups_nobody_holds() -> None:
    wait = _code(_procedure(_render()["plain.sql"], "wait", "plain"))
    # Bounded, and each candidate's groups row read past its holder: locked_at is read (the heap
    # row a holder's stamp holds X on), with READPAST, READCOMMITTEDLOCK and no U lock. Whether the
    # optimizer keeps the lookup is the conformance suite's to show, on a server.
    assert "SELECT TOP (100) m.id" in wait
    assert re.search(r"@bound_id = MAX\(c\.id\),\s*@window = COUNT\(\*\)\s*FROM \(\s*SELECT TOP \(100\) m\.id\s*"
                     r"FROM [^\n]*\s*WHERE m\.group_head = 1 AND m\.id > @after_id\s*ORDER BY m\.id\s*\) AS c;", wait)
    assert "m.group_head = 1 AND m.id > @after_id AND m.id <= @bound_id" in wait
    assert re.search(r"SELECT g\.locked_at\s*FROM \[s\]\.\[plain_groups\] AS g WITH \(INDEX \(\[pk_plain_groups\]\), "
                     r"FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK\)\s*WHERE\s*g\.group_key = m\.group_key\s*"
                     r"(--[^\n]*\n\s*)*AND COALESCE\(g\.locked_at, '00010102'\) > '00010101'", wait)
    assert "UPDLOCK" not in wait


def test_purge_deletes_groups_rows_only_in_its_own_transactions_and_never_waits() -> None:
    purge = _code(_procedure(_render()["plain.sql"], "purge", "plain"))
    skip = "IF @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0 SET @found = 0;"
    deletes = [m.start() for m in re.finditer(r"DELETE FROM g\s", purge)]
    # The chunks delete no groups row; the empty-groups pass is skipped in a caller's transaction.
    assert len(deletes) == 1 and purge.index(skip) < deletes[0]
    # The delete does not wait for a pinned producer: 1222 leaves the group for the next purge.
    assert re.search(r"SET LOCK_TIMEOUT 0;\s*DELETE FROM g\s", purge)
    assert re.search(r"IF ERROR_NUMBER\(\) <> 1222 OR @started_transaction = 0\s*BEGIN\s*"
                     r"IF ERROR_NUMBER\(\) <> 1205 OR @started_transaction = 0 THROW;", purge)


def test_wait_slides_its_window_so_held_groups_candidates_never_hide_a_free_group() -> None:
    """Review 19 S3: 100 candidates of held groups ahead of a free group's head made every step
    probe the same 100 and report nothing ready for the whole hold. The window now starts after the
    last step's bound and wraps to the start once a window reached the end of the candidates."""
    wait = _code(_procedure(_render()["plain.sql"], "wait", "plain"))
    assert "DECLARE @after_id bigint = 0;" in wait and "DECLARE @window int;" in wait
    step = wait[wait.index("WHILE 1 = 1"):wait.index("WAITFOR DELAY")]
    # The next window is set in the step, after its probe: past this one, or from the start.
    probe = step.index("m.id > @after_id AND m.id <= @bound_id")
    slide = step.index("SET @after_id = IIF(@window < 100, 0, @bound_id);")
    assert probe < slide and step.count("SET @after_id") == 1
    # Nothing else sets the window back, so the steps walk every candidate in turn.
    assert wait.count("@after_id =") == 1


def test_grouped_tsqlt_tests_fake_the_groups_table_and_build_its_key_from_the_ddl() -> None:
    """Review 19 S5: the grouped tSQLt tests wrote into the real groups table (a real row with the
    same key made Assemble fail with 2627). Every test that names the groups table fakes it first and
    builds, on the fake, the key the verbs pin, as the table's DDL declares it."""
    catalog = parse_catalog({"schema": "s", "queues": QUEUES})
    ddl = _render()["plain.sql"]
    assert "CONSTRAINT [pk_plain_groups] PRIMARY KEY NONCLUSTERED (group_key)" in ddl
    text = next(f.text for f in render_tsqlt(catalog) if f.queue == "plain")
    helper = text[text.index("CREATE PROCEDURE [test_s_plain].[index the faked groups table]"):]
    helper = helper[:helper.index("\nGO\n")]
    assert re.search(r"CREATE UNIQUE NONCLUSTERED INDEX \[pk_plain_groups\]\s+ON \[s\]\.\[plain_groups\] \(group_key\);",
                     helper)
    tests = re.findall(r"CREATE PROCEDURE \[test_s_plain\]\.\[test [^\]]*\]\nAS\nBEGIN\n.*?\nEND;\nGO\n", text, re.S)
    # The role tests name the groups table only to ask HAS_PERMS_BY_NAME about it: they run the verbs
    # on the real tables on purpose (a fake carries no grants) and write no group.
    # The pinned-index test reads only the real tables' catalog rows (sys.indexes), never a row.
    role_tests = [t for t in tests if re.match(r"CREATE PROCEDURE \S+\.\[test (the \w+ role |the pinned indexes )", t)]
    assert len(role_tests) == 7 and all("group_key = N'" not in t and "INTO [s].[plain_groups]" not in t
                                        for t in role_tests)
    naming = [t for t in tests if t not in role_tests and ("[s].[plain_groups]" in t or "group_key = N'" in t)]
    assert len(naming) >= 10
    fake = ("EXEC tSQLt.FakeTable @TableName = N'[s].[plain_groups]';\n"
            "    EXEC [test_s_plain].[index the faked groups table];")
    for test in naming:
        assert fake in test, test[:test.index("\n")]
        first_use = min(i for i in (test.find("INSERT INTO [s].[plain_groups]"), test.find("EXEC [s].[plain_"),
                                    test.find("FROM [s].[plain_groups]")) if i >= 0)
        assert test.index(fake) < first_use, test[:test.index("\n")]


# ---- work (docs/queue-kinds.md, "SQL Server (work)"): a group is busy while it has an in-flight message.
WORK_QUEUES = [
    {"name": "jobs", "kind": "work", "payload": "json", "options": {"groups": True, "dedupe": True, "history": True}},
    {"name": "tasks", "kind": "work", "payload": "text", "options": {"groups": True, "client_ids": True}},
    {"name": "chores", "kind": "work", "payload": "json", "options": {"handler": "s.do_chore", "groups": True}},
    {"name": "plainwork", "kind": "work", "payload": "json"},
]
WORK_VERBS = ("enqueue", "enqueue_batch", "dequeue", "complete", "complete_batch", "complete_next", "fail",
              "fail_batch", "release", "extend_lease", "dead_requeue", "purge", "wait", "stats")


def _render_work() -> dict[str, str]:
    catalog = parse_catalog({"schema": "s", "queues": WORK_QUEUES})
    return {f.name: f.text for f in render_catalog(catalog, "mssql")}


def test_work_with_groups_renders_on_sql_server_and_passes_check_tsql() -> None:
    files = _render_work()
    # (chores names a handler that only a deployment provides: its EXEC would be an unresolved
    # reference here; its process procedure is rendered, and the matrix's work_handler is checked.)
    report = check_sources(sorted((name, text) for name, text in files.items()
                                  if name not in ("plainwork.sql", "chores.sql")))
    assert report.clean, "\n".join(map(str, report.findings + report.violations))
    for verb in WORK_VERBS:
        assert f"CREATE OR ALTER PROCEDURE [s].[jobs_{verb}]" in files["jobs.sql"], verb
    assert "CREATE OR ALTER PROCEDURE [s].[chores_process]" in files["chores.sql"]


def test_work_with_groups_has_the_contract_names() -> None:
    files = _render_work()
    for queue in ("jobs", "tasks"):
        text = files[f"{queue}.sql"]
        assert "@group_key nvarchar(MAX) = NULL" in _procedure(text, "enqueue", queue)
        assert re.search(rf"CREATE TYPE \[s\]\.\[{queue}_items\] AS TABLE \([^;]*group_key nvarchar\(MAX\)", text)
        # dequeue and complete_next return group_key after dequeue's other columns.
        assert re.search(r"c\.lease_token,\s+c\.group_key\s+FROM @claimed AS c", _procedure(text, "dequeue", queue))
        assert re.search(r"c\.lease_token,\s+c\.group_key,\s+@previous_completed AS previous_completed",
                         _procedure(text, "complete_next", queue))
        table = text[text.index(f"CREATE TABLE [s].[{queue}_groups]"):]
        table = table[:table.index(");")]
        assert "in_flight" in table and "PRIMARY KEY NONCLUSTERED (group_key)" in table
        # locked_at and in_flight are in no index: a holder's writes take the heap row, never the key
        # a producer's S pin reads.
        for index in re.findall(rf"INDEX \[\w+\]\s+ON \[s\]\.\[{queue}_groups\][^;]*", text):
            assert "locked_at" not in index and "in_flight" not in index
    # A buried or completed message keeps its group.
    jobs = files["jobs.sql"]
    for table in ("jobs_dead", "jobs_history"):
        body = jobs[jobs.index(f"CREATE TABLE [s].[{table}]"):]
        assert "group_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL" in body[:body.index(");")]


def test_the_grouped_work_claim_reads_only_due_head_candidates_and_never_waits() -> None:
    for queue, tie in (("jobs", "id"), ("tasks", "seq")):
        dequeue = _code(_procedure(_render_work()[f"{queue}.sql"], "dequeue", queue))
        # Ungrouped messages on the filtered claim index; grouped ones from the head index, a range
        # seek from the last candidate seen, stepping over every group this call has tried.
        assert re.search(rf"INDEX \(\[ix_{queue}_ready_ungrouped\]\), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, "
                         rf"READCOMMITTEDLOCK\)\s*WHERE m\.group_key IS NULL AND m\.leased_by IS NULL AND "
                         rf"m\.visible_at <= @now", dequeue)
        probe = dequeue[dequeue.index("@after_at = m.visible_at"):]
        probe = probe[:probe.index(f"ORDER BY m.visible_at, m.{tie};")]
        assert f"INDEX ([ix_{queue}_heads]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK" in probe
        assert "m.group_head = 1 AND m.visible_at >= @after_at AND m.visible_at <= @now" in probe
        assert re.search(r"AND NOT EXISTS \(\s*SELECT 1\s*FROM @visited AS v\s*WHERE v\.group_key = m\.group_key\s*\)",
                         probe)
        grouped = dequeue[dequeue.index("@after_at = m.visible_at"):]
        # The group is taken without waiting, remembered before the outcome is known.
        assert grouped.index("INSERT INTO @visited (group_key) VALUES (@group);") < grouped.index("WITH held_group AS")
        held = grouped[grouped.index("WITH held_group AS"):grouped.index("UPDATE held_group")]
        assert "READPAST, UPDLOCK, READCOMMITTEDLOCK" in held
        # The head: in_flight when set (a failed head retries first), else the group's oldest.
        assert re.search(r"IF @in_flight IS NULL\s*BEGIN\s*SET @waiting_id = NULL;", grouped)
        assert re.search(r"ELSE\s*BEGIN\s*SET @next_id = @in_flight;", grouped)
        # Leased only when due, and then the group's in-flight message.
        assert re.search(r"IF @head_due IS NULL OR @head_due > @now CONTINUE;\s*WITH group_head AS", grouped)
        assert re.search(r"WHERE visible_at <= @now;\s*IF @@ROWCOUNT = 1 AND @in_flight IS NULL", grouped)
        assert "UPDATE TOP (1000) other_candidates" in grouped and "UPDATE other_candidates" not in grouped
        # No OR in the WHERE of any hinted read (claims and probes).
        wheres = re.findall(r"WITH \(INDEX [^\n]*\)\s*WHERE\s(.*?)(?:ORDER BY|\n\s*\)|;)", dequeue, flags=re.S)
        assert len(wheres) > 8 and not any(re.search(r"\bOR\b", w) for w in wheres)


def test_acknowledgements_hold_the_group_first_and_settle_it_after() -> None:
    jobs = _render_work()["jobs.sql"]
    hold = re.compile(r"FROM \[s\]\.\[jobs_groups\] AS g WITH \(INDEX \(\[pk_jobs_groups\]\), FORCESEEK, ROWLOCK, "
                      r"UPDLOCK, HOLDLOCK\)")
    for verb, change in (("complete", "DELETE FROM [s].[jobs]"), ("fail", "UPDATE [s].[jobs]"),
                         ("complete_batch", "DELETE m"), ("fail_batch", "UPDATE m"),
                         ("complete_next", "DELETE FROM [s].[jobs]")):
        body = _code(_procedure(jobs, verb, "jobs"))
        held = hold.search(body)
        assert held, verb
        # The groups row (waiting: the acknowledgement must act), then the message (lock order).
        assert held.start() < body.index(change), verb
        # Settled after: in_flight cleared when its message is gone, the next head flagged.
        assert body.index(change) < body.index("SET in_flight = @in_flight"), verb
    # A retry keeps the group in flight: fail settles only a message that went to the dead table.
    assert re.search(r"IF @group IS NOT NULL AND @outcome = 'dead'", _procedure(jobs, "fail", "jobs"))
    # Batches hold their groups one at a time in key order.
    for verb in ("complete_batch", "fail_batch"):
        body = _code(_procedure(jobs, verb, "jobs"))
        assert re.search(r"WHERE a\.group_key > @group", body), verb
    # release and extend_lease change no group.
    for verb in ("release", "extend_lease"):
        assert "jobs_groups" not in _procedure(jobs, verb, "jobs")


def test_work_producers_never_take_a_lock_a_consumer_holds() -> None:
    for queue in ("jobs", "tasks"):
        for verb in ("enqueue", "enqueue_batch"):
            body = _code(_procedure(_render_work()[f"{queue}.sql"], verb, queue))
            groups_reads = re.findall(rf"\[s\]\.\[{queue}_groups\] AS g WITH \((.*?)\)\s*\n", body)
            assert any("READPAST, UPDLOCK" in r for r in groups_reads), verb
            assert all("UPDLOCK" not in r or "READPAST" in r for r in groups_reads), verb
            assert "HOLDLOCK)\n" not in body.split("[s].[" + queue + "_groups]")[1][:200]
            # The groups row before the message (the fixed lock order).
            assert body.index(f"[s].[{queue}_groups]") < body.index(f"INSERT INTO [s].[{queue}] ("), verb


def test_work_queues_without_groups_render_without_them() -> None:
    text = _render_work()["plainwork.sql"]
    assert "group_key" not in text and "_groups" not in text and "ix_plainwork_ungrouped" not in text


def test_the_work_groups_migrations_build_what_a_fresh_install_has() -> None:
    catalog = parse_catalog({"schema": "s", "queues": WORK_QUEUES[:1]})
    migrations = {f.name: f.text for f in render_migrations(catalog, "mssql")}
    added = migrations["s.jobs.work_table_add_groups.sql"]
    dropped = migrations["s.jobs.work_table_drop_groups.sql"]
    fresh = _render_work()["jobs.sql"]

    def indexes(text: str) -> set[str]:
        return {" ".join(i.split()) for i in re.findall(r"CREATE NONCLUSTERED INDEX \[ix_jobs_(?:ready_ungrouped|heads|group)\][^;]*?"
                                                         r"WHERE [^;\n]*", text)}

    assert indexes(fresh) == indexes(added) and len(indexes(fresh)) == 3
    assert "[ix_jobs_ready]" not in fresh
    # The old claim index goes after the code units (the old code pins it until then); dropping
    # groups builds it again before them and drops the group indexes after.
    after = added.index("tablequeue:step transaction after-code")
    assert added.index("DROP INDEX IF EXISTS [ix_jobs_ready]") > after
    assert dropped.index("CREATE NONCLUSTERED INDEX [ix_jobs_ready]") < dropped.index("after-code")
    assert all(dropped.index(f"DROP INDEX IF EXISTS [ix_jobs_{p}]") > dropped.index("after-code")
               for p in ("heads", "group", "ready_ungrouped"))
    for role in ("dead", "history"):
        assert "ADD group_key nvarchar(200)" in migrations[f"s.jobs_{role}.work_{role}_add_groups.sql"]
        assert "DROP COLUMN group_key" in migrations[f"s.jobs_{role}.work_{role}_drop_groups.sql"]


# ---- the senior-DBA review of SQL Server work groups (/work/briefs/review-wgroups-report.md) ----

def test_every_work_head_search_starts_from_no_tie() -> None:
    """M1: a probe that finds no row assigns nothing; a tie left from the previous group (or from
    process's previous turn) picked the NULL id, and the group went without its head."""
    for queue in ("jobs", "tasks"):
        text = _code(_render_work()[f"{queue}.sql"])
        searches = text.count("SET @waiting_id = NULL;")
        assert searches > 10
        assert len(re.findall(r"SET @waiting_id = NULL;\s*SET @waiting_tie = NULL;\s*"
                              r"SET @flagged_id = NULL;\s*SET @flagged_tie = NULL;", text)) == searches
    # process's order probes too: its loop runs them again, and a DECLARE resets nothing.
    process = _code(_procedure(_render_work()["chores.sql"], "process", "chores"))
    for probe in ("ungrouped", "head"):
        for column in ("at", "tie"):
            reset = process.index(f"SET @oldest_{probe}_{column} = NULL;")
            assert reset < process.index(f"@oldest_{probe}_{column} = m.")


def test_the_own_claim_takes_the_groups_it_buries_in_without_waiting() -> None:
    """S1: the groups of the own messages the claim will bury are taken with READPAST (a producer's
    or an acknowledgement's open transaction is not waited for), before the claim touches a message
    row, and a message it would bury in a group it did not take is left out of the claim; no group
    is held after the claim (that was a lock-order inversion)."""
    for queue in ("jobs", "tasks"):
        dequeue = _code(_procedure(_render_work()[f"{queue}.sql"], "dequeue", queue))
        own = dequeue[dequeue.index("WHERE o.attempts >= 5;"):dequeue.index("SET @exhausted = (")]
        taken = own[:own.index("WITH own_messages AS")]
        assert "READPAST, UPDLOCK, READCOMMITTEDLOCK" in taken and "HOLDLOCK" not in taken
        assert re.search(r"IF @@ROWCOUNT = 0\s*BEGIN\s*DELETE FROM @acked_groups\s*WHERE group_key = @group;", taken)
        claim = own[own.index("WITH own_messages AS"):]
        assert re.search(r"WHERE\s*m\.leased_by = @worker AND m\.leased_by IS NOT NULL\s*AND NOT EXISTS \(\s*SELECT 1\s*"
                         r"WHERE\s*m\.group_key IS NOT NULL AND m\.visible_at <= @now AND m\.attempts >= 5\s*"
                         r"AND NOT EXISTS \(\s*SELECT 1\s*FROM @acked_groups AS a\s*WHERE a\.group_key = m\.group_key",
                         claim)
        # Between the own claim and its bury nothing takes a groups row.
        assert "_groups]" not in claim


def test_purge_never_drops_the_row_of_a_group_with_a_message_in_flight() -> None:
    """S3: the emptiness probes read past a locked in-flight message (extend_lease, release): its
    groups row must stay, or it would come back without in_flight; and the row is put back only when
    it was deleted."""
    purge = _code(_procedure(_render_work()["jobs.sql"], "purge", "jobs"))
    drop = purge[purge.index("SET LOCK_TIMEOUT 0;"):]
    assert re.search(r"DELETE FROM g\s*FROM \[s\]\.\[jobs_groups\] AS g WITH \(INDEX \(\[pk_jobs_groups\]\), FORCESEEK, ROWLOCK\)\s*"
                     r"WHERE g\.group_key = @group AND g\.in_flight IS NULL;\s*IF @@ROWCOUNT = 1\s*BEGIN\s*"
                     r"INSERT INTO \[s\]\.\[jobs_groups\] \(group_key\)", drop)
    # fifo's groups rows have no in_flight: its purge deletes the held row as before.
    fifo = _code(_procedure(_render()["plain.sql"], "purge", "plain"))
    assert "in_flight" not in fifo and "WHERE g.group_key = @group;\n" in fifo


def test_the_batch_acknowledgements_read_their_groups_with_the_acknowledgements_join() -> None:
    for verb in ("complete_batch", "fail_batch"):
        body = _code(_procedure(_render_work()["jobs.sql"], verb, "jobs"))
        assert re.search(r"INSERT INTO @acked_groups \(group_key\)\s*SELECT DISTINCT m\.group_key\s*FROM @batch AS b\s*"
                         r"INNER JOIN \[s\]\.\[jobs\] AS m ON b\.id = m\.id\s*WHERE m\.group_key IS NOT NULL\s*"
                         r"OPTION \(LOOP JOIN, FORCE ORDER\);", body), verb


def test_dead_requeue_settles_its_group_without_reading_the_in_flight_row() -> None:
    """NIT: dead_requeue deletes no queue row, so the in-flight message is there: reading it would
    wait for a caller that holds that row (extend_lease, release in an open transaction)."""
    body = _code(_procedure(_render_work()["jobs.sql"], "dead_requeue", "jobs"))
    settle = body[body.index("IF @group_held = 1"):]
    assert "WHERE m.id = @in_flight" not in settle[:settle.index("UPDATE g")]


def test_grouped_work_tsqlt_tests_fake_the_groups_table_and_build_its_key_from_the_ddl() -> None:
    """Review S4: as fifo's (above), every work test that names the groups table fakes it first and
    builds the key the verbs pin on the fake through the class's helper, whose index comes from the
    table's DDL source (_pinned_indexes.sql), not from a key written again in the test."""
    catalog = parse_catalog({"schema": "s", "queues": WORK_QUEUES})
    rendered = {f.queue: f.text for f in render_tsqlt(catalog)}
    ddl = _render_work()
    for queue in ("jobs", "tasks", "chores"):
        assert f"CONSTRAINT [pk_{queue}_groups] PRIMARY KEY NONCLUSTERED (group_key)" in ddl[f"{queue}.sql"]
        text = rendered[queue]
        helper = text[text.index(f"CREATE PROCEDURE [test_s_{queue}].[index the faked groups table]"):]
        helper = helper[:helper.index("\nGO\n")]
        assert re.search(rf"CREATE UNIQUE NONCLUSTERED INDEX \[pk_{queue}_groups\]\s+ON \[s\]\.\[{queue}_groups\] "
                         r"\(group_key\);", helper)
        tests = re.findall(rf"(?:--\[@tSQLt:NoTransaction\]\([^\n]*\)\n)?CREATE PROCEDURE \[test_s_{queue}\]\.\[test [^\]]*\]"
                           r"\nAS\nBEGIN\n.*?\nEND;\nGO\n", text, re.S)
        # The role tests run the verbs on the real tables on purpose (a fake carries no grants) and
        # write no group.
        # The pinned-index test reads only the real tables' catalog rows (sys.indexes), never a row.
        role_tests = [t for t in tests if re.search(r"CREATE PROCEDURE \S+\.\[test (the \w+ role |the pinned indexes )", t)]
        assert role_tests and all("group_key = N'" not in t and f"INTO [s].[{queue}_groups]" not in t
                                  for t in role_tests)
        naming = [t for t in tests if t not in role_tests and (f"[s].[{queue}_groups]" in t or "group_key = N'" in t)]
        assert len(naming) >= 15
        fake = (f"EXEC tSQLt.FakeTable @TableName = N'[s].[{queue}_groups]';\n"
                f"    EXEC [test_s_{queue}].[index the faked groups table];")
        assert "CREATE UNIQUE NONCLUSTERED INDEX" not in "".join(naming)
        for test in naming:
            name = test[test.index("CREATE PROCEDURE"):test.index("\n", test.index("CREATE PROCEDURE"))]
            assert fake in test, name
            first_use = min(i for i in (test.find(f"INSERT INTO [s].[{queue}_groups]"), test.find(f"EXEC [s].[{queue}_"),
                                        test.find(f"FROM [s].[{queue}_groups]")) if i >= 0)
            assert test.index(fake) < first_use, name
        # Purge drops empty groups' rows only outside a caller's transaction: the test of the row it
        # must keep (S3) runs outside tSQLt's, or it would pass with the defect in place.
        keeps = next(t for t in naming if "[test purge keeps the row of a group with a message in flight]" in t)
        assert keeps.startswith(f"--[@tSQLt:NoTransaction]('[test_s_{queue}].[undo what a test outside a transaction left]')")
        assert f"EXEC [s].[{queue}_purge];" in keeps


def test_work_wait_slides_its_window_so_held_groups_candidates_never_hide_a_free_group() -> None:
    """Re-review S1: work's grouped wait read the first 100 due candidates on every step (fifo's had
    been fixed): 100 spurious candidates of held groups hid a free group's head for the whole hold."""
    for queue, tie in (("jobs", "id"), ("tasks", "seq")):
        wait = _code(_procedure(_render_work()[f"{queue}.sql"], "wait", queue))
        step = wait[wait.index("WHILE 1 = 1"):wait.index("WAITFOR DELAY")]
        window = step[step.index("INSERT INTO @window"):step.index("FROM @window AS c")]
        assert re.search(rf"m\.group_head = 1 AND m\.visible_at >= @after_at AND m\.visible_at <= @now\s*"
                         rf"AND NOT \(m\.visible_at = @after_at AND m\.{tie} <= @after_tie\)\s*"
                         rf"ORDER BY m\.visible_at, m\.{tie};", window)
        slide = step[step.index("IF (SELECT COUNT(*) FROM @window) < 100"):]
        assert re.search(r"SET @after_at = '00010101';\s*SET @after_tie = 0;", slide)
        assert re.search(r"@after_at = c\.visible_at,\s*@after_tie = c\.tie\s*FROM @window AS c\s*"
                         r"ORDER BY c\.visible_at DESC, c\.tie DESC;", slide)
        # The probe of the window comes before the slide, and nothing else moves the window.
        assert step.index("FROM @window AS c") < step.index("IF (SELECT COUNT(*) FROM @window) < 100")
        assert wait.count("@after_at =") == 2 and wait.count("SET @after_at") == 1
