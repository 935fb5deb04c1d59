{#-
  Message groups (option groups, fifo and work; docs/queue-kinds.md, "Message groups"): the PL/pgSQL
  fragments that producers and consumers share. Imported "with context" by work.sql and
  _destructive.sql, which set t (the queue table) and, for work, tie.
  The groups row S.Q_groups(group_key) is the group's lock. Whoever holds it (FOR NO KEY UPDATE) may
  change which message of the group is its head and makes the group's flags exact; a producer that
  cannot take it at once flags its message as a head candidate and pins the row (FOR KEY SHARE), so
  that it never waits for a consumer. Fixed lock order everywhere: groups rows (in key order), then
  message rows.
-#}
{% import '_macros.sql' as m with context %}
{% set groups_t = names.obj('_groups') %}
{% set is_work = queue.kind == 'work' %}
{% set group_tie = tie if is_work else 'id' %}
{% set group_id_type = id_type if is_work else 'bigint' %}

{#- Both dialects' limit on a key, and the batch form's per-item check. -#}
{% macro check_group_key(verb, key_sql) %}
    IF length({{ key_sql }}) > 200 THEN
{{ m.throw('invalid_argument', "'" ~ names.plain('_' ~ verb) ~ ": group_key is longer than 200 characters.'") }}
    END IF;
{%- endmacro %}

{% macro check_group_keys(verb, keys_sql, count_sql) %}
    IF {{ keys_sql }} IS NOT NULL AND cardinality({{ keys_sql }}) <> {{ count_sql }} THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": group_keys has %s elements but payloads has %s.', cardinality(" ~ keys_sql ~ "), " ~ count_sql ~ ")") }}
    END IF;
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest({{ keys_sql }}) WITH ORDINALITY AS u (group_key, ordinal)
    WHERE length(u.group_key) > 200;
    IF bad_ordinal IS NOT NULL THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": item %s has a group_key over 200 characters.', bad_ordinal)") }}
    END IF;
{%- endmacro %}

{#- A producer joins group key_sql (not NULL) and learns whether its message is a head candidate
    (head_var). It never waits for a consumer: only for another producer's uncommitted first insert
    of the same new key, or for a purge deleting the group's row (then it inserts the row again).
    The row is inserted only when a read finds none: an insert that meets a row a holder has updated
    (work: in_flight) would wait for the holder's transaction to end. held_var (optional): set to
    whether this transaction now holds the group (and may settle it). -#}
{% macro join_group(key_sql, head_var, held_var=none) %}
    LOOP
        PERFORM FROM {{ groups_t }} AS g WHERE g.group_key = {{ key_sql }} FOR NO KEY UPDATE SKIP LOCKED;
{% if held_var %}
        {{ held_var }} := FOUND;
{% endif %}
        IF FOUND THEN
            -- Nobody else holds the group until this transaction ends, so its head stays; this new
            -- statement sees every message committed before the lock. The message leads only an
            -- empty group.
            {{ head_var }} := NOT EXISTS (SELECT FROM {{ t }} AS m WHERE m.group_key = {{ key_sql }});
            EXIT;
        END IF;
        -- Held by a consumer (or another producer), or missing. Held: the message is a head
        -- candidate, maybe a spurious one that the group's next holder demotes. The pin keeps purge
        -- from deleting the row while the message is uncommitted (a message whose groups row is
        -- gone is never claimed); it conflicts with nothing a consumer takes.
        PERFORM FROM {{ groups_t }} AS g WHERE g.group_key = {{ key_sql }} FOR KEY SHARE;
        IF FOUND THEN
            {{ head_var }} := true;
            EXIT;
        END IF;
        INSERT INTO {{ groups_t }} AS g (group_key) VALUES ({{ key_sql }}) ON CONFLICT DO NOTHING;
    END LOOP;
{%- endmacro %}

{#- enqueue's: its group_key checked and, given, joined (is_head). -#}
{% macro enqueue_join() %}
{{ check_group_key('enqueue', fn ~ '_enqueue.group_key') }}
    IF {{ fn }}_enqueue.group_key IS NOT NULL THEN
{{ join_group(fn ~ '_enqueue.group_key', 'is_head') | indent(4, first=true) }}
    END IF;
{%- endmacro %}

{#- The variables join_groups uses. -#}
{% macro join_groups_declare() %}
    item_heads boolean[];
    batch_keys text[];
    got_keys text[];
    pinned_keys text[];
    empty_keys text[];
{%- endmacro %}

{#- The batch form: every distinct key of keys_sql joined in one statement per round, in key order.
    Sets heads_var (one per item, NULL for an item without a key): the first item of a group that
    was empty, or held by someone else, is a candidate; every other item waits (a candidate per item
    would cost every claim a skipped row each while the group is held). With dedupe or client ids
    that first item may not be inserted: flag_first_inserted then flags the group's first one that
    was. Expects batch_keys, got_keys, pinned_keys, empty_keys (text[]). -#}
{% macro join_groups(keys_sql, heads_var) %}
    batch_keys := ARRAY(SELECT DISTINCT u.group_key FROM unnest({{ keys_sql }}) AS u (group_key) WHERE u.group_key IS NOT NULL ORDER BY 1);
    got_keys := '{}';
    pinned_keys := '{}';
    LOOP
        got_keys := got_keys || ARRAY(
            SELECT g.group_key FROM {{ groups_t }} AS g
            WHERE g.group_key = ANY(batch_keys) AND NOT g.group_key = ANY(got_keys || pinned_keys)
            ORDER BY g.group_key
            FOR NO KEY UPDATE SKIP LOCKED
        );
        pinned_keys := pinned_keys || ARRAY(
            SELECT g.group_key FROM {{ groups_t }} AS g
            WHERE g.group_key = ANY(batch_keys) AND NOT g.group_key = ANY(got_keys || pinned_keys)
            ORDER BY g.group_key
            FOR KEY SHARE
        );
        EXIT WHEN cardinality(got_keys) + cardinality(pinned_keys) = cardinality(batch_keys);
        -- The keys without a row (as join_group: inserted only when none was found), in key order.
        INSERT INTO {{ groups_t }} AS g (group_key)
        SELECT u.group_key FROM unnest(batch_keys) AS u (group_key)
        WHERE NOT u.group_key = ANY(got_keys || pinned_keys)
        ORDER BY u.group_key
        ON CONFLICT DO NOTHING;
    END LOOP;
    empty_keys := ARRAY(
        SELECT k.group_key FROM unnest(got_keys) AS k (group_key)
        WHERE NOT EXISTS (SELECT FROM {{ t }} AS m WHERE m.group_key = k.group_key)
    );
    {{ heads_var }} := ARRAY(
        SELECT CASE
            WHEN u.group_key IS NULL THEN NULL
            ELSE u.group_key = ANY(pinned_keys || empty_keys)
                AND u.ordinal = min(u.ordinal) OVER (PARTITION BY u.group_key)
        END
        FROM unnest({{ keys_sql }}) WITH ORDINALITY AS u (group_key, ordinal)
        ORDER BY u.ordinal
    );
{%- endmacro %}

{#- After a batch's insert that may have skipped items (dedupe, client ids): in each group that
    needed a candidate, the first row the batch inserted is one (a no-op when the first item went
    in). inserted_sql: a query of (id, tie, group_key) of the rows the batch inserted. -#}
{% macro flag_first_inserted(inserted_sql) %}
    IF cardinality(pinned_keys || empty_keys) > 0 THEN
        UPDATE {{ t }} AS m
        SET group_head = true
        FROM (
            SELECT DISTINCT ON (i.group_key) i.id
            FROM ({{ inserted_sql }}) AS i (id, tie, group_key)
            WHERE i.group_key = ANY(pinned_keys || empty_keys)
            ORDER BY i.group_key, i.tie
        ) AS f
        WHERE m.id = f.id AND NOT m.group_head;
    END IF;
{%- endmacro %}

{#- Lock, waiting, the groups of the messages ids_sql addresses (in key order), into keys_var: the
    acknowledgements change a group's head, and take its row before any message row. A message's
    key never changes, so it is read without a lock. Then now_utc again: the wait can be long, and a
    lease judged by the time before it may have run out meanwhile (lease_status, which waits only for
    a message row, would have answered lost for a lease completed after). -#}
{% macro lock_groups_of(ids_sql, keys_var) %}
    {{ keys_var }} := ARRAY(
        SELECT g.group_key FROM {{ groups_t }} AS g
        WHERE g.group_key IN (SELECT m.group_key FROM {{ t }} AS m WHERE m.id = ANY({{ ids_sql }}))
        ORDER BY g.group_key
        FOR NO KEY UPDATE
    );
    now_utc := clock_timestamp();
{%- endmacro %}

{#- The heads of the groups keys_sql, into head_ids: work: a group's in-flight message while it has
    one; else its oldest message (two probes on ix_<q>_group: the waiting ones and the flagged ones). -#}
{% macro find_heads(keys_sql) %}
    head_ids := array_remove(ARRAY(
        SELECT {% if is_work %}coalesce(g.in_flight, {% endif %}(
            SELECT f.id FROM (
                (
                    SELECT m.id, m.{{ group_tie }} AS tie FROM {{ t }} AS m
                    WHERE m.group_key = g.group_key AND NOT m.group_head
                    ORDER BY m.{{ group_tie }}
                    LIMIT 1
                )
                UNION ALL
                (
                    SELECT m.id, m.{{ group_tie }} AS tie FROM {{ t }} AS m
                    WHERE m.group_key = g.group_key AND m.group_head
                    ORDER BY m.{{ group_tie }}
                    LIMIT 1
                )
            ) AS f
            ORDER BY f.tie
            LIMIT 1
        ){% if is_work %}){% endif %}

        FROM {{ groups_t }} AS g
        WHERE g.group_key = ANY({{ keys_sql }})
    ), NULL);
{%- endmacro %}

{#- A holder of the groups keys_sql makes their flags exact: each group's head (find_heads) is
    flagged, every other candidate it sees is demoted. Sets head_ids to the heads. -#}
{% macro settle(keys_sql) %}
{% if is_work %}
    -- An in-flight message that is gone (completed, dead, purged) no longer holds its group back.
    UPDATE {{ groups_t }} AS g
    SET in_flight = NULL
    WHERE
        g.group_key = ANY({{ keys_sql }}) AND g.in_flight IS NOT NULL
        AND NOT EXISTS (SELECT FROM {{ t }} AS m WHERE m.id = g.in_flight);
{% endif %}
{{ find_heads(keys_sql) }}
    -- Only in a group whose head this statement still sees: where find_heads saw none (the group is
    -- empty), a message a producer that could not take the group flagged a candidate and committed
    -- since is not demoted; it leads a claim to the group, whose holder settles it.
    UPDATE {{ t }} AS m
    SET group_head = false
    WHERE
        m.group_key = ANY({{ keys_sql }}) AND m.group_head AND NOT m.id = ANY(head_ids)
        AND EXISTS (SELECT FROM {{ t }} AS h WHERE h.id = ANY(head_ids) AND h.group_key = m.group_key);
    UPDATE {{ t }} AS m
    SET group_head = true
    WHERE m.id = ANY(head_ids) AND NOT m.group_head;
{%- endmacro %}

{#- The claim's first statement: from the start of ix_<q>_heads, lock up to limit_sql groups whose
    candidate is there (work: due), stepping over the groups someone holds, into keys_var. It locks
    only groups rows: the candidate just led here, the group's real head is settled next. -#}
{% macro discover_groups(limit_sql, keys_var, skip_var=none) %}
    {{ keys_var }} := ARRAY(
        SELECT DISTINCT d.group_key FROM (
            SELECT g.group_key
            FROM {{ t }} AS m
            INNER JOIN {{ groups_t }} AS g ON m.group_key = g.group_key
            WHERE m.group_head{% if is_work %} AND m.visible_at <= now_utc{% endif %}{% if skip_var %} AND NOT m.group_key = ANY({{ skip_var }}){% endif %}

            ORDER BY {% if is_work %}m.visible_at, m.{{ tie }}{% else %}m.id{% endif %}

            LIMIT {{ limit_sql }}
            FOR NO KEY UPDATE OF g SKIP LOCKED
        ) AS d
    );
{%- endmacro %}

{#- One round of a dequeue's grouped claim, inside its WHILE remaining > 0 loop: discover (a literal
    LIMIT 1 for one message: the generic plan of a variable limit is a sort) up to `remaining` groups
    this call has not been to, into locked_keys; leave the loop when there is none. -#}
{% macro discover_round() %}
        IF remaining = 1 THEN
{{ discover_groups('1', 'locked_keys', 'visited_keys') | indent(8, first=true) }}
        ELSE
{{ discover_groups('remaining', 'locked_keys', 'visited_keys') | indent(8, first=true) }}
        END IF;
        EXIT WHEN cardinality(locked_keys) = 0;
        visited_keys := visited_keys || locked_keys;
{%- endmacro %}

{#- purge's grouped body: messages go only with their group held (SKIP LOCKED: the messages of a
    group a consumer or producer holds stay for the next purge), groups rows first; each holder
    then settles its groups, and empty groups' rows go (delete_empty_groups). In rounds, oldest first
    (order_sql): a round that stepped over held groups leaves their messages out of the next one,
    so purge(max_rows) still purges up to max_rows messages of the other groups. Nothing here waits:
    groups rows and message rows are taken with SKIP LOCKED. -#}
{% macro purge_declare() %}
    candidate_ids {{ group_id_type }}[];
    held_keys text[] := '{}';
    skipped_keys text[] := '{}';
    round_keys text[];
    got_keys text[];
    round_count bigint;
    head_ids {{ group_id_type }}[];
    empty_keys text[];
{%- endmacro %}

{% macro purge_rounds(order_sql) %}
    purged_count := 0;
    LOOP
        candidate_ids := ARRAY(
            SELECT m.id FROM {{ t }} AS m
            WHERE
                ({{ fn }}_purge.older_than IS NULL OR m.enqueued_at < {{ fn }}_purge.older_than)
                AND (m.group_key IS NULL OR NOT m.group_key = ANY(skipped_keys))
            ORDER BY {{ order_sql }}
            LIMIT {{ fn }}_purge.max_rows - purged_count
        );
        EXIT WHEN cardinality(candidate_ids) = 0;
        round_keys := ARRAY(
            SELECT DISTINCT m.group_key FROM {{ t }} AS m
            WHERE m.id = ANY(candidate_ids) AND NOT m.group_key = ANY(held_keys)
        );
        got_keys := ARRAY(
            SELECT g.group_key FROM {{ groups_t }} AS g
            WHERE g.group_key = ANY(round_keys)
            ORDER BY g.group_key
            FOR NO KEY UPDATE SKIP LOCKED
        );
        held_keys := held_keys || got_keys;
        skipped_keys := skipped_keys || ARRAY(SELECT r.key FROM unnest(round_keys) AS r (key) WHERE NOT r.key = ANY(got_keys));
        WITH doomed AS (
            SELECT m.id FROM {{ t }} AS m
            WHERE m.id = ANY(candidate_ids) AND (m.group_key IS NULL OR m.group_key = ANY(held_keys))
            ORDER BY {{ order_sql }}
            FOR UPDATE SKIP LOCKED
        ),

        deleted AS (
            DELETE FROM {{ t }} AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
        )

        SELECT count(*) INTO round_count FROM deleted;
        purged_count := purged_count + round_count;
        -- Again only while max_rows is not reached and this round stepped over a held group.
        EXIT WHEN
            {{ fn }}_purge.max_rows IS NULL OR purged_count >= {{ fn }}_purge.max_rows
            OR cardinality(got_keys) = cardinality(round_keys);
    END LOOP;
{{ settle('held_keys') }}
{{ delete_empty_groups() }}
{%- endmacro %}

{% macro delete_empty_groups() %}
    empty_keys := ARRAY(
        SELECT g.group_key FROM {{ groups_t }} AS g
        WHERE NOT EXISTS (SELECT FROM {{ t }} AS m WHERE m.group_key = g.group_key)
        ORDER BY g.group_key
        FOR UPDATE SKIP LOCKED
    );
    DELETE FROM {{ groups_t }} AS g
    WHERE g.group_key = ANY(empty_keys) AND NOT EXISTS (SELECT FROM {{ t }} AS m WHERE m.group_key = g.group_key);
{%- endmacro %}
