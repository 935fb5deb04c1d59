{#- Shared PL/pgSQL fragments. Imported "with context" so they see names, errors and the queue. -#}
{#- A storage unit declares its storage version and object, and its shape: the kind and the options
    (shape: payload, dedupe, priority, client_ids) that decide its columns and indexes. The deploy
    tool tracks it by version and shape, never by its text: a change of the SQL beyond comments is a
    new version with a migration from the one before (docs/upgrades.md; tests/test_storage_versions.py
    fails otherwise), and a kind change is refused. -#}
{% macro unit(name, type, version=none, object=none, shape=()) %}
{% if type == 'storage' %}
-- tablequeue:unit {{ name }} storage v{{ version }} {{ object }}
{% if queue is defined %}
-- tablequeue:shape {{ shape_of(queue, shape) }}
{% endif %}
{% else %}
-- tablequeue:unit {{ name }} {{ type }}
{% endif %}
{%- endmacro %}

{#- Functions are granted by name only: the deploy tool drops stale overloads, so the name is unique. -#}
{#- A migration step (migrations/*.sql): it runs on its own, in a transaction with a lock timeout
    (retried) or, mode concurrent (PostgreSQL), outside any transaction for CREATE/DROP INDEX
    CONCURRENTLY; it says what it does and what it locks, which the deploy plan prints. after_code:
    it runs once the deploy has replaced the code units (a removal the old procedures still need). -#}
{% macro step(mode, what, locks, after_code=false) %}
-- tablequeue:step {{ mode }}{{ ' after-code' if after_code }} {{ what }}
-- locks: {{ locks | wordwrap(100, wrapstring='\n--        ') }}
{%- endmacro %}

{% macro grant(verb, routine='FUNCTION') %}
REVOKE ALL ON {{ routine }} {{ names.verb(verb) }} FROM public;
GRANT EXECUTE ON {{ routine }} {{ names.verb(verb) }} TO {{ names.role(verb) }};
{%- endmacro %}

{#- Every function runs as its owner with a pinned search_path (DESIGN.md §5). -#}
{% macro definer() %}
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
{%- endmacro %}

{% macro throw(error, message_sql) %}
        RAISE EXCEPTION USING ERRCODE = '{{ errors[error] }}', MESSAGE = {{ message_sql }};
{%- endmacro %}

{% macro check_batch_size(verb) %}
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
{{ throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": batch_size must be between 1 and 1000, got %s.', coalesce(batch_size::text, 'NULL'))") }}
    END IF;
{%- endmacro %}

{% macro check_payload(verb) %}
    IF payload IS NULL THEN
{{ throw('invalid_payload', "'" ~ names.plain('_' ~ verb) ~ ": payload must not be NULL.'") }}
    END IF;
{%- endmacro %}

{% macro check_dedupe_key(verb) %}
    IF length(dedupe_key) > 200 THEN
{{ throw('invalid_argument', "'" ~ names.plain('_' ~ verb) ~ ": dedupe_key is longer than 200 characters.'") }}
    END IF;
{%- endmacro %}

{#- The claim position (docs/queue-kinds.md, "The claim position"): where a session's next claim
    starts in the claim index, kept between calls in a custom setting named after the queue. -#}
{% macro position_setting(suffix='') %}'tablequeue.{{ schema }}.{{ queue.name }}{{ suffix }}'{% endmacro %}

{#- A timestamptz as text and back, exact to the microsecond whatever the session's DateStyle and
    TimeZone (ISO input is read the same under every DateStyle). to_char writes -infinity as ''. -#}
{% macro time_to_text(expr) %}to_char({{ expr }} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US BC'){% endmacro %}
{% macro text_to_time(expr) %}coalesce(nullif({{ expr }}, ''), '-infinity')::timestamp AT TIME ZONE 'UTC'{% endmacro %}

{#- The claim position of a dequeue (docs/queue-kinds.md, "The claim position"). key is the claim
    index: ['id'], or [time column, tie-breaker] (pending: due_at, id; work: visible_at, id or seq).
    The including function declares now_utc (clock_timestamp() at its start) and t (the queue table). -#}
{% macro position_declare(key, seen=true) %}
{% if seen %}
    -- The first key at or after the position still visible to a one-message claim (position_seen).
{% if key | length == 2 %}
    seen_time timestamptz;
{% endif %}
    seen_id bigint;
{% endif %}
{% if key | length == 2 %}
    position_time timestamptz;
    rewinds bigint := (SELECT CASE WHEN r.is_called THEN r.last_value ELSE 0 END FROM {{ names.obj('_rewinds') }} AS r);
{% endif %}
    -- '<found again after, epoch seconds>|{% if key | length == 2 %}<rewinds>|<tie-breaker>|<time>{% else %}<id>{% endif %}' (see position_load).
    position_state text := current_setting({{ position_setting() }}, true);
    position_expires numeric;
    position_id bigint;
{%- endmacro %}

{% macro position_predicate(key) -%}
{% if key | length == 2 %}(m.{{ key[0] }}, m.{{ key[1] }}) >= (position_time, position_id){% else %}m.{{ key[0] }} >= position_id{% endif %}
{%- endmacro %}

{#- The smallest key still visible at or after the position (every row another consumer holds
    is visible and so at or after it), stored for the session's next call. A time key is kept at
    or before now: whatever is enqueued from now on with a due time of now or later lands after
    it, and an enqueue with a due time already past moves the rewinds counter. -#}
{% macro position_find(key) %}
    SELECT {% for column in key %}m.{{ column }}{{ ', ' if not loop.last }}{% endfor %}

    INTO {% if key | length == 2 %}position_time, {% endif %}position_id
    FROM {{ t }} AS m
    WHERE {{ position_predicate(key) }}
    ORDER BY {% for column in key %}m.{{ column }}{{ ', ' if not loop.last }}{% endfor %}

    LIMIT 1;
{% if key | length == 2 %}
    IF position_id IS NULL OR position_time > now_utc THEN
        position_time := now_utc;
        position_id := 0;
    END IF;
{% else %}
    IF position_id IS NULL THEN
        -- Nothing visible: whatever is enqueued from now on draws a later id.
        SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END
        INTO position_id
        FROM {{ names.obj('_id_seq') }} AS s;
    END IF;
{% endif %}
{{ position_store(key) }}
{%- endmacro %}

{% macro position_store(key) %}
{% if key | length == 2 %}
    PERFORM set_config({{ position_setting() }}, position_expires || '|' || rewinds || '|' || position_id || '|' || {{ time_to_text('position_time') }}, false);
{%- else %}
    PERFORM set_config({{ position_setting() }}, position_expires || '|' || position_id, false);
{%- endif %}
{%- endmacro %}

{#- The hot path finds its next position in the claim statement itself: a LEFT JOIN LATERAL on
    the claimed row (alias `claimed`) reads the claim index from the position, into seen_time and
    seen_id. It sees what the claim's snapshot sees: a row another consumer holds (the claim stepped
    over it) and the claimed row itself (deleted by this very statement), so it stops at the claimed
    row at the latest. Bounded on the leading column only: a row comparison stops a scan only on
    its first column. -#}
{% macro position_seen(key, claimed) %}
LEFT JOIN LATERAL (
    SELECT {% for column in key %}m.{{ column }}{{ ', ' if not loop.last }}{% endfor %}

    FROM {{ t }} AS m
    WHERE {{ position_predicate(key) }} AND m.{{ key[0] }} <= {{ claimed }}.{{ key[0] }}
    ORDER BY {% for column in key %}m.{{ column }}{{ ', ' if not loop.last }}{% endfor %}

    LIMIT 1
) AS seen ON true
{%- endmacro %}

{#- After a one-message claim of the row with tie-breaker claimed_id_sql: a row seen before it is
    held by another consumer and is the position; else the claimed key's successor is (nothing lies
    between them: the tie-breaker is an integer). -#}
{% macro position_after_claim(key, claimed_id_sql, claimed_time_sql=none) %}
    IF seen_id <> {{ claimed_id_sql }} THEN
{% if key | length == 2 %}
        position_time := seen_time;
{% endif %}
        position_id := seen_id;
    ELSE
{% if key | length == 2 %}
        position_time := {{ claimed_time_sql }};
{% endif %}
        position_id := {{ claimed_id_sql }} + 1;
    END IF;
{{ position_store(key) }}
{%- endmacro %}

{#- Take the session's position if it is younger than a second (and, for a time key, no rewind
    happened since), else find it from the head of the index. -#}
{% macro position_load(key) %}
    IF position_state <> '' THEN
        position_expires := split_part(position_state, '|', 1)::numeric;
{% if key | length == 2 %}
        IF position_expires > extract(EPOCH FROM now_utc) AND split_part(position_state, '|', 2)::bigint = rewinds THEN
            position_id := split_part(position_state, '|', 3)::bigint;
            position_time := {{ text_to_time("split_part(position_state, '|', 4)") }};
        END IF;
{% else %}
        IF position_expires > extract(EPOCH FROM now_utc) THEN
            position_id := split_part(position_state, '|', 2)::bigint;
        END IF;
{% endif %}
    END IF;
    IF position_id IS NULL THEN
        position_expires := extract(EPOCH FROM now_utc) + 1;
        position_id := 0;
{% if key | length == 2 %}
        position_time := '-infinity';
{% endif %}
{{ position_find(key) | indent(4, first=true) }}
    END IF;
{%- endmacro %}

{#- The rewinds counter of a queue with a time key: an enqueue with a due time already past sorts
    before the positions consumers keep, so it moves the counter and they find theirs again from the
    head. A sequence, because moving it is not transactional, never waits and leaves no dead rows. -#}
{% macro rewinds_unit() %}
{{ unit(names.plain('_rewinds'), 'storage', version=1, object='sequence') }}
-- Moved by every enqueue whose due time has already passed (docs/queue-kinds.md, The claim position).
CREATE SEQUENCE IF NOT EXISTS {{ names.obj('_rewinds') }};
{%- endmacro %}

{% macro rewind_when(condition_sql) %}
    IF {{ condition_sql }} THEN
        -- Already due: it sorts before the consumers' claim positions, which must start again.
        PERFORM nextval('{{ names.obj("_rewinds") }}');
    END IF;
{%- endmacro %}
