{#- T-SQL: S.Q_dead_requeue of the work kind (included by work.sql, whose variables and imports it uses). -#}
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
    -- Requeue locks the id's place in the queue table, then the key's; enqueue locks the key, then
    -- the id: the same id or key in both at once can deadlock, and the operator's call is the
    -- victim, never the producer's (restored when the procedure returns).
    SET DEADLOCK_PRIORITY LOW;

    DECLARE @now datetime2(7);
    DECLARE @found bit;
    DECLARE @taken_id {{ id_type }};
{% if dedupe %}
    DECLARE @key nvarchar(200);
    DECLARE @locked_key nvarchar(200);
    DECLARE @key_holder {{ id_type }};
{% endif %}
    DECLARE @started_transaction bit;
{% if groups %}
{{ grp.work_declare() }}
    DECLARE @group_held bit;
{% endif %}
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
{% if dedupe %}
            SET @key = NULL;
            SET @locked_key = NULL;
            SET @key_holder = NULL;
{% endif %}
            SET @started_transaction = 0;
{% if groups %}
            SET @group_held = 0;
            SET @group_head = NULL;
{% endif %}

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
{% if groups %}

                -- Its group, joined as a producer joins it: never waiting for a claim or an
                -- acknowledgement, so taking it after the id's place closes no cycle.
                -- The key is read without a lock (a dead message's key never changes). Taken: the
                -- group is settled after the insert (the message keeps its id, so it comes before
                -- the group's later messages not yet in flight); held by someone else: the message
                -- is a head candidate that the group's next holder settles.
                SET @group = (
                    SELECT d.group_key
                    FROM {{ dead_t }} AS d
                    WHERE d.id = @id
                );
                IF @group IS NOT NULL
                    BEGIN
                        {{ grp.join_group('@group_held') | indent(24) }}
                    END;
{% endif %}
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
{{ w.throw('not_found', ["N'" ~ names.plain('_dead_requeue') ~ ": no dead-letter message with id '", "CONVERT(nvarchar(36), @id)", "N'.'"]) | indent(12, first=true) }}
                    END;
                IF @taken_id IS NOT NULL
                    BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_dead_requeue') ~ ": a message with id '", "CONVERT(nvarchar(36), @id)", "N' is queued already.'"]) | indent(12, first=true) }}
                    END;
{% if not client_ids %}

                SET IDENTITY_INSERT {{ t }} ON;
{% endif %}

                -- Queue table, then dead table: insert the copy, then delete.
{% if dedupe %}
                -- The message keeps its key unless the key was enqueued again since (or is not the key
                -- locked above): it then comes back without it rather than not at all (requeue is an
                -- operator's deliberate action).
{% endif %}
                INSERT INTO {{ t }} (
                    id, enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}{{ 'group_key, group_head,\n                    ' if groups }}attempts, last_error, payload
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
{% if groups %}
                    d.group_key,
                    IIF(d.group_key IS NULL, NULL, COALESCE(@group_head, CONVERT(bit, 1))) AS group_head,
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
{% if groups %}

                IF @group_held = 1
                    BEGIN
                        {{ grp.read_in_flight() | indent(24) }}
                        {# Unchecked: dead_requeue deletes no queue row, so the in-flight message
                           is still there; reading it would wait for a caller holding its row. #}
                        {{ grp.settle_work(false) | indent(24) }}
                    END;
{% endif %}

                IF @started_transaction = 1 COMMIT TRANSACTION;
                BREAK;
            END TRY
            BEGIN CATCH
{% if not client_ids %}
                SET IDENTITY_INSERT {{ t }} OFF;
{% endif %}
                IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                IF ERROR_NUMBER() <> 1205 OR @started_transaction = 0 OR @deadlock_retries >= 3 THROW;
                SET @deadlock_retries = @deadlock_retries + 1;
{{ w.transient_pause() | indent(12, first=true) }}
            END CATCH;
        END;

    SELECT CONVERT(bit, 1) AS requeued;
END;
GO

{{ m.grant('dead_requeue') }}
GO
