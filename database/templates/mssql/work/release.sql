{#- T-SQL: S.Q_release of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_release'), 'code') }}
-- Gives a leased message back at once, with the attempt its lease counted (a consumer shutting down
-- gracefully spends none): visible now, to any worker. Only the holder of the live lease, fenced by
-- @lease_token as complete's (NULL: the worker's name alone, deprecated); otherwise released = 0
-- and nothing changes.
CREATE OR ALTER PROCEDURE {{ names.verb('release') }}
    @id {{ id_type }},
    @worker nvarchar(201),
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('release') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ w.release_statement('@id', '@worker', '@lease_token') }}

    SELECT CONVERT(bit, @@ROWCOUNT) AS released;
END;
GO

{{ m.grant('release') }}
GO
