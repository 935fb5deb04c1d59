{#- PostgreSQL: S.Q_complete of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete'), 'code') }}
-- Only the holder of a live lease (given a token, of that very lease): a late complete after the
-- lease moved on changes nothing.
CREATE OR REPLACE FUNCTION {{ names.verb('complete') }}(
    id {{ id_type }},
    worker text,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (completed boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    done_count bigint;
{% if groups %}
    held_keys text[];
    head_ids {{ id_type }}[];
{% endif %}
BEGIN
{{ w.check_worker('complete') }}
{% if groups %}
{{ m.check_read_committed('complete') }}
{% endif %}
{{ w.complete_statements('complete') }}
{{ m.answer([('completed', 'done_count > 0')]) }}
END;
$function$;

{{ m.grant('complete') }}
