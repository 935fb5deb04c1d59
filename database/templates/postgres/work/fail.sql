{#- PostgreSQL: S.Q_fail of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_fail'), 'code') }}
-- With attempts left: release the lease, visible again after retry_after_seconds. On the last
-- attempt: to the dead-letter table with the error. outcome: retrying | dead | lost (the caller's
-- lease had expired or moved on: nothing changed).
CREATE OR REPLACE FUNCTION {{ names.verb('fail') }}(
    id {{ id_type }},
    worker text,
    error text DEFAULT NULL,
    retry_after_seconds integer DEFAULT NULL,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (outcome text)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    retry_after integer := coalesce({{ fn }}_fail.retry_after_seconds, 0);
    changed bigint;
{% if groups %}
    held_keys text[];
    head_ids {{ id_type }}[];
{% endif %}
BEGIN
{{ w.check_worker('fail') }}
{% if groups %}
{{ m.check_read_committed('fail') }}
{% endif %}
{{ w.check_retry_after('fail', 'retry_after') }}
{% if groups %}
    -- The message's group first (the fixed lock order): a last attempt buries its in-flight message
    -- and moves its head. A retry keeps it in flight, the head of its group.
{{ grp.lock_groups_of('ARRAY[' ~ fn ~ '_fail.id]', 'held_keys') }}
{% endif %}

    UPDATE {{ t }} AS m
    SET
        leased_by = NULL,
        lease_token = NULL,
        visible_at = now_utc + make_interval(secs => retry_after),
        last_error = left({{ fn }}_fail.error, 4000)
    WHERE
        {{ w.lease_guard('fail') }}
        AND m.attempts < {{ max_attempts }};
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed > 0 THEN
{{ m.answer([('outcome', "'retrying'")]) | indent(4, first=true) }}
        RETURN;
    END IF;

{{ w.bury(w.lease_guard('fail'), "g.attempts", "left(" ~ fn ~ "_fail.error, 4000)", "g.leased_by", "changed") }}
    IF changed = 0 THEN
{{ w.lost_under_snapshot('m.id = ' ~ fn ~ '_fail.id') }}
{% if groups %}
    ELSIF cardinality(held_keys) > 0 THEN
{{ grp.settle('held_keys') | indent(4, first=true) }}
{% endif %}
    END IF;
{{ m.answer([('outcome', "CASE WHEN changed > 0 THEN 'dead' ELSE 'lost' END")]) }}
END;
$function$;

{{ m.grant('fail') }}
