{#- PostgreSQL: S.Q_purge of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_purge'), 'code') }}
-- Removes queue messages (leased ones too: their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR REPLACE FUNCTION {{ names.verb('purge') }}(
    older_than timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL
)
RETURNS TABLE (purged bigint)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    purged_count bigint;
{% if groups %}
{{ grp.purge_declare() }}
{% endif %}
BEGIN
{{ m.check_max_rows('purge') }}
{% if groups %}
{{ m.check_read_committed('purge') }}
{% endif %}
    -- SKIP LOCKED leaves the rows a claim holds right now. Oldest first; LIMIT NULL is no limit.
    -- The doomed ids as an array, not a join: a generic plan (PL/pgSQL's own after a few calls, or
    -- plan_cache_mode) costs LIMIT max_rows at a tenth of the table and joins by hashing a sequential
    -- scan of all of it; an array is probed on the primary key whatever its size.
{% if groups %}
{{ grp.purge_rounds('m.visible_at, m.seq' if client_ids else 'm.id') }}
{% else %}
    WITH doomed AS (
        SELECT m.id FROM {{ t }} AS m
        WHERE {{ fn }}_purge.older_than IS NULL OR m.enqueued_at < {{ fn }}_purge.older_than
{% if client_ids %}
        -- In claim order, along the claim index: no index leads on seq.
        ORDER BY {% if has_priority %}m.priority DESC, {% endif %}m.visible_at, m.seq
{% else %}
        ORDER BY m.id
{% endif %}
        LIMIT {{ fn }}_purge.max_rows
        FOR UPDATE SKIP LOCKED
    ),

    deleted AS (
        DELETE FROM {{ t }} AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
    )

    SELECT count(*) INTO purged_count FROM deleted;
{% endif %}
    RETURN QUERY SELECT purged_count;
END;
$function$;

{{ m.grant('purge') }}
