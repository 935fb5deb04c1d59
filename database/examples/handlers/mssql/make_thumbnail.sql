-- The example catalog's handler for queue.thumbnails (database/queues.yml, option handler): the
-- in-database worker queue.thumbnails_process calls it as EXEC queue.make_thumbnail @id, @payload, in
-- the transaction that completes the message, so its writes and the completion commit together
-- (docs/work-queue.md, section 4). A real handler would render the thumbnail; this one records the
-- request. It raises to fail the message; it must not COMMIT or ROLLBACK.
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

IF OBJECT_ID(N'[queue].[thumbnails_made]', N'U') IS NULL
    BEGIN
        CREATE TABLE [queue].[thumbnails_made] (
            id uniqueidentifier NOT NULL,
            made_at datetime2(7) NOT NULL
            CONSTRAINT df_thumbnails_made_made_at DEFAULT (SYSUTCDATETIME()),
            payload nvarchar(MAX) NOT NULL,
            CONSTRAINT pk_thumbnails_made PRIMARY KEY CLUSTERED (id)
        );
    END;
GO

CREATE OR ALTER PROCEDURE [queue].[make_thumbnail]
    @id uniqueidentifier,
    @payload nvarchar(MAX)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT OFF;
    IF JSON_VALUE(@payload, '$.image') IS NULL
        BEGIN
            DECLARE @message nvarchar(200) = CONCAT(N'make_thumbnail: message ', @id, N' has no image');
            THROW 50001, @message, 1;
        END;
    SET XACT_ABORT ON;
    INSERT INTO [queue].[thumbnails_made] (id, payload)
    SELECT
        @id AS id,
        @payload AS payload
    WHERE NOT EXISTS (
        SELECT 1 / 0
        FROM [queue].[thumbnails_made] AS t
        WHERE t.id = @id
    );
END;
GO

-- The admin role runs the in-database worker: it may run the handler too.
GRANT EXECUTE ON OBJECT::[queue].[make_thumbnail] TO [queue_admin];
GO
