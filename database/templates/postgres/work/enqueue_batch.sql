{#- PostgreSQL: S.Q_enqueue_batch of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_enqueue_batch'), 'code') }}
-- PostgreSQL has no table-valued parameters: items arrive as parallel arrays, position = ordinal.
-- The arrays an option does not use must be NULL (the same contract as the SQL Server TVP).
CREATE OR REPLACE FUNCTION {{ names.verb('enqueue_batch') }}(
    payloads {{ payload_type }}[],
    due_ats timestamptz[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL,
    priorities integer[] DEFAULT NULL,
    ids uuid[] DEFAULT NULL,
    enqueued_ats timestamptz[] DEFAULT NULL{% if groups %},
    group_keys text[] DEFAULT NULL{% endif %}

)
RETURNS TABLE (ordinal integer, id {{ id_type }}, duplicate boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    item_count integer := coalesce(cardinality(payloads), 0);
    now_utc timestamptz := clock_timestamp();
    bad_ordinal integer;
{% if groups %}
{{ grp.join_groups_declare() }}
{% endif %}
{% if dedupe or client_ids %}
    new_ids {{ id_type }}[];
{% if client_ids %}
    -- seq (the claim order's tie-breaker) drawn in item order too: rows go in in key order.
    new_seqs bigint[];
{% endif %}
    inserted_ties bigint[];
    result_ids {{ id_type }}[];
    roots integer[];
{% if client_ids %}
    chased integer[];
{% endif %}
    queued_positions bigint[];
    queued_ids {{ id_type }}[];
{% endif %}
BEGIN
{{ m.check_batch_items('enqueue_batch', 'item_count') }}
{% if groups %}
{{ m.check_read_committed('enqueue_batch') }}
{% endif %}
{% for array in ('due_ats', 'dedupe_keys', 'priorities', 'ids', 'enqueued_ats') %}
    IF {{ array }} IS NOT NULL AND cardinality({{ array }}) <> item_count THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_enqueue_batch') ~ ": " ~ array ~ " has %s elements but payloads has %s.', cardinality(" ~ array ~ "), item_count)") }}
    END IF;
{% endfor %}
{% for array, enabled, option in (('priorities', has_priority, 'priority'), ('ids', client_ids, 'client_ids'), ('enqueued_ats', client_ids, 'client_ids')) %}
{% if not enabled %}
    IF {{ array }} IS NOT NULL THEN
        IF EXISTS (SELECT FROM unnest({{ array }}) AS u (v) WHERE u.v IS NOT NULL) THEN
    {{ m.throw('invalid_argument', "'" ~ names.plain('_enqueue_batch') ~ ": " ~ array ~ " needs option " ~ option ~ ".'") }}
        END IF;
    END IF;
{% endif %}
{% endfor %}
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest(payloads) WITH ORDINALITY AS u (payload, ordinal)
    WHERE u.payload IS NULL{% if is_json %} OR jsonb_typeof(u.payload) NOT IN ('object', 'array'){% endif %};
    IF bad_ordinal IS NOT NULL THEN
{{ m.throw('invalid_payload', "format('" ~ names.plain('_enqueue_batch') ~ ": item %s has a NULL" ~ (" or non-object/array JSON" if is_json else "") ~ " payload.', bad_ordinal)") }}
    END IF;
{{ m.rewind_when("u.due_at", "now_utc", "unnest(due_ats) AS u (due_at)") }}
{% if dedupe %}
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest(dedupe_keys) WITH ORDINALITY AS u (dedupe_key, ordinal)
    WHERE length(u.dedupe_key) > 200;
    IF bad_ordinal IS NOT NULL THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_enqueue_batch') ~ ": item %s has a dedupe_key over 200 characters.', bad_ordinal)") }}
    END IF;
{% else %}
    IF dedupe_keys IS NOT NULL THEN
        SELECT min(u.ordinal) INTO bad_ordinal
        FROM unnest(dedupe_keys) WITH ORDINALITY AS u (dedupe_key, ordinal)
        WHERE u.dedupe_key IS NOT NULL;
        IF bad_ordinal IS NOT NULL THEN
    {{ m.throw('invalid_argument', "format('" ~ names.plain('_enqueue_batch') ~ ": item %s has a dedupe_key, which needs option dedupe.', bad_ordinal)") }}
        END IF;
    END IF;
{% endif %}
{% if groups %}
{{ grp.check_group_keys('enqueue_batch', 'group_keys', 'item_count') }}
    -- Groups first (their rows, then message rows: the fixed lock order), outside the insert's
    -- subtransaction, so that a second round of it keeps them.
{{ grp.join_groups('group_keys', 'item_heads') }}
{% endif %}
{% if dedupe or client_ids %}

    -- Ids are settled in item order first, so each item knows its id whether or not it is inserted,
    -- and a batch is claimed in item order whatever order its rows go in.
{% if client_ids %}
    new_ids := ARRAY(
        SELECT coalesce(u.given_id, gen_random_uuid())
        FROM generate_series(1, item_count) AS g (position)
        LEFT JOIN unnest(ids) WITH ORDINALITY AS u (given_id, position) ON g.position = u.position
        ORDER BY g.position
    );
    new_seqs := ARRAY(SELECT nextval('{{ names.obj("_id_seq") }}') FROM generate_series(1, item_count));
{% else %}
    new_ids := ARRAY(SELECT nextval('{{ names.obj("_id_seq") }}') FROM generate_series(1, item_count));
{% endif %}
{% set new_ties = 'new_seqs' if client_ids else 'new_ids' %}
{% set insert_order = (['i.dedupe_key'] if dedupe else []) + (['i.new_id'] if client_ids else []) + ['i.position'] %}

    -- Each item's first: the earliest earlier item sharing its key{% if client_ids %} or its client id{% endif %}, followed to
    -- the first of that chain (the SQL Server twin's rule); an item that is its own first is offered
    -- for insertion, any other duplicates its first.
    roots := ARRAY(
        SELECT least(
            u.position{% if dedupe %},
            CASE WHEN k.dedupe_key IS NOT NULL THEN min(u.position) OVER (PARTITION BY k.dedupe_key) END{% endif %}{% if client_ids %},
            min(u.position) OVER (PARTITION BY u.new_id){% endif %}

        )::integer
        FROM unnest(new_ids) WITH ORDINALITY AS u (new_id, position)
        LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, position) ON u.position = k.position
        ORDER BY u.position
    );
{% if client_ids %}
    LOOP
        chased := ARRAY(SELECT roots[r.root] FROM unnest(roots) WITH ORDINALITY AS r (root, position) ORDER BY r.position);
        EXIT WHEN chased IS NOT DISTINCT FROM roots;
        roots := chased;
    END LOOP;
{% endif %}

    -- The firsts go in in {{ 'key' if dedupe else 'id' }} order: two batches that share {{ 'keys' if dedupe else 'ids' }} then wait for each other
    -- instead of deadlocking (each would hold one the other waits for).{% if dedupe and client_ids %} A client id given with
    -- different keys in two overlapping batches can still deadlock (two unique indexes have no common
    -- order); PostgreSQL then ends one batch with 40P01.{% endif %} ON CONFLICT skips one whose {{ 'key or id' if client_ids and dedupe else ('key' if dedupe else 'id') }}
    -- is queued already (waiting for a racing insert of it first).
{% call m.insert_in_key_order("SELECT FROM unnest(result_ids, roots) WITH ORDINALITY AS r (result_id, root, position) WHERE r.root = r.position AND r.result_id IS NULL") %}
    WITH items AS (
        SELECT
            u.new_id,
{% if client_ids %}
            s.new_seq,
{% endif %}
            u.payload,
            u.position,
            d.due_at,
            k.dedupe_key,
            p.priority,
{% if groups %}
            gk.group_key,
            gk.group_head,
{% endif %}
            e.enqueued_at
        FROM unnest(new_ids, payloads) WITH ORDINALITY AS u (new_id, payload, position)
{% if client_ids %}
        INNER JOIN unnest(new_seqs) WITH ORDINALITY AS s (new_seq, position) ON u.position = s.position
{% endif %}
        LEFT JOIN unnest(due_ats) WITH ORDINALITY AS d (due_at, position) ON u.position = d.position
        LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, position) ON u.position = k.position
        LEFT JOIN unnest(priorities) WITH ORDINALITY AS p (priority, position) ON u.position = p.position
        LEFT JOIN unnest(enqueued_ats) WITH ORDINALITY AS e (enqueued_at, position) ON u.position = e.position
{% if groups %}
        LEFT JOIN unnest(group_keys, item_heads) WITH ORDINALITY AS gk (group_key, group_head, position) ON u.position = gk.position
{% endif %}
        WHERE roots[u.position] = u.position
    ),

    queued AS (
        SELECT
            i.position,
            {{ 'coalesce(by_key.id, by_id.id)' if dedupe and client_ids else ('by_key.id' if dedupe else 'by_id.id') }} AS id
        FROM items AS i
{% if dedupe %}
        LEFT JOIN {{ t }} AS by_key ON i.dedupe_key = by_key.dedupe_key
{% endif %}
{% if client_ids %}
        LEFT JOIN {{ t }} AS by_id ON i.new_id = by_id.id
{% endif %}
    ),

    inserted AS (
        INSERT INTO {{ t }} AS m (
            id, {% if client_ids %}seq, {% endif %}enqueued_at, due_at, visible_at, {% if has_priority %}priority, {% endif %}{% if dedupe %}dedupe_key, {% endif %}{% if groups %}group_key, group_head, {% endif %}payload
        )
        OVERRIDING SYSTEM VALUE
        SELECT
            i.new_id,
{% if client_ids %}
            i.new_seq,
{% endif %}
            {{ 'coalesce(i.enqueued_at, now_utc)' if client_ids else 'now_utc' }},
            coalesce(i.due_at, now_utc),
            coalesce(i.due_at, now_utc),
{% if has_priority %}
            coalesce(i.priority, 0),
{% endif %}
{% if dedupe %}
            i.dedupe_key,
{% endif %}
{% if groups %}
            i.group_key,
            i.group_head,
{% endif %}
            i.payload
        FROM items AS i
        ORDER BY {{ insert_order | join(', ') }}
        ON CONFLICT DO NOTHING
        RETURNING m.{{ tie }}
    )

    SELECT
        coalesce((SELECT array_agg(n.{{ tie }}) FROM inserted AS n), '{}'),
        (SELECT array_agg(q.position ORDER BY q.position) FROM queued AS q WHERE q.id IS NOT NULL),
        (SELECT array_agg(q.id ORDER BY q.position) FROM queued AS q WHERE q.id IS NOT NULL)
    INTO inserted_ties, queued_positions, queued_ids;

    -- A first's id: its own when its row went in; else the message now queued with its key{% if client_ids %} or id{% endif %} (a
    -- new statement sees what racing transactions committed while this one waited on them); else,
    -- when that message has been consumed since, the one the insert's own snapshot saw.
    result_ids := ARRAY(
        SELECT
            CASE
                WHEN roots[u.position] <> u.position THEN NULL
                WHEN own.tie IS NOT NULL THEN u.new_id
                ELSE coalesce(
{% if dedupe %}
                    (SELECT m.id FROM {{ t }} AS m WHERE m.dedupe_key = k.dedupe_key),
{% endif %}
{% if client_ids %}
                    (SELECT m.id FROM {{ t }} AS m WHERE m.id = u.new_id),
{% endif %}
                    q.id
                )
            END
        FROM unnest(new_ids, {{ new_ties }}) WITH ORDINALITY AS u (new_id, new_tie, position)
        LEFT JOIN unnest(inserted_ties) AS own (tie) ON u.new_tie = own.tie
        LEFT JOIN unnest(queued_positions, queued_ids) AS q (position, id) ON u.position = q.position
        LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, position) ON u.position = k.position
        ORDER BY u.position
    );
{%- endcall %}

{% if groups %}
{{ grp.flag_first_inserted("SELECT u.new_id, u.new_tie, k.group_key FROM unnest(new_ids, " ~ new_ties ~ ") WITH ORDINALITY AS u (new_id, new_tie, position) INNER JOIN unnest(group_keys) WITH ORDINALITY AS k (group_key, position) ON u.position = k.position WHERE u.new_tie = ANY(inserted_ties)") }}
{% endif %}

    -- A later item duplicates its first: it reports the first's id.
    RETURN QUERY
    SELECT
        u.position::integer,
        result_ids[roots[u.position]],
        own.tie IS NULL
    FROM unnest({{ new_ties }}) WITH ORDINALITY AS u (new_tie, position)
    LEFT JOIN unnest(inserted_ties) AS own (tie) ON u.new_tie = own.tie
    ORDER BY u.position;
{% else %}

    -- One statement: the rows go in in item order, so the identity gives them ids in item order
    -- and item n's id is the n-th smallest.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO {{ t }} AS m (enqueued_at, due_at, visible_at, {% if has_priority %}priority, {% endif %}{% if groups %}group_key, group_head, {% endif %}payload)
        SELECT
            now_utc,
            coalesce(u.due_at, now_utc),
            coalesce(u.due_at, now_utc),
{% if has_priority %}
            coalesce(u.priority, 0),
{% endif %}
{% if groups %}
            u.group_key,
            u.group_head,
{% endif %}
            u.payload
        FROM unnest(payloads, due_ats{% if has_priority %}, priorities{% endif %}{% if groups %}, group_keys, item_heads{% endif %}) WITH ORDINALITY
            AS u (payload, due_at, {% if has_priority %}priority, {% endif %}{% if groups %}group_key, group_head, {% endif %}position)
        ORDER BY u.position
        RETURNING m.id
    )

    SELECT (row_number() OVER (ORDER BY i.id))::integer, i.id, false
    FROM inserted AS i
    ORDER BY i.id;
{% endif %}
{% if opt.notify %}
    IF cardinality({{ 'inserted_ties' if dedupe or client_ids else 'payloads' }}) > 0 THEN
{{ m.notify() | indent(4, first=true) }}
    END IF;
{% endif %}
END;
$function$;

{{ m.grant('enqueue_batch') }}
