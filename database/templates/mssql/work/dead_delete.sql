{#- T-SQL: S.Q_dead_delete of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_dead_delete'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('dead_delete') }}
    @id {{ id_type }}
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @id IS NULL
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_dead_delete') ~ ": id must not be NULL.'") }}
        END;
    SET XACT_ABORT ON;

    BEGIN TRY
        DELETE FROM {{ dead_t }}
        WHERE id = @id;

        IF @@ROWCOUNT = 0
            BEGIN
{{ w.throw('not_found', ["N'" ~ names.plain('_dead_delete') ~ ": no dead-letter message with id '", "CONVERT(nvarchar(36), @id)", "N'.'"]) | indent(4, first=true) }}
            END;
    END TRY
    BEGIN CATCH
        THROW;
    END CATCH;

    SELECT CONVERT(bit, 1) AS deleted; -- noqa: RF04
END;
GO

{{ m.grant('dead_delete') }}
GO
