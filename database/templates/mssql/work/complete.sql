{#- T-SQL: S.Q_complete of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete'), 'code') }}
-- Only the holder of a live lease: a late complete, after the lease moved on, changes nothing.
CREATE OR ALTER PROCEDURE {{ names.verb('complete') }}
    @id {{ id_type }},
    @worker nvarchar(201)
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('complete') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ w.complete_statement('@id', '@worker') }}

    SELECT CONVERT(bit, @@ROWCOUNT) AS completed;
END;
GO

{{ m.grant('complete') }}
GO
