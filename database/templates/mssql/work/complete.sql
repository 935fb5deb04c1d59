{#- T-SQL: S.Q_complete of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete'), 'code') }}
-- Only the holder of the live lease: a late complete, after the lease moved on, changes nothing.
-- @lease_token (from dequeue) fences it to that very lease; without it (NULL, deprecated: 0.1.0's
-- call) the worker's name alone is checked, which cannot tell a lease from the worker's next one.
CREATE OR ALTER PROCEDURE {{ names.verb('complete') }}
    @id {{ id_type }},
    @worker nvarchar(201),
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('complete') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{% if groups %}
{{ grp.work_declare() }}
    DECLARE @completed bit;
    DECLARE @started_transaction bit = 0;

    -- A message's group never changes: read without a lock. Its groups row is held first, waiting
    -- (the fixed lock order), and settled after the delete: the group's next message is its head.
    SET @group = (
        SELECT m.group_key
        FROM {{ t }} AS m
        WHERE m.id = @id
    );

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @group IS NOT NULL AND @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

        IF @group IS NOT NULL
            BEGIN
                {{ grp.hold_group() | indent(16) }}
            END;
{{ w.complete_statement('@id', '@worker', '@lease_token') | indent(4, first=true) }}
        SET @completed = CONVERT(bit, @@ROWCOUNT);
        IF @group IS NOT NULL AND @completed = 1
            BEGIN
                {{ grp.settle_work(true) | indent(16) }}
            END;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT @completed AS completed;
{% else %}
{{ w.complete_statement('@id', '@worker', '@lease_token') }}

    SELECT CONVERT(bit, @@ROWCOUNT) AS completed;
{% endif %}
END;
GO

{{ m.grant('complete') }}
GO
