{#- T-SQL: S.Q_extend_lease of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_extend_lease'), 'code') }}
-- The new lease runs from now, under the same token. An extend begun after the lease expired cannot
-- revive it: another worker may hold it. @lease_token fences it to one lease, as complete's (NULL: deprecated).
CREATE OR ALTER PROCEDURE {{ names.verb('extend_lease') }}
    @id {{ id_type }},
    @worker nvarchar(201),
    @lease_seconds int = NULL,
    @lease_token uniqueidentifier = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_worker('extend_lease') }}
    SET @lease_seconds = COALESCE(@lease_seconds, {{ lease_seconds }});
{{ w.check_lease('extend_lease') }}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    UPDATE {{ t }}
    SET visible_at = DATEADD(SECOND, @lease_seconds, @now)
    WHERE
        id = @id AND {{ w.holds_lease('@worker', '@lease_token') }};

    SELECT CONVERT(bit, @@ROWCOUNT) AS extended;
END;
GO

{{ m.grant('extend_lease') }}
GO
