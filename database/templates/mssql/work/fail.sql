{#- T-SQL: S.Q_fail of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_fail'), 'code') }}
-- outcome: retrying | dead | lost (the caller's lease had expired or moved on: nothing changed).
-- @lease_token fences it to one lease, as complete's (NULL: the worker's name alone, deprecated).
CREATE OR ALTER PROCEDURE {{ names.verb('fail') }}
    @id {{ id_type }},
    @worker nvarchar(201),
    @error nvarchar(4000) = NULL,
    @retry_after_seconds int = NULL,
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('fail') }}
{{ w.check_retry_after('fail') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @outcome varchar(8);
{{ w.buried_table() }}
    DECLARE @started_transaction bit = 0;
{% if groups %}
{{ grp.work_declare() }}

    -- As complete: the group (read without a lock: it never changes) held first, waiting; a message
    -- that goes to the dead-letter table unblocks its group (settled). A retry keeps it in flight.
    SET @group = (
        SELECT m.group_key
        FROM {{ t }} AS m
        WHERE m.id = @id
    );
{% endif %}

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;
{% if groups %}

        IF @group IS NOT NULL
            BEGIN
                {{ grp.hold_group() | indent(16) }}
            END;
{% endif %}

{{ w.fail_statements('@id', '@worker', '@error', '@retry_after_seconds', '@lease_token') | indent(4, first=true) }}
{% if groups %}

        IF @group IS NOT NULL AND @outcome = 'dead'
            BEGIN
                {{ grp.settle_work(true) | indent(16) }}
            END;
{% endif %}

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
