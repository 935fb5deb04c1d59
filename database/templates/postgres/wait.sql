{#- PostgreSQL: S.Q_wait of every kind and the definer probe it calls (included by work.sql and
    _destructive.sql, whose variables and imports it uses). -#}
{% set is_work = queue.kind == 'work' %}
{% if is_work %}
{% set ready_sql = 'm.visible_at <= now_utc' %}
{% set probe_order_sql = 'm.visible_at, m.' ~ tie %}
{% elif has_due %}
{% set ready_sql = 'm.due_at <= now_utc' %}
{% set probe_order_sql = claim_order_sql %}
{% else %}
{% set ready_sql = none %}
{% set probe_order_sql = claim_order_sql %}
{% endif %}
{% macro probe(where_sql) %}
    PERFORM
    FROM {{ t }} AS m
    WHERE {{ where_sql }}
    ORDER BY {{ probe_order_sql }}
    LIMIT 1
    FOR KEY SHARE SKIP LOCKED;
{%- endmacro %}
{{ m.unit(names.plain('_wait_probe'), 'code') }}
-- One step of S.Q_wait: is a message ready that dequeue would hand out now? A row that an open
-- dequeue{% if is_work %} (or complete, fail, release){% endif %} has locked is not: FOR KEY SHARE
-- SKIP LOCKED passes over it, as READPAST does on SQL Server. The weakest row lock there is, and
-- only on the one row found; the calling procedure commits it at once. The definer half of the
-- wait: PostgreSQL refuses COMMIT in a definer procedure (2D000), and the caller may not read the table.
CREATE OR REPLACE FUNCTION {{ names.verb('wait_probe') }}()
RETURNS boolean
{{ m.definer() }}
AS $function$
DECLARE
    now_utc timestamptz := clock_timestamp();
{% if is_work and has_priority %}
    current_level integer;
{% endif %}
BEGIN
{% if is_work and has_priority %}
    -- One probe per priority level present, from the top (the loose index scan of dequeue).
    current_level := (SELECT m.priority FROM {{ t }} AS m ORDER BY m.priority DESC LIMIT 1);
    WHILE current_level IS NOT NULL LOOP
{{ probe("m.priority = current_level AND " ~ ready_sql) | indent(4, first=true) }}
        IF FOUND THEN
            RETURN true;
        END IF;
        current_level := (
            SELECT m.priority FROM {{ t }} AS m WHERE m.priority < current_level ORDER BY m.priority DESC LIMIT 1
        );
    END LOOP;
    RETURN false;
{% elif ready_sql %}
{{ probe(ready_sql) }}
    RETURN FOUND;
{% else %}
    PERFORM
    FROM {{ t }} AS m
    ORDER BY {{ probe_order_sql }}
    LIMIT 1
    FOR KEY SHARE SKIP LOCKED;
    RETURN FOUND;
{% endif %}
END;
$function$;

{{ m.grant('wait_probe') }}

{{ m.unit(names.plain('_wait'), 'code') }}
-- Returns ready = true as soon as a message is ready to dequeue, false after wait_ms. Each step is a
-- transaction of its own: COMMIT, one probe, a 50 ms sleep; so it holds no lock and no transaction
-- between steps, and its snapshot is never older than one step (vacuum is not held back). It claims
-- nothing: the caller dequeues next, in its own transaction. Because it commits it must be CALLed
-- outside a transaction block (autocommit); inside one PostgreSQL refuses the first COMMIT (2D000).
-- No definer rights and no pinned search_path, for the same reason as S.Q_process; every routine it
-- calls is schema-qualified. With notify: true, LISTEN on the queue's channel wakes a client sooner.
CREATE OR REPLACE PROCEDURE {{ names.verb('wait') }}(
    wait_ms integer DEFAULT 20000,
    INOUT ready boolean DEFAULT NULL
)
LANGUAGE plpgsql
AS $procedure$
DECLARE
    deadline timestamptz;
BEGIN
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
{{ m.throw('in_transaction', "'" ~ names.plain('_wait') ~ ": commits between its steps and cannot run inside an open transaction.'") }}
    END IF;
    IF wait_ms IS NULL OR wait_ms NOT BETWEEN 0 AND 20000 THEN
{{ m.throw('invalid_argument', "pg_catalog.format('" ~ names.plain('_wait') ~ ": wait_ms must be between 0 and 20000, got %s.', coalesce(wait_ms::text, 'NULL'))") }}
    END IF;
    deadline := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => wait_ms / 1000.0);
    LOOP
        COMMIT;
        ready := {{ names.verb('wait_probe') }}();
        EXIT WHEN ready OR pg_catalog.clock_timestamp() >= deadline;
        PERFORM pg_catalog.pg_sleep(
            LEAST(0.05, pg_catalog.date_part('epoch', deadline - pg_catalog.clock_timestamp()))
        );
    END LOOP;
    COMMIT;
END;
$procedure$;

{{ m.grant('wait', 'PROCEDURE') }}
