{#- PostgreSQL: S.Q_fail of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_fail'), 'code') }}
-- With attempts left: release the lease, visible again after retry_after_seconds. On the last
-- attempt: to the dead-letter table with the error. outcome: retrying | dead | lost (the caller's
-- lease had expired or moved on: nothing changed).
CREATE OR REPLACE FUNCTION {{ names.verb('fail') }}(
    id {{ id_type }},
    worker text,
    error text DEFAULT NULL,
    retry_after_seconds integer DEFAULT NULL
)
RETURNS TABLE (outcome text)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    retry_after integer := coalesce({{ fn }}_fail.retry_after_seconds, 0);
    changed bigint;
BEGIN
{{ w.check_worker('fail') }}
    IF retry_after NOT BETWEEN 0 AND 2592000 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_fail') ~ ": retry_after_seconds must be between 0 and 2592000, got %s.', retry_after)") }}
    END IF;

    UPDATE {{ t }} AS m
    SET
        leased_by = NULL,
        visible_at = now_utc + make_interval(secs => retry_after),
        last_error = left({{ fn }}_fail.error, 4000)
    WHERE
        m.id = {{ fn }}_fail.id AND m.leased_by = {{ fn }}_fail.worker AND m.visible_at > now_utc
        AND m.attempts < {{ max_attempts }};
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed > 0 THEN
        RETURN QUERY SELECT 'retrying'::text;
        RETURN;
    END IF;

{{ w.bury("m.id = " ~ fn ~ "_fail.id AND m.leased_by = " ~ fn ~ "_fail.worker AND m.visible_at > now_utc", "g.attempts", "left(" ~ fn ~ "_fail.error, 4000)", "g.leased_by", "changed") }}
    IF changed = 0 THEN
{{ w.lost_under_snapshot('fail') }}
    END IF;
    RETURN QUERY SELECT CASE WHEN changed > 0 THEN 'dead' ELSE 'lost' END;
END;
$function$;

{{ m.grant('fail') }}
