{#- T-SQL: S.Q_history_purge of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_history_purge'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('history_purge') }}
    @older_than datetime2(7) = NULL,
    @max_rows int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_max_rows('history_purge') }}
    SET XACT_ABORT ON;
    -- The purge, not a completing consumer, is the victim of any deadlock (restored on return).
    SET DEADLOCK_PRIORITY LOW;

    -- Default: the retention of option history_retention_days ({{ opt.history_retention_days }}).
    SET @older_than = COALESCE(@older_than, DATEADD(DAY, -{{ opt.history_retention_days }}, SYSUTCDATETIME()));
    DECLARE @after_finished datetime2(7) = '0001-01-01';
    DECLARE @after_id bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE (history_id bigint NOT NULL PRIMARY KEY, finished_at datetime2(7) NOT NULL);

    -- A range at the start of the clustered index (finished_at, history_id), oldest first, in
    -- chunks below the lock-escalation threshold, each from where the last one ended.
    WHILE @chunk > 0
        BEGIN
            SET @chunk = {{ m.purge_chunk_size() }};
            DELETE FROM @deleted;
            WITH doomed AS (
                SELECT TOP (@chunk)
                    h.history_id,
                    h.finished_at
                FROM {{ history_t }} AS h WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                WHERE
                    h.finished_at >= @after_finished AND h.finished_at < @older_than
                    AND NOT (h.finished_at = @after_finished AND h.history_id <= @after_id)
                ORDER BY h.finished_at, h.history_id
            )

            DELETE FROM doomed
            OUTPUT DELETED.history_id, DELETED.finished_at INTO @deleted (history_id, finished_at);
            SET @chunk = @@ROWCOUNT;
            SET @purged = @purged + @chunk;
            SELECT TOP (1)
                @after_finished = d.finished_at,
                @after_id = d.history_id
            FROM @deleted AS d
            ORDER BY d.finished_at DESC, d.history_id DESC;
        END;

    SELECT @purged AS purged;
END;
GO

{{ m.grant('history_purge') }}
GO
