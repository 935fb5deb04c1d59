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

    -- Chunks of at most 1,000 rows stay under the lock-escalation threshold, so consumers keep
    -- working; READPAST leaves the rows a claim holds right now (and never waits, so purge and
    -- dequeue cannot deadlock); the bound stops a purge from chasing producers forever. Oldest
    -- first, in the clustered index's order ({{ tie }}). Called in a transaction (the caller's, or an
    -- implicit one), every chunk's locks last until it ends: purge with max_rows and commit between
    -- calls on a busy queue.
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
END;
GO

{{ m.grant('purge') }}
GO
