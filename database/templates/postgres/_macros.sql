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

{#- A migration step (migrations/*.sql): it runs on its own, in a transaction with a lock timeout
    (retried) or, mode concurrent (PostgreSQL), outside any transaction for CREATE/DROP INDEX
    CONCURRENTLY; it says what it does and what it locks, which the deploy plan prints. after_code:
    it runs once the deploy has replaced the code units (a removal the old procedures still need). -#}
{% macro step(mode, what, locks, after_code=false) %}
-- tablequeue:step {{ mode }}{{ ' after-code' if after_code }} {{ what }}
-- locks: {{ locks | wordwrap(100, wrapstring='\n--        ') }}
{%- endmacro %}

{#- A migration's length check of a text column (at most 200 characters), added NOT VALID so that the
    step holding the table's exclusive lock scans nothing; a step of its own validates it. -#}
{% macro add_length_check_not_valid(column) %}
DO $check$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_constraint AS k
        WHERE k.conrelid = '{{ names.obj() }}'::regclass AND k.conname = '{{ names.index_name('ck', column) }}'
    ) THEN
        ALTER TABLE {{ names.obj() }}
        ADD CONSTRAINT {{ names.index('ck', column) }} CHECK (length({{ column }}) <= 200) NOT VALID;
    END IF;
END
$check$;
{%- endmacro %}

{#- Functions are granted by name only: the deploy tool drops stale overloads, so the name is unique.
    The schema's owner role owns every routine, so a SECURITY DEFINER function runs with its rights,
    not with the rights of whoever deployed it. -#}
{% macro grant(verb, routine='FUNCTION') %}
ALTER {{ routine }} {{ names.verb(verb) }} OWNER TO {{ names.quote(schema ~ '_owner') }};
REVOKE ALL ON {{ routine }} {{ names.verb(verb) }} FROM public;
GRANT EXECUTE ON {{ routine }} {{ names.verb(verb) }} TO {{ names.role(verb) }};
{%- endmacro %}

{#- A queue's tables, sequences and types belong to the schema's owner role (see grant). A code unit,
    so that queues deployed before the owner role existed are handed over too; ALTER ... OWNER takes
    an ACCESS EXCLUSIVE lock for an instant, so it runs only where the owner differs, and a lock it
    cannot get at once within the deploy's lock_timeout fails the deploy rather than stall traffic.
    suffixes: the queue's own relations ('' is the queue table). Identity sequences follow their
    table; indexes too. -#}
{% macro ownership_unit(suffixes) %}
{{ unit(names.plain('_ownership'), 'code') }}
DO $ownership$
DECLARE
    relation record;
BEGIN
    FOR relation IN
        SELECT
            c.relkind,
            pg_catalog.format('%I.%I', n.nspname, c.relname) AS name
        FROM pg_catalog.pg_class AS c
        INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace = n.oid
        WHERE
            n.nspname = '{{ schema }}'
            AND c.relname IN ({% for suffix in suffixes %}'{{ queue.name }}{{ suffix }}'{{ ', ' if not loop.last }}{% endfor %})
            AND c.relkind IN ('r', 'p', 'S', 'c')
            AND c.relowner <> (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = '{{ schema }}_owner')
            AND (c.relkind <> 'S' OR NOT EXISTS (
                SELECT FROM pg_catalog.pg_depend AS d
                WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')
            ))
    LOOP
        EXECUTE pg_catalog.format(
            'ALTER %s %s OWNER TO %I',
            CASE relation.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'c' THEN 'TYPE' ELSE 'TABLE' END,
            relation.name,
            '{{ schema }}_owner'
        );
    END LOOP;
END
$ownership$;
{%- endmacro %}

{#- Every function runs as its owner with a pinned search_path (DESIGN.md §5), and with generic plans:
    a statement whose cost depends on a parameter's value (an array's length, a LIMIT) otherwise gets a
    custom plan, costed with the real value, that always beats the cached generic one, so it was planned
    again on every call (a third to half of a call's server time for dequeue, enqueue_batch and
    complete_batch). Every claim is written to seek under a generic plan (tests/test_plans_at_depth.py).
    plans='custom' for the purges, admin calls made now and then: a generic plan cached while the
    queue was empty read the whole table at depth (its LIMIT max_rows and id = ANY(...) are costed for
    unknown values), and planning each call is cheap next to what a purge deletes
    (tests/test_purge_plans.py). -#}
{#- The functions' settings. enable_seqscan off: every statement of a verb reads its table along an
    index, and a plan cached while the table had no pages at all (a drained queue that VACUUM cut to
    nothing, reltuples 0) costed a sequential scan at nothing and kept it once the queue filled again
    (the senior-PostgreSQL review of storage v3's read-back: 1,670 of 520 pages for a batch of 10;
    tests/test_plans_at_depth.py). Off, a scan with no index to use is still planned; about 2,000
    server instructions a call. -#}
{% macro definer(plans='generic', index_order=false) %}
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_{{ plans }}_plan
SET enable_seqscan = off
{%- if index_order %}

SET enable_bitmapscan = off
{%- endif %}
{%- endmacro %}

{#- A row lock taken only to wait for its holders: `statement` runs in a subtransaction rolled back
    at once (SQLSTATE TQ900, raised nowhere else), so no lock it takes outlives it. -#}
{% macro locked_a_moment(statement) %}
    BEGIN
        {{ statement | indent(8) }}
        RAISE SQLSTATE 'TQ900';
    EXCEPTION WHEN SQLSTATE 'TQ900' THEN
        NULL;
    END;
{%- endmacro %}

{#- Option notify: wake the clients that LISTEN on the queue's channel (the quoted identifier
    "S.Q") once this transaction commits. PostgreSQL folds repeats within a transaction into one. -#}
{% macro notify() %}
    PERFORM pg_notify('{{ schema }}.{{ queue.name }}', '');
{%- endmacro %}

{% macro throw(error, message_sql) %}
        RAISE EXCEPTION USING ERRCODE = '{{ errors[error] }}', MESSAGE = {{ message_sql }};
{%- endmacro %}

{% macro check_batch_size(verb) %}
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
{{ throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": batch_size must be between 1 and 1000, got %s.', coalesce(batch_size::text, 'NULL'))") }}
    END IF;
{%- endmacro %}

{#- max_rows bounds one purge call (NULL: everything matching, in one statement); a caller that
    purges a deep queue loops until a call purges fewer than max_rows, committing in between. The
    contract of both dialects: inside a caller's transaction max_rows is required, since every
    purged row would stay locked until that transaction ends (SQL Server's chunks cannot commit
    there either). PL/pgSQL sees a caller's transaction once it has written something (as process
    does): a transaction block that has written nothing yet cannot be told from autocommit. -#}
{% macro check_max_rows(verb) %}
    IF {{ fn }}_{{ verb }}.max_rows < 1 THEN
{{ throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": max_rows must be at least 1, got %s.', " ~ fn ~ "_" ~ verb ~ ".max_rows)") }}
    END IF;
    IF {{ fn }}_{{ verb }}.max_rows IS NULL AND pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
{{ throw('invalid_argument', "'" ~ names.plain('_' ~ verb) ~ ": max_rows is required in a transaction.'") }}
    END IF;
{%- endmacro %}

{#- Batches of every verb are capped at 1,000 items (the SQL Server twin's lock-escalation bound). -#}
{% macro check_batch_items(verb, count_sql) %}
    IF {{ count_sql }} > 1000 THEN
{{ throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": at most 1000 items per call, got %s.', " ~ count_sql ~ ")") }}
    END IF;
{%- endmacro %}

{#- A claim is written for READ COMMITTED: each statement sees what committed before it, SKIP LOCKED
    steps over what others hold, and the claim position is found in the claim's own snapshot. Under
    REPEATABLE READ or SERIALIZABLE the snapshot is the transaction's first: a claim would fail with
    40001 on a row changed since, and a position found there could pass ids committed since and hide
    them from the session's later dequeues. A function cannot change the level, so it refuses. -#}
{% macro check_read_committed(verb) %}
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
{{ throw('isolation_level', "format('" ~ names.plain('_' ~ verb) ~ ": runs only at READ COMMITTED, and this transaction is %s.', upper(current_setting('transaction_isolation')))") }}
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

{#- A one-row answer: the OUT columns assigned, then RETURN NEXT (simple expressions, evaluated
    without starting the executor, where RETURN QUERY SELECT starts it for the one row); a function
    returning SETOF row_type has no OUT columns and returns the row itself. pairs: (column, value). -#}
{% macro answer(pairs, row_type=none) %}
{% if row_type %}
    RETURN NEXT ROW({% for column, value in pairs %}{{ value }}{{ ', ' if not loop.last }}{% endfor %})::{{ row_type }};
{%- else %}
{% for column, value in pairs %}
    {{ column }} := {{ value }};
{% endfor %}
    RETURN NEXT;
{%- endif %}
{%- endmacro %}

{#- work: the predicate of ix_<q>_ready, the claim index of the messages nobody leases (with groups:
    of those without a group), over alias `alias` (none: bare columns, for the CREATE INDEX). -#}
{% macro ready_predicate(grouped, alias=none) -%}
{%- set p = (alias ~ '.') if alias else '' -%}
{{ p }}leased_by IS NULL{% if grouped %} AND {{ p }}group_key IS NULL{% endif %}
{%- endmacro %}

{#- The claim position (docs/queue-kinds.md, "The claim position"): where a session's next claim
    starts in the claim index, kept between calls in a custom setting named after the queue. -#}
{% macro position_setting(suffix='') %}'tablequeue.{{ schema }}.{{ queue.name }}{{ suffix }}'{% endmacro %}

{#- What time_to_text writes: epoch microseconds, or '' for -infinity. Read back only when at most 17
    characters long (a time between 1653 and 5138; one outside is written but not read back, and the
    position is found again), so reading back never overflows whatever a session sets: the settings
    are the session's to change. -#}
{% macro time_pattern() %}(-?[0-9]+)?{% endmacro %}

{#- What position_store writes: '<expiry>|<id>' or '<expiry>|<rewinds>|<tie-breaker>|<time>'. The
    pattern has no bounded repeats ({1,18}: PostgreSQL's regular expressions take some 12 us to match
    one, 2.5 without, a tenth of a claim's cost); position_valid bounds the lengths instead. -#}
{% macro position_pattern(key) -%}
^[0-9]+(\.[0-9]+)?\|{% if key | length == 2 %}[0-9]+\|[0-9]+\|{{ time_pattern() }}{% else %}[0-9]+{% endif %}$
{%- endmacro %}

{#- True when position_state is what position_store writes and its integers fit a bigint (at most
    18 digits), its time the timestamptz arithmetic (at most 17 characters) and its expiry a numeric
    (at most 22 characters: a numeric of 131,072 digits overflows). -#}
{% macro position_valid(key) -%}
position_state ~ '{{ position_pattern(key) }}' AND length(split_part(position_state, '|', 1)) <= 22
{%- if key | length == 2 %} AND length(split_part(position_state, '|', 2)) <= 18 AND length(split_part(position_state, '|', 3)) <= 18
        AND length(split_part(position_state, '|', 4)) <= 17
{%- else %} AND length(split_part(position_state, '|', 2)) <= 18{% endif %}
{%- endmacro %}

{#- A timestamptz as text and back, whatever the session's DateStyle and TimeZone: an integer, which
    no date arithmetic can reject. Exact to the microsecond while the product fits a double's 53 bits
    (1685 to 2255), which every time a position or a lease holds does. -#}
{% macro time_to_text(expr) %}CASE WHEN isfinite({{ expr }}) THEN (extract(EPOCH FROM {{ expr }}) * 1000000)::bigint::text ELSE '' END{% endmacro %}
{% macro text_to_time(expr) %}coalesce('epoch'::timestamptz + nullif({{ expr }}, '')::bigint * interval '1 microsecond', '-infinity'){% endmacro %}

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
    -- A function call, not a query of the sequence: no executor start-up on every call.
    rewinds bigint := coalesce(pg_sequence_last_value('{{ names.obj('_rewinds') }}'::regclass), 0);
{% endif %}
    -- '<found again after, epoch seconds>|{% if key | length == 2 %}<rewinds>|<tie-breaker>|<time>{% else %}<id>{% endif %}' (see position_load).
    position_state text := current_setting({{ position_setting() }}, true);
    position_expires numeric;
    position_id bigint;
{%- endmacro %}

{#- work: the position lies in ix_<q>_ready (no position with groups or priority), whose predicate it
    carries, so that every scan from it can use the partial index. -#}
{% macro position_predicate(key) -%}
{% if queue.kind == 'work' %}{{ ready_predicate(false, 'm') }} AND {% endif %}{% if key | length == 2 %}(m.{{ key[0] }}, m.{{ key[1] }}) >= (position_time, position_id){% else %}m.{{ key[0] }} >= position_id{% endif %}
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

{#- An assignment, not PERFORM: PL/pgSQL evaluates it as a simple expression, without starting the
    executor for a query (PERFORM runs one). -#}
{% macro position_store(key) %}
{% if key | length == 2 %}
    position_state := set_config({{ position_setting() }}, position_expires || '|' || rewinds || '|' || position_id || '|' || {{ time_to_text('position_time') }}, false);
{%- else %}
    position_state := set_config({{ position_setting() }}, position_expires || '|' || position_id, false);
{%- endif %}
{%- endmacro %}

{#- The hot path finds its next position in the claim statement itself: a LEFT JOIN LATERAL on
    the claimed row (alias `claimed`) reads the claim index from the position, into seen_time and
    seen_id. It sees what the claim's snapshot sees: a row another consumer holds (the claim stepped
    over it) and the claimed row itself (deleted or leased by this very statement), so it stops at
    the claimed row at the latest; except under EvalPlanQual, where the claim returns the row's
    latest version, whose key the snapshot may not see (position_after_claim). Bounded on the
    leading column only: a row comparison stops a scan only on its first column. -#}
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
        -- The claimed key as the claim's snapshot saw it (seen_time): under EvalPlanQual (a fail or
        -- release committed between the claim's snapshot and its row lock) the claim returns the row's
        -- latest version, whose key may lie later, past rows the snapshot sees before it. NULL when
        -- that version lay outside the lateral's bound: then nothing lay between.
        position_time := coalesce(seen_time, {{ claimed_time_sql }});
{% endif %}
        position_id := {{ claimed_id_sql }} + 1;
    END IF;
{{ position_store(key) }}
{%- endmacro %}

{#- Take the session's position if it is younger than a second (and, for a time key, no rewind
    happened since), else find it from the head of the index. The setting is the session's to
    change: an expiry more than a second ahead (set by hand, or by a clock that went back) is not
    trusted, so no value can hide messages for longer than a second. -#}
{% macro position_load(key) %}
    -- A value this function did not write (set by hand: any text) is ignored, not cast into an error.
    IF NOT ({{ position_valid(key) }}) THEN
        position_state := '';
    END IF;
    IF position_state <> '' THEN
        position_expires := split_part(position_state, '|', 1)::numeric;
        IF position_expires <= extract(EPOCH FROM now_utc) OR position_expires > extract(EPOCH FROM now_utc) + 1 THEN
            position_state := '';
        END IF;
    END IF;
    IF position_state <> '' THEN
{% if key | length == 2 %}
        IF split_part(position_state, '|', 2)::bigint = rewinds THEN
            position_id := split_part(position_state, '|', 3)::bigint;
            position_time := {{ text_to_time("split_part(position_state, '|', 4)") }};
        END IF;
{% else %}
        position_id := split_part(position_state, '|', 2)::bigint;
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

{#- due_sql: the due time of the one message, or of `u` in items_sql (a FROM clause over the batch).
    A due time up to a second in the past does not rewind: a position lives at most a second, so such
    a message waits at most that long, and an ordinary `due_at => now()` (the transaction's start,
    always a little earlier than the clock) does not send every consumer back to the head. -#}
{% macro rewind_when(due_sql, now_sql, items_sql=none) %}
{% set late = due_sql ~ " < " ~ now_sql ~ " - interval '1 second'" %}
    IF {{ ("EXISTS (SELECT FROM " ~ items_sql ~ " WHERE " ~ late ~ ")") if items_sql else late }} THEN
        -- Due over a second ago: it sorts before the consumers' claim positions, which must start again.
        PERFORM nextval('{{ names.obj("_rewinds") }}');
    END IF;
{%- endmacro %}

{#- A batch's insert of keys (dedupe keys, client ids), in key order, with its look-ups (the caller's
    block): when it leaves a first unresolved (unresolved_sql, a query, finds a row), the duplicate it
    waited for committed and was consumed before the look-up, and the key must be offered again.
    Offering it while this batch holds higher keys could wait on a batch that waits on one of them
    (a deadlock), so the block is a subtransaction: it is rolled back, which lets go of every key the
    batch took and wakes whoever waits on them, and the whole batch goes in again in key order. The
    private SQLSTATE never leaves the function (docs/errors.md). -#}
{% set redo_sqlstate = 'TQ900' %}
{% macro insert_in_key_order(unresolved_sql) %}
    LOOP
        BEGIN
{{ caller() | indent(8, first=true) }}
            IF EXISTS ({{ unresolved_sql }}) THEN
                RAISE EXCEPTION USING ERRCODE = '{{ redo_sqlstate }}', MESSAGE = 'a key to offer again: the batch goes in again';
            END IF;
            EXIT;
        EXCEPTION WHEN SQLSTATE '{{ redo_sqlstate }}' THEN
            -- Rolled back: no key of this batch is held any more; the next round starts from the lowest.
            NULL;
        END;
    END LOOP;
{%- endmacro %}
