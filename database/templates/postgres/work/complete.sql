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
{% if groups %}
    -- The message's group first (the fixed lock order): completing its in-flight message moves its head.
{{ grp.lock_groups_of('ARRAY[' ~ fn ~ '_complete.id]', 'held_keys') }}
{% endif %}
{% if history %}
    -- One statement: queue table, then history table (the fixed lock order).
    WITH done AS (
        DELETE FROM {{ t }} AS m
        WHERE {{ w.lease_guard('complete') | indent(4) }}
        RETURNING m.*
    ),

    kept AS (
{{ w.history_insert() }}
    )

    SELECT count(*) INTO done_count FROM kept;
{% else %}
    DELETE FROM {{ t }} AS m
    WHERE {{ w.lease_guard('complete') }};
    GET DIAGNOSTICS done_count = ROW_COUNT;
{% endif %}
    IF done_count = 0 THEN
{{ w.lost_under_snapshot('m.id = ' ~ fn ~ '_complete.id') }}
{% if groups %}
    ELSIF cardinality(held_keys) > 0 THEN
{{ grp.settle('held_keys') | indent(4, first=true) }}
{% endif %}
    END IF;
    RETURN QUERY SELECT done_count > 0;
END;
$function$;

{{ m.grant('complete') }}
