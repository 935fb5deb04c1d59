{#- PostgreSQL: S.Q_complete_next of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete_next'), 'code') }}
-- complete, then dequeue, in the caller's one transaction: one commit per message instead of two.
-- The rows are dequeue's with previous_completed (complete's answer) added; when nothing is ready,
-- one row with a NULL id carries it.
CREATE OR REPLACE FUNCTION {{ names.verb('complete_next') }}(
    id {{ id_type }},
    worker text,
    lease_token uuid DEFAULT NULL,
    batch_size integer DEFAULT 1,
    lease_seconds integer DEFAULT NULL
)
RETURNS SETOF {{ names.obj("_complete_next_result") }}
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
    completed_now boolean;
    effective_lease integer := coalesce({{ fn }}_complete_next.lease_seconds, {{ lease_seconds }});
BEGIN
{{ w.check_worker('complete_next') }}
{% if groups %}
{{ m.check_read_committed('complete_next') }}
{% endif %}
{{ m.check_batch_size('complete_next') }}
{{ w.check_lease('complete_next', 'effective_lease') }}
    -- complete's statements in this function's body (a call of complete would cost a function entry).
{{ w.complete_statements('complete_next') }}
    completed_now := done_count > 0;
    RETURN QUERY
    SELECT d.id, d.payload, d.enqueued_at, d.due_at, d.attempts, d.lease_token, {% if groups %}d.group_key, {% endif %}completed_now
    FROM {{ names.verb('dequeue') }}({{ fn }}_complete_next.batch_size, {{ fn }}_complete_next.worker, {{ fn }}_complete_next.lease_seconds) AS d;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::{{ id_type }}, NULL::{{ payload_type }}, NULL::timestamptz, NULL::timestamptz, NULL::integer, NULL::uuid, {% if groups %}NULL::text, {% endif %}completed_now;
    END IF;
END;
$function$;

{{ m.grant('complete_next') }}
