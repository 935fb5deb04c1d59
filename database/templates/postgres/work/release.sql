{#- PostgreSQL: S.Q_release of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_release'), 'code') }}
-- Gives a leased message back at once, with its attempt: a consumer shutting down gracefully (or
-- handing work it will not start to another) spends none of max_attempts. Only the holder of the
-- live lease; a lost lease changes nothing (released = false).
CREATE OR REPLACE FUNCTION {{ names.verb('release') }}(
    id {{ id_type }},
    worker text,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (released boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    changed bigint;
BEGIN
{{ w.check_worker('release') }}
    -- visible_at = now: at or after every claim position a consumer can have stored, so the next
    -- dequeue finds it.
    UPDATE {{ t }} AS m
    SET
        leased_by = NULL,
        leased_at = NULL,
        lease_token = NULL,
        visible_at = now_utc,
        attempts = greatest(m.attempts - 1, 0)
    WHERE {{ w.lease_guard('release') }};
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
{{ w.lost_under_snapshot('m.id = ' ~ fn ~ '_release.id') }}
{% if opt.notify %}
    ELSE
{{ m.notify() | indent(4, first=true) }}
{% endif %}
    END IF;
{{ m.answer([('released', 'changed > 0')]) }}
END;
$function$;

{{ m.grant('release') }}
