-- tablequeue 0.2.0 | generated: do not edit
-- template: tests_tsql/templates/test_pending.sql | dialect: mssql | kind: pending | queue: queue.reminders
-- noqa: disable=CP02, RF05
-- tSQLt's own names are mixed case (tSQLt.FakeTable, #Expected, #Actual) and a test is named by a
-- sentence in brackets ([test enqueue ...]), as tSQLt documents: sqlfluff's identifier casing (CP02)
-- and special-character (RF05) rules cannot hold for them. Every other rule applies.
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

EXEC tSQLt.NewTestClass 'test_queue_reminders';
GO

CREATE PROCEDURE [test_queue_reminders].[index the faked queue table]
AS
BEGIN
    CREATE CLUSTERED INDEX [pk_reminders]
        ON [queue].[reminders] (due_at, id);
END;
GO

-- enqueue -----------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_reminders].[test enqueue stores the message and returns its new id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}';

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (1, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.payload
    INTO #Stored
    FROM [queue].[reminders] AS m;

    SELECT TOP (0)
        s.id,
        s.payload
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, payload) VALUES (1, N'{"n": 1}');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue stamps enqueued_at with the UTC time]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}';

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    DECLARE @stamped int = (
        SELECT COUNT(*)
        FROM [queue].[reminders] AS m
        WHERE m.enqueued_at BETWEEN @before AND @after
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @stamped, @Message = N'enqueued_at is not SYSUTCDATETIME()';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue refuses a NULL payload with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002;

    -- Act
    EXEC [queue].[reminders_enqueue] @payload = NULL;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue refuses invalid JSON with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002;

    -- Act
    EXEC [queue].[reminders_enqueue] @payload = N'{"unterminated": ';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue refuses a JSON scalar with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002;

    -- Act
    EXEC [queue].[reminders_enqueue] @payload = N'42';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test the table itself refuses invalid JSON]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ApplyConstraint
        @TableName = N'[queue].[reminders]',
        @ConstraintName = N'ck_reminders_payload_json';
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 547;

    -- Act
    INSERT INTO [queue].[reminders] (id, payload) VALUES (1, N'not json');
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue of a queued dedupe_key returns that id, duplicate]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    INSERT INTO [queue].[reminders] (due_at, dedupe_key, payload)
    VALUES (SYSUTCDATETIME(), N'order-42', N'{"n": 1}');
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 2}', @dedupe_key = N'order-42';

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT m.id
    INTO #Remaining
    FROM [queue].[reminders] AS m;

    CREATE TABLE #ExpectedRemaining (id bigint NOT NULL);
    INSERT INTO #ExpectedRemaining (id) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedRemaining', @Actual = N'#Remaining';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue with a new dedupe_key stores it]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    INSERT INTO [queue].[reminders] (due_at, dedupe_key, payload)
    VALUES (SYSUTCDATETIME(), N'order-41', N'{"n": 1}');
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 2}', @dedupe_key = N'order-42';

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (2, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.dedupe_key
    INTO #Stored
    FROM [queue].[reminders] AS m;

    SELECT TOP (0)
        s.id,
        s.dedupe_key
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, dedupe_key) VALUES (1, N'order-41'), (2, N'order-42');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue compares dedupe keys exactly, case included]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    INSERT INTO [queue].[reminders] (due_at, dedupe_key, payload)
    VALUES (SYSUTCDATETIME(), N'order-42', N'{"n": 1}');
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 2}', @dedupe_key = N'ORDER-42';

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (2, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue without a dedupe_key is never a duplicate]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}';
    INSERT INTO #Actual (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}', @dedupe_key = NULL;

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (1, 0), (2, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue refuses a dedupe_key over 200 characters with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @long_key nvarchar(MAX) = REPLICATE(N'k', 201);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}', @dedupe_key = @long_key;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue takes a dedupe_key of exactly 200 characters]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @key nvarchar(MAX) = REPLICATE(N'k', 200);
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}', @dedupe_key = @key;

    -- Assert
    DECLARE @stored nvarchar(MAX) = (SELECT m.dedupe_key FROM [queue].[reminders] AS m);
    EXEC tSQLt.AssertEqualsString @Expected = @key, @Actual = @stored;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue keeps the given due_at]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @due datetime2(7) = DATEADD(HOUR, 3, SYSUTCDATETIME());
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}', @due_at = @due;

    -- Assert
    DECLARE @stored datetime2(7) = (SELECT m.due_at FROM [queue].[reminders] AS m);
    EXEC tSQLt.AssertEquals @Expected = @due, @Actual = @stored;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue without due_at makes the message due now in UTC]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC [queue].[reminders_enqueue] @payload = N'{"n": 1}';

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    DECLARE @due_now int = (
        SELECT COUNT(*)
        FROM [queue].[reminders] AS m
        WHERE m.due_at BETWEEN @before AND @after
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @due_now, @Message = N'due_at is not SYSUTCDATETIME()';
END;
GO

-- enqueue_batch -----------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch gives one row per item, ids in item order]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @items [queue].[reminders_items];
    -- Filled out of order on purpose: the ordinal, not the insertion order, is the item order.
    INSERT INTO @items (ordinal, payload) VALUES (3, N'{"n": 3}'), (1, N'{"n": 1}'), (2, N'{"n": 2}');
    CREATE TABLE #Actual (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC [queue].[reminders_enqueue_batch] @items = @items;

    -- Assert
    CREATE TABLE #Expected (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (ordinal, id, duplicate) VALUES (1, 1, 0), (2, 2, 0), (3, 3, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.payload
    INTO #Stored
    FROM [queue].[reminders] AS m;

    SELECT TOP (0)
        s.id,
        s.payload
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, payload) VALUES (1, N'{"n": 1}'), (2, N'{"n": 2}'), (3, N'{"n": 3}');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch with no items returns no rows]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @items [queue].[reminders_items];
    CREATE TABLE #Actual (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC [queue].[reminders_enqueue_batch] @items = @items;

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[reminders]';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch refuses more than 1000 items with 51001]
AS
BEGIN
    -- Assemble: past ~5,000 row locks a batch would escalate to a table lock READPAST cannot skip.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @items [queue].[reminders_items];
    INSERT INTO @items (ordinal, payload)
    SELECT TOP (1001)
        ROW_NUMBER() OVER (ORDER BY c.object_id, c.column_id) AS ordinal,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS c;
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001, @ExpectedMessagePattern = N'%at most 1000 items%';

    -- Act
    EXEC [queue].[reminders_enqueue_batch] @items = @items;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch refuses a NULL payload item with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @items [queue].[reminders_items];
    INSERT INTO @items (ordinal, payload) VALUES (1, N'{"n": 1}'), (2, NULL);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC [queue].[reminders_enqueue_batch] @items = @items;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch refuses an invalid JSON item with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @items [queue].[reminders_items];
    INSERT INTO @items (ordinal, payload) VALUES (1, N'{"n": 1}'), (2, N'{"unterminated": ');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51002, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC [queue].[reminders_enqueue_batch] @items = @items;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch reports duplicates with the kept id]
AS
BEGIN
    -- Assemble: key a is queued (id 1); the batch repeats a, brings b twice, c once, and two without a key.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    INSERT INTO [queue].[reminders] (due_at, dedupe_key, payload)
    VALUES (SYSUTCDATETIME(), N'a', N'{"n": 9}');
    DECLARE @items [queue].[reminders_items];
    INSERT INTO @items (ordinal, payload, dedupe_key)
    VALUES
    (1, N'{"n": 1}', N'a'),
    (2, N'{"n": 2}', N'b'),
    (3, N'{"n": 3}', N'b'),
    (4, N'{"n": 4}', NULL),
    (5, N'{"n": 5}', N'c'),
    (6, N'{"n": 6}', N'a'),
    (7, N'{"n": 7}', NULL);
    CREATE TABLE #Actual (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC [queue].[reminders_enqueue_batch] @items = @items;

    -- Assert: new rows get ids 2.. in item order; a duplicate carries the id that was kept.
    CREATE TABLE #Expected (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (ordinal, id, duplicate)
    VALUES (1, 1, 1), (2, 2, 0), (3, 2, 1), (4, 3, 0), (5, 4, 0), (6, 1, 1), (7, 5, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.dedupe_key,
        m.payload
    INTO #Stored
    FROM [queue].[reminders] AS m;

    SELECT TOP (0)
        s.id,
        s.dedupe_key,
        s.payload
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, dedupe_key, payload)
    VALUES
    (1, N'a', N'{"n": 9}'),
    (2, N'b', N'{"n": 2}'),
    (3, NULL, N'{"n": 4}'),
    (4, N'c', N'{"n": 5}'),
    (5, NULL, N'{"n": 7}');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch refuses a key over 200 characters with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @items [queue].[reminders_items];
    INSERT INTO @items (ordinal, payload, dedupe_key)
    VALUES (1, N'{"n": 1}', N'a'), (2, N'{"n": 2}', REPLICATE(N'k', 201));
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC [queue].[reminders_enqueue_batch] @items = @items;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test enqueue_batch takes the due_at of each item or now]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]', @Identity = 1, @Defaults = 1;
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @due datetime2(7) = DATEADD(HOUR, 2, SYSUTCDATETIME());
    DECLARE @items [queue].[reminders_items];
    INSERT INTO @items (ordinal, payload, due_at) VALUES (1, N'{"n": 1}', @due), (2, N'{"n": 2}', NULL);
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Ignored (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (ordinal, id, duplicate)
    EXEC [queue].[reminders_enqueue_batch] @items = @items;

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    SELECT
        m.id,
        CASE WHEN m.due_at = @due THEN N'given' WHEN m.due_at BETWEEN @before AND @after THEN N'now' END AS due
    INTO #Actual
    FROM [queue].[reminders] AS m;

    CREATE TABLE #Expected (id bigint NOT NULL, due nvarchar(5) NULL);
    INSERT INTO #Expected (id, due) VALUES (1, N'given'), (2, N'now');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- dequeue -----------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_reminders].[test dequeue hands out batch_size messages, earliest due first]
AS
BEGIN
    -- Assemble: ids, enqueue times and due times disagree, so only the right order passes.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (11, DATEADD(SECOND, -30, @now), DATEADD(SECOND, -10, @now), N'k11', N'{"n": 1}'),
    (12, DATEADD(SECOND, -20, @now), DATEADD(SECOND, -30, @now), N'k12', N'{"n": 2}'),
    (13, DATEADD(SECOND, -10, @now), DATEADD(SECOND, -20, @now), N'k13', N'{"n": 3}');

    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Actual (id, payload, enqueued_at, due_at)
    EXEC [queue].[reminders_dequeue] @batch_size = 2;

    -- Assert
    CREATE TABLE #Expected (
        position int NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );
    INSERT INTO #Expected (position, id, payload, enqueued_at, due_at)
    VALUES
    (1, 12, N'{"n": 2}', DATEADD(SECOND, -20, @now), DATEADD(SECOND, -30, @now)),
    (2, 13, N'{"n": 3}', DATEADD(SECOND, -10, @now), DATEADD(SECOND, -20, @now));

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT m.id
    INTO #Remaining
    FROM [queue].[reminders] AS m;

    CREATE TABLE #ExpectedRemaining (id bigint NOT NULL);
    INSERT INTO #ExpectedRemaining (id) VALUES (11);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedRemaining', @Actual = N'#Remaining';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test dequeue hands out nothing that is not due yet]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (21, DATEADD(SECOND, -5, @now), DATEADD(SECOND, 3600, @now), N'k21', N'{"n": 1}'),
    (22, DATEADD(SECOND, -5, @now), DATEADD(SECOND, -1, @now), N'k22', N'{"n": 2}');

    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Actual (id, payload, enqueued_at, due_at)
    EXEC [queue].[reminders_dequeue] @batch_size = 10;

    -- Assert
    CREATE TABLE #Expected (
        position int NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );
    INSERT INTO #Expected (position, id, payload, enqueued_at, due_at)
    VALUES
    (1, 22, N'{"n": 2}', DATEADD(SECOND, -5, @now), DATEADD(SECOND, -1, @now));

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT m.id
    INTO #Remaining
    FROM [queue].[reminders] AS m;

    CREATE TABLE #ExpectedRemaining (id bigint NOT NULL);
    INSERT INTO #ExpectedRemaining (id) VALUES (21);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedRemaining', @Actual = N'#Remaining';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test dequeue after an earlier one takes a message due before it first]
AS
BEGIN
    -- Assemble: a dequeue has taken message 31; then message 33 arrives, due long before it (an
    -- enqueue with a due time in the past). The claim order starts at its head on every call (the
    -- PostgreSQL twin keeps a claim position and moves it back: docs/queue-kinds.md).
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (31, DATEADD(SECOND, -5, @now), DATEADD(SECOND, -30, @now), N'k31', N'{"n": 1}'),
    (32, DATEADD(SECOND, -5, @now), DATEADD(SECOND, -20, @now), N'k32', N'{"n": 2}');

    CREATE TABLE #Earlier (
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );
    INSERT INTO #Earlier (id, payload, enqueued_at, due_at)
    EXEC [queue].[reminders_dequeue] @batch_size = 1;
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (33, DATEADD(SECOND, -1, @now), DATEADD(SECOND, -3600, @now), N'k33', N'{"n": 3}');

    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Actual (id, payload, enqueued_at, due_at)
    EXEC [queue].[reminders_dequeue] @batch_size = 1;

    -- Assert
    CREATE TABLE #Expected (
        position int NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );
    INSERT INTO #Expected (position, id, payload, enqueued_at, due_at)
    VALUES
    (1, 33, N'{"n": 3}', DATEADD(SECOND, -1, @now), DATEADD(SECOND, -3600, @now));

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT m.id
    INTO #Remaining
    FROM [queue].[reminders] AS m;

    CREATE TABLE #ExpectedRemaining (id bigint NOT NULL);
    INSERT INTO #ExpectedRemaining (id) VALUES (32);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedRemaining', @Actual = N'#Remaining';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test dequeue on an empty queue returns no rows]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Actual (id, payload, enqueued_at, due_at)
    EXEC [queue].[reminders_dequeue] @batch_size = 1;

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test dequeue takes at most 1000 messages at once]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, payload)
    SELECT TOP (1001)
        ROW_NUMBER() OVER (ORDER BY c.object_id, c.column_id) AS id,
        SYSUTCDATETIME() AS enqueued_at,
        SYSUTCDATETIME() AS due_at,
        N'{"n": 1}' AS payload
    FROM sys.all_columns AS c;
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id bigint NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Actual (id, payload, enqueued_at, due_at)
    EXEC [queue].[reminders_dequeue] @batch_size = 1000;

    -- Assert
    DECLARE @handed_out int = (SELECT COUNT(*) FROM #Actual);
    EXEC tSQLt.AssertEquals @Expected = 1000, @Actual = @handed_out;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test dequeue refuses batch_size 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[reminders_dequeue] @batch_size = 0;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test dequeue refuses batch_size 1001 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[reminders_dequeue] @batch_size = 1001;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test dequeue refuses batch_size NULL with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[reminders_dequeue] @batch_size = NULL;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test a refused argument leaves the caller's transaction usable]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's transaction.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @error int;

    -- Act: as a driver's session has it (engines.connect sets it; tSQLt's session has it off, where
    -- the test would pass whatever the procedure did). The argument check throws with XACT_ABORT
    -- off, its own setting, so the transaction is not doomed.
    SET XACT_ABORT ON;
    BEGIN TRY
        EXEC [queue].[reminders_dequeue] @batch_size = 0;
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

-- wait --------------------------------------------------------------------------------------------
-- A probe skips a row another session holds (READPAST): tSQLt runs in one session, whose own locks
-- never block it, so that case (and the wake-up by another connection's commit) is the
-- conformance suite's, against a real server.

CREATE PROCEDURE [test_queue_reminders].[test wait returns ready at once for a due message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (41, DATEADD(SECOND, -5, @now), DATEADD(SECOND, -1, @now), N'k41', N'{"n": 1}');

    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act: a timeout far longer than a test may take, so only "ready" ends it in time.
    INSERT INTO #Actual (ready)
    EXEC [queue].[reminders_wait] @wait_ms = 20000;

    -- Assert: it claimed nothing.
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @left int = (SELECT COUNT(*) FROM [queue].[reminders]);
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @left, @Message = N'wait took the message';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test wait returns 0 at the timeout when nothing is due]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (42, DATEADD(SECOND, -5, @now), DATEADD(SECOND, 3600, @now), N'k42', N'{"n": 2}');

    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ready)
    EXEC [queue].[reminders_wait] @wait_ms = 120;

    -- Assert
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test wait refuses wait_ms over 20000 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 51001,
        @ExpectedMessagePattern = N'%wait_ms must be between 0 and 20000%';

    -- Act
    EXEC [queue].[reminders_wait] @wait_ms = 20001;
END;
GO

-- stats -------------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_reminders].[test stats of an empty queue are zero with no age]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    CREATE TABLE #Actual (
        ready bigint NULL,
        delayed bigint NULL,
        in_flight bigint NULL,
        dead bigint NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NULL
    );

    -- Act
    INSERT INTO #Actual (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[reminders_stats];

    -- Assert
    SELECT TOP (0)
        a.ready,
        a.delayed,
        a.in_flight,
        a.dead,
        a.oldest_ready_age_seconds,
        a.estimated
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    VALUES (0, 0, 0, 0, NULL, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test stats count due and delayed, age the oldest from due_at]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (31, DATEADD(SECOND, -10, @now), DATEADD(SECOND, -90, @now), N'k31', N'{"n": 1}'),
    (32, DATEADD(SECOND, -500, @now), DATEADD(SECOND, -5, @now), N'k32', N'{"n": 2}'),
    (33, DATEADD(SECOND, -900, @now), DATEADD(SECOND, 600, @now), N'k33', N'{"n": 3}');

    CREATE TABLE #Stats (
        ready bigint NULL,
        delayed bigint NULL,
        in_flight bigint NULL,
        dead bigint NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC [queue].[reminders_stats];

    -- Assert: the age is 90 seconds plus however long the test took to get here.
    SELECT
        s.ready,
        s.delayed,
        s.in_flight,
        s.dead,
        s.estimated,
        CASE
            WHEN s.oldest_ready_age_seconds >= 90 AND s.oldest_ready_age_seconds < 150 THEN 1 ELSE 0
        END AS age_is_90_seconds
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.ready,
        a.delayed,
        a.in_flight,
        a.dead,
        a.estimated,
        a.age_is_90_seconds
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, delayed, in_flight, dead, estimated, age_is_90_seconds)
    VALUES (2, 1, 0, 0, 0, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- purge -------------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_reminders].[test purge without older_than removes and counts every message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (11, DATEADD(SECOND, -30, @now), DATEADD(SECOND, -10, @now), N'k11', N'{"n": 1}'),
    (12, DATEADD(SECOND, -20, @now), DATEADD(SECOND, -30, @now), N'k12', N'{"n": 2}'),
    (13, DATEADD(SECOND, -10, @now), DATEADD(SECOND, -20, @now), N'k13', N'{"n": 3}');

    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC [queue].[reminders_purge] @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (3);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'[queue].[reminders]';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test purge removes only messages enqueued before older_than]
AS
BEGIN
    -- Assemble: 30 and 20 seconds old go, 10 seconds old stays; the cut-off is 15 seconds ago.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (11, DATEADD(SECOND, -30, @now), DATEADD(SECOND, -10, @now), N'k11', N'{"n": 1}'),
    (12, DATEADD(SECOND, -20, @now), DATEADD(SECOND, -30, @now), N'k12', N'{"n": 2}'),
    (13, DATEADD(SECOND, -10, @now), DATEADD(SECOND, -20, @now), N'k13', N'{"n": 3}');

    DECLARE @cutoff datetime2(7) = DATEADD(SECOND, -15, @now);
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC [queue].[reminders_purge] @older_than = @cutoff, @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT m.id
    INTO #Remaining
    FROM [queue].[reminders] AS m;

    CREATE TABLE #ExpectedRemaining (id bigint NOT NULL);
    INSERT INTO #ExpectedRemaining (id) VALUES (13);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedRemaining', @Actual = N'#Remaining';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test purge of an empty queue purges nothing]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC [queue].[reminders_purge] @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test purge takes at most max_rows, oldest first]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO [queue].[reminders] (id, enqueued_at, due_at, dedupe_key, payload)
    VALUES
    (11, DATEADD(SECOND, -30, @now), DATEADD(SECOND, -10, @now), N'k11', N'{"n": 1}'),
    (12, DATEADD(SECOND, -20, @now), DATEADD(SECOND, -30, @now), N'k12', N'{"n": 2}'),
    (13, DATEADD(SECOND, -10, @now), DATEADD(SECOND, -20, @now), N'k13', N'{"n": 3}');

    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC [queue].[reminders_purge] @max_rows = 2;

    -- Assert: the first two in the clustered index's order (due_at, id).
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT m.id
    INTO #Remaining
    FROM [queue].[reminders] AS m;

    CREATE TABLE #ExpectedRemaining (id bigint NOT NULL);
    INSERT INTO #ExpectedRemaining (id) VALUES (11);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedRemaining', @Actual = N'#Remaining';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test purge refuses max_rows 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[reminders_purge] @max_rows = 0;
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test purge without max_rows in a transaction fails with 51001]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's: every chunk's locks would
    -- last until it ends.
    EXEC tSQLt.FakeTable @TableName = N'[queue].[reminders]';
    EXEC [test_queue_reminders].[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC [queue].[reminders_purge];
END;
GO

-- the deployed objects ----------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_reminders].[test the pinned indexes have the key and filter the claims seek on]
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
        i.object_id = OBJECT_ID(N'[queue].[reminders]')
        AND i.name IN (
            N'pk_reminders'
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
    (N'reminders', N'pk_reminders', 1, 1, 1, 0, NULL, N'due_at', 0, 1),
    (N'reminders', N'pk_reminders', 1, 1, 1, 0, NULL, N'id', 0, 2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test the dedupe index is unique on BIN2 keys, keyless rows left out]
AS
BEGIN
    -- Act: the dedupe index as the catalog shows it. Its strings have the catalog's collation
    -- (Latin1_General_CI_AS_KS_WS): #Expected takes #Actual's columns (a CREATE TABLE #Expected has
    -- tempdb's, and AssertEqualsTable fails on the mix with Msg 451 / 468).
    SELECT
        i.is_unique,
        i.has_filter,
        c.name AS column_name,
        c.collation_name,
        REPLACE(REPLACE(REPLACE(i.filter_definition, N' ', N''), N'(', N''), N')', N'') AS filter_definition,
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
        i.object_id = OBJECT_ID(N'[queue].[reminders]')
        AND i.name = N'ux_reminders_dedupe'
        AND ic.key_ordinal > 0;

    -- Assert: a unique index filtered on dedupe_key IS NOT NULL, over a column that compares byte
    -- for byte (Latin1_General_100_BIN2, as text compares on PostgreSQL), whatever the database's
    -- collation: 'K' and 'k', or 'k' and 'k ', are different keys.
    SELECT TOP (0)
        a.is_unique,
        a.has_filter,
        a.filter_definition,
        a.column_name,
        a.collation_name,
        a.key_ordinal
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (is_unique, has_filter, filter_definition, column_name, collation_name, key_ordinal)
    VALUES (1, 1, N'[dedupe_key]ISNOTNULL', N'dedupe_key', N'Latin1_General_100_BIN2', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test every time default of the queue's tables is SYSUTCDATETIME]
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
            OBJECT_ID(N'[queue].[reminders]')
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
    VALUES (N'enqueued_at', N'reminders', N'sysutcdatetime');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- roles -------------------------------------------------------------------------------------------

CREATE PROCEDURE [test_queue_reminders].[test the producer role runs its verbs and may touch nothing else]
AS
BEGIN
    -- Assemble: a user in the producer role only, and a procedure that runs as that user. Nothing
    -- is faked: a fake carries none of the real tables' grants. enqueue runs on the real table
    -- through the procedure (ownership chaining: the role has no right on any table), inside the
    -- transaction tSQLt rolls back: the message it adds goes with it.
    CREATE USER [test_reminders_producer] WITHOUT LOGIN;
    ALTER ROLE [queue_producer] ADD MEMBER [test_reminders_producer];
    CREATE TABLE #Actual (
        securable nvarchar(300) NOT NULL,
        securable_class nvarchar(10) NOT NULL,
        permission_name sysname NOT NULL,
        has_right int NULL
    );
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[as test_reminders_producer]
WITH EXECUTE AS ''test_reminders_producer''
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @ran TABLE (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO @ran
    EXEC (N''EXEC [queue].[reminders_enqueue] @payload = N''''{"n": 1}'''';'');
    IF NOT EXISTS (SELECT 1 FROM @ran) THROW 50000, N''enqueue returned no row'', 1;
END;');
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[rights of test_reminders_producer]
WITH EXECUTE AS ''test_reminders_producer''
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
        (N''[queue].[reminders_enqueue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_enqueue_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_dequeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_wait]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_stats]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_purge]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_items]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[reminders]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[reminders]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[reminders]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[reminders]'', N''OBJECT'', N''DELETE'')
    ) AS v (securable, securable_class, permission_name);
END;');

    -- Act: the verb (it raises unless it returned its row), then the user's rights.
    EXEC [test_queue_reminders].[as test_reminders_producer];
    INSERT INTO #Actual (securable, securable_class, permission_name, has_right)
    EXEC [test_queue_reminders].[rights of test_reminders_producer];

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
    (N'[queue].[reminders_enqueue]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[reminders_enqueue_batch]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[reminders_dequeue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_wait]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_stats]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_purge]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_items]', N'TYPE', N'EXECUTE', 1),
    (N'[queue].[reminders]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[reminders]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[reminders]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[reminders]', N'OBJECT', N'DELETE', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test the producer role may not run dequeue: 229]
AS
BEGIN
    -- Assemble: a user in the producer role only; dequeue belongs to the consumer role, so the
    -- call is refused before it runs.
    CREATE USER [test_reminders_producer] WITHOUT LOGIN;
    ALTER ROLE [queue_producer] ADD MEMBER [test_reminders_producer];
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[as test_reminders_producer]
WITH EXECUTE AS ''test_reminders_producer''
AS
BEGIN
    SET NOCOUNT ON;
    EXEC (N''EXEC [queue].[reminders_dequeue] @batch_size = 1;'');
END;');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 229;

    -- Act
    EXEC [test_queue_reminders].[as test_reminders_producer];
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test the consumer role runs its verbs and may touch nothing else]
AS
BEGIN
    -- Assemble: a user in the consumer role only, and a procedure that runs as that user. Nothing
    -- is faked: a fake carries none of the real tables' grants. wait runs on the real table
    -- through the procedure (ownership chaining: the role has no right on any table), inside the
    -- transaction tSQLt rolls back, and changes nothing.
    CREATE USER [test_reminders_consumer] WITHOUT LOGIN;
    ALTER ROLE [queue_consumer] ADD MEMBER [test_reminders_consumer];
    CREATE TABLE #Actual (
        securable nvarchar(300) NOT NULL,
        securable_class nvarchar(10) NOT NULL,
        permission_name sysname NOT NULL,
        has_right int NULL
    );
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[as test_reminders_consumer]
WITH EXECUTE AS ''test_reminders_consumer''
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @ran TABLE (ready bit NOT NULL);
    INSERT INTO @ran
    EXEC (N''EXEC [queue].[reminders_wait] @wait_ms = 0;'');
    IF NOT EXISTS (SELECT 1 FROM @ran) THROW 50000, N''wait returned no row'', 1;
END;');
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[rights of test_reminders_consumer]
WITH EXECUTE AS ''test_reminders_consumer''
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
        (N''[queue].[reminders_enqueue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_enqueue_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_dequeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_wait]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_stats]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_purge]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_items]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[reminders]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[reminders]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[reminders]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[reminders]'', N''OBJECT'', N''DELETE'')
    ) AS v (securable, securable_class, permission_name);
END;');

    -- Act: the verb (it raises unless it returned its row), then the user's rights.
    EXEC [test_queue_reminders].[as test_reminders_consumer];
    INSERT INTO #Actual (securable, securable_class, permission_name, has_right)
    EXEC [test_queue_reminders].[rights of test_reminders_consumer];

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
    (N'[queue].[reminders_enqueue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_enqueue_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_dequeue]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[reminders_wait]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[reminders_stats]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_purge]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_items]', N'TYPE', N'EXECUTE', 0),
    (N'[queue].[reminders]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[reminders]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[reminders]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[reminders]', N'OBJECT', N'DELETE', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test the consumer role may not run purge: 229]
AS
BEGIN
    -- Assemble: a user in the consumer role only; purge belongs to the admin role, so the
    -- call is refused before it runs.
    CREATE USER [test_reminders_consumer] WITHOUT LOGIN;
    ALTER ROLE [queue_consumer] ADD MEMBER [test_reminders_consumer];
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[as test_reminders_consumer]
WITH EXECUTE AS ''test_reminders_consumer''
AS
BEGIN
    SET NOCOUNT ON;
    EXEC (N''EXEC [queue].[reminders_purge] @older_than = ''''1900-01-01'''', @max_rows = 1;'');
END;');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 229;

    -- Act
    EXEC [test_queue_reminders].[as test_reminders_consumer];
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test the admin role runs its verbs and may touch nothing else]
AS
BEGIN
    -- Assemble: a user in the admin role only, and a procedure that runs as that user. Nothing
    -- is faked: a fake carries none of the real tables' grants. purge runs on the real table
    -- through the procedure (ownership chaining: the role has no right on any table), inside the
    -- transaction tSQLt rolls back, and changes nothing.
    CREATE USER [test_reminders_admin] WITHOUT LOGIN;
    ALTER ROLE [queue_admin] ADD MEMBER [test_reminders_admin];
    CREATE TABLE #Actual (
        securable nvarchar(300) NOT NULL,
        securable_class nvarchar(10) NOT NULL,
        permission_name sysname NOT NULL,
        has_right int NULL
    );
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[as test_reminders_admin]
WITH EXECUTE AS ''test_reminders_admin''
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @ran TABLE (purged bigint NOT NULL);
    INSERT INTO @ran
    EXEC (N''EXEC [queue].[reminders_purge] @older_than = ''''1900-01-01'''', @max_rows = 1;'');
    IF NOT EXISTS (SELECT 1 FROM @ran) THROW 50000, N''purge returned no row'', 1;
END;');
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[rights of test_reminders_admin]
WITH EXECUTE AS ''test_reminders_admin''
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
        (N''[queue].[reminders_enqueue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_enqueue_batch]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_dequeue]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_wait]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_stats]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_purge]'', N''OBJECT'', N''EXECUTE''),
        (N''[queue].[reminders_items]'', N''TYPE'', N''EXECUTE''),
        (N''[queue].[reminders]'', N''OBJECT'', N''SELECT''),
        (N''[queue].[reminders]'', N''OBJECT'', N''INSERT''),
        (N''[queue].[reminders]'', N''OBJECT'', N''UPDATE''),
        (N''[queue].[reminders]'', N''OBJECT'', N''DELETE'')
    ) AS v (securable, securable_class, permission_name);
END;');

    -- Act: the verb (it raises unless it returned its row), then the user's rights.
    EXEC [test_queue_reminders].[as test_reminders_admin];
    INSERT INTO #Actual (securable, securable_class, permission_name, has_right)
    EXEC [test_queue_reminders].[rights of test_reminders_admin];

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
    (N'[queue].[reminders_enqueue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_enqueue_batch]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_dequeue]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_wait]', N'OBJECT', N'EXECUTE', 0),
    (N'[queue].[reminders_stats]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[reminders_purge]', N'OBJECT', N'EXECUTE', 1),
    (N'[queue].[reminders_items]', N'TYPE', N'EXECUTE', 0),
    (N'[queue].[reminders]', N'OBJECT', N'SELECT', 0),
    (N'[queue].[reminders]', N'OBJECT', N'INSERT', 0),
    (N'[queue].[reminders]', N'OBJECT', N'UPDATE', 0),
    (N'[queue].[reminders]', N'OBJECT', N'DELETE', 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test the admin role may not run enqueue: 229]
AS
BEGIN
    -- Assemble: a user in the admin role only; enqueue belongs to the producer role, so the
    -- call is refused before it runs.
    CREATE USER [test_reminders_admin] WITHOUT LOGIN;
    ALTER ROLE [queue_admin] ADD MEMBER [test_reminders_admin];
    EXEC (N'CREATE PROCEDURE [test_queue_reminders].[as test_reminders_admin]
WITH EXECUTE AS ''test_reminders_admin''
AS
BEGIN
    SET NOCOUNT ON;
    EXEC (N''EXEC [queue].[reminders_enqueue] @payload = N''''{"n": 1}'''';'');
END;');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 229;

    -- Act
    EXEC [test_queue_reminders].[as test_reminders_admin];
END;
GO

CREATE PROCEDURE [test_queue_reminders].[test destructive_table_drop_dedupe keeps the rows of table]
AS
BEGIN
    SET NOCOUNT ON;

    -- Assemble: two rows, as the table is before the migration.
    INSERT INTO [queue].[reminders] (due_at, payload)
    VALUES
    (SYSUTCDATETIME(), N'{"n": 1}'),
    (SYSUTCDATETIME(), N'{"n": 2}');

    SELECT
        r.id,
        r.payload
    INTO #Expected
    FROM [queue].[reminders] AS r;

    -- Act: the migration's steps, as the deploy runs them.
    DROP INDEX IF EXISTS [ux_reminders_dedupe] ON [queue].[reminders];

    IF COL_LENGTH(N'[queue].[reminders]', N'dedupe_key') IS NOT NULL
        BEGIN
            ALTER TABLE [queue].[reminders] DROP COLUMN dedupe_key;
        END;

    -- Assert
    SELECT
        r.id,
        r.payload
    INTO #Actual
    FROM [queue].[reminders] AS r;

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF COL_LENGTH(N'[queue].[reminders]', N'dedupe_key') IS NOT NULL
        BEGIN
            EXEC tSQLt.Fail N'destructive_table_drop_dedupe: column dedupe_key is still there';
        END;
END;
GO
