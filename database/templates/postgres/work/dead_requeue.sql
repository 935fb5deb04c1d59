{#- PostgreSQL: S.Q_dead_requeue of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_dead_requeue'), 'code') }}
-- Back to the queue under the same id, visible now, attempts reset; the last error stays on the
-- row for reference.
CREATE OR REPLACE FUNCTION {{ names.verb('dead_requeue') }}(id {{ id_type }})
RETURNS TABLE (requeued boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    dead_row record;
{% if groups %}
    is_head boolean;
    group_held boolean := false;
    head_ids {{ id_type }}[];
{% endif %}
{% if dedupe or client_ids %}
    moved bigint;
{% endif %}
BEGIN
    IF {{ fn }}_dead_requeue.id IS NULL THEN
{{ m.throw('invalid_argument', "'" ~ names.plain('_dead_requeue') ~ ": id must not be NULL.'") }}
    END IF;
{% if groups %}
{{ m.check_read_committed('dead_requeue') }}
{% endif %}
{% if client_ids %}
    -- Queue table first (the fixed lock order): the same client id may have been enqueued again.
    PERFORM FROM {{ t }} AS m WHERE m.id = {{ fn }}_dead_requeue.id FOR UPDATE;
    IF FOUND THEN
        IF NOT EXISTS (SELECT FROM {{ dead_t }} AS d WHERE d.id = {{ fn }}_dead_requeue.id) THEN
{{ m.throw('not_found', "format('" ~ names.plain('_dead_requeue') ~ ": no dead-letter message with id %s.', " ~ fn ~ "_dead_requeue.id)") | indent(4, first=true) }}
        END IF;
{{ m.throw('invalid_argument', "format('" ~ names.plain('_dead_requeue') ~ ": a message with id %s is in the queue already.', " ~ fn ~ "_dead_requeue.id)") }}
    END IF;
{% endif %}
    -- The dead row, locked: a concurrent requeue or delete of the same id waits here and then finds
    -- it gone (not_found), instead of colliding with this one's insert.
    SELECT d.* INTO dead_row FROM {{ dead_t }} AS d WHERE d.id = {{ fn }}_dead_requeue.id FOR UPDATE;
    IF NOT FOUND THEN
{{ m.throw('not_found', "format('" ~ names.plain('_dead_requeue') ~ ": no dead-letter message with id %s.', " ~ fn ~ "_dead_requeue.id)") }}
    END IF;
{% if groups %}
{% if client_ids %}
    -- Back into its group, under its client id but a new seq: its group serves it in seq order,
    -- after the messages already there.
{% else %}
    -- Back into its group, under its id: its group serves it in id order, so it comes before the
    -- group's later messages that are not yet in flight.
{% endif %}
    IF dead_row.group_key IS NOT NULL THEN
{{ grp.join_group('dead_row.group_key', 'is_head', 'group_held') | indent(4, first=true) }}
    END IF;
{% endif %}
{% set requeue_columns = 'id, enqueued_at, due_at, visible_at, ' ~ ('priority, ' if has_priority else '') ~ ('dedupe_key, ' if dedupe else '') ~ ('group_key, group_head, ' if groups else '') ~ 'attempts, last_error, payload' %}
{% macro requeue_values(key_sql) %}
    VALUES (
        dead_row.id, dead_row.enqueued_at, dead_row.due_at, now_utc, {% if has_priority %}dead_row.priority, {% endif %}{% if dedupe %}{{ key_sql }}, {% endif %}{% if groups %}dead_row.group_key, is_head, {% endif %}0,
        dead_row.last_error, dead_row.payload
    )
{%- endmacro %}
    INSERT INTO {{ t }} AS m ({{ requeue_columns }})
{% if not client_ids %}
    OVERRIDING SYSTEM VALUE
{% endif %}
{{ requeue_values('dead_row.dedupe_key') }}{% if dedupe or client_ids %}

    ON CONFLICT DO NOTHING{% endif %};
{% if dedupe or client_ids %}
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved = 0 THEN
{% if client_ids %}
        IF EXISTS (SELECT FROM {{ t }} AS m WHERE m.id = {{ fn }}_dead_requeue.id) THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_dead_requeue') ~ ": a message with id %s is in the queue already.', " ~ fn ~ "_dead_requeue.id)") | indent(4, first=true) }}
        END IF;
{% endif %}
        -- {% if dedupe %}The key was enqueued again since: the message comes back without it rather than not
        -- at all (requeue is a deliberate admin action on this one message). {% endif %}No ON CONFLICT: whatever
        -- collides now raises rather than losing the message.
        INSERT INTO {{ t }} AS m ({{ requeue_columns }})
{% if not client_ids %}
        OVERRIDING SYSTEM VALUE
{% endif %}
{{ requeue_values('NULL') | indent(4, first=true) }};
    END IF;
{% endif %}
{% if groups %}
    -- join_group flags a new message only in an empty group, but this one may come before the
    -- group's head (a later message, perhaps not due for a day): the holder makes the flags exact.
    -- Not held: the message is a candidate (is_head) and the group's next holder settles it.
    IF group_held THEN
{{ grp.settle('ARRAY[dead_row.group_key]') | indent(4, first=true) }}
    END IF;
{% endif %}
    DELETE FROM {{ dead_t }} AS d WHERE d.id = {{ fn }}_dead_requeue.id;
{% if opt.notify %}
{{ m.notify() }}
{% endif %}
    RETURN QUERY SELECT true;
END;
$function$;

{{ m.grant('dead_requeue') }}
