{#- PostgreSQL: S.Q_dead_list of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_dead_list'), 'code') }}
-- Paged by id: pass the last id of a page as after_id to read the next one. (page_size, not
-- `limit`: a reserved word in PostgreSQL would need quoting at every call.)
CREATE OR REPLACE FUNCTION {{ names.verb('dead_list') }}(
    after_id {{ id_type }} DEFAULT NULL,
    page_size integer DEFAULT 100
)
RETURNS TABLE (
    id {{ id_type }},
    payload {{ payload_type }},
    enqueued_at timestamptz,
    due_at timestamptz,
{% if has_priority %}
    priority integer,
{% endif %}
{% if dedupe %}
    dedupe_key text,
{% endif %}
    attempts integer,
    last_error text,
    last_worker text,
    dead_at timestamptz
)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
BEGIN
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_dead_list') ~ ": page_size must be between 1 and 1000, got %s.', coalesce(page_size::text, 'NULL'))") }}
    END IF;
    RETURN QUERY
    SELECT
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
    FROM {{ dead_t }} AS d
    WHERE {{ fn }}_dead_list.after_id IS NULL OR d.id > {{ fn }}_dead_list.after_id
    ORDER BY d.id
    LIMIT page_size;
END;
$function$;

{{ m.grant('dead_list') }}
