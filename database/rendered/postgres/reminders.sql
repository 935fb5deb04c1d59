-- tablequeue 0.2.0 | generated: do not edit
-- template: postgres/pending.sql | dialect: postgres | kind: pending | queue: queue.reminders
-- tablequeue:unit queue.reminders storage v1 table
-- tablequeue:shape kind=pending payload=json dedupe=on

CREATE TABLE IF NOT EXISTS "queue"."reminders" (
    id bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME "queue"."reminders_id_seq"),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    due_at timestamptz NOT NULL,
    dedupe_key text CONSTRAINT "ck_reminders_dedupe_key" CHECK (length(dedupe_key) <= 200),
    payload jsonb NOT NULL,
    -- SQL Server's ISJSON (2017-2019) only takes an object or an array; so does this twin.
    CONSTRAINT "ck_reminders_payload_json" CHECK (jsonb_typeof(payload) IN ('object', 'array')),
    CONSTRAINT "pk_reminders" PRIMARY KEY (id)
)
-- A queue's table is mostly dead rows: vacuum after a fixed number of them rather than a fraction
-- of the (small) live count, so index scans from the head do not wade through dead entries.
WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);

-- The claim's exact WHERE/ORDER BY: a range scan from the earliest due row.
CREATE INDEX IF NOT EXISTS "ix_reminders_due" ON "queue"."reminders" (due_at, id);

CREATE UNIQUE INDEX IF NOT EXISTS "ux_reminders_dedupe"
ON "queue"."reminders" (dedupe_key)
WHERE dedupe_key IS NOT NULL;

-- tablequeue:unit queue.reminders_rewinds storage v1 sequence
-- tablequeue:shape kind=pending

-- Moved by every enqueue whose due time has already passed (docs/queue-kinds.md, The claim position).
CREATE SEQUENCE IF NOT EXISTS "queue"."reminders_rewinds";

-- tablequeue:unit queue.reminders_ownership code

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
            n.nspname = 'queue'
            AND c.relname IN ('reminders', 'reminders_rewinds')
            AND c.relkind IN ('r', 'p', 'S', 'c')
            AND c.relowner <> (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'queue_owner')
            AND (c.relkind <> 'S' OR NOT EXISTS (
                SELECT FROM pg_catalog.pg_depend AS d
                WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')
            ))
    LOOP
        EXECUTE pg_catalog.format(
            'ALTER %s %s OWNER TO %I',
            CASE relation.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'c' THEN 'TYPE' ELSE 'TABLE' END,
            relation.name,
            'queue_owner'
        );
    END LOOP;
END
$ownership$;

-- tablequeue:unit queue.reminders_enqueue code

CREATE OR REPLACE FUNCTION "queue"."reminders_enqueue"(
    payload jsonb,
    due_at timestamptz DEFAULT NULL,
    dedupe_key text DEFAULT NULL
)
RETURNS TABLE (id bigint, duplicate boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    new_id bigint;
BEGIN
    IF payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ002', MESSAGE = 'queue.reminders_enqueue: payload must not be NULL.';
    END IF;
    IF jsonb_typeof(reminders_enqueue.payload) NOT IN ('object', 'array') THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ002', MESSAGE = 'queue.reminders_enqueue: payload must be a JSON object or array.';
    END IF;
    IF reminders_enqueue.due_at < clock_timestamp() - interval '1 second' THEN
        -- Due over a second ago: it sorts before the consumers' claim positions, which must start again.
        PERFORM nextval('"queue"."reminders_rewinds"');
    END IF;
    IF length(dedupe_key) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.reminders_enqueue: dedupe_key is longer than 200 characters.';
    END IF;
    -- ON CONFLICT waits for a racing insert of the same key and then does nothing; the row is looked
    -- up in a new statement, which sees it. If it is gone again by then (dequeued), insert again.
    LOOP
        INSERT INTO "queue"."reminders" AS m (due_at, dedupe_key, payload)
        VALUES (coalesce(reminders_enqueue.due_at, clock_timestamp()), reminders_enqueue.dedupe_key, reminders_enqueue.payload)
        ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING m.id INTO new_id;
        IF new_id IS NOT NULL THEN
            id := new_id;
            duplicate := false;
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT m.id INTO new_id FROM "queue"."reminders" AS m WHERE m.dedupe_key = reminders_enqueue.dedupe_key;
        IF new_id IS NOT NULL THEN
            id := new_id;
            duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
END;
$function$;

ALTER FUNCTION "queue"."reminders_enqueue" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."reminders_enqueue" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."reminders_enqueue" TO "queue_producer";

-- tablequeue:unit queue.reminders_enqueue_batch code

-- PostgreSQL has no table-valued parameters: items arrive as parallel arrays, position = ordinal.
CREATE OR REPLACE FUNCTION "queue"."reminders_enqueue_batch"(
    payloads jsonb[],
    due_ats timestamptz[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL
)
RETURNS TABLE (ordinal integer, id bigint, duplicate boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    item_count integer := coalesce(cardinality(payloads), 0);
    bad_ordinal integer;
    new_ids bigint[];
    roots integer[];
    result_ids bigint[];
    inserted_ids bigint[];
    queued_ordinals bigint[];
    queued_ids bigint[];
BEGIN
    IF item_count > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.reminders_enqueue_batch: at most 1000 items per call, got %s.', item_count);
    END IF;
    IF due_ats IS NOT NULL AND cardinality(due_ats) <> item_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.reminders_enqueue_batch: due_ats has %s elements but payloads has %s.', cardinality(due_ats), item_count);
    END IF;
    IF dedupe_keys IS NOT NULL AND cardinality(dedupe_keys) <> item_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.reminders_enqueue_batch: dedupe_keys has %s elements but payloads has %s.', cardinality(dedupe_keys), item_count);
    END IF;
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest(payloads) WITH ORDINALITY AS u (payload, ordinal)
    WHERE u.payload IS NULL OR jsonb_typeof(u.payload) NOT IN ('object', 'array');
    IF bad_ordinal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ002', MESSAGE = format('queue.reminders_enqueue_batch: item %s has a NULL or non-object/array JSON payload.', bad_ordinal);
    END IF;
    IF EXISTS (SELECT FROM unnest(due_ats) AS u (due_at) WHERE u.due_at < clock_timestamp() - interval '1 second') THEN
        -- Due over a second ago: it sorts before the consumers' claim positions, which must start again.
        PERFORM nextval('"queue"."reminders_rewinds"');
    END IF;
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest(dedupe_keys) WITH ORDINALITY AS u (dedupe_key, ordinal)
    WHERE length(u.dedupe_key) > 200;
    IF bad_ordinal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.reminders_enqueue_batch: item %s has a dedupe_key over 200 characters.', bad_ordinal);
    END IF;

    -- Ids are drawn in item order first, so each item knows its id whether or not it is inserted,
    -- and a batch is dequeued in item order.
    new_ids := ARRAY(SELECT nextval('"queue"."reminders_id_seq"') FROM generate_series(1, item_count));
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
    LOOP
        BEGIN
            WITH items AS (
                SELECT
                    u.new_id,
                    u.due_at,
                    u.dedupe_key,
                    u.payload,
                    u.ordinal
                FROM unnest(new_ids, payloads, due_ats, dedupe_keys) WITH ORDINALITY
                    AS u (new_id, payload, due_at, dedupe_key, ordinal)
                WHERE roots[u.ordinal] = u.ordinal
            ),

            queued AS (
                SELECT
                    i.ordinal,
                    m.id
                FROM items AS i
                INNER JOIN "queue"."reminders" AS m ON i.dedupe_key = m.dedupe_key
            ),

            inserted AS (
                INSERT INTO "queue"."reminders" AS m (id, due_at, dedupe_key, payload)
                OVERRIDING SYSTEM VALUE
                SELECT
                    i.new_id,
                    coalesce(i.due_at, clock_timestamp()),
                    i.dedupe_key,
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
                        ELSE coalesce((SELECT m.id FROM "queue"."reminders" AS m WHERE m.dedupe_key = k.dedupe_key), q.id)
                    END
                FROM unnest(new_ids) WITH ORDINALITY AS u (new_id, ordinal)
                LEFT JOIN unnest(inserted_ids) AS own (id) ON u.new_id = own.id
                LEFT JOIN unnest(queued_ordinals, queued_ids) AS q (ordinal, id) ON u.ordinal = q.ordinal
                LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, ordinal) ON u.ordinal = k.ordinal
                ORDER BY u.ordinal
            );
            IF EXISTS (SELECT FROM unnest(result_ids, roots) WITH ORDINALITY AS r (result_id, root, ordinal) WHERE r.root = r.ordinal AND r.result_id IS NULL) THEN
                RAISE EXCEPTION USING ERRCODE = 'TQ900', MESSAGE = 'a key to offer again: the batch goes in again';
            END IF;
            EXIT;
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            -- Rolled back: no key of this batch is held any more; the next round starts from the lowest.
            NULL;
        END;
    END LOOP;

    -- A later item duplicates its first: it reports the first's id.
    RETURN QUERY
    SELECT
        u.ordinal::integer,
        result_ids[roots[u.ordinal]],
        own.id IS NULL
    FROM unnest(new_ids) WITH ORDINALITY AS u (new_id, ordinal)
    LEFT JOIN unnest(inserted_ids) AS own (id) ON u.new_id = own.id
    ORDER BY u.ordinal;
END;
$function$;

ALTER FUNCTION "queue"."reminders_enqueue_batch" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."reminders_enqueue_batch" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."reminders_enqueue_batch" TO "queue_producer";

-- tablequeue:unit queue.reminders_dequeue code

CREATE OR REPLACE FUNCTION "queue"."reminders_dequeue"(batch_size integer DEFAULT 1)
RETURNS TABLE (id bigint, payload jsonb, enqueued_at timestamptz, due_at timestamptz)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    -- A variable, not clock_timestamp() in the WHERE: a volatile function cannot bound an index
    -- scan, and the claim would read every not-yet-due row before finding out none is due.
    now_utc timestamptz := clock_timestamp();
    -- The first key at or after the position still visible to a one-message claim (position_seen).
    seen_time timestamptz;
    seen_id bigint;
    position_time timestamptz;
    -- A function call, not a query of the sequence: no executor start-up on every call.
    rewinds bigint := coalesce(pg_sequence_last_value('"queue"."reminders_rewinds"'::regclass), 0);
    -- '<found again after, epoch seconds>|<rewinds>|<tie-breaker>|<time>' (see position_load).
    position_state text := current_setting('tablequeue.queue.reminders', true);
    position_expires numeric;
    position_id bigint;
BEGIN
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.reminders_dequeue: batch_size must be between 1 and 1000, got %s.', coalesce(batch_size::text, 'NULL'));
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ008', MESSAGE = format('queue.reminders_dequeue: runs only at READ COMMITTED, and this transaction is %s.', upper(current_setting('transaction_isolation')));
    END IF;
    -- A value this function did not write (set by hand: any text) is ignored, not cast into an error.
    IF NOT (position_state ~ '^[0-9]+(\.[0-9]+)?\|[0-9]+\|[0-9]+\|(-?[0-9]+)?$' AND length(split_part(position_state, '|', 1)) <= 22 AND length(split_part(position_state, '|', 2)) <= 18 AND length(split_part(position_state, '|', 3)) <= 18
        AND length(split_part(position_state, '|', 4)) <= 17) THEN
        position_state := '';
    END IF;
    IF position_state <> '' THEN
        position_expires := split_part(position_state, '|', 1)::numeric;
        IF position_expires <= extract(EPOCH FROM now_utc) OR position_expires > extract(EPOCH FROM now_utc) + 1 THEN
            position_state := '';
        END IF;
    END IF;
    IF position_state <> '' THEN
        IF split_part(position_state, '|', 2)::bigint = rewinds THEN
            position_id := split_part(position_state, '|', 3)::bigint;
            position_time := coalesce('epoch'::timestamptz + nullif(split_part(position_state, '|', 4), '')::bigint * interval '1 microsecond', '-infinity');
        END IF;
    END IF;
    IF position_id IS NULL THEN
        position_expires := extract(EPOCH FROM now_utc) + 1;
        position_id := 0;
        position_time := '-infinity';
        SELECT m.due_at, m.id
        INTO position_time, position_id
        FROM "queue"."reminders" AS m
        WHERE (m.due_at, m.id) >= (position_time, position_id)
        ORDER BY m.due_at, m.id
        LIMIT 1;
        IF position_id IS NULL OR position_time > now_utc THEN
            position_time := now_utc;
            position_id := 0;
        END IF;
        position_state := set_config('tablequeue.queue.reminders', position_expires || '|' || rewinds || '|' || position_id || '|' || CASE WHEN isfinite(position_time) THEN (extract(EPOCH FROM position_time) * 1000000)::bigint::text ELSE '' END, false);
    END IF;

    -- Batch size 1 has its own statement with a literal LIMIT. PL/pgSQL caches one plan per
    -- statement, and the generic plan of `LIMIT batch_size` (costed for an unknown limit) is a sort
    -- of the whole queue, so that statement is planned again on every call; with LIMIT 1 the generic
    -- plan is the index scan and is kept for the session (docs/BENCHMARKS.md, The ceiling). It also
    -- finds the next claim position itself, where a batch reads it again after the claim.
    IF batch_size = 1 THEN
        WITH next_messages AS (
            SELECT m.id
            FROM "queue"."reminders" AS m
            WHERE (m.due_at, m.id) >= (position_time, position_id) AND m.due_at <= now_utc
            ORDER BY m.due_at, m.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ),

        claimed AS (
            DELETE FROM "queue"."reminders" AS m
            USING next_messages AS n
            WHERE m.id = n.id
            RETURNING m.id, m.payload, m.enqueued_at, m.due_at
        )

        SELECT c.id, c.payload, c.enqueued_at, c.due_at, seen.due_at, seen.id
        INTO id, payload, enqueued_at, due_at, seen_time, seen_id
        FROM claimed AS c
        LEFT JOIN LATERAL (
            SELECT m.due_at, m.id
            FROM "queue"."reminders" AS m
            WHERE (m.due_at, m.id) >= (position_time, position_id) AND m.due_at <= c.due_at
            ORDER BY m.due_at, m.id
            LIMIT 1
        ) AS seen ON true;
        IF FOUND THEN
            IF seen_id <> reminders_dequeue.id THEN
                position_time := seen_time;
                position_id := seen_id;
            ELSE
                -- The claimed key as the claim's snapshot saw it (seen_time): under EvalPlanQual (a fail or
                -- release committed between the claim's snapshot and its row lock) the claim returns the row's
                -- latest version, whose key may lie later, past rows the snapshot sees before it. NULL when
                -- that version lay outside the lateral's bound: then nothing lay between.
                position_time := coalesce(seen_time, reminders_dequeue.due_at);
                position_id := reminders_dequeue.id + 1;
            END IF;
            position_state := set_config('tablequeue.queue.reminders', position_expires || '|' || rewinds || '|' || position_id || '|' || CASE WHEN isfinite(position_time) THEN (extract(EPOCH FROM position_time) * 1000000)::bigint::text ELSE '' END, false);
            RETURN NEXT;
        END IF;
    ELSE
        RETURN QUERY
        WITH next_messages AS (
            SELECT m.id
            FROM "queue"."reminders" AS m
            WHERE (m.due_at, m.id) >= (position_time, position_id) AND m.due_at <= now_utc
            ORDER BY m.due_at, m.id
            LIMIT batch_size
            FOR UPDATE SKIP LOCKED
        ),

        claimed AS (
            DELETE FROM "queue"."reminders" AS m
            WHERE m.id = ANY(ARRAY(SELECT n.id FROM next_messages AS n))
            RETURNING m.id, m.payload, m.enqueued_at, m.due_at
        )

        SELECT c.id, c.payload, c.enqueued_at, c.due_at
        FROM claimed AS c
        ORDER BY c.due_at, c.id;
        IF FOUND THEN
            SELECT m.due_at, m.id
            INTO position_time, position_id
            FROM "queue"."reminders" AS m
            WHERE (m.due_at, m.id) >= (position_time, position_id)
            ORDER BY m.due_at, m.id
            LIMIT 1;
            IF position_id IS NULL OR position_time > now_utc THEN
                position_time := now_utc;
                position_id := 0;
            END IF;
            position_state := set_config('tablequeue.queue.reminders', position_expires || '|' || rewinds || '|' || position_id || '|' || CASE WHEN isfinite(position_time) THEN (extract(EPOCH FROM position_time) * 1000000)::bigint::text ELSE '' END, false);
        END IF;
    END IF;
END;
$function$;

ALTER FUNCTION "queue"."reminders_dequeue" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."reminders_dequeue" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."reminders_dequeue" TO "queue_consumer";

-- tablequeue:unit queue.reminders_stats code

CREATE OR REPLACE FUNCTION "queue"."reminders_stats"()
RETURNS TABLE (
    ready bigint,
    delayed bigint,
    in_flight bigint,
    dead bigint,
    oldest_ready_age_seconds double precision,
    estimated boolean
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
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
        SELECT 1 FROM "queue"."reminders" AS m
        WHERE m.due_at <= now_utc
        LIMIT exact_limit + 1
    ) AS counted;
    SELECT count(*) INTO delayed_count FROM (
        SELECT 1 FROM "queue"."reminders" AS m WHERE m.due_at > now_utc LIMIT exact_limit + 1
    ) AS counted;
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
        WHERE c.oid = '"queue"."reminders"'::regclass;
        IF ready_count > exact_limit THEN
            ready_count := greatest(ready_count, total_estimate - delayed_count);
        ELSE
            delayed_count := greatest(delayed_count, total_estimate - ready_count);
        END IF;
    END IF;

    SELECT m.due_at INTO oldest_ready
    FROM "queue"."reminders" AS m
    WHERE m.due_at <= now_utc
    ORDER BY m.due_at, m.id
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

ALTER FUNCTION "queue"."reminders_stats" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."reminders_stats" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."reminders_stats" TO "queue_admin";

-- tablequeue:unit queue.reminders_purge code

CREATE OR REPLACE FUNCTION "queue"."reminders_purge"(
    older_than timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL
)
RETURNS TABLE (purged bigint)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    purged_count bigint;
BEGIN
    IF reminders_purge.max_rows < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.reminders_purge: max_rows must be at least 1, got %s.', reminders_purge.max_rows);
    END IF;
    IF reminders_purge.max_rows IS NULL AND pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.reminders_purge: max_rows is required in a transaction.';
    END IF;
    -- SKIP LOCKED leaves the rows a consumer is dequeuing right now, and never waits for them.
    -- Oldest first; LIMIT NULL is no limit.
    -- The doomed ids as an array, not a join: a generic plan (PL/pgSQL's own after a few calls, or
    -- plan_cache_mode) costs LIMIT max_rows at a tenth of the table and joins by hashing a sequential
    -- scan of all of it; an array is probed on the primary key whatever its size.
    IF reminders_purge.older_than IS NULL THEN
        WITH doomed AS (
            SELECT m.id FROM "queue"."reminders" AS m
            ORDER BY m.id
            LIMIT reminders_purge.max_rows
            FOR UPDATE SKIP LOCKED
        ),

        deleted AS (
            DELETE FROM "queue"."reminders" AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
        )

        SELECT count(*) INTO purged_count FROM deleted;
    ELSE
        WITH doomed AS (
            SELECT m.id FROM "queue"."reminders" AS m
            WHERE m.enqueued_at < reminders_purge.older_than
            ORDER BY m.id
            LIMIT reminders_purge.max_rows
            FOR UPDATE SKIP LOCKED
        ),

        deleted AS (
            DELETE FROM "queue"."reminders" AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
        )

        SELECT count(*) INTO purged_count FROM deleted;
    END IF;
    RETURN QUERY SELECT purged_count;
END;
$function$;

ALTER FUNCTION "queue"."reminders_purge" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."reminders_purge" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."reminders_purge" TO "queue_admin";

-- tablequeue:unit queue.reminders_wait_step code

-- One step of S.Q_wait: true when a message is ready that this session's dequeue would hand out
-- now; otherwise a sleep, then false, or NULL once wait_ms have passed since started_at. The sleep
-- is a quarter of the time waited so far, at least 5 ms and at most 50 ms: a message that comes
-- soon after a consumer started waiting wakes it within a few ms, while a consumer that stays idle
-- probes 20 times a second (each step costs a commit and a wake-up, not only the probe).
-- A row an open dequeue has locked is not ready: FOR KEY
-- SHARE SKIP LOCKED passes over it, as READPAST does on SQL Server; the weakest row lock there is,
-- on the one row found, which the caller's next COMMIT ends at once.
-- It reads from the session's claim position, as dequeue does, so an idle wait does not walk dead
-- index entries every step.
-- Everything but the COMMITs is here, with definer rights and a pinned search_path: PostgreSQL
-- refuses COMMIT in such a procedure (2D000), and the procedure, run with the caller's search_path,
-- evaluates no operator.
CREATE OR REPLACE FUNCTION "queue"."reminders_wait_step"(wait_ms integer, started_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
DECLARE
    now_utc timestamptz := clock_timestamp();
    deadline timestamptz;
    position_time timestamptz;
    -- A function call, not a query of the sequence: no executor start-up on every call.
    rewinds bigint := coalesce(pg_sequence_last_value('"queue"."reminders_rewinds"'::regclass), 0);
    -- '<found again after, epoch seconds>|<rewinds>|<tie-breaker>|<time>' (see position_load).
    position_state text := current_setting('tablequeue.queue.reminders', true);
    position_expires numeric;
    position_id bigint;
BEGIN
    IF wait_ms IS NULL OR wait_ms NOT BETWEEN 0 AND 20000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.reminders_wait: wait_ms must be between 0 and 20000, got %s.', coalesce(wait_ms::text, 'NULL'));
    END IF;
    deadline := started_at + make_interval(secs => wait_ms / 1000.0);
    -- A value this function did not write (set by hand: any text) is ignored, not cast into an error.
    IF NOT (position_state ~ '^[0-9]+(\.[0-9]+)?\|[0-9]+\|[0-9]+\|(-?[0-9]+)?$' AND length(split_part(position_state, '|', 1)) <= 22 AND length(split_part(position_state, '|', 2)) <= 18 AND length(split_part(position_state, '|', 3)) <= 18
        AND length(split_part(position_state, '|', 4)) <= 17) THEN
        position_state := '';
    END IF;
    IF position_state <> '' THEN
        position_expires := split_part(position_state, '|', 1)::numeric;
        IF position_expires <= extract(EPOCH FROM now_utc) OR position_expires > extract(EPOCH FROM now_utc) + 1 THEN
            position_state := '';
        END IF;
    END IF;
    IF position_state <> '' THEN
        IF split_part(position_state, '|', 2)::bigint = rewinds THEN
            position_id := split_part(position_state, '|', 3)::bigint;
            position_time := coalesce('epoch'::timestamptz + nullif(split_part(position_state, '|', 4), '')::bigint * interval '1 microsecond', '-infinity');
        END IF;
    END IF;
    IF position_id IS NULL THEN
        position_expires := extract(EPOCH FROM now_utc) + 1;
        position_id := 0;
        position_time := '-infinity';
        SELECT m.due_at, m.id
        INTO position_time, position_id
        FROM "queue"."reminders" AS m
        WHERE (m.due_at, m.id) >= (position_time, position_id)
        ORDER BY m.due_at, m.id
        LIMIT 1;
        IF position_id IS NULL OR position_time > now_utc THEN
            position_time := now_utc;
            position_id := 0;
        END IF;
        position_state := set_config('tablequeue.queue.reminders', position_expires || '|' || rewinds || '|' || position_id || '|' || CASE WHEN isfinite(position_time) THEN (extract(EPOCH FROM position_time) * 1000000)::bigint::text ELSE '' END, false);
    END IF;
    PERFORM
    FROM "queue"."reminders" AS m
    WHERE (m.due_at, m.id) >= (position_time, position_id) AND m.due_at <= now_utc
    ORDER BY m.due_at, m.id
    LIMIT 1
    FOR KEY SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN true;
    END IF;
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

ALTER FUNCTION "queue"."reminders_wait_step" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."reminders_wait_step" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."reminders_wait_step" TO "queue_consumer";

-- tablequeue:unit queue.reminders_wait code

-- Returns ready = true as soon as a message is ready to dequeue, false after wait_ms. Each step is a
-- transaction of its own: COMMIT, then S.Q_wait_step (a probe, a sleep of 5 to 50 ms); so it holds
-- no lock and no transaction between steps, and the snapshot it holds while it sleeps is renewed
-- every step (backend_xmin moves on: vacuum is not held back). It claims nothing: the caller
-- dequeues next, in its own transaction. Because it commits it must be CALLed outside a transaction
-- block (autocommit): a caller that has written is refused (TQ003), any other open transaction
-- block by PostgreSQL at the first COMMIT (2D000). No definer rights and no pinned search_path, as
-- S.Q_process; its step is schema-qualified and it evaluates no operator the caller's search_path
-- could resolve. With notify: true, LISTEN on the queue's channel wakes a client sooner.
CREATE OR REPLACE PROCEDURE "queue"."reminders_wait"(
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
        RAISE EXCEPTION USING ERRCODE = 'TQ003', MESSAGE = 'queue.reminders_wait: commits between its steps and cannot run inside an open transaction.';
    END IF;
    LOOP
        COMMIT;
        step_ready := "queue"."reminders_wait_step"(wait_ms, started_at);
        EXIT WHEN step_ready OR step_ready IS NULL;
    END LOOP;
    ready := step_ready IS NOT NULL;
    COMMIT;
END;
$procedure$;

ALTER PROCEDURE "queue"."reminders_wait" OWNER TO "queue_owner";
REVOKE ALL ON PROCEDURE "queue"."reminders_wait" FROM public;
GRANT EXECUTE ON PROCEDURE "queue"."reminders_wait" TO "queue_consumer";
