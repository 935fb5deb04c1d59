{#- T-SQL: S.Q_complete_batch of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete_batch'), 'code') }}
-- complete for up to 1,000 messages in one statement: each item by its id and lease token (NULL:
-- the worker's name alone, deprecated), fenced as complete is; one row per item, in id order:
-- completed = 0 where the lease was lost (nothing changed for that item).
CREATE OR ALTER PROCEDURE {{ names.verb('complete_batch') }}
    @acks {{ acks }} READONLY,
    @worker nvarchar(201)
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('complete_batch') }}
{{ m.check_batch_items('complete_batch', '@acks') }}
{{ w.check_acks('complete_batch') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ w.batch_in_id_order() }}
{% if groups %}
{{ grp.acked_groups_of_batch() }}
{% endif %}
{% if history or groups %}
{% if history %}
    -- The history rows of the completed messages: written to the history table after the delete,
    -- in the same transaction (queue table, then history table, as complete). Not OUTPUT INTO the
    -- history table directly, as complete does: the result needs the ids completed, a DELETE has
    -- one OUTPUT INTO, and an INSERT over a nested DELETE (composable DML) may have none.
    DECLARE @completed TABLE (
{{ w.history_column_definitions() | indent(8, first=true) }}
        PRIMARY KEY (id)
    );
{% else %}
    DECLARE @completed TABLE (id {{ id_type }} NOT NULL PRIMARY KEY);
{% endif %}
    DECLARE @started_transaction bit = 0;

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;
{% if groups %}

        {{ grp.hold_groups_in_order() | indent(8) }}
{% endif %}

        DELETE m
{% if history %}
{{ w.history_output('@completed') | indent(4, first=true) }}
{% else %}
        OUTPUT DELETED.id INTO @completed (id)
{% endif %}
        FROM @batch AS b
        INNER JOIN {{ t }} AS m WITH (ROWLOCK) ON b.id = m.id
        WHERE
            {{ w.holds_lease('@worker', 'b.lease_token', 'm.', 12) }}
        OPTION (LOOP JOIN, FORCE ORDER);
{% if history %}

        INSERT INTO {{ history_t }} (
            {{ w.history_columns() }}
        )
        SELECT
            c.{{ w.history_columns() | replace(', ', ',\n            c.') }}
        FROM @completed AS c;
{% endif %}
{% if groups %}

        {{ grp.settle_groups_in_order() | indent(8) }}
{% endif %}

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
{% else %}
    DECLARE @completed TABLE (id {{ id_type }} NOT NULL PRIMARY KEY);

    DELETE m
    OUTPUT DELETED.id INTO @completed (id)
    FROM @batch AS b
    INNER JOIN {{ t }} AS m WITH (ROWLOCK) ON b.id = m.id
    WHERE
        {{ w.holds_lease('@worker', 'b.lease_token', 'm.') }}
    OPTION (LOOP JOIN, FORCE ORDER);
{% endif %}

    SELECT
        b.id,
        CONVERT(bit, IIF(c.id IS NULL, 0, 1)) AS completed
    FROM @batch AS b
    LEFT JOIN @completed AS c ON b.id = c.id
    ORDER BY b.id;
END;
GO

-- The acks type serves fail_batch and lease_status too (the same role).
GRANT EXECUTE ON TYPE::{{ acks }} TO {{ names.role('complete_batch') }};
GO

{{ m.grant('complete_batch') }}
GO
