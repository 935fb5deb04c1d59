{#- PostgreSQL: S.Q_enqueue of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_enqueue'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('enqueue') }}(
    payload {{ payload_type }},
    due_at timestamptz DEFAULT NULL,
    dedupe_key text DEFAULT NULL{% if has_priority or client_ids or groups %},{% endif %}

{% if has_priority %}
    priority integer DEFAULT NULL{% if client_ids or groups %},{% endif %}

{% endif %}
{% if client_ids %}
    id uuid DEFAULT NULL,
    enqueued_at timestamptz DEFAULT NULL{% if groups %},{% endif %}

{% endif %}
{% if groups %}
    group_key text DEFAULT NULL
{% endif %}
)
{% if client_ids %}
RETURNS SETOF {{ names.obj("_enqueue_result") }}
{% else %}
RETURNS TABLE (id bigint, duplicate boolean)
{% endif %}
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    new_id {{ id_type }};
{% if groups %}
    is_head boolean;
{% endif %}
BEGIN
{{ m.check_payload('enqueue') }}
{% if groups %}
{{ m.check_read_committed('enqueue') }}
{% endif %}
{% if is_json %}
    -- SQL Server's ISJSON (2017-2019) only takes an object or an array; so does this twin. The
    -- table has no CHECK for it (storage v4, work.sql): this test, and enqueue_batch's, are the rule.
    IF jsonb_typeof({{ fn }}_enqueue.payload) NOT IN ('object', 'array') THEN
{{ m.throw('invalid_payload', "'" ~ names.plain('_enqueue') ~ ": payload must be a JSON object or array.'") }}
    END IF;
{% endif %}
{{ m.rewind_when(fn ~ "_enqueue.due_at", "now_utc") }}
{% if dedupe %}
{{ m.check_dedupe_key('enqueue') }}
{% else %}
    IF {{ fn }}_enqueue.dedupe_key IS NOT NULL THEN
{{ m.throw('invalid_argument', "'" ~ names.plain('_enqueue') ~ ": dedupe_key needs option dedupe.'") }}
    END IF;
{% endif %}
{% if groups %}
{{ grp.enqueue_join() }}
{% endif %}
{% set columns = ('id, ' if client_ids else '') ~ 'enqueued_at, due_at, visible_at, ' ~ ('priority, ' if has_priority else '') ~ ('dedupe_key, ' if dedupe else '') ~ ('group_key, group_head, ' if groups else '') ~ 'payload' %}
{% set values = ('coalesce(' ~ fn ~ '_enqueue.id, gen_random_uuid()), coalesce(' ~ fn ~ '_enqueue.enqueued_at, now_utc), ' if client_ids else 'now_utc, ') ~ 'coalesce(' ~ fn ~ '_enqueue.due_at, now_utc), coalesce(' ~ fn ~ '_enqueue.due_at, now_utc), ' ~ ('coalesce(' ~ fn ~ '_enqueue.priority, 0), ' if has_priority else '') ~ (fn ~ '_enqueue.dedupe_key, ' if dedupe else '') ~ (fn ~ '_enqueue.group_key, is_head, ' if groups else '') ~ fn ~ '_enqueue.payload' %}
{% if dedupe or client_ids %}
    -- ON CONFLICT waits for a racing insert of the same key{% if client_ids %} or id{% endif %}; if that row is gone again by the
    -- time we look it up (completed), try the insert once more.
    LOOP
        INSERT INTO {{ t }} AS m ({{ columns }})
        VALUES ({{ values }})
        ON CONFLICT DO NOTHING
        RETURNING m.id INTO new_id;
        IF new_id IS NOT NULL THEN
{% if opt.notify %}
{{ m.notify() | indent(8, first=true) }}
{% endif %}
{{ m.answer([('id', 'new_id'), ('duplicate', 'false')], (names.obj('_enqueue_result') if client_ids else none)) | indent(8, first=true) }}
            RETURN;
        END IF;
{% if dedupe %}
        SELECT m.id INTO new_id FROM {{ t }} AS m WHERE m.dedupe_key = {{ fn }}_enqueue.dedupe_key;
{% endif %}
{% if client_ids %}
        IF new_id IS NULL THEN
            SELECT m.id INTO new_id FROM {{ t }} AS m WHERE m.id = {{ fn }}_enqueue.id;
        END IF;
{% endif %}
        IF new_id IS NOT NULL THEN
{{ m.answer([('id', 'new_id'), ('duplicate', 'true')], (names.obj('_enqueue_result') if client_ids else none)) | indent(8, first=true) }}
            RETURN;
        END IF;
    END LOOP;
{% else %}
    INSERT INTO {{ t }} AS m ({{ columns }})
    VALUES ({{ values }})
    RETURNING m.id INTO new_id;
{% if opt.notify %}
{{ m.notify() }}
{% endif %}
{{ m.answer([('id', 'new_id'), ('duplicate', 'false')], (names.obj('_enqueue_result') if client_ids else none)) }}
{% endif %}
END;
$function$;

{{ m.grant('enqueue') }}
