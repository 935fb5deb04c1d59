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
{{ w.complete_statement('@id', '@worker', '@lease_token') }}

    SELECT CONVERT(bit, @@ROWCOUNT) AS completed;
END;
GO

{{ m.grant('complete') }}
GO
