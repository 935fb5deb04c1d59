{#-
  The destructive kinds (heap, fifo, lifo, pending) share one shape: a dequeue deletes the rows it
  hands out, in the caller's transaction. The including template sets:
    claim_order  'none' | 'oldest' | 'newest' | 'due'
    strict       true only for strict FIFO (consumers serialise: no READPAST)
-#}
{% import '_macros.sql' as m with context %}
{% set has_due = claim_order == 'due' %}
{% set dedupe = opt.dedupe %}
{% set t = names.obj() %}
{% set key_columns = 'due_at, id' if has_due else 'id' %}
{% set claim_hints = 'ROWLOCK, UPDLOCK, READCOMMITTEDLOCK' if strict else 'ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK' %}
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

{{ m.unit(names.plain(), 'storage') }}
IF OBJECT_ID(N'{{ t }}', N'U') IS NULL
BEGIN
    CREATE TABLE {{ t }} (
        id bigint IDENTITY (1, 1) NOT NULL,
        enqueued_at datetime2(7) NOT NULL
            CONSTRAINT {{ names.index('df', 'enqueued_at') }} DEFAULT (SYSUTCDATETIME()),
{% if has_due %}
        due_at datetime2(7) NOT NULL,
{% endif %}
{% if dedupe %}
        dedupe_key nvarchar(200) NULL,
{% endif %}
        payload {{ payload_type }} NOT NULL,
{% if is_json %}
        CONSTRAINT {{ names.index('ck', 'payload_json') }} CHECK (ISJSON(payload) = 1),
{% endif %}
        -- The clustered key is the dequeue order, so a claim is a seek to one end of the index.
        CONSTRAINT {{ names.index('pk') }} PRIMARY KEY CLUSTERED ({{ key_columns }})
    );
{% if dedupe %}
    -- Filtered, so messages without a key cost nothing; IGNORE_DUP_KEY is not allowed on a
    -- filtered index, so enqueue checks under a key-range lock and reports the duplicate itself.
    CREATE UNIQUE NONCLUSTERED INDEX {{ names.index('ux', 'dedupe') }}
    ON {{ t }} (dedupe_key)
    WHERE dedupe_key IS NOT NULL;
{% endif %}
END;
GO

IF TYPE_ID(N'{{ names.obj("_items") }}') IS NULL
BEGIN
    CREATE TYPE {{ names.obj("_items") }} AS TABLE (
        ordinal int NOT NULL PRIMARY KEY,
        payload {{ payload_type }} NULL,
{% if has_due %}
        due_at datetime2(7) NULL,
{% endif %}
        dedupe_key nvarchar(200) NULL
    );
END;
GO

{{ m.unit(names.plain('_enqueue'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('enqueue') }}
    @payload {{ payload_type }},
{% if has_due %}
    @due_at datetime2(7) = NULL,
{% endif %}
    @dedupe_key nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;

{{ m.check_payload('enqueue') }}
{% if has_due %}
    DECLARE @effective_due_at datetime2(7) = COALESCE(@due_at, SYSUTCDATETIME());
{% endif %}
{% if dedupe %}
{{ m.check_dedupe_key('enqueue') }}

    IF @dedupe_key IS NOT NULL
    BEGIN
        -- UPDLOCK + HOLDLOCK lock the key (or the gap where it would go) until the insert is done,
        -- so two racing callers cannot both miss the existing row.
        DECLARE @started_transaction bit = 0;
        DECLARE @existing_id bigint;
        BEGIN TRY
            IF @@TRANCOUNT = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

            SELECT @existing_id = m.id
            FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
            WHERE m.dedupe_key = @dedupe_key;

            IF @existing_id IS NULL
            BEGIN
                INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}dedupe_key, payload)
                VALUES ({% if has_due %}@effective_due_at, {% endif %}@dedupe_key, @payload);
            END;

            IF @started_transaction = 1 COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;

        SELECT
            COALESCE(@existing_id, CONVERT(bigint, SCOPE_IDENTITY())) AS id,
            CONVERT(bit, CASE WHEN @existing_id IS NULL THEN 0 ELSE 1 END) AS duplicate;
        RETURN;
    END;
{% endif %}

    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}payload)
    OUTPUT inserted.id, CONVERT(bit, 0) AS duplicate
    VALUES ({% if has_due %}@effective_due_at, {% endif %}@payload);
END;
GO

{{ m.grant('enqueue') }}
GO

{{ m.unit(names.plain('_enqueue_batch'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('enqueue_batch') }}
    @items {{ names.obj("_items") }} READONLY
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;

    DECLARE @bad_ordinal int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE i.payload IS NULL{% if is_json %} OR ISJSON(i.payload) = 0{% endif %}

    );
    IF @bad_ordinal IS NOT NULL
    BEGIN
{{ m.throw('invalid_payload', "CONCAT(N'" ~ names.plain('_enqueue_batch') ~ ": item ', @bad_ordinal, N' has a NULL" ~ (" or invalid JSON" if is_json else "") ~ " payload.')") }}
    END;

    DECLARE @new_ids TABLE (id bigint NOT NULL PRIMARY KEY);
{% if dedupe %}
    DECLARE @existing TABLE (dedupe_key nvarchar(200) NOT NULL PRIMARY KEY, id bigint NOT NULL);
    DECLARE @started_transaction bit = 0;
    BEGIN TRY
        IF @@TRANCOUNT = 0
        BEGIN
            BEGIN TRANSACTION;
            SET @started_transaction = 1;
        END;

        -- Lock every key of the batch (present or not) before inserting; see enqueue.
        INSERT INTO @existing (dedupe_key, id)
        SELECT m.dedupe_key, m.id
        FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
        WHERE m.dedupe_key IN (SELECT i.dedupe_key FROM @items AS i);

        -- Identity values follow the ORDER BY of an INSERT ... SELECT, which is what maps ids
        -- back to ordinals below.
        INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}dedupe_key, payload)
        OUTPUT inserted.id INTO @new_ids (id)
        SELECT {% if has_due %}COALESCE(i.due_at, SYSUTCDATETIME()), {% endif %}i.dedupe_key, i.payload
        FROM @items AS i
        WHERE
            i.dedupe_key IS NULL
            OR (
                NOT EXISTS (SELECT 1 / 0 FROM @existing AS e WHERE e.dedupe_key = i.dedupe_key)
                AND NOT EXISTS (
                    SELECT 1 / 0 FROM @items AS earlier
                    WHERE earlier.dedupe_key = i.dedupe_key AND earlier.ordinal < i.ordinal
                )
            )
        ORDER BY i.ordinal;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    WITH inserted_items AS (
        SELECT
            i.ordinal,
            i.dedupe_key,
            ROW_NUMBER() OVER (ORDER BY i.ordinal) AS position
        FROM @items AS i
        WHERE
            i.dedupe_key IS NULL
            OR (
                NOT EXISTS (SELECT 1 / 0 FROM @existing AS e WHERE e.dedupe_key = i.dedupe_key)
                AND NOT EXISTS (
                    SELECT 1 / 0 FROM @items AS earlier
                    WHERE earlier.dedupe_key = i.dedupe_key AND earlier.ordinal < i.ordinal
                )
            )
    ),

    numbered_ids AS (
        SELECT
            n.id,
            ROW_NUMBER() OVER (ORDER BY n.id) AS position
        FROM @new_ids AS n
    ),

    inserted_map AS (
        SELECT
            ii.ordinal,
            ii.dedupe_key,
            ni.id
        FROM inserted_items AS ii
        INNER JOIN numbered_ids AS ni ON ni.position = ii.position
    )

    SELECT
        i.ordinal,
        COALESCE(own.id, e.id, first_in_batch.id) AS id,
        CONVERT(bit, CASE WHEN own.id IS NULL THEN 1 ELSE 0 END) AS duplicate
    FROM @items AS i
    LEFT JOIN inserted_map AS own ON own.ordinal = i.ordinal
    LEFT JOIN @existing AS e ON e.dedupe_key = i.dedupe_key
    LEFT JOIN inserted_map AS first_in_batch ON first_in_batch.dedupe_key = i.dedupe_key
    ORDER BY i.ordinal;
{% else %}
    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}payload)
    OUTPUT inserted.id INTO @new_ids (id)
    SELECT {% if has_due %}COALESCE(i.due_at, SYSUTCDATETIME()), {% endif %}i.payload
    FROM @items AS i
    ORDER BY i.ordinal;

    -- Identity values follow the ORDER BY of an INSERT ... SELECT: the n-th id is the n-th item.
    WITH numbered_items AS (
        SELECT
            i.ordinal,
            ROW_NUMBER() OVER (ORDER BY i.ordinal) AS position
        FROM @items AS i
    ),

    numbered_ids AS (
        SELECT
            n.id,
            ROW_NUMBER() OVER (ORDER BY n.id) AS position
        FROM @new_ids AS n
    )

    SELECT
        ni.ordinal,
        nid.id,
        CONVERT(bit, 0) AS duplicate
    FROM numbered_items AS ni
    INNER JOIN numbered_ids AS nid ON nid.position = ni.position
    ORDER BY ni.ordinal;
{% endif %}
END;
GO

GRANT EXECUTE ON TYPE::{{ names.obj("_items") }} TO {{ names.role('enqueue_batch') }};
GO

{{ m.grant('enqueue_batch') }}
GO

{{ m.unit(names.plain('_dequeue'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('dequeue') }}
    @batch_size int = 1
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;

{{ m.check_batch_size('dequeue') }}

{% if claim_order == 'none' %}
    -- A heap promises no order: DELETE TOP takes whatever unlocked rows the clustered index
    -- offers first. READCOMMITTEDLOCK keeps READPAST meaningful under READ_COMMITTED_SNAPSHOT.
    DELETE TOP (@batch_size)
    FROM {{ t }} WITH ({{ claim_hints }})
    OUTPUT deleted.id, deleted.payload, deleted.enqueued_at;
{% else %}
    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY,
        payload {{ payload_type }} NOT NULL,
{% if has_due %}
        due_at datetime2(7) NOT NULL,
{% endif %}
        enqueued_at datetime2(7) NOT NULL
    );
{% if strict %}

    -- Strict order: no READPAST, so a consumer waits behind the row another consumer holds
    -- until that transaction commits (row gone) or rolls back (row handed out again, in order).
{% endif %}

    WITH next_messages AS (
        SELECT TOP (@batch_size)
            m.id,
            m.payload,
{% if has_due %}
            m.due_at,
{% endif %}
            m.enqueued_at
        FROM {{ t }} AS m WITH ({{ claim_hints }})
{% if has_due %}
        WHERE m.due_at <= SYSUTCDATETIME()
        ORDER BY m.due_at, m.id
{% elif claim_order == 'newest' %}
        ORDER BY m.id DESC
{% else %}
        ORDER BY m.id
{% endif %}
    )

    DELETE FROM next_messages
    OUTPUT deleted.id, deleted.payload, {% if has_due %}deleted.due_at, {% endif %}deleted.enqueued_at
    INTO @claimed (id, payload, {% if has_due %}due_at, {% endif %}enqueued_at);

    SELECT
        c.id,
        c.payload,
        c.enqueued_at{% if has_due %},
        c.due_at{% endif %}

    FROM @claimed AS c
{% if has_due %}
    ORDER BY c.due_at, c.id;
{% elif claim_order == 'newest' %}
    ORDER BY c.id DESC;
{% else %}
    ORDER BY c.id;
{% endif %}
{% endif %}
END;
GO

{{ m.grant('dequeue') }}
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

    -- Counting stops at exact_limit rows; past that the row count comes from the catalog, so a
    -- deep queue never costs a full scan (NServiceBus.SqlServer #481).
    DECLARE @exact_limit bigint = 10000;
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @estimated bit = 0;
    DECLARE @ready bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.id
            FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
{% if has_due %}
            WHERE m.due_at <= @now
{% endif %}
        ) AS counted
    );
{% if has_due %}
    DECLARE @delayed bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.id
            FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.due_at > @now
        ) AS counted
    );
{% else %}
    DECLARE @delayed bigint = 0;
{% endif %}
    DECLARE @total_estimate bigint = (
        SELECT SUM(p.rows)
        FROM sys.partitions AS p
        WHERE p.object_id = OBJECT_ID(N'{{ t }}') AND p.index_id IN (0, 1)
    );

    IF @ready > @exact_limit{% if has_due %} OR @delayed > @exact_limit{% endif %}

    BEGIN
        SET @estimated = 1;
{% if has_due %}
        IF @ready > @exact_limit
            SET @ready = IIF(@total_estimate - @delayed > @ready, @total_estimate - @delayed, @ready);
        ELSE
            SET @delayed = IIF(@total_estimate - @ready > @delayed, @total_estimate - @ready, @delayed);
{% else %}
        SET @ready = IIF(@total_estimate > @ready, @total_estimate, @ready);
{% endif %}
    END;

    DECLARE @oldest_ready datetime2(7) = (
        SELECT TOP (1) m.{{ 'due_at' if has_due else 'enqueued_at' }}
        FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
{% if has_due %}
        WHERE m.due_at <= @now
        ORDER BY m.due_at, m.id
{% else %}
        ORDER BY m.id
{% endif %}
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

{{ m.grant('stats') }}
GO

{{ m.unit(names.plain('_purge'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('purge') }}
    @older_than datetime2(7) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;

    -- Small chunks stay under the 5,000-lock escalation threshold, READPAST leaves rows that a
    -- consumer holds, and the id bound stops a purge from chasing a producer forever.
    DECLARE @last_id bigint = (SELECT MAX(m.id) FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK));
    DECLARE @purged bigint = 0;
    DECLARE @deleted int = 1;

    WHILE @deleted > 0
    BEGIN
        IF @older_than IS NULL
        BEGIN
            DELETE TOP (4000)
            FROM {{ t }} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
            WHERE id <= @last_id;
        END;
        ELSE
        BEGIN
            DELETE TOP (4000)
            FROM {{ t }} WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
            WHERE id <= @last_id AND enqueued_at < @older_than;
        END;
        SET @deleted = @@ROWCOUNT;
        SET @purged += @deleted;
    END;

    SELECT @purged AS purged;
END;
GO

{{ m.grant('purge') }}
GO
