{#- T-SQL: S.Q_enqueue of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_enqueue'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('enqueue') }}
    @payload {{ payload_type }},
    @due_at datetime2(7) = NULL,
    @dedupe_key nvarchar(MAX) = NULL{% if has_priority or client_ids or groups %},{% endif %}

{% if has_priority %}
    @priority int = NULL{% if client_ids %},{% endif %}

{% endif %}
{% if client_ids %}
    @id uniqueidentifier = NULL,
    @enqueued_at datetime2(7) = NULL{% if groups %},{% endif %}

{% endif %}
{% if groups %}
    @group_key nvarchar(MAX) = NULL
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
{% if groups %}
    IF DATALENGTH(@group_key) > 400
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_enqueue') ~ ": group_key is longer than 200 characters.'") }}
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
{% if groups %}
    -- The message's group is joined first (the fixed lock order: the groups row, then the queue
    -- table; docs/queue-kinds.md, Message groups), in a transaction of the procedure's own when the
    -- caller has none, so that the group's lock or pin lasts until the message commits.
    DECLARE @group nvarchar(200) = @group_key;
    DECLARE @group_head bit;
    DECLARE @group_joined bit;
{% endif %}

    BEGIN TRY
{% if dedupe or client_ids or groups %}
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens, and the verb neither commits nor ends it (a BEGIN
        -- TRANSACTION there would only nest in it: its COMMIT would commit nothing).
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0 AND ({{ ((['@key IS NOT NULL'] if dedupe else []) + (['@id IS NOT NULL'] if client_ids else []) + (['@group IS NOT NULL'] if groups else [])) | join(' OR ') }})
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;
{% endif %}
{% if groups %}

        IF @group IS NOT NULL
            BEGIN
                {{ grp.join_group() | indent(16) }}
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
                    {{ 'id, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}{{ 'group_key, group_head, ' if groups }}payload
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
{% if groups %}
                    @group,
                    @group_head,
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
