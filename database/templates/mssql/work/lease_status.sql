{#- T-SQL: S.Q_lease_status of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_lease_status'), 'code') }}
-- What became of up to 1,000 leases, each named by its message id and lease token: held (the
-- message is in the queue under this live lease), lost (in the queue, but not under this live lease:
-- it ran out, was released, failed for a retry or leased again), dead (in the dead-letter table) or
-- gone (in neither: completed, or purged). A consumer whose complete's answer never arrived (the
-- connection dropped at COMMIT) learns whether it committed. It first waits for each transaction
-- that holds one of these messages' rows (a complete, a fail, a release in flight), so the answer is
-- what that transaction left, not what it may still undo. Changes nothing and keeps no lock: its
-- shared locks are released row by row, also inside a caller's transaction. One row per item, in id
-- order.
CREATE OR ALTER PROCEDURE {{ names.verb('lease_status') }}
    @acks {{ acks }} READONLY
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ m.check_batch_items('lease_status', '@acks') }}
{{ w.check_acks('lease_status') }}
    DECLARE @tokenless_id {{ id_type }} = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        WHERE a.lease_token IS NULL
        ORDER BY a.id
    );
    IF @tokenless_id IS NOT NULL
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_lease_status') ~ ": the lease token of id '", "@tokenless_id", "N' is NULL.'"]) }}
        END;
    SET XACT_ABORT ON;

{{ w.batch_in_id_order() }}
    -- The wait: a locking read of each message's row (READCOMMITTEDLOCK: also where the database
    -- runs READ_COMMITTED_SNAPSHOT, whose row versions would answer at once), one seek per item in id
    -- order (the fixed lock order), waits for a transaction holding it.
    DECLARE @found TABLE (
        id {{ id_type }} NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL,
        visible_at datetime2(7) NOT NULL
    );
    INSERT INTO @found (id, lease_token, visible_at)
    SELECT
        m.id,
        m.lease_token,
        m.visible_at
    FROM @batch AS b
    INNER JOIN {{ t }} AS m WITH (ROWLOCK, READCOMMITTEDLOCK) ON b.id = m.id
    OPTION (LOOP JOIN, FORCE ORDER);

    -- After the wait: this statement reads what those transactions committed.
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    SELECT
        b.id,
        CONVERT(varchar(4), CASE
            WHEN f.id IS NOT NULL AND f.lease_token = b.lease_token AND f.visible_at > @now THEN 'held'
            WHEN f.id IS NOT NULL THEN 'lost'
            WHEN EXISTS (
                SELECT 1
                FROM {{ dead_t }} AS d WITH (READCOMMITTEDLOCK)
                WHERE d.id = b.id
            ) THEN 'dead'
            ELSE 'gone'
        END) AS status
    FROM @batch AS b
    LEFT JOIN @found AS f ON b.id = f.id
    ORDER BY b.id;
END;
GO

{{ m.grant('lease_status') }}
GO
