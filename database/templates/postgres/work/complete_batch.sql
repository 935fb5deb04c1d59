{#- PostgreSQL: S.Q_complete_batch of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_complete_batch'), 'code') }}
-- complete for up to 1,000 messages in one statement: each item fenced by its own token (NULL: by
-- worker name), one row per item in id order, completed = false where the lease was lost.
CREATE OR REPLACE FUNCTION {{ names.verb('complete_batch') }}(
    ids {{ id_type }}[],
    lease_tokens uuid[],
    worker text
)
{# Its delete locks in the order it scans: a bitmap heap scan (the generic plan's choice where ids and
    the rows' places on disk are uncorrelated: client ids, a churned table) goes in heap order. #}
RETURNS TABLE (id {{ id_type }}, completed boolean)
{{ m.definer(index_order=true) }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    sorted_ids {{ id_type }}[];
    sorted_tokens uuid[];
    distinct_count bigint;
    done_ids {{ id_type }}[];
{% if groups %}
    held_keys text[];
    head_ids {{ id_type }}[];
{% endif %}
BEGIN
{{ w.check_worker('complete_batch') }}
{{ m.check_read_committed('complete_batch') }}
{{ w.check_acks('complete_batch') }}
    IF cardinality(sorted_ids) IS NULL THEN
        RETURN;
    END IF;
{% if groups %}
    -- Their groups first, in key order (the fixed lock order).
{{ grp.lock_groups_of('sorted_ids', 'held_keys') }}
{% endif %}

    -- One statement: the queue rows, then the history table (complete's order). One walk of the
    -- primary key by = ANY(sorted_ids) deletes the rows in id order (the fixed lock order: with
    -- sequential and bitmap scans off, the plan is that index scan); each row's token is the one at
    -- its id's place in sorted_ids, found by width_bucket's binary search (the ids are sorted and
    -- distinct). A join to unnest(ids, tokens) instead would be planned as a nested loop rescanning
    -- the array for every row. A row another transaction changed meanwhile is judged again on its
    -- new version.
    WITH done AS (
        DELETE FROM {{ t }} AS m
        WHERE
            m.id = ANY(sorted_ids) AND m.leased_by IS NOT DISTINCT FROM {{ fn }}_complete_batch.worker
            AND m.visible_at > now_utc
            AND (
                sorted_tokens[width_bucket(m.id, sorted_ids)] IS NULL
                OR m.lease_token = sorted_tokens[width_bucket(m.id, sorted_ids)]
            )
        RETURNING m.*
    ){% if history %},

    kept AS (
{{ w.history_insert() }}
    ){% endif %}

    SELECT array_agg(d.id) INTO done_ids FROM done AS d;
    IF cardinality(done_ids) IS DISTINCT FROM cardinality(sorted_ids) THEN
{{ w.lost_under_snapshot('m.id = ANY(sorted_ids)') }}
    END IF;
{% if groups %}
    IF cardinality(done_ids) > 0 AND cardinality(held_keys) > 0 THEN
{{ grp.settle('held_keys') | indent(4, first=true) }}
    END IF;
{% endif %}
    RETURN QUERY
    SELECT u.id, coalesce(u.id = ANY(done_ids), false)
    FROM unnest(sorted_ids) AS u (id)
    ORDER BY u.id;
END;
$function$;

{{ m.grant('complete_batch') }}
