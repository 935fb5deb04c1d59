{#- PostgreSQL: S.Q_extend_lease of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_extend_lease'), 'code') }}
-- The new lease runs from now; an expired lease cannot be revived (another worker may have it).
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
        -- The UPDATE judged the row version it could see: one whose lease had run out is passed
        -- over without waiting for a transaction that is completing (deleting) it. Wait for that
        -- transaction, as SQL Server's UPDATE does on the row's update lock, so that false means
        -- the lease is not the caller's once it has ended: a caller taking leases back (the Spark
        -- drain's sweep) learns that no complete is in flight. The lock is taken in a
        -- subtransaction rolled back at once: nothing stays locked in the caller's transaction.
        IF current_setting('transaction_isolation') NOT IN ('repeatable read', 'serializable') THEN
            BEGIN
                PERFORM FROM {{ t }} AS m WHERE m.id = {{ fn }}_extend_lease.id FOR KEY SHARE;
                RAISE SQLSTATE 'TQ900';
            EXCEPTION WHEN SQLSTATE 'TQ900' THEN
                NULL;
            END;
        END IF;
{{ w.lost_under_snapshot('m.id = ' ~ fn ~ '_extend_lease.id') }}
    END IF;
{{ m.answer([('extended', 'changed > 0')]) }}
END;
$function$;

{{ m.grant('extend_lease') }}
