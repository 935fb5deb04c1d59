-- tablequeue 0.2.0 | generated: do not edit
-- template: mssql/pending.sql | dialect: mssql | kind: pending | queue: queue.reminders
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

-- tablequeue:unit queue.reminders storage v1 table
-- tablequeue:shape kind=pending payload=json dedupe=on

IF OBJECT_ID(N'[queue].[reminders]', N'U') IS NULL
    BEGIN
        CREATE TABLE [queue].[reminders] (
            id bigint IDENTITY (1, 1) NOT NULL,
            enqueued_at datetime2(7) NOT NULL
            CONSTRAINT [df_reminders_enqueued_at] DEFAULT (SYSUTCDATETIME()),
            due_at datetime2(7) NOT NULL,
            dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL, -- noqa: CP02
            payload nvarchar(MAX) NOT NULL,
            CONSTRAINT [ck_reminders_payload_json] CHECK (ISJSON(payload) = 1),
            -- The clustered key is the claim's ORDER BY, so a claim is a seek to one end of it. A heap
            -- is clustered too: a real heap keeps its emptied pages and every claim scans them.
            CONSTRAINT [pk_reminders] PRIMARY KEY CLUSTERED (due_at, id)
        );

        -- Filtered: messages without a key cost nothing. IGNORE_DUP_KEY is not allowed on a filtered
        -- index, and would hide the existing id anyway: enqueue locks the key and reports it itself.
        CREATE UNIQUE NONCLUSTERED INDEX [ux_reminders_dedupe]
            ON [queue].[reminders] (dedupe_key)
            WHERE dedupe_key IS NOT NULL;
    END;
GO

-- tablequeue:unit queue.reminders_items storage v1 type
-- tablequeue:shape kind=pending payload=json

IF TYPE_ID(N'[queue].[reminders_items]') IS NULL
    BEGIN
        -- dedupe_key is wider than the table's, so that an over-long key reaches the procedure's
        -- check (and its error number) instead of failing in the driver.
        CREATE TYPE [queue].[reminders_items] AS TABLE (
            ordinal int NOT NULL PRIMARY KEY,
            payload nvarchar(MAX) NULL,
            due_at datetime2(7) NULL,
            dedupe_key nvarchar(MAX) COLLATE Latin1_General_100_BIN2 NULL -- noqa: CP02
        );
    END;
GO

-- tablequeue:unit queue.reminders_enqueue code

CREATE OR ALTER PROCEDURE [queue].[reminders_enqueue]
    @payload nvarchar(MAX),
    @due_at datetime2(7) = NULL,
    @dedupe_key nvarchar(MAX) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    -- Whatever the caller's level, the locking below is written for READ COMMITTED (reset on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF @payload IS NULL OR ISJSON(@payload) = 0
        BEGIN
            THROW 51002, N'queue.reminders_enqueue: payload must not be NULL and must be valid JSON.', 1;

        END;
    IF DATALENGTH(@dedupe_key) > 400
        BEGIN
            THROW 51001, N'queue.reminders_enqueue: dedupe_key is over 200 characters.', 1;
        END;
    SET XACT_ABORT ON;

    -- A variable takes the database collation; compared with the column, the column's BIN2 wins.
    DECLARE @key nvarchar(200) = @dedupe_key;
    DECLARE @id bigint;
    DECLARE @duplicate bit = 0;
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens, and the verb neither commits nor ends it (a BEGIN
        -- TRANSACTION there would only nest in it: its COMMIT would commit nothing).
        IF @key IS NOT NULL AND @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        IF @key IS NOT NULL
            BEGIN
                -- UPDLOCK + HOLDLOCK keep the key, or the gap where it would go, locked until the
                -- transaction ends: a racing caller with the same key waits here, then finds this row.
                SELECT @id = m.id
                FROM [queue].[reminders] AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.dedupe_key = @key AND m.dedupe_key IS NOT NULL;
            END;

        IF @id IS NULL
            BEGIN
                INSERT INTO [queue].[reminders] (due_at, dedupe_key, payload)
                VALUES (COALESCE(@due_at, SYSUTCDATETIME()), @key, @payload);
                SET @id = CONVERT(bigint, SCOPE_IDENTITY());
            END;
        ELSE
            BEGIN
                SET @duplicate = 1;
            END;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        @id AS id,
        @duplicate AS duplicate;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[reminders_enqueue] TO [queue_producer];
GO

-- tablequeue:unit queue.reminders_enqueue_batch code

CREATE OR ALTER PROCEDURE [queue].[reminders_enqueue_batch]
    @items [queue].[reminders_items] READONLY
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    -- Whatever the caller's level, the locking below is written for READ COMMITTED (reset on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF (SELECT COUNT_BIG(*) FROM @items) > 1000
        BEGIN
            THROW 51001, N'queue.reminders_enqueue_batch: at most 1000 items per call.', 1;
        END;

    DECLARE @bad_payload int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE i.payload IS NULL OR ISJSON(i.payload) = 0
    );
    IF @bad_payload IS NOT NULL
        BEGIN
            DECLARE @error_message nvarchar(2048) = CONCAT(
                N'queue.reminders_enqueue_batch: item ',
                @bad_payload,
                N' has a NULL or invalid JSON payload.'
            );
            THROW 51002, @error_message, 1;

        END;

    DECLARE @bad_key int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE DATALENGTH(i.dedupe_key) > 400
    );
    IF @bad_key IS NOT NULL
        BEGIN
            DECLARE @key_message nvarchar(2048) = CONCAT(
                N'queue.reminders_enqueue_batch: item ',
                @bad_key,
                N' has a dedupe_key longer than 200 characters.'
            );
            THROW 51001, @key_message, 1;
        END;
    SET XACT_ABORT ON;

    -- The items that become rows, in ordinal order.
    DECLARE @candidates TABLE (ordinal int NOT NULL PRIMARY KEY, position int NOT NULL UNIQUE);
    DECLARE @new_ids TABLE (id bigint NOT NULL PRIMARY KEY);
    DECLARE @keys TABLE (dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY); -- noqa: CP02
    DECLARE @existing TABLE (
        dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, -- noqa: CP02
        id bigint NOT NULL
    );
    DECLARE @started_transaction bit = 0;

    INSERT INTO @keys (dedupe_key)
    SELECT DISTINCT i.dedupe_key
    FROM @items AS i
    WHERE i.dedupe_key IS NOT NULL;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- Lock every key of the batch, present or not (see enqueue), walking the keys in index order:
        -- two batches that share keys then wait for each other instead of deadlocking.
        INSERT INTO @existing (dedupe_key, id)
        SELECT
            m.dedupe_key,
            m.id
        FROM @keys AS k
        INNER JOIN [queue].[reminders] AS m WITH (UPDLOCK, HOLDLOCK)
            ON k.dedupe_key = m.dedupe_key AND m.dedupe_key IS NOT NULL
        OPTION (LOOP JOIN, FORCE ORDER);

        -- Every item without a key, and the first item of each key that is not in the queue yet.
        INSERT INTO @candidates (ordinal, position)
        SELECT
            i.ordinal,
            ROW_NUMBER() OVER (ORDER BY i.ordinal) AS position
        FROM @items AS i
        WHERE
            i.dedupe_key IS NULL
            OR (
                NOT EXISTS (
                    SELECT 1 / 0
                    FROM @existing AS e
                    WHERE e.dedupe_key = i.dedupe_key
                )
                AND NOT EXISTS (
                    SELECT 1 / 0
                    FROM @items AS earlier
                    WHERE earlier.dedupe_key = i.dedupe_key AND earlier.ordinal < i.ordinal
                )
            );

        -- Identity values are assigned in the ORDER BY of an INSERT ... SELECT: the n-th new id
        -- belongs to the n-th candidate, which is how ids are mapped back to ordinals below.
        INSERT INTO [queue].[reminders] (due_at, dedupe_key, payload)
        OUTPUT INSERTED.id INTO @new_ids (id)
        SELECT
            COALESCE(i.due_at, SYSUTCDATETIME()) AS due_at,
            i.dedupe_key,
            i.payload
        FROM @items AS i
        INNER JOIN @candidates AS c ON i.ordinal = c.ordinal
        ORDER BY c.position;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    WITH numbered_ids AS (
        SELECT
            n.id,
            ROW_NUMBER() OVER (ORDER BY n.id) AS position
        FROM @new_ids AS n
    ),

    inserted_items AS (
        SELECT
            i.ordinal,
            i.dedupe_key,
            ni.id
        FROM @items AS i
        INNER JOIN @candidates AS c ON i.ordinal = c.ordinal
        INNER JOIN numbered_ids AS ni ON c.position = ni.position
    )

    -- A later item with the key of an earlier one gets the earlier one's id.
    SELECT
        i.ordinal,
        COALESCE(own.id, e.id, first_in_batch.id) AS id,
        CONVERT(bit, CASE WHEN own.id IS NULL THEN 1 ELSE 0 END) AS duplicate
    FROM @items AS i
    LEFT JOIN inserted_items AS own ON i.ordinal = own.ordinal
    LEFT JOIN @existing AS e ON i.dedupe_key = e.dedupe_key
    LEFT JOIN inserted_items AS first_in_batch ON i.dedupe_key = first_in_batch.dedupe_key
    ORDER BY i.ordinal;
END;
GO

GRANT EXECUTE ON TYPE::[queue].[reminders_items] TO [queue_producer];
GO

GRANT EXECUTE ON OBJECT::[queue].[reminders_enqueue_batch] TO [queue_producer];
GO

-- tablequeue:unit queue.reminders_dequeue code

CREATE OR ALTER PROCEDURE [queue].[reminders_dequeue]
    @batch_size int = 1
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    -- The claim's hints are refused (skipping locked rows) or lock differently under SERIALIZABLE
    -- and SNAPSHOT: READ COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF @batch_size IS NULL OR @batch_size NOT BETWEEN 1 AND 1000
        BEGIN
            DECLARE @error_message nvarchar(2048) = CONCAT(
                N'queue.reminders_dequeue: batch_size must be between 1 and 1000, got ',
                COALESCE(CONVERT(nvarchar(12), @batch_size), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;

        END;
    SET XACT_ABORT ON;

    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY,
        payload nvarchar(MAX) NOT NULL,
        due_at datetime2(7) NOT NULL,
        enqueued_at datetime2(7) NOT NULL
    );

    -- READPAST skips rows other consumers hold; READCOMMITTEDLOCK keeps the hints locking under
    -- READ_COMMITTED_SNAPSHOT; the clustered key is the ORDER BY, so there is no sort.
    WITH next_messages AS (
        SELECT TOP (@batch_size)
            m.id,
            m.payload,
            m.due_at,
            m.enqueued_at
        FROM [queue].[reminders] AS m WITH (INDEX ([pk_reminders]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.due_at <= SYSUTCDATETIME()
        ORDER BY m.due_at, m.id
    )

    DELETE FROM next_messages
    OUTPUT DELETED.id, DELETED.payload, DELETED.due_at, DELETED.enqueued_at
    INTO @claimed (id, payload, due_at, enqueued_at);

    SELECT
        c.id,
        c.payload,
        c.enqueued_at,
        c.due_at
    FROM @claimed AS c
    ORDER BY c.due_at, c.id;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[reminders_dequeue] TO [queue_consumer];
GO

-- tablequeue:unit queue.reminders_wait code

-- Waiting instead of polling: a probe, then a pause of 50 ms, until a message is ready or wait_ms
-- have passed (the answer comes at most one pause after the timeout). It holds no lock and no
-- snapshot between its probes and never opens a transaction of its own: the caller dequeues
-- afterwards, in its own transaction. In IMPLICIT_TRANSACTIONS mode (a manual-commit caller) the
-- first probe opens the caller's implicit transaction, as any statement would; it holds nothing
-- (READ COMMITTED releases each probe's locks) and the caller ends it as usual. Called inside an
-- open transaction, the caller's own locks stay held while it waits: call it outside one.
CREATE OR ALTER PROCEDURE [queue].[reminders_wait]
    @wait_ms int = 20000
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    -- READPAST needs READ COMMITTED (or REPEATABLE READ, which would keep the probe's locks): READ
    -- COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF @wait_ms IS NULL OR @wait_ms NOT BETWEEN 0 AND 20000
        BEGIN
            DECLARE @error_message nvarchar(2048) = CONCAT(
                N'queue.reminders_wait: wait_ms must be between 0 and 20000, got ',
                COALESCE(CONVERT(nvarchar(12), @wait_ms), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;

        END;
    SET XACT_ABORT ON;

    DECLARE @deadline datetime2(7) = DATEADD(MILLISECOND, @wait_ms, SYSUTCDATETIME());
    DECLARE @ready bit = 0;

    WHILE 1 = 1
        BEGIN
            SELECT TOP (1) @ready = 1
            FROM [queue].[reminders] AS m WITH (INDEX ([pk_reminders]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.due_at <= SYSUTCDATETIME();

            IF @ready = 1 OR SYSUTCDATETIME() >= @deadline BREAK;
            WAITFOR DELAY '00:00:00.050';
        END;

    SELECT @ready AS ready;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[reminders_wait] TO [queue_consumer];
GO

-- tablequeue:unit queue.reminders_stats code

-- EXECUTE AS OWNER: the estimate reads sys.partitions, whose rows a caller holding only the admin
-- role could not see. The procedure only reads.
CREATE OR ALTER PROCEDURE [queue].[reminders_stats]
    WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    -- Counting stops at exact_limit rows; past that the row count of the catalog views stands in,
    -- so a deep queue never costs a full scan (NServiceBus.SqlServer #481). READPAST: rows that
    -- consumers hold right now are not counted, and stats never waits for them.
    DECLARE @exact_limit bigint = 10000;
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @estimated bit = 0;
    DECLARE @ready bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.id
            FROM [queue].[reminders] AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.due_at <= @now
        ) AS counted
    );
    DECLARE @delayed bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.id
            FROM [queue].[reminders] AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.due_at > @now
        ) AS counted
    );

    IF @ready > @exact_limit OR @delayed > @exact_limit
        BEGIN
            DECLARE @total_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'[queue].[reminders]') AND p.index_id IN (0, 1)
            );
            SET @estimated = 1;
            IF @ready > @exact_limit
                SET @ready = IIF(@total_estimate - @delayed > @ready, @total_estimate - @delayed, @ready);
            ELSE
                SET @delayed = IIF(@total_estimate - @ready > @delayed, @total_estimate - @ready, @delayed);
        END;

    DECLARE @oldest_ready datetime2(7) = (
        SELECT TOP (1) m.due_at
        FROM [queue].[reminders] AS m WITH (READPAST, READCOMMITTEDLOCK)
        WHERE m.due_at <= @now
        ORDER BY m.due_at, m.id
    );

    -- A destructive dequeue deletes in the consumer's own transaction: nothing is ever "in flight"
    -- outside it, and nothing is dead.
    SELECT
        @ready AS ready,
        @delayed AS delayed,
        CONVERT(bigint, 0) AS in_flight,
        CONVERT(bigint, 0) AS dead,
        CONVERT(float, DATEDIFF_BIG(MICROSECOND, @oldest_ready, @now)) / 1000000.0 AS oldest_ready_age_seconds,
        @estimated AS estimated;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[reminders_stats] TO [queue_admin];
GO

-- tablequeue:unit queue.reminders_purge code

CREATE OR ALTER PROCEDURE [queue].[reminders_purge]
    @older_than datetime2(7) = NULL,
    @max_rows int = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF @max_rows < 1
        BEGIN
            THROW 51001, N'queue.reminders_purge: max_rows must be at least 1.', 1;
        END;
    IF @max_rows IS NULL AND (@@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0)
        BEGIN
            THROW 51001, N'queue.reminders_purge: max_rows is required in a transaction.', 1;
        END;
    SET XACT_ABORT ON;
    -- The purge, not a consumer or a producer, is the victim of any deadlock (restored on return).
    SET DEADLOCK_PRIORITY LOW;

    -- Chunks of at most 1,000 rows stay under the lock-escalation threshold, so consumers keep
    -- working; READPAST skips the rows a consumer holds right now, but deleting a row also locks
    -- its other index entries (the dedupe key's), where the purge can wait on a producer's or a
    -- consumer's lock until that transaction ends. Oldest first, in the clustered index's order.
    -- Without max_rows each chunk commits on its own (inside a transaction max_rows is required:
    -- checked above).
    -- The bound that stops a purge from chasing producers: enqueued before it started
    -- (enqueued_at is the insert time); the table is clustered on (due_at, id), not on id.
    DECLARE @started datetime2(7) = SYSUTCDATETIME();
    DECLARE @after_due datetime2(7) = '0001-01-01';
    DECLARE @after_id bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE (id bigint NOT NULL PRIMARY KEY, due_at datetime2(7) NOT NULL);

    WHILE @chunk > 0
        BEGIN
            SET @chunk = IIF(@max_rows IS NULL OR @max_rows - @purged > 1000, 1000, @max_rows - @purged);
            DELETE FROM @deleted;
            IF @older_than IS NULL
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk)
                            m.id,
                            m.due_at
                        FROM [queue].[reminders] AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE
                            m.due_at >= @after_due AND NOT (m.due_at = @after_due AND m.id <= @after_id)
                            AND m.enqueued_at <= @started
                        ORDER BY m.due_at, m.id
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.id, DELETED.due_at INTO @deleted (id, due_at);
                    SET @chunk = @@ROWCOUNT;
                END;
            ELSE
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk)
                            m.id,
                            m.due_at
                        FROM [queue].[reminders] AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE
                            m.due_at >= @after_due AND NOT (m.due_at = @after_due AND m.id <= @after_id)
                            AND m.enqueued_at <= @started AND m.enqueued_at < @older_than
                        ORDER BY m.due_at, m.id
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.id, DELETED.due_at INTO @deleted (id, due_at);
                    SET @chunk = @@ROWCOUNT;
                END;
            SET @purged = @purged + @chunk;
            SELECT TOP (1)
                @after_due = d.due_at,
                @after_id = d.id
            FROM @deleted AS d
            ORDER BY d.due_at DESC, d.id DESC;
        END;

    SELECT @purged AS purged;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[reminders_purge] TO [queue_admin];
GO
