{#- T-SQL: S.Q_lease_status of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_lease_status'), 'code') }}
-- What became of up to 1,000 leases, each named by its message id and lease token: held (the
-- message is in the queue under this live lease), expired (in the queue under this lease, which ran
-- out: no acknowledgement that reads its clock from now on takes it, one that read it before may),
-- lost (in the queue under no lease or another one: released, failed for a retry or leased again;
-- this lease never completes), dead (in the dead-letter table) or gone (in neither: completed, or purged). A
-- consumer whose complete's answer never arrived (the connection dropped at COMMIT) learns whether
-- it committed. It first waits for each transaction that holds one of these messages' rows (a
-- complete, a fail, a release in flight), so the answer is what that transaction left, not what it
-- may still undo. Changes nothing and keeps no lock: each shared lock is released once its row is
-- read, also inside a caller's transaction. One row per item, in the engine's id order.
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
    -- No SET XACT_ABORT ON: the verb changes nothing, so a lock timeout (1222) in its reads ends
    -- the call (TRY, then THROW) and leaves a caller's transaction as it was; under XACT_ABORT ON it
    -- would roll that transaction back.

{{ w.batch_in_id_order() }}
    DECLARE @found TABLE (
        id {{ id_type }} NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL,
        visible_at datetime2(7) NOT NULL
    );
{% if client_ids %}
    DECLARE @located TABLE (
        seq bigint NOT NULL PRIMARY KEY,
        id uniqueidentifier NOT NULL
    );
{% endif %}
    DECLARE @answers TABLE (
        id {{ id_type }} NOT NULL PRIMARY KEY,
        status varchar(7) NOT NULL
    );
    DECLARE @requeued TABLE (id {{ id_type }} NOT NULL PRIMARY KEY);

    BEGIN TRY
        -- The wait: locking reads (READCOMMITTEDLOCK: also where the database runs
        -- READ_COMMITTED_SNAPSHOT, whose row versions would answer at once), one seek per item in
        -- id order, each shared lock released once its row is read: a transaction holding a row (a
        -- complete, fail or release in flight) is waited for.
{% if client_ids %}
        -- Two reads, the primary key's entries, then the clustered rows by seq: a join through the
        -- nonclustered key would hold the key's lock while its lookup waits for the clustered row,
        -- and deadlock with an acknowledgement that holds the row and deletes the key.
        INSERT INTO @located (seq, id)
        SELECT
            m.seq,
            m.id
        FROM @batch AS b
        INNER JOIN {{ t }} AS m WITH (INDEX ({{ pk }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON b.id = m.id
        OPTION (LOOP JOIN, FORCE ORDER);

        INSERT INTO @found (id, lease_token, visible_at)
        SELECT
            m.id,
            m.lease_token,
            m.visible_at
        FROM @located AS l
        INNER JOIN {{ t }} AS m WITH (INDEX ({{ names.index('ux', 'seq') }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON l.seq = m.seq
        OPTION (LOOP JOIN, FORCE ORDER);
{% else %}
        INSERT INTO @found (id, lease_token, visible_at)
        SELECT
            m.id,
            m.lease_token,
            m.visible_at
        FROM @batch AS b
        INNER JOIN {{ t }} AS m WITH (INDEX ({{ pk }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON b.id = m.id
        OPTION (LOOP JOIN, FORCE ORDER);
{% endif %}

        -- After the wait: read what those transactions committed.
        DECLARE @now datetime2(7) = SYSUTCDATETIME();
        INSERT INTO @answers (id, status)
        SELECT
            b.id,
            CASE
                WHEN f.id IS NOT NULL AND f.lease_token = b.lease_token AND f.visible_at > @now THEN 'held'
                WHEN f.id IS NOT NULL AND f.lease_token = b.lease_token THEN 'expired'
                WHEN f.id IS NOT NULL THEN 'lost'
                WHEN EXISTS (
                    SELECT 1
                    FROM {{ dead_t }} AS d WITH (INDEX ({{ pins.dead_pinned[0][1] }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE d.id = b.id
                ) THEN 'dead'
                ELSE 'gone'
            END AS status
        FROM @batch AS b
        LEFT JOIN @found AS f ON b.id = f.id;

        -- Requeued from the dead-letter table between the reads above (locking reads share no
        -- snapshot): in the queue again, under no lease of the caller's. A statement of its own, so
        -- that it reads the queue after the dead-letter table.
        INSERT INTO @requeued (id)
        SELECT g.id
        FROM (
            SELECT a.id
            FROM @answers AS a
            WHERE a.status = 'gone'
        ) AS g
        INNER JOIN {{ t }} AS q WITH (INDEX ({{ pk }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            ON g.id = q.id
        OPTION (LOOP JOIN, FORCE ORDER);
    END TRY
    BEGIN CATCH
        THROW;
    END CATCH;

    -- The result only once every read has succeeded: an error never follows part of an answer.
    SELECT
        a.id,
        IIF(r.id IS NULL, a.status, 'lost') AS status
    FROM @answers AS a
    LEFT JOIN @requeued AS r ON a.id = r.id
    ORDER BY a.id;
END;
GO

{{ m.grant('lease_status') }}
GO
