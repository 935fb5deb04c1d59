{#- T-SQL: S.Q_fail_batch of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_fail_batch'), 'code') }}
-- fail for up to 1,000 messages, all with the same error and retry delay: each item by its id and
-- lease token (NULL: the worker's name alone, deprecated), fenced as fail is. One row per item, in
-- id order: outcome retrying | dead | lost (the lease was lost: nothing changed for that item).
CREATE OR ALTER PROCEDURE {{ names.verb('fail_batch') }}
    @acks {{ acks }} READONLY,
    @worker nvarchar(201),
    @error nvarchar(4000) = NULL,
    @retry_after_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('fail_batch') }}
{{ w.check_retry_after('fail_batch') }}
{{ m.check_batch_items('fail_batch', '@acks') }}
{{ w.check_acks('fail_batch') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ w.batch_in_id_order() }}
{% if groups %}
{{ grp.acked_groups_of_batch() }}
{% endif %}
    -- The messages whose lease the caller held, with the attempts they had used.
    DECLARE @held TABLE (
        id {{ id_type }} NOT NULL PRIMARY KEY,
        attempts int NOT NULL
    );
{{ w.buried_table() }}
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

        -- 1. One statement locks every message of the batch whose lease the caller holds, in id
        -- order: with attempts left it is visible again after the retry delay; on its last attempt
        -- it keeps its lease, locked, for the move below.
        UPDATE m
        SET
            m.leased_by = IIF(m.attempts < {{ max_attempts }}, NULL, m.leased_by),
            m.lease_token = IIF(m.attempts < {{ max_attempts }}, NULL, m.lease_token),
            m.visible_at = IIF(m.attempts < {{ max_attempts }}, DATEADD(SECOND, @retry_after_seconds, @now), m.visible_at),
            m.last_error = @error
        OUTPUT
            INSERTED.id,
            INSERTED.attempts
        INTO @held (id, attempts)
        FROM @batch AS b
        INNER JOIN {{ t }} AS m WITH (ROWLOCK) ON b.id = m.id
        WHERE
            {{ w.holds_lease('@worker', 'b.lease_token', 'm.', 12) }}
        OPTION (LOOP JOIN, FORCE ORDER);

        -- 2. Those on their last attempt to the dead-letter table: rows this transaction holds
        -- already (step 1). On a client-id queue the seek also takes the nonclustered primary key
        -- entry again, which a late single verb on that message may hold while it waits for the
        -- row: a deadlock one of the two retries (docs/errors.md).
{{ w.bury("FROM @held AS h\nINNER JOIN " ~ t ~ " AS m ON h.id = m.id\nWHERE h.attempts >= " ~ max_attempts ~ "\nOPTION (LOOP JOIN, FORCE ORDER)",
          "DELETED.attempts", "@error", "DELETED.leased_by") | indent(4, first=true) }}
{% if groups %}

        {{ grp.settle_groups_in_order() | indent(8) }}
{% endif %}

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
            WHEN h.attempts < {{ max_attempts }} THEN 'retrying'
            ELSE 'dead'
        END) AS outcome
    FROM @batch AS b
    LEFT JOIN @held AS h ON b.id = h.id
    ORDER BY b.id;
END;
GO

{{ m.grant('fail_batch') }}
GO
