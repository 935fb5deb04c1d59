{#- T-SQL: S.Q_dead_list of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_dead_list'), 'code') }}
-- Paged by id: pass the last id of a page as after_id to read the next one. (page_size, not
-- `limit`: PostgreSQL reserves that word, and the parameter names are the same in both dialects.)
-- Pinned to the primary key on id: with client ids the table is clustered on dead_seq, and a plan
-- compiled while the table was small could scan and sort all of it for every page.
CREATE OR ALTER PROCEDURE {{ names.verb('dead_list') }}
    @after_id {{ id_type }} = NULL,
    @page_size int = 100
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

    IF @page_size IS NULL OR @page_size NOT BETWEEN 1 AND 1000
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_dead_list') ~ ": page_size must be between 1 and 1000, got '", "COALESCE(CONVERT(nvarchar(12), @page_size), N'NULL')", "N'.'"]) }}
        END;
    SET XACT_ABORT ON;
{% if client_ids %}
    -- A page reads the key on id, then looks each row up in the clustered dead_seq; a delete of the
    -- same row (dead_delete, a burial replacing an older copy) locks them the other way round: a
    -- rare deadlock, of which this read is the victim (retry it), not the operator's delete.
    SET DEADLOCK_PRIORITY LOW;
{% endif %}

{% for paged in (false, true) %}
    {{ 'ELSE' if paged else 'IF @after_id IS NULL' }}
        BEGIN
            SELECT TOP (@page_size)
                d.id,
                d.payload,
                d.enqueued_at,
                d.due_at,
{% if has_priority %}
                d.priority,
{% endif %}
{% if dedupe %}
                d.dedupe_key,
{% endif %}
                d.attempts,
                d.last_error,
                d.last_worker,
                d.dead_at
{% if paged %}
            FROM {{ dead_t }} AS d WITH (INDEX ({{ pins.dead_pinned[0][1] }}), FORCESEEK)
            WHERE d.id > @after_id
{% else %}
            FROM {{ dead_t }} AS d WITH (INDEX ({{ pins.dead_pinned[0][1] }}))
{% endif %}
            ORDER BY d.id ASC;
        END;
{% endfor %}
END;
GO

{{ m.grant('dead_list') }}
GO
