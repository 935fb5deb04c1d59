-- tablequeue 0.2.0 | generated: do not edit
-- template: mssql/work.sql | dialect: mssql | kind: work | queue: queue.thumbnails
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

-- tablequeue:unit queue.thumbnails storage v4 table
-- tablequeue:shape kind=work payload=json dedupe=off priority=on client_ids=on

IF OBJECT_ID(N'[queue].[thumbnails]', N'U') IS NULL
    BEGIN
        CREATE TABLE [queue].[thumbnails] (
            -- Client-supplied GUIDs (Pintér) are random: clustered on them, inserts would split
            -- pages all over the table. seq keeps inserts appending and breaks claim-order ties.
            id uniqueidentifier NOT NULL,
            seq bigint IDENTITY (1, 1) NOT NULL,
            enqueued_at datetime2(7) NOT NULL
            CONSTRAINT [df_thumbnails_enqueued_at] DEFAULT (SYSUTCDATETIME()),
            -- The scheduled start as enqueued (dequeue returns it).
            due_at datetime2(7) NOT NULL,
            -- When the message may next be claimed: due_at, then the lease's expiry while leased,
            -- then the retry time after a fail.
            visible_at datetime2(7) NOT NULL,
            priority int NOT NULL
            CONSTRAINT [df_thumbnails_priority] DEFAULT (0),
            attempts int NOT NULL
            CONSTRAINT [df_thumbnails_attempts] DEFAULT (0),
            leased_by nvarchar(200) NULL,
            leased_at datetime2(7) NULL,
            -- The lease's fencing token, new for every lease: complete, fail, extend_lease and
            -- release given a token act only while it is the message's current one.
            lease_token uniqueidentifier NULL,
            last_error nvarchar(4000) NULL,
            payload nvarchar(MAX) NOT NULL,
            CONSTRAINT [ck_thumbnails_payload_json] CHECK (ISJSON(payload) = 1),
            CONSTRAINT [pk_thumbnails] PRIMARY KEY NONCLUSTERED (id)
        );

        CREATE UNIQUE CLUSTERED INDEX [ux_thumbnails_seq]
            ON [queue].[thumbnails] (seq);

        -- The claim's exact WHERE and ORDER BY, of the messages nobody leases: filtered, so that a
        -- lease moves a message's entry out of it into the lease index instead of moving its key
        -- within it (docs/queue-kinds.md, What a lease writes).
        -- One priority level per seek.
        CREATE NONCLUSTERED INDEX [ix_thumbnails_ready_priority]
            ON [queue].[thumbnails] (priority DESC, visible_at, seq)
            WHERE leased_by IS NULL;

        -- Leased rows only: a worker's own messages (the restart path), the in-flight count and
        -- the look for expired leases (dequeue, at most once a second per session).
        CREATE NONCLUSTERED INDEX [ix_thumbnails_lease]
            ON [queue].[thumbnails] (leased_by, visible_at, seq)
            WHERE leased_by IS NOT NULL;

        -- Appending to an ever-increasing key latches the last page; past ~8 concurrent producers
        -- that is the bottleneck (NServiceBus.SqlServer #624). SQL Server 2019+ and Azure can queue
        -- the waiters fairly; 2017 cannot, hence the guard (a literal: nothing is concatenated).
        IF CONVERT(int, SERVERPROPERTY('ProductMajorVersion')) >= 15 OR SERVERPROPERTY('EngineEdition') IN (5, 8)
            BEGIN
                EXEC (N'ALTER INDEX [ux_thumbnails_seq] ON [queue].[thumbnails] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);'); -- noqa: LT05
            END;
    END;
GO

-- tablequeue:unit queue.thumbnails_items storage v1 type
-- tablequeue:shape kind=work payload=json

-- One shape whatever the options; columns an option does not use must be NULL (enqueue_batch
-- checks). dedupe_key is wider than the table's so that an over-long key reaches the procedure's
-- check (and its error number) instead of failing in the driver.
IF TYPE_ID(N'[queue].[thumbnails_items]') IS NULL
    BEGIN
        CREATE TYPE [queue].[thumbnails_items] AS TABLE (
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

-- tablequeue:unit queue.thumbnails_acks storage v1 type
-- tablequeue:shape kind=work client_ids=on

-- complete_batch and fail_batch: one message each, by id with its lease token (NULL: the worker's
-- name alone, as 0.1.0 checked). No key on id and no NOT NULL: an id given twice or a NULL id
-- reaches the procedure, which refuses it naming the queue (the type would fail in the driver,
-- naming neither).
IF TYPE_ID(N'[queue].[thumbnails_acks]') IS NULL
    BEGIN
        CREATE TYPE [queue].[thumbnails_acks] AS TABLE (
            id uniqueidentifier NULL,
            lease_token uniqueidentifier NULL
        );
    END;
GO

-- tablequeue:unit queue.thumbnails_dead storage v2 table
-- tablequeue:shape kind=work payload=json dedupe=off priority=on client_ids=on

IF OBJECT_ID(N'[queue].[thumbnails_dead]', N'U') IS NULL
    BEGIN
        -- Messages that used up max_attempts: a last fail, or a lease that expired once too often.
        -- Few inserts, paged reads by id (dead_list). Client ids are random GUIDs: clustered on them,
        -- every insert would land on a random page and split it. dead_seq keeps inserts appending;
        -- the primary key on id, nonclustered, is what dead_list, dead_requeue and dead_delete seek.
        -- No OPTIMIZE_FOR_SEQUENTIAL_KEY (the queue table has it): dead letters arrive one per
        -- message transaction, never in a convoy on the last page.
        CREATE TABLE [queue].[thumbnails_dead] (
            id uniqueidentifier NOT NULL,
            dead_seq bigint IDENTITY (1, 1) NOT NULL,
            enqueued_at datetime2(7) NOT NULL,
            due_at datetime2(7) NOT NULL,
            priority int NOT NULL,
            attempts int NOT NULL,
            last_error nvarchar(4000) NULL,
            last_worker nvarchar(200) NULL,
            dead_at datetime2(7) NOT NULL,
            payload nvarchar(MAX) NOT NULL,
            CONSTRAINT [pk_thumbnails_dead] PRIMARY KEY NONCLUSTERED (id)
        );

        CREATE UNIQUE CLUSTERED INDEX [ux_thumbnails_dead_seq]
            ON [queue].[thumbnails_dead] (dead_seq);
    END;
GO

-- tablequeue:unit queue.thumbnails_enqueue code

CREATE OR ALTER PROCEDURE [queue].[thumbnails_enqueue]
    @payload nvarchar(MAX),
    @due_at datetime2(7) = NULL,
    @dedupe_key nvarchar(MAX) = NULL,
    @priority int = NULL,
    @id uniqueidentifier = NULL,
    @enqueued_at datetime2(7) = NULL
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
            SET @error_message = N'queue.thumbnails_enqueue: payload must not be NULL and must be valid JSON.';
            THROW 51002, @error_message, 1;
        END;
    IF @dedupe_key IS NOT NULL
        BEGIN
            SET @error_message = N'queue.thumbnails_enqueue: dedupe_key needs option dedupe.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @effective_due_at datetime2(7) = COALESCE(@due_at, @now);
    DECLARE @new_id uniqueidentifier = COALESCE(@id, NEWID());
    DECLARE @existing_id uniqueidentifier;
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens, and the verb neither commits nor ends it (a BEGIN
        -- TRANSACTION there would only nest in it: its COMMIT would commit nothing).
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0 AND (@id IS NOT NULL)
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- A client id that is queued already: the same message enqueued again.
        IF @existing_id IS NULL AND @id IS NOT NULL
            BEGIN
                SELECT @existing_id = m.id
                FROM [queue].[thumbnails] AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.id = @id;
            END;

        IF @existing_id IS NULL
            BEGIN
                INSERT INTO [queue].[thumbnails] (
                    id, enqueued_at, due_at, visible_at, priority, payload
                )
                VALUES (
                    @new_id, COALESCE(@enqueued_at, @now),
                    @effective_due_at,
                    @effective_due_at,
                    COALESCE(@priority, 0),
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
        COALESCE(@existing_id, @new_id) AS id,
        CONVERT(bit, IIF(@existing_id IS NULL, 0, 1)) AS duplicate;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_enqueue] TO [queue_producer];
GO

-- tablequeue:unit queue.thumbnails_enqueue_batch code

CREATE OR ALTER PROCEDURE [queue].[thumbnails_enqueue_batch]
    @items [queue].[thumbnails_items] READONLY
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF (SELECT COUNT_BIG(*) FROM @items) > 1000
        BEGIN
            THROW 51001, N'queue.thumbnails_enqueue_batch: at most 1000 items per call.', 1;
        END;

    DECLARE @bad_ordinal int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE i.payload IS NULL OR ISJSON(i.payload) = 0
    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_enqueue_batch: item ',
                @bad_ordinal,
                N' has a NULL or invalid JSON payload.'
            );
            THROW 51002, @error_message, 1;
        END;

    IF (SELECT COUNT(i.dedupe_key) FROM @items AS i) > 0
        BEGIN
            SET @error_message = N'queue.thumbnails_enqueue_batch: dedupe_key needs option dedupe.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    -- One row per item: the id it gets, or the queued message it duplicates.
    DECLARE @staged TABLE (
        ordinal int NOT NULL PRIMARY KEY,
        new_id uniqueidentifier NOT NULL,
        first_ordinal int NULL,
        existing_id uniqueidentifier NULL,
        assigned_id uniqueidentifier NULL
    );
    DECLARE @given_ids TABLE (id uniqueidentifier NOT NULL PRIMARY KEY);
    DECLARE @started_transaction bit = 0;

    INSERT INTO @staged (ordinal, new_id)
    SELECT
        i.ordinal,
        COALESCE(i.id, NEWID()) AS new_id
    FROM @items AS i;

    -- A later item with the key or the client id of an earlier one duplicates that one.
    UPDATE s
    SET
        s.first_ordinal = (
            SELECT MIN(e.ordinal)
            FROM @staged AS e
            WHERE
                e.ordinal < s.ordinal
                AND (e.new_id = s.new_id)
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

    INSERT INTO @given_ids (id)
    SELECT DISTINCT s.new_id
    FROM @staged AS s
    INNER JOIN @items AS i ON s.ordinal = i.ordinal
    WHERE i.id IS NOT NULL;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- Client ids that are queued already, locked in id order as the keys are.
        UPDATE s
        SET s.existing_id = m.id
        FROM @given_ids AS g
        INNER JOIN [queue].[thumbnails] AS m WITH (UPDLOCK, HOLDLOCK) ON g.id = m.id
        INNER JOIN @staged AS s ON g.id = s.new_id
        WHERE s.existing_id IS NULL
        OPTION (LOOP JOIN, FORCE ORDER);

        INSERT INTO [queue].[thumbnails] (
            id, enqueued_at, due_at, visible_at, priority, payload
        )
        SELECT
            s.new_id,
            COALESCE(i.enqueued_at, @now) AS enqueued_at,
            COALESCE(i.due_at, @now) AS due_at,
            COALESCE(i.due_at, @now) AS visible_at,
            COALESCE(i.priority, 0) AS priority,
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

    UPDATE @staged
    SET assigned_id = new_id
    WHERE existing_id IS NULL AND first_ordinal IS NULL;

    SELECT
        s.ordinal,
        COALESCE(s.assigned_id, s.existing_id, f.assigned_id, f.existing_id) AS id,
        CONVERT(bit, IIF(s.assigned_id IS NULL, 1, 0)) AS duplicate
    FROM @staged AS s
    LEFT JOIN @staged AS f ON s.first_ordinal = f.ordinal
    ORDER BY s.ordinal;
END;
GO

GRANT EXECUTE ON TYPE::[queue].[thumbnails_items] TO [queue_producer];
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_enqueue_batch] TO [queue_producer];
GO

-- tablequeue:unit queue.thumbnails_dequeue code

-- A dequeue by worker W first takes back W's own unfinished messages: by asking, W declares that it
-- holds nothing else. A worker name is therefore one single-threaded consumer at a time.
-- lease_token identifies the lease: complete, fail, extend_lease and release take it back, and a
-- live lease handed out again is the same lease with the same token.
-- @worker is one character wider than leased_by, so that an over-long name reaches the check
-- (invalid_argument) instead of being cut to 200 characters silently.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_dequeue]
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
                N'queue.thumbnails_dequeue: batch_size must be between 1 and 1000, got ',
                COALESCE(CONVERT(nvarchar(12), @batch_size), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_dequeue: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @lease_seconds = COALESCE(@lease_seconds, 120);
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 1 AND 604800
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_dequeue: lease_seconds must be between 1 and 604800, got ',
                COALESCE(CONVERT(nvarchar(12), @lease_seconds), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @claimed TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        seq bigint NOT NULL,
        own bit NOT NULL,
        priority int NOT NULL,
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
    DECLARE @priority int;
    DECLARE @started_transaction bit = 0;
    DECLARE @next_look sql_variant = SESSION_CONTEXT(N'tablequeue.queue.thumbnails.expired');
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
    DECLARE @buried TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        priority int NOT NULL,
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL,
        payload nvarchar(MAX) NOT NULL
    );
    DECLARE @buried_count int = 0;
    -- This session's look for expired leases, when due, is recorded first (record_look).
    IF @look_due = 1
        BEGIN
            SET @look_after = DATEADD(SECOND, 1, @now);
            SET XACT_ABORT OFF;
            BEGIN TRY
                -- Not transactional: a caller that rolls back still waits its second.
                EXEC sys.sp_set_session_context
                    @key = N'tablequeue.queue.thumbnails.expired',
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
                m.seq,
                m.priority,
                m.enqueued_at,
                m.due_at,
                m.visible_at,
                m.attempts,
                m.leased_by,
                m.leased_at,
                m.lease_token,
                m.payload
            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.leased_by = @worker AND m.leased_by IS NOT NULL
            ORDER BY m.visible_at, m.seq
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
            INSERTED.seq,
            1,
            INSERTED.priority,
            DELETED.visible_at,
            DELETED.leased_by,
            INSERTED.enqueued_at,
            INSERTED.due_at,
            INSERTED.attempts,
            INSERTED.lease_token,
            INSERTED.payload
        INTO @claimed (
            id, seq, own, priority, previous_visible_at, previous_worker,
            enqueued_at, due_at, attempts, lease_token, payload
        );

        SET @exhausted = (
            SELECT COUNT(*)
            FROM @claimed AS c
            WHERE c.attempts > 4 AND c.previous_visible_at <= @now
        );
        IF @exhausted > 0
            BEGIN
                -- A table variable keeps its rows through a rollback:
                -- a burial rolled back in an earlier pass of a retry
                -- (process after a deadlock) must leave none here.
                DELETE FROM @buried;

                DELETE m
                OUTPUT
                    DELETED.id,
                    DELETED.enqueued_at,
                    DELETED.due_at,
                    DELETED.priority,
                    c.attempts - 1,
                    N'lease expired',
                    c.previous_worker,
                    @now,
                    DELETED.payload
                INTO
                    @buried (
                        id, enqueued_at, due_at, priority, attempts,
                        last_error, last_worker, dead_at, payload
                    )
                FROM [queue].[thumbnails] AS m
                INNER JOIN @claimed AS c ON m.id = c.id
                WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                SET @buried_count = @@ROWCOUNT;

                IF @buried_count > 0
                    BEGIN
                        DELETE d
                        FROM [queue].[thumbnails_dead] AS d
                        INNER JOIN @buried AS b ON d.id = b.id;

                        INSERT INTO [queue].[thumbnails_dead] (
                            id, enqueued_at, due_at, priority, attempts,
                            last_error, last_worker, dead_at, payload
                        )
                        SELECT
                            id,
                            enqueued_at,
                            due_at,
                            priority,
                            attempts,
                            last_error,
                            last_worker,
                            dead_at,
                            payload
                        FROM @buried;

                        DELETE FROM @buried;
                    END;

                DELETE c
                FROM @claimed AS c
                WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
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
                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.leased_by IS NOT NULL
                            ORDER BY m.leased_by
                        );
                        WHILE @look_worker IS NOT NULL AND @remaining > 0
                            BEGIN
                                WITH expired_leases AS (
                                    SELECT TOP (@remaining)
                                        m.id,
                                        m.seq,
                                        m.priority,
                                        m.enqueued_at,
                                        m.due_at,
                                        m.visible_at,
                                        m.attempts,
                                        m.leased_by,
                                        m.leased_at,
                                        m.lease_token,
                                        m.payload
                                    FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE
                                        m.leased_by = @look_worker AND m.leased_by IS NOT NULL
                                        AND m.visible_at <= @now
                                    ORDER BY m.visible_at, m.seq
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
                                    INSERTED.seq,
                                    0,
                                    INSERTED.priority,
                                    DELETED.visible_at,
                                    DELETED.leased_by,
                                    INSERTED.enqueued_at,
                                    INSERTED.due_at,
                                    INSERTED.attempts,
                                    INSERTED.lease_token,
                                    INSERTED.payload
                                INTO @claimed (
                                    id, seq, own, priority, previous_visible_at, previous_worker,
                                    enqueued_at, due_at, attempts, lease_token, payload
                                );
                                IF @@ROWCOUNT = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                            WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                            ORDER BY m.leased_by
                                        );
                                        CONTINUE;
                                    END;
                                SET @buried_count = 0;
                                SET @exhausted = (
                                    SELECT COUNT(*)
                                    FROM @claimed AS c
                                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now
                                );
                                IF @exhausted > 0
                                    BEGIN
                                        -- A table variable keeps its rows through a rollback:
                                        -- a burial rolled back in an earlier pass of a retry
                                        -- (process after a deadlock) must leave none here.
                                        DELETE FROM @buried;

                                        DELETE m
                                        OUTPUT
                                            DELETED.id,
                                            DELETED.enqueued_at,
                                            DELETED.due_at,
                                            DELETED.priority,
                                            c.attempts - 1,
                                            N'lease expired',
                                            c.previous_worker,
                                            @now,
                                            DELETED.payload
                                        INTO
                                            @buried (
                                                id, enqueued_at, due_at, priority, attempts,
                                                last_error, last_worker, dead_at, payload
                                            )
                                        FROM [queue].[thumbnails] AS m
                                        INNER JOIN @claimed AS c ON m.id = c.id
                                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                                        SET @buried_count = @@ROWCOUNT;

                                        IF @buried_count > 0
                                            BEGIN
                                                DELETE d
                                                FROM [queue].[thumbnails_dead] AS d
                                                INNER JOIN @buried AS b ON d.id = b.id;

                                                INSERT INTO [queue].[thumbnails_dead] (
                                                    id, enqueued_at, due_at, priority, attempts,
                                                    last_error, last_worker, dead_at, payload
                                                )
                                                SELECT
                                                    id,
                                                    enqueued_at,
                                                    due_at,
                                                    priority,
                                                    attempts,
                                                    last_error,
                                                    last_worker,
                                                    dead_at,
                                                    payload
                                                FROM @buried;

                                                DELETE FROM @buried;
                                            END;

                                        DELETE c
                                        FROM @claimed AS c
                                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                                    END;
                                SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                                IF @buried_count = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
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
                            @key = N'tablequeue.queue.thumbnails.expired',
                            @value = NULL;
                    END;
            END;

        -- 3. Messages nobody leases (new, due, retried, released), on the filtered claim index, whose
        -- filter the claims repeat. A claimed row that goes to the dead-letter table frees its place in
        -- the batch: claim again until the batch is full or nothing visible is left.
        WHILE @remaining > 0
            BEGIN
                -- A loose index scan: one seek per priority level present, each claim an equality
                -- and range seek on (priority DESC, visible_at, seq). A single ORDER BY
                -- priority DESC would read past every delayed or leased row of the higher levels
                -- on each claim, and the whole index whenever nothing is ready.
                SET @claimed_now = 0;
                SET @priority = (
                    SELECT TOP (1) m.priority
                    FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.leased_by IS NULL
                    ORDER BY m.priority DESC
                );
                WHILE @priority IS NOT NULL AND @claimed_now < @remaining
                    BEGIN
                        WITH next_messages AS (
                            SELECT TOP (@remaining - @claimed_now)
                                m.id,
                                m.seq,
                                m.priority,
                                m.enqueued_at,
                                m.due_at,
                                m.visible_at,
                                m.attempts,
                                m.leased_by,
                                m.leased_at,
                                m.lease_token,
                                m.payload
                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now
                            ORDER BY m.visible_at, m.seq
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
                            INSERTED.seq,
                            0,
                            INSERTED.priority,
                            DELETED.visible_at,
                            DELETED.leased_by,
                            INSERTED.enqueued_at,
                            INSERTED.due_at,
                            INSERTED.attempts,
                            INSERTED.lease_token,
                            INSERTED.payload
                        INTO @claimed (
                            id, seq, own, priority, previous_visible_at, previous_worker,
                            enqueued_at, due_at, attempts, lease_token, payload
                        );
                        SET @claimed_now = @claimed_now + @@ROWCOUNT;
                        SET @priority = (
                            SELECT TOP (1) m.priority
                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.priority < @priority AND m.leased_by IS NULL
                            ORDER BY m.priority DESC
                        );
                    END;

                IF @claimed_now = 0 BREAK;

                SET @buried_count = 0;
                SET @exhausted = (
                    SELECT COUNT(*)
                    FROM @claimed AS c
                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now
                );
                IF @exhausted > 0
                    BEGIN
                        -- A table variable keeps its rows through a rollback:
                        -- a burial rolled back in an earlier pass of a retry
                        -- (process after a deadlock) must leave none here.
                        DELETE FROM @buried;

                        DELETE m
                        OUTPUT
                            DELETED.id,
                            DELETED.enqueued_at,
                            DELETED.due_at,
                            DELETED.priority,
                            c.attempts - 1,
                            N'lease expired',
                            c.previous_worker,
                            @now,
                            DELETED.payload
                        INTO
                            @buried (
                                id, enqueued_at, due_at, priority, attempts,
                                last_error, last_worker, dead_at, payload
                            )
                        FROM [queue].[thumbnails] AS m
                        INNER JOIN @claimed AS c ON m.id = c.id
                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                        SET @buried_count = @@ROWCOUNT;

                        IF @buried_count > 0
                            BEGIN
                                DELETE d
                                FROM [queue].[thumbnails_dead] AS d
                                INNER JOIN @buried AS b ON d.id = b.id;

                                INSERT INTO [queue].[thumbnails_dead] (
                                    id, enqueued_at, due_at, priority, attempts,
                                    last_error, last_worker, dead_at, payload
                                )
                                SELECT
                                    id,
                                    enqueued_at,
                                    due_at,
                                    priority,
                                    attempts,
                                    last_error,
                                    last_worker,
                                    dead_at,
                                    payload
                                FROM @buried;

                                DELETE FROM @buried;
                            END;

                        DELETE c
                        FROM @claimed AS c
                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
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
                        @key = N'tablequeue.queue.thumbnails.expired',
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
    ORDER BY c.own DESC, c.priority DESC, c.previous_visible_at ASC, c.seq ASC;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_dequeue] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_complete code

-- Only the holder of the live lease: a late complete, after the lease moved on, changes nothing.
-- @lease_token (from dequeue) fences it to that very lease; without it (NULL, deprecated: 0.1.0's
-- call) the worker's name alone is checked, which cannot tell a lease from the worker's next one.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_complete]
    @id uniqueidentifier,
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
                N'queue.thumbnails_complete: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DELETE FROM [queue].[thumbnails]
    WHERE
        id = @id AND leased_by = @worker AND visible_at > @now
        AND (@lease_token IS NULL OR lease_token = @lease_token);

    SELECT CONVERT(bit, @@ROWCOUNT) AS completed;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_complete] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_fail code

-- outcome: retrying | dead | lost (the caller's lease had expired or moved on: nothing changed).
-- @lease_token fences it to one lease, as complete's (NULL: the worker's name alone, deprecated).
CREATE OR ALTER PROCEDURE [queue].[thumbnails_fail]
    @id uniqueidentifier,
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
                N'queue.thumbnails_fail: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @retry_after_seconds = COALESCE(@retry_after_seconds, 0);
    IF @retry_after_seconds NOT BETWEEN 0 AND 2592000
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_fail: retry_after_seconds must be between 0 and 2592000, got ',
                @retry_after_seconds,
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @outcome varchar(8);
    DECLARE @buried TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        priority int NOT NULL,
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL,
        payload nvarchar(MAX) NOT NULL
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

        UPDATE [queue].[thumbnails]
        SET
            leased_by = NULL,
            lease_token = NULL,
            visible_at = DATEADD(SECOND, @retry_after_seconds, @now),
            last_error = @error
        WHERE
            id = @id AND leased_by = @worker AND visible_at > @now
            AND (@lease_token IS NULL OR lease_token = @lease_token)
            AND attempts < 4;

        IF @@ROWCOUNT = 1
            BEGIN
                SET @outcome = 'retrying';
            END;
        ELSE
            BEGIN
                -- A table variable keeps its rows through a rollback:
                -- a burial rolled back in an earlier pass of a retry
                -- (process after a deadlock) must leave none here.
                DELETE FROM @buried;

                DELETE m
                OUTPUT
                    DELETED.id,
                    DELETED.enqueued_at,
                    DELETED.due_at,
                    DELETED.priority,
                    DELETED.attempts,
                    @error,
                    DELETED.leased_by,
                    @now,
                    DELETED.payload
                INTO
                    @buried (
                        id, enqueued_at, due_at, priority, attempts,
                        last_error, last_worker, dead_at, payload
                    )
                FROM [queue].[thumbnails] AS m
                WHERE
                    m.id = @id AND m.leased_by = @worker AND m.visible_at > @now
                    AND (@lease_token IS NULL OR m.lease_token = @lease_token);
                SET @buried_count = @@ROWCOUNT;

                IF @buried_count > 0
                    BEGIN
                        DELETE d
                        FROM [queue].[thumbnails_dead] AS d
                        INNER JOIN @buried AS b ON d.id = b.id;

                        INSERT INTO [queue].[thumbnails_dead] (
                            id, enqueued_at, due_at, priority, attempts,
                            last_error, last_worker, dead_at, payload
                        )
                        SELECT
                            id,
                            enqueued_at,
                            due_at,
                            priority,
                            attempts,
                            last_error,
                            last_worker,
                            dead_at,
                            payload
                        FROM @buried;

                        DELETE FROM @buried;
                    END;
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

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_fail] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_extend_lease code

-- The new lease runs from now, under the same token. An extend begun after the lease expired cannot
-- revive it: another worker may hold it. @lease_token fences it to one lease, as complete's (NULL: deprecated).
CREATE OR ALTER PROCEDURE [queue].[thumbnails_extend_lease]
    @id uniqueidentifier,
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
                N'queue.thumbnails_extend_lease: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @lease_seconds = COALESCE(@lease_seconds, 120);
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 1 AND 604800
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_extend_lease: lease_seconds must be between 1 and 604800, got ',
                COALESCE(CONVERT(nvarchar(12), @lease_seconds), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    UPDATE [queue].[thumbnails]
    SET visible_at = DATEADD(SECOND, @lease_seconds, @now)
    WHERE
        id = @id AND leased_by = @worker AND visible_at > @now
        AND (@lease_token IS NULL OR lease_token = @lease_token);

    SELECT CONVERT(bit, @@ROWCOUNT) AS extended;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_extend_lease] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_release code

-- Gives a leased message back at once, with the attempt its lease counted (a consumer shutting down
-- gracefully spends none): visible now, to any worker. Only the holder of the live lease, fenced by
-- @lease_token as complete's (NULL: the worker's name alone, deprecated); otherwise released = 0
-- and nothing changes.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_release]
    @id uniqueidentifier,
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
                N'queue.thumbnails_release: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    UPDATE [queue].[thumbnails]
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

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_release] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_lease_status code

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
CREATE OR ALTER PROCEDURE [queue].[thumbnails_lease_status]
    @acks [queue].[thumbnails_acks] READONLY
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF (SELECT COUNT_BIG(*) FROM @acks) > 1000
        BEGIN
            THROW 51001, N'queue.thumbnails_lease_status: at most 1000 items per call.', 1;
        END;
    DECLARE @null_ids int = (
        SELECT COUNT(*)
        FROM @acks AS a
        WHERE a.id IS NULL
    );
    IF @null_ids > 0
        BEGIN
            SET @error_message = N'queue.thumbnails_lease_status: acks holds a NULL id.';
            THROW 51001, @error_message, 1;
        END;
    DECLARE @repeated_id uniqueidentifier = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        GROUP BY a.id
        HAVING COUNT(*) > 1
        ORDER BY a.id
    );
    IF @repeated_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_lease_status: acks holds id ',
                @repeated_id,
                N' more than once.'
            );
            THROW 51001, @error_message, 1;
        END;
    DECLARE @tokenless_id uniqueidentifier = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        WHERE a.lease_token IS NULL
        ORDER BY a.id
    );
    IF @tokenless_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_lease_status: the lease token of id ',
                @tokenless_id,
                N' is NULL.'
            );
            THROW 51001, @error_message, 1;
        END;
    -- No SET XACT_ABORT ON: the verb changes nothing, so a lock timeout (1222) in its reads ends
    -- the call (TRY, then THROW) and leaves a caller's transaction as it was; under XACT_ABORT ON it
    -- would roll that transaction back.

    DECLARE @batch TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO @batch (id, lease_token)
    SELECT
        a.id,
        a.lease_token
    FROM @acks AS a;
    DECLARE @found TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL,
        visible_at datetime2(7) NOT NULL
    );
    DECLARE @located TABLE (
        seq bigint NOT NULL PRIMARY KEY,
        id uniqueidentifier NOT NULL
    );
    DECLARE @answers TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        status varchar(7) NOT NULL
    );
    DECLARE @requeued TABLE (id uniqueidentifier NOT NULL PRIMARY KEY);

    BEGIN TRY
        -- The wait: locking reads (READCOMMITTEDLOCK: also where the database runs
        -- READ_COMMITTED_SNAPSHOT, whose row versions would answer at once), one seek per item in
        -- id order, each shared lock released once its row is read: a transaction holding a row (a
        -- complete, fail or release in flight) is waited for.
        -- Two reads, the primary key's entries, then the clustered rows by seq: a join through the
        -- nonclustered key would hold the key's lock while its lookup waits for the clustered row,
        -- and deadlock with an acknowledgement that holds the row and deletes the key.
        INSERT INTO @located (seq, id)
        SELECT
            m.seq,
            m.id
        FROM @batch AS b
        INNER JOIN [queue].[thumbnails] AS m WITH (INDEX ([pk_thumbnails]), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON b.id = m.id
        OPTION (LOOP JOIN, FORCE ORDER);

        INSERT INTO @found (id, lease_token, visible_at)
        SELECT
            m.id,
            m.lease_token,
            m.visible_at
        FROM @located AS l
        INNER JOIN [queue].[thumbnails] AS m WITH (INDEX ([ux_thumbnails_seq]), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON l.seq = m.seq
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
                    FROM [queue].[thumbnails_dead] AS d WITH (INDEX ([pk_thumbnails_dead]), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
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
        INNER JOIN [queue].[thumbnails] AS q WITH (INDEX ([pk_thumbnails]), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
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

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_lease_status] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_complete_batch code

-- complete for up to 1,000 messages in one statement: each item by its id and lease token (NULL:
-- the worker's name alone, deprecated), fenced as complete is; one row per item, in id order:
-- completed = 0 where the lease was lost (nothing changed for that item).
CREATE OR ALTER PROCEDURE [queue].[thumbnails_complete_batch]
    @acks [queue].[thumbnails_acks] READONLY,
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
                N'queue.thumbnails_complete_batch: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF (SELECT COUNT_BIG(*) FROM @acks) > 1000
        BEGIN
            THROW 51001, N'queue.thumbnails_complete_batch: at most 1000 items per call.', 1;
        END;
    DECLARE @null_ids int = (
        SELECT COUNT(*)
        FROM @acks AS a
        WHERE a.id IS NULL
    );
    IF @null_ids > 0
        BEGIN
            SET @error_message = N'queue.thumbnails_complete_batch: acks holds a NULL id.';
            THROW 51001, @error_message, 1;
        END;
    DECLARE @repeated_id uniqueidentifier = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        GROUP BY a.id
        HAVING COUNT(*) > 1
        ORDER BY a.id
    );
    IF @repeated_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_complete_batch: acks holds id ',
                @repeated_id,
                N' more than once.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @batch TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO @batch (id, lease_token)
    SELECT
        a.id,
        a.lease_token
    FROM @acks AS a;
    DECLARE @completed TABLE (id uniqueidentifier NOT NULL PRIMARY KEY);

    DELETE m
    OUTPUT DELETED.id INTO @completed (id)
    FROM @batch AS b
    INNER JOIN [queue].[thumbnails] AS m WITH (ROWLOCK) ON b.id = m.id
    WHERE
        m.leased_by = @worker AND m.visible_at > @now
        AND (b.lease_token IS NULL OR m.lease_token = b.lease_token)
    OPTION (LOOP JOIN, FORCE ORDER);

    SELECT
        b.id,
        CONVERT(bit, IIF(c.id IS NULL, 0, 1)) AS completed
    FROM @batch AS b
    LEFT JOIN @completed AS c ON b.id = c.id
    ORDER BY b.id;
END;
GO

-- The acks type serves fail_batch and lease_status too (the same role).
GRANT EXECUTE ON TYPE::[queue].[thumbnails_acks] TO [queue_consumer];
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_complete_batch] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_fail_batch code

-- fail for up to 1,000 messages, all with the same error and retry delay: each item by its id and
-- lease token (NULL: the worker's name alone, deprecated), fenced as fail is. One row per item, in
-- id order: outcome retrying | dead | lost (the lease was lost: nothing changed for that item).
CREATE OR ALTER PROCEDURE [queue].[thumbnails_fail_batch]
    @acks [queue].[thumbnails_acks] READONLY,
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
                N'queue.thumbnails_fail_batch: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @retry_after_seconds = COALESCE(@retry_after_seconds, 0);
    IF @retry_after_seconds NOT BETWEEN 0 AND 2592000
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_fail_batch: retry_after_seconds must be between 0 and 2592000, got ',
                @retry_after_seconds,
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF (SELECT COUNT_BIG(*) FROM @acks) > 1000
        BEGIN
            THROW 51001, N'queue.thumbnails_fail_batch: at most 1000 items per call.', 1;
        END;
    DECLARE @null_ids int = (
        SELECT COUNT(*)
        FROM @acks AS a
        WHERE a.id IS NULL
    );
    IF @null_ids > 0
        BEGIN
            SET @error_message = N'queue.thumbnails_fail_batch: acks holds a NULL id.';
            THROW 51001, @error_message, 1;
        END;
    DECLARE @repeated_id uniqueidentifier = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        GROUP BY a.id
        HAVING COUNT(*) > 1
        ORDER BY a.id
    );
    IF @repeated_id IS NOT NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_fail_batch: acks holds id ',
                @repeated_id,
                N' more than once.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @batch TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO @batch (id, lease_token)
    SELECT
        a.id,
        a.lease_token
    FROM @acks AS a;
    -- The messages whose lease the caller held, with the attempts they had used.
    DECLARE @held TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        attempts int NOT NULL
    );
    DECLARE @buried TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        priority int NOT NULL,
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL,
        payload nvarchar(MAX) NOT NULL
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
            m.leased_by = IIF(m.attempts < 4, NULL, m.leased_by),
            m.lease_token = IIF(m.attempts < 4, NULL, m.lease_token),
            m.visible_at = IIF(m.attempts < 4, DATEADD(SECOND, @retry_after_seconds, @now), m.visible_at),
            m.last_error = @error
        OUTPUT
            INSERTED.id,
            INSERTED.attempts
        INTO @held (id, attempts)
        FROM @batch AS b
        INNER JOIN [queue].[thumbnails] AS m WITH (ROWLOCK) ON b.id = m.id
        WHERE
            m.leased_by = @worker AND m.visible_at > @now
            AND (b.lease_token IS NULL OR m.lease_token = b.lease_token)
        OPTION (LOOP JOIN, FORCE ORDER);

        -- 2. Those on their last attempt to the dead-letter table: rows this transaction holds
        -- already (step 1). On a client-id queue the seek also takes the nonclustered primary key
        -- entry again, which a late single verb on that message may hold while it waits for the
        -- row: a deadlock one of the two retries (docs/errors.md).
        -- A table variable keeps its rows through a rollback:
        -- a burial rolled back in an earlier pass of a retry
        -- (process after a deadlock) must leave none here.
        DELETE FROM @buried;

        DELETE m
        OUTPUT
            DELETED.id,
            DELETED.enqueued_at,
            DELETED.due_at,
            DELETED.priority,
            DELETED.attempts,
            @error,
            DELETED.leased_by,
            @now,
            DELETED.payload
        INTO
            @buried (
                id, enqueued_at, due_at, priority, attempts,
                last_error, last_worker, dead_at, payload
            )
        FROM @held AS h
        INNER JOIN [queue].[thumbnails] AS m ON h.id = m.id
        WHERE h.attempts >= 4
        OPTION (LOOP JOIN, FORCE ORDER);
        SET @buried_count = @@ROWCOUNT;

        IF @buried_count > 0
            BEGIN
                DELETE d
                FROM [queue].[thumbnails_dead] AS d
                INNER JOIN @buried AS b ON d.id = b.id;

                INSERT INTO [queue].[thumbnails_dead] (
                    id, enqueued_at, due_at, priority, attempts,
                    last_error, last_worker, dead_at, payload
                )
                SELECT
                    id,
                    enqueued_at,
                    due_at,
                    priority,
                    attempts,
                    last_error,
                    last_worker,
                    dead_at,
                    payload
                FROM @buried;

                DELETE FROM @buried;
            END;

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
            WHEN h.attempts < 4 THEN 'retrying'
            ELSE 'dead'
        END) AS outcome
    FROM @batch AS b
    LEFT JOIN @held AS h ON b.id = h.id
    ORDER BY b.id;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_fail_batch] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_complete_next code

-- complete, then dequeue, in one transaction: one commit per message instead of two. The complete
-- is fenced as complete's (@lease_token NULL: the worker's name alone, deprecated) and its outcome
-- is previous_completed; the dequeue is dequeue's (the worker's own unfinished messages first). The
-- rows are dequeue's, each with previous_completed; with nothing to lease, one row whose id (and
-- every other dequeue column) is NULL carries it.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_complete_next]
    @id uniqueidentifier,
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
                N'queue.thumbnails_complete_next: batch_size must be between 1 and 1000, got ',
                COALESCE(CONVERT(nvarchar(12), @batch_size), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_complete_next: ',
                N'worker must be a name of 1 to 200 characters.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET @lease_seconds = COALESCE(@lease_seconds, 120);
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 1 AND 604800
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_complete_next: lease_seconds must be between 1 and 604800, got ',
                COALESCE(CONVERT(nvarchar(12), @lease_seconds), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    DECLARE @claimed TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        seq bigint NOT NULL,
        own bit NOT NULL,
        priority int NOT NULL,
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
    DECLARE @priority int;
    DECLARE @started_transaction bit = 0;
    DECLARE @next_look sql_variant = SESSION_CONTEXT(N'tablequeue.queue.thumbnails.expired');
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
    DECLARE @buried TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        priority int NOT NULL,
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL,
        payload nvarchar(MAX) NOT NULL
    );
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
                    @key = N'tablequeue.queue.thumbnails.expired',
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
        DELETE FROM [queue].[thumbnails]
        WHERE
            id = @id AND leased_by = @worker AND visible_at > @now
            AND (@lease_token IS NULL OR lease_token = @lease_token);
        SET @previous_completed = CONVERT(bit, @@ROWCOUNT);

        -- 1. Own messages first. `leased_by IS NOT NULL` repeats the filter of the filtered index,
        -- so that the optimizer can match it whatever @worker is.
        WITH own_messages AS (
            SELECT TOP (@remaining)
                m.id,
                m.seq,
                m.priority,
                m.enqueued_at,
                m.due_at,
                m.visible_at,
                m.attempts,
                m.leased_by,
                m.leased_at,
                m.lease_token,
                m.payload
            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.leased_by = @worker AND m.leased_by IS NOT NULL
            ORDER BY m.visible_at, m.seq
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
            INSERTED.seq,
            1,
            INSERTED.priority,
            DELETED.visible_at,
            DELETED.leased_by,
            INSERTED.enqueued_at,
            INSERTED.due_at,
            INSERTED.attempts,
            INSERTED.lease_token,
            INSERTED.payload
        INTO @claimed (
            id, seq, own, priority, previous_visible_at, previous_worker,
            enqueued_at, due_at, attempts, lease_token, payload
        );

        SET @exhausted = (
            SELECT COUNT(*)
            FROM @claimed AS c
            WHERE c.attempts > 4 AND c.previous_visible_at <= @now
        );
        IF @exhausted > 0
            BEGIN
                -- A table variable keeps its rows through a rollback:
                -- a burial rolled back in an earlier pass of a retry
                -- (process after a deadlock) must leave none here.
                DELETE FROM @buried;

                DELETE m
                OUTPUT
                    DELETED.id,
                    DELETED.enqueued_at,
                    DELETED.due_at,
                    DELETED.priority,
                    c.attempts - 1,
                    N'lease expired',
                    c.previous_worker,
                    @now,
                    DELETED.payload
                INTO
                    @buried (
                        id, enqueued_at, due_at, priority, attempts,
                        last_error, last_worker, dead_at, payload
                    )
                FROM [queue].[thumbnails] AS m
                INNER JOIN @claimed AS c ON m.id = c.id
                WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                SET @buried_count = @@ROWCOUNT;

                IF @buried_count > 0
                    BEGIN
                        DELETE d
                        FROM [queue].[thumbnails_dead] AS d
                        INNER JOIN @buried AS b ON d.id = b.id;

                        INSERT INTO [queue].[thumbnails_dead] (
                            id, enqueued_at, due_at, priority, attempts,
                            last_error, last_worker, dead_at, payload
                        )
                        SELECT
                            id,
                            enqueued_at,
                            due_at,
                            priority,
                            attempts,
                            last_error,
                            last_worker,
                            dead_at,
                            payload
                        FROM @buried;

                        DELETE FROM @buried;
                    END;

                DELETE c
                FROM @claimed AS c
                WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
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
                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.leased_by IS NOT NULL
                            ORDER BY m.leased_by
                        );
                        WHILE @look_worker IS NOT NULL AND @remaining > 0
                            BEGIN
                                WITH expired_leases AS (
                                    SELECT TOP (@remaining)
                                        m.id,
                                        m.seq,
                                        m.priority,
                                        m.enqueued_at,
                                        m.due_at,
                                        m.visible_at,
                                        m.attempts,
                                        m.leased_by,
                                        m.leased_at,
                                        m.lease_token,
                                        m.payload
                                    FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE
                                        m.leased_by = @look_worker AND m.leased_by IS NOT NULL
                                        AND m.visible_at <= @now
                                    ORDER BY m.visible_at, m.seq
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
                                    INSERTED.seq,
                                    0,
                                    INSERTED.priority,
                                    DELETED.visible_at,
                                    DELETED.leased_by,
                                    INSERTED.enqueued_at,
                                    INSERTED.due_at,
                                    INSERTED.attempts,
                                    INSERTED.lease_token,
                                    INSERTED.payload
                                INTO @claimed (
                                    id, seq, own, priority, previous_visible_at, previous_worker,
                                    enqueued_at, due_at, attempts, lease_token, payload
                                );
                                IF @@ROWCOUNT = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                            WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                            ORDER BY m.leased_by
                                        );
                                        CONTINUE;
                                    END;
                                SET @buried_count = 0;
                                SET @exhausted = (
                                    SELECT COUNT(*)
                                    FROM @claimed AS c
                                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now
                                );
                                IF @exhausted > 0
                                    BEGIN
                                        -- A table variable keeps its rows through a rollback:
                                        -- a burial rolled back in an earlier pass of a retry
                                        -- (process after a deadlock) must leave none here.
                                        DELETE FROM @buried;

                                        DELETE m
                                        OUTPUT
                                            DELETED.id,
                                            DELETED.enqueued_at,
                                            DELETED.due_at,
                                            DELETED.priority,
                                            c.attempts - 1,
                                            N'lease expired',
                                            c.previous_worker,
                                            @now,
                                            DELETED.payload
                                        INTO
                                            @buried (
                                                id, enqueued_at, due_at, priority, attempts,
                                                last_error, last_worker, dead_at, payload
                                            )
                                        FROM [queue].[thumbnails] AS m
                                        INNER JOIN @claimed AS c ON m.id = c.id
                                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                                        SET @buried_count = @@ROWCOUNT;

                                        IF @buried_count > 0
                                            BEGIN
                                                DELETE d
                                                FROM [queue].[thumbnails_dead] AS d
                                                INNER JOIN @buried AS b ON d.id = b.id;

                                                INSERT INTO [queue].[thumbnails_dead] (
                                                    id, enqueued_at, due_at, priority, attempts,
                                                    last_error, last_worker, dead_at, payload
                                                )
                                                SELECT
                                                    id,
                                                    enqueued_at,
                                                    due_at,
                                                    priority,
                                                    attempts,
                                                    last_error,
                                                    last_worker,
                                                    dead_at,
                                                    payload
                                                FROM @buried;

                                                DELETE FROM @buried;
                                            END;

                                        DELETE c
                                        FROM @claimed AS c
                                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                                    END;
                                SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                                IF @buried_count = 0
                                    BEGIN
                                        SET @look_worker = (
                                            SELECT TOP (1) m.leased_by
                                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
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
                            @key = N'tablequeue.queue.thumbnails.expired',
                            @value = NULL;
                    END;
            END;

        -- 3. Messages nobody leases (new, due, retried, released), on the filtered claim index, whose
        -- filter the claims repeat. A claimed row that goes to the dead-letter table frees its place in
        -- the batch: claim again until the batch is full or nothing visible is left.
        WHILE @remaining > 0
            BEGIN
                -- A loose index scan: one seek per priority level present, each claim an equality
                -- and range seek on (priority DESC, visible_at, seq). A single ORDER BY
                -- priority DESC would read past every delayed or leased row of the higher levels
                -- on each claim, and the whole index whenever nothing is ready.
                SET @claimed_now = 0;
                SET @priority = (
                    SELECT TOP (1) m.priority
                    FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.leased_by IS NULL
                    ORDER BY m.priority DESC
                );
                WHILE @priority IS NOT NULL AND @claimed_now < @remaining
                    BEGIN
                        WITH next_messages AS (
                            SELECT TOP (@remaining - @claimed_now)
                                m.id,
                                m.seq,
                                m.priority,
                                m.enqueued_at,
                                m.due_at,
                                m.visible_at,
                                m.attempts,
                                m.leased_by,
                                m.leased_at,
                                m.lease_token,
                                m.payload
                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now
                            ORDER BY m.visible_at, m.seq
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
                            INSERTED.seq,
                            0,
                            INSERTED.priority,
                            DELETED.visible_at,
                            DELETED.leased_by,
                            INSERTED.enqueued_at,
                            INSERTED.due_at,
                            INSERTED.attempts,
                            INSERTED.lease_token,
                            INSERTED.payload
                        INTO @claimed (
                            id, seq, own, priority, previous_visible_at, previous_worker,
                            enqueued_at, due_at, attempts, lease_token, payload
                        );
                        SET @claimed_now = @claimed_now + @@ROWCOUNT;
                        SET @priority = (
                            SELECT TOP (1) m.priority
                            FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.priority < @priority AND m.leased_by IS NULL
                            ORDER BY m.priority DESC
                        );
                    END;

                IF @claimed_now = 0 BREAK;

                SET @buried_count = 0;
                SET @exhausted = (
                    SELECT COUNT(*)
                    FROM @claimed AS c
                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now
                );
                IF @exhausted > 0
                    BEGIN
                        -- A table variable keeps its rows through a rollback:
                        -- a burial rolled back in an earlier pass of a retry
                        -- (process after a deadlock) must leave none here.
                        DELETE FROM @buried;

                        DELETE m
                        OUTPUT
                            DELETED.id,
                            DELETED.enqueued_at,
                            DELETED.due_at,
                            DELETED.priority,
                            c.attempts - 1,
                            N'lease expired',
                            c.previous_worker,
                            @now,
                            DELETED.payload
                        INTO
                            @buried (
                                id, enqueued_at, due_at, priority, attempts,
                                last_error, last_worker, dead_at, payload
                            )
                        FROM [queue].[thumbnails] AS m
                        INNER JOIN @claimed AS c ON m.id = c.id
                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                        SET @buried_count = @@ROWCOUNT;

                        IF @buried_count > 0
                            BEGIN
                                DELETE d
                                FROM [queue].[thumbnails_dead] AS d
                                INNER JOIN @buried AS b ON d.id = b.id;

                                INSERT INTO [queue].[thumbnails_dead] (
                                    id, enqueued_at, due_at, priority, attempts,
                                    last_error, last_worker, dead_at, payload
                                )
                                SELECT
                                    id,
                                    enqueued_at,
                                    due_at,
                                    priority,
                                    attempts,
                                    last_error,
                                    last_worker,
                                    dead_at,
                                    payload
                                FROM @buried;

                                DELETE FROM @buried;
                            END;

                        DELETE c
                        FROM @claimed AS c
                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
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
                        @key = N'tablequeue.queue.thumbnails.expired',
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
    ORDER BY c.own DESC, c.priority DESC, c.previous_visible_at ASC, c.seq ASC;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_complete_next] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_wait code

-- Waiting instead of polling: a probe, then a pause of 50 ms, until a message is ready or wait_ms
-- have passed (the answer comes at most one pause after the timeout). It holds no lock and no
-- snapshot between its probes and never opens a transaction of its own: the caller dequeues
-- afterwards, in its own transaction. In IMPLICIT_TRANSACTIONS mode (a manual-commit caller) the
-- first probe opens the caller's implicit transaction, as any statement would; it holds nothing
-- (READ COMMITTED releases each probe's locks) and the caller ends it as usual. Called inside an
-- open transaction, the caller's own locks stay held while it waits: call it outside one.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_wait]
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
                N'queue.thumbnails_wait: wait_ms must be between 0 and 20000, got ',
                COALESCE(CONVERT(nvarchar(12), @wait_ms), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;

        END;
    SET XACT_ABORT ON;

    DECLARE @deadline datetime2(7) = DATEADD(MILLISECOND, @wait_ms, SYSUTCDATETIME());
    DECLARE @ready bit = 0;
    DECLARE @now datetime2(7);
    DECLARE @priority int;
    DECLARE @next_look sql_variant;
    DECLARE @look_due bit;
    DECLARE @look_after datetime2(7);
    DECLARE @look_worker nvarchar(200);

    WHILE 1 = 1
        BEGIN
            -- One seek per priority level present, as the claim walks them (a single range on
            -- visible_at would read every delayed or leased row of the higher levels).
            SET @now = SYSUTCDATETIME();
            SET @priority = (
                SELECT TOP (1) m.priority
                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.leased_by IS NULL
                ORDER BY m.priority DESC
            );
            WHILE @priority IS NOT NULL AND @ready = 0
                BEGIN
                    SELECT TOP (1) @ready = 1
                    FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now;
                    SET @priority = (
                        SELECT TOP (1) m.priority
                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.priority < @priority AND m.leased_by IS NULL
                        ORDER BY m.priority DESC
                    );
                END;
            IF @ready = 0
                BEGIN
                    SET @next_look = SESSION_CONTEXT(N'tablequeue.queue.thumbnails.expired');
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
                                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                WHERE m.leased_by IS NOT NULL
                                ORDER BY m.leased_by
                            );
                            WHILE @look_worker IS NOT NULL AND @ready = 0
                                BEGIN
                                    SELECT TOP (1) @ready = 1
                                    FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE
                                        m.leased_by = @look_worker AND m.leased_by IS NOT NULL
                                        AND m.visible_at <= @now;
                                    IF @ready = 0
                                        BEGIN
                                            SET @look_worker = (
                                                SELECT TOP (1) m.leased_by
                                                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
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
                                            @key = N'tablequeue.queue.thumbnails.expired',
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

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_wait] TO [queue_consumer];
GO

-- tablequeue:unit queue.thumbnails_stats code

-- EXECUTE AS OWNER: the estimate reads sys.partitions, whose rows a caller holding only the admin
-- role could not see. The procedure only reads.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_stats]
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
    -- counted on the claim index (filtered WHERE leased_by IS NULL), leased ones on ix_thumbnails_lease.
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
    DECLARE @level_oldest datetime2(7);
    DECLARE @priority int;
    SET @priority = (
        SELECT TOP (1) m.priority
        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.leased_by IS NULL
        ORDER BY m.priority DESC
    );

    -- One priority level at a time on the claim index, as the claim reads it, until both counts
    -- passed the limit (one that did counts no more); each level visited gives its oldest.
    WHILE @priority IS NOT NULL AND (@ready <= @exact_limit OR @delayed <= @exact_limit)
        BEGIN
            IF @ready <= @exact_limit
                SET @ready = @ready + (
                    SELECT COUNT_BIG(*)
                    FROM (
                        SELECT TOP (@exact_limit + 1 - @ready) m.seq
                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now
                    ) AS counted
                );
            IF @delayed <= @exact_limit
                SET @delayed = @delayed + (
                    SELECT COUNT_BIG(*)
                    FROM (
                        SELECT TOP (@exact_limit + 1 - @delayed) m.seq
                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at > @now
                    ) AS counted
                );
            SET @level_oldest = (
                SELECT TOP (1) m.visible_at
                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now
                ORDER BY m.visible_at ASC, m.seq ASC
            );
            IF @oldest_ready IS NULL OR @level_oldest < @oldest_ready SET @oldest_ready = @level_oldest;
            SET @priority = (
                SELECT TOP (1) m.priority
                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.priority < @priority AND m.leased_by IS NULL
                ORDER BY m.priority DESC
            );
        END;
    SET @ready_capped = IIF(@ready > @exact_limit, 1, 0);
    SET @delayed_capped = IIF(@delayed > @exact_limit, 1, 0);
    -- Expired leases are ready too, the oldest expiry maybe the oldest of all: one lease holder at a
    -- time on ix_thumbnails_lease (w.next_lease_holder), each holder's oldest first. The count
    -- reads at most the limit and one row over all holders; once past it, only each remaining
    -- holder's oldest (one seek): the oldest stays exact.
    DECLARE @expired bigint = 0;
    DECLARE @oldest_expired datetime2(7);
    DECLARE @holder_oldest datetime2(7);
    DECLARE @look_worker nvarchar(200);
    SET @look_worker = (
        SELECT TOP (1) m.leased_by
        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
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
                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.leased_by = @look_worker AND m.leased_by IS NOT NULL AND m.visible_at <= @now
                ORDER BY m.visible_at
            ) AS e;
            IF @oldest_expired IS NULL OR @holder_oldest < @oldest_expired SET @oldest_expired = @holder_oldest;
            SET @look_worker = (
                SELECT TOP (1) m.leased_by
                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
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
            SELECT TOP (@exact_limit + 1) m.seq
            FROM [queue].[thumbnails] AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.leased_by IS NOT NULL AND m.visible_at > @now
        ) AS counted
    );
    DECLARE @dead bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) d.id
            FROM [queue].[thumbnails_dead] AS d WITH (READPAST, READCOMMITTEDLOCK)
        ) AS counted
    );

    IF @ready_capped = 1 OR @delayed_capped = 1 OR @grouped_capped = 1 OR @in_flight > @exact_limit
        BEGIN
            DECLARE @total_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'[queue].[thumbnails]') AND p.index_id IN (0, 1)
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
                WHERE p.object_id = OBJECT_ID(N'[queue].[thumbnails_dead]') AND p.index_id IN (0, 1)
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

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_stats] TO [queue_admin];
GO

-- tablequeue:unit queue.thumbnails_purge code

-- Removes queued messages, leased ones too (their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_purge]
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
            THROW 51001, N'queue.thumbnails_purge: max_rows must be at least 1.', 1;
        END;
    IF @max_rows IS NULL AND (@@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0)
        BEGIN
            THROW 51001, N'queue.thumbnails_purge: max_rows is required in a transaction.', 1;
        END;
    SET XACT_ABORT ON;
    -- Purge can deadlock with consumers: it locks a row, then the row's other index entries, while
    -- claims (through the claim index) and complete, fail, extend_lease (through the
    -- nonclustered primary key) lock an entry first, then the row. The purge is the victim,
    -- never the consumer (restored when the procedure returns); a consumer's 1205 is retryable, and
    -- so is the purge's own: the chunks before it are committed, call it again.
    SET DEADLOCK_PRIORITY LOW;

    -- Chunks of at most 1,000 rows stay under the lock-escalation threshold, so consumers keep
    -- working; READPAST skips the rows a claim holds right now, but deleting a row also locks its
    -- index entries, where the purge can wait on a claim's lock until that claim's transaction
    -- ends. The bound stops a purge from chasing producers forever. Oldest first, in the clustered
    -- index's order (seq). Without max_rows each chunk commits on its own (inside a transaction
    -- max_rows is required: checked above).
    DECLARE @last bigint = (SELECT MAX(m.seq) FROM [queue].[thumbnails] AS m WITH (READPAST, READCOMMITTEDLOCK));
    DECLARE @after bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE (seq bigint NOT NULL PRIMARY KEY);

    WHILE @chunk > 0
        BEGIN
            SET @chunk = IIF(@max_rows IS NULL OR @max_rows - @purged > 1000, 1000, @max_rows - @purged);
            DELETE FROM @deleted;
            IF @older_than IS NULL
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk) m.seq
                        FROM [queue].[thumbnails] AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE m.seq > @after AND m.seq <= @last
                        ORDER BY m.seq
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.seq INTO @deleted (seq);
                    SET @chunk = @@ROWCOUNT;
                END;
            ELSE
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk) m.seq
                        FROM [queue].[thumbnails] AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE m.seq > @after AND m.seq <= @last AND m.enqueued_at < @older_than
                        ORDER BY m.seq
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.seq INTO @deleted (seq);
                    SET @chunk = @@ROWCOUNT;
                END;
            SET @purged = @purged + @chunk;
            SET @after = COALESCE((SELECT MAX(d.seq) FROM @deleted AS d), @after);
        END;

    SELECT @purged AS purged;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_purge] TO [queue_admin];
GO

-- tablequeue:unit queue.thumbnails_dead_list code

-- Paged by id: pass the last id of a page as after_id to read the next one. (page_size, not
-- `limit`: PostgreSQL reserves that word, and the parameter names are the same in both dialects.)
-- Pinned to the primary key on id: with client ids the table is clustered on dead_seq, and a plan
-- compiled while the table was small could scan and sort all of it for every page.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_dead_list]
    @after_id uniqueidentifier = NULL,
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
                N'queue.thumbnails_dead_list: page_size must be between 1 and 1000, got ',
                COALESCE(CONVERT(nvarchar(12), @page_size), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;
    -- A page reads the key on id, then looks each row up in the clustered dead_seq; a delete of the
    -- same row (dead_delete, a burial replacing an older copy) locks them the other way round: a
    -- rare deadlock, of which this read is the victim (retry it), not the operator's delete.
    SET DEADLOCK_PRIORITY LOW;

    IF @after_id IS NULL
        BEGIN
            SELECT TOP (@page_size)
                d.id,
                d.payload,
                d.enqueued_at,
                d.due_at,
                d.priority,
                d.attempts,
                d.last_error,
                d.last_worker,
                d.dead_at
            FROM [queue].[thumbnails_dead] AS d WITH (INDEX ([pk_thumbnails_dead]))
            ORDER BY d.id ASC;
        END;
    ELSE
        BEGIN
            SELECT TOP (@page_size)
                d.id,
                d.payload,
                d.enqueued_at,
                d.due_at,
                d.priority,
                d.attempts,
                d.last_error,
                d.last_worker,
                d.dead_at
            FROM [queue].[thumbnails_dead] AS d WITH (INDEX ([pk_thumbnails_dead]), FORCESEEK)
            WHERE d.id > @after_id
            ORDER BY d.id ASC;
        END;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_dead_list] TO [queue_admin];
GO

-- tablequeue:unit queue.thumbnails_dead_requeue code

-- Back to the queue under the same id, visible now, attempts reset; the last error stays on the
-- row for reference.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_dead_requeue]
    @id uniqueidentifier
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @id IS NULL
        BEGIN
            SET @error_message = N'queue.thumbnails_dead_requeue: id must not be NULL.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;
    -- Requeue locks the id's place in the queue table, then the key's; enqueue locks the key, then
    -- the id: the same id or key in both at once can deadlock, and the operator's call is the
    -- victim, never the producer's (restored when the procedure returns).
    SET DEADLOCK_PRIORITY LOW;

    DECLARE @now datetime2(7);
    DECLARE @found bit;
    DECLARE @taken_id uniqueidentifier;
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
            SET @started_transaction = 0;

            BEGIN TRY
                -- In implicit-transaction mode the caller owns the transaction the next statement opens.
                IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
                    BEGIN
                        BEGIN TRANSACTION;
                        SET @started_transaction = 1;
                    END;

                -- Queue table first, the fixed lock order: the id's place in the queue (the same client id
                -- may have been enqueued again). A concurrent requeue of the same id waits here.
                SELECT @taken_id = m.id
                FROM [queue].[thumbnails] AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.id = @id;

                -- Then the dead row, locked to the end of the transaction: a concurrent delete of it waits
                -- here and then finds it gone (not_found), instead of colliding with this insert (2627).
                SELECT @found = 1
                FROM [queue].[thumbnails_dead] AS d WITH (UPDLOCK, HOLDLOCK)
                WHERE d.id = @id;
                IF @found = 0
                    BEGIN
                        SET @error_message = CONCAT(
                            N'queue.thumbnails_dead_requeue: no dead-letter message with id ',
                            CONVERT(nvarchar(36), @id),
                            N'.'
                        );
                        THROW 51004, @error_message, 1;
                    END;
                IF @taken_id IS NOT NULL
                    BEGIN
                        SET @error_message = CONCAT(
                            N'queue.thumbnails_dead_requeue: a message with id ',
                            CONVERT(nvarchar(36), @id),
                            N' is queued already.'
                        );
                        THROW 51001, @error_message, 1;
                    END;

                -- Queue table, then dead table: insert the copy, then delete.
                INSERT INTO [queue].[thumbnails] (
                    id, enqueued_at, due_at, visible_at, priority, attempts, last_error, payload
                )
                SELECT
                    d.id,
                    d.enqueued_at,
                    d.due_at,
                    @now AS visible_at,
                    d.priority,
                    0 AS attempts,
                    d.last_error,
                    d.payload
                FROM [queue].[thumbnails_dead] AS d
                WHERE d.id = @id;

                DELETE FROM [queue].[thumbnails_dead]
                WHERE id = @id;

                IF @started_transaction = 1 COMMIT TRANSACTION;
                BREAK;
            END TRY
            BEGIN CATCH
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

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_dead_requeue] TO [queue_admin];
GO

-- tablequeue:unit queue.thumbnails_dead_delete code

CREATE OR ALTER PROCEDURE [queue].[thumbnails_dead_delete]
    @id uniqueidentifier
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @id IS NULL
        BEGIN
            SET @error_message = N'queue.thumbnails_dead_delete: id must not be NULL.';
            THROW 51001, @error_message, 1;
        END;
    SET XACT_ABORT ON;

    BEGIN TRY
        DELETE FROM [queue].[thumbnails_dead]
        WHERE id = @id;

        IF @@ROWCOUNT = 0
            BEGIN
                SET @error_message = CONCAT(
                    N'queue.thumbnails_dead_delete: no dead-letter message with id ',
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

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_dead_delete] TO [queue_admin];
GO

-- tablequeue:unit queue.thumbnails_process_handler code

-- process's check of its handler: @found is 1 when the handler procedure exists with exactly the
-- parameters process passes (@id, @payload, of the queue's types: a narrower payload parameter
-- would cut the payload short without an error), else 0; the same contract as PostgreSQL's check by
-- signature. @chained is 1 when the handler has process's owner: process then reaches it through
-- the ownership chain, with no permission of the caller's checked. EXECUTE AS OWNER: sys.objects and
-- sys.parameters show a caller only objects it holds a permission on, and the admin role runs the
-- handler through the ownership chain without any permission on it, so a check in process itself
-- saw no handler (OBJECT_ID NULL: no_handler for a handler that exists). It needs a database owner
-- that can be impersonated (docs/work-queue.md). No role is granted it: process reaches it through
-- the ownership chain.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_process_handler]
    @found bit OUTPUT,
    @chained bit OUTPUT
    WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    -- ON, as every procedure that reads (check-tsql's rule): a run-time error of its catalog reads (a
    -- lock wait, 1222 under the caller's LOCK_TIMEOUT while a handler's ALTER is open) then dooms a
    -- caller's transaction instead of process refusing it with 51003. Rare, and it fails closed.
    SET XACT_ABORT ON;
    DECLARE @handler_name nvarchar(300) = N'[queue].[make_thumbnail]';
    DECLARE @handler_id int = OBJECT_ID(@handler_name, N'P');
    -- OwnerId: the object's own owner, else its schema's.
    DECLARE @process_id int = OBJECT_ID(N'[queue].[thumbnails_process]', N'P');
    SET @chained = IIF(OBJECTPROPERTY(@handler_id, 'OwnerId') = OBJECTPROPERTY(@process_id, 'OwnerId'), 1, 0);
    SET @found = (
        SELECT
            IIF(
                COUNT(*) = 2
                AND COUNT(
                    CASE
                        WHEN
                            p.name = N'@id' AND p.user_type_id = TYPE_ID(N'uniqueidentifier')
                            AND p.is_output = 0
                            THEN 1
                        WHEN
                            p.name = N'@payload' AND p.user_type_id = TYPE_ID(N'nvarchar')
                            AND p.max_length = -1 AND p.is_output = 0
                            THEN 1
                    END
                ) = 2,
                1, 0
            )
        FROM sys.parameters AS p
        WHERE p.object_id = @handler_id AND p.parameter_id > 0
    );
END;
GO

-- tablequeue:unit queue.thumbnails_process code

-- The in-database worker (Darling's loop): claim one message and commit (the attempt and the lease
-- are durable before the handler runs, so a session that dies mid-message still counts it), run
-- the handler, complete in the same transaction as the handler's own writes, commit; or, when the
-- handler raises, roll its writes back and record its error with fail. Safe to run from many
-- sessions (SQL Agent jobs) at once: each is its own worker, 'process:<session id>', and completes
-- or fails with the token of its lease, as any consumer does.
CREATE OR ALTER PROCEDURE [queue].[thumbnails_process]
    @time_budget_seconds int = 60
AS
BEGIN
    SET NOCOUNT ON;
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);
    -- The handler first, before the transaction check: tSQLt, whose tests all run in a transaction,
    -- can then tell a caller that gets past it (51003 next) from one that does not (51005).
    -- NULL when the check could not run (the database owner cannot be impersonated: 15517): refused
    -- as no handler, never taken for one.
    -- The handler's name is a validated catalog value, quoted here; EXEC @name calls it without
    -- building any SQL text.
    DECLARE @handler_name nvarchar(300) = QUOTENAME(N'queue') + N'.' + QUOTENAME(N'make_thumbnail');
    DECLARE @handler_found bit;
    DECLARE @handler_chained bit;
    EXEC [queue].[thumbnails_process_handler]
        @found = @handler_found OUTPUT, @chained = @handler_chained OUTPUT;
    IF @handler_found IS NULL
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_process: could not check handler procedure ',
                N'queue.make_thumbnail(@id uniqueidentifier, @payload nvarchar(max)): ',
                N'see the error raised just before this one (most often 15517: its check runs as its owner, ',
                N'normally the database owner, who cannot be impersonated; docs/work-queue.md).'
            );
            THROW 51005, @error_message, 1;
        END;
    IF @handler_found = 0
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_process: handler procedure ',
                N'queue.make_thumbnail(@id uniqueidentifier, @payload nvarchar(max)) does not exist.'
            );
            THROW 51005, @error_message, 1;
        END;
    -- A handler of another owner (its schema another principal's) is outside the ownership chain:
    -- SQL Server checks the caller's EXECUTE on it at each call, and without it every message would
    -- fail with 229 until it is dead. Here, in the caller's context, process asks first.
    IF
        COALESCE(@handler_chained, 0) = 0
        AND COALESCE(HAS_PERMS_BY_NAME(@handler_name, N'OBJECT', N'EXECUTE'), 0) = 0
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_process: handler procedure ',
                N'queue.make_thumbnail(@id uniqueidentifier, @payload nvarchar(max)) has another owner than ',
                N'queue.thumbnails_process and the caller may not execute it: grant EXECUTE on it, or ',
                N'give it process''s owner.'
            );
            THROW 51005, @error_message, 1;
        END;

    -- It commits once per message, so it must not run inside a caller's transaction, nor for a
    -- caller in implicit-transaction mode (ODBC/JDBC autocommit off), whose driver commits or rolls
    -- back what the session did as one transaction: an error would undo earlier messages' work.
    IF @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_process: commits once per message: call it in autocommit mode, ',
                N'outside any transaction (not with IMPLICIT_TRANSACTIONS ON).'
            );
            THROW 51003, @error_message, 1;
        END;
    IF @time_budget_seconds IS NULL OR @time_budget_seconds NOT BETWEEN 1 AND 86400
        BEGIN
            SET @error_message = CONCAT(
                N'queue.thumbnails_process: time_budget_seconds must be between 1 and 86400, got ',
                COALESCE(CONVERT(nvarchar(12), @time_budget_seconds), N'NULL'),
                N'.'
            );
            THROW 51001, @error_message, 1;
        END;

    SET XACT_ABORT ON;

    DECLARE @batch_size int = 1;
    DECLARE @worker nvarchar(200) = CONCAT(N'process:', @@SPID);
    DECLARE @lease_seconds int = 120;
    DECLARE @deadline datetime2(7) = DATEADD(SECOND, @time_budget_seconds, SYSUTCDATETIME());
    DECLARE @processed bigint = 0;
    DECLARE @completed bigint = 0;
    DECLARE @failed bigint = 0;
    DECLARE @id uniqueidentifier;
    DECLARE @payload nvarchar(MAX);
    DECLARE @lease_token uniqueidentifier;
    DECLARE @error nvarchar(4000);
    DECLARE @error_number int;
    DECLARE @transient_retries int;
    DECLARE @pause datetime;
    DECLARE @outcome varchar(8);
    DECLARE @handler_unrunnable bit = 0;
    DECLARE @released int;
    DECLARE @claimed TABLE (
        id uniqueidentifier NOT NULL PRIMARY KEY,
        seq bigint NOT NULL,
        own bit NOT NULL,
        priority int NOT NULL,
        previous_visible_at datetime2(7) NOT NULL,
        previous_worker nvarchar(200) NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        -- NULL only for a live lease taken before storage v2 that its worker asked for again.
        lease_token uniqueidentifier NULL,
        payload nvarchar(MAX) NOT NULL
    );

    -- A deadlock (1205), a lock timeout (1222) or a snapshot conflict (3960) says nothing about a
    -- message: whether in the claim, in the handler or in recording a failure, the step runs again
    -- after a short random pause (so that it does not meet the same peer at once), up to 3 times,
    -- without spending an attempt. Any other error of the handler is recorded with fail.
    DECLARE @claim_retries int = 0;
    WHILE SYSUTCDATETIME() < @deadline
        BEGIN
            BEGIN TRY
                -- The claim's DECLAREs that carry a value run again on every pass.
                DELETE FROM @claimed;
                DECLARE @now datetime2(7) = SYSUTCDATETIME();
                DECLARE @lease_until datetime2(7) = DATEADD(SECOND, @lease_seconds, @now);
                DECLARE @remaining int = @batch_size;
                DECLARE @claimed_now int = 0;
                DECLARE @exhausted int;
                DECLARE @priority int;
                DECLARE @started_transaction bit = 0;
                DECLARE @next_look sql_variant = SESSION_CONTEXT(N'tablequeue.queue.thumbnails.expired');
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
                DECLARE @buried TABLE (
                    id uniqueidentifier NOT NULL PRIMARY KEY,
                    enqueued_at datetime2(7) NOT NULL,
                    due_at datetime2(7) NOT NULL,
                    priority int NOT NULL,
                    attempts int NOT NULL,
                    last_error nvarchar(4000) NULL,
                    last_worker nvarchar(200) NULL,
                    dead_at datetime2(7) NOT NULL,
                    payload nvarchar(MAX) NOT NULL
                );
                DECLARE @buried_count int = 0;
                -- This session's look for expired leases, when due, is recorded first (record_look).
                IF @look_due = 1
                    BEGIN
                        SET @look_after = DATEADD(SECOND, 1, @now);
                        SET XACT_ABORT OFF;
                        BEGIN TRY
                            -- Not transactional: a caller that rolls back still waits its second.
                            EXEC sys.sp_set_session_context
                                @key = N'tablequeue.queue.thumbnails.expired',
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
                            m.seq,
                            m.priority,
                            m.enqueued_at,
                            m.due_at,
                            m.visible_at,
                            m.attempts,
                            m.leased_by,
                            m.leased_at,
                            m.lease_token,
                            m.payload
                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.leased_by = @worker AND m.leased_by IS NOT NULL
                        ORDER BY m.visible_at, m.seq
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
                        INSERTED.seq,
                        1,
                        INSERTED.priority,
                        DELETED.visible_at,
                        DELETED.leased_by,
                        INSERTED.enqueued_at,
                        INSERTED.due_at,
                        INSERTED.attempts,
                        INSERTED.lease_token,
                        INSERTED.payload
                    INTO @claimed (
                        id, seq, own, priority, previous_visible_at, previous_worker,
                        enqueued_at, due_at, attempts, lease_token, payload
                    );

                    SET @exhausted = (
                        SELECT COUNT(*)
                        FROM @claimed AS c
                        WHERE c.attempts > 4 AND c.previous_visible_at <= @now
                    );
                    IF @exhausted > 0
                        BEGIN
                            -- A table variable keeps its rows through a rollback:
                            -- a burial rolled back in an earlier pass of a retry
                            -- (process after a deadlock) must leave none here.
                            DELETE FROM @buried;

                            DELETE m
                            OUTPUT
                                DELETED.id,
                                DELETED.enqueued_at,
                                DELETED.due_at,
                                DELETED.priority,
                                c.attempts - 1,
                                N'lease expired',
                                c.previous_worker,
                                @now,
                                DELETED.payload
                            INTO
                                @buried (
                                    id, enqueued_at, due_at, priority, attempts,
                                    last_error, last_worker, dead_at, payload
                                )
                            FROM [queue].[thumbnails] AS m
                            INNER JOIN @claimed AS c ON m.id = c.id
                            WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                            SET @buried_count = @@ROWCOUNT;

                            IF @buried_count > 0
                                BEGIN
                                    DELETE d
                                    FROM [queue].[thumbnails_dead] AS d
                                    INNER JOIN @buried AS b ON d.id = b.id;

                                    INSERT INTO [queue].[thumbnails_dead] (
                                        id, enqueued_at, due_at, priority, attempts,
                                        last_error, last_worker, dead_at, payload
                                    )
                                    SELECT
                                        id,
                                        enqueued_at,
                                        due_at,
                                        priority,
                                        attempts,
                                        last_error,
                                        last_worker,
                                        dead_at,
                                        payload
                                    FROM @buried;

                                    DELETE FROM @buried;
                                END;

                            DELETE c
                            FROM @claimed AS c
                            WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
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
                                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                        WHERE m.leased_by IS NOT NULL
                                        ORDER BY m.leased_by
                                    );
                                    WHILE @look_worker IS NOT NULL AND @remaining > 0
                                        BEGIN
                                            WITH expired_leases AS (
                                                SELECT TOP (@remaining)
                                                    m.id,
                                                    m.seq,
                                                    m.priority,
                                                    m.enqueued_at,
                                                    m.due_at,
                                                    m.visible_at,
                                                    m.attempts,
                                                    m.leased_by,
                                                    m.leased_at,
                                                    m.lease_token,
                                                    m.payload
                                                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                                                WHERE
                                                    m.leased_by = @look_worker AND m.leased_by IS NOT NULL
                                                    AND m.visible_at <= @now
                                                ORDER BY m.visible_at, m.seq
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
                                                INSERTED.seq,
                                                0,
                                                INSERTED.priority,
                                                DELETED.visible_at,
                                                DELETED.leased_by,
                                                INSERTED.enqueued_at,
                                                INSERTED.due_at,
                                                INSERTED.attempts,
                                                INSERTED.lease_token,
                                                INSERTED.payload
                                            INTO @claimed (
                                                id, seq, own, priority, previous_visible_at, previous_worker,
                                                enqueued_at, due_at, attempts, lease_token, payload
                                            );
                                            IF @@ROWCOUNT = 0
                                                BEGIN
                                                    SET @look_worker = (
                                                        SELECT TOP (1) m.leased_by
                                                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                                        WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
                                                        ORDER BY m.leased_by
                                                    );
                                                    CONTINUE;
                                                END;
                                            SET @buried_count = 0;
                                            SET @exhausted = (
                                                SELECT COUNT(*)
                                                FROM @claimed AS c
                                                WHERE c.attempts > 4 AND c.previous_visible_at <= @now
                                            );
                                            IF @exhausted > 0
                                                BEGIN
                                                    -- A table variable keeps its rows through a rollback:
                                                    -- a burial rolled back in an earlier pass of a retry
                                                    -- (process after a deadlock) must leave none here.
                                                    DELETE FROM @buried;

                                                    DELETE m
                                                    OUTPUT
                                                        DELETED.id,
                                                        DELETED.enqueued_at,
                                                        DELETED.due_at,
                                                        DELETED.priority,
                                                        c.attempts - 1,
                                                        N'lease expired',
                                                        c.previous_worker,
                                                        @now,
                                                        DELETED.payload
                                                    INTO
                                                        @buried (
                                                            id, enqueued_at, due_at, priority, attempts,
                                                            last_error, last_worker, dead_at, payload
                                                        )
                                                    FROM [queue].[thumbnails] AS m
                                                    INNER JOIN @claimed AS c ON m.id = c.id
                                                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                                                    SET @buried_count = @@ROWCOUNT;

                                                    IF @buried_count > 0
                                                        BEGIN
                                                            DELETE d
                                                            FROM [queue].[thumbnails_dead] AS d
                                                            INNER JOIN @buried AS b ON d.id = b.id;

                                                            INSERT INTO [queue].[thumbnails_dead] (
                                                                id, enqueued_at, due_at, priority, attempts,
                                                                last_error, last_worker, dead_at, payload
                                                            )
                                                            SELECT
                                                                id,
                                                                enqueued_at,
                                                                due_at,
                                                                priority,
                                                                attempts,
                                                                last_error,
                                                                last_worker,
                                                                dead_at,
                                                                payload
                                                            FROM @buried;

                                                            DELETE FROM @buried;
                                                        END;

                                                    DELETE c
                                                    FROM @claimed AS c
                                                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                                                END;
                                            SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                                            IF @buried_count = 0
                                                BEGIN
                                                    SET @look_worker = (
                                                        SELECT TOP (1) m.leased_by
                                                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_lease]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
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
                                        @key = N'tablequeue.queue.thumbnails.expired',
                                        @value = NULL;
                                END;
                        END;

                    -- 3. Messages nobody leases (new, due, retried, released), on the filtered claim index, whose
                    -- filter the claims repeat. A claimed row that goes to the dead-letter table frees its place in
                    -- the batch: claim again until the batch is full or nothing visible is left.
                    WHILE @remaining > 0
                        BEGIN
                            -- A loose index scan: one seek per priority level present, each claim an equality
                            -- and range seek on (priority DESC, visible_at, seq). A single ORDER BY
                            -- priority DESC would read past every delayed or leased row of the higher levels
                            -- on each claim, and the whole index whenever nothing is ready.
                            SET @claimed_now = 0;
                            SET @priority = (
                                SELECT TOP (1) m.priority
                                FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                WHERE m.leased_by IS NULL
                                ORDER BY m.priority DESC
                            );
                            WHILE @priority IS NOT NULL AND @claimed_now < @remaining
                                BEGIN
                                    WITH next_messages AS (
                                        SELECT TOP (@remaining - @claimed_now)
                                            m.id,
                                            m.seq,
                                            m.priority,
                                            m.enqueued_at,
                                            m.due_at,
                                            m.visible_at,
                                            m.attempts,
                                            m.leased_by,
                                            m.leased_at,
                                            m.lease_token,
                                            m.payload
                                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                                        WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now
                                        ORDER BY m.visible_at, m.seq
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
                                        INSERTED.seq,
                                        0,
                                        INSERTED.priority,
                                        DELETED.visible_at,
                                        DELETED.leased_by,
                                        INSERTED.enqueued_at,
                                        INSERTED.due_at,
                                        INSERTED.attempts,
                                        INSERTED.lease_token,
                                        INSERTED.payload
                                    INTO @claimed (
                                        id, seq, own, priority, previous_visible_at, previous_worker,
                                        enqueued_at, due_at, attempts, lease_token, payload
                                    );
                                    SET @claimed_now = @claimed_now + @@ROWCOUNT;
                                    SET @priority = (
                                        SELECT TOP (1) m.priority
                                        FROM [queue].[thumbnails] AS m WITH (INDEX ([ix_thumbnails_ready_priority]), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                        WHERE m.priority < @priority AND m.leased_by IS NULL
                                        ORDER BY m.priority DESC
                                    );
                                END;

                            IF @claimed_now = 0 BREAK;

                            SET @buried_count = 0;
                            SET @exhausted = (
                                SELECT COUNT(*)
                                FROM @claimed AS c
                                WHERE c.attempts > 4 AND c.previous_visible_at <= @now
                            );
                            IF @exhausted > 0
                                BEGIN
                                    -- A table variable keeps its rows through a rollback:
                                    -- a burial rolled back in an earlier pass of a retry
                                    -- (process after a deadlock) must leave none here.
                                    DELETE FROM @buried;

                                    DELETE m
                                    OUTPUT
                                        DELETED.id,
                                        DELETED.enqueued_at,
                                        DELETED.due_at,
                                        DELETED.priority,
                                        c.attempts - 1,
                                        N'lease expired',
                                        c.previous_worker,
                                        @now,
                                        DELETED.payload
                                    INTO
                                        @buried (
                                            id, enqueued_at, due_at, priority, attempts,
                                            last_error, last_worker, dead_at, payload
                                        )
                                    FROM [queue].[thumbnails] AS m
                                    INNER JOIN @claimed AS c ON m.id = c.id
                                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
                                    SET @buried_count = @@ROWCOUNT;

                                    IF @buried_count > 0
                                        BEGIN
                                            DELETE d
                                            FROM [queue].[thumbnails_dead] AS d
                                            INNER JOIN @buried AS b ON d.id = b.id;

                                            INSERT INTO [queue].[thumbnails_dead] (
                                                id, enqueued_at, due_at, priority, attempts,
                                                last_error, last_worker, dead_at, payload
                                            )
                                            SELECT
                                                id,
                                                enqueued_at,
                                                due_at,
                                                priority,
                                                attempts,
                                                last_error,
                                                last_worker,
                                                dead_at,
                                                payload
                                            FROM @buried;

                                            DELETE FROM @buried;
                                        END;

                                    DELETE c
                                    FROM @claimed AS c
                                    WHERE c.attempts > 4 AND c.previous_visible_at <= @now;
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
                                    @key = N'tablequeue.queue.thumbnails.expired',
                                    @value = NULL;
                            END TRY
                            BEGIN CATCH
                            END CATCH;
                        END;
                    THROW;
                END CATCH;
            END TRY
            BEGIN CATCH
                IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @claim_retries >= 3 THROW;
                SET @claim_retries = @claim_retries + 1;
                SET @pause = DATEADD(MILLISECOND, 20 + ABS(CHECKSUM(NEWID()) % 180), CONVERT(datetime, 0));
                WAITFOR DELAY @pause;
                CONTINUE;
            END CATCH;
            SET @claim_retries = 0;

            SET @id = NULL;
            SELECT
                @id = c.id,
                @payload = c.payload,
                @lease_token = c.lease_token
            FROM @claimed AS c;
            IF @id IS NULL BREAK;
            SET @processed = @processed + 1;

            -- The handler and complete, in one transaction. @error stays NULL unless the handler
            -- raised something that is to be recorded with fail.
            SET @error = NULL;
            SET @transient_retries = 0;
            WHILE 1 = 1
                BEGIN
                    BEGIN TRY
                        BEGIN TRANSACTION;

                        EXEC @handler_name @id = @id, @payload = @payload;

                        SET @now = SYSUTCDATETIME();
                        DELETE FROM [queue].[thumbnails]
                        WHERE
                            id = @id AND leased_by = @worker AND visible_at > @now
                            AND (@lease_token IS NULL OR lease_token = @lease_token);
                        IF @@ROWCOUNT = 1
                            BEGIN
                                COMMIT TRANSACTION;
                                SET @completed = @completed + 1;
                            END;
                        ELSE
                            BEGIN
                                -- The lease expired under the handler and may be another worker's
                                -- now: undo the handler's writes; the message runs again elsewhere.
                                ROLLBACK TRANSACTION;
                            END;
                        BREAK;
                    END TRY
                    BEGIN CATCH
                        SET @error_number = ERROR_NUMBER();
                        SET @error = LEFT(CONCAT(
                            N'error ', @error_number, N' in ', COALESCE(ERROR_PROCEDURE(), N'a batch'),
                            N' line ', ERROR_LINE(), N': ', ERROR_MESSAGE()
                        ), 4000);
                        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                        -- An error that can mean the handler cannot be run (dropped, altered to
                        -- other parameters, EXECUTE revoked: 2812, 201, 8144, 8145, 229) is not
                        -- the message's fault when the handler check now fails: handled after
                        -- this loop. Raised inside a handler that is still there and runnable, it
                        -- is the handler's own error, recorded with fail as any other.
                        -- The check runs inside this CATCH: an error of its own (1222 on the catalog
                        -- read of a handler whose ALTER is still open) ends process with that error,
                        -- the message's attempt counted and its lease left to expire: closed, not lost.
                        IF @error_number IN (229, 2812, 201, 8144, 8145)
                            BEGIN
                                EXEC [queue].[thumbnails_process_handler]
                                    @found = @handler_found OUTPUT, @chained = @handler_chained OUTPUT;
                                IF
                                    COALESCE(@handler_found, 0) = 0
                                    OR (
                                        COALESCE(@handler_chained, 0) = 0
                                        AND COALESCE(HAS_PERMS_BY_NAME(@handler_name, N'OBJECT', N'EXECUTE'), 0) = 0
                                    )
                                    BEGIN
                                        SET @handler_unrunnable = 1;
                                        BREAK;
                                    END;
                            END;
                        IF @error_number NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 BREAK;
                        SET @transient_retries = @transient_retries + 1;
                        SET @error = NULL;
                        SET @pause = DATEADD(MILLISECOND, 20 + ABS(CHECKSUM(NEWID()) % 180), CONVERT(datetime, 0));
                        WAITFOR DELAY @pause;
                    END CATCH;
                END;

            -- The handler cannot be run: the lease goes back with its attempt, as release gives it
            -- (nothing if the lease had already expired), and process stops with no_handler.
            SET @transient_retries = 0;
            WHILE @handler_unrunnable = 1
                BEGIN
                    BEGIN TRY
                        SET @now = SYSUTCDATETIME();
                        UPDATE [queue].[thumbnails]
                        SET
                            leased_by = NULL,
                            leased_at = NULL,
                            lease_token = NULL,
                            visible_at = @now,
                            attempts = IIF(attempts > 0, attempts - 1, 0)
                        WHERE
                            id = @id AND leased_by = @worker AND visible_at > @now
                            AND (@lease_token IS NULL OR lease_token = @lease_token);
                        SET @released = @@ROWCOUNT;
                        -- What the run did is in the message: the refusal ends it without its row.
                        SET @error_message = CONCAT(
                            N'queue.thumbnails_process: the handler can no longer be run; message ',
                            @id,
                            IIF(@released = 1, N' handed back', N' not handed back (its lease was no longer held)'),
                            N' after ',
                            @processed,
                            N' processed, ',
                            @completed,
                            N' completed, ',
                            @failed,
                            N' failed; the handler''s call raised: ',
                            @error
                        );
                        THROW 51005, @error_message, 1;
                    END TRY
                    BEGIN CATCH
                        IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 THROW;
                        SET @transient_retries = @transient_retries + 1;
                        SET @pause = DATEADD(MILLISECOND, 20 + ABS(CHECKSUM(NEWID()) % 180), CONVERT(datetime, 0));
                        WAITFOR DELAY @pause;
                    END CATCH;
                END;

            -- The handler's error, recorded with fail.
            SET @transient_retries = 0;
            WHILE @error IS NOT NULL
                BEGIN
                    BEGIN TRY
                        SET @now = SYSUTCDATETIME();
                        BEGIN TRANSACTION;
                        UPDATE [queue].[thumbnails]
                        SET
                            leased_by = NULL,
                            lease_token = NULL,
                            visible_at = DATEADD(SECOND, 0, @now),
                            last_error = @error
                        WHERE
                            id = @id AND leased_by = @worker AND visible_at > @now
                            AND (@lease_token IS NULL OR lease_token = @lease_token)
                            AND attempts < 4;

                        IF @@ROWCOUNT = 1
                            BEGIN
                                SET @outcome = 'retrying';
                            END;
                        ELSE
                            BEGIN
                                -- A table variable keeps its rows through a rollback:
                                -- a burial rolled back in an earlier pass of a retry
                                -- (process after a deadlock) must leave none here.
                                DELETE FROM @buried;

                                DELETE m
                                OUTPUT
                                    DELETED.id,
                                    DELETED.enqueued_at,
                                    DELETED.due_at,
                                    DELETED.priority,
                                    DELETED.attempts,
                                    @error,
                                    DELETED.leased_by,
                                    @now,
                                    DELETED.payload
                                INTO
                                    @buried (
                                        id, enqueued_at, due_at, priority, attempts,
                                        last_error, last_worker, dead_at, payload
                                    )
                                FROM [queue].[thumbnails] AS m
                                WHERE
                                    m.id = @id AND m.leased_by = @worker AND m.visible_at > @now
                                    AND (@lease_token IS NULL OR m.lease_token = @lease_token);
                                SET @buried_count = @@ROWCOUNT;

                                IF @buried_count > 0
                                    BEGIN
                                        DELETE d
                                        FROM [queue].[thumbnails_dead] AS d
                                        INNER JOIN @buried AS b ON d.id = b.id;

                                        INSERT INTO [queue].[thumbnails_dead] (
                                            id, enqueued_at, due_at, priority, attempts,
                                            last_error, last_worker, dead_at, payload
                                        )
                                        SELECT
                                            id,
                                            enqueued_at,
                                            due_at,
                                            priority,
                                            attempts,
                                            last_error,
                                            last_worker,
                                            dead_at,
                                            payload
                                        FROM @buried;

                                        DELETE FROM @buried;
                                    END;
                                SET @outcome = IIF(@buried_count = 1, 'dead', 'lost');
                            END;
                        COMMIT TRANSACTION;
                        IF @outcome <> 'lost' SET @failed = @failed + 1;
                        SET @error = NULL;
                    END TRY
                    BEGIN CATCH
                        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                        IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 THROW;
                        SET @transient_retries = @transient_retries + 1;
                        SET @pause = DATEADD(MILLISECOND, 20 + ABS(CHECKSUM(NEWID()) % 180), CONVERT(datetime, 0));
                        WAITFOR DELAY @pause;
                    END CATCH;
                END;
        END;

    SELECT
        @processed AS processed,
        @completed AS completed,
        @failed AS failed;
END;
GO

GRANT EXECUTE ON OBJECT::[queue].[thumbnails_process] TO [queue_admin];
GO
