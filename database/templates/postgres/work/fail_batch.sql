{#- PostgreSQL: S.Q_fail_batch of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_fail_batch'), 'code') }}
-- fail for up to 1,000 messages in one statement, with one error for all: each item fenced by its
-- own token (NULL: by worker name); one row per item in id order, outcome as fail's.
CREATE OR REPLACE FUNCTION {{ names.verb('fail_batch') }}(
    ids {{ id_type }}[],
    lease_tokens uuid[],
    worker text,
    error text DEFAULT NULL,
    retry_after_seconds integer DEFAULT NULL
)
RETURNS TABLE (id {{ id_type }}, outcome text)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    retry_after integer := coalesce({{ fn }}_fail_batch.retry_after_seconds, 0);
    sorted_ids {{ id_type }}[];
    sorted_tokens uuid[];
    distinct_count bigint;
    retried_ids {{ id_type }}[];
    buried_ids {{ id_type }}[];
{% if groups %}
    held_keys text[];
    head_ids {{ id_type }}[];
{% endif %}
BEGIN
{{ w.check_worker('fail_batch') }}
{{ m.check_read_committed('fail_batch') }}
{{ w.check_retry_after('fail_batch', 'retry_after') }}
{{ w.check_acks('fail_batch') }}
    IF cardinality(sorted_ids) IS NULL THEN
        RETURN;
    END IF;
{% if groups %}
    -- Their groups first, in key order (the fixed lock order).
{{ grp.lock_groups_of('sorted_ids', 'held_keys') }}
{% endif %}

    -- One statement: the queue rows (locked in id order), then the dead-letter table (fail's order).
{{ w.held_cte('fail_batch') }},

    retried AS (
        UPDATE {{ t }} AS m
        SET
            leased_by = NULL,
            lease_token = NULL,
            visible_at = now_utc + make_interval(secs => retry_after),
            last_error = left({{ fn }}_fail_batch.error, 4000)
        WHERE m.id = ANY(ARRAY(SELECT h.id FROM held AS h WHERE h.attempts < {{ max_attempts }}))
        RETURNING m.id
    ),

    gone AS (
        DELETE FROM {{ t }} AS m
        WHERE m.id = ANY(ARRAY(SELECT h.id FROM held AS h WHERE h.attempts >= {{ max_attempts }}))
        RETURNING m.*
    ),

    buried AS (
{{ w.dead_insert("g.attempts", "left(" ~ fn ~ "_fail_batch.error, 4000)", "g.leased_by", returning='id') }}
    )

    SELECT
        (SELECT array_agg(r.id) FROM retried AS r),
        (SELECT array_agg(b.id) FROM buried AS b)
    INTO retried_ids, buried_ids;
    IF coalesce(cardinality(retried_ids), 0) + coalesce(cardinality(buried_ids), 0) < cardinality(sorted_ids) THEN
{{ w.lost_under_snapshot('m.id = ANY(sorted_ids)') }}
    END IF;
{% if groups %}
    IF cardinality(buried_ids) > 0 AND cardinality(held_keys) > 0 THEN
{{ grp.settle('held_keys') | indent(4, first=true) }}
    END IF;
{% endif %}
    RETURN QUERY
    SELECT
        u.id,
        CASE
            WHEN u.id = ANY(retried_ids) THEN 'retrying'
            WHEN u.id = ANY(buried_ids) THEN 'dead'
            ELSE 'lost'
        END
    FROM unnest(sorted_ids) AS u (id)
    ORDER BY u.id;
END;
$function$;

{{ m.grant('fail_batch') }}
