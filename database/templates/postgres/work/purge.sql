{#- PostgreSQL: S.Q_purge of the work kind (included by work.sql, whose variables and imports it uses). -#}
{#- Delete up to limit_sql messages (NULL: no limit) enqueued before older_than, of those matching where_sql
    (none: all), in the order order_sql, into count_var. -#}
{% macro purge_statement(where_sql, order_sql, limit_sql, count_var) %}
    WITH doomed AS (
        SELECT m.id FROM {{ t }} AS m
        WHERE {% if where_sql %}{{ where_sql }} AND ({% endif %}{{ fn }}_purge.older_than IS NULL OR m.enqueued_at < {{ fn }}_purge.older_than{% if where_sql %}){% endif %}

        ORDER BY {{ order_sql }}
        LIMIT {{ limit_sql }}
        FOR UPDATE SKIP LOCKED
    ),

    deleted AS (
        DELETE FROM {{ t }} AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
    )

    SELECT count(*) INTO {{ count_var }} FROM deleted;
{%- endmacro %}
{{ m.unit(names.plain('_purge'), 'code') }}
-- Removes queue messages (leased ones too: their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR REPLACE FUNCTION {{ names.verb('purge') }}(
    older_than timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL
)
RETURNS TABLE (purged bigint)
{{ m.definer(plans='custom') }}
AS $function$
#variable_conflict use_column
DECLARE
    purged_count bigint;
{% if client_ids and not groups %}
    leased_count bigint;
{% endif %}
{% if groups %}
{{ grp.purge_declare() }}
{% endif %}
BEGIN
{{ m.check_max_rows('purge') }}
{% if groups %}
{{ m.check_read_committed('purge') }}
{% endif %}
    -- SKIP LOCKED leaves the rows a claim holds right now. Oldest first; LIMIT NULL is no limit.
    -- The doomed ids as an array, not a join: a generic plan (PL/pgSQL's own after a few calls, or
    -- plan_cache_mode) costs LIMIT max_rows at a tenth of the table and joins by hashing a sequential
    -- scan of all of it; an array is probed on the primary key whatever its size.
{% if groups %}
{{ grp.purge_rounds('m.visible_at, m.seq' if client_ids else 'm.id') }}
{% elif client_ids %}
    -- No index leads on seq: the messages nobody leases in claim order along ix_{{ queue.name }}_ready, then
    -- the leased ones along ix_{{ queue.name }}_lease_start.
{{ purge_statement("m.leased_by IS NULL", ("m.priority DESC, " if has_priority else "") ~ "m.visible_at, m.seq", fn ~ "_purge.max_rows", "purged_count") }}
    IF {{ fn }}_purge.max_rows IS NULL OR purged_count < {{ fn }}_purge.max_rows THEN
{{ purge_statement("m.leased_by IS NOT NULL", "m.leased_by, m.leased_at", fn ~ "_purge.max_rows - purged_count", "leased_count") | indent(4, first=true) }}
        purged_count := purged_count + leased_count;
    END IF;
{% else %}
{{ purge_statement(none, "m.id", fn ~ "_purge.max_rows", "purged_count") }}
{% endif %}
    RETURN QUERY SELECT purged_count;
END;
$function$;

{{ m.grant('purge') }}
