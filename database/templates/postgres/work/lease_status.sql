{#- PostgreSQL: S.Q_lease_status of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_lease_status'), 'code') }}
-- What became of up to 1,000 leases, each named by its message id and lease token: held (the
-- message is in the queue under this live lease), expired (in the queue under this lease, which ran
-- out: no acknowledgement that reads its clock from now on takes it, one that read it before may),
-- lost (in the queue under no lease or another one: released, failed for a retry or leased again;
-- this lease never completes), dead (in the dead-letter table) or gone (in neither: completed, or
-- purged). A consumer whose complete's answer never arrived (the connection dropped at COMMIT)
-- learns whether it committed. It first waits for each transaction that, when it looks, has changed,
-- deleted or locked for update one of these messages' rows (a complete, a fail, a release in
-- flight), so the answer is what that transaction left, not what it may still undo. Changes nothing,
-- locks nothing after it returns. One row per item, in id order.
CREATE OR REPLACE FUNCTION {{ names.verb('lease_status') }}(
    ids {{ id_type }}[],
    lease_tokens uuid[]
)
RETURNS TABLE (id {{ id_type }}, status text)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz;
    sorted_ids {{ id_type }}[];
    sorted_tokens uuid[];
    distinct_count bigint;
    remaining_ids {{ id_type }}[];
    free_ids {{ id_type }}[];
    wait_id {{ id_type }};
BEGIN
{{ m.check_read_committed('lease_status') }}
{{ w.check_acks('lease_status') }}
    IF array_position(sorted_tokens, NULL) IS NOT NULL THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_lease_status') ~ ": the lease token of id %s is NULL.', sorted_ids[array_position(sorted_tokens, NULL)])") }}
    END IF;
    IF cardinality(sorted_ids) IS NULL THEN
        RETURN;
    END IF;
    -- The wait: FOR SHARE waits for a transaction that updates, deletes or locks a row for update;
    -- each lock is taken in a subtransaction rolled back at once, so none outlives it. A pass takes
    -- every row nobody holds, without waiting; then the first row still held alone; then a pass over
    -- the rest again (what was held may be free by then): no share is kept while waiting for another
    -- row (a complete of a row passed would wait behind this call, and could deadlock with it), and
    -- a subtransaction that locks takes a transaction id only per wait, not per held row.
    remaining_ids := sorted_ids;
    LOOP
{{ m.locked_a_moment('free_ids := ARRAY(SELECT m.id FROM ' ~ t ~ ' AS m WHERE m.id = ANY(remaining_ids) ORDER BY m.id FOR SHARE SKIP LOCKED);') | indent(4, first=true) }}
        wait_id := (
            SELECT m.id FROM {{ t }} AS m
            WHERE m.id = ANY(remaining_ids) AND m.id <> ALL(free_ids)
            ORDER BY m.id
            LIMIT 1
        );
        EXIT WHEN wait_id IS NULL;
{{ m.locked_a_moment('PERFORM FROM ' ~ t ~ ' AS m WHERE m.id = wait_id FOR SHARE;') | indent(4, first=true) }}
        remaining_ids := ARRAY(SELECT r.id FROM unnest(remaining_ids) AS r (id) WHERE r.id > wait_id ORDER BY r.id);
    END LOOP;
    -- After the wait: this statement's snapshot sees what those transactions committed.
    now_utc := clock_timestamp();
    RETURN QUERY
    SELECT
        u.id,
        CASE
            WHEN q.id IS NOT NULL AND q.lease_token = u.lease_token AND q.visible_at > now_utc THEN 'held'
            WHEN q.id IS NOT NULL AND q.lease_token = u.lease_token THEN 'expired'
            WHEN q.id IS NOT NULL THEN 'lost'
            WHEN EXISTS (SELECT FROM {{ dead_t }} AS d WHERE d.id = u.id) THEN 'dead'
            ELSE 'gone'
        END
    FROM unnest(sorted_ids, sorted_tokens) AS u (id, lease_token)
    LEFT JOIN LATERAL (
        SELECT m.id, m.lease_token, m.visible_at FROM {{ t }} AS m WHERE m.id = u.id OFFSET 0
    ) AS q ON true
    ORDER BY u.id;
END;
$function$;

{{ m.grant('lease_status') }}
