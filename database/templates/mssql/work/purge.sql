{#- T-SQL: S.Q_purge of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_purge'), 'code') }}
-- Removes queued messages, leased ones too (their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR ALTER PROCEDURE {{ names.verb('purge') }}
    @older_than datetime2(7) = NULL,
    @max_rows int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

{{ m.check_max_rows('purge') }}
    SET XACT_ABORT ON;
    -- Purge can deadlock with consumers: it locks a row, then the row's other index entries, while
    -- claims (through the claim index){% if client_ids %} and complete, fail, extend_lease (through the
    -- nonclustered primary key){% endif %} lock an entry first, then the row. The purge is the victim,
    -- never the consumer (restored when the procedure returns); a consumer's 1205 is retryable, and
    -- so is the purge's own: the chunks before it are committed, call it again.
    SET DEADLOCK_PRIORITY LOW;

{% if groups %}
{{ grp.purge_body() }}
{% else %}
    -- Chunks of at most 1,000 rows stay under the lock-escalation threshold, so consumers keep
    -- working; READPAST skips the rows a claim holds right now, but deleting a row also locks its
    -- index entries, where the purge can wait on a claim's lock until that claim's transaction
    -- ends. The bound stops a purge from chasing producers forever. Oldest first, in the clustered
    -- index's order ({{ tie }}). Without max_rows each chunk commits on its own (inside a transaction
    -- max_rows is required: checked above).
    DECLARE @last bigint = (SELECT MAX(m.{{ tie }}) FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK));
    DECLARE @after bigint = 0;
    DECLARE @purged bigint = 0;
    DECLARE @chunk int = 1;
    DECLARE @deleted TABLE ({{ tie }} bigint NOT NULL PRIMARY KEY);

    WHILE @chunk > 0
        BEGIN
            SET @chunk = {{ m.purge_chunk_size() }};
            DELETE FROM @deleted;
{% for cutoff in (false, true) %}
            {{ 'ELSE' if cutoff else 'IF @older_than IS NULL' }}
                BEGIN
                    WITH doomed AS (
                        SELECT TOP (@chunk) m.{{ tie }}
                        FROM {{ t }} AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                        WHERE m.{{ tie }} > @after AND m.{{ tie }} <= @last{% if cutoff %} AND m.enqueued_at < @older_than{% endif %}

                        ORDER BY m.{{ tie }}
                    )

                    DELETE FROM doomed
                    OUTPUT DELETED.{{ tie }} INTO @deleted ({{ tie }});
                    SET @chunk = @@ROWCOUNT;
                END;
{% endfor %}
            SET @purged = @purged + @chunk;
            SET @after = COALESCE((SELECT MAX(d.{{ tie }}) FROM @deleted AS d), @after);
        END;

    SELECT @purged AS purged;
{% endif %}
END;
GO

{{ m.grant('purge') }}
GO
