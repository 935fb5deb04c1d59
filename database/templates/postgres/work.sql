{#-
  The work kind: a reliable, lease-based queue (at-least-once). See docs/work-queue.md.
  A dequeue leases rows to a worker and counts an attempt; complete / fail / extend_lease need the
  live lease; a lease that expires makes the message visible again; max_attempts ends in S.Q_dead.
-#}
{% set t = names.obj() %}
{% set dead_t = names.obj('_dead') %}
{% set history_t = names.obj('_history') %}
{% set fn = queue.name %}
{% set client_ids = opt.client_ids %}
{% set id_type = 'uuid' if client_ids else 'bigint' %}
{% set tie = 'seq' if client_ids else 'id' %}
{% set has_priority = opt.priority %}
{% set dedupe = opt.dedupe %}
{% set history = opt.history %}
{% set max_attempts = opt.max_attempts %}
{% set lease_seconds = opt.lease_seconds %}
{% set handler = opt.handler %}
{% set position_key = ['visible_at', tie] %}
{% import '_macros.sql' as m with context %}
{% import '_work_macros.sql' as w with context %}
{{ m.unit(names.plain(), 'storage', version=1, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids')) }}
-- Every claim, fail and extend writes a new row version, never a HOT update (visible_at is indexed).
CREATE TABLE IF NOT EXISTS {{ t }} (
{% if client_ids %}
    -- Client-supplied (Pintér); seq is the claim order's tie-breaker.
    id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{ names.obj('_id_seq') }}),
{% else %}
    id bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{ names.obj('_id_seq') }}),
{% endif %}
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The scheduled start, as enqueued (returned by dequeue).
    due_at timestamptz NOT NULL,
    -- When the message may next be claimed: due_at, then the lease expiry while leased, then the
    -- retry time after a fail.
    visible_at timestamptz NOT NULL,
{% if has_priority %}
    priority integer NOT NULL DEFAULT 0,
{% endif %}
    attempts integer NOT NULL DEFAULT 0,
    leased_by text,
    leased_at timestamptz,
    last_error text,
{% if dedupe %}
    dedupe_key text CONSTRAINT {{ names.index('ck', 'dedupe_key') }} CHECK (length(dedupe_key) <= 200),
{% endif %}
    payload {{ payload_type }} NOT NULL,
{% if is_json %}
    -- SQL Server's ISJSON (2017-2019) only takes an object or an array; so does this twin.
    CONSTRAINT {{ names.index('ck', 'payload_json') }} CHECK (jsonb_typeof(payload) IN ('object', 'array')),
{% endif %}
    CONSTRAINT {{ names.index('pk') }} PRIMARY KEY (id)
)
-- fillfactor leaves room on the page for the row's next version; vacuum and analyze run after a
-- fixed number of changed rows rather than a fraction of a (small, or huge) live count, so index
-- scans from the head do not wade through dead entries (as the destructive kinds).
WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);

-- The claim's exact WHERE and ORDER BY{% if has_priority %} (one priority level per range scan){% endif %}.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'claim') }}
ON {{ t }} ({% if has_priority %}priority DESC, {% endif %}visible_at, {{ tie }});

-- A worker's own messages (the restart path) and the in-flight count; only leased rows.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'lease') }}
ON {{ t }} (leased_by, visible_at, {{ tie }})
WHERE leased_by IS NOT NULL;
{% if dedupe %}

CREATE UNIQUE INDEX IF NOT EXISTS {{ names.index('ux', 'dedupe') }}
ON {{ t }} (dedupe_key)
WHERE dedupe_key IS NOT NULL;
{% endif %}
{% if client_ids %}

{{ m.unit(names.plain('_enqueue_result'), 'storage', version=1, object='type') }}
-- enqueue's result row. A function cannot have a parameter and a result column of the same name
-- (both are parameters to PostgreSQL), and the contract names both `id`: the result is this type.
DO $type$
BEGIN
    IF to_regtype('{{ names.obj("_enqueue_result") }}') IS NULL THEN
        CREATE TYPE {{ names.obj("_enqueue_result") }} AS (id uuid, duplicate boolean);
    END IF;
END
$type$;
{% endif %}

{{ m.rewinds_unit() }}

{{ m.unit(names.index_plain('ix', 'lease_start'), 'storage', version=1, object='index') }}
-- The own-messages probe: a worker's leases taken since this session last found it holding none
-- (dequeue). An index of its own, so that queues deployed before it gain it without a rebuild.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'lease_start') }}
ON {{ t }} (leased_by, leased_at)
WHERE leased_by IS NOT NULL;

{{ m.unit(names.plain('_dead'), 'storage', version=1, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids')) }}
-- Messages that used up max_attempts (a last fail, or a lease that expired once too often).
CREATE TABLE IF NOT EXISTS {{ dead_t }} (
    id {{ id_type }} NOT NULL,
    enqueued_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
{% if has_priority %}
    priority integer NOT NULL,
{% endif %}
{% if dedupe %}
    dedupe_key text,
{% endif %}
    attempts integer NOT NULL,
    last_error text,
    last_worker text,
    dead_at timestamptz NOT NULL,
    payload {{ payload_type }} NOT NULL,
    CONSTRAINT {{ names.index('pk', 'dead') }} PRIMARY KEY (id)
);
{% if history %}

{{ m.unit(names.plain('_history'), 'storage', version=1, object='table', shape=('payload', 'priority', 'client_ids')) }}
-- Completed messages; history_purge deletes by finish time.
CREATE TABLE IF NOT EXISTS {{ history_t }} (
    history_id bigint GENERATED ALWAYS AS IDENTITY,
    id {{ id_type }} NOT NULL,
    enqueued_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
{% if has_priority %}
    priority integer NOT NULL,
{% endif %}
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    duration_ms bigint NOT NULL,
    worker text NOT NULL,
    attempts integer NOT NULL,
    payload {{ payload_type }} NOT NULL,
    CONSTRAINT {{ names.index('pk', 'history') }} PRIMARY KEY (history_id)
);

CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'history_finished') }} ON {{ history_t }} (finished_at);

CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'history_id') }} ON {{ history_t }} (id);
{% endif %}

{{ m.ownership_unit(['', '_dead', '_rewinds'] + (['_history'] if history else []) + (['_enqueue_result'] if client_ids else [])) }}

{{ m.unit(names.plain('_enqueue'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('enqueue') }}(
    payload {{ payload_type }},
    due_at timestamptz DEFAULT NULL,
    dedupe_key text DEFAULT NULL{% if has_priority or client_ids %},{% endif %}

{% if has_priority %}
    priority integer DEFAULT NULL{% if client_ids %},{% endif %}

{% endif %}
{% if client_ids %}
    id uuid DEFAULT NULL,
    enqueued_at timestamptz DEFAULT NULL
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
BEGIN
{{ m.check_payload('enqueue') }}
{% if is_json %}
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
{% set columns = ('id, ' if client_ids else '') ~ 'enqueued_at, due_at, visible_at, ' ~ ('priority, ' if has_priority else '') ~ ('dedupe_key, ' if dedupe else '') ~ 'payload' %}
{% set values = ('coalesce(' ~ fn ~ '_enqueue.id, gen_random_uuid()), coalesce(' ~ fn ~ '_enqueue.enqueued_at, now_utc), ' if client_ids else 'now_utc, ') ~ 'coalesce(' ~ fn ~ '_enqueue.due_at, now_utc), coalesce(' ~ fn ~ '_enqueue.due_at, now_utc), ' ~ ('coalesce(' ~ fn ~ '_enqueue.priority, 0), ' if has_priority else '') ~ (fn ~ '_enqueue.dedupe_key, ' if dedupe else '') ~ fn ~ '_enqueue.payload' %}
{% if dedupe or client_ids %}
    -- ON CONFLICT waits for a racing insert of the same key{% if client_ids %} or id{% endif %}; if that row is gone again by the
    -- time we look it up (completed), try the insert once more.
    LOOP
        INSERT INTO {{ t }} AS m ({{ columns }})
        VALUES ({{ values }})
        ON CONFLICT DO NOTHING
        RETURNING m.id INTO new_id;
        IF new_id IS NOT NULL THEN
            RETURN QUERY SELECT new_id, false;
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
            RETURN QUERY SELECT new_id, true;
            RETURN;
        END IF;
    END LOOP;
{% else %}
    INSERT INTO {{ t }} AS m ({{ columns }})
    VALUES ({{ values }})
    RETURNING m.id INTO new_id;
    RETURN QUERY SELECT new_id, false;
{% endif %}
END;
$function$;

{{ m.grant('enqueue') }}

{{ m.unit(names.plain('_enqueue_batch'), 'code') }}
-- PostgreSQL has no table-valued parameters: items arrive as parallel arrays, position = ordinal.
-- The arrays an option does not use must be NULL (the same contract as the SQL Server TVP).
CREATE OR REPLACE FUNCTION {{ names.verb('enqueue_batch') }}(
    payloads {{ payload_type }}[],
    due_ats timestamptz[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL,
    priorities integer[] DEFAULT NULL,
    ids uuid[] DEFAULT NULL,
    enqueued_ats timestamptz[] DEFAULT NULL
)
RETURNS TABLE (ordinal integer, id {{ id_type }}, duplicate boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    item_count integer := coalesce(cardinality(payloads), 0);
    now_utc timestamptz := clock_timestamp();
    bad_ordinal integer;
{% if dedupe or client_ids %}
    new_ids {{ id_type }}[];
{% if client_ids %}
    -- seq (the claim order's tie-breaker) drawn in item order too: rows go in in key order.
    new_seqs bigint[];
{% endif %}
    inserted_ties bigint[] := '{}';
    step_ties bigint[];
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
    result_ids := array_fill(NULL::{{ id_type }}, ARRAY[item_count]);

    -- The firsts go in in {{ 'key' if dedupe else 'id' }} order: two batches that share {{ 'keys' if dedupe else 'ids' }} then wait for each other
    -- instead of deadlocking (each would hold one the other waits for).{% if dedupe and client_ids %} A client id given with
    -- different keys in two overlapping batches can still deadlock (two unique indexes have no common
    -- order); PostgreSQL then ends one batch with 40P01.{% endif %} ON CONFLICT skips one whose {{ 'key or id' if client_ids and dedupe else ('key' if dedupe else 'id') }}
    -- is queued already (waiting for a racing insert of it first). The loop runs again only for an
    -- item whose duplicate a racing transaction committed while this one waited and consumed before
    -- the look-up below: a duplicate that was queued when the insert began is reported as such even if
    -- it has been consumed since (offering it again could wait on a batch that waits on this one).
    LOOP
{% filter indent(4, first=true) %}
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
            e.enqueued_at
        FROM unnest(new_ids, payloads) WITH ORDINALITY AS u (new_id, payload, position)
{% if client_ids %}
        INNER JOIN unnest(new_seqs) WITH ORDINALITY AS s (new_seq, position) ON u.position = s.position
{% endif %}
        LEFT JOIN unnest(due_ats) WITH ORDINALITY AS d (due_at, position) ON u.position = d.position
        LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, position) ON u.position = k.position
        LEFT JOIN unnest(priorities) WITH ORDINALITY AS p (priority, position) ON u.position = p.position
        LEFT JOIN unnest(enqueued_ats) WITH ORDINALITY AS e (enqueued_at, position) ON u.position = e.position
        WHERE roots[u.position] = u.position AND result_ids[u.position] IS NULL
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
            id, {% if client_ids %}seq, {% endif %}enqueued_at, due_at, visible_at, {% if has_priority %}priority, {% endif %}{% if dedupe %}dedupe_key, {% endif %}payload
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
            i.payload
        FROM items AS i
        ORDER BY {{ insert_order | join(', ') }}
        ON CONFLICT DO NOTHING
        RETURNING m.{{ tie }}
    )

    SELECT
        (SELECT array_agg(n.{{ tie }}) FROM inserted AS n),
        (SELECT array_agg(q.position ORDER BY q.position) FROM queued AS q WHERE q.id IS NOT NULL),
        (SELECT array_agg(q.id ORDER BY q.position) FROM queued AS q WHERE q.id IS NOT NULL)
    INTO step_ties, queued_positions, queued_ids;
    inserted_ties := inserted_ties || coalesce(step_ties, '{}');

    -- A first's id: its own when its row went in; else the message now queued with its key{% if client_ids %} or id{% endif %} (a
    -- new statement sees what racing transactions committed while this one waited on them); else,
    -- when that message has been consumed since, the one the insert's own snapshot saw.
    result_ids := ARRAY(
        SELECT
            CASE
                WHEN roots[u.position] <> u.position OR result_ids[u.position] IS NOT NULL THEN result_ids[u.position]
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
{% endfilter %}
        EXIT WHEN NOT EXISTS (
            SELECT FROM unnest(result_ids, roots) WITH ORDINALITY AS r (result_id, root, position)
            WHERE r.root = r.position AND r.result_id IS NULL
        );
    END LOOP;

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
        INSERT INTO {{ t }} AS m (enqueued_at, due_at, visible_at, {% if has_priority %}priority, {% endif %}payload)
        SELECT
            now_utc,
            coalesce(u.due_at, now_utc),
            coalesce(u.due_at, now_utc),
{% if has_priority %}
            coalesce(u.priority, 0),
{% endif %}
            u.payload
        FROM unnest(payloads, due_ats{% if has_priority %}, priorities{% endif %}) WITH ORDINALITY
            AS u (payload, due_at, {% if has_priority %}priority, {% endif %}position)
        ORDER BY u.position
        RETURNING m.id
    )

    SELECT (row_number() OVER (ORDER BY i.id))::integer, i.id, false
    FROM inserted AS i
    ORDER BY i.id;
{% endif %}
END;
$function$;

{{ m.grant('enqueue_batch') }}

{{ m.unit(names.plain('_dequeue'), 'code') }}
-- A dequeue by worker W first takes back W's own unfinished messages: W declares, by asking, that
-- it holds nothing else. A worker name is therefore one single-threaded consumer at a time.
-- Claimed rows whose lease had already expired max_attempts times go to the dead-letter table
-- ('lease expired') instead of to the worker: the claim would be one attempt too many.
CREATE OR REPLACE FUNCTION {{ names.verb('dequeue') }}(
    batch_size integer DEFAULT 1,
    worker text DEFAULT NULL,
    lease_seconds integer DEFAULT NULL
)
RETURNS TABLE (id {{ id_type }}, payload {{ payload_type }}, enqueued_at timestamptz, due_at timestamptz, attempts integer)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    effective_lease integer := coalesce({{ fn }}_dequeue.lease_seconds, {{ lease_seconds }});
    lease_until timestamptz;
    claimed_ids {{ id_type }}[] := '{}';
    step_ids {{ id_type }}[];
    buried_count bigint;
    exhausted_ids {{ id_type }}[];
    exhausted_workers text[];
    remaining integer;
    -- '<time>|<worker>': when this session last found none of that worker's messages leased.
    -- Every lease the worker has taken since was taken at that time or later, so its own claim
    -- need not read back through the entries of the messages it has finished (docs/work-queue.md).
    own_state text := current_setting({{ m.position_setting('.own') }}, true);
    own_since timestamptz := '-infinity';
{% if has_priority %}
    current_level integer;
    level_ids {{ id_type }}[];
    level_buried bigint;
{% else %}
    own_count integer;
{{ m.position_declare(position_key, seen=false) }}
{% endif %}
BEGIN
{{ m.check_batch_size('dequeue') }}
{{ m.check_read_committed('dequeue') }}
{{ w.check_worker('dequeue') }}
{{ w.check_lease('dequeue', 'effective_lease') }}
    lease_until := now_utc + make_interval(secs => effective_lease);

    -- 1. Own messages first (leased, even unexpired: a restarted worker), on ix_{{ queue.name }}_lease_start.
    -- The probe has a cached plan; the claim it guards is planned on every call and is needed only
    -- after a restart. A worker name is one single-threaded consumer (contract), so no lease can
    -- come to this worker between the probe and the claim. `>=`: the claim below leases at the
    -- very time it records.
    IF own_state ~ '^{{ m.time_pattern() }}\|' AND substr(own_state, strpos(own_state, '|') + 1) = {{ fn }}_dequeue.worker THEN
        own_since := {{ m.text_to_time("split_part(own_state, '|', 1)") }};
    END IF;
    IF EXISTS (
        SELECT FROM {{ t }} AS m WHERE m.leased_by = {{ fn }}_dequeue.worker AND m.leased_at >= own_since
    ) THEN
{{ w.claim_statement("m.leased_by = " ~ fn ~ "_dequeue.worker AND m.leased_at >= own_since", "batch_size", own=true) | indent(4, first=true) }}
        claimed_ids := claimed_ids || coalesce(step_ids, '{}');
    ELSE
        PERFORM set_config({{ m.position_setting('.own') }}, {{ m.time_to_text('now_utc') }} || '|' || {{ fn }}_dequeue.worker, false);
    END IF;
    remaining := batch_size - cardinality(claimed_ids);

    -- 2. Visible messages (new, due, retried, or with an expired lease), on ix_{{ queue.name }}_claim.
    -- Two statements, never an OR (DESIGN.md §4). A row that goes to the dead-letter table frees
    -- its place in the batch, so claim again until the batch is full or nothing visible is left.
{% if has_priority %}
    -- Priority levels claim from the head of each level (no claim position: docs/work-queue.md).
{% else %}
    -- From this session's claim position (docs/queue-kinds.md, The claim position).
    own_count := cardinality(claimed_ids);
{{ m.position_load(position_key) }}
{% endif %}
    WHILE remaining > 0 LOOP
{% if has_priority %}
        -- A loose index scan: one range scan per priority level present. A single ORDER BY
        -- priority DESC would read past every delayed or leased row of the higher levels on each
        -- claim, and the whole index when nothing is ready.
        step_ids := '{}';
        buried_count := 0;
        current_level := (SELECT m.priority FROM {{ t }} AS m ORDER BY m.priority DESC LIMIT 1);
        WHILE current_level IS NOT NULL AND cardinality(step_ids) < remaining LOOP
{{ w.claim_by_limit("m.priority = current_level AND m.visible_at <= now_utc", "remaining - cardinality(step_ids)", "level_ids", "level_buried") | indent(8, first=true) }}
            step_ids := step_ids || coalesce(level_ids, '{}');
            buried_count := buried_count + level_buried;
            current_level := (
                SELECT m.priority FROM {{ t }} AS m WHERE m.priority < current_level ORDER BY m.priority DESC LIMIT 1
            );
        END LOOP;
{% else %}
{{ w.claim_by_limit(m.position_predicate(position_key) ~ " AND m.visible_at <= now_utc", "remaining") | indent(4, first=true) }}
{% endif %}
        claimed_ids := claimed_ids || coalesce(step_ids, '{}');
        remaining := batch_size - cardinality(claimed_ids);
        EXIT WHEN buried_count = 0;
    END LOOP;
{% if not has_priority %}
    IF cardinality(claimed_ids) > own_count THEN
{{ m.position_find(position_key) | indent(4, first=true) }}
    END IF;
{% endif %}

    -- In claim order: the array keeps it. One primary-key probe per claimed id: LIMIT 1 keeps the
    -- subquery from being merged into a join, which the cached plan (costing the array at ten ids)
    -- would run as a hash join over a sequential scan of a small queue, dead rows and all.
    RETURN QUERY
    SELECT m.id, m.payload, m.enqueued_at, m.due_at, m.attempts
    FROM unnest(claimed_ids) WITH ORDINALITY AS c (id, position)
    CROSS JOIN LATERAL (
        SELECT q.id, q.payload, q.enqueued_at, q.due_at, q.attempts
        FROM {{ t }} AS q
        WHERE q.id = c.id
        LIMIT 1
    ) AS m
    ORDER BY c.position;
END;
$function$;

{{ m.grant('dequeue') }}

{{ m.unit(names.plain('_complete'), 'code') }}
-- Only the holder of a live lease: a late complete after the lease moved on changes nothing.
CREATE OR REPLACE FUNCTION {{ names.verb('complete') }}(id {{ id_type }}, worker text)
RETURNS TABLE (completed boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    done_count bigint;
BEGIN
{{ w.check_worker('complete') }}
{% if history %}
    -- One statement: queue table, then history table (the fixed lock order).
    WITH done AS (
        DELETE FROM {{ t }} AS m
        WHERE m.id = {{ fn }}_complete.id AND m.leased_by = {{ fn }}_complete.worker AND m.visible_at > now_utc
        RETURNING m.id, m.enqueued_at, m.due_at, {% if has_priority %}m.priority, {% endif %}m.leased_at, m.leased_by, m.attempts, m.payload
    ),

    kept AS (
        INSERT INTO {{ history_t }} (
            id, enqueued_at, due_at, {% if has_priority %}priority, {% endif %}started_at, finished_at, duration_ms, worker, attempts, payload
        )
        SELECT
            d.id,
            d.enqueued_at,
            d.due_at,
{% if has_priority %}
            d.priority,
{% endif %}
            d.leased_at,
            now_utc,
            (extract(EPOCH FROM now_utc - d.leased_at) * 1000)::bigint,
            d.leased_by,
            d.attempts,
            d.payload
        FROM done AS d
        RETURNING 1
    )

    SELECT count(*) INTO done_count FROM kept;
{% else %}
    DELETE FROM {{ t }} AS m
    WHERE m.id = {{ fn }}_complete.id AND m.leased_by = {{ fn }}_complete.worker AND m.visible_at > now_utc;
    GET DIAGNOSTICS done_count = ROW_COUNT;
{% endif %}
    IF done_count = 0 THEN
{{ w.lost_under_snapshot('complete') }}
    END IF;
    RETURN QUERY SELECT done_count > 0;
END;
$function$;

{{ m.grant('complete') }}

{{ m.unit(names.plain('_fail'), 'code') }}
-- With attempts left: release the lease, visible again after retry_after_seconds. On the last
-- attempt: to the dead-letter table with the error. outcome: retrying | dead | lost (the caller's
-- lease had expired or moved on: nothing changed).
CREATE OR REPLACE FUNCTION {{ names.verb('fail') }}(
    id {{ id_type }},
    worker text,
    error text DEFAULT NULL,
    retry_after_seconds integer DEFAULT NULL
)
RETURNS TABLE (outcome text)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    retry_after integer := coalesce({{ fn }}_fail.retry_after_seconds, 0);
    changed bigint;
BEGIN
{{ w.check_worker('fail') }}
    IF retry_after NOT BETWEEN 0 AND 2592000 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_fail') ~ ": retry_after_seconds must be between 0 and 2592000, got %s.', retry_after)") }}
    END IF;

    UPDATE {{ t }} AS m
    SET
        leased_by = NULL,
        visible_at = now_utc + make_interval(secs => retry_after),
        last_error = left({{ fn }}_fail.error, 4000)
    WHERE
        m.id = {{ fn }}_fail.id AND m.leased_by = {{ fn }}_fail.worker AND m.visible_at > now_utc
        AND m.attempts < {{ max_attempts }};
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed > 0 THEN
        RETURN QUERY SELECT 'retrying'::text;
        RETURN;
    END IF;

{{ w.bury("m.id = " ~ fn ~ "_fail.id AND m.leased_by = " ~ fn ~ "_fail.worker AND m.visible_at > now_utc", "g.attempts", "left(" ~ fn ~ "_fail.error, 4000)", "g.leased_by", "changed") }}
    IF changed = 0 THEN
{{ w.lost_under_snapshot('fail') }}
    END IF;
    RETURN QUERY SELECT CASE WHEN changed > 0 THEN 'dead' ELSE 'lost' END;
END;
$function$;

{{ m.grant('fail') }}

{{ m.unit(names.plain('_extend_lease'), 'code') }}
-- The new lease runs from now; an expired lease cannot be revived (another worker may have it).
CREATE OR REPLACE FUNCTION {{ names.verb('extend_lease') }}(
    id {{ id_type }},
    worker text,
    lease_seconds integer DEFAULT NULL
)
RETURNS TABLE (extended boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    effective_lease integer := coalesce({{ fn }}_extend_lease.lease_seconds, {{ lease_seconds }});
    changed bigint;
BEGIN
{{ w.check_worker('extend_lease') }}
{{ w.check_lease('extend_lease', 'effective_lease') }}
    UPDATE {{ t }} AS m
    SET visible_at = now_utc + make_interval(secs => effective_lease)
    WHERE m.id = {{ fn }}_extend_lease.id AND m.leased_by = {{ fn }}_extend_lease.worker AND m.visible_at > now_utc;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
{{ w.lost_under_snapshot('extend_lease') }}
    END IF;
    RETURN QUERY SELECT changed > 0;
END;
$function$;

{{ m.grant('extend_lease') }}

{{ m.unit(names.plain('_stats'), 'code') }}
-- ready: visible_at <= now (new, due, retried, or with an expired lease: all claimable);
-- delayed: not yet due and not leased; in_flight: under a live lease; dead: in S.Q_dead.
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
    -- Every count stops at exact_limit rows and reads only an index range that the count matches;
    -- past the limit the planner's row estimate stands in, so a deep queue never costs a full scan.
    exact_limit constant bigint := 10000;
    now_utc timestamptz := clock_timestamp();
    ready_count bigint := 0;
    delayed_count bigint := 0;
    in_flight_count bigint;
    dead_count bigint;
    total_estimate bigint;
    is_estimate boolean := false;
    oldest_ready timestamptz;
{% if has_priority %}
    current_level integer;
    level_oldest timestamptz;
{% endif %}
BEGIN
{% if has_priority %}
    -- One priority level at a time, as the claim reads the index.
    current_level := (SELECT m.priority FROM {{ t }} AS m ORDER BY m.priority DESC LIMIT 1);
    WHILE current_level IS NOT NULL AND ready_count <= exact_limit AND delayed_count <= exact_limit LOOP
        ready_count := ready_count + (SELECT count(*) FROM (
            SELECT 1 FROM {{ t }} AS m
            WHERE m.priority = current_level AND m.visible_at <= now_utc
            LIMIT exact_limit + 1 - ready_count
        ) AS counted);
        delayed_count := delayed_count + (SELECT count(*) FROM (
            SELECT 1 FROM {{ t }} AS m
            WHERE m.priority = current_level AND m.visible_at > now_utc AND m.leased_by IS NULL
            LIMIT exact_limit + 1 - delayed_count
        ) AS counted);
        level_oldest := (
            SELECT m.visible_at FROM {{ t }} AS m
            WHERE m.priority = current_level AND m.visible_at <= now_utc
            ORDER BY m.visible_at, m.{{ tie }}
            LIMIT 1
        );
        oldest_ready := least(oldest_ready, level_oldest);
        current_level := (SELECT m.priority FROM {{ t }} AS m WHERE m.priority < current_level ORDER BY m.priority DESC LIMIT 1);
    END LOOP;
{% else %}
    SELECT count(*) INTO ready_count FROM (
        SELECT 1 FROM {{ t }} AS m WHERE m.visible_at <= now_utc LIMIT exact_limit + 1
    ) AS counted;
    -- The range past now also holds the in-flight rows: few, as many as leases held.
    SELECT count(*) INTO delayed_count FROM (
        SELECT 1 FROM {{ t }} AS m WHERE m.visible_at > now_utc AND m.leased_by IS NULL LIMIT exact_limit + 1
    ) AS counted;
    SELECT m.visible_at INTO oldest_ready
    FROM {{ t }} AS m
    WHERE m.visible_at <= now_utc
    ORDER BY m.visible_at, m.{{ tie }}
    LIMIT 1;
{% endif %}
    SELECT count(*) INTO in_flight_count FROM (
        SELECT 1 FROM {{ t }} AS m WHERE m.leased_by IS NOT NULL AND m.visible_at > now_utc LIMIT exact_limit + 1
    ) AS counted;
    SELECT count(*) INTO dead_count FROM (
        SELECT 1 FROM {{ dead_t }} AS d LIMIT exact_limit + 1
    ) AS counted;

    IF ready_count > exact_limit OR delayed_count > exact_limit OR in_flight_count > exact_limit THEN
        is_estimate := true;
        total_estimate := {{ w.row_estimate(t) }};
        IF ready_count > exact_limit THEN
            ready_count := greatest(ready_count, total_estimate - delayed_count - in_flight_count);
        ELSIF delayed_count > exact_limit THEN
            delayed_count := greatest(delayed_count, total_estimate - ready_count - in_flight_count);
        ELSE
            in_flight_count := greatest(in_flight_count, total_estimate - ready_count - delayed_count);
        END IF;
    END IF;
    IF dead_count > exact_limit THEN
        is_estimate := true;
        dead_count := greatest(dead_count, {{ w.row_estimate(dead_t) }});
    END IF;

    RETURN QUERY SELECT
        ready_count,
        delayed_count,
        in_flight_count,
        dead_count,
        extract(EPOCH FROM now_utc - oldest_ready)::double precision,
        is_estimate;
END;
$function$;

{{ m.grant('stats') }}

{{ m.unit(names.plain('_purge'), 'code') }}
-- Removes queue messages (leased ones too: their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR REPLACE FUNCTION {{ names.verb('purge') }}(
    older_than timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL
)
RETURNS TABLE (purged bigint)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    purged_count bigint;
BEGIN
{{ m.check_max_rows('purge') }}
    -- SKIP LOCKED leaves the rows a claim holds right now. Oldest first; LIMIT NULL is no limit.
    WITH doomed AS (
        SELECT m.id FROM {{ t }} AS m
        WHERE {{ fn }}_purge.older_than IS NULL OR m.enqueued_at < {{ fn }}_purge.older_than
{% if client_ids %}
        -- In claim order, along the claim index: no index leads on seq.
        ORDER BY {% if has_priority %}m.priority DESC, {% endif %}m.visible_at, m.seq
{% else %}
        ORDER BY m.id
{% endif %}
        LIMIT {{ fn }}_purge.max_rows
        FOR UPDATE SKIP LOCKED
    ),

    deleted AS (
        DELETE FROM {{ t }} AS m USING doomed AS d WHERE m.id = d.id RETURNING 1
    )

    SELECT count(*) INTO purged_count FROM deleted;
    RETURN QUERY SELECT purged_count;
END;
$function$;

{{ m.grant('purge') }}

{{ m.unit(names.plain('_dead_list'), 'code') }}
-- Paged by id: pass the last id of a page as after_id to read the next one. (page_size, not
-- `limit`: a reserved word in PostgreSQL would need quoting at every call.)
CREATE OR REPLACE FUNCTION {{ names.verb('dead_list') }}(
    after_id {{ id_type }} DEFAULT NULL,
    page_size integer DEFAULT 100
)
RETURNS TABLE (
    id {{ id_type }},
    payload {{ payload_type }},
    enqueued_at timestamptz,
    due_at timestamptz,
{% if has_priority %}
    priority integer,
{% endif %}
{% if dedupe %}
    dedupe_key text,
{% endif %}
    attempts integer,
    last_error text,
    last_worker text,
    dead_at timestamptz
)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
BEGIN
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_dead_list') ~ ": page_size must be between 1 and 1000, got %s.', coalesce(page_size::text, 'NULL'))") }}
    END IF;
    RETURN QUERY
    SELECT
        d.id,
        d.payload,
        d.enqueued_at,
        d.due_at,
{% if has_priority %}
        d.priority,
{% endif %}
{% if dedupe %}
        d.dedupe_key,
{% endif %}
        d.attempts,
        d.last_error,
        d.last_worker,
        d.dead_at
    FROM {{ dead_t }} AS d
    WHERE {{ fn }}_dead_list.after_id IS NULL OR d.id > {{ fn }}_dead_list.after_id
    ORDER BY d.id
    LIMIT page_size;
END;
$function$;

{{ m.grant('dead_list') }}

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
{% if dedupe or client_ids %}
    moved bigint;
{% endif %}
BEGIN
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
{% set requeue_columns = 'id, enqueued_at, due_at, visible_at, ' ~ ('priority, ' if has_priority else '') ~ ('dedupe_key, ' if dedupe else '') ~ 'attempts, last_error, payload' %}
{% macro requeue_values(key_sql) %}
    VALUES (
        dead_row.id, dead_row.enqueued_at, dead_row.due_at, now_utc, {% if has_priority %}dead_row.priority, {% endif %}{% if dedupe %}{{ key_sql }}, {% endif %}0,
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
    DELETE FROM {{ dead_t }} AS d WHERE d.id = {{ fn }}_dead_requeue.id;
    RETURN QUERY SELECT true;
END;
$function$;

{{ m.grant('dead_requeue') }}

{{ m.unit(names.plain('_dead_delete'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('dead_delete') }}(id {{ id_type }})
RETURNS TABLE (deleted boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    removed bigint;
BEGIN
    DELETE FROM {{ dead_t }} AS d WHERE d.id = {{ fn }}_dead_delete.id;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed = 0 THEN
{{ m.throw('not_found', "format('" ~ names.plain('_dead_delete') ~ ": no dead-letter message with id %s.', " ~ fn ~ "_dead_delete.id)") }}
    END IF;
    RETURN QUERY SELECT true;
END;
$function$;

{{ m.grant('dead_delete') }}
{% if history %}

{{ m.unit(names.plain('_history_purge'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('history_purge') }}(
    older_than timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL
)
RETURNS TABLE (purged bigint)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    -- Default retention: history_retention_days ({{ opt.history_retention_days }}) days.
    cutoff timestamptz := coalesce(
        {{ fn }}_history_purge.older_than, clock_timestamp() - make_interval(days => {{ opt.history_retention_days }})
    );
    purged_count bigint;
BEGIN
{{ m.check_max_rows('history_purge') }}
    -- Oldest first; LIMIT NULL is no limit.
    DELETE FROM {{ history_t }} AS h
    WHERE h.history_id IN (
        SELECT o.history_id FROM {{ history_t }} AS o
        WHERE o.finished_at < cutoff
        ORDER BY o.finished_at
        LIMIT {{ fn }}_history_purge.max_rows
        -- A concurrent purge's rows are skipped, not waited for: a caller looping until a call
        -- purges fewer than max_rows must not stop early because another purge got there first.
        FOR UPDATE SKIP LOCKED
    );
    GET DIAGNOSTICS purged_count = ROW_COUNT;
    RETURN QUERY SELECT purged_count;
END;
$function$;

{{ m.grant('history_purge') }}
{% endif %}
{% if handler %}
{% set handler_parts = handler.split('.') if '.' in handler else [schema, handler] %}

{{ m.unit(names.plain('_process'), 'code') }}
-- The in-database worker (Darling's loop): claim one message and COMMIT (the attempt and the lease
-- are durable before the handler runs, so a session that dies mid-message still counts it), CALL
-- the handler, complete in the same transaction as the handler's own writes, COMMIT; or, when the
-- handler raises, roll its writes back and record its error with fail. Safe to run from many
-- sessions at once (each is its own worker, 'process:<backend pid>').
--
-- Unlike every function here it has no definer rights and no pinned search_path: PostgreSQL refuses
-- COMMIT in a procedure that has either (SQLSTATE 2D000). Nothing is lost by it: the procedure
-- touches no table itself; it calls the definer functions dequeue / complete / fail, so its
-- caller needs EXECUTE on those (S_consumer) and on the handler. It runs with the caller's rights,
-- so the caller's search_path can only mislead the caller; the routines it calls are
-- schema-qualified all the same.
CREATE OR REPLACE PROCEDURE {{ names.verb('process') }}(
    time_budget_seconds integer DEFAULT 60,
    INOUT processed bigint DEFAULT NULL,
    INOUT completed bigint DEFAULT NULL,
    INOUT failed bigint DEFAULT NULL
)
LANGUAGE plpgsql
AS $procedure$
#variable_conflict use_column
DECLARE
    worker_name text := 'process:' || pg_catalog.pg_backend_pid()::text;
    deadline timestamptz;
    message record;
    claimed boolean;
    lease_kept boolean;
    lease_lost boolean;
    outcome_text text;
    error_state text;
    error_text text;
    error_context text;
    transient_retries integer;
BEGIN
    -- It commits once per message, so it must not run inside a caller's transaction. A caller that
    -- has written something is refused here; a transaction block with nothing written yet is
    -- refused by PostgreSQL itself at the COMMIT below (2D000), before anything has been done:
    -- PL/pgSQL cannot ask whether its CALL is atomic.
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
{{ m.throw('in_transaction', "'" ~ names.plain('_process') ~ ": commits once per message and cannot run inside an open transaction.'") }}
    END IF;
    IF time_budget_seconds IS NULL OR time_budget_seconds NOT BETWEEN 1 AND 86400 THEN
{{ m.throw('invalid_argument', "pg_catalog.format('" ~ names.plain('_process') ~ ": time_budget_seconds must be between 1 and 86400, got %s.', coalesce(time_budget_seconds::text, 'NULL'))") }}
    END IF;
    COMMIT;
    -- Every transaction this procedure begins, right after each COMMIT, before any query.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_proc AS p
        INNER JOIN pg_catalog.pg_namespace AS n ON p.pronamespace = n.oid
        WHERE n.nspname = '{{ handler_parts[0] }}' AND p.proname = '{{ handler_parts[1] }}' AND p.prokind = 'p'
    ) THEN
{{ m.throw('no_handler', "'" ~ names.plain('_process') ~ ": handler procedure " ~ handler_parts[0] ~ "." ~ handler_parts[1] ~ " does not exist.'") }}
    END IF;

    processed := 0;
    completed := 0;
    failed := 0;
    deadline := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => time_budget_seconds);
    -- A deadlock, a lock timeout or a serialization failure says nothing about a message: whether in
    -- the claim, in the handler or in recording a failure, the step runs again after a short random
    -- pause (so that it does not meet the same peer at once), up to 3 times, without spending an
    -- attempt. Any other error of the handler is recorded with fail. Every transaction this procedure
    -- begins is READ COMMITTED, whatever the session's default (dequeue refuses any other level):
    -- SET TRANSACTION must come before any query of the transaction, so it follows each COMMIT.
    WHILE pg_catalog.clock_timestamp() < deadline LOOP
{% filter indent(8, first=true) %}
{% call w.retry_transient() %}
SELECT d.id, d.payload INTO message
FROM {{ names.verb('dequeue') }}(batch_size => 1, worker => worker_name) AS d;
claimed := FOUND;
{% endcall %}
{% endfilter %}

        EXIT WHEN NOT claimed;
        COMMIT;
        SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
        processed := processed + 1;
        transient_retries := 0;

        LOOP
            lease_lost := false;
            BEGIN
                EXECUTE pg_catalog.format('CALL %I.%I($1, $2)', '{{ handler_parts[0] }}', '{{ handler_parts[1] }}')
                USING message.id, message.payload;
                SELECT c.completed INTO lease_kept
                FROM {{ names.verb('complete') }}(id => message.id, worker => worker_name) AS c;
                IF NOT lease_kept THEN
                    -- The lease expired under the handler and may be another worker's now: undo the
                    -- handler's writes (this block's subtransaction), the message runs again elsewhere.
                    lease_lost := true;
                    RAISE EXCEPTION 'lease lost';
                END IF;
                completed := completed + 1;
                EXIT;
            EXCEPTION WHEN OTHERS THEN
                EXIT WHEN lease_lost;
                GET STACKED DIAGNOSTICS
                    error_state = RETURNED_SQLSTATE, error_text = MESSAGE_TEXT, error_context = PG_EXCEPTION_CONTEXT;
                IF error_state IN ('40P01', '55P03', '40001') AND transient_retries < 3 THEN
                    transient_retries := transient_retries + 1;
                    {{ w.transient_pause() }}
                    CONTINUE;
                END IF;
                -- The SQLSTATE, where it was raised (the innermost routine of the context, PL/pgSQL
                -- or SQL, with its line or statement) and the message.
                error_text := pg_catalog.format('SQLSTATE %s in %s: %s', error_state, coalesce(
                    pg_catalog.regexp_replace(
                        pg_catalog.substring(error_context, '(?:^|\n)((?:PL/pgSQL|SQL) function [^\n]*)'),
                        '^PL/pgSQL function ', ''
                    ),
                    pg_catalog.split_part(error_context, E'\n', 1)
                ), error_text);
{% filter indent(16, first=true) %}
{% call w.retry_transient() %}
SELECT f.outcome INTO outcome_text
FROM {{ names.verb('fail') }}(
    id => message.id, worker => worker_name, error => error_text, retry_after_seconds => 0
) AS f;
{% endcall %}
{% endfilter %}

                IF outcome_text <> 'lost' THEN
                    failed := failed + 1;
                END IF;
                EXIT;
            END;
        END LOOP;
        COMMIT;
        SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    END LOOP;
END;
$procedure$;

{{ m.grant('process', 'PROCEDURE') }}
{% endif %}
