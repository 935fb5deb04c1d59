{#- PostgreSQL: S.Q_complete of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete'), 'code') }}
-- Only the holder of a live lease: a late complete after the lease moved on changes nothing.
CREATE OR REPLACE FUNCTION {{ names.verb('complete') }}(id {{ id_type }}, worker text)
RETURNS TABLE (completed boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    done_count bigint;
BEGIN
{{ w.check_worker('complete') }}
{% if history %}
    -- One statement: queue table, then history table (the fixed lock order).
    WITH done AS (
        DELETE FROM {{ t }} AS m
        WHERE m.id = {{ fn }}_complete.id AND m.leased_by = {{ fn }}_complete.worker AND m.visible_at > now_utc
        RETURNING m.id, m.enqueued_at, m.due_at, {% if has_priority %}m.priority, {% endif %}m.leased_at, m.leased_by, m.attempts, m.payload
    ),

    kept AS (
        INSERT INTO {{ history_t }} (
            id, enqueued_at, due_at, {% if has_priority %}priority, {% endif %}started_at, finished_at, duration_ms, worker, attempts, payload
        )
        SELECT
            d.id,
            d.enqueued_at,
            d.due_at,
{% if has_priority %}
            d.priority,
{% endif %}
            d.leased_at,
            now_utc,
            (extract(EPOCH FROM now_utc - d.leased_at) * 1000)::bigint,
            d.leased_by,
            d.attempts,
            d.payload
        FROM done AS d
        RETURNING 1
    )

    SELECT count(*) INTO done_count FROM kept;
{% else %}
    DELETE FROM {{ t }} AS m
    WHERE m.id = {{ fn }}_complete.id AND m.leased_by = {{ fn }}_complete.worker AND m.visible_at > now_utc;
    GET DIAGNOSTICS done_count = ROW_COUNT;
{% endif %}
    IF done_count = 0 THEN
{{ w.lost_under_snapshot('complete') }}
    END IF;
    RETURN QUERY SELECT done_count > 0;
END;
$function$;

{{ m.grant('complete') }}
