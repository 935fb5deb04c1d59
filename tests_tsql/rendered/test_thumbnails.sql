-- tablequeue 0.2.0 | generated: do not edit
-- template: tests_tsql/templates/test_work.sql | dialect: mssql | kind: work | queue: queue.thumbnails
-- noqa: disable=CP02, RF05
-- tSQLt's own names are mixed case (tSQLt.FakeTable, #Expected, #Actual) and a test is named by a
-- sentence in brackets ([test enqueue ...]), as tSQLt documents: sqlfluff's identifier casing (CP02)
-- and special-character (RF05) rules cannot hold for them. Every other rule applies.
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

EXEC tSQLt.NewTestClass 'test_queue_thumbnails';
GO

CREATE PROCEDURE [test_queue_thumbnails].[index the faked queue table]
AS
BEGIN
    CREATE NONCLUSTERED INDEX [ix_thumbnails_ready_priority]
        ON [queue].[thumbnails] (priority DESC, visible_at, seq)
        WHERE leased_by IS NULL;
    CREATE NONCLUSTERED INDEX [ix_thumbnails_lease]
        ON [queue].[thumbnails] (leased_by, visible_at, seq)
        WHERE leased_by IS NOT NULL;
    CREATE UNIQUE CLUSTERED INDEX [ux_thumbnails_seq]
        ON [queue].[thumbnails] (seq);
    CREATE UNIQUE NONCLUSTERED INDEX [pk_thumbnails]
        ON [queue].[thumbnails] (id);
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[index the faked dead-letter table]
AS
BEGIN
    CREATE NONCLUSTERED INDEX [pk_thumbnails_dead]
        ON [queue].[thumbnails_dead] (id);
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[undo what a test outside a transaction left]
AS
BEGIN
    -- The clean-up of the NoTransaction tests (--[@tSQLt:NoTransaction]), which tSQLt runs after
    -- such a test and before tSQLt.UndoTestDoubles puts back what it faked or moved away: a
    -- transaction the test left open, the handler double (only it carries the marker:
    -- a real handler that tSQLt.RemoveObjectIfExists moved away comes back untouched) and the handler's
    -- schema if the test created it.
    -- Rolling back here ends this procedure with a lower @@TRANCOUNT than it began with: Msg 266,
    -- on which tSQLt's handler skips its own tSQLt.UndoTestDoubles and the real tables would stay
    -- renamed. So, after such a rollback, the doubles are undone here (the handler double
    -- first: it sits under the real handler's name).
    DECLARE @left_open bit = IIF(@@TRANCOUNT > 0, 1, 0);
    IF @left_open = 1 ROLLBACK TRANSACTION;
    IF OBJECT_DEFINITION(OBJECT_ID(N'[queue].[make_thumbnail]', N'P')) LIKE N'%tablequeue tSQLt handler double%'
        BEGIN
            DROP PROCEDURE [queue].[make_thumbnail];
        END;
    -- The flag is read and cleared before the DROP, so that a DROP that fails cannot leave it set for
    -- the next test of the session (which did not create the schema).
    DECLARE @created_schema int = CONVERT(int, SESSION_CONTEXT(N'tablequeue test created schema'));
    EXEC sys.sp_set_session_context @key = N'tablequeue test created schema', @value = NULL;
    IF
        @created_schema = 1
        AND NOT EXISTS (
            SELECT 1 FROM sys.objects AS o
            WHERE o.schema_id = SCHEMA_ID(N'queue')
        )
        BEGIN
            EXEC (N'DROP SCHEMA [queue];');
        END;
    IF @left_open = 1
        BEGIN
            EXEC tSQLt.UndoTestDoubles;
        END;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[SetUp]
AS
BEGIN
    -- tSQLt runs this before every test of the class. The session's look for expired leases is due
    -- at the start of each test: SESSION_CONTEXT belongs to the session, not to the transaction tSQLt
    -- rolls back, so one test's dequeue would otherwise decide whether the next one looks.
    EXEC sys.sp_set_session_context @key = N'tablequeue.queue.thumbnails.expired', @value = NULL;
END;
GO

-- enqueue -----------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue stores a message due now, no attempt, and returns its id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Returned (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Returned (id, duplicate)
    EXEC [queue].[thumbnails_enqueue] @payload = N'{"n": 1}';

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    SELECT
        m.id,
        m.payload,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.due_at = m.visible_at AND m.visible_at BETWEEN @before AND @after, 1, 0)) AS due_now
    INTO #Actual
    FROM [queue].[thumbnails] AS m;

    SELECT TOP (0)
        a.id,
        a.payload,
        a.attempts,
        a.leased_by,
        a.due_now
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (id, payload, attempts, leased_by, due_now)
    SELECT
        r.id,
        N'{"n": 1}' AS payload,
        0 AS attempts,
        NULL AS leased_by,
        1 AS due_now
    FROM #Returned AS r
    WHERE r.duplicate = 0;
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue with due_at schedules the message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @due datetime2(7) = DATEADD(HOUR, 3, SYSUTCDATETIME());
    CREATE TABLE #Ignored (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC [queue].[thumbnails_enqueue] @payload = N'{"n": 1}', @due_at = @due;

    -- Assert
    DECLARE @scheduled int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE m.due_at = @due AND m.visible_at = @due
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @scheduled, @Message = N'due_at / visible_at not kept';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue refuses a NULL payload with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002;

    -- Act
    EXEC [queue].[thumbnails_enqueue] @payload = NULL;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue refuses invalid JSON with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002;

    -- Act
    EXEC [queue].[thumbnails_enqueue] @payload = N'{"unterminated": ';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the table itself refuses invalid JSON]
AS
BEGIN
    -- Storage v4 dropped PostgreSQL's CHECKs (it evaluates them on every UPDATE); SQL Server keeps
    -- this one, which costs a lease nothing (no UPDATE sets payload: check-tsql's update-payload).
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ApplyConstraint
        @TableName = N'[queue].[thumbnails]',
        @ConstraintName = N'ck_thumbnails_payload_json';
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 547,
        @ExpectedMessagePattern = N'%ck_thumbnails_payload_json%';

    -- Act
    INSERT INTO [queue].[thumbnails] (payload) VALUES (N'not json');
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue refuses a dedupe_key without option dedupe]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_enqueue] @payload = N'{"n": 1}', @dedupe_key = N'k';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue stores the priority, 0 by default]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    CREATE TABLE #Ignored (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC [queue].[thumbnails_enqueue] @payload = N'{"n": 1}', @priority = 7;
    INSERT INTO #Ignored (id, duplicate)
    EXEC [queue].[thumbnails_enqueue] @payload = N'{"n": 2}';

    -- Assert
    SELECT m.priority
    INTO #Actual
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #Expected (priority int NULL);
    INSERT INTO #Expected (priority) VALUES (7), (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue keeps the client id and created time]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @created datetime2(7) = '2024-05-01T12:30:15.1234567';
    CREATE TABLE #Actual (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[thumbnails_enqueue]
        @payload = N'{"n": 1}',
        @id = '00000000-0000-0000-0000-000000000005',
        @enqueued_at = @created;

    -- Assert
    CREATE TABLE #Expected (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES ('00000000-0000-0000-0000-000000000005', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @stored datetime2(7) = (SELECT m.enqueued_at FROM [queue].[thumbnails] AS m);
    EXEC tSQLt.AssertEquals @Expected = @created, @Actual = @stored;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue of a queued client id is a duplicate]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000005', 5, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 5}'
    );
    CREATE TABLE #Actual (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[thumbnails_enqueue]
        @payload = N'{"n": 6}',
        @id = '00000000-0000-0000-0000-000000000005';

    -- Assert
    CREATE TABLE #Expected (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES ('00000000-0000-0000-0000-000000000005', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000005', 0, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

-- enqueue_batch -----------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue_batch returns a row per item in item order]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @items [queue].[thumbnails_items];
    -- Filled out of order on purpose: the ordinal, not the insertion order, is the item order.
    INSERT INTO @items (ordinal, payload, id)
    VALUES
    (3, N'{"n": 3}', '00000000-0000-0000-0000-000000000003'),
    (1, N'{"n": 1}', '00000000-0000-0000-0000-000000000001'),
    (2, N'{"n": 2}', '00000000-0000-0000-0000-000000000002');
    CREATE TABLE #Actual (ordinal int NOT NULL, id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC [queue].[thumbnails_enqueue_batch] @items = @items;

    -- Assert: new ids follow the item order.
    CREATE TABLE #Expected (ordinal int NOT NULL, id uniqueidentifier NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (ordinal, id, duplicate)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 0),
    (2, '00000000-0000-0000-0000-000000000002', 0),
    (3, '00000000-0000-0000-0000-000000000003', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.payload
    INTO #Stored
    FROM [queue].[thumbnails] AS m;

    SELECT TOP (0)
        s.id,
        s.payload
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, payload)
    VALUES
    ('00000000-0000-0000-0000-000000000001', N'{"n": 1}'),
    ('00000000-0000-0000-0000-000000000002', N'{"n": 2}'),
    ('00000000-0000-0000-0000-000000000003', N'{"n": 3}');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue_batch refuses a NULL payload with 51002, naming it]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @items [queue].[thumbnails_items];
    INSERT INTO @items (ordinal, payload) VALUES (1, N'{"n": 1}'), (2, NULL);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC [queue].[thumbnails_enqueue_batch] @items = @items;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test enqueue_batch refuses dedupe_key without option dedupe]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @items [queue].[thumbnails_items];
    INSERT INTO @items (ordinal, payload, dedupe_key) VALUES (1, N'{"n": 1}', N'k');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_enqueue_batch] @items = @items;
END;
GO

-- dequeue -----------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue leases visible messages in order, one attempt each]
AS
BEGIN
    -- Assemble: ids and visible times disagree, so only the visible order passes.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -10, @now),
        DATEADD(SECOND, -10, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -30, @now),
        DATEADD(SECOND, -30, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -20, @now),
        DATEADD(SECOND, -20, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 2,
        @worker = N'w',
        @lease_seconds = 600;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 1),
    (2, '00000000-0000-0000-0000-000000000003', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 0, NULL, 1),
    ('00000000-0000-0000-0000-000000000002', 1, N'w', 0),
    ('00000000-0000-0000-0000-000000000003', 1, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    DECLARE @lease_ends int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE m.leased_by = N'w' AND m.visible_at > DATEADD(SECOND, 590, @now) AND m.leased_at >= @now
    );
    EXEC tSQLt.AssertEquals @Expected = 2, @Actual = @lease_ends, @Message = N'lease not from now';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test a later dequeue takes an earlier-visible message first]
AS
BEGIN
    -- Assemble: a dequeue has taken message 1; then message 3 arrives, visible since long before
    -- (an enqueue with a due time in the past). The claim order starts at its head on every call
    -- (the PostgreSQL twin keeps a claim position and moves it back: docs/queue-kinds.md).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -30, @now),
        DATEADD(SECOND, -30, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -20, @now),
        DATEADD(SECOND, -20, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Earlier (
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO #Earlier (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue] @batch_size = 1, @worker = N'w', @lease_seconds = 600;
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now),
        DATEADD(SECOND, -3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'v',
        @lease_seconds = 600;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000003', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue skips messages not yet due and live leases]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'other', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 10,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 0, NULL, 0),
    ('00000000-0000-0000-0000-000000000002', 1, N'other', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue gives a worker its own leased messages first]
AS
BEGIN
    -- Assemble: message 1 is visible and older than anything, yet w gets its own leased 2 first.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3000, @now),
        DATEADD(SECOND, -3000, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 2,
        @worker = N'w',
        @lease_seconds = 600;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert: 2 comes back in the attempt it is in (its lease is live).
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 1),
    (2, '00000000-0000-0000-0000-000000000001', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue again returns a live own lease as it is]
AS
BEGIN
    -- Assemble: w holds 2 with a minute left; asking three times must neither spend an attempt nor
    -- move the lease's expiry (0.1.0 counted an attempt each time and buried it as 'lease expired').
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 4,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    DECLARE @expiry datetime2(7) = (SELECT m.visible_at FROM [queue].[thumbnails] AS m);
    CREATE TABLE #Ignored (
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act
    INSERT INTO #Ignored
    EXEC [queue].[thumbnails_dequeue] @batch_size = 1, @worker = N'w', @lease_seconds = 600;
    INSERT INTO #Ignored
    EXEC [queue].[thumbnails_dequeue] @batch_size = 1, @worker = N'w', @lease_seconds = 600;
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'w',
        @lease_seconds = 600;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 4);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @expiry_after datetime2(7) = (SELECT m.visible_at FROM [queue].[thumbnails] AS m);
    EXEC tSQLt.AssertEquals @Expected = @expiry, @Actual = @expiry_after;
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test a refused argument leaves the caller's transaction usable]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's transaction.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @error int;

    -- Act: as a driver's session has it (engines.connect sets it; tSQLt's session has it off, where
    -- the test would pass whatever the procedure did). The argument check throws with XACT_ABORT
    -- off, its own setting, so the transaction is not doomed.
    SET XACT_ABORT ON;
    BEGIN TRY
        EXEC [queue].[thumbnails_dequeue] @batch_size = 1, @worker = NULL;
    END TRY
    BEGIN CATCH
        SET @error = ERROR_NUMBER();
    END CATCH;

    -- Assert
    DECLARE @state smallint = XACT_STATE();
    EXEC tSQLt.AssertEquals @Expected = 51001, @Actual = @error;
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @state;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue takes an expired lease as the next attempt]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 2, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue leaves an expired lease until the look is due]
AS
BEGIN
    -- Assemble: 1's lease expired, 2 is ready; this session looked for expired leases a moment ago.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @next_look datetime2(7);
    -- A first call on the empty fake compiles the procedure, so that the second runs within the
    -- second the key is set for; it finds nothing.
    CREATE TABLE #DequeuedCompile (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #DequeuedCompile (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #ActualCompile
    FROM #DequeuedCompile AS d;
    CREATE TABLE #ExpectedCompile (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedCompile', @Actual = N'#ActualCompile';
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -10, @now),
        DATEADD(SECOND, -10, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    SET @next_look = DATEADD(MILLISECOND, 1000, SYSUTCDATETIME());
    EXEC sys.sp_set_session_context @key = N'tablequeue.queue.thumbnails.expired', @value = @next_look;
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 2,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;
    IF SYSUTCDATETIME() >= @next_look
        EXEC tSQLt.Fail N'inconclusive: the dequeue took longer than the second the key was set for';

    -- Assert: only the ready message; the expired lease waits for the session's next look.
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, N'crashed', 1),
    ('00000000-0000-0000-0000-000000000002', 1, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the look takes every holder's expired leases and no live one]
AS
BEGIN
    -- Assemble: a's lease is live; b's and c's expired. The look walks the holders one at a time.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'a', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'b', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -6, @now), 0, 1,
        N'c', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 3}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 5,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert: both expired leases, oldest expiry first; a's lease as it was.
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000003', 2),
    (2, '00000000-0000-0000-0000-000000000002', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, N'a', 0),
    ('00000000-0000-0000-0000-000000000002', 2, N'w', 0),
    ('00000000-0000-0000-0000-000000000003', 2, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the look stays on a holder whose expired lease it buried]
AS
BEGIN
    -- Assemble: holder 'x' (sorting after the caller 'w') crashed with two expired leases, the older
    -- one out of attempts; nothing else is ready. The batch of one is the second of them.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -20, @now), 0, 4,
        N'x', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -10, @now), 0, 1,
        N'x', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert: the buried lease freed the batch's place, and the look took x's next expired lease.
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        d.id,
        d.attempts,
        d.last_error,
        d.last_worker
    INTO #Dead
    FROM [queue].[thumbnails_dead] AS d;

    CREATE TABLE #ExpectedDead (
        id uniqueidentifier NULL,
        attempts int NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL
    );
    INSERT INTO #ExpectedDead (id, attempts, last_error, last_worker)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 4, N'lease expired', N'x');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedDead', @Actual = N'#Dead';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 2, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test a look short of the batch makes the next due in a second]
AS
BEGIN
    -- Assemble: one expired lease, a batch of two.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 2,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @next_look sql_variant = SESSION_CONTEXT(N'tablequeue.queue.thumbnails.expired');
    DECLARE @next_look_type sysname = CONVERT(sysname, SQL_VARIANT_PROPERTY(@next_look, 'BaseType'));
    EXEC tSQLt.AssertEqualsString @Expected = N'datetime2', @Actual = @next_look_type;
    IF CONVERT(datetime2(7), @next_look) NOT BETWEEN DATEADD(SECOND, 1, @now) AND DATEADD(SECOND, 1, SYSUTCDATETIME())
        BEGIN
            EXEC tSQLt.Fail N'the next look is not due a second after this one';
        END;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test a look that fills the batch leaves the look due]
AS
BEGIN
    -- Assemble: a crashed worker's two expired leases, a batch of one.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;
    CREATE TABLE #DequeuedAgain (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #DequeuedAgain (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'v',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #ActualAgain
    FROM #DequeuedAgain AS d;

    -- Assert: the second call looked again and took the other one.
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    CREATE TABLE #ExpectedAgain (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #ExpectedAgain (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedAgain', @Actual = N'#ActualAgain';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test an untrusted look setting leaves the look due]
AS
BEGIN
    -- Assemble: the session's own values for the key (any type, any time): not one the procedures
    -- wrote, or more than a second ahead, so the look is due.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @far datetime2(7) = DATEADD(HOUR, 1, SYSUTCDATETIME());
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    EXEC sys.sp_set_session_context @key = N'tablequeue.queue.thumbnails.expired', @value = N'soon';
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;
    EXEC sys.sp_set_session_context @key = N'tablequeue.queue.thumbnails.expired', @value = @far;
    CREATE TABLE #DequeuedAgain (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #DequeuedAgain (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'v',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #ActualAgain
    FROM #DequeuedAgain AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    CREATE TABLE #ExpectedAgain (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #ExpectedAgain (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedAgain', @Actual = N'#ActualAgain';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue buries a message out of attempts and fills the batch]
AS
BEGIN
    -- Assemble: message 1 used its 4 attempts and its last lease expired; 2 is ready.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -20, @now), 0, 4,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -10, @now),
        DATEADD(SECOND, -10, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        d.id,
        d.attempts,
        d.last_error,
        d.last_worker
    INTO #Dead
    FROM [queue].[thumbnails_dead] AS d;

    CREATE TABLE #ExpectedDead (
        id uniqueidentifier NULL,
        attempts int NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL
    );
    INSERT INTO #ExpectedDead (id, attempts, last_error, last_worker)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 4, N'lease expired', N'crashed');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedDead', @Actual = N'#Dead';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 1, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue hands out higher priorities first]
AS
BEGIN
    -- Assemble: a delayed message at the top level must not hide the ready ones below it.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -50, @now),
        DATEADD(SECOND, -50, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -10, @now),
        DATEADD(SECOND, -10, @now), 5, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -30, @now),
        DATEADD(SECOND, -30, @now), 1, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000004', 4, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -40, @now),
        DATEADD(SECOND, -40, @now), 1, 0,
        NULL, NULL,
        NULL, N'{"n": 4}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000005', 5, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 9, 0,
        NULL, NULL,
        NULL, N'{"n": 5}'
    );
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 10,
        @worker = N'w',
        @lease_seconds = NULL;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;

    -- Assert
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 1),
    (2, '00000000-0000-0000-0000-000000000004', 1),
    (3, '00000000-0000-0000-0000-000000000003', 1),
    (4, '00000000-0000-0000-0000-000000000001', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue refuses batch_size 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_dequeue] @batch_size = 0, @worker = N'w';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue refuses batch_size 1001 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_dequeue] @batch_size = 1001, @worker = N'w';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue refuses a NULL worker with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_dequeue] @batch_size = 1, @worker = NULL;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue refuses lease_seconds 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_dequeue] @batch_size = 1, @worker = N'w', @lease_seconds = 0;
END;
GO

-- complete ----------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test complete by the lease holder removes the message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 2,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC [queue].[thumbnails_complete]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w';

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 0, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete by another worker returns 0]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC [queue].[thumbnails_complete]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'late';

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete after the lease expired returns 0]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -1, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC [queue].[thumbnails_complete]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w';

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, N'w', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete refuses a NULL worker with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_complete]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = NULL;
END;
GO

-- fail --------------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test fail with attempts left retries after the delay]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 3,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (outcome varchar(8) NOT NULL);

    -- Act
    INSERT INTO #Actual (outcome)
    EXEC [queue].[thumbnails_fail]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @error = N'timeout',
        @retry_after_seconds = 300;

    -- Assert
    CREATE TABLE #Expected (outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (outcome) VALUES ('retrying');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 3, NULL, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    DECLARE @retry_kept int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE m.last_error = N'timeout' AND m.visible_at > DATEADD(SECOND, 290, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @retry_kept, @Message = N'error or retry time not kept';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test fail on the last attempt moves the message to dead]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 4,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (outcome varchar(8) NOT NULL);

    -- Act
    INSERT INTO #Actual (outcome)
    EXEC [queue].[thumbnails_fail]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @error = N'poison';

    -- Assert
    CREATE TABLE #Expected (outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (outcome) VALUES ('dead');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        d.id,
        d.attempts,
        d.last_error,
        d.last_worker
    INTO #Dead
    FROM [queue].[thumbnails_dead] AS d;

    CREATE TABLE #ExpectedDead (
        id uniqueidentifier NULL,
        attempts int NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL
    );
    INSERT INTO #ExpectedDead (id, attempts, last_error, last_worker)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 4, N'poison', N'w');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedDead', @Actual = N'#Dead';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test fail without the live lease is lost]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 4,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (outcome varchar(8) NOT NULL);

    -- Act
    INSERT INTO #Actual (outcome)
    EXEC [queue].[thumbnails_fail]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'late',
        @error = N'x';

    -- Assert
    CREATE TABLE #Expected (outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (outcome) VALUES ('lost');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 4, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

--[@tSQLt:NoTransaction]('[test_queue_thumbnails].[undo what a test outside a transaction left]')
CREATE PROCEDURE [test_queue_thumbnails].[test fail in implicit-transaction mode joins the caller's transaction]
AS
BEGIN
    -- Assemble: outside tSQLt's transaction (NoTransaction), as a manual-commit caller (ODBC/JDBC
    -- autocommit off) calls: IMPLICIT_TRANSACTIONS ON at @@TRANCOUNT = 0. fail opens a transaction
    -- of its own only for an autocommit caller; here its first statement opens the caller's, and
    -- fail neither commits nor ends the caller's implicit transaction. The fakes come back
    -- through tSQLt.UndoTestDoubles.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 4,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    DECLARE @open_after int;

    -- Act: the last attempt fails (to dead), then the caller rolls its transaction back. Plain
    -- EXEC: INSERT ... EXEC would open the transaction before the call. Should fail raise, the
    -- catch rolls back and leaves implicit-transaction mode before re-raising: the clean-up then
    -- finds no transaction open.
    BEGIN TRY
        SET IMPLICIT_TRANSACTIONS ON;
        EXEC [queue].[thumbnails_fail]
            @id = '00000000-0000-0000-0000-000000000001',
            @worker = N'w',
            @error = N'poison';
        SET @open_after = @@TRANCOUNT;
        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        SET IMPLICIT_TRANSACTIONS OFF;
    END TRY
    BEGIN CATCH
        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        SET IMPLICIT_TRANSACTIONS OFF;
        THROW;
    END CATCH;

    -- Assert: the caller's transaction was still open, and its rollback undid the move.
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @open_after, @Message = N'fail ended the caller''s transaction';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 4, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test fail refuses a negative retry_after_seconds with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_fail]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @error = N'x',
        @retry_after_seconds = -1;
END;
GO

-- extend_lease ------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test extend_lease by the holder runs from now]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 5, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (extended bit NOT NULL);

    -- Act
    INSERT INTO #Actual (extended)
    EXEC [queue].[thumbnails_extend_lease]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert
    CREATE TABLE #Expected (extended bit NOT NULL);
    INSERT INTO #Expected (extended) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @extended int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE m.visible_at > DATEADD(SECOND, 590, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @extended;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test extend_lease of an expired lease returns 0]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (extended bit NOT NULL);

    -- Act
    INSERT INTO #Actual (extended)
    EXEC [queue].[thumbnails_extend_lease]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert
    CREATE TABLE #Expected (extended bit NOT NULL);
    INSERT INTO #Expected (extended) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, N'w', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test extend_lease by another worker returns 0 and leaves the lease]
AS
BEGIN
    -- Assemble: w holds a live lease (token 1) for another 60 seconds.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    CREATE TABLE #Actual (extended bit NOT NULL);

    -- Act: another worker, by name alone and with w's token.
    INSERT INTO #Actual (extended)
    EXEC [queue].[thumbnails_extend_lease]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'intruder',
        @lease_seconds = 600;
    INSERT INTO #Actual (extended)
    EXEC [queue].[thumbnails_extend_lease]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'intruder',
        @lease_seconds = 600,
        @lease_token = '7e57ab1e-0000-0000-0000-000000000001';

    -- Assert: nothing extended; the lease is still w's, with its token, ending when it did.
    CREATE TABLE #Expected (extended bit NOT NULL);
    INSERT INTO #Expected (extended) VALUES (0), (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @unchanged int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE
            m.leased_by = N'w'
            AND m.lease_token = '7e57ab1e-0000-0000-0000-000000000001'
            AND m.visible_at = DATEADD(SECOND, 60, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @unchanged, @Message = N'the lease changed';
END;
GO

-- lease tokens ------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test dequeue gives a new lease a new token, a live lease its own]
AS
BEGIN
    -- Assemble: w holds 1 (token 1, live); 2 and 3 are visible.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -20, @now),
        DATEADD(SECOND, -20, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -10, @now),
        DATEADD(SECOND, -10, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    CREATE TABLE #Dequeued (
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 3,
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert: what dequeue returned is each row's token; 1 kept its own; 2 and 3 got two new ones.
    SELECT
        d.id,
        CONVERT(bit, IIF(d.lease_token = m.lease_token, 1, 0)) AS returned_the_stored_token,
        CONVERT(bit, IIF(d.lease_token = '7e57ab1e-0000-0000-0000-000000000001', 1, 0)) AS the_old_token
    INTO #Actual
    FROM #Dequeued AS d
    INNER JOIN [queue].[thumbnails] AS m ON d.id = m.id;

    CREATE TABLE #Expected (id uniqueidentifier NOT NULL, returned_the_stored_token bit NULL, the_old_token bit NULL);
    INSERT INTO #Expected (id, returned_the_stored_token, the_old_token)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, 1),
    ('00000000-0000-0000-0000-000000000002', 1, 0),
    ('00000000-0000-0000-0000-000000000003', 1, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @distinct_tokens int = (SELECT COUNT(DISTINCT d.lease_token) FROM #Dequeued AS d);
    EXEC tSQLt.AssertEquals @Expected = 3, @Actual = @distinct_tokens, @Message = N'two leases share a token';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test a stale token changes nothing, even for the same worker]
AS
BEGIN
    -- Assemble: w's first lease (token 1) expired and w leased the message again (token 2); w's
    -- late calls from the first attempt carry token 1.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 4,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000002', N'{"n": 1}'
    );
    DECLARE @expiry datetime2(7) = (SELECT m.visible_at FROM [queue].[thumbnails] AS m);
    DECLARE @stale uniqueidentifier = '7e57ab1e-0000-0000-0000-000000000001';
    CREATE TABLE #Completed (completed bit NOT NULL);
    CREATE TABLE #Failed (outcome varchar(8) NOT NULL);
    CREATE TABLE #Extended (extended bit NOT NULL);
    CREATE TABLE #Released (released bit NOT NULL);

    -- Act
    INSERT INTO #Completed (completed)
    EXEC [queue].[thumbnails_complete]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_token = @stale;
    INSERT INTO #Failed (outcome)
    EXEC [queue].[thumbnails_fail]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @error = N'late',
        @lease_token = @stale;
    INSERT INTO #Extended (extended)
    EXEC [queue].[thumbnails_extend_lease]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_seconds = 3600,
        @lease_token = @stale;
    INSERT INTO #Released (released)
    EXEC [queue].[thumbnails_release]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_token = @stale;

    -- Assert: every verb reports the lease lost; the message is as it was (on its last attempt, a
    -- fail that got through would have buried it).
    DECLARE @completed bit = (SELECT c.completed FROM #Completed AS c);
    DECLARE @outcome varchar(8) = (SELECT f.outcome FROM #Failed AS f);
    DECLARE @extended bit = (SELECT e.extended FROM #Extended AS e);
    DECLARE @released bit = (SELECT r.released FROM #Released AS r);
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @completed, @Message = N'complete';
    EXEC tSQLt.AssertEqualsString @Expected = 'lost', @Actual = @outcome, @Message = N'fail';
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @extended, @Message = N'extend_lease';
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @released, @Message = N'release';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 4, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    DECLARE @unchanged int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE m.visible_at = @expiry AND m.lease_token = '7e57ab1e-0000-0000-0000-000000000002' AND m.last_error IS NULL
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @unchanged, @Message = N'lease, token or error changed';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete with the current token removes the message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000002', N'{"n": 1}'
    );
    DECLARE @current uniqueidentifier = '7e57ab1e-0000-0000-0000-000000000002';
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC [queue].[thumbnails_complete]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_token = @current;

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test a NULL token keeps the check by worker name]
AS
BEGIN
    -- Assemble: w holds 1 under token 2; v holds nothing (0.1.0's calls pass no token).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 5, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000002', N'{"n": 1}'
    );
    CREATE TABLE #ByAnother (extended bit NOT NULL);
    CREATE TABLE #ByTheHolder (extended bit NOT NULL);

    -- Act
    INSERT INTO #ByAnother (extended)
    EXEC [queue].[thumbnails_extend_lease]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'v',
        @lease_seconds = 600;
    INSERT INTO #ByTheHolder (extended)
    EXEC [queue].[thumbnails_extend_lease]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert: another name is refused, the holder's name is enough, and the token stays.
    DECLARE @by_another bit = (SELECT a.extended FROM #ByAnother AS a);
    DECLARE @by_the_holder bit = (SELECT h.extended FROM #ByTheHolder AS h);
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @by_another, @Message = N'another worker extended it';
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @by_the_holder, @Message = N'the holder could not extend it';
    DECLARE @kept int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE m.lease_token = '7e57ab1e-0000-0000-0000-000000000002' AND m.visible_at > DATEADD(SECOND, 590, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @kept, @Message = N'lease not extended under its token';
END;
GO

-- release -----------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test release returns the attempt and makes the message visible now]
AS
BEGIN
    -- Assemble: w holds 1 on its second attempt (token 1), with ten minutes left.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 600, @now), 0, 2,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    DECLARE @current uniqueidentifier = '7e57ab1e-0000-0000-0000-000000000001';
    CREATE TABLE #Released (released bit NOT NULL);

    -- Act
    INSERT INTO #Released (released)
    EXEC [queue].[thumbnails_release]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_token = @current;

    -- Assert: no lease left at all, one attempt fewer, and another worker gets it at once, its
    -- second attempt again.
    DECLARE @released bit = (SELECT r.released FROM #Released AS r);
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @released;
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    DECLARE @lease_gone int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE m.leased_at IS NULL AND m.lease_token IS NULL
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @lease_gone, @Message = N'leased_at or lease_token kept';
    CREATE TABLE #Dequeued (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token)
    EXEC [queue].[thumbnails_dequeue]
        @batch_size = 1,
        @worker = N'v',
        @lease_seconds = 600;

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual
    FROM #Dequeued AS d;
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, attempts int NOT NULL);
    INSERT INTO #Expected (position, id, attempts)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test release never takes attempts below 0]
AS
BEGIN
    -- Assemble: a lease with no attempt counted (a row put back by hand, say).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 600, @now), 0, 0,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    CREATE TABLE #Ignored (released bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (released)
    EXEC [queue].[thumbnails_release] @id = '00000000-0000-0000-0000-000000000001', @worker = N'w';

    -- Assert
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 0, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test release of an expired lease returns 0 and changes nothing]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 2,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    DECLARE @current uniqueidentifier = '7e57ab1e-0000-0000-0000-000000000001';
    CREATE TABLE #Actual (released bit NOT NULL);

    -- Act
    INSERT INTO #Actual (released)
    EXEC [queue].[thumbnails_release]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_token = @current;

    -- Assert
    CREATE TABLE #Expected (released bit NOT NULL);
    INSERT INTO #Expected (released) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 2, N'w', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

-- complete_batch ----------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test complete_batch completes the held leases and reports a stale item]
AS
BEGIN
    -- Assemble: w holds 1, 2 and 3 (tokens 1, 2, 3); the batch, out of order, carries a stale
    -- token for 2 (an earlier lease of it); 4 is w's too but not in the batch.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 2,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000002', N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000003', N'{"n": 3}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000004', 4, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000004', N'{"n": 4}'
    );
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000003', '7e57ab1e-0000-0000-0000-000000000003'),
    ('00000000-0000-0000-0000-000000000002', '7e57ab1e-0000-0000-0000-000000000009'),
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000001');
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        completed bit NOT NULL
    );

    -- Act
    INSERT INTO #Actual (id, completed)
    EXEC [queue].[thumbnails_complete_batch] @acks = @acks, @worker = N'w';

    -- Assert: one row per item, in id order.
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, completed bit NOT NULL);
    INSERT INTO #Expected (position, id, completed)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 1),
    (2, '00000000-0000-0000-0000-000000000002', 0),
    (3, '00000000-0000-0000-0000-000000000003', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 2, N'w', 0),
    ('00000000-0000-0000-0000-000000000004', 1, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete_batch with a NULL token checks the worker name]
AS
BEGIN
    -- Assemble: w holds 1, v holds 2; w acknowledges both without tokens.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'v', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000002', N'{"n": 2}'
    );
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000001', NULL),
    ('00000000-0000-0000-0000-000000000002', NULL);
    CREATE TABLE #Actual (id uniqueidentifier NOT NULL, completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, completed)
    EXEC [queue].[thumbnails_complete_batch] @acks = @acks, @worker = N'w';

    -- Assert
    CREATE TABLE #Expected (id uniqueidentifier NOT NULL, completed bit NOT NULL);
    INSERT INTO #Expected (id, completed)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1),
    ('00000000-0000-0000-0000-000000000002', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 1, N'v', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete_batch of no items returns no rows]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @acks [queue].[thumbnails_acks];
    CREATE TABLE #Actual (id uniqueidentifier NOT NULL, completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, completed)
    EXEC [queue].[thumbnails_complete_batch] @acks = @acks, @worker = N'w';

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete_batch refuses more than 1000 items with 51001]
AS
BEGIN
    -- Assemble: past ~5,000 row locks a batch would escalate to a table lock READPAST cannot skip.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id)
    SELECT TOP (1001) NEWID() AS id
    FROM sys.all_columns;
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51001,
        @ExpectedMessagePattern = N'%complete_batch: at most 1000 items%';

    -- Act
    EXEC [queue].[thumbnails_complete_batch] @acks = @acks, @worker = N'w';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete_batch refuses a repeated id, the transaction usable]
AS
BEGIN
    -- Assemble: the caller's session runs with XACT_ABORT ON (as drivers often set it); this test's
    -- own transaction (tSQLt's) is the caller's transaction.
    SET XACT_ABORT ON;
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000001'),
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000002');
    DECLARE @error int;
    DECLARE @message nvarchar(2048);

    -- Act: the check throws before the procedure's XACT_ABORT ON, with the session's set OFF.
    BEGIN TRY
        EXEC [queue].[thumbnails_complete_batch] @acks = @acks, @worker = N'w';
    END TRY
    BEGIN CATCH
        SET @error = ERROR_NUMBER();
        SET @message = ERROR_MESSAGE();
    END CATCH;

    -- Assert
    DECLARE @state smallint = XACT_STATE();
    EXEC tSQLt.AssertEquals @Expected = 51001, @Actual = @error;
    EXEC tSQLt.AssertLike @ExpectedPattern = N'%complete_batch: acks holds id % more than once.', @Actual = @message;
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @state;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test fail_batch refuses more than 1000 items with 51001]
AS
BEGIN
    -- Assemble: past ~5,000 row locks a batch would escalate to a table lock READPAST cannot skip.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id)
    SELECT TOP (1001) NEWID() AS id
    FROM sys.all_columns;
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51001,
        @ExpectedMessagePattern = N'%fail_batch: at most 1000 items%';

    -- Act
    EXEC [queue].[thumbnails_fail_batch] @acks = @acks, @worker = N'w';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test fail_batch refuses a repeated id, the transaction usable]
AS
BEGIN
    -- Assemble: the caller's session runs with XACT_ABORT ON (as drivers often set it); this test's
    -- own transaction (tSQLt's) is the caller's transaction.
    SET XACT_ABORT ON;
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000001'),
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000002');
    DECLARE @error int;
    DECLARE @message nvarchar(2048);

    -- Act: the check throws before the procedure's XACT_ABORT ON, with the session's set OFF.
    BEGIN TRY
        EXEC [queue].[thumbnails_fail_batch] @acks = @acks, @worker = N'w';
    END TRY
    BEGIN CATCH
        SET @error = ERROR_NUMBER();
        SET @message = ERROR_MESSAGE();
    END CATCH;

    -- Assert
    DECLARE @state smallint = XACT_STATE();
    EXEC tSQLt.AssertEquals @Expected = 51001, @Actual = @error;
    EXEC tSQLt.AssertLike @ExpectedPattern = N'%fail_batch: acks holds id % more than once.', @Actual = @message;
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @state;
END;
GO

-- lease_status ------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test lease_status tells held, expired, lost, dead and gone apart]
AS
BEGIN
    -- Assemble: 1 held by its token; 2 under another token (leased again); 3 expired under its
    -- token; 4 not leased (released, or failed for a retry); 5 in the dead-letter table; 6 nowhere.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    EXEC [test_queue_thumbnails].[index the faked dead-letter table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 2,
        N'v', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000009', N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000003', N'{"n": 3}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000004', 4, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -5, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        NULL, NULL,
        NULL, N'{"n": 4}'
    );
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000005', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 5}'
    );
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000006', '7e57ab1e-0000-0000-0000-000000000006'),
    ('00000000-0000-0000-0000-000000000005', '7e57ab1e-0000-0000-0000-000000000005'),
    ('00000000-0000-0000-0000-000000000004', '7e57ab1e-0000-0000-0000-000000000004'),
    ('00000000-0000-0000-0000-000000000003', '7e57ab1e-0000-0000-0000-000000000003'),
    ('00000000-0000-0000-0000-000000000002', '7e57ab1e-0000-0000-0000-000000000002'),
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000001');
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        status varchar(7) NOT NULL
    );

    -- Act
    INSERT INTO #Actual (id, status)
    EXEC [queue].[thumbnails_lease_status] @acks = @acks;

    -- Assert: one row per item, in id order; nothing changed.
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, status varchar(7) NOT NULL);
    INSERT INTO #Expected (position, id, status)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 'held'),
    (2, '00000000-0000-0000-0000-000000000002', 'lost'),
    (3, '00000000-0000-0000-0000-000000000003', 'expired'),
    (4, '00000000-0000-0000-0000-000000000004', 'lost'),
    (5, '00000000-0000-0000-0000-000000000005', 'dead'),
    (6, '00000000-0000-0000-0000-000000000006', 'gone');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, N'w', 0),
    ('00000000-0000-0000-0000-000000000002', 2, N'v', 0),
    ('00000000-0000-0000-0000-000000000003', 1, N'w', 1),
    ('00000000-0000-0000-0000-000000000004', 1, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test lease_status refuses a NULL token, the transaction usable]
AS
BEGIN
    -- Assemble: as the batch acknowledgements' check, inside the caller's (tSQLt's) transaction.
    SET XACT_ABORT ON;
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000001'),
    ('00000000-0000-0000-0000-000000000002', NULL);
    DECLARE @error int;
    DECLARE @message nvarchar(2048);

    -- Act
    BEGIN TRY
        EXEC [queue].[thumbnails_lease_status] @acks = @acks;
    END TRY
    BEGIN CATCH
        SET @error = ERROR_NUMBER();
        SET @message = ERROR_MESSAGE();
    END CATCH;

    -- Assert
    DECLARE @state smallint = XACT_STATE();
    EXEC tSQLt.AssertEquals @Expected = 51001, @Actual = @error;
    EXEC tSQLt.AssertLike @ExpectedPattern = N'%lease_status: the lease token of id % is NULL.', @Actual = @message;
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @state;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test lease_status refuses 1001 items and a repeated id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @many [queue].[thumbnails_acks];
    INSERT INTO @many (id, lease_token)
    SELECT TOP (1001)
        NEWID() AS id,
        NEWID() AS lease_token
    FROM sys.all_columns;
    DECLARE @twice [queue].[thumbnails_acks];
    INSERT INTO @twice (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000001'),
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000002');
    DECLARE @many_error int;
    DECLARE @twice_error int;

    -- Act
    BEGIN TRY
        EXEC [queue].[thumbnails_lease_status] @acks = @many;
    END TRY
    BEGIN CATCH
        SET @many_error = ERROR_NUMBER();
    END CATCH;
    BEGIN TRY
        EXEC [queue].[thumbnails_lease_status] @acks = @twice;
    END TRY
    BEGIN CATCH
        SET @twice_error = ERROR_NUMBER();
    END CATCH;

    -- Assert
    EXEC tSQLt.AssertEquals @Expected = 51001, @Actual = @many_error;
    EXEC tSQLt.AssertEquals @Expected = 51001, @Actual = @twice_error;
END;
GO

-- fail_batch --------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test fail_batch retries, buries and reports a stale item as lost]
AS
BEGIN
    -- Assemble: w holds 1 (attempts left), 2 (its token in the batch is stale) and 3 (on its last
    -- attempt).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000002', N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 4,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000003', N'{"n": 3}'
    );
    DECLARE @acks [queue].[thumbnails_acks];
    INSERT INTO @acks (id, lease_token)
    VALUES
    ('00000000-0000-0000-0000-000000000002', '7e57ab1e-0000-0000-0000-000000000008'),
    ('00000000-0000-0000-0000-000000000003', '7e57ab1e-0000-0000-0000-000000000003'),
    ('00000000-0000-0000-0000-000000000001', '7e57ab1e-0000-0000-0000-000000000001');
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        outcome varchar(8) NOT NULL
    );

    -- Act
    INSERT INTO #Actual (id, outcome)
    EXEC [queue].[thumbnails_fail_batch]
        @acks = @acks,
        @worker = N'w',
        @error = N'timeout',
        @retry_after_seconds = 300;

    -- Assert: one row per item, in id order.
    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL, outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (position, id, outcome)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001', 'retrying'),
    (2, '00000000-0000-0000-0000-000000000002', 'lost'),
    (3, '00000000-0000-0000-0000-000000000003', 'dead');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, NULL, 0),
    ('00000000-0000-0000-0000-000000000002', 1, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    DECLARE @retry_kept int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE
            m.id = '00000000-0000-0000-0000-000000000001' AND m.last_error = N'timeout' AND m.lease_token IS NULL
            AND m.visible_at > DATEADD(SECOND, 290, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @retry_kept, @Message = N'error, token or retry time not kept';
    DECLARE @stale_untouched int = (
        SELECT COUNT(*)
        FROM [queue].[thumbnails] AS m
        WHERE
            m.id = '00000000-0000-0000-0000-000000000002' AND m.last_error IS NULL
            AND m.lease_token = '7e57ab1e-0000-0000-0000-000000000002'
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @stale_untouched, @Message = N'the stale item changed its message';
    SELECT
        d.id,
        d.attempts,
        d.last_error,
        d.last_worker
    INTO #Dead
    FROM [queue].[thumbnails_dead] AS d;

    CREATE TABLE #ExpectedDead (
        id uniqueidentifier NULL,
        attempts int NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL
    );
    INSERT INTO #ExpectedDead (id, attempts, last_error, last_worker)
    VALUES
    ('00000000-0000-0000-0000-000000000003', 4, N'timeout', N'w');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedDead', @Actual = N'#Dead';
END;
GO

-- complete_next -----------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test complete_next completes and leases the next messages]
AS
BEGIN
    -- Assemble: w holds 1 (token 1); 2 and 3 are visible.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -30, @now),
        DATEADD(SECOND, -30, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -20, @now),
        DATEADD(SECOND, -20, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    DECLARE @current uniqueidentifier = '7e57ab1e-0000-0000-0000-000000000001';
    CREATE TABLE #Next (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NULL,
        payload nvarchar(MAX) NULL,
        enqueued_at datetime2(7) NULL,
        due_at datetime2(7) NULL,
        attempts int NULL,
        lease_token uniqueidentifier NULL,
        previous_completed bit NULL
    );

    -- Act
    INSERT INTO #Next (id, payload, enqueued_at, due_at, attempts, lease_token, previous_completed)
    EXEC [queue].[thumbnails_complete_next]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @lease_token = @current,
        @batch_size = 2,
        @lease_seconds = 600;

    -- Assert: 1 is gone; 2 and 3 are w's, in claim order, each row carrying the completion.
    SELECT
        n.position,
        n.id,
        n.attempts,
        n.previous_completed,
        CONVERT(bit, IIF(n.lease_token = m.lease_token, 1, 0)) AS returned_the_stored_token
    INTO #Actual
    FROM #Next AS n
    INNER JOIN [queue].[thumbnails] AS m ON n.id = m.id;

    CREATE TABLE #Expected (
        position int NOT NULL,
        id uniqueidentifier NULL,
        attempts int NULL,
        previous_completed bit NULL,
        returned_the_stored_token bit NULL
    );
    INSERT INTO #Expected (position, id, attempts, previous_completed, returned_the_stored_token)
    VALUES
    (1, '00000000-0000-0000-0000-000000000002', 1, 1, 1),
    (2, '00000000-0000-0000-0000-000000000003', 1, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 1, N'w', 0),
    ('00000000-0000-0000-0000-000000000003', 1, N'w', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete_next with nothing ready returns one row with a NULL id]
AS
BEGIN
    -- Assemble: 2 is not due yet, and w's message 1 is gone (completed already, say).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Actual (
        id uniqueidentifier NULL,
        payload nvarchar(MAX) NULL,
        enqueued_at datetime2(7) NULL,
        due_at datetime2(7) NULL,
        attempts int NULL,
        lease_token uniqueidentifier NULL,
        previous_completed bit NULL
    );

    -- Act
    INSERT INTO #Actual (id, payload, enqueued_at, due_at, attempts, lease_token, previous_completed)
    EXEC [queue].[thumbnails_complete_next] @id = '00000000-0000-0000-0000-000000000001', @worker = N'w';

    -- Assert
    SELECT TOP (0)
        a.id,
        a.payload,
        a.enqueued_at,
        a.due_at,
        a.attempts,
        a.lease_token,
        a.previous_completed
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (id, payload, enqueued_at, due_at, attempts, lease_token, previous_completed)
    VALUES (NULL, NULL, NULL, NULL, NULL, NULL, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 0, NULL, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete_next refuses batch_size 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_complete_next]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = N'w',
        @batch_size = 0;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test complete_next refuses a NULL worker with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_complete_next]
        @id = '00000000-0000-0000-0000-000000000001',
        @worker = NULL;
END;
GO

-- wait --------------------------------------------------------------------------------------------
-- A probe skips a row another session holds (READPAST): tSQLt runs in one session, whose own locks
-- never block it, so that case (and the wake-up by another connection's commit) is the
-- conformance suite's, against a real server.

CREATE PROCEDURE [test_queue_thumbnails].[test wait returns ready at once for a visible message]
AS
BEGIN
    -- Assemble: 1 is leased, 2 delayed, 3 visible since its lease expired.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'v', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -1, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000003', N'{"n": 3}'
    );
    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act: a timeout far longer than a test may take, so only "ready" ends it in time.
    INSERT INTO #Actual (ready)
    EXEC [queue].[thumbnails_wait] @wait_ms = 20000;

    -- Assert: it claimed nothing.
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000001', 1, N'v', 0),
    ('00000000-0000-0000-0000-000000000002', 0, NULL, 0),
    ('00000000-0000-0000-0000-000000000003', 1, N'crashed', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test wait walks down to a lower priority level with a ready message]
AS
BEGIN
    -- Assemble: the top level holds only a live lease and a delayed message; a lower level holds
    -- a visible one. A probe of the top level alone would wait out the timeout and say 0.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 9, 1,
        N'v', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 9, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 1, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ready)
    EXEC [queue].[thumbnails_wait] @wait_ms = 120;

    -- Assert
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test wait returns 0 at the timeout when nothing is ready]
AS
BEGIN
    -- Assemble: a live lease and a delayed message only.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'v', DATEADD(SECOND, -10, @now),
        '7e57ab1e-0000-0000-0000-000000000001', N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ready)
    EXEC [queue].[thumbnails_wait] @wait_ms = 120;

    -- Assert
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test wait in implicit-transaction mode leaves the transaction count]
AS
BEGIN
    -- Assemble: a manual-commit caller (IMPLICIT_TRANSACTIONS ON). tSQLt's own transaction is open,
    -- so this shows that wait leaves the caller's transaction count as it was (no BEGIN, no
    -- COMMIT, no error 266); the first probe opening a caller's implicit transaction at
    -- @@TRANCOUNT = 0 needs a session of its own (the conformance suite).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -5, @now),
        DATEADD(SECOND, -5, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    CREATE TABLE #Actual (ready bit NOT NULL);
    SET IMPLICIT_TRANSACTIONS ON;
    DECLARE @before int = @@TRANCOUNT;

    -- Act
    INSERT INTO #Actual (ready)
    EXEC [queue].[thumbnails_wait] @wait_ms = 100;

    -- Assert
    DECLARE @after int = @@TRANCOUNT;
    SET IMPLICIT_TRANSACTIONS OFF;
    EXEC tSQLt.AssertEquals @Expected = @before, @Actual = @after, @Message = N'wait changed the transaction count';
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test wait refuses wait_ms NULL with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51001,
        @ExpectedMessagePattern = N'%wait_ms must be between 0 and 20000%';

    -- Act
    EXEC [queue].[thumbnails_wait] @wait_ms = NULL;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test wait refuses wait_ms -1 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51001,
        @ExpectedMessagePattern = N'%wait_ms must be between 0 and 20000%';

    -- Act
    EXEC [queue].[thumbnails_wait] @wait_ms = -1;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test wait refuses wait_ms 20001 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51001,
        @ExpectedMessagePattern = N'%wait_ms must be between 0 and 20000%';

    -- Act
    EXEC [queue].[thumbnails_wait] @wait_ms = 20001;
END;
GO

-- stats -------------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test stats counts ready, delayed, in_flight and dead]
AS
BEGIN
    -- Assemble: 1 and 2 ready (2's lease expired), 3 delayed, 4 and 5 in flight, 6 dead.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -120, @now),
        DATEADD(SECOND, -120, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, -5, @now), 0, 1,
        N'crashed', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000004', 4, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 4}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000005', 5, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 5}'
    );
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000006', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 6}'
    );
    CREATE TABLE #Stats (
        ready bigint NOT NULL,
        delayed bigint NOT NULL,
        in_flight bigint NOT NULL,
        dead bigint NOT NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NOT NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[thumbnails_stats];

    -- Assert
    SELECT
        s.ready,
        s.delayed,
        s.in_flight,
        s.dead,
        s.estimated,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 119 AND 180, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.ready,
        a.delayed,
        a.in_flight,
        a.dead,
        a.estimated,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, delayed, in_flight, dead, estimated, age_of_the_oldest)
    VALUES (2, 1, 2, 1, 0, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test stats of expired leases, 10000 of one holder are exact]
AS
BEGIN
    -- Assemble: 10000 leases of 'a' that expired a minute ago.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at, payload
    )
    SELECT TOP (10000)
        NEWID() AS id,
        0 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -3600, @now) AS due_at,
        DATEADD(SECOND, -60, @now) AS visible_at,
        0 AS priority,
        1 AS attempts,
        N'a' AS leased_by,
        DATEADD(SECOND, -1800, @now) AS leased_at,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
    CREATE TABLE #Stats (
        ready bigint NOT NULL,
        delayed bigint NOT NULL,
        in_flight bigint NOT NULL,
        dead bigint NOT NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NOT NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[thumbnails_stats];

    -- Assert: the oldest expiry, exact whatever the count; the count exact up to the limit, and past
    -- it an estimate (the catalog's row count) of at least the limit and one.
    SELECT
        s.estimated,
        CONVERT(bit, IIF(s.ready = 10000, 1, 0)) AS ready_as_expected,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 59 AND 120, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.estimated,
        a.ready_as_expected,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (estimated, ready_as_expected, age_of_the_oldest)
    VALUES (0, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test stats of expired leases, 5000 and 5001 of two are past the limit]
AS
BEGIN
    -- Assemble: 5000 leases of 'a' that expired a minute ago, 5001 of 'b' that expired 60 seconds ago.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at, payload
    )
    SELECT TOP (5000)
        NEWID() AS id,
        0 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -3600, @now) AS due_at,
        DATEADD(SECOND, -60, @now) AS visible_at,
        0 AS priority,
        1 AS attempts,
        N'a' AS leased_by,
        DATEADD(SECOND, -1800, @now) AS leased_at,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at, payload
    )
    SELECT TOP (5001)
        NEWID() AS id,
        100000 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -3600, @now) AS due_at,
        DATEADD(SECOND, -60, @now) AS visible_at,
        0 AS priority,
        1 AS attempts,
        N'b' AS leased_by,
        DATEADD(SECOND, -1800, @now) AS leased_at,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
    CREATE TABLE #Stats (
        ready bigint NOT NULL,
        delayed bigint NOT NULL,
        in_flight bigint NOT NULL,
        dead bigint NOT NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NOT NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[thumbnails_stats];

    -- Assert: the oldest expiry, exact whatever the count; the count exact up to the limit, and past
    -- it an estimate (the catalog's row count) of at least the limit and one.
    SELECT
        s.estimated,
        CONVERT(bit, IIF(s.ready >= 10001, 1, 0)) AS ready_as_expected,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 59 AND 120, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.estimated,
        a.ready_as_expected,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (estimated, ready_as_expected, age_of_the_oldest)
    VALUES (1, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test stats of expired leases, past the limit the oldest is exact]
AS
BEGIN
    -- Assemble: 10001 leases of 'a' that expired a minute ago, 1 of 'b' that expired 600 seconds ago.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at, payload
    )
    SELECT TOP (10001)
        NEWID() AS id,
        0 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -3600, @now) AS due_at,
        DATEADD(SECOND, -60, @now) AS visible_at,
        0 AS priority,
        1 AS attempts,
        N'a' AS leased_by,
        DATEADD(SECOND, -1800, @now) AS leased_at,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at, payload
    )
    SELECT TOP (1)
        NEWID() AS id,
        100000 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -3600, @now) AS due_at,
        DATEADD(SECOND, -600, @now) AS visible_at,
        0 AS priority,
        1 AS attempts,
        N'b' AS leased_by,
        DATEADD(SECOND, -1800, @now) AS leased_at,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
    CREATE TABLE #Stats (
        ready bigint NOT NULL,
        delayed bigint NOT NULL,
        in_flight bigint NOT NULL,
        dead bigint NOT NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NOT NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[thumbnails_stats];

    -- Assert: the oldest expiry, exact whatever the count; the count exact up to the limit, and past
    -- it an estimate (the catalog's row count) of at least the limit and one.
    SELECT
        s.estimated,
        CONVERT(bit, IIF(s.ready >= 10001, 1, 0)) AS ready_as_expected,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 599 AND 660, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.estimated,
        a.ready_as_expected,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (estimated, ready_as_expected, age_of_the_oldest)
    VALUES (1, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test stats counts a lower level past a delayed count over the limit]
AS
BEGIN
    -- Assemble: 10,001 delayed messages at priority 5 and 3 ready ones at priority 1. The delayed
    -- count passes the limit at the top level; the walk still counts the ready ones below (it
    -- stopped there, and reported ready 0 as exact, with no oldest).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, payload
    )
    SELECT TOP (10001)
        NEWID() AS id,
        ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, 3600, @now) AS due_at,
        DATEADD(SECOND, 3600, @now) AS visible_at,
        5 AS priority,
        0 AS attempts,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000020001', 20001, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -120, @now),
        DATEADD(SECOND, -120, @now), 1, 0,
        NULL, NULL,
        NULL, N'{"n": 20001}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000020002', 20002, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 1, 0,
        NULL, NULL,
        NULL, N'{"n": 20002}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000020003', 20003, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 1, 0,
        NULL, NULL,
        NULL, N'{"n": 20003}'
    );
    CREATE TABLE #Stats (
        ready bigint NOT NULL,
        delayed bigint NOT NULL,
        in_flight bigint NOT NULL,
        dead bigint NOT NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NOT NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[thumbnails_stats];

    -- Assert: ready exact, the estimate on delayed, and the oldest is 20001's.
    SELECT
        s.ready,
        s.in_flight,
        s.estimated,
        CONVERT(bit, IIF(s.delayed >= 10001, 1, 0)) AS delayed_past_the_exact_limit,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 119 AND 180, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.ready,
        a.in_flight,
        a.estimated,
        a.delayed_past_the_exact_limit,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, in_flight, estimated, delayed_past_the_exact_limit, age_of_the_oldest)
    VALUES (3, 0, 1, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test stats past 10000 rows estimates from the catalog row count]
AS
BEGIN
    -- Assemble: 10,050 ready messages and 3 delayed ones. Each count stops at 10,001 rows; past that
    -- the table's row count in sys.partitions (which counts this transaction's own rows) less the
    -- exact counts stands in: ready comes out above 10,001 only through that estimate.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, payload
    )
    SELECT TOP (10050)
        NEWID() AS id,
        ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -60, @now) AS due_at,
        DATEADD(SECOND, -60, @now) AS visible_at,
        0 AS priority,
        0 AS attempts,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000020001', 20001, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 20001}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000020002', 20002, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 20002}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000020003', 20003, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 20003}'
    );
    CREATE TABLE #Stats (
        ready bigint NOT NULL,
        delayed bigint NOT NULL,
        in_flight bigint NOT NULL,
        dead bigint NOT NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NOT NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[thumbnails_stats];

    -- Assert
    SELECT
        s.delayed,
        s.in_flight,
        s.dead,
        s.estimated,
        CONVERT(bit, IIF(s.ready > 10001, 1, 0)) AS ready_past_the_exact_limit
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.delayed,
        a.in_flight,
        a.dead,
        a.estimated,
        a.ready_past_the_exact_limit
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (delayed, in_flight, dead, estimated, ready_past_the_exact_limit)
    VALUES (3, 0, 0, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- purge -------------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test purge with older_than removes only older messages]
AS
BEGIN
    -- Assemble: every test message is enqueued an hour ago; 9 is newer.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -600, @now),
        DATEADD(SECOND, 60, @now), 0, 1,
        N'w', DATEADD(SECOND, -10, @now),
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (id, seq, enqueued_at, due_at, visible_at, priority, attempts, payload)
    VALUES ('00000000-0000-0000-0000-000000000009', 9, @now, @now, @now, 0, 0, N'{"n": 9}');
    DECLARE @cutoff datetime2(7) = DATEADD(MINUTE, -1, @now);
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC [queue].[thumbnails_purge] @older_than = @cutoff, @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000009', 0, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test purge without older_than removes every message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC [queue].[thumbnails_purge] @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test purge takes at most max_rows, oldest first]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC [queue].[thumbnails_purge] @max_rows = 2;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000003', 0, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test purge refuses max_rows 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_purge] @max_rows = 0;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test purge without max_rows in a transaction fails with 51001]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's: every chunk's locks would
    -- last until it ends.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_purge];
END;
GO

-- dead-letter handling ----------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test dead_list pages by id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    EXEC [test_queue_thumbnails].[index the faked dead-letter table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 3}'
    );
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 2}'
    );
    DECLARE @after uniqueidentifier = '00000000-0000-0000-0000-000000000001';
    CREATE TABLE #Page (
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        priority int NOT NULL,
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL
    );

    -- Act: the page after message 1, one message long.
    INSERT INTO #Page
    EXEC [queue].[thumbnails_dead_list] @after_id = @after, @page_size = 1;

    -- Assert
    SELECT
        p.id,
        p.attempts,
        p.last_error
    INTO #Actual
    FROM #Page AS p;

    SELECT TOP (0)
        a.id,
        a.attempts,
        a.last_error
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (id, attempts, last_error) VALUES ('00000000-0000-0000-0000-000000000002', 4, N'boom');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dead_list without after_id starts at the lowest id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    EXEC [test_queue_thumbnails].[index the faked dead-letter table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 3}'
    );
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 2}'
    );
    CREATE TABLE #Page (
        position int IDENTITY (1, 1) NOT NULL,
        id uniqueidentifier NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        priority int NOT NULL,
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL
    );

    -- Act: the first page, two messages long, in the order it came.
    INSERT INTO #Page (
        id, payload, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at
    )
    EXEC [queue].[thumbnails_dead_list] @page_size = 2;

    -- Assert
    SELECT
        p.position,
        p.id
    INTO #Actual
    FROM #Page AS p;

    CREATE TABLE #Expected (position int NOT NULL, id uniqueidentifier NOT NULL);
    INSERT INTO #Expected (position, id)
    VALUES
    (1, '00000000-0000-0000-0000-000000000001'),
    (2, '00000000-0000-0000-0000-000000000002');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dead_list refuses page_size 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    EXEC [test_queue_thumbnails].[index the faked dead-letter table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[thumbnails_dead_list] @page_size = 0;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dead_requeue puts the message back with attempts reset]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000007', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'poison', N'w', DATEADD(SECOND, -60, @now), N'{"n": 7}'
    );
    CREATE TABLE #Actual (requeued bit NOT NULL);

    -- Act
    INSERT INTO #Actual (requeued)
    EXEC [queue].[thumbnails_dead_requeue] @id = '00000000-0000-0000-0000-000000000007';

    -- Assert
    CREATE TABLE #Expected (requeued bit NOT NULL);
    INSERT INTO #Expected (requeued) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000007', 0, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dead_requeue of an unknown id fails with 51004]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51004;

    -- Act
    EXEC [queue].[thumbnails_dead_requeue] @id = '00000000-0000-0000-0000-000000000007';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dead_requeue of an id queued again fails with 51001]
AS
BEGIN
    -- Assemble: message 7 is dead and its id is in the queue again (a producer enqueued the same
    -- client id since). The requeue must refuse it, not collide (2627).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    SET IDENTITY_INSERT [queue].[thumbnails] ON;
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000007', 7, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 7}'
    );
    SET IDENTITY_INSERT [queue].[thumbnails] OFF;
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000007', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 7}'
    );
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51001,
        @ExpectedMessagePattern = N'%is queued already%';

    -- Act
    EXEC [queue].[thumbnails_dead_requeue] @id = '00000000-0000-0000-0000-000000000007';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dead_delete removes the dead-letter message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000007', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 7}'
    );
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000008', DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), 0, 4,
        N'boom', N'w', DATEADD(SECOND, -60, @now), N'{"n": 8}'
    );
    CREATE TABLE #Ignored (deleted bit NOT NULL); -- noqa: RF04

    -- Act
    INSERT INTO #Ignored
    EXEC [queue].[thumbnails_dead_delete] @id = '00000000-0000-0000-0000-000000000007';

    -- Assert
    SELECT
        d.id,
        d.attempts,
        d.last_error,
        d.last_worker
    INTO #Dead
    FROM [queue].[thumbnails_dead] AS d;

    CREATE TABLE #ExpectedDead (
        id uniqueidentifier NULL,
        attempts int NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL
    );
    INSERT INTO #ExpectedDead (id, attempts, last_error, last_worker)
    VALUES
    ('00000000-0000-0000-0000-000000000008', 4, N'boom', N'w');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedDead', @Actual = N'#Dead';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test dead_delete of an unknown id fails with 51004]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51004;

    -- Act
    EXEC [queue].[thumbnails_dead_delete] @id = '00000000-0000-0000-0000-000000000007';
END;
GO

-- process -----------------------------------------------------------------------------------------

-- The handler process calls, of the queue's signature; any procedure of that name is set aside
-- first (tSQLt.RemoveObject renames it, and the test's rollback brings it back).
CREATE PROCEDURE [test_queue_thumbnails].[create the handler]
AS
BEGIN
    IF SCHEMA_ID(N'queue') IS NULL EXEC (N'CREATE SCHEMA [queue];');
    EXEC tSQLt.RemoveObject @ObjectName = N'[queue].[make_thumbnail]', @IfExists = 1;
    EXEC (N'CREATE PROCEDURE [queue].[make_thumbnail] @id uniqueidentifier, @payload nvarchar(MAX)
        AS SET NOCOUNT ON;');
END;
GO

-- A handler of the handler's name whose payload parameter is not the queue's payload type (a
-- varbinary(4000) would also cut every longer binary payload short without an error).
CREATE PROCEDURE [test_queue_thumbnails].[create a handler of other parameter types]
AS
BEGIN
    IF SCHEMA_ID(N'queue') IS NULL EXEC (N'CREATE SCHEMA [queue];');
    EXEC tSQLt.RemoveObject @ObjectName = N'[queue].[make_thumbnail]', @IfExists = 1;
    EXEC (N'CREATE PROCEDURE [queue].[make_thumbnail] @id uniqueidentifier, @payload varbinary(4000)
        AS SET NOCOUNT ON;');
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test process refuses an open transaction with 51003]
AS
BEGIN
    -- Assemble: tSQLt runs every test in a transaction, which is exactly the caller's transaction
    -- process must refuse (it commits once per message). Its handler exists: process checks the
    -- handler first.
    EXEC [test_queue_thumbnails].[create the handler];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51003;

    -- Act
    EXEC [queue].[thumbnails_process] @time_budget_seconds = 1;
END;
GO

-- A user in the admin role alone, [test_admin_only_user], and [as test_admin_only_user], which runs
-- process as that user: a procedure WITH EXECUTE AS it (sqlfluff cannot parse a statement EXECUTE AS /
-- REVERT; the user and the procedure go with tSQLt's rollback), process by dynamic SQL, so that the
-- user's own EXECUTE permission is checked, not the ownership chain. @visible is the handler's
-- OBJECT_ID as the user sees it, @error_number what process raised (tSQLt's own transaction hides
-- the loop: process refuses it, 51003, right after the handler check, so 51003 and not 51005,
-- no_handler, shows that the check let the user pass).
CREATE PROCEDURE [test_queue_thumbnails].[create the admin-only user]
AS
BEGIN
    CREATE USER [test_admin_only_user] WITHOUT LOGIN;
    ALTER ROLE [queue_admin] ADD MEMBER [test_admin_only_user];
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[as test_admin_only_user]
    @visible int OUTPUT,
    @error_number int OUTPUT
WITH EXECUTE AS ''test_admin_only_user''
AS
BEGIN
    SET NOCOUNT ON;
    SET @visible = OBJECT_ID(N''[queue].[make_thumbnail]'', N''P'');
    BEGIN TRY
        EXEC (N''EXEC [queue].[thumbnails_process] @time_budget_seconds = 1;'');
    END TRY
    BEGIN CATCH
        SET @error_number = ERROR_NUMBER();
    END CATCH;
END;');
END;
GO

-- The handler double given another owner than process's: process no longer reaches it through the
-- ownership chain, and SQL Server checks the caller's EXECUTE on it at the call.
CREATE PROCEDURE [test_queue_thumbnails].[give the handler another owner]
AS
BEGIN
    EXEC [test_queue_thumbnails].[create the handler];
    CREATE USER [test_handler_owner] WITHOUT LOGIN;
    ALTER AUTHORIZATION ON OBJECT::[queue].[make_thumbnail] TO [test_handler_owner];
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test process finds its handler for a caller in the admin role only]
AS
BEGIN
    -- Assemble: a user in the admin role alone holds no permission on the handler and sees none of
    -- its metadata (OBJECT_ID is NULL for it); process runs the handler through the ownership chain.
    EXEC [test_queue_thumbnails].[create the handler];
    EXEC [test_queue_thumbnails].[create the admin-only user];
    DECLARE @visible int;
    DECLARE @error_number int;

    -- Act
    EXEC [test_queue_thumbnails].[as test_admin_only_user]
        @visible = @visible OUTPUT, @error_number = @error_number OUTPUT;

    -- Assert: 51003, the check passed.
    EXEC tSQLt.AssertEquals @Expected = 51003, @Actual = @error_number;
    EXEC tSQLt.AssertEquals @Expected = NULL, @Actual = @visible, @Message = N'the user sees the handler: no test';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test process refuses an unchained handler without EXECUTE]
AS
BEGIN
    -- Assemble: the handler has another owner, and the admin-only user holds no EXECUTE on it:
    -- every call would fail with 229 (review fix19 SHOULD-1).
    EXEC [test_queue_thumbnails].[give the handler another owner];
    EXEC [test_queue_thumbnails].[create the admin-only user];
    DECLARE @visible int;
    DECLARE @error_number int;

    -- Act
    EXEC [test_queue_thumbnails].[as test_admin_only_user]
        @visible = @visible OUTPUT, @error_number = @error_number OUTPUT;

    -- Assert: 51005, no_handler, before the transaction check (51003: the check let it pass).
    EXEC tSQLt.AssertEquals @Expected = 51005, @Actual = @error_number;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test process accepts an unchained handler with EXECUTE]
AS
BEGIN
    -- Assemble: the same, and the admin-only user granted EXECUTE on the handler: process asks in
    -- the caller's context (HAS_PERMS_BY_NAME of the handler's bracketed name, class OBJECT).
    EXEC [test_queue_thumbnails].[give the handler another owner];
    EXEC [test_queue_thumbnails].[create the admin-only user];
    GRANT EXECUTE ON OBJECT::[queue].[make_thumbnail] TO [test_admin_only_user];
    DECLARE @visible int;
    DECLARE @error_number int;

    -- Act
    EXEC [test_queue_thumbnails].[as test_admin_only_user]
        @visible = @visible OUTPUT, @error_number = @error_number OUTPUT;

    -- Assert: 51003, the handler check passed (51005 if it refused).
    EXEC tSQLt.AssertEquals @Expected = 51003, @Actual = @error_number;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test process refuses a handler of other parameter types with 51005]
AS
BEGIN
    -- Assemble
    EXEC [test_queue_thumbnails].[create a handler of other parameter types];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51005;

    -- Act
    EXEC [queue].[thumbnails_process] @time_budget_seconds = 1;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test process refuses a missing handler with 51005]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.RemoveObject @ObjectName = N'[queue].[make_thumbnail]', @IfExists = 1;
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51005, @ExpectedMessagePattern = N'%does not exist%';

    -- Act
    EXEC [queue].[thumbnails_process] @time_budget_seconds = 1;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test process refuses with 51005 when its handler check could not run]
AS
BEGIN
    -- Assemble: the check replaced by a spy, which leaves its outputs NULL. This proves the branch
    -- after a check that could not run, not the sequence on a server (15517 at the EXECUTE AS entry,
    -- ending that statement only, process going on to this branch): unproven here, and under tSQLt's
    -- TRY a real 15517 would reach the test as 15517, not as 51005.
    EXEC tSQLt.SpyProcedure @ProcedureName = N'[queue].[thumbnails_process_handler]';
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51005, @ExpectedMessagePattern = N'%could not check handler procedure%';

    -- Act
    EXEC [queue].[thumbnails_process] @time_budget_seconds = 1;
END;
GO

--[@tSQLt:NoTransaction]('[test_queue_thumbnails].[undo what a test outside a transaction left]')
CREATE PROCEDURE [test_queue_thumbnails].[test process runs the handler on each message and completes it]
AS
BEGIN
    -- Assemble: a handler that fails unless it is given a queued message's id with its payload,
    -- and counts its calls in the session context (not transactional: process's commits and
    -- rollbacks leave it; a #temp table would be unknown where the double is created).
    EXEC sys.sp_set_session_context @key = N'test process calls', @value = 0;
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    -- The handler's schema may not exist (deploy creates the queue's schema only): created here,
    -- remembered in the session context, dropped by the clean-up once the double is gone.
    IF SCHEMA_ID(N'queue') IS NULL
        BEGIN
            EXEC (N'CREATE SCHEMA [queue];');
            EXEC sys.sp_set_session_context @key = N'tablequeue test created schema', @value = 1;
        END;
    EXEC tSQLt.RemoveObjectIfExists @ObjectName = N'[queue].[make_thumbnail]';
    EXEC (N'CREATE PROCEDURE [queue].[make_thumbnail]
    @id uniqueidentifier,
    @payload nvarchar(MAX)
AS
BEGIN
    /* tablequeue tSQLt handler double */
    SET NOCOUNT ON;
    IF NOT EXISTS (SELECT 1 FROM [queue].[thumbnails] AS m WHERE m.id = @id AND m.payload = @payload) THROW 50000, N''not the queued message'', 1;
    DECLARE @calls int = CONVERT(int, SESSION_CONTEXT(N''test process calls'')) + 1;
    EXEC sys.sp_set_session_context @key = N''test process calls'', @value = @calls;
END;');
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );

    -- Act: its one row (processed, completed, failed) goes to the caller: INSERT ... EXEC would run it
    -- inside the INSERT's transaction, which it refuses.
    EXEC [queue].[thumbnails_process] @time_budget_seconds = 60;

    -- Assert: the handler ran once on each message (a call with another id or payload raises, and
    -- the message would then not be completed); both completed, none failed.
    DECLARE @calls int = CONVERT(int, SESSION_CONTEXT(N'test process calls'));
    EXEC tSQLt.AssertEquals @Expected = 2, @Actual = @calls, @Message = N'handler calls';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails]';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

--[@tSQLt:NoTransaction]('[test_queue_thumbnails].[undo what a test outside a transaction left]')
CREATE PROCEDURE [test_queue_thumbnails].[test process fails with the handler's error until the message is dead]
AS
BEGIN
    -- Assemble: a handler that always raises. process fails the message with no retry delay, so it
    -- takes it again at once, until the 4th attempt buries it.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    -- The handler's schema may not exist (deploy creates the queue's schema only): created here,
    -- remembered in the session context, dropped by the clean-up once the double is gone.
    IF SCHEMA_ID(N'queue') IS NULL
        BEGIN
            EXEC (N'CREATE SCHEMA [queue];');
            EXEC sys.sp_set_session_context @key = N'tablequeue test created schema', @value = 1;
        END;
    EXEC tSQLt.RemoveObjectIfExists @ObjectName = N'[queue].[make_thumbnail]';
    EXEC (N'CREATE PROCEDURE [queue].[make_thumbnail]
    @id uniqueidentifier,
    @payload nvarchar(MAX)
AS
BEGIN
    /* tablequeue tSQLt handler double */
    SET NOCOUNT ON;
    THROW 50000, N''handler says no'', 1;
END;');
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );

    -- Act
    EXEC [queue].[thumbnails_process] @time_budget_seconds = 60;

    -- Assert: dead after 4 attempts, with the handler's error and the process worker.
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails]';
    SELECT
        d.id,
        d.attempts,
        CONVERT(bit, IIF(d.last_error LIKE N'error 50000 in %handler says no%', 1, 0)) AS handler_error,
        CONVERT(bit, IIF(d.last_worker LIKE N'process:%', 1, 0)) AS by_process
    INTO #Actual
    FROM [queue].[thumbnails_dead] AS d;

    CREATE TABLE #Expected (
        id uniqueidentifier NOT NULL,
        attempts int NULL,
        handler_error bit NULL,
        by_process bit NULL
    );
    INSERT INTO #Expected (id, attempts, handler_error, by_process)
    VALUES ('00000000-0000-0000-0000-000000000001', 4, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

--[@tSQLt:NoTransaction]('[test_queue_thumbnails].[undo what a test outside a transaction left]')
CREATE PROCEDURE [test_queue_thumbnails].[test process takes no message after its time budget ends]
AS
BEGIN
    -- Assemble: three ready messages and a handler that takes longer than the whole budget (1
    -- second): whatever the server's speed, the budget has ended when the first message is done.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails]';
    EXEC [test_queue_thumbnails].[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'[queue].[thumbnails_dead]';
    -- The handler's schema may not exist (deploy creates the queue's schema only): created here,
    -- remembered in the session context, dropped by the clean-up once the double is gone.
    IF SCHEMA_ID(N'queue') IS NULL
        BEGIN
            EXEC (N'CREATE SCHEMA [queue];');
            EXEC sys.sp_set_session_context @key = N'tablequeue test created schema', @value = 1;
        END;
    EXEC tSQLt.RemoveObjectIfExists @ObjectName = N'[queue].[make_thumbnail]';
    EXEC (N'CREATE PROCEDURE [queue].[make_thumbnail]
    @id uniqueidentifier,
    @payload nvarchar(MAX)
AS
BEGIN
    /* tablequeue tSQLt handler double */
    SET NOCOUNT ON;
    WAITFOR DELAY ''00:00:01.200'';
END;');
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000001', 1, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 1}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000002', 2, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 2}'
    );
    INSERT INTO [queue].[thumbnails] (
        id, seq, enqueued_at, due_at, visible_at, priority, attempts, leased_by, leased_at,
        lease_token, payload
    )
    VALUES (
        '00000000-0000-0000-0000-000000000003', 3, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -60, @now),
        DATEADD(SECOND, -60, @now), 0, 0,
        NULL, NULL,
        NULL, N'{"n": 3}'
    );

    -- Act
    EXEC [queue].[thumbnails_process] @time_budget_seconds = 1;

    -- Assert: 1 completed; 2 and 3 never claimed (no attempt, no lease).
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM [queue].[thumbnails] AS m;

    CREATE TABLE #ExpectedQueue (
        id uniqueidentifier NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
    ('00000000-0000-0000-0000-000000000002', 0, NULL, 1),
    ('00000000-0000-0000-0000-000000000003', 0, NULL, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[thumbnails_dead]';
END;
GO

-- the deployed objects ----------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test the pinned indexes have the key and filter the claims seek on]
AS
BEGIN
    -- Act: every index a claim, probe, count or key seek names in an INDEX hint, on any of the
    -- queue's tables, as the catalog shows it (an index on another of them than the one its hint
    -- names is a row of that table). The index type is its number (1 clustered, 2 nonclustered),
    -- not type_desc, whose collation is the catalog's (Latin1_General_CI_AS_KS_WS); names have the
    -- database's catalog collation (CATALOG_COLLATION on Azure SQL, fixed on a contained database):
    -- #Expected takes #Actual's columns, so AssertEqualsTable meets no Msg 451 / 468 either way.
    SELECT
        o.name AS table_name,
        i.name AS index_name,
        i.is_unique,
        i.is_primary_key,
        i.is_disabled,
        c.name AS column_name,
        ic.is_descending_key,
        REPLACE(REPLACE(REPLACE(i.filter_definition, N' ', N''), N'(', N''), N')', N'') AS filter_definition,
        CONVERT(tinyint, i.type) AS index_type,
        CONVERT(int, ic.key_ordinal) AS key_ordinal
    INTO #Actual
    FROM sys.indexes AS i
    INNER JOIN sys.objects AS o
        ON i.object_id = o.object_id
    INNER JOIN sys.index_columns AS ic
        ON i.object_id = ic.object_id AND i.index_id = ic.index_id
    INNER JOIN sys.columns AS c
        ON ic.object_id = c.object_id AND ic.column_id = c.column_id
    WHERE
        i.object_id IN (
            OBJECT_ID(N'[queue].[thumbnails]'),
            OBJECT_ID(N'[queue].[thumbnails_dead]')
        )
        AND i.name IN (
            N'ix_thumbnails_ready_priority',
            N'ix_thumbnails_lease',
            N'ux_thumbnails_seq',
            N'pk_thumbnails',
            N'pk_thumbnails_dead'
        )
        AND ic.key_ordinal > 0;

    -- Assert: the table, key, filter and uniqueness that _pinned_indexes.sql declares once for the
    -- tables' DDL, the hints and this test, each index enabled (a claim's WHERE and ORDER BY are
    -- that key: a deep queue otherwise sorts, or Msg 308 / 8622 / 315; a seek under HOLDLOCK on a
    -- key that is not unique locks a range, and a seek by id may find two rows).
    SELECT TOP (0)
        a.table_name,
        a.index_name,
        a.is_unique,
        a.is_primary_key,
        a.is_disabled,
        a.filter_definition,
        a.column_name,
        a.is_descending_key,
        a.index_type,
        a.key_ordinal
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (
        table_name, index_name, index_type, is_unique, is_primary_key, is_disabled, filter_definition,
        column_name, is_descending_key, key_ordinal
    )
    VALUES
    (N'thumbnails', N'ix_thumbnails_ready_priority', 2, 0, 0, 0, N'[leased_by]ISNULL', N'priority', 1, 1),
    (N'thumbnails', N'ix_thumbnails_ready_priority', 2, 0, 0, 0, N'[leased_by]ISNULL', N'visible_at', 0, 2),
    (N'thumbnails', N'ix_thumbnails_ready_priority', 2, 0, 0, 0, N'[leased_by]ISNULL', N'seq', 0, 3),
    (N'thumbnails', N'ix_thumbnails_lease', 2, 0, 0, 0, N'[leased_by]ISNOTNULL', N'leased_by', 0, 1),
    (N'thumbnails', N'ix_thumbnails_lease', 2, 0, 0, 0, N'[leased_by]ISNOTNULL', N'visible_at', 0, 2),
    (N'thumbnails', N'ix_thumbnails_lease', 2, 0, 0, 0, N'[leased_by]ISNOTNULL', N'seq', 0, 3),
    (N'thumbnails', N'ux_thumbnails_seq', 1, 1, 0, 0, NULL, N'seq', 0, 1),
    (N'thumbnails', N'pk_thumbnails', 2, 1, 1, 0, NULL, N'id', 0, 1),
    (N'thumbnails_dead', N'pk_thumbnails_dead', 2, 1, 1, 0, NULL, N'id', 0, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the dead letters are clustered on dead_seq, not on the random id]
AS
BEGIN
    -- Act: the dead-letter table's indexes with their keys. Client ids are random GUIDs: clustered
    -- on them, every dead letter would land on a random page (storage v2, work_dead_v1_to_v2).
    SELECT
        i.name AS index_name,
        i.is_unique,
        i.is_primary_key,
        c.name AS column_name,
        CONVERT(tinyint, i.type) AS index_type,
        CONVERT(int, ic.key_ordinal) AS key_ordinal
    INTO #Actual
    FROM sys.indexes AS i
    INNER JOIN sys.objects AS o
        ON i.object_id = o.object_id
    INNER JOIN sys.index_columns AS ic
        ON i.object_id = ic.object_id AND i.index_id = ic.index_id
    INNER JOIN sys.columns AS c
        ON ic.object_id = c.object_id AND ic.column_id = c.column_id
    WHERE
        i.object_id = OBJECT_ID(N'[queue].[thumbnails_dead]')
        AND ic.key_ordinal > 0;

    -- Assert: clustered (type 1) on the IDENTITY dead_seq, unique; the primary key on id nonclustered
    -- (type 2), which dead_list, dead_requeue and dead_delete seek. #Expected takes #Actual's columns
    -- (the catalog views' collation, see the pinned index test).
    SELECT TOP (0)
        a.index_name,
        a.is_unique,
        a.is_primary_key,
        a.column_name,
        a.index_type,
        a.key_ordinal
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (index_name, index_type, is_unique, is_primary_key, column_name, key_ordinal)
    VALUES
    (N'ux_thumbnails_dead_seq', 1, 1, 0, N'dead_seq', 1),
    (N'pk_thumbnails_dead', 2, 1, 1, N'id', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF
        COALESCE(
            COLUMNPROPERTY(OBJECT_ID(N'[queue].[thumbnails_dead]'), N'dead_seq', 'IsIdentity'), 0
        ) <> 1
        BEGIN
            EXEC tSQLt.Fail N'dead_seq is not an IDENTITY column: inserts would not append';
        END;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test every time default of the queue's tables is SYSUTCDATETIME]
AS
BEGIN
    -- Act: every default on a date or time column of the queue's tables.
    SELECT
        c.name AS column_name,
        OBJECT_NAME(dc.parent_object_id) AS table_name,
        REPLACE(REPLACE(LOWER(OBJECT_DEFINITION(dc.object_id)), N'(', N''), N')', N'') AS default_function
    INTO #Actual
    FROM sys.default_constraints AS dc
    INNER JOIN sys.columns AS c
        ON dc.parent_object_id = c.object_id AND dc.parent_column_id = c.column_id
    INNER JOIN sys.types AS ty
        ON c.user_type_id = ty.user_type_id
    WHERE
        dc.parent_object_id IN (
            OBJECT_ID(N'[queue].[thumbnails]'),
            OBJECT_ID(N'[queue].[thumbnails_dead]')
        )
        AND ty.name IN (N'date', N'time', N'datetime', N'datetime2', N'smalldatetime', N'datetimeoffset');

    -- Assert: times are UTC. A GETDATE() default passes every enqueue test on a server whose
    -- clock is UTC and is off by the offset elsewhere, so the definition itself is checked (as
    -- sys.default_constraints stores it, lower case in parentheses; the parentheses are dropped).
    -- #Expected takes #Actual's columns: the catalog's names have the catalog's collation.
    SELECT TOP (0)
        a.column_name,
        a.table_name,
        a.default_function
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (column_name, table_name, default_function)
    VALUES (N'enqueued_at', N'thumbnails', N'sysutcdatetime');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- roles -------------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_thumbnails].[test the producer role runs its verbs and may touch nothing else]
AS
BEGIN
    -- Assemble: a user in the producer role only, and a procedure that runs as that user. Nothing
    -- is faked: a fake carries none of the real tables' grants. enqueue runs on the real table
    -- through the procedure (ownership chaining: the role has no right on any table), inside the
    -- transaction tSQLt rolls back: the message it adds goes with it.
    CREATE USER [test_thumbnails_producer] WITHOUT LOGIN;
    ALTER ROLE [queue_producer] ADD MEMBER [test_thumbnails_producer];
    CREATE TABLE #Actual (
        securable nvarchar(300) NOT NULL,
        securable_class nvarchar(10) NOT NULL,
        permission_name sysname NOT NULL,
        has_right int NULL
    );
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[as test_thumbnails_producer]
WITH EXECUTE AS ''test_thumbnails_producer''
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @ran TABLE (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);
    INSERT INTO @ran
    EXEC (N''EXEC [queue].[thumbnails_enqueue] @payload = N''''{"n": 1}'''';'');
    IF NOT EXISTS (SELECT 1 FROM @ran) THROW 50000, N''enqueue returned no row'', 1;
END;');
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[rights of test_thumbnails_producer]
WITH EXECUTE AS ''test_thumbnails_producer''
AS
BEGIN
    SET NOCOUNT ON;
    SELECT
        v.securable,
        v.securable_class,
        v.permission_name,
        COALESCE(HAS_PERMS_BY_NAME(v.securable, v.securable_class, v.permission_name), 0) AS has_right
    FROM (
        VALUES
        (N''[queue].[thumbnails_enqueue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_enqueue_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dequeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_fail]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_extend_lease]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_release]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_lease_status]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_fail_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete_next]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_wait]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_stats]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_purge]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_process]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_list]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_requeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_delete]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_process_handler]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_items]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[thumbnails_acks]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''DELETE''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''DELETE'')
    ) AS v (securable, securable_class, permission_name);
END;');

    -- Act: the verb (it raises unless it returned its row), then the user's rights.
    EXEC [test_queue_thumbnails].[as test_thumbnails_producer];
    INSERT INTO #Actual (securable, securable_class, permission_name, has_right)
    EXEC [test_queue_thumbnails].[rights of test_thumbnails_producer];

    -- Assert: every securable exists (HAS_PERMS_BY_NAME gives NULL for a misspelt name, which
    -- would pass as "no right"; checked here, as the test's owner: the user cannot see the tables).
    SELECT a.securable
    INTO #Missing
    FROM #Actual AS a
    WHERE IIF(a.securable_class = N'TYPE', TYPE_ID(a.securable), OBJECT_ID(a.securable)) IS NULL;
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Missing', @Message = N'securables that do not exist';
    SELECT TOP (0)
        a.securable,
        a.securable_class,
        a.permission_name,
        a.has_right
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (securable, securable_class, permission_name, has_right)
    VALUES
    (N'[queue].[thumbnails_enqueue]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_enqueue_batch]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_dequeue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_complete]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_fail]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_extend_lease]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_release]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_lease_status]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_complete_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_fail_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_complete_next]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_wait]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_stats]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_purge]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_process]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dead_list]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dead_requeue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dead_delete]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_process_handler]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_items]', N'TYPE', N'EXECUTE', 1),
    (N'[queue].[thumbnails_acks]', N'TYPE', N'EXECUTE', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'DELETE', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'DELETE', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the producer role may not run dequeue: 229]
AS
BEGIN
    -- Assemble: a user in the producer role only; dequeue belongs to the consumer role, so the
    -- call is refused before it runs.
    CREATE USER [test_thumbnails_producer] WITHOUT LOGIN;
    ALTER ROLE [queue_producer] ADD MEMBER [test_thumbnails_producer];
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[as test_thumbnails_producer]
WITH EXECUTE AS ''test_thumbnails_producer''
AS
BEGIN
    SET NOCOUNT ON;
    EXEC (N''EXEC [queue].[thumbnails_dequeue] @batch_size = 1, @worker = N''''w'''';'');
END;');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 229;

    -- Act
    EXEC [test_queue_thumbnails].[as test_thumbnails_producer];
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the consumer role runs its verbs and may touch nothing else]
AS
BEGIN
    -- Assemble: a user in the consumer role only, and a procedure that runs as that user. Nothing
    -- is faked: a fake carries none of the real tables' grants. wait runs on the real table
    -- through the procedure (ownership chaining: the role has no right on any table), inside the
    -- transaction tSQLt rolls back, and changes nothing.
    CREATE USER [test_thumbnails_consumer] WITHOUT LOGIN;
    ALTER ROLE [queue_consumer] ADD MEMBER [test_thumbnails_consumer];
    CREATE TABLE #Actual (
        securable nvarchar(300) NOT NULL,
        securable_class nvarchar(10) NOT NULL,
        permission_name sysname NOT NULL,
        has_right int NULL
    );
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[as test_thumbnails_consumer]
WITH EXECUTE AS ''test_thumbnails_consumer''
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @ran TABLE (ready bit NOT NULL);
    INSERT INTO @ran
    EXEC (N''EXEC [queue].[thumbnails_wait] @wait_ms = 0;'');
    IF NOT EXISTS (SELECT 1 FROM @ran) THROW 50000, N''wait returned no row'', 1;
END;');
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[rights of test_thumbnails_consumer]
WITH EXECUTE AS ''test_thumbnails_consumer''
AS
BEGIN
    SET NOCOUNT ON;
    SELECT
        v.securable,
        v.securable_class,
        v.permission_name,
        COALESCE(HAS_PERMS_BY_NAME(v.securable, v.securable_class, v.permission_name), 0) AS has_right
    FROM (
        VALUES
        (N''[queue].[thumbnails_enqueue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_enqueue_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dequeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_fail]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_extend_lease]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_release]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_lease_status]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_fail_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete_next]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_wait]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_stats]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_purge]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_process]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_list]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_requeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_delete]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_process_handler]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_items]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[thumbnails_acks]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''DELETE''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''DELETE'')
    ) AS v (securable, securable_class, permission_name);
END;');

    -- Act: the verb (it raises unless it returned its row), then the user's rights.
    EXEC [test_queue_thumbnails].[as test_thumbnails_consumer];
    INSERT INTO #Actual (securable, securable_class, permission_name, has_right)
    EXEC [test_queue_thumbnails].[rights of test_thumbnails_consumer];

    -- Assert: every securable exists (HAS_PERMS_BY_NAME gives NULL for a misspelt name, which
    -- would pass as "no right"; checked here, as the test's owner: the user cannot see the tables).
    SELECT a.securable
    INTO #Missing
    FROM #Actual AS a
    WHERE IIF(a.securable_class = N'TYPE', TYPE_ID(a.securable), OBJECT_ID(a.securable)) IS NULL;
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Missing', @Message = N'securables that do not exist';
    SELECT TOP (0)
        a.securable,
        a.securable_class,
        a.permission_name,
        a.has_right
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (securable, securable_class, permission_name, has_right)
    VALUES
    (N'[queue].[thumbnails_enqueue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_enqueue_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dequeue]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_complete]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_fail]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_extend_lease]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_release]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_lease_status]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_complete_batch]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_fail_batch]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_complete_next]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_wait]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_stats]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_purge]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_process]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dead_list]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dead_requeue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dead_delete]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_process_handler]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_items]', N'TYPE', N'EXECUTE', 0),
    (N'[queue].[thumbnails_acks]', N'TYPE', N'EXECUTE', 1),
    (N'[queue].[thumbnails]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'DELETE', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'DELETE', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the consumer role may not run purge: 229]
AS
BEGIN
    -- Assemble: a user in the consumer role only; purge belongs to the admin role, so the
    -- call is refused before it runs.
    CREATE USER [test_thumbnails_consumer] WITHOUT LOGIN;
    ALTER ROLE [queue_consumer] ADD MEMBER [test_thumbnails_consumer];
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[as test_thumbnails_consumer]
WITH EXECUTE AS ''test_thumbnails_consumer''
AS
BEGIN
    SET NOCOUNT ON;
    EXEC (N''EXEC [queue].[thumbnails_purge] @older_than = ''''1900-01-01'''', @max_rows = 1;'');
END;');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 229;

    -- Act
    EXEC [test_queue_thumbnails].[as test_thumbnails_consumer];
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the admin role runs its verbs and may touch nothing else]
AS
BEGIN
    -- Assemble: a user in the admin role only, and a procedure that runs as that user. Nothing
    -- is faked: a fake carries none of the real tables' grants. purge runs on the real table
    -- through the procedure (ownership chaining: the role has no right on any table), inside the
    -- transaction tSQLt rolls back, and changes nothing.
    CREATE USER [test_thumbnails_admin] WITHOUT LOGIN;
    ALTER ROLE [queue_admin] ADD MEMBER [test_thumbnails_admin];
    CREATE TABLE #Actual (
        securable nvarchar(300) NOT NULL,
        securable_class nvarchar(10) NOT NULL,
        permission_name sysname NOT NULL,
        has_right int NULL
    );
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[as test_thumbnails_admin]
WITH EXECUTE AS ''test_thumbnails_admin''
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @ran TABLE (purged bigint NOT NULL);
    INSERT INTO @ran
    EXEC (N''EXEC [queue].[thumbnails_purge] @older_than = ''''1900-01-01'''', @max_rows = 1;'');
    IF NOT EXISTS (SELECT 1 FROM @ran) THROW 50000, N''purge returned no row'', 1;
END;');
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[rights of test_thumbnails_admin]
WITH EXECUTE AS ''test_thumbnails_admin''
AS
BEGIN
    SET NOCOUNT ON;
    SELECT
        v.securable,
        v.securable_class,
        v.permission_name,
        COALESCE(HAS_PERMS_BY_NAME(v.securable, v.securable_class, v.permission_name), 0) AS has_right
    FROM (
        VALUES
        (N''[queue].[thumbnails_enqueue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_enqueue_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dequeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_fail]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_extend_lease]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_release]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_lease_status]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_fail_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_complete_next]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_wait]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_stats]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_purge]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_process]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_list]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_requeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_dead_delete]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_process_handler]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[thumbnails_items]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[thumbnails_acks]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[thumbnails]'', N''OBJECT'', N''DELETE''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[thumbnails_dead]'', N''OBJECT'', N''DELETE'')
    ) AS v (securable, securable_class, permission_name);
END;');

    -- Act: the verb (it raises unless it returned its row), then the user's rights.
    EXEC [test_queue_thumbnails].[as test_thumbnails_admin];
    INSERT INTO #Actual (securable, securable_class, permission_name, has_right)
    EXEC [test_queue_thumbnails].[rights of test_thumbnails_admin];

    -- Assert: every securable exists (HAS_PERMS_BY_NAME gives NULL for a misspelt name, which
    -- would pass as "no right"; checked here, as the test's owner: the user cannot see the tables).
    SELECT a.securable
    INTO #Missing
    FROM #Actual AS a
    WHERE IIF(a.securable_class = N'TYPE', TYPE_ID(a.securable), OBJECT_ID(a.securable)) IS NULL;
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Missing', @Message = N'securables that do not exist';
    SELECT TOP (0)
        a.securable,
        a.securable_class,
        a.permission_name,
        a.has_right
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (securable, securable_class, permission_name, has_right)
    VALUES
    (N'[queue].[thumbnails_enqueue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_enqueue_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_dequeue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_complete]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_fail]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_extend_lease]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_release]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_lease_status]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_complete_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_fail_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_complete_next]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_wait]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_stats]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_purge]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_process]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_dead_list]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_dead_requeue]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_dead_delete]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[thumbnails_process_handler]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[thumbnails_items]', N'TYPE', N'EXECUTE', 0),
    (N'[queue].[thumbnails_acks]', N'TYPE', N'EXECUTE', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[thumbnails]', N'OBJECT', N'DELETE', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[thumbnails_dead]', N'OBJECT', N'DELETE', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test the admin role may not run enqueue: 229]
AS
BEGIN
    -- Assemble: a user in the admin role only; enqueue belongs to the producer role, so the
    -- call is refused before it runs.
    CREATE USER [test_thumbnails_admin] WITHOUT LOGIN;
    ALTER ROLE [queue_admin] ADD MEMBER [test_thumbnails_admin];
    EXEC (N'CREATE PROCEDURE [test_queue_thumbnails].[as test_thumbnails_admin]
WITH EXECUTE AS ''test_thumbnails_admin''
AS
BEGIN
    SET NOCOUNT ON;
    EXEC (N''EXEC [queue].[thumbnails_enqueue] @payload = N''''{"n": 1}'''';'');
END;');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 229;

    -- Act
    EXEC [test_queue_thumbnails].[as test_thumbnails_admin];
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test work_table_add_dedupe keeps the rows of table]
AS
BEGIN
    SET NOCOUNT ON;

    -- Assemble: two rows, as the table is before the migration.
    INSERT INTO [queue].[thumbnails] (id, due_at, visible_at, payload)
    VALUES
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), N'{"n": 1}'),
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), N'{"n": 2}');

    SELECT
        r.id,
        r.payload
    INTO #Expected
    FROM [queue].[thumbnails] AS r;

    -- Act: the migration's steps, as the deploy runs them.
    IF COL_LENGTH(N'[queue].[thumbnails]', N'dedupe_key') IS NULL
        BEGIN
            ALTER TABLE [queue].[thumbnails]
            ADD dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL; -- noqa: CP02
        END;

    IF INDEXPROPERTY(OBJECT_ID(N'[queue].[thumbnails]'), N'ux_thumbnails_dedupe', 'IndexID') IS NULL
        BEGIN
            IF SERVERPROPERTY('EngineEdition') IN (3, 5, 8)
                BEGIN
                    CREATE UNIQUE NONCLUSTERED INDEX [ux_thumbnails_dedupe]
                        ON [queue].[thumbnails] (dedupe_key)
                        WHERE dedupe_key IS NOT NULL
                        WITH (ONLINE = ON);
                END;
            ELSE
                BEGIN
                    CREATE UNIQUE NONCLUSTERED INDEX [ux_thumbnails_dedupe]
                        ON [queue].[thumbnails] (dedupe_key)
                        WHERE dedupe_key IS NOT NULL;
                END;
        END;

    -- Assert
    SELECT
        r.id,
        r.payload
    INTO #Actual
    FROM [queue].[thumbnails] AS r;

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF COL_LENGTH(N'[queue].[thumbnails]', N'dedupe_key') IS NULL
        BEGIN
            EXEC tSQLt.Fail N'work_table_add_dedupe: column dedupe_key was not added';
        END;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test work_table_drop_priority keeps the rows of table]
AS
BEGIN
    SET NOCOUNT ON;

    -- Assemble: two rows, as the table is before the migration.
    INSERT INTO [queue].[thumbnails] (id, due_at, visible_at, payload)
    VALUES
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), N'{"n": 1}'),
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), N'{"n": 2}');

    SELECT
        r.id,
        r.payload
    INTO #Expected
    FROM [queue].[thumbnails] AS r;

    -- Act: the migration's steps, as the deploy runs them.
    IF
        NOT COALESCE(
            (
                SELECT
                    STRING_AGG(
                        CONCAT(c.name, CASE WHEN ic.is_descending_key = 1 THEN N' DESC' END), N', '
                    ) WITHIN GROUP (ORDER BY ic.key_ordinal)
                FROM sys.indexes AS i
                INNER JOIN sys.index_columns AS ic
                    ON i.object_id = ic.object_id AND i.index_id = ic.index_id
                INNER JOIN sys.columns AS c
                    ON ic.object_id = c.object_id AND ic.column_id = c.column_id
                WHERE
                    i.object_id = OBJECT_ID(N'[queue].[thumbnails]')
                    AND i.name = N'ix_thumbnails_ready'
                    AND i.type = 2 AND i.is_disabled = 0 AND i.has_filter = 1
                    AND REPLACE(TRANSLATE(i.filter_definition, N'[]()', N'    '), N' ', N'') = N'leased_byISNULL'
                    AND ic.key_ordinal > 0
            ),
            N''
        ) = N'visible_at, seq'
        BEGIN
            IF
                INDEXPROPERTY(
                    OBJECT_ID(N'[queue].[thumbnails]'), N'ix_thumbnails_ready', 'IndexID'
                ) IS NULL
                BEGIN
                    IF SERVERPROPERTY('EngineEdition') IN (3, 5, 8)
                        BEGIN
                            CREATE NONCLUSTERED INDEX [ix_thumbnails_ready]
                                ON [queue].[thumbnails] (visible_at, seq)
                                WHERE leased_by IS NULL
                                WITH (ONLINE = ON);
                        END;
                    ELSE
                        BEGIN
                            CREATE NONCLUSTERED INDEX [ix_thumbnails_ready]
                                ON [queue].[thumbnails] (visible_at, seq)
                                WHERE leased_by IS NULL;
                        END;
                END;
            ELSE
                BEGIN
                    DROP INDEX IF EXISTS [ix_thumbnails_ready_new] ON [queue].[thumbnails];
                    IF SERVERPROPERTY('EngineEdition') IN (3, 5, 8)
                        BEGIN
                            CREATE NONCLUSTERED INDEX [ix_thumbnails_ready_new]
                                ON [queue].[thumbnails] (visible_at, seq)
                                WHERE leased_by IS NULL
                                WITH (ONLINE = ON);
                        END;
                    ELSE
                        BEGIN
                            CREATE NONCLUSTERED INDEX [ix_thumbnails_ready_new]
                                ON [queue].[thumbnails] (visible_at, seq)
                                WHERE leased_by IS NULL;
                        END;
                    DROP INDEX [ix_thumbnails_ready] ON [queue].[thumbnails];
                    EXEC sys.sp_rename
                        @objname = N'[queue].[thumbnails].[ix_thumbnails_ready_new]',
                        @newname = N'ix_thumbnails_ready',
                        @objtype = N'INDEX';
                END;
        END;

    DROP INDEX IF EXISTS [ix_thumbnails_ready_priority] ON [queue].[thumbnails];

    IF COL_LENGTH(N'[queue].[thumbnails]', N'priority') IS NOT NULL
        BEGIN
            ALTER TABLE [queue].[thumbnails] DROP CONSTRAINT IF EXISTS [df_thumbnails_priority];

            ALTER TABLE [queue].[thumbnails] DROP COLUMN priority;
        END;

    -- Assert
    SELECT
        r.id,
        r.payload
    INTO #Actual
    FROM [queue].[thumbnails] AS r;

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF COL_LENGTH(N'[queue].[thumbnails]', N'priority') IS NOT NULL
        BEGIN
            EXEC tSQLt.Fail N'work_table_drop_priority: column priority is still there';
        END;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test work_dead_add_dedupe keeps the rows of dead]
AS
BEGIN
    SET NOCOUNT ON;

    -- Assemble: two rows, as the table is before the migration.
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, dead_at, payload
    )
    VALUES
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), 0, 1, SYSUTCDATETIME(), N'{"n": 1}'),
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), 0, 1, SYSUTCDATETIME(), N'{"n": 2}');

    SELECT
        r.id,
        r.payload
    INTO #Expected
    FROM [queue].[thumbnails_dead] AS r;

    -- Act: the migration's steps, as the deploy runs them.
    IF COL_LENGTH(N'[queue].[thumbnails_dead]', N'dedupe_key') IS NULL
        BEGIN
            ALTER TABLE [queue].[thumbnails_dead]
            ADD dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL; -- noqa: CP02
        END;

    -- Assert
    SELECT
        r.id,
        r.payload
    INTO #Actual
    FROM [queue].[thumbnails_dead] AS r;

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF COL_LENGTH(N'[queue].[thumbnails_dead]', N'dedupe_key') IS NULL
        BEGIN
            EXEC tSQLt.Fail N'work_dead_add_dedupe: column dedupe_key was not added';
        END;
END;
GO

CREATE PROCEDURE [test_queue_thumbnails].[test work_dead_drop_priority keeps the rows of dead]
AS
BEGIN
    SET NOCOUNT ON;

    -- Assemble: two rows, as the table is before the migration.
    INSERT INTO [queue].[thumbnails_dead] (
        id, enqueued_at, due_at, priority, attempts, dead_at, payload
    )
    VALUES
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), 0, 1, SYSUTCDATETIME(), N'{"n": 1}'),
    (NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), 0, 1, SYSUTCDATETIME(), N'{"n": 2}');

    SELECT
        r.id,
        r.payload
    INTO #Expected
    FROM [queue].[thumbnails_dead] AS r;

    -- Act: the migration's steps, as the deploy runs them.
    IF COL_LENGTH(N'[queue].[thumbnails_dead]', N'priority') IS NOT NULL
        BEGIN
            IF OBJECT_ID(N'[queue].[df_thumbnails_dead_priority]', N'D') IS NULL
                BEGIN
                    ALTER TABLE [queue].[thumbnails_dead]
                    ADD CONSTRAINT [df_thumbnails_dead_priority] DEFAULT (0) FOR priority;
                END;
        END;

    IF COL_LENGTH(N'[queue].[thumbnails_dead]', N'priority') IS NOT NULL
        BEGIN
            ALTER TABLE [queue].[thumbnails_dead]
            DROP CONSTRAINT IF EXISTS [df_thumbnails_dead_priority];

            ALTER TABLE [queue].[thumbnails_dead] DROP COLUMN priority;
        END;

    -- Assert
    SELECT
        r.id,
        r.payload
    INTO #Actual
    FROM [queue].[thumbnails_dead] AS r;

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF COL_LENGTH(N'[queue].[thumbnails_dead]', N'priority') IS NOT NULL
        BEGIN
            EXEC tSQLt.Fail N'work_dead_drop_priority: column priority is still there';
        END;
END;
GO
