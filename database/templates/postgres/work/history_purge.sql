{#- PostgreSQL: S.Q_history_purge of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_history_purge'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('history_purge') }}(
    older_than timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL
)
RETURNS TABLE (purged bigint)
{{ m.definer(plans='custom') }}
AS $function$
#variable_conflict use_column
DECLARE
    -- Default retention: history_retention_days ({{ opt.history_retention_days }}) days.
    cutoff timestamptz := coalesce(
        {{ fn }}_history_purge.older_than, clock_timestamp() - make_interval(days => {{ opt.history_retention_days }})
    );
    purged_count bigint;
BEGIN
{{ m.check_max_rows('history_purge') }}
    -- Oldest first; LIMIT NULL is no limit. The ids as an array, not IN (a join): see purge.
    DELETE FROM {{ history_t }} AS h
    WHERE h.history_id = ANY(ARRAY(
        SELECT o.history_id FROM {{ history_t }} AS o
        WHERE o.finished_at < cutoff
        ORDER BY o.finished_at
        LIMIT {{ fn }}_history_purge.max_rows
        -- A concurrent purge's rows are skipped, not waited for: a caller looping until a call
        -- purges fewer than max_rows must not stop early because another purge got there first.
        FOR UPDATE SKIP LOCKED
    ));
    GET DIAGNOSTICS purged_count = ROW_COUNT;
    RETURN QUERY SELECT purged_count;
END;
$function$;

{{ m.grant('history_purge') }}
