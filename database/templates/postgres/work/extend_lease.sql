{#- PostgreSQL: S.Q_extend_lease of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_extend_lease'), 'code') }}
-- The new lease runs from now; an extend begun after the lease expired cannot revive it (another
-- worker may have it).
CREATE OR REPLACE FUNCTION {{ names.verb('extend_lease') }}(
    id {{ id_type }},
    worker text,
    lease_seconds integer DEFAULT NULL,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (extended boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    effective_lease integer := coalesce({{ fn }}_extend_lease.lease_seconds, {{ lease_seconds }});
    changed bigint;
BEGIN
{{ w.check_worker('extend_lease') }}
{{ w.check_lease('extend_lease', 'effective_lease') }}
    UPDATE {{ t }} AS m
    SET visible_at = now_utc + make_interval(secs => effective_lease)
    WHERE {{ w.lease_guard('extend_lease') }};
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
{{ w.lost_under_snapshot('m.id = ' ~ fn ~ '_extend_lease.id', wait_verb='extend_lease') }}
    END IF;
{{ m.answer([('extended', 'changed > 0')]) }}
END;
$function$;

{{ m.grant('extend_lease') }}
