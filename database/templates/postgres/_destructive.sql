{#-
  The destructive kinds (heap, fifo, lifo, pending) share one shape: a dequeue deletes the rows it
  hands out, in the caller's transaction. The including template sets:
    claim_order  'none' | 'oldest' | 'newest' | 'due'
    strict       true only for strict FIFO (consumers serialise on an advisory lock)
  fifo also reads option groups (message groups: docs/queue-kinds.md, Message groups).
  docs/queue-kinds.md explains the storage, index and locking choices; keep it in step.
-#}
{% set has_due = claim_order == 'due' %}
{% set dedupe = opt.dedupe %}
{% set groups = opt.get('groups', false) %}
{% set group_shape = ('groups',) if groups else () %}
{% set t = names.obj() %}
{% set fn = queue.name %}
{% if has_due %}
{% set claim_order_sql = 'm.due_at, m.id' %}
{% elif claim_order == 'newest' %}
{% set claim_order_sql = 'm.id DESC' %}
{% else %}
{% set claim_order_sql = 'm.id' %}
{% endif %}
{#- Every kind but lifo and strict fifo claims from a claim position (docs/queue-kinds.md): the head
    of its index is where consumed rows leave their entries. lifo claims from the other end, where new
    rows land. Strict fifo claims from the head: a position stored while a producer's lower id is
    still uncommitted would hand out later ids before it. -#}
{% set has_position = claim_order != 'newest' and not strict and not groups %}
{% set position_key = ['due_at', 'id'] if has_due else ['id'] %}
{% import '_macros.sql' as m with context %}
{% if groups %}
{% import '_group_macros.sql' as grp with context %}
{% endif %}
{#- The claim's two CTEs: lock up to limit_sql rows in claim order (next_messages) and delete them,
    returning them (claimed). For a variable limit the delete finds them by `id = ANY(the claimed
    ids)`, not by a join: the generic plan of the join with `LIMIT limit_sql` (costed at a tenth of
    the index's rows) can be a hash join over a sequential scan of the whole queue (claim_ctes in
    _work_macros.sql); `LIMIT 1` keeps the join, a nested loop. -#}
{% macro claim_ctes(limit_sql) %}
    WITH next_messages AS (
        SELECT m.id
        FROM {{ t }} AS m
{% if has_position %}
        WHERE {{ m.position_predicate(position_key) }}{% if has_due %} AND m.due_at <= now_utc{% endif %}

{% endif %}
        ORDER BY {{ claim_order_sql }}
        LIMIT {{ limit_sql }}
        FOR UPDATE{% if not strict %} SKIP LOCKED{% endif %}

    ),

    claimed AS (
        DELETE FROM {{ t }} AS m
{% if limit_sql == '1' %}
        USING next_messages AS n
        WHERE m.id = n.id
{% else %}
        WHERE m.id = ANY(ARRAY(SELECT n.id FROM next_messages AS n))
{% endif %}
        RETURNING m.id, m.payload, m.enqueued_at{% if has_due %}, m.due_at{% endif %}

    )
{%- endmacro %}
{#- A batch's claim: the claimed rows, in claim order, to the caller. -#}
{% macro claim_statement(limit_sql) %}
    RETURN QUERY
{{ claim_ctes(limit_sql) }}

    SELECT c.id, c.payload, c.enqueued_at{% if has_due %}, c.due_at{% endif %}

    FROM claimed AS c
    ORDER BY {{ claim_order_sql | replace('m.', 'c.') }};
{%- endmacro %}
{#- The one-message claim, the hot path: the claimed row goes into the function's OUT parameters,
    and the statement also finds where this session's next claim starts (m.position_seen). -#}
{% macro claim_one_statement() %}
{{ claim_ctes('1') }}

    SELECT c.id, c.payload, c.enqueued_at{% if has_due %}, c.due_at{% endif %}{% if has_position %}, {% if has_due %}seen.due_at, {% endif %}seen.id{% endif %}

    INTO id, payload, enqueued_at{% if has_due %}, due_at{% endif %}{% if has_position %}, {% if has_due %}seen_time, {% endif %}seen_id{% endif %}

    FROM claimed AS c{% if has_position %}

{{ m.position_seen(position_key, 'c') | indent(4, first=true) }}{% endif %};
{%- endmacro %}
{% if groups %}
{#- fifo with groups: messages without a group are claimed on ix_<q>_ungrouped, grouped ones a group
    at a time (docs/queue-kinds.md, Message groups), each from the head of its index: no claim
    position (a promoted head can be old). The source whose first message is older goes first, the
    other fills the batch. -#}
{% macro ungrouped_claim_statement(limit_sql) %}
        RETURN QUERY
        WITH next_messages AS (
            SELECT m.id
            FROM {{ t }} AS m
            WHERE m.group_key IS NULL
            ORDER BY m.id
            LIMIT {{ limit_sql }}
            FOR UPDATE SKIP LOCKED
        ),

        claimed AS (
            DELETE FROM {{ t }} AS m
{% if limit_sql == '1' %}
            USING next_messages AS n
            WHERE m.id = n.id
{% else %}
            WHERE m.id = ANY(ARRAY(SELECT n.id FROM next_messages AS n))
{% endif %}
            RETURNING m.id, m.payload, m.enqueued_at
        )

        SELECT c.id, c.payload, c.enqueued_at, NULL::text
        FROM claimed AS c
        ORDER BY c.id;
{%- endmacro %}
{#- With a literal LIMIT 1 for one message (the generic plan of a variable limit is a sort). -#}
{% macro ungrouped_claim() %}
        IF remaining = 1 THEN
{{ ungrouped_claim_statement('1') | indent(4, first=true) }}
        ELSE
{{ ungrouped_claim_statement('remaining') | indent(4, first=true) }}
        END IF;
        GET DIAGNOSTICS claimed_count = ROW_COUNT;
        remaining := remaining - claimed_count;
{%- endmacro %}
{#- Rounds of: lock up to `remaining` groups that have a candidate (stepping over held ones and
    those this call has been to), delete each one's real head, flag its next one. The groups stay
    locked until the caller's transaction ends: that is the consumer holding its groups, and a
    rollback restores heads and flags alike. -#}
{% macro grouped_claim() %}
    WHILE remaining > 0 LOOP
{{ grp.discover_round() }}
{{ grp.find_heads('locked_keys') | indent(4, first=true) }}
        -- Only a holder of the group locks its head (the wait probe locks the groups row instead).
        RETURN QUERY
        WITH heads AS (
            SELECT m.id FROM {{ t }} AS m WHERE m.id = ANY(head_ids) FOR UPDATE SKIP LOCKED
        ),

        claimed AS (
            DELETE FROM {{ t }} AS m
            USING heads AS h
            WHERE m.id = h.id
            RETURNING m.id, m.payload, m.enqueued_at, m.group_key
        )

        SELECT c.id, c.payload, c.enqueued_at, c.group_key
        FROM claimed AS c
        ORDER BY c.id;
        GET DIAGNOSTICS claimed_count = ROW_COUNT;
        remaining := remaining - claimed_count;
{{ grp.settle('locked_keys') | indent(4, first=true) }}
    END LOOP;
{%- endmacro %}
{% macro grouped_dequeue_body() %}
DECLARE
    remaining integer := batch_size;
    claimed_count bigint;
    locked_keys text[];
    visited_keys text[] := '{}';
    head_ids bigint[];
    oldest_ungrouped bigint;
    oldest_head bigint;
    grouped_first boolean;
BEGIN
{{ m.check_batch_size('dequeue') }}
{{ m.check_read_committed('dequeue') }}
    oldest_ungrouped := (SELECT m.id FROM {{ t }} AS m WHERE m.group_key IS NULL ORDER BY m.id LIMIT 1);
    oldest_head := (SELECT m.id FROM {{ t }} AS m WHERE m.group_head ORDER BY m.id LIMIT 1);
    grouped_first := coalesce(oldest_head < oldest_ungrouped, oldest_ungrouped IS NULL);
    IF NOT grouped_first THEN
{{ ungrouped_claim() }}
    END IF;
{{ grouped_claim() }}
    IF grouped_first THEN
{{ ungrouped_claim() }}
    END IF;
END;
{%- endmacro %}
{% endif %}
{{ m.unit(names.plain(), 'storage', version=1, object='table', shape=('payload', 'dedupe') + group_shape) }}
CREATE TABLE IF NOT EXISTS {{ t }} (
    id bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{ names.obj('_id_seq') }}),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
{% if has_due %}
    due_at timestamptz NOT NULL,
{% endif %}
{% if dedupe %}
    dedupe_key text CONSTRAINT {{ names.index('ck', 'dedupe_key') }} CHECK (length(dedupe_key) <= 200),
{% endif %}
{% if groups %}
    group_key text CONSTRAINT {{ names.index('ck', 'group_key') }} CHECK (length(group_key) <= 200),
    -- NULL: no group; true: a head candidate of its group (in ix_{{ queue.name }}_heads); false: it
    -- waits behind its group's head (docs/queue-kinds.md, Message groups).
    group_head boolean,
{% endif %}
    payload {{ payload_type }} NOT NULL,
{% if is_json %}
    -- SQL Server's ISJSON (2017-2019) only takes an object or an array; so does this twin.
    CONSTRAINT {{ names.index('ck', 'payload_json') }} CHECK (jsonb_typeof(payload) IN ('object', 'array')),
{% endif %}
    CONSTRAINT {{ names.index('pk') }} PRIMARY KEY (id)
)
-- A queue's table is mostly dead rows: vacuum after a fixed number of them rather than a fraction
-- of the (small) live count, so index scans from the head do not wade through dead entries.
WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);
{% if has_due %}

-- The claim's exact WHERE/ORDER BY: a range scan from the earliest due row.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'due') }} ON {{ t }} (due_at, id);
{% endif %}
{% if dedupe %}

CREATE UNIQUE INDEX IF NOT EXISTS {{ names.index('ux', 'dedupe') }}
ON {{ t }} (dedupe_key)
WHERE dedupe_key IS NOT NULL;
{% endif %}
{% if groups %}

-- The claim of messages without a group.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'ungrouped') }}
ON {{ t }} (id)
WHERE group_key IS NULL;

-- The claim of grouped messages: only head candidates, so a held group's backlog is never read.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'heads') }}
ON {{ t }} (id)
WHERE group_head;

-- One group's head (the oldest waiting or flagged message) and its candidates.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'group') }}
ON {{ t }} (group_key, group_head, id)
WHERE group_key IS NOT NULL;

{{ m.unit(names.plain('_groups'), 'storage', version=1, object='table') }}
-- One row per group key that has messages: the group's lock (docs/queue-kinds.md, Message groups),
-- held by the consumer that dequeued the group's head until its transaction ends. Never updated.
CREATE TABLE IF NOT EXISTS {{ names.obj('_groups') }} (
    group_key text NOT NULL,
    CONSTRAINT {{ names.index('pk', 'groups') }} PRIMARY KEY (group_key)
);
{% endif %}
{% if has_due %}

{{ m.rewinds_unit() }}
{% endif %}

{{ m.ownership_unit((['', '_rewinds'] if has_due else ['']) + (['_groups'] if groups else [])) }}

{{ m.unit(names.plain('_enqueue'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('enqueue') }}(
    payload {{ payload_type }},
{% if has_due %}
    due_at timestamptz DEFAULT NULL,
{% endif %}
    dedupe_key text DEFAULT NULL{% if groups %},
    group_key text DEFAULT NULL{% endif %}

)
RETURNS TABLE (id bigint, duplicate boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    new_id bigint;
{% if groups %}
    is_head boolean;
{% endif %}
BEGIN
{{ m.check_payload('enqueue') }}
{% if groups %}
{{ m.check_read_committed('enqueue') }}
{% endif %}
{% if is_json %}
    IF jsonb_typeof({{ fn }}_enqueue.payload) NOT IN ('object', 'array') THEN
{{ m.throw('invalid_payload', "'" ~ names.plain('_enqueue') ~ ": payload must be a JSON object or array.'") }}
    END IF;
{% endif %}
{% if has_due %}
{{ m.rewind_when(fn ~ "_enqueue.due_at", "clock_timestamp()") }}
{% endif %}
{% if groups %}
{{ grp.enqueue_join() }}
{% endif %}
{% if dedupe %}
{{ m.check_dedupe_key('enqueue') }}
    -- ON CONFLICT waits for a racing insert of the same key and then does nothing; the row is looked
    -- up in a new statement, which sees it. If it is gone again by then (dequeued), insert again.
    LOOP
        INSERT INTO {{ t }} AS m ({% if has_due %}due_at, {% endif %}dedupe_key, {% if groups %}group_key, group_head, {% endif %}payload)
        VALUES ({% if has_due %}coalesce({{ fn }}_enqueue.due_at, clock_timestamp()), {% endif %}{{ fn }}_enqueue.dedupe_key, {% if groups %}{{ fn }}_enqueue.group_key, is_head, {% endif %}{{ fn }}_enqueue.payload)
        ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING m.id INTO new_id;
        IF new_id IS NOT NULL THEN
{% if opt.notify %}
{{ m.notify() | indent(8, first=true) }}
{% endif %}
{{ m.answer([('id', 'new_id'), ('duplicate', 'false')]) | indent(8, first=true) }}
            RETURN;
        END IF;
        SELECT m.id INTO new_id FROM {{ t }} AS m WHERE m.dedupe_key = {{ fn }}_enqueue.dedupe_key;
        IF new_id IS NOT NULL THEN
{{ m.answer([('id', 'new_id'), ('duplicate', 'true')]) | indent(8, first=true) }}
            RETURN;
        END IF;
    END LOOP;
{% else %}
    IF {{ fn }}_enqueue.dedupe_key IS NOT NULL THEN
{{ m.throw('invalid_argument', "'" ~ names.plain('_enqueue') ~ ": dedupe_key needs option dedupe.'") }}
    END IF;
    INSERT INTO {{ t }} AS m ({% if has_due %}due_at, {% endif %}{% if groups %}group_key, group_head, {% endif %}payload)
    VALUES ({% if has_due %}coalesce({{ fn }}_enqueue.due_at, clock_timestamp()), {% endif %}{% if groups %}{{ fn }}_enqueue.group_key, is_head, {% endif %}{{ fn }}_enqueue.payload)
    RETURNING m.id INTO new_id;
{% if opt.notify %}
{{ m.notify() }}
{% endif %}
{{ m.answer([('id', 'new_id'), ('duplicate', 'false')]) }}
{% endif %}
END;
$function$;

{{ m.grant('enqueue') }}

{{ m.unit(names.plain('_enqueue_batch'), 'code') }}
-- PostgreSQL has no table-valued parameters: items arrive as parallel arrays, position = ordinal.
CREATE OR REPLACE FUNCTION {{ names.verb('enqueue_batch') }}(
    payloads {{ payload_type }}[],
{% if has_due %}
    due_ats timestamptz[] DEFAULT NULL,
{% endif %}
    dedupe_keys text[] DEFAULT NULL{% if groups %},
    group_keys text[] DEFAULT NULL{% endif %}

)
RETURNS TABLE (ordinal integer, id bigint, duplicate boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    item_count integer := coalesce(cardinality(payloads), 0);
    bad_ordinal integer;
{% if groups %}
{{ grp.join_groups_declare() }}
{% endif %}
{% if dedupe %}
    new_ids bigint[];
    roots integer[];
    result_ids bigint[];
    inserted_ids bigint[];
    queued_ordinals bigint[];
    queued_ids bigint[];
{% endif %}
BEGIN
{{ m.check_batch_items('enqueue_batch', 'item_count') }}
{% if groups %}
{{ m.check_read_committed('enqueue_batch') }}
{% endif %}
{% for array in (['due_ats', 'dedupe_keys'] if has_due else ['dedupe_keys']) %}
    IF {{ array }} IS NOT NULL AND cardinality({{ array }}) <> item_count THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_enqueue_batch') ~ ": " ~ array ~ " has %s elements but payloads has %s.', cardinality(" ~ array ~ "), item_count)") }}
    END IF;
{% endfor %}
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest(payloads) WITH ORDINALITY AS u (payload, ordinal)
    WHERE u.payload IS NULL{% if is_json %} OR jsonb_typeof(u.payload) NOT IN ('object', 'array'){% endif %};
    IF bad_ordinal IS NOT NULL THEN
{{ m.throw('invalid_payload', "format('" ~ names.plain('_enqueue_batch') ~ ": item %s has a NULL" ~ (" or non-object/array JSON" if is_json else "") ~ " payload.', bad_ordinal)") }}
    END IF;
{% if has_due %}
{{ m.rewind_when("u.due_at", "clock_timestamp()", "unnest(due_ats) AS u (due_at)") }}
{% endif %}
{% if groups %}
{{ grp.check_group_keys('enqueue_batch', 'group_keys', 'item_count') }}
    -- Groups first (their rows, then message rows: the fixed lock order), outside the insert's
    -- subtransaction, so that a second round of it keeps them.
{{ grp.join_groups('group_keys', 'item_heads') }}
{% endif %}
{% if dedupe %}
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest(dedupe_keys) WITH ORDINALITY AS u (dedupe_key, ordinal)
    WHERE length(u.dedupe_key) > 200;
    IF bad_ordinal IS NOT NULL THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_enqueue_batch') ~ ": item %s has a dedupe_key over 200 characters.', bad_ordinal)") }}
    END IF;

    -- Ids are drawn in item order first, so each item knows its id whether or not it is inserted,
    -- and a batch is dequeued in item order.
    new_ids := ARRAY(SELECT nextval('{{ names.obj("_id_seq") }}') FROM generate_series(1, item_count));
    -- Each item's first: itself, or the earliest item with its key (one sort, where a look-back per
    -- item was quadratic in the batch). Only firsts are offered; a later item duplicates its first.
    roots := ARRAY(
        SELECT least(
            u.ordinal,
            CASE WHEN u.dedupe_key IS NOT NULL THEN min(u.ordinal) OVER (PARTITION BY u.dedupe_key) END
        )::integer
        FROM unnest(dedupe_keys) WITH ORDINALITY AS u (dedupe_key, ordinal)
        ORDER BY u.ordinal
    );
    IF dedupe_keys IS NULL THEN
        roots := ARRAY(SELECT generate_series(1, item_count));
    END IF;

    -- The firsts go in in key order: two batches that share keys then wait for each other instead
    -- of deadlocking (each would hold a key the other waits for). The ids were drawn in item order
    -- above, so the dequeue order is still the item order. ON CONFLICT skips a key already in the
    -- queue (waiting for a racing insert of it first).
{% call m.insert_in_key_order("SELECT FROM unnest(result_ids, roots) WITH ORDINALITY AS r (result_id, root, ordinal) WHERE r.root = r.ordinal AND r.result_id IS NULL") %}
    WITH items AS (
        SELECT
            u.new_id,
{% if has_due %}
            u.due_at,
{% endif %}
            u.dedupe_key,
{% if groups %}
            u.group_key,
            u.group_head,
{% endif %}
            u.payload,
            u.ordinal
        FROM unnest(new_ids, payloads{% if has_due %}, due_ats{% endif %}, dedupe_keys{% if groups %}, group_keys, item_heads{% endif %}) WITH ORDINALITY
            AS u (new_id, payload{% if has_due %}, due_at{% endif %}, dedupe_key, {% if groups %}group_key, group_head, {% endif %}ordinal)
        WHERE roots[u.ordinal] = u.ordinal
    ),

    queued AS (
        SELECT
            i.ordinal,
            m.id
        FROM items AS i
        INNER JOIN {{ t }} AS m ON i.dedupe_key = m.dedupe_key
    ),

    inserted AS (
        INSERT INTO {{ t }} AS m (id, {% if has_due %}due_at, {% endif %}dedupe_key, {% if groups %}group_key, group_head, {% endif %}payload)
        OVERRIDING SYSTEM VALUE
        SELECT
            i.new_id,
{% if has_due %}
            coalesce(i.due_at, clock_timestamp()),
{% endif %}
            i.dedupe_key,
{% if groups %}
            i.group_key,
            i.group_head,
{% endif %}
            i.payload
        FROM items AS i
        ORDER BY i.dedupe_key, i.ordinal
        ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING m.id
    )

    SELECT
        coalesce((SELECT array_agg(n.id) FROM inserted AS n), '{}'),
        (SELECT array_agg(q.ordinal ORDER BY q.ordinal) FROM queued AS q),
        (SELECT array_agg(q.id ORDER BY q.ordinal) FROM queued AS q)
    INTO inserted_ids, queued_ordinals, queued_ids;

    -- A first's id: its own when its row went in; else the message now queued with its key (a
    -- new statement sees what racing transactions committed while this one waited on them);
    -- else, when that message has been dequeued since, the one the insert's own snapshot saw.
    result_ids := ARRAY(
        SELECT
            CASE
                WHEN roots[u.ordinal] <> u.ordinal THEN NULL
                WHEN own.id IS NOT NULL THEN u.new_id
                ELSE coalesce((SELECT m.id FROM {{ t }} AS m WHERE m.dedupe_key = k.dedupe_key), q.id)
            END
        FROM unnest(new_ids) WITH ORDINALITY AS u (new_id, ordinal)
        LEFT JOIN unnest(inserted_ids) AS own (id) ON u.new_id = own.id
        LEFT JOIN unnest(queued_ordinals, queued_ids) AS q (ordinal, id) ON u.ordinal = q.ordinal
        LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, ordinal) ON u.ordinal = k.ordinal
        ORDER BY u.ordinal
    );
{%- endcall %}

{% if groups %}
{{ grp.flag_first_inserted("SELECT u.new_id, u.new_id, k.group_key FROM unnest(new_ids) WITH ORDINALITY AS u (new_id, ordinal) INNER JOIN unnest(group_keys) WITH ORDINALITY AS k (group_key, ordinal) ON u.ordinal = k.ordinal WHERE u.new_id = ANY(inserted_ids)") }}
{% endif %}

    -- A later item duplicates its first: it reports the first's id.
    RETURN QUERY
    SELECT
        u.ordinal::integer,
        result_ids[roots[u.ordinal]],
        own.id IS NULL
    FROM unnest(new_ids) WITH ORDINALITY AS u (new_id, ordinal)
    LEFT JOIN unnest(inserted_ids) AS own (id) ON u.new_id = own.id
    ORDER BY u.ordinal;
{% else %}
    IF dedupe_keys IS NOT NULL THEN
        SELECT min(u.ordinal) INTO bad_ordinal
        FROM unnest(dedupe_keys) WITH ORDINALITY AS u (dedupe_key, ordinal)
        WHERE u.dedupe_key IS NOT NULL;
        IF bad_ordinal IS NOT NULL THEN
    {{ m.throw('invalid_argument', "format('" ~ names.plain('_enqueue_batch') ~ ": item %s has a dedupe_key, which needs option dedupe.', bad_ordinal)") }}
        END IF;
    END IF;

    -- One statement: the rows go in in item order, so the identity gives them ids in item order
    -- (a batch is dequeued in item order) and item n's id is the n-th smallest.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO {{ t }} AS m ({% if has_due %}due_at, {% endif %}{% if groups %}group_key, group_head, {% endif %}payload)
        SELECT
{% if has_due %}
            coalesce(u.due_at, clock_timestamp()),
{% endif %}
{% if groups %}
            u.group_key,
            u.group_head,
{% endif %}
            u.payload
        FROM unnest(payloads{% if has_due %}, due_ats{% endif %}{% if groups %}, group_keys, item_heads{% endif %}) WITH ORDINALITY AS u (payload, {% if has_due %}due_at, {% endif %}{% if groups %}group_key, group_head, {% endif %}ordinal)
        ORDER BY u.ordinal
        RETURNING m.id
    )

    SELECT (row_number() OVER (ORDER BY i.id))::integer, i.id, false
    FROM inserted AS i
    ORDER BY i.id;
{% endif %}
{% if opt.notify %}
    IF cardinality({{ 'inserted_ids' if dedupe else 'payloads' }}) > 0 THEN
{{ m.notify() | indent(4, first=true) }}
    END IF;
{% endif %}
END;
$function$;

{{ m.grant('enqueue_batch') }}

{{ m.unit(names.plain('_dequeue'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('dequeue') }}(batch_size integer DEFAULT 1)
RETURNS TABLE (id bigint, payload {{ payload_type }}, enqueued_at timestamptz{% if has_due %}, due_at timestamptz{% endif %}{% if groups %}, group_key text{% endif %})
{{ m.definer() }}
AS $function$
#variable_conflict use_column
{% if groups %}
{{ grouped_dequeue_body() }}
{% else %}
{% if has_position %}
DECLARE
{% if has_due %}
    -- A variable, not clock_timestamp() in the WHERE: a volatile function cannot bound an index
    -- scan, and the claim would read every not-yet-due row before finding out none is due.
{% endif %}
    now_utc timestamptz := clock_timestamp();
{{ m.position_declare(position_key) }}
{% endif %}
BEGIN
{{ m.check_batch_size('dequeue') }}
{{ m.check_read_committed('dequeue') }}
{% if strict %}
    -- Strict FIFO: one consumer at a time until its transaction ends, so hand-outs commit in
    -- order and a rolled-back batch is handed out again first. Waiting on row locks alone (FOR
    -- UPDATE without SKIP LOCKED) would also order them with this plan, but would make the order
    -- depend on how the plan combines LIMIT with row locks; the lock states the rule.
    PERFORM pg_advisory_xact_lock(hashtextextended('tablequeue:{{ names.plain() }}', 0));
{% elif claim_order == 'none' %}
    -- A heap promises no order; the claim still walks the primary key, because a LIMIT over a
    -- sequential scan re-reads every dead tuple at the head of the table until vacuum runs.
{% endif %}
{% if has_position %}
{{ m.position_load(position_key) }}

{% endif %}
    -- Batch size 1 has its own statement with a literal LIMIT. PL/pgSQL caches one plan per
    -- statement, and the generic plan of `LIMIT batch_size` (costed for an unknown limit) is a sort
    -- of the whole queue, so that statement is planned again on every call; with LIMIT 1 the generic
    -- plan is the index scan and is kept for the session (docs/BENCHMARKS.md, The ceiling). It also
    -- finds the next claim position itself, where a batch reads it again after the claim.
    IF batch_size = 1 THEN
{{ claim_one_statement() | indent(4, first=true) }}
        IF FOUND THEN
{% if has_position %}
{{ m.position_after_claim(position_key, fn ~ '_dequeue.id', fn ~ '_dequeue.due_at') | indent(8, first=true) }}
{% endif %}
            RETURN NEXT;
        END IF;
    ELSE
{{ claim_statement('batch_size') | indent(4, first=true) }}
{% if has_position %}
        IF FOUND THEN
{{ m.position_find(position_key) | indent(8, first=true) }}
        END IF;
{% endif %}
    END IF;
END;
{% endif %}
$function$;

{{ m.grant('dequeue') }}

{{ m.unit(names.plain('_stats'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('stats') }}()
RETURNS TABLE (
    ready bigint,
    delayed bigint,
    in_flight bigint,
    dead bigint,
    oldest_ready_age_seconds double precision,
    estimated boolean
)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    -- Counting stops at exact_limit rows; past that the planner's row estimate stands in, so a
    -- deep queue never costs a full scan.
    exact_limit constant bigint := 10000;
    now_utc timestamptz := clock_timestamp();
    ready_count bigint;
    delayed_count bigint := 0;
    total_estimate bigint;
    is_estimate boolean := false;
    oldest_ready timestamptz;
BEGIN
    SELECT count(*) INTO ready_count FROM (
        SELECT 1 FROM {{ t }} AS m
{% if has_due %}
        WHERE m.due_at <= now_utc
{% endif %}
        LIMIT exact_limit + 1
    ) AS counted;
{% if has_due %}
    SELECT count(*) INTO delayed_count FROM (
        SELECT 1 FROM {{ t }} AS m WHERE m.due_at > now_utc LIMIT exact_limit + 1
    ) AS counted;
{% endif %}
    IF ready_count > exact_limit OR delayed_count > exact_limit THEN
        is_estimate := true;
        -- The planner's own estimate: tuples per page from the last ANALYZE times current pages.
        SELECT CASE
            WHEN c.reltuples > 0 AND c.relpages > 0
                THEN (c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::integer))::bigint
            ELSE 0
        END
        INTO total_estimate
        FROM pg_class AS c
        WHERE c.oid = '{{ t }}'::regclass;
        IF ready_count > exact_limit THEN
            ready_count := greatest(ready_count, total_estimate - delayed_count);
        ELSE
            delayed_count := greatest(delayed_count, total_estimate - ready_count);
        END IF;
    END IF;

    SELECT m.{{ 'due_at' if has_due else 'enqueued_at' }} INTO oldest_ready
    FROM {{ t }} AS m
{% if has_due %}
    WHERE m.due_at <= now_utc
    ORDER BY m.due_at, m.id
{% else %}
    ORDER BY m.id
{% endif %}
    LIMIT 1;

    -- A destructive dequeue deletes in the consumer's own transaction: nothing is ever "in flight"
    -- outside it, and nothing is dead.
    RETURN QUERY SELECT
        ready_count,
        delayed_count,
        0::bigint,
        0::bigint,
        extract(EPOCH FROM now_utc - oldest_ready)::double precision,
        is_estimate;
END;
$function$;

{{ m.grant('stats') }}

{{ m.unit(names.plain('_purge'), 'code') }}
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
{% if groups %}
{{ grp.purge_declare() }}
{% endif %}
BEGIN
{{ m.check_max_rows('purge') }}
{% if groups %}
{{ m.check_read_committed('purge') }}
{% endif %}
{% if groups %}
{{ grp.purge_rounds('m.id') }}
{% else %}
    -- SKIP LOCKED leaves the rows a consumer is dequeuing right now, and never waits for them.
    -- Oldest first; LIMIT NULL is no limit.
    -- The doomed ids as an array, not a join: a generic plan (PL/pgSQL's own after a few calls, or
    -- plan_cache_mode) costs LIMIT max_rows at a tenth of the table and joins by hashing a sequential
    -- scan of all of it; an array is probed on the primary key whatever its size.
    IF {{ fn }}_purge.older_than IS NULL THEN
        WITH doomed AS (
            SELECT m.id FROM {{ t }} AS m
            ORDER BY m.id
            LIMIT {{ fn }}_purge.max_rows
            FOR UPDATE SKIP LOCKED
        ),

        deleted AS (
            DELETE FROM {{ t }} AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
        )

        SELECT count(*) INTO purged_count FROM deleted;
    ELSE
        WITH doomed AS (
            SELECT m.id FROM {{ t }} AS m
            WHERE m.enqueued_at < {{ fn }}_purge.older_than
            ORDER BY m.id
            LIMIT {{ fn }}_purge.max_rows
            FOR UPDATE SKIP LOCKED
        ),

        deleted AS (
            DELETE FROM {{ t }} AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
        )

        SELECT count(*) INTO purged_count FROM deleted;
    END IF;
{% endif %}
    RETURN QUERY SELECT purged_count;
END;
$function$;

{{ m.grant('purge') }}

{% include 'wait.sql' %}
