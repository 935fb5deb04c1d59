{#- T-SQL: S.Q_complete_next of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete_next'), 'code') }}
-- complete, then dequeue, in one transaction: one commit per message instead of two. The complete
-- is fenced as complete's (@lease_token NULL: the worker's name alone, deprecated) and its outcome
-- is previous_completed; the dequeue is dequeue's (the worker's own unfinished messages first). The
-- rows are dequeue's, each with previous_completed; with nothing to lease, one row whose id (and
-- every other dequeue column) is NULL carries it.
CREATE OR ALTER PROCEDURE {{ names.verb('complete_next') }}
    @id {{ id_type }},
    @worker nvarchar(201),
    @lease_token uniqueidentifier = NULL,
    @batch_size int = 1,
    @lease_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    -- The claim's hints are refused (READPAST) or lock differently under SERIALIZABLE and SNAPSHOT:
    -- READ COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_batch_size('complete_next') }}
{{ w.check_worker('complete_next') }}
    SET @lease_seconds = COALESCE(@lease_seconds, {{ lease_seconds }});
{{ w.check_lease('complete_next') }}
    SET XACT_ABORT ON;

{{ w.claimed_table() }}
{{ w.claim_declarations() }}
    DECLARE @previous_completed bit;
{{ w.record_due_look() }}

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        -- Complete first: its row (queue table, then history) is locked before the claim's, the
        -- order of complete and of dequeue (queue table, then dead-letter table).
{% if groups %}
        -- Its group first, waiting, as complete; the claim after it takes other groups without
        -- waiting, and holds first only the groups of own messages it will bury.
        SET @group = (
            SELECT m.group_key
            FROM {{ t }} AS m
            WHERE m.id = @id
        );
        IF @group IS NOT NULL
            BEGIN
                {{ grp.hold_group() | indent(16) }}
                -- The claim's lease counts from the @now its group's hold re-read.
                SET @lease_until = DATEADD(SECOND, @lease_seconds, @now);
            END;
{% endif %}
{{ w.complete_statement('@id', '@worker', '@lease_token') | indent(4, first=true) }}
        SET @previous_completed = CONVERT(bit, @@ROWCOUNT);
{% if groups %}
        IF @group IS NOT NULL AND @previous_completed = 1
            BEGIN
                {{ grp.settle_work(true) | indent(16) }}
            END;
{% endif %}

{{ w.claim_statements() | indent(4, first=true) }}

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
{{ w.forget_failed_look() }}
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
{% if groups %}
        c.group_key,
{% endif %}
        @previous_completed AS previous_completed
    FROM (VALUES (1)) AS one_row(n)
    LEFT JOIN @claimed AS c ON one_row.n = 1
    ORDER BY c.own DESC, {{ 'c.priority DESC, ' if has_priority }}c.previous_visible_at ASC, c.{{ tie }} ASC;
END;
GO

{{ m.grant('complete_next') }}
GO
