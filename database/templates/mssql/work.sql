{#-
  The work kind: a reliable, lease-based queue (at-least-once). docs/work-queue.md explains the
  storage, the indexes, the claim and the lease/attempt rules; keep it in step.
  A dequeue leases rows to a worker and counts an attempt; complete / fail / extend_lease need the
  live lease; a lease that expires makes the message visible again; max_attempts ends in S.Q_dead.
-#}
{% set t = names.obj() %}
{% set dead_t = names.obj('_dead') %}
{% set history_t = names.obj('_history') %}
{% set items = names.obj('_items') %}
{% set client_ids = opt.client_ids %}
{% set id_type = 'uniqueidentifier' if client_ids else 'bigint' %}
{% set tie = 'seq' if client_ids else 'id' %}
{% set has_priority = opt.priority %}
{% set dedupe = opt.dedupe %}
{% set history = opt.history %}
{% set max_attempts = opt.max_attempts %}
{% set lease_seconds = opt.lease_seconds %}
{% set handler = opt.handler %}
{#- Dedupe keys compare byte for byte, as text does on PostgreSQL (as in the destructive kinds). -#}
{% set key_type = 'nvarchar(200) COLLATE Latin1_General_100_BIN2' %}
{% import '_macros.sql' as m with context %}
{% import '_work_macros.sql' as w with context %}
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

{{ m.unit(names.plain(), 'storage', version=1, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids')) }}
IF OBJECT_ID(N'{{ t }}', N'U') IS NULL
    BEGIN
        CREATE TABLE {{ t }} (
{% if client_ids %}
            -- Client-supplied GUIDs (Pintér) are random: clustered on them, inserts would split
            -- pages all over the table. seq keeps inserts appending and breaks claim-order ties.
            id uniqueidentifier NOT NULL,
            seq bigint IDENTITY (1, 1) NOT NULL,
{% else %}
            id bigint IDENTITY (1, 1) NOT NULL,
{% endif %}
            enqueued_at datetime2(7) NOT NULL
            CONSTRAINT {{ names.index('df', 'enqueued_at') }} DEFAULT (SYSUTCDATETIME()),
            -- The scheduled start as enqueued (dequeue returns it).
            due_at datetime2(7) NOT NULL,
            -- When the message may next be claimed: due_at, then the lease's expiry while leased,
            -- then the retry time after a fail.
            visible_at datetime2(7) NOT NULL,
{% if has_priority %}
            priority int NOT NULL
            CONSTRAINT {{ names.index('df', 'priority') }} DEFAULT (0),
{% endif %}
            attempts int NOT NULL
            CONSTRAINT {{ names.index('df', 'attempts') }} DEFAULT (0),
            leased_by nvarchar(200) NULL,
            leased_at datetime2(7) NULL,
            last_error nvarchar(4000) NULL,
{% if dedupe %}
            dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
            payload {{ payload_type }} NOT NULL,
{% if is_json %}
            CONSTRAINT {{ names.index('ck', 'payload_json') }} CHECK (ISJSON(payload) = 1),
{% endif %}
{% if client_ids %}
            CONSTRAINT {{ names.index('pk') }} PRIMARY KEY NONCLUSTERED (id)
{% else %}
            -- Clustered on the immutable id: a claim, fail or extend updates the row in place (only
            -- the narrow claim index moves), complete is a clustered seek, and deleted rows leave
            -- no emptied heap pages behind.
            CONSTRAINT {{ names.index('pk') }} PRIMARY KEY CLUSTERED (id)
{% endif %}
        );
{% if client_ids %}

        CREATE UNIQUE CLUSTERED INDEX {{ names.index('ux', 'seq') }}
            ON {{ t }} (seq);
{% endif %}

        -- The claim's exact WHERE and ORDER BY{% if has_priority %}, one priority level per seek{% endif %}.
        CREATE NONCLUSTERED INDEX {{ names.index('ix', 'claim') }}
            ON {{ t }} ({% if has_priority %}priority DESC, {% endif %}visible_at, {{ tie }});

        -- A worker's own messages (the restart path) and the in-flight count: leased rows only.
        CREATE NONCLUSTERED INDEX {{ names.index('ix', 'lease') }}
            ON {{ t }} (leased_by, visible_at, {{ tie }})
            WHERE leased_by IS NOT NULL;
{% if dedupe %}

        -- Filtered: messages without a key cost nothing. IGNORE_DUP_KEY is not allowed on a filtered
        -- index, and would hide the existing id anyway: enqueue locks the key and reports it itself.
        CREATE UNIQUE NONCLUSTERED INDEX {{ names.index('ux', 'dedupe') }}
            ON {{ t }} (dedupe_key)
            WHERE dedupe_key IS NOT NULL;
{% endif %}

        -- Appending to an ever-increasing key latches the last page; past ~8 concurrent producers
        -- that is the bottleneck (NServiceBus.SqlServer #624). SQL Server 2019+ and Azure can queue
        -- the waiters fairly; 2017 cannot, hence the guard (a literal: nothing is concatenated).
        IF CONVERT(int, SERVERPROPERTY('ProductMajorVersion')) >= 15 OR SERVERPROPERTY('EngineEdition') IN (5, 8)
            BEGIN
                EXEC (N'ALTER INDEX {{ names.index('ux', 'seq') if client_ids else names.index('pk') }} ON {{ t }} SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);'); -- noqa: LT05
            END;
    END;
GO

{{ m.unit(names.plain('_items'), 'storage', version=1, object='type', shape=('payload',)) }}
-- One shape whatever the options; columns an option does not use must be NULL (enqueue_batch
-- checks). dedupe_key is wider than the table's so that an over-long key reaches the procedure's
-- check (and its error number) instead of failing in the driver.
IF TYPE_ID(N'{{ items }}') IS NULL
    BEGIN
        CREATE TYPE {{ items }} AS TABLE (
            ordinal int NOT NULL PRIMARY KEY,
            payload {{ payload_type }} NULL,
            due_at datetime2(7) NULL,
            dedupe_key nvarchar(MAX) COLLATE Latin1_General_100_BIN2 NULL, -- noqa: CP02
            priority int NULL,
            id uniqueidentifier NULL,
            enqueued_at datetime2(7) NULL
        );
    END;
GO

{{ m.unit(names.plain('_dead'), 'storage', version=1, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids')) }}
IF OBJECT_ID(N'{{ dead_t }}', N'U') IS NULL
    BEGIN
        -- Messages that used up max_attempts: a last fail, or a lease that expired once too often.
        -- Few inserts, paged reads by id (dead_list): clustered on id.
        CREATE TABLE {{ dead_t }} (
            id {{ id_type }} NOT NULL,
            enqueued_at datetime2(7) NOT NULL,
            due_at datetime2(7) NOT NULL,
{% if has_priority %}
            priority int NOT NULL,
{% endif %}
{% if dedupe %}
            dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
            attempts int NOT NULL,
            last_error nvarchar(4000) NULL,
            last_worker nvarchar(200) NULL,
            dead_at datetime2(7) NOT NULL,
            payload {{ payload_type }} NOT NULL,
            CONSTRAINT {{ names.index('pk', 'dead') }} PRIMARY KEY CLUSTERED (id)
        );
    END;
GO
{% if history %}

{{ m.unit(names.plain('_history'), 'storage', version=1, object='table', shape=('payload', 'priority', 'client_ids')) }}
IF OBJECT_ID(N'{{ history_t }}', N'U') IS NULL
    BEGIN
        -- Completed messages. Clustered on the finish time: inserts append, and history_purge
        -- deletes a range at the start of the clustered index.
        CREATE TABLE {{ history_t }} (
            history_id bigint IDENTITY (1, 1) NOT NULL,
            id {{ id_type }} NOT NULL,
            enqueued_at datetime2(7) NOT NULL,
            due_at datetime2(7) NOT NULL,
{% if has_priority %}
            priority int NOT NULL,
{% endif %}
            started_at datetime2(7) NOT NULL,
            finished_at datetime2(7) NOT NULL,
            duration_ms AS DATEDIFF_BIG(MILLISECOND, started_at, finished_at),
            worker nvarchar(200) NOT NULL,
            attempts int NOT NULL,
            payload {{ payload_type }} NOT NULL,
            CONSTRAINT {{ names.index('pk', 'history') }} PRIMARY KEY CLUSTERED (finished_at, history_id)
        );

        CREATE NONCLUSTERED INDEX {{ names.index('ix', 'history_id') }}
            ON {{ history_t }} (id);
    END;
GO
{% endif %}

{{ m.unit(names.plain('_enqueue'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('enqueue') }}
    @payload {{ payload_type }},
    @due_at datetime2(7) = NULL,
    @dedupe_key nvarchar(MAX) = NULL{% if has_priority or client_ids %},{% endif %}

{% if has_priority %}
    @priority int = NULL{% if client_ids %},{% endif %}

{% endif %}
{% if client_ids %}
    @id uniqueidentifier = NULL,
    @enqueued_at datetime2(7) = NULL
{% endif %}
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    -- Whatever the caller's level, the locking below is written for READ COMMITTED (reset on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @payload IS NULL{% if is_json %} OR ISJSON(@payload) = 0{% endif %}

        BEGIN
{{ w.throw('invalid_payload', "N'" ~ names.plain('_enqueue') ~ ": payload must not be NULL" ~ (" and must be valid JSON" if is_json else "") ~ ".'") }}
        END;
{% if dedupe %}
    IF DATALENGTH(@dedupe_key) > 400
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_enqueue') ~ ": dedupe_key is over 200 characters.'") }}
        END;
{% else %}
    IF @dedupe_key IS NOT NULL
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_enqueue') ~ ": dedupe_key needs option dedupe.'") }}
        END;
{% endif %}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @effective_due_at datetime2(7) = COALESCE(@due_at, @now);
{% if dedupe %}
    -- A variable takes the database collation; compared with the column, the column's BIN2 wins.
    DECLARE @key nvarchar(200) = @dedupe_key;
{% endif %}
{% if client_ids %}
    DECLARE @new_id uniqueidentifier = COALESCE(@id, NEWID());
{% endif %}
    DECLARE @existing_id {{ id_type }};
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
{% if dedupe or client_ids %}
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens: BEGIN TRANSACTION there would open a second level (266).
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0 AND ({{ '@key IS NOT NULL' if dedupe }}{{ ' OR ' if dedupe and client_ids }}{{ '@id IS NOT NULL' if client_ids }})
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;
{% endif %}
{% if dedupe %}

        -- UPDLOCK + HOLDLOCK keep the key, or the gap where it would go, locked until the
        -- transaction ends: a racing caller with the same key waits here, then finds this row.
        IF @key IS NOT NULL
            BEGIN
                SELECT @existing_id = m.id
                FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.dedupe_key = @key AND m.dedupe_key IS NOT NULL;
            END;
{% endif %}
{% if client_ids %}

        -- A client id that is queued already: the same message enqueued again.
        IF @existing_id IS NULL AND @id IS NOT NULL
            BEGIN
                SELECT @existing_id = m.id
                FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.id = @id;
            END;
{% endif %}

        IF @existing_id IS NULL
            BEGIN
                INSERT INTO {{ t }} (
                    {{ 'id, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}payload
                )
                VALUES (
                    {{ '@new_id, COALESCE(@enqueued_at, @now)' if client_ids else '@now' }},
                    @effective_due_at,
                    @effective_due_at,
{% if has_priority %}
                    COALESCE(@priority, 0),
{% endif %}
{% if dedupe %}
                    @key,
{% endif %}
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
        COALESCE(@existing_id, {{ '@new_id' if client_ids else 'CONVERT(bigint, SCOPE_IDENTITY())' }}) AS id,
        CONVERT(bit, IIF(@existing_id IS NULL, 0, 1)) AS duplicate;
END;
GO

{{ m.grant('enqueue') }}
GO

{{ m.unit(names.plain('_enqueue_batch'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('enqueue_batch') }}
    @items {{ items }} READONLY
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ m.check_batch_items('enqueue_batch') }}

    DECLARE @bad_ordinal int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE i.payload IS NULL{% if is_json %} OR ISJSON(i.payload) = 0{% endif %}

    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
{{ w.throw('invalid_payload', ["N'" ~ names.plain('_enqueue_batch') ~ ": item '", "@bad_ordinal", "N' has a NULL" ~ (" or invalid JSON" if is_json else "") ~ " payload.'"]) }}
        END;
{% if dedupe %}

    SET @bad_ordinal = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE DATALENGTH(i.dedupe_key) > 400
    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_enqueue_batch') ~ ": item '", "@bad_ordinal", "N' has a dedupe_key over 200 characters.'"]) }}
        END;
{% endif %}
{% for column, option in (('dedupe_key', 'dedupe'), ('priority', 'priority'), ('id', 'client_ids'), ('enqueued_at', 'client_ids')) if not opt[option] %}

    IF (SELECT COUNT(i.{{ column }}) FROM @items AS i) > 0
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_enqueue_batch') ~ ": " ~ column ~ " needs option " ~ option ~ ".'") }}
        END;
{% endfor %}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    -- One row per item: the id it gets, or the queued message it duplicates.
    DECLARE @staged TABLE (
        ordinal int NOT NULL PRIMARY KEY,
{% if client_ids %}
        new_id uniqueidentifier NOT NULL,
{% endif %}
{% if dedupe %}
        dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
        first_ordinal int NULL,
        existing_id {{ id_type }} NULL,
        assigned_id {{ id_type }} NULL
    );
{% if dedupe %}
    DECLARE @keys TABLE (dedupe_key {{ key_type }} NOT NULL PRIMARY KEY); -- noqa: CP02
    DECLARE @existing_keys TABLE (
        dedupe_key {{ key_type }} NOT NULL PRIMARY KEY, -- noqa: CP02
        id {{ id_type }} NOT NULL
    );
{% endif %}
{% if client_ids %}
    DECLARE @given_ids TABLE (id uniqueidentifier NOT NULL PRIMARY KEY);
{% else %}
    DECLARE @new_ids TABLE (id bigint NOT NULL PRIMARY KEY);
{% endif %}
    DECLARE @started_transaction bit = 0;

    INSERT INTO @staged (ordinal{% if client_ids %}, new_id{% endif %}{% if dedupe %}, dedupe_key{% endif %})
{% set staged_select = ['i.ordinal'] + (['COALESCE(i.id, NEWID()) AS new_id'] if client_ids else []) + (['i.dedupe_key'] if dedupe else []) %}
    SELECT{{ ' ' if staged_select | length == 1 else '\n        ' }}{{ staged_select | join(',\n        ') }}
    FROM @items AS i;
{% if dedupe or client_ids %}

    -- A later item with the key{% if client_ids %} or the client id{% endif %} of an earlier one duplicates that one.
    UPDATE s
    SET
        s.first_ordinal = (
            SELECT MIN(e.ordinal)
            FROM @staged AS e
            WHERE
                e.ordinal < s.ordinal
                AND ({{ 'e.dedupe_key = s.dedupe_key' if dedupe }}{{ ' OR ' if dedupe and client_ids }}{{ 'e.new_id = s.new_id' if client_ids }})
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
{% endif %}
{% if dedupe %}

    INSERT INTO @keys (dedupe_key)
    SELECT DISTINCT s.dedupe_key
    FROM @staged AS s
    WHERE s.dedupe_key IS NOT NULL;
{% endif %}
{% if client_ids %}

    INSERT INTO @given_ids (id)
    SELECT DISTINCT s.new_id
    FROM @staged AS s
    INNER JOIN @items AS i ON s.ordinal = i.ordinal
    WHERE i.id IS NOT NULL;
{% endif %}

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;
{% if dedupe %}

        -- Lock every key of the batch, present or not (see enqueue), walking the keys in index order:
        -- two batches that share keys then wait for each other instead of deadlocking.
        INSERT INTO @existing_keys (dedupe_key, id)
        SELECT
            m.dedupe_key,
            m.id
        FROM @keys AS k
        INNER JOIN {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
            ON k.dedupe_key = m.dedupe_key AND m.dedupe_key IS NOT NULL
        OPTION (LOOP JOIN, FORCE ORDER);

        UPDATE s
        SET s.existing_id = e.id
        FROM @staged AS s
        INNER JOIN @existing_keys AS e ON s.dedupe_key = e.dedupe_key;
{% endif %}
{% if client_ids %}

        -- Client ids that are queued already, locked in id order as the keys are.
        UPDATE s
        SET s.existing_id = m.id
        FROM @given_ids AS g
        INNER JOIN {{ t }} AS m WITH (UPDLOCK, HOLDLOCK) ON g.id = m.id
        INNER JOIN @staged AS s ON g.id = s.new_id
        WHERE s.existing_id IS NULL
        OPTION (LOOP JOIN, FORCE ORDER);
{% endif %}

        INSERT INTO {{ t }} (
            {{ 'id, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}payload
        )
{% if not client_ids %}
        OUTPUT INSERTED.id INTO @new_ids (id)
{% endif %}
        SELECT
{% if client_ids %}
            s.new_id,
            COALESCE(i.enqueued_at, @now) AS enqueued_at,
{% else %}
            @now AS enqueued_at,
{% endif %}
            COALESCE(i.due_at, @now) AS due_at,
            COALESCE(i.due_at, @now) AS visible_at,
{% if has_priority %}
            COALESCE(i.priority, 0) AS priority,
{% endif %}
{% if dedupe %}
            s.dedupe_key,
{% endif %}
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

{% if client_ids %}
    UPDATE @staged
    SET assigned_id = new_id
    WHERE existing_id IS NULL AND first_ordinal IS NULL;
{% else %}
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
{% endif %}

    SELECT
        s.ordinal,
        COALESCE(s.assigned_id, s.existing_id, f.assigned_id, f.existing_id) AS id,
        CONVERT(bit, IIF(s.assigned_id IS NULL, 1, 0)) AS duplicate
    FROM @staged AS s
    LEFT JOIN @staged AS f ON s.first_ordinal = f.ordinal
    ORDER BY s.ordinal;
END;
GO

GRANT EXECUTE ON TYPE::{{ items }} TO {{ names.role('enqueue_batch') }};
GO

{{ m.grant('enqueue_batch') }}
GO

{{ m.unit(names.plain('_dequeue'), 'code') }}
-- A dequeue by worker W first takes back W's own unfinished messages: by asking, W declares that it
-- holds nothing else. A worker name is therefore one single-threaded consumer at a time.
-- @worker is one character wider than leased_by, so that an over-long name reaches the check
-- (invalid_argument) instead of being cut to 200 characters silently.
CREATE OR ALTER PROCEDURE {{ names.verb('dequeue') }}
    @batch_size int = 1,
    @worker nvarchar(201) = NULL,
    @lease_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    -- The claim's hints are refused (READPAST) or lock differently under SERIALIZABLE and SNAPSHOT:
    -- READ COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_batch_size('dequeue') }}
{{ w.check_worker('dequeue') }}
    SET @lease_seconds = COALESCE(@lease_seconds, {{ lease_seconds }});
{{ w.check_lease('dequeue') }}
    SET XACT_ABORT ON;

{{ w.claimed_table() }}

{{ w.claim() }}

    SELECT
        c.id,
        c.payload,
        c.enqueued_at,
        c.due_at,
        c.attempts
    FROM @claimed AS c
    ORDER BY c.own DESC, {{ 'c.priority DESC, ' if has_priority }}c.previous_visible_at ASC, c.{{ tie }} ASC;
END;
GO

{{ m.grant('dequeue') }}
GO

{{ m.unit(names.plain('_complete'), 'code') }}
-- Only the holder of a live lease: a late complete, after the lease moved on, changes nothing.
CREATE OR ALTER PROCEDURE {{ names.verb('complete') }}
    @id {{ id_type }},
    @worker nvarchar(201)
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('complete') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ w.complete_statement('@id', '@worker') }}

    SELECT CONVERT(bit, @@ROWCOUNT) AS completed;
END;
GO

{{ m.grant('complete') }}
GO

{{ m.unit(names.plain('_fail'), 'code') }}
-- outcome: retrying | dead | lost (the caller's lease had expired or moved on: nothing changed).
CREATE OR ALTER PROCEDURE {{ names.verb('fail') }}
    @id {{ id_type }},
    @worker nvarchar(201),
    @error nvarchar(4000) = NULL,
    @retry_after_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('fail') }}
    SET @retry_after_seconds = COALESCE(@retry_after_seconds, 0);
    IF @retry_after_seconds NOT BETWEEN 0 AND 2592000
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_fail') ~ ": retry_after_seconds must be between 0 and 2592000, got '", "@retry_after_seconds", "N'.'"]) }}
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @outcome varchar(8);
{{ w.buried_table() }}
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

{{ w.fail_statements('@id', '@worker', '@error', '@retry_after_seconds') | indent(4, first=true) }}

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT @outcome AS outcome;
END;
GO

{{ m.grant('fail') }}
GO

{{ m.unit(names.plain('_extend_lease'), 'code') }}
-- The new lease runs from now. An expired lease cannot be revived: another worker may hold it.
CREATE OR ALTER PROCEDURE {{ names.verb('extend_lease') }}
    @id {{ id_type }},
    @worker nvarchar(201),
    @lease_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('extend_lease') }}
    SET @lease_seconds = COALESCE(@lease_seconds, {{ lease_seconds }});
{{ w.check_lease('extend_lease') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    UPDATE {{ t }}
    SET visible_at = DATEADD(SECOND, @lease_seconds, @now)
    WHERE id = @id AND leased_by = @worker AND visible_at > @now;

    SELECT CONVERT(bit, @@ROWCOUNT) AS extended;
END;
GO

{{ m.grant('extend_lease') }}
GO

{{ m.unit(names.plain('_stats'), 'code') }}
-- EXECUTE AS OWNER: the estimate reads sys.partitions, whose rows a caller holding only the admin
-- role could not see. The procedure only reads.
CREATE OR ALTER PROCEDURE {{ names.verb('stats') }}
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
    -- delayed: not yet due and not leased; in_flight: under a live lease.
    DECLARE @exact_limit bigint = 10000;
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @estimated bit = 0;
    DECLARE @ready bigint = 0;
    DECLARE @delayed bigint = 0;
    DECLARE @oldest_ready datetime2(7);
{% if has_priority %}
    DECLARE @level_oldest datetime2(7);
    DECLARE @priority int = (
        SELECT TOP (1) m.priority
        FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
        ORDER BY m.priority DESC
    );

    -- One priority level at a time, as the claim reads the index.
    WHILE @priority IS NOT NULL AND @ready <= @exact_limit AND @delayed <= @exact_limit
        BEGIN
            SET @ready = @ready + (
                SELECT COUNT_BIG(*)
                FROM (
                    SELECT TOP (@exact_limit + 1 - @ready) m.{{ tie }}
                    FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
                    WHERE m.priority = @priority AND m.visible_at <= @now
                ) AS counted
            );
            SET @delayed = @delayed + (
                SELECT COUNT_BIG(*)
                FROM (
                    SELECT TOP (@exact_limit + 1 - @delayed) m.{{ tie }}
                    FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
                    WHERE m.priority = @priority AND m.visible_at > @now AND m.leased_by IS NULL
                ) AS counted
            );
            SET @level_oldest = (
                SELECT TOP (1) m.visible_at
                FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
                WHERE m.priority = @priority AND m.visible_at <= @now
                ORDER BY m.visible_at ASC, m.{{ tie }} ASC
            );
            IF @oldest_ready IS NULL OR @level_oldest < @oldest_ready SET @oldest_ready = @level_oldest;
            SET @priority = (
                SELECT TOP (1) m.priority
                FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
                WHERE m.priority < @priority
                ORDER BY m.priority DESC
            );
        END;
{% else %}
    SET @ready = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.{{ tie }}
            FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.visible_at <= @now
        ) AS counted
    );
    -- The range after now also holds the in-flight rows: as many as there are leases.
    SET @delayed = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.{{ tie }}
            FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.visible_at > @now AND m.leased_by IS NULL
        ) AS counted
    );
    SET @oldest_ready = (
        SELECT TOP (1) m.visible_at
        FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
        WHERE m.visible_at <= @now
        ORDER BY m.visible_at ASC, m.{{ tie }} ASC
    );
{% endif %}
    DECLARE @in_flight bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.{{ tie }}
            FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.leased_by IS NOT NULL AND m.visible_at > @now
        ) AS counted
    );
    DECLARE @dead bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) d.id
            FROM {{ dead_t }} AS d WITH (READPAST, READCOMMITTEDLOCK)
        ) AS counted
    );

    IF @ready > @exact_limit OR @delayed > @exact_limit OR @in_flight > @exact_limit
        BEGIN
            DECLARE @total_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'{{ t }}') AND p.index_id IN (0, 1)
            );
            SET @estimated = 1;
            -- The catalog's total less the exact counts is the estimate of the one over the limit.
            IF @ready > @exact_limit AND @total_estimate - @delayed - @in_flight > @ready
                SET @ready = @total_estimate - @delayed - @in_flight;
            ELSE IF @delayed > @exact_limit AND @total_estimate - @ready - @in_flight > @delayed
                SET @delayed = @total_estimate - @ready - @in_flight;
            ELSE IF @in_flight > @exact_limit AND @total_estimate - @ready - @delayed > @in_flight
                SET @in_flight = @total_estimate - @ready - @delayed;
        END;
    IF @dead > @exact_limit
        BEGIN
            DECLARE @dead_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'{{ dead_t }}') AND p.index_id IN (0, 1)
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

{{ m.grant('stats') }}
GO

{{ m.unit(names.plain('_purge'), 'code') }}
-- Removes queued messages, leased ones too (their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR ALTER PROCEDURE {{ names.verb('purge') }}
    @older_than datetime2(7) = NULL,
    @max_rows int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_max_rows('purge') }}
    SET XACT_ABORT ON;

    -- Chunks of at most 1,000 rows stay under the lock-escalation threshold, so consumers keep
    -- working; READPAST leaves the rows a claim holds right now (and never waits, so purge and
    -- dequeue cannot deadlock); the bound stops a purge from chasing producers forever. Oldest
    -- first, in the clustered index's order ({{ tie }}). Called in a transaction (the caller's, or an
    -- implicit one), every chunk's locks last until it ends: purge with max_rows and commit between
    -- calls on a busy queue.
    DECLARE @last bigint = (SELECT MAX(m.{{ tie }}) FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK));
    DECLARE @after bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE ({{ tie }} bigint NOT NULL PRIMARY KEY);

    WHILE @chunk > 0
        BEGIN
            SET @chunk = {{ m.purge_chunk_size() }};
            DELETE FROM @deleted;
{% for cutoff in (false, true) %}
            {{ 'ELSE' if cutoff else 'IF @older_than IS NULL' }}
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk) m.{{ tie }}
                        FROM {{ t }} AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE m.{{ tie }} > @after AND m.{{ tie }} <= @last{% if cutoff %} AND m.enqueued_at < @older_than{% endif %}

                        ORDER BY m.{{ tie }}
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.{{ tie }} INTO @deleted ({{ tie }});
                    SET @chunk = @@ROWCOUNT;
                END;
{% endfor %}
            SET @purged = @purged + @chunk;
            SET @after = COALESCE((SELECT MAX(d.{{ tie }}) FROM @deleted AS d), @after);
        END;

    SELECT @purged AS purged;
END;
GO

{{ m.grant('purge') }}
GO

{{ m.unit(names.plain('_dead_list'), 'code') }}
-- Paged by id: pass the last id of a page as after_id to read the next one. (page_size, not
-- `limit`: PostgreSQL reserves that word, and the parameter names are the same in both dialects.)
CREATE OR ALTER PROCEDURE {{ names.verb('dead_list') }}
    @after_id {{ id_type }} = NULL,
    @page_size int = 100
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @page_size IS NULL OR @page_size NOT BETWEEN 1 AND 1000
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_dead_list') ~ ": page_size must be between 1 and 1000, got '", "COALESCE(CONVERT(nvarchar(12), @page_size), N'NULL')", "N'.'"]) }}
        END;
    SET XACT_ABORT ON;

{% for paged in (false, true) %}
    {{ 'ELSE' if paged else 'IF @after_id IS NULL' }}
        BEGIN
            SELECT TOP (@page_size)
                d.id,
                d.payload,
                d.enqueued_at,
                d.due_at,
{% if has_priority %}
                d.priority,
{% endif %}
{% if dedupe %}
                d.dedupe_key,
{% endif %}
                d.attempts,
                d.last_error,
                d.last_worker,
                d.dead_at
            FROM {{ dead_t }} AS d
{% if paged %}
            WHERE d.id > @after_id
{% endif %}
            ORDER BY d.id ASC;
        END;
{% endfor %}
END;
GO

{{ m.grant('dead_list') }}
GO

{{ m.unit(names.plain('_dead_requeue'), 'code') }}
-- Back to the queue under the same id, visible now, attempts reset; the last error stays on the
-- row for reference.
{% if not client_ids %}
-- EXECUTE AS OWNER: keeping the id takes SET IDENTITY_INSERT, which needs ALTER on the table.
{% endif %}
CREATE OR ALTER PROCEDURE {{ names.verb('dead_requeue') }}
    @id {{ id_type }}
{% if not client_ids %}
    WITH EXECUTE AS OWNER
{% endif %}
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @id IS NULL
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_dead_requeue') ~ ": id must not be NULL.'") }}
        END;
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @found bit = 0;
    DECLARE @taken_id {{ id_type }};
{% if dedupe %}
    DECLARE @key nvarchar(200);
    DECLARE @locked_key nvarchar(200);
    DECLARE @key_holder {{ id_type }};
{% endif %}
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- Queue table first, the fixed lock order: the id's place in the queue{% if client_ids %} (the same client id
        -- may have been enqueued again){% else %}, held so that nothing
        -- else can insert it{% endif %}. A concurrent requeue of the same id waits here.
        SELECT @taken_id = m.id
        FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
        WHERE m.id = @id;
{% if dedupe %}

        -- The key to lock in the queue table, before the dead row is locked (queue first): read
        -- without keeping a lock, and checked again below under the dead row's lock.
        SET @key = (
            SELECT d.dedupe_key
            FROM {{ dead_t }} AS d
            WHERE d.id = @id
        );
        IF @key IS NOT NULL
            BEGIN
                SELECT @key_holder = m.id
                FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.dedupe_key = @key AND m.dedupe_key IS NOT NULL;
            END;
{% endif %}

        -- Then the dead row, locked to the end of the transaction: a concurrent delete of it waits
        -- here and then finds it gone (not_found), instead of colliding with this insert (2627).
{% if dedupe %}
        SELECT
            @found = 1,
            @locked_key = d.dedupe_key
{% else %}
        SELECT @found = 1
{% endif %}
        FROM {{ dead_t }} AS d WITH (UPDLOCK, HOLDLOCK)
        WHERE d.id = @id;
        IF @found = 0
            BEGIN
{{ w.throw('not_found', ["N'" ~ names.plain('_dead_requeue') ~ ": no dead-letter message with id '", "CONVERT(nvarchar(36), @id)", "N'.'"]) | indent(4, first=true) }}
            END;
        IF @taken_id IS NOT NULL
            BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_dead_requeue') ~ ": a message with id '", "CONVERT(nvarchar(36), @id)", "N' is queued already.'"]) | indent(4, first=true) }}
            END;
{% if not client_ids %}

        SET IDENTITY_INSERT {{ t }} ON;
{% endif %}

        -- Queue table, then dead table: insert the copy, then delete. The message keeps its key
        -- unless the key was enqueued again since (or is not the key locked above): it then comes
        -- back without it rather than not at all (requeue is an operator's deliberate action).
        INSERT INTO {{ t }} (
            id, enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}attempts, last_error, payload
        )
        SELECT
            d.id,
            d.enqueued_at,
            d.due_at,
            @now AS visible_at,
{% if has_priority %}
            d.priority,
{% endif %}
{% if dedupe %}
            IIF(@key_holder IS NULL AND @locked_key = @key, @locked_key, NULL) AS dedupe_key,
{% endif %}
            0 AS attempts,
            d.last_error,
            d.payload
        FROM {{ dead_t }} AS d
        WHERE d.id = @id;
{% if not client_ids %}

        SET IDENTITY_INSERT {{ t }} OFF;
{% endif %}

        DELETE FROM {{ dead_t }}
        WHERE id = @id;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
{% if not client_ids %}
        SET IDENTITY_INSERT {{ t }} OFF;
{% endif %}
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT CONVERT(bit, 1) AS requeued;
END;
GO

{{ m.grant('dead_requeue') }}
GO

{{ m.unit(names.plain('_dead_delete'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('dead_delete') }}
    @id {{ id_type }}
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @id IS NULL
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_dead_delete') ~ ": id must not be NULL.'") }}
        END;
    SET XACT_ABORT ON;

    BEGIN TRY
        DELETE FROM {{ dead_t }}
        WHERE id = @id;

        IF @@ROWCOUNT = 0
            BEGIN
{{ w.throw('not_found', ["N'" ~ names.plain('_dead_delete') ~ ": no dead-letter message with id '", "CONVERT(nvarchar(36), @id)", "N'.'"]) | indent(4, first=true) }}
            END;
    END TRY
    BEGIN CATCH
        THROW;
    END CATCH;

    SELECT CONVERT(bit, 1) AS deleted; -- noqa: RF04
END;
GO

{{ m.grant('dead_delete') }}
GO
{% if history %}

{{ m.unit(names.plain('_history_purge'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('history_purge') }}
    @older_than datetime2(7) = NULL,
    @max_rows int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_max_rows('history_purge') }}
    SET XACT_ABORT ON;

    -- Default: the retention of option history_retention_days ({{ opt.history_retention_days }}).
    SET @older_than = COALESCE(@older_than, DATEADD(DAY, -{{ opt.history_retention_days }}, SYSUTCDATETIME()));
    DECLARE @after_finished datetime2(7) = '0001-01-01';
    DECLARE @after_id bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE (history_id bigint NOT NULL PRIMARY KEY, finished_at datetime2(7) NOT NULL);

    -- A range at the start of the clustered index (finished_at, history_id), oldest first, in
    -- chunks below the lock-escalation threshold, each from where the last one ended.
    WHILE @chunk > 0
        BEGIN
            SET @chunk = {{ m.purge_chunk_size() }};
            DELETE FROM @deleted;
            WITH doomed AS (
                SELECT TOP (@chunk)
                    h.history_id,
                    h.finished_at
                FROM {{ history_t }} AS h WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
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

{{ m.grant('history_purge') }}
GO
{% endif %}
{% if handler %}
{% set handler_parts = handler.split('.') if '.' in handler else [schema, handler] %}

{{ m.unit(names.plain('_process'), 'code') }}
-- The in-database worker (Darling's loop): claim one message and commit (the attempt and the lease
-- are durable before the handler runs, so a session that dies mid-message still counts it), run
-- the handler, complete in the same transaction as the handler's own writes, commit; or, when the
-- handler raises, roll its writes back and record its error with fail. Safe to run from many
-- sessions (SQL Agent jobs) at once: each is its own worker, 'process:<session id>'.
CREATE OR ALTER PROCEDURE {{ names.verb('process') }}
    @time_budget_seconds int = 60
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    -- It commits once per message, so it must not run inside a caller's transaction, nor for a
    -- caller in implicit-transaction mode (ODBC/JDBC autocommit off), whose driver commits or rolls
    -- back what the session did as one transaction: an error would undo earlier messages' work.
    IF @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0
        BEGIN
{{ w.throw('in_transaction', ["N'" ~ names.plain('_process') ~ ": commits once per message: call it in autocommit mode, '", "N'outside any transaction (not with IMPLICIT_TRANSACTIONS ON).'"]) }}
        END;
    IF @time_budget_seconds IS NULL OR @time_budget_seconds NOT BETWEEN 1 AND 86400
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_process') ~ ": time_budget_seconds must be between 1 and 86400, got '", "COALESCE(CONVERT(nvarchar(12), @time_budget_seconds), N'NULL')", "N'.'"]) }}
        END;

    -- The handler's name is a validated catalog value, quoted here; EXEC @name calls it without
    -- building any SQL text.
    DECLARE @handler_name nvarchar(300) = QUOTENAME(N'{{ handler_parts[0] }}') + N'.' + QUOTENAME(N'{{ handler_parts[1] }}');
    IF OBJECT_ID(@handler_name, N'P') IS NULL
        BEGIN
{{ w.throw('no_handler', ["N'" ~ names.plain('_process') ~ ": handler procedure '", "@handler_name", "N' does not exist.'"]) }}
        END;
    SET XACT_ABORT ON;

    DECLARE @batch_size int = 1;
    DECLARE @worker nvarchar(200) = CONCAT(N'process:', @@SPID);
    DECLARE @lease_seconds int = {{ lease_seconds }};
    DECLARE @deadline datetime2(7) = DATEADD(SECOND, @time_budget_seconds, SYSUTCDATETIME());
    DECLARE @processed bigint = 0;
    DECLARE @completed bigint = 0;
    DECLARE @failed bigint = 0;
    DECLARE @id {{ id_type }};
    DECLARE @payload {{ payload_type }};
    DECLARE @error nvarchar(4000);
    DECLARE @error_number int;
    DECLARE @transient_retries int;
    DECLARE @pause datetime;
    DECLARE @outcome varchar(8);
{{ w.claimed_table() }}

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
{{ w.claim() | indent(12, first=true) }}
            END TRY
            BEGIN CATCH
                IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @claim_retries >= 3 THROW;
                SET @claim_retries = @claim_retries + 1;
{{ w.transient_pause() | indent(12, first=true) }}
                CONTINUE;
            END CATCH;
            SET @claim_retries = 0;

            SET @id = NULL;
            SELECT
                @id = c.id,
                @payload = c.payload
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
{{ w.complete_statement('@id', '@worker') | indent(20, first=true) }}
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
                        IF @error_number NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 BREAK;
                        SET @transient_retries = @transient_retries + 1;
                        SET @error = NULL;
{{ w.transient_pause() | indent(20, first=true) }}
                    END CATCH;
                END;

            -- The handler's error, recorded with fail.
            SET @transient_retries = 0;
            WHILE @error IS NOT NULL
                BEGIN
                    BEGIN TRY
                        SET @now = SYSUTCDATETIME();
                        BEGIN TRANSACTION;
{{ w.fail_statements('@id', '@worker', '@error', '0') | indent(20, first=true) }}
                        COMMIT TRANSACTION;
                        IF @outcome <> 'lost' SET @failed = @failed + 1;
                        SET @error = NULL;
                    END TRY
                    BEGIN CATCH
                        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                        IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 THROW;
                        SET @transient_retries = @transient_retries + 1;
{{ w.transient_pause() | indent(20, first=true) }}
                    END CATCH;
                END;
        END;

    SELECT
        @processed AS processed,
        @completed AS completed,
        @failed AS failed;
END;
GO

{{ m.grant('process') }}
GO
{% endif %}
