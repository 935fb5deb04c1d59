{#-
  The destructive kinds (heap, fifo, lifo, pending) share one shape: a dequeue deletes the rows it
  hands out, in the caller's transaction. The including template sets:
    claim_order  'none' | 'oldest' | 'newest' | 'due'
    strict       true only for strict FIFO (consumers serialise: no READPAST)
  fifo also reads option groups (message groups: docs/queue-kinds.md, Message groups).
  docs/queue-kinds.md explains the storage, index and locking choices; keep it in step.
-#}
{% import '_macros.sql' as m with context %}
{% set has_due = claim_order == 'due' %}
{% set dedupe = opt.dedupe %}
{% set groups = opt.get('groups', false) %}
{% set group_shape = ('groups',) if groups else () %}
{% set t = names.obj() %}
{% set items = names.obj("_items") %}
{#- Every claim and probe reads the clustered index, whose key is the claim's ORDER BY (docs/queue-kinds.md,
    "Plans at depth"); FORCESEEK where the claim has a predicate on that key (pending's due_at): without
    one there is nothing to seek and FORCESEEK would find no plan (8622). -#}
{% import '_pinned_indexes.sql' as pins with context %}
{% set pk = pins.pk %}
{% set pin = 'INDEX (' ~ pk ~ '), FORCESEEK' if has_due else 'INDEX (' ~ pk ~ ')' %}
{% if groups %}
{% import '_group_macros.sql' as grp with context %}
{% endif %}
{% set claim_hints = pin ~ (', ROWLOCK, UPDLOCK, READCOMMITTEDLOCK' if strict else ', ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK') %}
{#- Dedupe keys compare byte for byte, as text does on PostgreSQL (a case-insensitive database
    collation would make 'A' and 'a' the same key). Trailing spaces still compare equal on SQL Server. -#}
{% set key_type = 'nvarchar(200) COLLATE Latin1_General_100_BIN2' %}
{% if has_due %}
{% set claim_order_sql = 'm.due_at, m.id' %}
{% elif claim_order == 'newest' %}
{% set claim_order_sql = 'm.id DESC' %}
{% else %}
{% set claim_order_sql = 'm.id' %}
{% endif %}
{#- enqueue's insert of a message that is not a duplicate (@id NULL), the end of its transaction and
    its result; columns and values_sql: the INSERT's lists. -#}
{% macro insert_unless_duplicate(columns, values_sql) %}
        IF @id IS NULL
            BEGIN
                INSERT INTO {{ t }} ({{ columns }})
                VALUES ({{ values_sql }});
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
{%- endmacro %}
{% if groups %}
{#- fifo with groups: enqueue joins the message's group first (the fixed lock order: the groups row,
    then the queue table; docs/queue-kinds.md, Message groups), in a transaction of its own when the
    caller has none, so that the group's lock or pin lasts until the message commits. -#}
{% macro grouped_enqueue_body() %}
    IF DATALENGTH(@group_key) > 400
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain("_enqueue") }}: group_key is longer than 200 characters.', 1;
        END;
{% if dedupe %}
    IF DATALENGTH(@dedupe_key) > 400
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain("_enqueue") }}: dedupe_key is over 200 characters.', 1;
        END;
{% else %}
    IF @dedupe_key IS NOT NULL
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain("_enqueue") }}: dedupe_key needs option dedupe.', 1;
        END;
{% endif %}
    SET XACT_ABORT ON;

    -- Variables take the database collation; compared with the columns, the columns' BIN2 wins.
    DECLARE @group nvarchar(200) = @group_key;
{% if dedupe %}
    DECLARE @key nvarchar(200) = @dedupe_key;
{% endif %}
    DECLARE @group_head bit;
    DECLARE @group_joined bit;
    DECLARE @id bigint;
    DECLARE @duplicate bit = 0;
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens: BEGIN TRANSACTION there would open a second level (266).
        IF (@group IS NOT NULL{% if dedupe %} OR @key IS NOT NULL{% endif %}) AND @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        IF @group IS NOT NULL
            BEGIN
                {{ grp.join_group() | indent(16) }}
            END;
{% if dedupe %}

        IF @key IS NOT NULL
            BEGIN
                -- UPDLOCK + HOLDLOCK keep the key, or the gap where it would go, locked until the
                -- transaction ends: a racing caller with the same key waits here, then finds this row.
                SELECT @id = m.id
                FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.dedupe_key = @key AND m.dedupe_key IS NOT NULL;
            END;
{% endif %}

{{ insert_unless_duplicate(('dedupe_key, ' if dedupe else '') ~ 'group_key, group_head, payload',
                           ('@key, ' if dedupe else '') ~ '@group, @group_head, @payload') }}
{%- endmacro %}
{% endif %}
{#- Pieces of enqueue_batch with dedupe, shared by its grouped form. -#}
{% macro dedupe_batch_declarations() %}
    DECLARE @keys TABLE (dedupe_key {{ key_type }} NOT NULL PRIMARY KEY); -- noqa: CP02
    DECLARE @existing TABLE (
        dedupe_key {{ key_type }} NOT NULL PRIMARY KEY, -- noqa: CP02
        id bigint NOT NULL
    );
{%- endmacro %}
{% macro dedupe_batch_keys() %}
    INSERT INTO @keys (dedupe_key)
    SELECT DISTINCT i.dedupe_key
    FROM @items AS i
    WHERE i.dedupe_key IS NOT NULL;
{%- endmacro %}
{% macro dedupe_batch_lock() %}
        -- Lock every key of the batch, present or not (see enqueue), walking the keys in index order:
        -- two batches that share keys then wait for each other instead of deadlocking.
        INSERT INTO @existing (dedupe_key, id)
        SELECT
            m.dedupe_key,
            m.id
        FROM @keys AS k
        INNER JOIN {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
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
{%- endmacro %}
{% macro dedupe_batch_result() %}
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
{%- endmacro %}
{% if groups %}
{#- enqueue_batch with groups: the batch's distinct groups joined one at a time in key order (the
    fixed lock order, as enqueue), then the rows. The first item the batch inserts into a group that
    was empty, or held by someone else, is a head candidate; every other item waits (a candidate per
    item would cost every claim a skipped row each while the group is held). -#}
{% macro grouped_batch_body() %}
    DECLARE @joined TABLE (
        group_key {{ key_type }} NOT NULL PRIMARY KEY, -- noqa: CP02
        group_head bit NOT NULL
    );
    DECLARE @group nvarchar(200);
    DECLARE @group_head bit;
    DECLARE @group_joined bit;
{% if dedupe %}
{{ dedupe_batch_declarations() }}
{% endif %}
    DECLARE @started_transaction bit = 0;

    INSERT INTO @joined (group_key, group_head)
    SELECT DISTINCT
        i.group_key,
        CONVERT(bit, 0) AS group_head
    FROM @items AS i
    WHERE i.group_key IS NOT NULL;
{% if dedupe %}

{{ dedupe_batch_keys() }}
{% endif %}

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        {{ grp.join_groups_in_order() | indent(8) }}

{% if dedupe %}
{{ dedupe_batch_lock() }}
{% else %}
        INSERT INTO @candidates (ordinal, position)
        SELECT
            i.ordinal,
            ROW_NUMBER() OVER (ORDER BY i.ordinal) AS position
        FROM @items AS i;
{% endif %}

        -- Identity values are assigned in the ORDER BY of an INSERT ... SELECT: the n-th new id
        -- belongs to the n-th candidate, which is how ids are mapped back to ordinals below.
        INSERT INTO {{ t }} ({% if dedupe %}dedupe_key, {% endif %}group_key, group_head, payload)
        OUTPUT INSERTED.id INTO @new_ids (id)
        SELECT
{% if dedupe %}
            i.dedupe_key,
{% endif %}
            i.group_key,
            CONVERT(bit, CASE
                WHEN i.group_key IS NULL THEN NULL
                WHEN j.group_head = 1 AND ROW_NUMBER() OVER (PARTITION BY i.group_key ORDER BY c.position) = 1 THEN 1
                ELSE 0
            END) AS group_head,
            i.payload
        FROM @items AS i
        INNER JOIN @candidates AS c ON i.ordinal = c.ordinal
        LEFT JOIN @joined AS j ON i.group_key = j.group_key
        ORDER BY c.position;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

{% if dedupe %}
{{ dedupe_batch_result() }}
{% else %}
    WITH numbered_ids AS (
        SELECT
            n.id,
            ROW_NUMBER() OVER (ORDER BY n.id) AS position
        FROM @new_ids AS n
    )

    SELECT
        c.ordinal,
        ni.id,
        CONVERT(bit, 0) AS duplicate
    FROM @candidates AS c
    INNER JOIN numbered_ids AS ni ON c.position = ni.position
    ORDER BY c.ordinal;
{% endif %}
{%- endmacro %}
{% endif %}
{% if groups %}
{#- dequeue with groups: messages without a group are claimed on ix_<q>_ungrouped, grouped ones a
    group at a time (docs/queue-kinds.md, Message groups): step through the head candidates of
    ix_<q>_heads (lock-free), take each one's group without waiting, delete the group's real head
    and flag its next one. The groups stay locked until the transaction ends: that is the consumer
    holding its groups, and a rollback restores heads and flags alike. The source whose first
    message is older goes first, the other fills the batch. -#}
{% macro grouped_dequeue_body() %}
    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        group_key {{ key_type }} NULL -- noqa: CP02
    );
    DECLARE @visited TABLE (group_key {{ key_type }} NOT NULL PRIMARY KEY); -- noqa: CP02
    DECLARE @taken int;
    DECLARE @remaining int = @batch_size;
    DECLARE @oldest_ungrouped bigint;
    DECLARE @oldest_head bigint;
    DECLARE @grouped_first bit;
    DECLARE @pass int = 0;
    DECLARE @after_id bigint;
    DECLARE @candidate_id bigint;
    DECLARE @group nvarchar(200);
    DECLARE @head_id bigint;
    DECLARE @next_id bigint;
    DECLARE @waiting_id bigint;
    DECLARE @flagged_id bigint;
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- The groups this call takes stay held until the transaction ends: without a caller's
        -- transaction the call is one (in implicit-transaction mode the caller owns the one the next
        -- statement opens).
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        SELECT TOP (1) @oldest_ungrouped = m.id
        FROM {{ t }} AS m WITH (INDEX ({{ grp.ungrouped_ix }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.group_key IS NULL
        ORDER BY m.id;
        SELECT TOP (1) @oldest_head = m.id
        FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.group_head = 1
        ORDER BY m.id;
        SET @grouped_first = IIF(@oldest_ungrouped IS NULL OR @oldest_head < @oldest_ungrouped, 1, 0);

        WHILE @pass < 2 AND @remaining > 0
            BEGIN
                IF (@pass = 0 AND @grouped_first = 0) OR (@pass = 1 AND @grouped_first = 1)
                    BEGIN
                        -- READPAST skips rows other consumers hold; the index's key is the ORDER BY.
                        WITH next_messages AS (
                            SELECT TOP (@remaining)
                                m.id,
                                m.payload,
                                m.enqueued_at,
                                m.group_key
                            FROM {{ t }} AS m WITH (INDEX ({{ grp.ungrouped_ix }}), ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                            WHERE m.group_key IS NULL
                            ORDER BY m.id
                        )

                        DELETE FROM next_messages
                        OUTPUT DELETED.id, DELETED.payload, DELETED.enqueued_at, DELETED.group_key
                        INTO @claimed (id, payload, enqueued_at, group_key);
                        SET @remaining = @remaining - @@ROWCOUNT;
                    END;
                ELSE
                    BEGIN
                        SET @after_id = 0;
                        WHILE @remaining > 0
                            BEGIN
                                -- The next head candidate (lock-free): a held group's flagged rows are
                                -- locked by its holder, READPAST steps over them.
                                SET @candidate_id = NULL;
                                SELECT TOP (1)
                                    @candidate_id = m.id,
                                    @group = m.group_key
                                FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                WHERE
                                    m.group_head = 1 AND m.id > @after_id
                                    AND NOT EXISTS (
                                        SELECT 1
                                        FROM @visited AS v
                                        WHERE v.group_key = m.group_key
                                    )
                                ORDER BY m.id;
                                IF @candidate_id IS NULL BREAK;
                                SET @after_id = @candidate_id;

                                -- The candidate only led here: take the group (never waiting), then its
                                -- real head, in new statements that see what committed before the lock.
                                -- A group is tried once a call: taken or not, it goes into @visited, and
                                -- the probe steps over its other candidates (a held group's spurious
                                -- ones) without trying them one by one.
                                {{ grp.take_group('@group') | indent(32) }}
                                SET @taken = @@ROWCOUNT;
                                INSERT INTO @visited (group_key) VALUES (@group);
                                IF @taken = 0 CONTINUE;

                                {{ grp.find_head('@head_id') | indent(32) }}
                                WITH head AS (
                                    SELECT
                                        m.id,
                                        m.payload,
                                        m.enqueued_at,
                                        m.group_key
                                    FROM {{ t }} AS m WITH (INDEX ({{ pk }}), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE m.id = @head_id
                                )

                                DELETE FROM head
                                OUTPUT DELETED.id, DELETED.payload, DELETED.enqueued_at, DELETED.group_key
                                INTO @claimed (id, payload, enqueued_at, group_key);
                                SET @remaining = @remaining - @@ROWCOUNT;
                                {{ grp.settle() | indent(32) }}
                            END;
                    END;
                SET @pass = @pass + 1;
            END;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        c.id,
        c.payload,
        c.enqueued_at,
        c.group_key
    FROM @claimed AS c
    ORDER BY c.id;
{%- endmacro %}
{% endif %}
{% if groups %}
{#- purge with groups: grouped messages go only with their group held (READPAST: the messages of a
    group a consumer or producer holds stay for the next purge), the groups row first (the fixed
    lock order); the holder then flags the group's new head. Groups left empty lose their rows
    afterwards, outside any caller's transaction, each without waiting (drop_if_empty). Each
    chunk is a transaction of its own without the caller's, and the purge is the deadlock victim:
    a deadlock in its own transaction retries the chunk. -#}
{% macro grouped_purge_body() %}
{{ grp.purge_body() }}
{%- endmacro %}
{% endif %}
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

{{ m.unit(names.plain(), 'storage', version=1, object='table', shape=('payload', 'dedupe') + group_shape) }}
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
            dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
{% if groups %}
            group_key {{ key_type }} NULL, -- noqa: CP02
            -- NULL: no group; 1: a head candidate of its group (in ix_{{ queue.name }}_heads); 0: it
            -- waits behind its group's head (docs/queue-kinds.md, Message groups).
            group_head bit NULL,
{% endif %}
            payload {{ payload_type }} NOT NULL,
{% if is_json %}
            CONSTRAINT {{ names.index('ck', 'payload_json') }} CHECK (ISJSON(payload) = 1),
{% endif %}
            -- The clustered key is the claim's ORDER BY, so a claim is a seek to one end of it. A heap
            -- is clustered too: a real heap keeps its emptied pages and every claim scans them.
            CONSTRAINT {{ pk }} PRIMARY KEY CLUSTERED ({{ pins.pk_key }})
        );
{% if dedupe %}

        -- Filtered: messages without a key cost nothing. IGNORE_DUP_KEY is not allowed on a filtered
        -- index, and would hide the existing id anyway: enqueue locks the key and reports it itself.
        CREATE UNIQUE NONCLUSTERED INDEX {{ names.index('ux', 'dedupe') }}
            ON {{ t }} (dedupe_key)
            WHERE dedupe_key IS NOT NULL;
{% endif %}
{% if groups %}

        -- The claim of ungrouped messages; the claim of grouped ones (only head candidates, so a held
        -- group's backlog is never read); one group's head and its candidates.
{% for index in pins.group_pinned %}
        {{ pins.create_index(index, t) | indent(8) }};
{% endfor %}
{% endif %}
    END;
GO
{% if groups %}

{{ m.unit(names.plain('_groups'), 'storage', version=1, object='table') }}
IF OBJECT_ID(N'{{ grp.groups_t }}', N'U') IS NULL
    BEGIN
        -- One row per group key that has messages: the group's lock (docs/queue-kinds.md, Message
        -- groups), held by the consumer that dequeued the group's head until its transaction ends.
        -- A heap under a nonclustered key: a holder's U lock stays on the key while its stamp of
        -- locked_at takes the heap row, so a producer's S lock on the key never waits for it. Only
        -- ever read by a seek on the key (a heap's emptied pages are never scanned).
        CREATE TABLE {{ grp.groups_t }} (
            group_key {{ key_type }} NOT NULL, -- noqa: CP02
            locked_at datetime2(7) NULL,
            CONSTRAINT {{ grp.groups_pk }} PRIMARY KEY NONCLUSTERED (group_key)
        );
    END;
GO
{% endif %}

{{ m.unit(names.plain('_items'), 'storage', version=1, object='type', shape=('payload',) + group_shape) }}
IF TYPE_ID(N'{{ items }}') IS NULL
    BEGIN
        -- dedupe_key is wider than the table's, so that an over-long key reaches the procedure's
        -- check (and its error number) instead of failing in the driver.
        CREATE TYPE {{ items }} AS TABLE (
            ordinal int NOT NULL PRIMARY KEY,
            payload {{ payload_type }} NULL,
{% if has_due %}
            due_at datetime2(7) NULL,
{% endif %}
            dedupe_key nvarchar(MAX) COLLATE Latin1_General_100_BIN2 NULL{% if groups %},{% endif %} -- noqa: CP02
{% if groups %}
            group_key nvarchar(MAX) COLLATE Latin1_General_100_BIN2 NULL -- noqa: CP02
{% endif %}
        );
    END;
GO

{{ m.unit(names.plain('_enqueue'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('enqueue') }}
    @payload {{ payload_type }},
{% if has_due %}
    @due_at datetime2(7) = NULL,
{% endif %}
    @dedupe_key nvarchar(MAX) = NULL{% if groups %},
    @group_key nvarchar(MAX) = NULL{% endif %}

AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    -- Whatever the caller's level, the locking below is written for READ COMMITTED (reset on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_payload('enqueue') }}
{% if groups %}
{{ grouped_enqueue_body() }}
{% elif dedupe %}
    IF DATALENGTH(@dedupe_key) > 400
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain("_enqueue") }}: dedupe_key is over 200 characters.', 1;
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
                FROM {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
                WHERE m.dedupe_key = @key AND m.dedupe_key IS NOT NULL;
            END;

{{ insert_unless_duplicate(('due_at, ' if has_due else '') ~ 'dedupe_key, payload',
                           ('COALESCE(@due_at, SYSUTCDATETIME()), ' if has_due else '') ~ '@key, @payload') }}
{% else %}
    IF @dedupe_key IS NOT NULL
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain("_enqueue") }}: dedupe_key needs option dedupe.', 1;
        END;
    SET XACT_ABORT ON;

    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}payload)
    VALUES ({% if has_due %}COALESCE(@due_at, SYSUTCDATETIME()), {% endif %}@payload);

    SELECT
        CONVERT(bigint, SCOPE_IDENTITY()) AS id,
        CONVERT(bit, 0) AS duplicate;
{% endif %}
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
    -- Whatever the caller's level, the locking below is written for READ COMMITTED (reset on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_batch_items('enqueue_batch') }}

    DECLARE @bad_payload int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE i.payload IS NULL{% if is_json %} OR ISJSON(i.payload) = 0{% endif %}

    );
    IF @bad_payload IS NOT NULL
        BEGIN
{{ m.throw('invalid_payload', ["N'" ~ names.plain('_enqueue_batch') ~ ": item '", "@bad_payload",
                               "N' has a NULL" ~ (" or invalid JSON" if is_json else "") ~ " payload.'"]) }}
        END;

    DECLARE @bad_key int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
{% if dedupe %}
        WHERE DATALENGTH(i.dedupe_key) > 400
{% else %}
        WHERE i.dedupe_key IS NOT NULL
{% endif %}
    );
    IF @bad_key IS NOT NULL
        BEGIN
            DECLARE @key_message nvarchar(2048) = CONCAT(
                N'{{ names.plain("_enqueue_batch") }}: item ',
                @bad_key,
{% if dedupe %}
                N' has a dedupe_key longer than 200 characters.'
{% else %}
                N' has a dedupe_key, but the queue has no dedupe option.'
{% endif %}
            );
            THROW {{ errors.invalid_argument }}, @key_message, 1;
        END;
{% if groups %}

    DECLARE @bad_group int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE DATALENGTH(i.group_key) > 400
    );
    IF @bad_group IS NOT NULL
        BEGIN
            DECLARE @group_message nvarchar(2048) = CONCAT(
                N'{{ names.plain("_enqueue_batch") }}: item ',
                @bad_group,
                N' has a group_key over 200 characters.'
            );
            THROW {{ errors.invalid_argument }}, @group_message, 1;
        END;
{% endif %}
    SET XACT_ABORT ON;

    -- The items that become rows, in ordinal order.
    DECLARE @candidates TABLE (ordinal int NOT NULL PRIMARY KEY, position int NOT NULL UNIQUE);
    DECLARE @new_ids TABLE (id bigint NOT NULL PRIMARY KEY);
{% if groups %}
{{ grouped_batch_body() }}
{% elif dedupe %}
{{ dedupe_batch_declarations() }}
    DECLARE @started_transaction bit = 0;

{{ dedupe_batch_keys() }}

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

{{ dedupe_batch_lock() }}

        -- Identity values are assigned in the ORDER BY of an INSERT ... SELECT: the n-th new id
        -- belongs to the n-th candidate, which is how ids are mapped back to ordinals below.
        INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}dedupe_key, payload)
        OUTPUT INSERTED.id INTO @new_ids (id)
        SELECT
{% if has_due %}
            COALESCE(i.due_at, SYSUTCDATETIME()) AS due_at,
{% endif %}
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

{{ dedupe_batch_result() }}
{% else %}
    INSERT INTO @candidates (ordinal, position)
    SELECT
        i.ordinal,
        ROW_NUMBER() OVER (ORDER BY i.ordinal) AS position
    FROM @items AS i;

    -- Identity values are assigned in the ORDER BY of an INSERT ... SELECT: the n-th new id
    -- belongs to the n-th item, which is how ids are mapped back to ordinals below.
    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}payload)
    OUTPUT INSERTED.id INTO @new_ids (id)
{% if has_due %}
    SELECT
        COALESCE(i.due_at, SYSUTCDATETIME()) AS due_at,
        i.payload
{% else %}
    SELECT i.payload
{% endif %}
    FROM @items AS i
    INNER JOIN @candidates AS c ON i.ordinal = c.ordinal
    ORDER BY c.position;

    WITH numbered_ids AS (
        SELECT
            n.id,
            ROW_NUMBER() OVER (ORDER BY n.id) AS position
        FROM @new_ids AS n
    )

    SELECT
        c.ordinal,
        ni.id,
        CONVERT(bit, 0) AS duplicate
    FROM @candidates AS c
    INNER JOIN numbered_ids AS ni ON c.position = ni.position
    ORDER BY c.ordinal;
{% endif %}
END;
GO

GRANT EXECUTE ON TYPE::{{ items }} TO {{ names.role('enqueue_batch') }};
GO

{{ m.grant('enqueue_batch') }}
GO

{{ m.unit(names.plain('_dequeue'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('dequeue') }}
    @batch_size int = 1
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    -- The claim's hints are refused (skipping locked rows) or lock differently under SERIALIZABLE
    -- and SNAPSHOT: READ COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_batch_size('dequeue') }}
    SET XACT_ABORT ON;

{% if groups %}
{{ grouped_dequeue_body() }}
{% else %}
    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY,
        payload {{ payload_type }} NOT NULL,
{% if has_due %}
        due_at datetime2(7) NOT NULL,
{% endif %}
        enqueued_at datetime2(7) NOT NULL
    );

{% if claim_order == 'none' %}
    -- A heap promises no order: the first unlocked rows the clustered index offers, with no sort.
    -- A CTE rather than DELETE TOP, whose target takes no INDEX hint. READCOMMITTEDLOCK keeps the
    -- hints locking under READ_COMMITTED_SNAPSHOT.
{% elif strict %}
    -- Strict order: locked rows are not skipped. A consumer waits on the first row another one holds
    -- until that transaction ends: committed, the row is gone and the scan moves on; rolled back,
    -- this consumer gets it, in order. It also waits on an uncommitted enqueue with a lower id.
{% else %}
    -- READPAST skips rows other consumers hold; READCOMMITTEDLOCK keeps the hints locking under
    -- READ_COMMITTED_SNAPSHOT; the clustered key is the ORDER BY, so there is no sort.
{% endif %}
    WITH next_messages AS (
        SELECT TOP (@batch_size)
            m.id,
            m.payload,
{% if has_due %}
            m.due_at,
{% endif %}
            m.enqueued_at
        FROM {{ t }} AS m WITH ({{ claim_hints }}) -- noqa: LT05
{% if has_due %}
        WHERE m.due_at <= SYSUTCDATETIME()
{% endif %}
{% if claim_order != 'none' %}
        ORDER BY {{ claim_order_sql }}
{% endif %}
    )

    DELETE FROM next_messages
    OUTPUT DELETED.id, DELETED.payload, {% if has_due %}DELETED.due_at, {% endif %}DELETED.enqueued_at
    INTO @claimed (id, payload, {% if has_due %}due_at, {% endif %}enqueued_at);

    SELECT
        c.id,
        c.payload,
        c.enqueued_at{% if has_due %},
        c.due_at{% endif %}

    FROM @claimed AS c
    ORDER BY {{ claim_order_sql | replace('m.', 'c.') }};
{% endif %}
END;
GO

{{ m.grant('dequeue') }}
GO

{# Ready: what dequeue would hand out now, a row no consumer holds (pending: a due one). Strict
    FIFO's dequeue does not skip a held head: a caller told ready waits for it there. #}
{% set wait_declarations %}
    DECLARE @after_id bigint = 0;
    DECLARE @bound_id bigint;
    DECLARE @window int;
{%- endset %}
{% call m.wait_procedure(wait_declarations if groups else '') %}
{% if groups %}
            -- A message without a group on its claim index, else a head candidate of a group nobody
            -- holds, each candidate with its groups row read past a holder (the predicate on
            -- locked_at, true for every row, makes the seek look the heap row up, and a holder's
            -- stamp holds X on it; the key's U would let a read through). A held group's spurious
            -- candidates so never make this true (it would spin: ready, an empty dequeue, ready).
            -- Only READPAST, READCOMMITTEDLOCK probes, no U lock.
            -- Bounded: a step reads a window of 100 candidates, and the window slides across the
            -- steps (the next starts after this one's last id, and from the start again once a
            -- window reaches the end). A free group's head behind 100 or more candidates of held
            -- groups (a hot group's burst while its holder runs a slow handler) is so found within
            -- about one step per 100 candidates ahead of it, plus one, not never; dequeue, which
            -- steps over a held group's candidates at once, would hand it out.
            SELECT TOP (1) @ready = 1
            FROM {{ t }} AS m WITH (INDEX ({{ grp.ungrouped_ix }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.group_key IS NULL;
            IF @ready = 0
                BEGIN
                    SELECT
                        @bound_id = MAX(c.id),
                        @window = COUNT(*)
                    FROM (
                        SELECT TOP (100) m.id
                        FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.group_head = 1 AND m.id > @after_id
                        ORDER BY m.id
                    ) AS c;
                    SELECT TOP (1) @ready = 1
                    FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE
                        m.group_head = 1 AND m.id > @after_id AND m.id <= @bound_id
                        AND {{ grp.not_held('m.group_key') | indent(24) }};
                    -- The next window: after this one, or from the start when this one was the last.
                    SET @after_id = IIF(@window < 100, 0, @bound_id);
                END;
{% else %}
            SELECT TOP (1) @ready = 1
{% if has_due %}
            FROM {{ t }} AS m WITH ({{ pin }}, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.due_at <= SYSUTCDATETIME();
{% else %}
            FROM {{ t }} WITH ({{ pin }}, ROWLOCK, READPAST, READCOMMITTEDLOCK); -- noqa: LT05
{% endif %}
{% endif %}
{% endcall %}

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

    IF @ready > @exact_limit{% if has_due %} OR @delayed > @exact_limit{% endif %}

        BEGIN
            DECLARE @total_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'{{ t }}') AND p.index_id IN (0, 1)
            );
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
    @older_than datetime2(7) = NULL,
    @max_rows int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_max_rows('purge') }}
    SET XACT_ABORT ON;
    -- The purge, not a consumer or a producer, is the victim of any deadlock (restored on return).
    SET DEADLOCK_PRIORITY LOW;

{% if groups %}
{{ grouped_purge_body() }}
{% else %}
    -- Chunks of at most 1,000 rows stay under the lock-escalation threshold, so consumers keep
    -- working; READPAST skips the rows a consumer holds right now, but deleting a row also locks
    -- its other index entries (the dedupe key's), where the purge can wait on a producer's or a
    -- consumer's lock until that transaction ends. Oldest first, in the clustered index's order.
    -- Without max_rows each chunk commits on its own (inside a transaction max_rows is required:
    -- checked above).
{% if has_due %}
    -- The bound that stops a purge from chasing producers: enqueued before it started
    -- (enqueued_at is the insert time); the table is clustered on (due_at, id), not on id.
    DECLARE @started datetime2(7) = SYSUTCDATETIME();
    DECLARE @after_due datetime2(7) = '0001-01-01';
{% else %}
    -- The bound that stops a purge from chasing producers: one seek to the clustered index's end.
    DECLARE @last_id bigint = (
        SELECT MAX(m.id)
        FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
    );
{% endif %}
    DECLARE @after_id bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE (id bigint NOT NULL PRIMARY KEY{% if has_due %}, due_at datetime2(7) NOT NULL{% endif %});

    WHILE @chunk > 0
        BEGIN
            SET @chunk = {{ m.purge_chunk_size() }};
            DELETE FROM @deleted;
{% for cutoff in (false, true) %}
            {{ 'ELSE' if cutoff else 'IF @older_than IS NULL' }}
                BEGIN
                    WITH doomed AS (
{% if has_due %}
                        SELECT TOP (@chunk)
                            m.id,
                            m.due_at
{% else %}
                        SELECT TOP (@chunk) m.id
{% endif %}
                        FROM {{ t }} AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
{% if has_due %}
                        WHERE
                            m.due_at >= @after_due AND NOT (m.due_at = @after_due AND m.id <= @after_id)
                            AND m.enqueued_at <= @started{% if cutoff %} AND m.enqueued_at < @older_than{% endif %}

                        ORDER BY m.due_at, m.id
{% else %}
                        WHERE m.id > @after_id AND m.id <= @last_id{% if cutoff %} AND m.enqueued_at < @older_than{% endif %}

                        ORDER BY m.id
{% endif %}
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.id{% if has_due %}, DELETED.due_at{% endif %} INTO @deleted (id{% if has_due %}, due_at{% endif %});
                    SET @chunk = @@ROWCOUNT;
                END;
{% endfor %}
            SET @purged = @purged + @chunk;
{% if has_due %}
            SELECT TOP (1)
                @after_due = d.due_at,
                @after_id = d.id
            FROM @deleted AS d
            ORDER BY d.due_at DESC, d.id DESC;
{% else %}
            SET @after_id = COALESCE((SELECT MAX(d.id) FROM @deleted AS d), @after_id);
{% endif %}
        END;

    SELECT @purged AS purged;
{% endif %}
END;
GO

{{ m.grant('purge') }}
GO
