-- tablequeue 0.2.0 | generated: do not edit
-- template: mssql/work.sql | dialect: mssql | kind: work | queue: queue.emails
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

-- tablequeue:unit queue.emails storage v4 table
-- tablequeue:shape kind=work payload=json dedupe=on priority=off client_ids=off

IF OBJECT_ID(N'[queue].[emails]', N'U') IS NULL
    BEGIN
        CREATE TABLE [queue].[emails] (
            id bigint IDENTITY (1, 1) NOT NULL,
            enqueued_at datetime2(7) NOT NULL
            CONSTRAINT [df_emails_enqueued_at] DEFAULT (SYSUTCDATETIME()),
            -- The scheduled start as enqueued (dequeue returns it).
            due_at datetime2(7) NOT NULL,
            -- When the message may next be claimed: due_at, then the lease's expiry while leased,
            -- then the retry time after a fail.
            visible_at datetime2(7) NOT NULL,
            attempts int NOT NULL
            CONSTRAINT [df_emails_attempts] DEFAULT (0),
            leased_by nvarchar(200) NULL,
            leased_at datetime2(7) NULL,
            -- The lease's fencing token, new for every lease: complete, fail, extend_lease and
            -- release given a token act only while it is the message's current one.
            lease_token uniqueidentifier NULL,
            last_error nvarchar(4000) NULL,
            dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL, -- noqa: CP02
            payload nvarchar(MAX) NOT NULL,
            CONSTRAINT [ck_emails_payload_json] CHECK (ISJSON(payload) = 1),
            -- Clustered on the immutable id: a claim, fail or extend updates the row in place (a
            -- claim moves its entry from the claim index to the lease index, an extend moves it
            -- within the lease index), complete is a clustered seek, and deleted rows leave no
            -- emptied heap pages behind.
            CONSTRAINT [pk_emails] PRIMARY KEY CLUSTERED (id)
        );

        -- The claim's exact WHERE and ORDER BY, of the messages nobody leases: filtered, so that a
        -- lease moves a message's entry out of it into the lease index instead of moving its key
        -- within it (docs/queue-kinds.md, What a lease writes).
        CREATE NONCLUSTERED INDEX [ix_emails_ready]
            ON [queue].[emails] (visible_at, id)
            WHERE leased_by IS NULL;

        -- Leased rows only: a worker's own messages (the restart path), the in-flight count and
        -- the look for expired leases (dequeue, at most once a second per session).
        CREATE NONCLUSTERED INDEX [ix_emails_lease]
            ON [queue].[emails] (leased_by, visible_at, id)
            WHERE leased_by IS NOT NULL;

        -- Filtered: messages without a key cost nothing. IGNORE_DUP_KEY is not allowed on a filtered
        -- index, and would hide the existing id anyway: enqueue locks the key and reports it itself.
        CREATE UNIQUE NONCLUSTERED INDEX [ux_emails_dedupe]
            ON [queue].[emails] (dedupe_key)
            WHERE dedupe_key IS NOT NULL;

        -- Appending to an ever-increasing key latches the last page; past ~8 concurrent producers
        -- that is the bottleneck (NServiceBus.SqlServer #624). SQL Server 2019+ and Azure can queue
        -- the waiters fairly; 2017 cannot, hence the guard (a literal: nothing is concatenated).
        IF CONVERT(int, SERVERPROPERTY('ProductMajorVersion')) >= 15 OR SERVERPROPERTY('EngineEdition') IN (5, 8)
            BEGIN
                EXEC (N'ALTER INDEX [pk_emails] ON [queue].[emails] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);'); -- noqa: LT05
            END;
    END;
GO

-- tablequeue:unit queue.emails_items storage v1 type
-- tablequeue:shape kind=work payload=json

-- One shape whatever the options; columns an option does not use must be NULL (enqueue_batch
-- checks). dedupe_key is wider than the table's so that an over-long key reaches the procedure's
-- check (and its error number) instead of failing in the driver.
IF TYPE_ID(N'[queue].[emails_items]') IS NULL
    BEGIN
        CREATE TYPE [queue].[emails_items] AS TABLE (
            ordinal int NOT NULL PRIMARY KEY,
            payload nvarchar(MAX) NULL,
            due_at datetime2(7) NULL,
            dedupe_key nvarchar(MAX) COLLATE Latin1_General_100_BIN2 NULL, -- noqa: CP02
            priority int NULL,
            id uniqueidentifier NULL,
            enqueued_at datetime2(7) NULL
        );
    END;
GO

-- tablequeue:unit queue.emails_acks storage v1 type
-- tablequeue:shape kind=work client_ids=off

-- complete_batch and fail_batch: one message each, by id with its lease token (NULL: the worker's
-- name alone, as 0.1.0 checked). No key on id and no NOT NULL: an id given twice or a NULL id
-- reaches the procedure, which refuses it naming the queue (the type would fail in the driver,
-- naming neither).
IF TYPE_ID(N'[queue].[emails_acks]') IS NULL
    BEGIN
        CREATE TYPE [queue].[emails_acks] AS TABLE (
            id bigint NULL,
            lease_token uniqueidentifier NULL
        );
    END;
GO

-- tablequeue:unit queue.emails_dead storage v2 table
-- tablequeue:shape kind=work payload=json dedupe=on priority=off client_ids=off

IF OBJECT_ID(N'[queue].[emails_dead]', N'U') IS NULL
    BEGIN
        -- Messages that used up max_attempts: a last fail, or a lease that expired once too often.
        -- Few inserts, paged reads by id (dead_list): clustered on id.
        CREATE TABLE [queue].[emails_dead] (
            id bigint NOT NULL,
            enqueued_at datetime2(7) NOT NULL,
            due_at datetime2(7) NOT NULL,
            dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL, -- noqa: CP02
            attempts int NOT NULL,
            last_error nvarchar(4000) NULL,
            last_worker nvarchar(200) NULL,
            dead_at datetime2(7) NOT NULL,
            payload nvarchar(MAX) NOT NULL,
            CONSTRAINT [pk_emails_dead] PRIMARY KEY CLUSTERED (id)
        );
    END;
GO

-- tablequeue:unit queue.emails_history storage v1 table
-- tablequeue:shape kind=work payload=json priority=off client_ids=off

IF OBJECT_ID(N'[queue].[emails_history]', N'U') IS NULL
    BEGIN
        -- Completed messages. Clustered on the finish time: inserts append, and history_purge
        -- deletes a range at the start of the clustered index.
        CREATE TABLE [queue].[emails_history] (
            history_id bigint IDENTITY (1, 1) NOT NULL,
            id bigint NOT NULL,
            enqueued_at datetime2(7) NOT NULL,
            due_at datetime2(7) NOT NULL,
            started_at datetime2(7) NOT NULL,
            finished_at datetime2(7) NOT NULL,
            duration_ms AS DATEDIFF_BIG(MILLISECOND, started_at, finished_at),
            worker nvarchar(200) NOT NULL,
            attempts int NOT NULL,
            payload nvarchar(MAX) NOT NULL,
            CONSTRAINT [pk_emails_history] PRIMARY KEY CLUSTERED (finished_at, history_id)
        );

        CREATE NONCLUSTERED INDEX [ix_emails_history_id]
            ON [queue].[emails_history] (id);
    END;
GO

-- tablequeue:unit queue.emails_enqueue code

CREATE OR ALTER PROCEDURE [queue].[emails_enqueue]
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
    DECLARE @error_message nvarchar(2048);

    IF @payload IS NULL OR ISJSON(@payload) = 0
        BEGIN
            SET @error_message = N'queue.emails_enqueue: payload must not be NULL and must be valid JSON.';
            THROW 51002, @error_message, 1;
        END;
    IF DATALENGTH(@dedupe_key) > 400
        BEGIN
            SET @error_message = N'queue.emails_enqueue: dedupe_key is over 200 characters.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @effective_due_at datetime2(7) = COALESCE(@due_at, @now);
    -- A variable takes the database collation; compared with the column, the column's BIN2 wins.
    DECLARE @key nvarchar(200) = @dedupe_key;
    DECLARE @existing_id bigint;
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens, and the verb neither commits nor ends it (a BEGIN
        -- TRANSACTION there would only nest in it: its COMMIT would commit nothing).
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0 AND (@key IS NOT NULL)
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- UPDLOCK + HOLDLOCK keep the key, or the gap where it would go, locked until the
        -- transaction ends: a racing caller with the same key waits here, then finds this row.
        IF @key IS NOT NULL
            BEGIN
                SELECT @existing_id = m.id
                FROM [queue].[emails] AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.dedupe_key = @key AND m.dedupe_key IS NOT NULL;
            END;

        IF @existing_id IS NULL
            BEGIN
                INSERT INTO [queue].[emails] (
                    enqueued_at, due_at, visible_at, dedupe_key, payload
                )
                VALUES (
                    @now,
                    @effective_due_at,
                    @effective_due_at,
                    @key,
                    @payload
                );
            END;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        COALESCE(@existing_id, CONVERT(bigint, SCOPE_IDENTITY())) AS id,
        CONVERT(bit, IIF(@existing_id IS NULL, 0, 1)) AS duplicate;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_enqueue] TO [queue_producer];
GO

-- tablequeue:unit queue.emails_enqueue_batch code

CREATE OR ALTER PROCEDURE [queue].[emails_enqueue_batch]
    @items [queue].[emails_items] READONLY
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF (SELECT COUNT_BIG(*) FROM @items) > 1000
        BEGIN
            THROW 51001, N'queue.emails_enqueue_batch: at most 1000 items per call.', 1;
        END;

    DECLARE @bad_ordinal int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE i.payload IS NULL OR ISJSON(i.payload) = 0
    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_enqueue_batch: item ',
                @bad_ordinal,
                N' has a NULL or invalid JSON payload.'
            );
            THROW 51002, @error_message, 1;
        END;

    SET @bad_ordinal = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE DATALENGTH(i.dedupe_key) > 400
    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_enqueue_batch: item ',
                @bad_ordinal,
                N' has a dedupe_key over 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;

    IF (SELECT COUNT(i.priority) FROM @items AS i) > 0
        BEGIN
            SET @error_message = N'queue.emails_enqueue_batch: priority needs option priority.';
            THROW 51001, @error_message, 1;
        END;

    IF (SELECT COUNT(i.id) FROM @items AS i) > 0
        BEGIN
            SET @error_message = N'queue.emails_enqueue_batch: id needs option client_ids.';
            THROW 51001, @error_message, 1;
        END;

    IF (SELECT COUNT(i.enqueued_at) FROM @items AS i) > 0
        BEGIN
            SET @error_message = N'queue.emails_enqueue_batch: enqueued_at needs option client_ids.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    -- One row per item: the id it gets, or the queued message it duplicates.
    DECLARE @staged TABLE (
        ordinal int NOT NULL PRIMARY KEY,
        dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL, -- noqa: CP02
        first_ordinal int NULL,
        existing_id bigint NULL,
        assigned_id bigint NULL
    );
    DECLARE @keys TABLE (dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY); -- noqa: CP02
    DECLARE @existing_keys TABLE (
        dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, -- noqa: CP02
        id bigint NOT NULL
    );
    DECLARE @new_ids TABLE (id bigint NOT NULL PRIMARY KEY);
    DECLARE @started_transaction bit = 0;

    INSERT INTO @staged (ordinal, dedupe_key)
    SELECT
        i.ordinal,
        i.dedupe_key
    FROM @items AS i;

    -- A later item with the key of an earlier one duplicates that one.
    UPDATE s
    SET
        s.first_ordinal = (
            SELECT MIN(e.ordinal)
            FROM @staged AS e
            WHERE
                e.ordinal < s.ordinal
                AND (e.dedupe_key = s.dedupe_key)
        )
    FROM @staged AS s;

    -- Point every duplicate at the first item of its chain (a key shared with one item, a client
    -- id with another), so that each one resolves to an id that is inserted or queued already.
    WHILE @@ROWCOUNT > 0
        BEGIN
            UPDATE s
            SET s.first_ordinal = f.first_ordinal
            FROM @staged AS s
            INNER JOIN @staged AS f ON s.first_ordinal = f.ordinal
            WHERE f.first_ordinal IS NOT NULL;
        END;

    INSERT INTO @keys (dedupe_key)
    SELECT DISTINCT s.dedupe_key
    FROM @staged AS s
    WHERE s.dedupe_key IS NOT NULL;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- Lock every key of the batch, present or not (see enqueue), walking the keys in index order:
        -- two batches that share keys then wait for each other instead of deadlocking.
        INSERT INTO @existing_keys (dedupe_key, id)
        SELECT
            m.dedupe_key,
            m.id
        FROM @keys AS k
        INNER JOIN [queue].[emails] AS m WITH (UPDLOCK, HOLDLOCK)
            ON k.dedupe_key = m.dedupe_key AND m.dedupe_key IS NOT NULL
        OPTION (LOOP JOIN, FORCE ORDER);

        UPDATE s
        SET s.existing_id = e.id
        FROM @staged AS s
        INNER JOIN @existing_keys AS e ON s.dedupe_key = e.dedupe_key;

        INSERT INTO [queue].[emails] (
            enqueued_at, due_at, visible_at, dedupe_key, payload
        )
        OUTPUT INSERTED.id INTO @new_ids (id)
        SELECT
            @now AS enqueued_at,
            COALESCE(i.due_at, @now) AS due_at,
            COALESCE(i.due_at, @now) AS visible_at,
            s.dedupe_key,
            i.payload
        FROM @staged AS s
        INNER JOIN @items AS i ON s.ordinal = i.ordinal
        WHERE s.existing_id IS NULL AND s.first_ordinal IS NULL
        ORDER BY s.ordinal;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    -- Identity values are assigned in the ORDER BY of an INSERT ... SELECT: the n-th new id
    -- belongs to the n-th inserted item.
    WITH numbered_items AS (
        SELECT
            s.ordinal,
            ROW_NUMBER() OVER (ORDER BY s.ordinal) AS position
        FROM @staged AS s
        WHERE s.existing_id IS NULL AND s.first_ordinal IS NULL
    ),

    numbered_ids AS (
        SELECT
            n.id,
            ROW_NUMBER() OVER (ORDER BY n.id) AS position
        FROM @new_ids AS n
    )

    UPDATE s
    SET s.assigned_id = nid.id
    FROM @staged AS s
    INNER JOIN numbered_items AS ni ON s.ordinal = ni.ordinal
    INNER JOIN numbered_ids AS nid ON ni.position = nid.position;

    SELECT
        s.ordinal,
        COALESCE(s.assigned_id, s.existing_id, f.assigned_id, f.existing_id) AS id,
        CONVERT(bit, IIF(s.assigned_id IS NULL, 1, 0)) AS duplicate
    FROM @staged AS s
    LEFT JOIN @staged AS f ON s.first_ordinal = f.ordinal
    ORDER BY s.ordinal;
END;
GO

GRANT EXECUTE ON TYPE::[queue].[emails_items] TO [queue_producer];
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_enqueue_batch] TO [queue_producer];
GO

-- tablequeue:unit queue.emails_dequeue code

-- A dequeue by worker W first takes back W's own unfinished messages: by asking, W declares that it
-- holds nothing else. A worker name is therefore one single-threaded consumer at a time.
-- lease_token identifies the lease: complete, fail, extend_lease and release take it back, and a
-- live lease handed out again is the same lease with the same token.
-- @worker is one character wider than leased_by, so that an over-long name reaches the check
-- (invalid_argument) instead of being cut to 200 characters silently.
CREATE OR ALTER PROCEDURE [queue].[emails_dequeue]
    @batch_size int = 1,
    @worker nvarchar(201) = NULL,
    @lease_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    -- The claim's hints are refused (READPAST) or lock differently under SERIALIZABLE and SNAPSHOT:
    -- READ COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @batch_size IS NULL OR @batch_size NOT BETWEEN 1 AND 1000
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_dequeue: batch_size must be between 1 and 1000, got ',
                COALESCE(CONVERT(nvarchar(12), @batch_size), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_dequeue: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @lease_seconds = COALESCE(@lease_seconds, 600);
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 1 AND 604800
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_dequeue: lease_seconds must be between 1 and 604800, got ',
                COALESCE(CONVERT(nvarchar(12), @lease_seconds), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY,
        own bit NOT NULL,
        previous_visible_at datetime2(7) NOT NULL,
        previous_worker nvarchar(200) NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        -- NULL only for a live lease taken before storage v2 that its worker asked for again.
        lease_token uniqueidentifier NULL,
        payload nvarchar(MAX) NOT NULL
    );

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @lease_until datetime2(7) = DATEADD(SECOND, @lease_seconds, @now);
    DECLARE @remaining int = @batch_size;
    DECLARE @claimed_now int = 0;
    DECLARE @exhausted int;
    DECLARE @started_transaction bit = 0;
    DECLARE @next_look sql_variant = SESSION_CONTEXT(N'tablequeue.queue.emails.expired');
    DECLARE @look_due bit = CASE
        WHEN @next_look IS NULL THEN 1
        WHEN CONVERT(sysname, SQL_VARIANT_PROPERTY(@next_look, 'BaseType')) <> N'datetime2' THEN 1
        WHEN CONVERT(datetime2(7), @next_look) <= @now THEN 1
        WHEN CONVERT(datetime2(7), @next_look) > DATEADD(SECOND, 1, @now) THEN 1
        ELSE 0
    END;
    DECLARE @look_after datetime2(7);
    DECLARE @look_recorded bit = 0;
    DECLARE @look_worker nvarchar(200);
    DECLARE @buried_count int = 0;
    -- This session's look for expired leases, when due, is recorded first (record_look).
    IF @look_due = 1
        BEGIN
            SET @look_after = DATEADD(SECOND, 1, @now);
            SET XACT_ABORT OFF;
            BEGIN TRY
                -- Not transactional: a caller that rolls back still waits its second.
                EXEC sys.sp_set_session_context
                    @key = N'tablequeue.queue.emails.expired',
                    @value = @look_after;
                SET XACT_ABORT ON;
                SET @look_recorded = 1;
            END TRY
            BEGIN CATCH
                SET XACT_ABORT ON;
                IF ERROR_NUMBER() NOT IN (15664, 15665) OR XACT_STATE() = -1 THROW;
            END CATCH;
        END;

    BEGIN TRY
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens, and the verb neither commits nor ends it (a BEGIN
        -- TRANSACTION there would only nest in it: its COMMIT would commit nothing).
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- 1. Own messages first. `leased_by IS NOT NULL` repeats the filter of the filtered index,
        -- so that the optimizer can match it whatever @worker is.
        WITH own_messages AS (
            SELECT TOP (@remaining)
                m.id,
                m.enqueued_at,
                m.due_at,
                m.visible_at,
                m.attempts,
                m.leased_by,
                m.leased_at,
                m.lease_token,
                m.payload
            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.leased_by = @worker AND m.leased_by IS NOT NULL
            ORDER BY m.visible_at, m.id
        )

        UPDATE own_messages
        SET
            -- The worker's own messages come back as they are while their lease lives (the same
            -- attempt, the same expiry, the same token: it is the same lease, and asking again neither
            -- spends an attempt nor buys time); one whose lease has expired is leased anew, as anyone's
            -- would be, with a new token. (Every right-hand side reads the row as it was before this
            -- statement; NEWID() is drawn for each row.)
            attempts = attempts + IIF(visible_at <= @now, 1, 0),
            visible_at = IIF(visible_at <= @now, @lease_until, visible_at),
            leased_by = @worker,
            leased_at = IIF(visible_at <= @now, @now, leased_at),
            lease_token = IIF(visible_at <= @now, NEWID(), lease_token)
        OUTPUT
            INSERTED.id,
            1,
            DELETED.visible_at,
            DELETED.leased_by,
            INSERTED.enqueued_at,
            INSERTED.due_at,
            INSERTED.attempts,
            INSERTED.lease_token,
            INSERTED.payload
        INTO @claimed (
            id, own, previous_visible_at, previous_worker,
            enqueued_at, due_at, attempts, lease_token, payload
        );

        SET @exhausted = (
            SELECT COUNT(*)
            FROM @claimed AS c
            WHERE c.attempts > 3 AND c.previous_visible_at <= @now
        );
        IF @exhausted > 0
            BEGIN
                DELETE m
                OUTPUT
                    DELETED.id,
                    DELETED.enqueued_at,
                    DELETED.due_at,
                    DELETED.dedupe_key,
                    c.attempts - 1,
                    N'lease expired',
                    c.previous_worker,
                    @now,
                    DELETED.payload
                INTO
                    [queue].[emails_dead] (
                        id, enqueued_at, due_at, dedupe_key, attempts,
                        last_error, last_worker, dead_at, payload
                    )
                FROM [queue].[emails] AS m
                INNER JOIN @claimed AS c ON m.id = c.id
                WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                SET @buried_count = @@ROWCOUNT;

                DELETE c
                FROM @claimed AS c
                WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
            END;

        SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);

        -- 2. Expired leases, at most once a second per session (look_declarations), one lease holder
        -- at a time; a holder whose expired lease went to the dead-letter table is looked at again.
        IF @look_due = 1
            BEGIN
                IF @remaining > 0
                    BEGIN
                        SET @look_worker = (
                            SELECT TOP (1) m.leased_by
                            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.leased_by IS NOT NULL
                            ORDER BY m.leased_by
                        );
                        WHILE @look_worker IS NOT NULL AND @remaining > 0
                            BEGIN
                                WITH expired_leases AS (
                                    SELECT TOP (@remaining)
                                        m.id,
                                        m.enqueued_at,
                                        m.due_at,
                                        m.visible_at,
                                        m.attempts,
                                        m.leased_by,
                                        m.leased_at,
                                        m.lease_token,
                                        m.payload
                                    FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE
                                        m.leased_by = @look_worker AND m.leased_by IS NOT NULL
                                        AND m.visible_at <= @now
                                    ORDER BY m.visible_at, m.id
                                )

                                UPDATE expired_leases
                                SET
                                    attempts = attempts + 1,
                                    visible_at = @lease_until,
                                    leased_by = @worker,
                                    leased_at = @now,
                                    lease_token = NEWID()
                                OUTPUT
                                    INSERTED.id,
                                    0,
                                    DELETED.visible_at,
                                    DELETED.leased_by,
                                    INSERTED.enqueued_at,
                                    INSERTED.due_at,
                                    INSERTED.attempts,
                                    INSERTED.lease_token,
                                    INSERTED.payload
                                INTO @claimed (
                                    id, own, previous_visible_at, previous_worker,
                                    enqueued_at, due_at, attempts, lease_token, payload
                                );
                                IF @@ROWCOUNT = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                            WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                            ORDER BY m.leased_by
                                        );
                                        CONTINUE;
                                    END;
                                SET @buried_count = 0;
                                SET @exhausted = (
                                    SELECT COUNT(*)
                                    FROM @claimed AS c
                                    WHERE c.attempts > 3 AND c.previous_visible_at <= @now
                                );
                                IF @exhausted > 0
                                    BEGIN
                                        DELETE m
                                        OUTPUT
                                            DELETED.id,
                                            DELETED.enqueued_at,
                                            DELETED.due_at,
                                            DELETED.dedupe_key,
                                            c.attempts - 1,
                                            N'lease expired',
                                            c.previous_worker,
                                            @now,
                                            DELETED.payload
                                        INTO
                                            [queue].[emails_dead] (
                                                id, enqueued_at, due_at, dedupe_key, attempts,
                                                last_error, last_worker, dead_at, payload
                                            )
                                        FROM [queue].[emails] AS m
                                        INNER JOIN @claimed AS c ON m.id = c.id
                                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                                        SET @buried_count = @@ROWCOUNT;

                                        DELETE c
                                        FROM @claimed AS c
                                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                                    END;
                                SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                                IF @buried_count = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                            WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                            ORDER BY m.leased_by
                                        );
                                    END;
                            END;
                    END;
                -- A look that filled the batch may have left more behind, and one the own
                -- messages left no room for has not happened: either stays due. The key is this
                -- call's own write (record_due_look), so that clearing it is never refused.
                IF @remaining = 0 AND @look_recorded = 1
                    BEGIN
                        EXEC sys.sp_set_session_context
                            @key = N'tablequeue.queue.emails.expired',
                            @value = NULL;
                    END;
            END;

        -- 3. Messages nobody leases (new, due, retried, released), on the filtered claim index, whose
        -- filter the claims repeat. A claimed row that goes to the dead-letter table frees its place in
        -- the batch: claim again until the batch is full or nothing visible is left.
        WHILE @remaining > 0
            BEGIN
                WITH next_messages AS (
                    SELECT TOP (@remaining)
                        m.id,
                        m.enqueued_at,
                        m.due_at,
                        m.visible_at,
                        m.attempts,
                        m.leased_by,
                        m.leased_at,
                        m.lease_token,
                        m.payload
                    FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_ready]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.leased_by IS NULL AND m.visible_at <= @now
                    ORDER BY m.visible_at, m.id
                )

                UPDATE next_messages
                SET
                    attempts = attempts + 1,
                    visible_at = @lease_until,
                    leased_by = @worker,
                    leased_at = @now,
                    lease_token = NEWID()
                OUTPUT
                    INSERTED.id,
                    0,
                    DELETED.visible_at,
                    DELETED.leased_by,
                    INSERTED.enqueued_at,
                    INSERTED.due_at,
                    INSERTED.attempts,
                    INSERTED.lease_token,
                    INSERTED.payload
                INTO @claimed (
                    id, own, previous_visible_at, previous_worker,
                    enqueued_at, due_at, attempts, lease_token, payload
                );
                SET @claimed_now = @@ROWCOUNT;

                IF @claimed_now = 0 BREAK;

                SET @buried_count = 0;
                SET @exhausted = (
                    SELECT COUNT(*)
                    FROM @claimed AS c
                    WHERE c.attempts > 3 AND c.previous_visible_at <= @now
                );
                IF @exhausted > 0
                    BEGIN
                        DELETE m
                        OUTPUT
                            DELETED.id,
                            DELETED.enqueued_at,
                            DELETED.due_at,
                            DELETED.dedupe_key,
                            c.attempts - 1,
                            N'lease expired',
                            c.previous_worker,
                            @now,
                            DELETED.payload
                        INTO
                            [queue].[emails_dead] (
                                id, enqueued_at, due_at, dedupe_key, attempts,
                                last_error, last_worker, dead_at, payload
                            )
                        FROM [queue].[emails] AS m
                        INNER JOIN @claimed AS c ON m.id = c.id
                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                        SET @buried_count = @@ROWCOUNT;

                        DELETE c
                        FROM @claimed AS c
                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                    END;

                SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                IF @buried_count = 0 BREAK;
            END;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        IF @look_recorded = 1
            BEGIN
                -- An error of the clear is dropped: the claim's, rethrown next, is the caller's.
                BEGIN TRY
                    EXEC sys.sp_set_session_context
                        @key = N'tablequeue.queue.emails.expired',
                        @value = NULL;
                END TRY
                BEGIN CATCH
                END CATCH;
            END;
        THROW;
    END CATCH;

    SELECT
        c.id,
        c.payload,
        c.enqueued_at,
        c.due_at,
        c.attempts,
        c.lease_token
    FROM @claimed AS c
    ORDER BY c.own DESC, c.previous_visible_at ASC, c.id ASC;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_dequeue] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_complete code

-- Only the holder of the live lease: a late complete, after the lease moved on, changes nothing.
-- @lease_token (from dequeue) fences it to that very lease; without it (NULL, deprecated: 0.1.0's
-- call) the worker's name alone is checked, which cannot tell a lease from the worker's next one.
CREATE OR ALTER PROCEDURE [queue].[emails_complete]
    @id bigint,
    @worker nvarchar(201),
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_complete: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DELETE FROM [queue].[emails]
    OUTPUT
        DELETED.id,
        DELETED.enqueued_at,
        DELETED.due_at,
        DELETED.leased_at,
        @now,
        DELETED.leased_by,
        DELETED.attempts,
        DELETED.payload
    INTO
        [queue].[emails_history] (
            id, enqueued_at, due_at, started_at, finished_at, worker, attempts, payload
        )
    WHERE
        id = @id AND leased_by = @worker AND visible_at > @now
        AND (@lease_token IS NULL OR lease_token = @lease_token);

    SELECT CONVERT(bit, @@ROWCOUNT) AS completed;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_complete] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_fail code

-- outcome: retrying | dead | lost (the caller's lease had expired or moved on: nothing changed).
-- @lease_token fences it to one lease, as complete's (NULL: the worker's name alone, deprecated).
CREATE OR ALTER PROCEDURE [queue].[emails_fail]
    @id bigint,
    @worker nvarchar(201),
    @error nvarchar(4000) = NULL,
    @retry_after_seconds int = NULL,
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_fail: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @retry_after_seconds = COALESCE(@retry_after_seconds, 0);
    IF @retry_after_seconds NOT BETWEEN 0 AND 2592000
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_fail: retry_after_seconds must be between 0 and 2592000, got ',
                @retry_after_seconds,
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @outcome varchar(8);
    DECLARE @buried_count int = 0;
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        UPDATE [queue].[emails]
        SET
            leased_by = NULL,
            lease_token = NULL,
            visible_at = DATEADD(SECOND, @retry_after_seconds, @now),
            last_error = @error
        WHERE
            id = @id AND leased_by = @worker AND visible_at > @now
            AND (@lease_token IS NULL OR lease_token = @lease_token)
            AND attempts < 3;

        IF @@ROWCOUNT = 1
            BEGIN
                SET @outcome = 'retrying';
            END;
        ELSE
            BEGIN
                DELETE m
                OUTPUT
                    DELETED.id,
                    DELETED.enqueued_at,
                    DELETED.due_at,
                    DELETED.dedupe_key,
                    DELETED.attempts,
                    @error,
                    DELETED.leased_by,
                    @now,
                    DELETED.payload
                INTO
                    [queue].[emails_dead] (
                        id, enqueued_at, due_at, dedupe_key, attempts,
                        last_error, last_worker, dead_at, payload
                    )
                FROM [queue].[emails] AS m
                WHERE
                    m.id = @id AND m.leased_by = @worker AND m.visible_at > @now
                    AND (@lease_token IS NULL OR m.lease_token = @lease_token);
                SET @buried_count = @@ROWCOUNT;
                SET @outcome = IIF(@buried_count = 1, 'dead', 'lost');
            END;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT @outcome AS outcome;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_fail] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_extend_lease code

-- The new lease runs from now, under the same token. An extend begun after the lease expired cannot
-- revive it: another worker may hold it. @lease_token fences it to one lease, as complete's (NULL: deprecated).
CREATE OR ALTER PROCEDURE [queue].[emails_extend_lease]
    @id bigint,
    @worker nvarchar(201),
    @lease_seconds int = NULL,
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_extend_lease: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @lease_seconds = COALESCE(@lease_seconds, 600);
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 1 AND 604800
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_extend_lease: lease_seconds must be between 1 and 604800, got ',
                COALESCE(CONVERT(nvarchar(12), @lease_seconds), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    UPDATE [queue].[emails]
    SET visible_at = DATEADD(SECOND, @lease_seconds, @now)
    WHERE
        id = @id AND leased_by = @worker AND visible_at > @now
        AND (@lease_token IS NULL OR lease_token = @lease_token);

    SELECT CONVERT(bit, @@ROWCOUNT) AS extended;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_extend_lease] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_release code

-- Gives a leased message back at once, with the attempt its lease counted (a consumer shutting down
-- gracefully spends none): visible now, to any worker. Only the holder of the live lease, fenced by
-- @lease_token as complete's (NULL: the worker's name alone, deprecated); otherwise released = 0
-- and nothing changes.
CREATE OR ALTER PROCEDURE [queue].[emails_release]
    @id bigint,
    @worker nvarchar(201),
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_release: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    UPDATE [queue].[emails]
    SET
        leased_by = NULL,
        leased_at = NULL,
        lease_token = NULL,
        visible_at = @now,
        attempts = IIF(attempts > 0, attempts - 1, 0)
    WHERE
        id = @id AND leased_by = @worker AND visible_at > @now
        AND (@lease_token IS NULL OR lease_token = @lease_token);

    SELECT CONVERT(bit, @@ROWCOUNT) AS released;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_release] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_lease_status code

-- What became of up to 1,000 leases, each named by its message id and lease token: held (the
-- message is in the queue under this live lease), expired (in the queue under this lease, which ran
-- out: no acknowledgement that reads its clock from now on takes it, one that read it before may),
-- lost (in the queue under no lease or another one: released, failed for a retry or leased again;
-- this lease never completes), dead (in the dead-letter table) or gone (in neither: completed, or purged). A
-- consumer whose complete's answer never arrived (the connection dropped at COMMIT) learns whether
-- it committed. It first waits for each transaction that holds one of these messages' rows (a
-- complete, a fail, a release in flight), so the answer is what that transaction left, not what it
-- may still undo. Changes nothing and keeps no lock: each shared lock is released once its row is
-- read, also inside a caller's transaction. One row per item, in the engine's id order.
CREATE OR ALTER PROCEDURE [queue].[emails_lease_status]
    @acks [queue].[emails_acks] READONLY
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF (SELECT COUNT_BIG(*) FROM @acks) > 1000
        BEGIN
            THROW 51001, N'queue.emails_lease_status: at most 1000 items per call.', 1;
        END;
    DECLARE @null_ids int = (
        SELECT COUNT(*)
        FROM @acks AS a
        WHERE a.id IS NULL
    );
    IF @null_ids > 0
        BEGIN
            SET @error_message = N'queue.emails_lease_status: acks holds a NULL id.';
            THROW 51001, @error_message, 1;
        END;
    DECLARE @repeated_id bigint = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        GROUP BY a.id
        HAVING COUNT(*) > 1
        ORDER BY a.id
    );
    IF @repeated_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_lease_status: acks holds id ',
                @repeated_id,
                N' more than once.'
            );
            THROW 51001, @error_message, 1;
        END;
    DECLARE @tokenless_id bigint = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        WHERE a.lease_token IS NULL
        ORDER BY a.id
    );
    IF @tokenless_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_lease_status: the lease token of id ',
                @tokenless_id,
                N' is NULL.'
            );
            THROW 51001, @error_message, 1;
        END;
    -- No SET XACT_ABORT ON: the verb changes nothing, so a lock timeout (1222) in its reads ends
    -- the call (TRY, then THROW) and leaves a caller's transaction as it was; under XACT_ABORT ON it
    -- would roll that transaction back.

    DECLARE @batch TABLE (
        id bigint NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO @batch (id, lease_token)
    SELECT
        a.id,
        a.lease_token
    FROM @acks AS a;
    DECLARE @found TABLE (
        id bigint NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL,
        visible_at datetime2(7) NOT NULL
    );
    DECLARE @answers TABLE (
        id bigint NOT NULL PRIMARY KEY,
        status varchar(7) NOT NULL
    );
    DECLARE @requeued TABLE (id bigint NOT NULL PRIMARY KEY);

    BEGIN TRY
        -- The wait: locking reads (READCOMMITTEDLOCK: also where the database runs
        -- READ_COMMITTED_SNAPSHOT, whose row versions would answer at once), one seek per item in
        -- id order, each shared lock released once its row is read: a transaction holding a row (a
        -- complete, fail or release in flight) is waited for.
        INSERT INTO @found (id, lease_token, visible_at)
        SELECT
            m.id,
            m.lease_token,
            m.visible_at
        FROM @batch AS b
        INNER JOIN [queue].[emails] AS m WITH (INDEX ([pk_emails]), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON b.id = m.id
        OPTION (LOOP JOIN, FORCE ORDER);

        -- After the wait: read what those transactions committed.
        DECLARE @now datetime2(7) = SYSUTCDATETIME();
        INSERT INTO @answers (id, status)
        SELECT
            b.id,
            CASE
                WHEN f.id IS NOT NULL AND f.lease_token = b.lease_token AND f.visible_at > @now THEN 'held'
                WHEN f.id IS NOT NULL AND f.lease_token = b.lease_token THEN 'expired'
                WHEN f.id IS NOT NULL THEN 'lost'
                WHEN EXISTS (
                    SELECT 1
                    FROM [queue].[emails_dead] AS d WITH (INDEX ([pk_emails_dead]), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE d.id = b.id
                ) THEN 'dead'
                ELSE 'gone'
            END AS status
        FROM @batch AS b
        LEFT JOIN @found AS f ON b.id = f.id;

        -- Requeued from the dead-letter table between the reads above (locking reads share no
        -- snapshot): in the queue again, under no lease of the caller's. A statement of its own, so
        -- that it reads the queue after the dead-letter table.
        INSERT INTO @requeued (id)
        SELECT g.id
        FROM (
            SELECT a.id
            FROM @answers AS a
            WHERE a.status = 'gone'
        ) AS g
        INNER JOIN [queue].[emails] AS q WITH (INDEX ([pk_emails]), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON g.id = q.id
        OPTION (LOOP JOIN, FORCE ORDER);
    END TRY
    BEGIN CATCH
        THROW;
    END CATCH;

    -- The result only once every read has succeeded: an error never follows part of an answer.
    SELECT
        a.id,
        IIF(r.id IS NULL, a.status, 'lost') AS status
    FROM @answers AS a
    LEFT JOIN @requeued AS r ON a.id = r.id
    ORDER BY a.id;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_lease_status] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_complete_batch code

-- complete for up to 1,000 messages in one statement: each item by its id and lease token (NULL:
-- the worker's name alone, deprecated), fenced as complete is; one row per item, in id order:
-- completed = 0 where the lease was lost (nothing changed for that item).
CREATE OR ALTER PROCEDURE [queue].[emails_complete_batch]
    @acks [queue].[emails_acks] READONLY,
    @worker nvarchar(201)
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_complete_batch: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF (SELECT COUNT_BIG(*) FROM @acks) > 1000
        BEGIN
            THROW 51001, N'queue.emails_complete_batch: at most 1000 items per call.', 1;
        END;
    DECLARE @null_ids int = (
        SELECT COUNT(*)
        FROM @acks AS a
        WHERE a.id IS NULL
    );
    IF @null_ids > 0
        BEGIN
            SET @error_message = N'queue.emails_complete_batch: acks holds a NULL id.';
            THROW 51001, @error_message, 1;
        END;
    DECLARE @repeated_id bigint = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        GROUP BY a.id
        HAVING COUNT(*) > 1
        ORDER BY a.id
    );
    IF @repeated_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_complete_batch: acks holds id ',
                @repeated_id,
                N' more than once.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @batch TABLE (
        id bigint NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO @batch (id, lease_token)
    SELECT
        a.id,
        a.lease_token
    FROM @acks AS a;
    -- The history rows of the completed messages: written to the history table after the delete,
    -- in the same transaction (queue table, then history table, as complete). Not OUTPUT INTO the
    -- history table directly, as complete does: the result needs the ids completed, a DELETE has
    -- one OUTPUT INTO, and an INSERT over a nested DELETE (composable DML) may have none.
    DECLARE @completed TABLE (
        id bigint NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        started_at datetime2(7) NOT NULL,
        finished_at datetime2(7) NOT NULL,
        worker nvarchar(200) NOT NULL,
        attempts int NOT NULL,
        payload nvarchar(MAX) NOT NULL,
        PRIMARY KEY (id)
    );
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        DELETE m
        OUTPUT
            DELETED.id,
            DELETED.enqueued_at,
            DELETED.due_at,
            DELETED.leased_at,
            @now,
            DELETED.leased_by,
            DELETED.attempts,
            DELETED.payload
        INTO
            @completed (
                id, enqueued_at, due_at, started_at, finished_at, worker, attempts, payload
            )
        FROM @batch AS b
        INNER JOIN [queue].[emails] AS m WITH (ROWLOCK) ON b.id = m.id
        WHERE
            m.leased_by = @worker AND m.visible_at > @now
            AND (b.lease_token IS NULL OR m.lease_token = b.lease_token)
        OPTION (LOOP JOIN, FORCE ORDER);

        INSERT INTO [queue].[emails_history] (
            id, enqueued_at, due_at, started_at, finished_at, worker, attempts, payload
        )
        SELECT
            c.id,
            c.enqueued_at,
            c.due_at,
            c.started_at,
            c.finished_at,
            c.worker,
            c.attempts,
            c.payload
        FROM @completed AS c;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        b.id,
        CONVERT(bit, IIF(c.id IS NULL, 0, 1)) AS completed
    FROM @batch AS b
    LEFT JOIN @completed AS c ON b.id = c.id
    ORDER BY b.id;
END;
GO

-- The acks type serves fail_batch and lease_status too (the same role).
GRANT EXECUTE ON TYPE::[queue].[emails_acks] TO [queue_consumer];
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_complete_batch] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_fail_batch code

-- fail for up to 1,000 messages, all with the same error and retry delay: each item by its id and
-- lease token (NULL: the worker's name alone, deprecated), fenced as fail is. One row per item, in
-- id order: outcome retrying | dead | lost (the lease was lost: nothing changed for that item).
CREATE OR ALTER PROCEDURE [queue].[emails_fail_batch]
    @acks [queue].[emails_acks] READONLY,
    @worker nvarchar(201),
    @error nvarchar(4000) = NULL,
    @retry_after_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_fail_batch: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @retry_after_seconds = COALESCE(@retry_after_seconds, 0);
    IF @retry_after_seconds NOT BETWEEN 0 AND 2592000
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_fail_batch: retry_after_seconds must be between 0 and 2592000, got ',
                @retry_after_seconds,
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF (SELECT COUNT_BIG(*) FROM @acks) > 1000
        BEGIN
            THROW 51001, N'queue.emails_fail_batch: at most 1000 items per call.', 1;
        END;
    DECLARE @null_ids int = (
        SELECT COUNT(*)
        FROM @acks AS a
        WHERE a.id IS NULL
    );
    IF @null_ids > 0
        BEGIN
            SET @error_message = N'queue.emails_fail_batch: acks holds a NULL id.';
            THROW 51001, @error_message, 1;
        END;
    DECLARE @repeated_id bigint = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        GROUP BY a.id
        HAVING COUNT(*) > 1
        ORDER BY a.id
    );
    IF @repeated_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_fail_batch: acks holds id ',
                @repeated_id,
                N' more than once.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @batch TABLE (
        id bigint NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO @batch (id, lease_token)
    SELECT
        a.id,
        a.lease_token
    FROM @acks AS a;
    -- The messages whose lease the caller held, with the attempts they had used.
    DECLARE @held TABLE (
        id bigint NOT NULL PRIMARY KEY,
        attempts int NOT NULL
    );
    DECLARE @buried_count int = 0;
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- 1. One statement locks every message of the batch whose lease the caller holds, in id
        -- order: with attempts left it is visible again after the retry delay; on its last attempt
        -- it keeps its lease, locked, for the move below.
        UPDATE m
        SET
            m.leased_by = IIF(m.attempts < 3, NULL, m.leased_by),
            m.lease_token = IIF(m.attempts < 3, NULL, m.lease_token),
            m.visible_at = IIF(m.attempts < 3, DATEADD(SECOND, @retry_after_seconds, @now), m.visible_at),
            m.last_error = @error
        OUTPUT
            INSERTED.id,
            INSERTED.attempts
        INTO @held (id, attempts)
        FROM @batch AS b
        INNER JOIN [queue].[emails] AS m WITH (ROWLOCK) ON b.id = m.id
        WHERE
            m.leased_by = @worker AND m.visible_at > @now
            AND (b.lease_token IS NULL OR m.lease_token = b.lease_token)
        OPTION (LOOP JOIN, FORCE ORDER);

        -- 2. Those on their last attempt to the dead-letter table: rows this transaction holds
        -- already (step 1). On a client-id queue the seek also takes the nonclustered primary key
        -- entry again, which a late single verb on that message may hold while it waits for the
        -- row: a deadlock one of the two retries (docs/errors.md).
        DELETE m
        OUTPUT
            DELETED.id,
            DELETED.enqueued_at,
            DELETED.due_at,
            DELETED.dedupe_key,
            DELETED.attempts,
            @error,
            DELETED.leased_by,
            @now,
            DELETED.payload
        INTO
            [queue].[emails_dead] (
                id, enqueued_at, due_at, dedupe_key, attempts,
                last_error, last_worker, dead_at, payload
            )
        FROM @held AS h
        INNER JOIN [queue].[emails] AS m ON h.id = m.id
        WHERE h.attempts >= 3
        OPTION (LOOP JOIN, FORCE ORDER);
        SET @buried_count = @@ROWCOUNT;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        b.id,
        CONVERT(varchar(8), CASE
            WHEN h.id IS NULL THEN 'lost'
            WHEN h.attempts < 3 THEN 'retrying'
            ELSE 'dead'
        END) AS outcome
    FROM @batch AS b
    LEFT JOIN @held AS h ON b.id = h.id
    ORDER BY b.id;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_fail_batch] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_complete_next code

-- complete, then dequeue, in one transaction: one commit per message instead of two. The complete
-- is fenced as complete's (@lease_token NULL: the worker's name alone, deprecated) and its outcome
-- is previous_completed; the dequeue is dequeue's (the worker's own unfinished messages first). The
-- rows are dequeue's, each with previous_completed; with nothing to lease, one row whose id (and
-- every other dequeue column) is NULL carries it.
CREATE OR ALTER PROCEDURE [queue].[emails_complete_next]
    @id bigint,
    @worker nvarchar(201),
    @lease_token uniqueidentifier = NULL,
    @batch_size int = 1,
    @lease_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    -- The claim's hints are refused (READPAST) or lock differently under SERIALIZABLE and SNAPSHOT:
    -- READ COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @batch_size IS NULL OR @batch_size NOT BETWEEN 1 AND 1000
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_complete_next: batch_size must be between 1 and 1000, got ',
                COALESCE(CONVERT(nvarchar(12), @batch_size), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_complete_next: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @lease_seconds = COALESCE(@lease_seconds, 600);
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 1 AND 604800
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_complete_next: lease_seconds must be between 1 and 604800, got ',
                COALESCE(CONVERT(nvarchar(12), @lease_seconds), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY,
        own bit NOT NULL,
        previous_visible_at datetime2(7) NOT NULL,
        previous_worker nvarchar(200) NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        -- NULL only for a live lease taken before storage v2 that its worker asked for again.
        lease_token uniqueidentifier NULL,
        payload nvarchar(MAX) NOT NULL
    );
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @lease_until datetime2(7) = DATEADD(SECOND, @lease_seconds, @now);
    DECLARE @remaining int = @batch_size;
    DECLARE @claimed_now int = 0;
    DECLARE @exhausted int;
    DECLARE @started_transaction bit = 0;
    DECLARE @next_look sql_variant = SESSION_CONTEXT(N'tablequeue.queue.emails.expired');
    DECLARE @look_due bit = CASE
        WHEN @next_look IS NULL THEN 1
        WHEN CONVERT(sysname, SQL_VARIANT_PROPERTY(@next_look, 'BaseType')) <> N'datetime2' THEN 1
        WHEN CONVERT(datetime2(7), @next_look) <= @now THEN 1
        WHEN CONVERT(datetime2(7), @next_look) > DATEADD(SECOND, 1, @now) THEN 1
        ELSE 0
    END;
    DECLARE @look_after datetime2(7);
    DECLARE @look_recorded bit = 0;
    DECLARE @look_worker nvarchar(200);
    DECLARE @buried_count int = 0;
    DECLARE @previous_completed bit;
    -- This session's look for expired leases, when due, is recorded first (record_look).
    IF @look_due = 1
        BEGIN
            SET @look_after = DATEADD(SECOND, 1, @now);
            SET XACT_ABORT OFF;
            BEGIN TRY
                -- Not transactional: a caller that rolls back still waits its second.
                EXEC sys.sp_set_session_context
                    @key = N'tablequeue.queue.emails.expired',
                    @value = @look_after;
                SET XACT_ABORT ON;
                SET @look_recorded = 1;
            END TRY
            BEGIN CATCH
                SET XACT_ABORT ON;
                IF ERROR_NUMBER() NOT IN (15664, 15665) OR XACT_STATE() = -1 THROW;
            END CATCH;
        END;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- Complete first: its row (queue table, then history) is locked before the claim's, the
        -- order of complete and of dequeue (queue table, then dead-letter table).
        DELETE FROM [queue].[emails]
        OUTPUT
            DELETED.id,
            DELETED.enqueued_at,
            DELETED.due_at,
            DELETED.leased_at,
            @now,
            DELETED.leased_by,
            DELETED.attempts,
            DELETED.payload
        INTO
            [queue].[emails_history] (
                id, enqueued_at, due_at, started_at, finished_at, worker, attempts, payload
            )
        WHERE
            id = @id AND leased_by = @worker AND visible_at > @now
            AND (@lease_token IS NULL OR lease_token = @lease_token);
        SET @previous_completed = CONVERT(bit, @@ROWCOUNT);

        -- 1. Own messages first. `leased_by IS NOT NULL` repeats the filter of the filtered index,
        -- so that the optimizer can match it whatever @worker is.
        WITH own_messages AS (
            SELECT TOP (@remaining)
                m.id,
                m.enqueued_at,
                m.due_at,
                m.visible_at,
                m.attempts,
                m.leased_by,
                m.leased_at,
                m.lease_token,
                m.payload
            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.leased_by = @worker AND m.leased_by IS NOT NULL
            ORDER BY m.visible_at, m.id
        )

        UPDATE own_messages
        SET
            -- The worker's own messages come back as they are while their lease lives (the same
            -- attempt, the same expiry, the same token: it is the same lease, and asking again neither
            -- spends an attempt nor buys time); one whose lease has expired is leased anew, as anyone's
            -- would be, with a new token. (Every right-hand side reads the row as it was before this
            -- statement; NEWID() is drawn for each row.)
            attempts = attempts + IIF(visible_at <= @now, 1, 0),
            visible_at = IIF(visible_at <= @now, @lease_until, visible_at),
            leased_by = @worker,
            leased_at = IIF(visible_at <= @now, @now, leased_at),
            lease_token = IIF(visible_at <= @now, NEWID(), lease_token)
        OUTPUT
            INSERTED.id,
            1,
            DELETED.visible_at,
            DELETED.leased_by,
            INSERTED.enqueued_at,
            INSERTED.due_at,
            INSERTED.attempts,
            INSERTED.lease_token,
            INSERTED.payload
        INTO @claimed (
            id, own, previous_visible_at, previous_worker,
            enqueued_at, due_at, attempts, lease_token, payload
        );

        SET @exhausted = (
            SELECT COUNT(*)
            FROM @claimed AS c
            WHERE c.attempts > 3 AND c.previous_visible_at <= @now
        );
        IF @exhausted > 0
            BEGIN
                DELETE m
                OUTPUT
                    DELETED.id,
                    DELETED.enqueued_at,
                    DELETED.due_at,
                    DELETED.dedupe_key,
                    c.attempts - 1,
                    N'lease expired',
                    c.previous_worker,
                    @now,
                    DELETED.payload
                INTO
                    [queue].[emails_dead] (
                        id, enqueued_at, due_at, dedupe_key, attempts,
                        last_error, last_worker, dead_at, payload
                    )
                FROM [queue].[emails] AS m
                INNER JOIN @claimed AS c ON m.id = c.id
                WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                SET @buried_count = @@ROWCOUNT;

                DELETE c
                FROM @claimed AS c
                WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
            END;

        SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);

        -- 2. Expired leases, at most once a second per session (look_declarations), one lease holder
        -- at a time; a holder whose expired lease went to the dead-letter table is looked at again.
        IF @look_due = 1
            BEGIN
                IF @remaining > 0
                    BEGIN
                        SET @look_worker = (
                            SELECT TOP (1) m.leased_by
                            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.leased_by IS NOT NULL
                            ORDER BY m.leased_by
                        );
                        WHILE @look_worker IS NOT NULL AND @remaining > 0
                            BEGIN
                                WITH expired_leases AS (
                                    SELECT TOP (@remaining)
                                        m.id,
                                        m.enqueued_at,
                                        m.due_at,
                                        m.visible_at,
                                        m.attempts,
                                        m.leased_by,
                                        m.leased_at,
                                        m.lease_token,
                                        m.payload
                                    FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE
                                        m.leased_by = @look_worker AND m.leased_by IS NOT NULL
                                        AND m.visible_at <= @now
                                    ORDER BY m.visible_at, m.id
                                )

                                UPDATE expired_leases
                                SET
                                    attempts = attempts + 1,
                                    visible_at = @lease_until,
                                    leased_by = @worker,
                                    leased_at = @now,
                                    lease_token = NEWID()
                                OUTPUT
                                    INSERTED.id,
                                    0,
                                    DELETED.visible_at,
                                    DELETED.leased_by,
                                    INSERTED.enqueued_at,
                                    INSERTED.due_at,
                                    INSERTED.attempts,
                                    INSERTED.lease_token,
                                    INSERTED.payload
                                INTO @claimed (
                                    id, own, previous_visible_at, previous_worker,
                                    enqueued_at, due_at, attempts, lease_token, payload
                                );
                                IF @@ROWCOUNT = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                            WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                            ORDER BY m.leased_by
                                        );
                                        CONTINUE;
                                    END;
                                SET @buried_count = 0;
                                SET @exhausted = (
                                    SELECT COUNT(*)
                                    FROM @claimed AS c
                                    WHERE c.attempts > 3 AND c.previous_visible_at <= @now
                                );
                                IF @exhausted > 0
                                    BEGIN
                                        DELETE m
                                        OUTPUT
                                            DELETED.id,
                                            DELETED.enqueued_at,
                                            DELETED.due_at,
                                            DELETED.dedupe_key,
                                            c.attempts - 1,
                                            N'lease expired',
                                            c.previous_worker,
                                            @now,
                                            DELETED.payload
                                        INTO
                                            [queue].[emails_dead] (
                                                id, enqueued_at, due_at, dedupe_key, attempts,
                                                last_error, last_worker, dead_at, payload
                                            )
                                        FROM [queue].[emails] AS m
                                        INNER JOIN @claimed AS c ON m.id = c.id
                                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                                        SET @buried_count = @@ROWCOUNT;

                                        DELETE c
                                        FROM @claimed AS c
                                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                                    END;
                                SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                                IF @buried_count = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                            WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                            ORDER BY m.leased_by
                                        );
                                    END;
                            END;
                    END;
                -- A look that filled the batch may have left more behind, and one the own
                -- messages left no room for has not happened: either stays due. The key is this
                -- call's own write (record_due_look), so that clearing it is never refused.
                IF @remaining = 0 AND @look_recorded = 1
                    BEGIN
                        EXEC sys.sp_set_session_context
                            @key = N'tablequeue.queue.emails.expired',
                            @value = NULL;
                    END;
            END;

        -- 3. Messages nobody leases (new, due, retried, released), on the filtered claim index, whose
        -- filter the claims repeat. A claimed row that goes to the dead-letter table frees its place in
        -- the batch: claim again until the batch is full or nothing visible is left.
        WHILE @remaining > 0
            BEGIN
                WITH next_messages AS (
                    SELECT TOP (@remaining)
                        m.id,
                        m.enqueued_at,
                        m.due_at,
                        m.visible_at,
                        m.attempts,
                        m.leased_by,
                        m.leased_at,
                        m.lease_token,
                        m.payload
                    FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_ready]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.leased_by IS NULL AND m.visible_at <= @now
                    ORDER BY m.visible_at, m.id
                )

                UPDATE next_messages
                SET
                    attempts = attempts + 1,
                    visible_at = @lease_until,
                    leased_by = @worker,
                    leased_at = @now,
                    lease_token = NEWID()
                OUTPUT
                    INSERTED.id,
                    0,
                    DELETED.visible_at,
                    DELETED.leased_by,
                    INSERTED.enqueued_at,
                    INSERTED.due_at,
                    INSERTED.attempts,
                    INSERTED.lease_token,
                    INSERTED.payload
                INTO @claimed (
                    id, own, previous_visible_at, previous_worker,
                    enqueued_at, due_at, attempts, lease_token, payload
                );
                SET @claimed_now = @@ROWCOUNT;

                IF @claimed_now = 0 BREAK;

                SET @buried_count = 0;
                SET @exhausted = (
                    SELECT COUNT(*)
                    FROM @claimed AS c
                    WHERE c.attempts > 3 AND c.previous_visible_at <= @now
                );
                IF @exhausted > 0
                    BEGIN
                        DELETE m
                        OUTPUT
                            DELETED.id,
                            DELETED.enqueued_at,
                            DELETED.due_at,
                            DELETED.dedupe_key,
                            c.attempts - 1,
                            N'lease expired',
                            c.previous_worker,
                            @now,
                            DELETED.payload
                        INTO
                            [queue].[emails_dead] (
                                id, enqueued_at, due_at, dedupe_key, attempts,
                                last_error, last_worker, dead_at, payload
                            )
                        FROM [queue].[emails] AS m
                        INNER JOIN @claimed AS c ON m.id = c.id
                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                        SET @buried_count = @@ROWCOUNT;

                        DELETE c
                        FROM @claimed AS c
                        WHERE c.attempts > 3 AND c.previous_visible_at <= @now;
                    END;

                SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                IF @buried_count = 0 BREAK;
            END;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        IF @look_recorded = 1
            BEGIN
                -- An error of the clear is dropped: the claim's, rethrown next, is the caller's.
                BEGIN TRY
                    EXEC sys.sp_set_session_context
                        @key = N'tablequeue.queue.emails.expired',
                        @value = NULL;
                END TRY
                BEGIN CATCH
                END CATCH;
            END;
        THROW;
    END CATCH;

    -- The one-row table on the left keeps a row when nothing was claimed.
    SELECT
        c.id,
        c.payload,
        c.enqueued_at,
        c.due_at,
        c.attempts,
        c.lease_token,
        @previous_completed AS previous_completed
    FROM (VALUES (1)) AS one_row(n)
    LEFT JOIN @claimed AS c ON one_row.n = 1
    ORDER BY c.own DESC, c.previous_visible_at ASC, c.id ASC;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_complete_next] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_wait code

-- Waiting instead of polling: a probe, then a pause of 50 ms, until a message is ready or wait_ms
-- have passed (the answer comes at most one pause after the timeout). It holds no lock and no
-- snapshot between its probes and never opens a transaction of its own: the caller dequeues
-- afterwards, in its own transaction. In IMPLICIT_TRANSACTIONS mode (a manual-commit caller) the
-- first probe opens the caller's implicit transaction, as any statement would; it holds nothing
-- (READ COMMITTED releases each probe's locks) and the caller ends it as usual. Called inside an
-- open transaction, the caller's own locks stay held while it waits: call it outside one.
CREATE OR ALTER PROCEDURE [queue].[emails_wait]
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
                N'queue.emails_wait: wait_ms must be between 0 and 20000, got ',
                COALESCE(CONVERT(nvarchar(12), @wait_ms), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;

        END;
    SET XACT_ABORT ON;

    DECLARE @deadline datetime2(7) = DATEADD(MILLISECOND, @wait_ms, SYSUTCDATETIME());
    DECLARE @ready bit = 0;
    DECLARE @now datetime2(7);
    DECLARE @next_look sql_variant;
    DECLARE @look_due bit;
    DECLARE @look_after datetime2(7);
    DECLARE @look_worker nvarchar(200);

    WHILE 1 = 1
        BEGIN
            SET @now = SYSUTCDATETIME();
            SELECT TOP (1) @ready = 1
            FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_ready]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.leased_by IS NULL AND m.visible_at <= @now;
            IF @ready = 0
                BEGIN
                    SET @next_look = SESSION_CONTEXT(N'tablequeue.queue.emails.expired');
                    SET @look_due = CASE
                        WHEN @next_look IS NULL THEN 1
                        WHEN CONVERT(sysname, SQL_VARIANT_PROPERTY(@next_look, 'BaseType')) <> N'datetime2' THEN 1
                        WHEN CONVERT(datetime2(7), @next_look) <= @now THEN 1
                        WHEN CONVERT(datetime2(7), @next_look) > DATEADD(SECOND, 1, @now) THEN 1
                        ELSE 0
                    END;
                    IF @look_due = 1
                        BEGIN
                            SET @look_worker = (
                                SELECT TOP (1) m.leased_by
                                FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                WHERE m.leased_by IS NOT NULL
                                ORDER BY m.leased_by
                            );
                            WHILE @look_worker IS NOT NULL AND @ready = 0
                                BEGIN
                                    SELECT TOP (1) @ready = 1
                                    FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE
                                        m.leased_by = @look_worker AND m.leased_by IS NOT NULL
                                        AND m.visible_at <= @now;
                                    IF @ready = 0
                                        BEGIN
                                            SET @look_worker = (
                                                SELECT TOP (1) m.leased_by
                                                FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                                WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                                ORDER BY m.leased_by
                                            );
                                        END;
                                END;
                            IF @ready = 0
                                BEGIN
                                    SET @look_after = DATEADD(SECOND, 1, @now);
                                    SET XACT_ABORT OFF;
                                    BEGIN TRY
                                        -- Not transactional: a caller that rolls back still waits its second.
                                        EXEC sys.sp_set_session_context
                                            @key = N'tablequeue.queue.emails.expired',
                                            @value = @look_after;
                                        SET XACT_ABORT ON;
                                    END TRY
                                    BEGIN CATCH
                                        SET XACT_ABORT ON;
                                        IF ERROR_NUMBER() NOT IN (15664, 15665) OR XACT_STATE() = -1 THROW;
                                    END CATCH;
                                END;
                        END;
                END;

            IF @ready = 1 OR SYSUTCDATETIME() >= @deadline BREAK;
            WAITFOR DELAY '00:00:00.050';
        END;

    SELECT @ready AS ready;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_wait] TO [queue_consumer];
GO

-- tablequeue:unit queue.emails_stats code

-- EXECUTE AS OWNER: the estimate reads sys.partitions, whose rows a caller holding only the admin
-- role could not see. The procedure only reads.
CREATE OR ALTER PROCEDURE [queue].[emails_stats]
    WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    -- Every count stops at exact_limit rows and reads an index range that the count matches; past
    -- the limit the catalog's row count stands in (NServiceBus.SqlServer #481). READPAST: rows a
    -- claim holds right now are not counted, and stats never waits for them.
    -- ready: visible_at <= now (new, due, retried, or with an expired lease: all claimable);
    -- delayed: not yet due and not leased; in_flight: under a live lease. Messages nobody leases are
    -- counted on the claim index (filtered WHERE leased_by IS NULL), leased ones on ix_emails_lease.
    DECLARE @exact_limit bigint = 10000;
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @estimated bit = 0;
    DECLARE @ready bigint = 0;
    DECLARE @delayed bigint = 0;
    -- Whether a count stopped at the limit (a sum of counts may pass it and still be exact).
    DECLARE @ready_capped bit = 0;
    DECLARE @delayed_capped bit = 0;
    DECLARE @grouped_capped bit = 0;
    DECLARE @oldest_ready datetime2(7);
    SET @ready = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.id
            FROM [queue].[emails] AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.leased_by IS NULL AND m.visible_at <= @now
        ) AS counted
    );
    SET @delayed = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.id
            FROM [queue].[emails] AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.leased_by IS NULL AND m.visible_at > @now
        ) AS counted
    );
    SET @ready_capped = IIF(@ready > @exact_limit, 1, 0);
    SET @delayed_capped = IIF(@delayed > @exact_limit, 1, 0);
    SET @oldest_ready = (
        SELECT TOP (1) m.visible_at
        FROM [queue].[emails] AS m WITH (READPAST, READCOMMITTEDLOCK)
        WHERE m.leased_by IS NULL AND m.visible_at <= @now
        ORDER BY m.visible_at ASC, m.id ASC
    );
    -- Expired leases are ready too, the oldest expiry maybe the oldest of all: one lease holder at a
    -- time on ix_emails_lease (w.next_lease_holder), each holder's oldest first. The count
    -- reads at most the limit and one row over all holders; once past it, only each remaining
    -- holder's oldest (one seek): the oldest stays exact.
    DECLARE @expired bigint = 0;
    DECLARE @oldest_expired datetime2(7);
    DECLARE @holder_oldest datetime2(7);
    DECLARE @look_worker nvarchar(200);
    SET @look_worker = (
        SELECT TOP (1) m.leased_by
        FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.leased_by IS NOT NULL
        ORDER BY m.leased_by
    );
    WHILE @look_worker IS NOT NULL
        BEGIN
            -- What is left of the limit and one row; past the limit, the holder's oldest only (TOP (1)).
            SELECT
                @expired = @expired + IIF(@expired > @exact_limit, 0, COUNT_BIG(*)),
                @holder_oldest = MIN(e.visible_at)
            FROM (
                SELECT TOP (IIF(@expired > @exact_limit, 1, @exact_limit + 1 - @expired)) m.visible_at
                FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.leased_by = @look_worker AND m.leased_by IS NOT NULL AND m.visible_at <= @now
                ORDER BY m.visible_at
            ) AS e;
            IF @oldest_expired IS NULL OR @holder_oldest < @oldest_expired SET @oldest_expired = @holder_oldest;
            SET @look_worker = (
                SELECT TOP (1) m.leased_by
                FROM [queue].[emails] AS m WITH (INDEX ([ix_emails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                ORDER BY m.leased_by
            );
        END;
    -- Each count stopped at the limit on its own: only one that did is an estimate.
    IF @expired > @exact_limit SET @ready_capped = 1;
    SET @ready = @ready + @expired;
    IF @oldest_ready IS NULL OR @oldest_expired < @oldest_ready SET @oldest_ready = @oldest_expired;
    DECLARE @in_flight bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.id
            FROM [queue].[emails] AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.leased_by IS NOT NULL AND m.visible_at > @now
        ) AS counted
    );
    DECLARE @dead bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) d.id
            FROM [queue].[emails_dead] AS d WITH (READPAST, READCOMMITTEDLOCK)
        ) AS counted
    );

    IF @ready_capped = 1 OR @delayed_capped = 1 OR @grouped_capped = 1 OR @in_flight > @exact_limit
        BEGIN
            DECLARE @total_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'[queue].[emails]') AND p.index_id IN (0, 1)
            );
            SET @estimated = 1;
            -- The catalog's total less the exact counts is the estimate of the one over the limit.
            IF @ready_capped = 1 AND @total_estimate - @delayed - @in_flight > @ready
                SET @ready = @total_estimate - @delayed - @in_flight;
            ELSE IF @delayed_capped = 1 AND @total_estimate - @ready - @in_flight > @delayed
                SET @delayed = @total_estimate - @ready - @in_flight;
            ELSE IF @in_flight > @exact_limit AND @total_estimate - @ready - @delayed > @in_flight
                SET @in_flight = @total_estimate - @ready - @delayed;
        END;
    IF @dead > @exact_limit
        BEGIN
            DECLARE @dead_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'[queue].[emails_dead]') AND p.index_id IN (0, 1)
            );
            SET @estimated = 1;
            SET @dead = IIF(@dead_estimate > @dead, @dead_estimate, @dead);
        END;

    SELECT
        @ready AS ready,
        @delayed AS delayed,
        @in_flight AS in_flight,
        @dead AS dead,
        CONVERT(float, DATEDIFF_BIG(MICROSECOND, @oldest_ready, @now)) / 1000000.0 AS oldest_ready_age_seconds,
        @estimated AS estimated;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_stats] TO [queue_admin];
GO

-- tablequeue:unit queue.emails_purge code

-- Removes queued messages, leased ones too (their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR ALTER PROCEDURE [queue].[emails_purge]
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
            THROW 51001, N'queue.emails_purge: max_rows must be at least 1.', 1;
        END;
    IF @max_rows IS NULL AND (@@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0)
        BEGIN
            THROW 51001, N'queue.emails_purge: max_rows is required in a transaction.', 1;
        END;
    SET XACT_ABORT ON;
    -- Purge can deadlock with consumers: it locks a row, then the row's other index entries, while
    -- claims (through the claim index) lock an entry first, then the row. The purge is the victim,
    -- never the consumer (restored when the procedure returns); a consumer's 1205 is retryable, and
    -- so is the purge's own: the chunks before it are committed, call it again.
    SET DEADLOCK_PRIORITY LOW;

    -- Chunks of at most 1,000 rows stay under the lock-escalation threshold, so consumers keep
    -- working; READPAST skips the rows a claim holds right now, but deleting a row also locks its
    -- index entries, where the purge can wait on a claim's lock until that claim's transaction
    -- ends. The bound stops a purge from chasing producers forever. Oldest first, in the clustered
    -- index's order (id). Without max_rows each chunk commits on its own (inside a transaction
    -- max_rows is required: checked above).
    DECLARE @last bigint = (SELECT MAX(m.id) FROM [queue].[emails] AS m WITH (READPAST, READCOMMITTEDLOCK));
    DECLARE @after bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE (id bigint NOT NULL PRIMARY KEY);

    WHILE @chunk > 0
        BEGIN
            SET @chunk = IIF(@max_rows IS NULL OR @max_rows - @purged > 1000, 1000, @max_rows - @purged);
            DELETE FROM @deleted;
            IF @older_than IS NULL
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk) m.id
                        FROM [queue].[emails] AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE m.id > @after AND m.id <= @last
                        ORDER BY m.id
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.id INTO @deleted (id);
                    SET @chunk = @@ROWCOUNT;
                END;
            ELSE
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk) m.id
                        FROM [queue].[emails] AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE m.id > @after AND m.id <= @last AND m.enqueued_at < @older_than
                        ORDER BY m.id
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.id INTO @deleted (id);
                    SET @chunk = @@ROWCOUNT;
                END;
            SET @purged = @purged + @chunk;
            SET @after = COALESCE((SELECT MAX(d.id) FROM @deleted AS d), @after);
        END;

    SELECT @purged AS purged;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_purge] TO [queue_admin];
GO

-- tablequeue:unit queue.emails_dead_list code

-- Paged by id: pass the last id of a page as after_id to read the next one. (page_size, not
-- `limit`: PostgreSQL reserves that word, and the parameter names are the same in both dialects.)
-- Pinned to the primary key on id: with client ids the table is clustered on dead_seq, and a plan
-- compiled while the table was small could scan and sort all of it for every page.
CREATE OR ALTER PROCEDURE [queue].[emails_dead_list]
    @after_id bigint = NULL,
    @page_size int = 100
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @page_size IS NULL OR @page_size NOT BETWEEN 1 AND 1000
        BEGIN
            SET @error_message = CONCAT(
                N'queue.emails_dead_list: page_size must be between 1 and 1000, got ',
                COALESCE(CONVERT(nvarchar(12), @page_size), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    IF @after_id IS NULL
        BEGIN
            SELECT TOP (@page_size)
                d.id,
                d.payload,
                d.enqueued_at,
                d.due_at,
                d.dedupe_key,
                d.attempts,
                d.last_error,
                d.last_worker,
                d.dead_at
            FROM [queue].[emails_dead] AS d WITH (INDEX ([pk_emails_dead]))
            ORDER BY d.id ASC;
        END;
    ELSE
        BEGIN
            SELECT TOP (@page_size)
                d.id,
                d.payload,
                d.enqueued_at,
                d.due_at,
                d.dedupe_key,
                d.attempts,
                d.last_error,
                d.last_worker,
                d.dead_at
            FROM [queue].[emails_dead] AS d WITH (INDEX ([pk_emails_dead]), FORCESEEK)
            WHERE d.id > @after_id
            ORDER BY d.id ASC;
        END;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_dead_list] TO [queue_admin];
GO

-- tablequeue:unit queue.emails_dead_requeue code

-- Back to the queue under the same id, visible now, attempts reset; the last error stays on the
-- row for reference.
-- EXECUTE AS OWNER: keeping the id takes SET IDENTITY_INSERT, which needs ALTER on the table.
CREATE OR ALTER PROCEDURE [queue].[emails_dead_requeue]
    @id bigint
    WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @id IS NULL
        BEGIN
            SET @error_message = N'queue.emails_dead_requeue: id must not be NULL.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;
    -- Requeue locks the id's place in the queue table, then the key's; enqueue locks the key, then
    -- the id: the same id or key in both at once can deadlock, and the operator's call is the
    -- victim, never the producer's (restored when the procedure returns).
    SET DEADLOCK_PRIORITY LOW;

    DECLARE @now datetime2(7);
    DECLARE @found bit;
    DECLARE @taken_id bigint;
    DECLARE @key nvarchar(200);
    DECLARE @locked_key nvarchar(200);
    DECLARE @key_holder bigint;
    DECLARE @started_transaction bit;
    DECLARE @deadlock_retries int = 0;
    DECLARE @pause datetime;

    -- A deadlock (1205) in a transaction of its own is tried again after a short random pause, up to
    -- 3 times; in a caller's transaction it is the caller's to retry (docs/errors.md).
    WHILE 1 = 1
        BEGIN
            -- Each pass starts afresh: a SELECT that finds no row leaves its variables as they were.
            SET @now = SYSUTCDATETIME();
            SET @found = 0;
            SET @taken_id = NULL;
            SET @key = NULL;
            SET @locked_key = NULL;
            SET @key_holder = NULL;
            SET @started_transaction = 0;

            BEGIN TRY
                -- In implicit-transaction mode the caller owns the transaction the next statement opens.
                IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
                    BEGIN
                        BEGIN TRANSACTION;
                        SET @started_transaction = 1;
                    END;

                -- Queue table first, the fixed lock order: the id's place in the queue, held so that nothing
                -- else can insert it. A concurrent requeue of the same id waits here.
                SELECT @taken_id = m.id
                FROM [queue].[emails] AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.id = @id;

                -- The key to lock in the queue table, before the dead row is locked (queue first): read
                -- without keeping a lock, and checked again below under the dead row's lock.
                SET @key = (
                    SELECT d.dedupe_key
                    FROM [queue].[emails_dead] AS d
                    WHERE d.id = @id
                );
                IF @key IS NOT NULL
                    BEGIN
                        SELECT @key_holder = m.id
                        FROM [queue].[emails] AS m WITH (UPDLOCK, HOLDLOCK)
                        WHERE m.dedupe_key = @key AND m.dedupe_key IS NOT NULL;
                    END;

                -- Then the dead row, locked to the end of the transaction: a concurrent delete of it waits
                -- here and then finds it gone (not_found), instead of colliding with this insert (2627).
                SELECT
                    @found = 1,
                    @locked_key = d.dedupe_key
                FROM [queue].[emails_dead] AS d WITH (UPDLOCK, HOLDLOCK)
                WHERE d.id = @id;
                IF @found = 0
                    BEGIN
                        SET @error_message = CONCAT(
                            N'queue.emails_dead_requeue: no dead-letter message with id ',
                            CONVERT(nvarchar(36), @id),
                            N'.'
                        );
                        THROW 51004, @error_message, 1;
                    END;
                IF @taken_id IS NOT NULL
                    BEGIN
                        SET @error_message = CONCAT(
                            N'queue.emails_dead_requeue: a message with id ',
                            CONVERT(nvarchar(36), @id),
                            N' is queued already.'
                        );
                        THROW 51001, @error_message, 1;
                    END;

                SET IDENTITY_INSERT [queue].[emails] ON;

                -- Queue table, then dead table: insert the copy, then delete.
                -- The message keeps its key unless the key was enqueued again since (or is not the key
                -- locked above): it then comes back without it rather than not at all (requeue is an
                -- operator's deliberate action).
                INSERT INTO [queue].[emails] (
                    id, enqueued_at, due_at, visible_at, dedupe_key, attempts, last_error, payload
                )
                SELECT
                    d.id,
                    d.enqueued_at,
                    d.due_at,
                    @now AS visible_at,
                    IIF(@key_holder IS NULL AND @locked_key = @key, @locked_key, NULL) AS dedupe_key,
                    0 AS attempts,
                    d.last_error,
                    d.payload
                FROM [queue].[emails_dead] AS d
                WHERE d.id = @id;

                SET IDENTITY_INSERT [queue].[emails] OFF;

                DELETE FROM [queue].[emails_dead]
                WHERE id = @id;

                IF @started_transaction = 1 COMMIT TRANSACTION;
                BREAK;
            END TRY
            BEGIN CATCH
                SET IDENTITY_INSERT [queue].[emails] OFF;
                IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                IF ERROR_NUMBER() <> 1205 OR @started_transaction = 0 OR @deadlock_retries >= 3 THROW;
                SET @deadlock_retries = @deadlock_retries + 1;
                SET @pause = DATEADD(MILLISECOND, 20 + ABS(CHECKSUM(NEWID()) % 180), CONVERT(datetime, 0));
                WAITFOR DELAY @pause;
            END CATCH;
        END;

    SELECT CONVERT(bit, 1) AS requeued;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_dead_requeue] TO [queue_admin];
GO

-- tablequeue:unit queue.emails_dead_delete code

CREATE OR ALTER PROCEDURE [queue].[emails_dead_delete]
    @id bigint
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @id IS NULL
        BEGIN
            SET @error_message = N'queue.emails_dead_delete: id must not be NULL.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    BEGIN TRY
        DELETE FROM [queue].[emails_dead]
        WHERE id = @id;

        IF @@ROWCOUNT = 0
            BEGIN
                SET @error_message = CONCAT(
                    N'queue.emails_dead_delete: no dead-letter message with id ',
                    CONVERT(nvarchar(36), @id),
                    N'.'
                );
                THROW 51004, @error_message, 1;
            END;
    END TRY
    BEGIN CATCH
        THROW;
    END CATCH;

    SELECT CONVERT(bit, 1) AS deleted; -- noqa: RF04
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_dead_delete] TO [queue_admin];
GO

-- tablequeue:unit queue.emails_history_purge code

CREATE OR ALTER PROCEDURE [queue].[emails_history_purge]
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
            THROW 51001, N'queue.emails_history_purge: max_rows must be at least 1.', 1;
        END;
    IF @max_rows IS NULL AND (@@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0)
        BEGIN
            THROW 51001, N'queue.emails_history_purge: max_rows is required in a transaction.', 1;
        END;
    SET XACT_ABORT ON;
    -- The purge, not a completing consumer, is the victim of any deadlock (restored on return).
    SET DEADLOCK_PRIORITY LOW;

    -- Default: the retention of option history_retention_days (30).
    SET @older_than = COALESCE(@older_than, DATEADD(DAY, -30, SYSUTCDATETIME()));
    DECLARE @after_finished datetime2(7) = '0001-01-01';
    DECLARE @after_id bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE (history_id bigint NOT NULL PRIMARY KEY, finished_at datetime2(7) NOT NULL);

    -- A range at the start of the clustered index (finished_at, history_id), oldest first, in
    -- chunks below the lock-escalation threshold, each from where the last one ended.
    WHILE @chunk > 0
        BEGIN
            SET @chunk = IIF(@max_rows IS NULL OR @max_rows - @purged > 1000, 1000, @max_rows - @purged);
            DELETE FROM @deleted;
            WITH doomed AS (
                SELECT TOP (@chunk)
                    h.history_id,
                    h.finished_at
                FROM [queue].[emails_history] AS h WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                WHERE
                    h.finished_at >= @after_finished AND h.finished_at < @older_than
                    AND NOT (h.finished_at = @after_finished AND h.history_id <= @after_id)
                ORDER BY h.finished_at, h.history_id
            )

            DELETE FROM doomed
            OUTPUT DELETED.history_id, DELETED.finished_at INTO @deleted (history_id, finished_at);
            SET @chunk = @@ROWCOUNT;
            SET @purged = @purged + @chunk;
            SELECT TOP (1)
                @after_finished = d.finished_at,
                @after_id = d.history_id
            FROM @deleted AS d
            ORDER BY d.finished_at DESC, d.history_id DESC;
        END;

    SELECT @purged AS purged;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[emails_history_purge] TO [queue_admin];
GO
