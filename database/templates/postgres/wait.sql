{#- PostgreSQL: S.Q_wait of every kind and the definer step it calls (included by work.sql and
    _destructive.sql, whose variables and imports it uses). -#}
{% set is_work = queue.kind == 'work' %}
{% set grouped = opt.get('groups', false) %}
{% if is_work %}
{% set ready_sql = 'm.visible_at <= now_utc' %}
{#- The messages nobody leases: ix_<q>_ready's predicate (expired leases: the probe after). -#}
{% set unleased_sql = w.ready_filter('m') ~ ' AND ' %}
{% set probe_order_sql = 'm.visible_at, m.' ~ tie %}
{% set probe_position = not has_priority and not grouped %}
{% else %}
{% set unleased_sql = '' %}
{% set ready_sql = 'm.due_at <= now_utc' if has_due else 'true' %}
{% set probe_order_sql = claim_order_sql %}
{% set probe_position = has_position %}
{% endif %}
{% macro probe(where_sql, order_sql=probe_order_sql) %}
    PERFORM
    FROM {{ t }} AS m
    WHERE {{ where_sql }}
    ORDER BY {{ order_sql }}
    LIMIT 1
    FOR KEY SHARE SKIP LOCKED;
{%- endmacro %}
{{ m.unit(names.plain('_wait_step'), 'code') }}
-- One step of S.Q_wait: true when a message is ready that this session's dequeue would hand out
-- now; otherwise a sleep, then false, or NULL once wait_ms have passed since started_at. The sleep
-- is a quarter of the time waited so far, at least 5 ms and at most 50 ms: a message that comes
-- soon after a consumer started waiting wakes it within a few ms, while a consumer that stays idle
-- probes 20 times a second (each step costs a commit and a wake-up, not only the probe).
-- A row an open dequeue{% if is_work %} (or complete, fail, release){% endif %} has locked is not ready: FOR KEY
-- SHARE SKIP LOCKED passes over it, as READPAST does on SQL Server; the weakest row lock there is,
-- on the one row found, which the caller's next COMMIT ends at once.
{% if probe_position %}
-- It reads from the session's claim position, as dequeue does, so an idle wait does not walk dead
-- index entries every step.
{% endif %}
-- Everything but the COMMITs is here, with definer rights and a pinned search_path: PostgreSQL
-- refuses COMMIT in such a procedure (2D000), and the procedure, run with the caller's search_path,
-- evaluates no operator.
CREATE OR REPLACE FUNCTION {{ names.verb('wait_step') }}(wait_ms integer, started_at timestamptz)
RETURNS boolean
{{ m.definer() }}
AS $function$
DECLARE
    now_utc timestamptz := clock_timestamp();
    deadline timestamptz;
{% if is_work and has_priority %}
    current_level integer;
{% elif probe_position %}
{{ m.position_declare(position_key, seen=false) }}
{% endif %}
{% if is_work %}
    expired_state text := current_setting({{ w.expired_setting() }}, true);
{% endif %}
BEGIN
    IF wait_ms IS NULL OR wait_ms NOT BETWEEN 0 AND 20000 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_wait') ~ ": wait_ms must be between 0 and 20000, got %s.', coalesce(wait_ms::text, 'NULL'))") }}
    END IF;
    deadline := started_at + make_interval(secs => wait_ms / 1000.0);
{% if is_work and has_priority %}
    -- One probe per priority level present, from the top (the loose index scan of dequeue).
    current_level := (SELECT m.priority FROM {{ t }} AS m WHERE {{ w.ready_filter('m') }} ORDER BY m.priority DESC LIMIT 1);
    WHILE current_level IS NOT NULL LOOP
{{ probe("m.priority = current_level AND " ~ unleased_sql ~ ready_sql) | indent(4, first=true) }}
        IF FOUND THEN
            RETURN true;
        END IF;
        current_level := (
            SELECT m.priority FROM {{ t }} AS m
            WHERE m.priority < current_level AND {{ w.ready_filter('m') }}
            ORDER BY m.priority DESC
            LIMIT 1
        );
    END LOOP;
{% elif grouped %}
    -- A message without a group on its claim index, else a group's head candidate in a group
    -- nobody holds. That probe locks the groups row (FOR SHARE: held groups are stepped over, and a
    -- claim steps over this one for the instant until the caller's COMMIT), never the candidate: a
    -- claim that took the group and then met its head locked would hold the group with no message.
{{ probe((unleased_sql if is_work else 'm.group_key IS NULL AND ') ~ ready_sql) }}
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM
    FROM {{ t }} AS m
    INNER JOIN {{ names.obj('_groups') }} AS g ON m.group_key = g.group_key
    WHERE m.group_head AND {{ ready_sql }}
    ORDER BY {{ probe_order_sql }}
    LIMIT 1
    FOR SHARE OF g SKIP LOCKED;
    IF FOUND THEN
        RETURN true;
    END IF;
{% else %}
{% if probe_position %}
{{ m.position_load(position_key) }}
{% endif %}
{{ probe((m.position_predicate(position_key) ~ ' AND ' if probe_position else unleased_sql) ~ ready_sql) }}
    IF FOUND THEN
        RETURN true;
    END IF;
{% endif %}
{% if is_work %}
    -- An expired lease, when this session's dequeue would look for one now (w.expired_due): not
    -- sooner, or the caller would dequeue nothing and be woken again at once until its look is due.
    -- A probe that finds none counts as the session's look (the next is due a second later), as
    -- dequeue's does: it reads every lease the queue holds, and would otherwise at every step.
    IF {{ w.expired_due('expired_state') }} THEN
{{ probe(w.expired_filter('m'), w.expired_order) | indent(4, first=true) }}
        IF FOUND THEN
            RETURN true;
        END IF;
    {{ w.expired_looked('expired_state') }}
    END IF;
{% endif %}
    IF clock_timestamp() >= deadline THEN
        RETURN NULL;
    END IF;
    PERFORM pg_sleep(least(
        0.05,
        greatest(0.005, extract(EPOCH FROM now_utc - started_at) / 4),
        extract(EPOCH FROM deadline - clock_timestamp())
    ));
    RETURN false;
END;
$function$;

{{ m.grant('wait_step') }}

{{ m.unit(names.plain('_wait'), 'code') }}
-- Returns ready = true as soon as a message is ready to dequeue, false after wait_ms. Each step is a
-- transaction of its own: COMMIT, then S.Q_wait_step (a probe, a sleep of 5 to 50 ms); so it holds
-- no lock and no transaction between steps, and the snapshot it holds while it sleeps is renewed
-- every step (backend_xmin moves on: vacuum is not held back). It claims nothing: the caller
-- dequeues next, in its own transaction. Because it commits it must be CALLed outside a transaction
-- block (autocommit): a caller that has written is refused (TQ003), any other open transaction
-- block by PostgreSQL at the first COMMIT (2D000). No definer rights and no pinned search_path, as
-- S.Q_process; its step is schema-qualified and it evaluates no operator the caller's search_path
-- could resolve. With notify: true, LISTEN on the queue's channel wakes a client sooner.
CREATE OR REPLACE PROCEDURE {{ names.verb('wait') }}(
    wait_ms integer DEFAULT 20000,
    INOUT ready boolean DEFAULT NULL
)
LANGUAGE plpgsql
AS $procedure$
DECLARE
    started_at timestamptz := pg_catalog.clock_timestamp();
    step_ready boolean;
BEGIN
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
{{ m.throw('in_transaction', "'" ~ names.plain('_wait') ~ ": commits between its steps and cannot run inside an open transaction.'") }}
    END IF;
    LOOP
        COMMIT;
        step_ready := {{ names.verb('wait_step') }}(wait_ms, started_at);
        EXIT WHEN step_ready OR step_ready IS NULL;
    END LOOP;
    ready := step_ready IS NOT NULL;
    COMMIT;
END;
$procedure$;

{{ m.grant('wait', 'PROCEDURE') }}
