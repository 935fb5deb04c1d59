-- tablequeue 0.2.0 | generated: do not edit
-- template: postgres/work.sql | dialect: postgres | kind: work | queue: queue.thumbnails
-- tablequeue:unit queue.thumbnails storage v4 table
-- tablequeue:shape kind=work payload=json dedupe=off priority=on client_ids=on

-- Every claim, fail and extend writes a new row version, never a HOT update (visible_at is indexed:
-- a HOT update needs every indexed column unchanged, a partial index's predicate columns included).
-- No CHECK constraints (storage v4): PostgreSQL evaluates every CHECK of a table on every UPDATE,
-- whatever columns it sets, and parses and plans them again for each statement that updates, so a
-- lease paid for checks of columns it never writes (about 35,000 instructions a work cycle,
-- docs/BENCHMARKS.md). enqueue and enqueue_batch check the payload's JSON shape and the keys'
-- lengths before they insert, and only the functions write this table (no role has a table
-- privilege). The destructive kinds keep theirs: their claims delete, and only a group's next head
-- is ever updated.
CREATE TABLE IF NOT EXISTS "queue"."thumbnails" (
    -- Client-supplied (Pintér); seq is the claim order's tie-breaker.
    id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME "queue"."thumbnails_id_seq"),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The scheduled start, as enqueued (returned by dequeue).
    due_at timestamptz NOT NULL,
    -- When the message may next be claimed: due_at, then the lease expiry while leased, then the
    -- retry time after a fail.
    visible_at timestamptz NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    leased_by text,
    leased_at timestamptz,
    -- New for every lease: complete, fail, extend_lease and release given a token act only while
    -- it is the message's current one (a stale holder is fenced off even under the same name).
    lease_token uuid,
    last_error text,
    payload jsonb NOT NULL,
    CONSTRAINT "pk_thumbnails" PRIMARY KEY (id)
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

-- The claim's exact WHERE and ORDER BY, of the messages nobody leases (new, due, retrying, released).
-- One priority level per range scan.
-- Partial, so that a lease (leased_by set) writes no entry here: a leased row version is in the
-- primary key and the lease start index only (docs/queue-kinds.md, What a lease writes), where the
-- look for expired leases finds it.
CREATE INDEX IF NOT EXISTS "ix_thumbnails_ready"
ON "queue"."thumbnails" (priority DESC, visible_at, seq)
WHERE leased_by IS NULL;

-- tablequeue:unit queue.thumbnails_enqueue_result storage v1 type
-- tablequeue:shape kind=work

-- enqueue's result row. A function cannot have a parameter and a result column of the same name
-- (both are parameters to PostgreSQL), and the contract names both `id`: the result is this type.
DO $type$
BEGIN
    IF to_regtype('"queue"."thumbnails_enqueue_result"') IS NULL THEN
        CREATE TYPE "queue"."thumbnails_enqueue_result" AS (id uuid, duplicate boolean);
    END IF;
END
$type$;

-- tablequeue:unit queue.thumbnails_complete_next_result storage v1 type
-- tablequeue:shape kind=work payload=json client_ids=on

-- complete_next's result row: dequeue's columns and previous_completed. A type for the reason of
-- _enqueue_result: the contract names parameters and result columns alike (id, lease_token).
DO $type$
BEGIN
    IF to_regtype('"queue"."thumbnails_complete_next_result"') IS NULL THEN
        CREATE TYPE "queue"."thumbnails_complete_next_result" AS (
            id uuid,
            payload jsonb,
            enqueued_at timestamptz,
            due_at timestamptz,
            attempts integer,
            lease_token uuid,
            previous_completed boolean
        );
    END IF;
END
$type$;

-- tablequeue:unit queue.thumbnails_rewinds storage v1 sequence
-- tablequeue:shape kind=work

-- Moved by every enqueue whose due time has already passed (docs/queue-kinds.md, The claim position).
CREATE SEQUENCE IF NOT EXISTS "queue"."thumbnails_rewinds";

-- tablequeue:unit queue.ix_thumbnails_lease_start storage v1 index
-- tablequeue:shape kind=work

-- Leased messages: the own-messages probe (a worker's leases taken since this session last found it
-- holding none), the look for expired leases (dequeue, at most once a second per session) and the
-- in-flight count. An index of its own, so that queues deployed before it gain it without a rebuild.
CREATE INDEX IF NOT EXISTS "ix_thumbnails_lease_start"
ON "queue"."thumbnails" (leased_by, leased_at)
WHERE leased_by IS NOT NULL;

-- tablequeue:unit queue.thumbnails_dead storage v2 table
-- tablequeue:shape kind=work payload=json dedupe=off priority=on client_ids=on

-- Messages that used up max_attempts (a last fail, or a lease that expired once too often).
CREATE TABLE IF NOT EXISTS "queue"."thumbnails_dead" (
    id uuid NOT NULL,
    enqueued_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
    priority integer NOT NULL,
    attempts integer NOT NULL,
    last_error text,
    last_worker text,
    dead_at timestamptz NOT NULL,
    payload jsonb NOT NULL,
    CONSTRAINT "pk_thumbnails_dead" PRIMARY KEY (id)
);

-- tablequeue:unit queue.thumbnails_ownership code

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
            AND c.relname IN ('thumbnails', 'thumbnails_dead', 'thumbnails_rewinds', 'thumbnails_enqueue_result', 'thumbnails_complete_next_result')
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

-- tablequeue:unit queue.thumbnails_enqueue code

CREATE OR REPLACE FUNCTION "queue"."thumbnails_enqueue"(
    payload jsonb,
    due_at timestamptz DEFAULT NULL,
    dedupe_key text DEFAULT NULL,
    priority integer DEFAULT NULL,
    id uuid DEFAULT NULL,
    enqueued_at timestamptz DEFAULT NULL
)
RETURNS SETOF "queue"."thumbnails_enqueue_result"
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    new_id uuid;
BEGIN
    IF payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ002', MESSAGE = 'queue.thumbnails_enqueue: payload must not be NULL.';
    END IF;
    -- SQL Server's ISJSON (2017-2019) only takes an object or an array; so does this twin. The
    -- table has no CHECK for it (storage v4, work.sql): this test, and enqueue_batch's, are the rule.
    IF jsonb_typeof(thumbnails_enqueue.payload) NOT IN ('object', 'array') THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ002', MESSAGE = 'queue.thumbnails_enqueue: payload must be a JSON object or array.';
    END IF;
    IF thumbnails_enqueue.due_at < now_utc - interval '1 second' THEN
        -- Due over a second ago: it sorts before the consumers' claim positions, which must start again.
        PERFORM nextval('"queue"."thumbnails_rewinds"');
    END IF;
    IF thumbnails_enqueue.dedupe_key IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_enqueue: dedupe_key needs option dedupe.';
    END IF;
    -- ON CONFLICT waits for a racing insert of the same key or id; if that row is gone again by the
    -- time we look it up (completed), try the insert once more.
    LOOP
        INSERT INTO "queue"."thumbnails" AS m (id, enqueued_at, due_at, visible_at, priority, payload)
        VALUES (coalesce(thumbnails_enqueue.id, gen_random_uuid()), coalesce(thumbnails_enqueue.enqueued_at, now_utc), coalesce(thumbnails_enqueue.due_at, now_utc), coalesce(thumbnails_enqueue.due_at, now_utc), coalesce(thumbnails_enqueue.priority, 0), thumbnails_enqueue.payload)
        ON CONFLICT DO NOTHING
        RETURNING m.id INTO new_id;
        IF new_id IS NOT NULL THEN
            RETURN NEXT ROW(new_id, false)::"queue"."thumbnails_enqueue_result";
            RETURN;
        END IF;
        IF new_id IS NULL THEN
            SELECT m.id INTO new_id FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_enqueue.id;
        END IF;
        IF new_id IS NOT NULL THEN
            RETURN NEXT ROW(new_id, true)::"queue"."thumbnails_enqueue_result";
            RETURN;
        END IF;
    END LOOP;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_enqueue" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_enqueue" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_enqueue" TO "queue_producer";

-- tablequeue:unit queue.thumbnails_enqueue_batch code

-- PostgreSQL has no table-valued parameters: items arrive as parallel arrays, position = ordinal.
-- The arrays an option does not use must be NULL (the same contract as the SQL Server TVP).
CREATE OR REPLACE FUNCTION "queue"."thumbnails_enqueue_batch"(
    payloads jsonb[],
    due_ats timestamptz[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL,
    priorities integer[] DEFAULT NULL,
    ids uuid[] DEFAULT NULL,
    enqueued_ats timestamptz[] DEFAULT NULL
)
RETURNS TABLE (ordinal integer, id uuid, duplicate boolean)
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
    now_utc timestamptz := clock_timestamp();
    bad_ordinal integer;
    new_ids uuid[];
    -- seq (the claim order's tie-breaker) drawn in item order too: rows go in in key order.
    new_seqs bigint[];
    inserted_ties bigint[];
    result_ids uuid[];
    roots integer[];
    chased integer[];
    queued_positions bigint[];
    queued_ids uuid[];
BEGIN
    IF item_count > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_enqueue_batch: at most 1000 items per call, got %s.', item_count);
    END IF;
    IF due_ats IS NOT NULL AND cardinality(due_ats) <> item_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_enqueue_batch: due_ats has %s elements but payloads has %s.', cardinality(due_ats), item_count);
    END IF;
    IF dedupe_keys IS NOT NULL AND cardinality(dedupe_keys) <> item_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_enqueue_batch: dedupe_keys has %s elements but payloads has %s.', cardinality(dedupe_keys), item_count);
    END IF;
    IF priorities IS NOT NULL AND cardinality(priorities) <> item_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_enqueue_batch: priorities has %s elements but payloads has %s.', cardinality(priorities), item_count);
    END IF;
    IF ids IS NOT NULL AND cardinality(ids) <> item_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_enqueue_batch: ids has %s elements but payloads has %s.', cardinality(ids), item_count);
    END IF;
    IF enqueued_ats IS NOT NULL AND cardinality(enqueued_ats) <> item_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_enqueue_batch: enqueued_ats has %s elements but payloads has %s.', cardinality(enqueued_ats), item_count);
    END IF;
    SELECT min(u.ordinal) INTO bad_ordinal
    FROM unnest(payloads) WITH ORDINALITY AS u (payload, ordinal)
    WHERE u.payload IS NULL OR jsonb_typeof(u.payload) NOT IN ('object', 'array');
    IF bad_ordinal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ002', MESSAGE = format('queue.thumbnails_enqueue_batch: item %s has a NULL or non-object/array JSON payload.', bad_ordinal);
    END IF;
    IF EXISTS (SELECT FROM unnest(due_ats) AS u (due_at) WHERE u.due_at < now_utc - interval '1 second') THEN
        -- Due over a second ago: it sorts before the consumers' claim positions, which must start again.
        PERFORM nextval('"queue"."thumbnails_rewinds"');
    END IF;
    IF dedupe_keys IS NOT NULL THEN
        SELECT min(u.ordinal) INTO bad_ordinal
        FROM unnest(dedupe_keys) WITH ORDINALITY AS u (dedupe_key, ordinal)
        WHERE u.dedupe_key IS NOT NULL;
        IF bad_ordinal IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_enqueue_batch: item %s has a dedupe_key, which needs option dedupe.', bad_ordinal);
        END IF;
    END IF;

    -- Ids are settled in item order first, so each item knows its id whether or not it is inserted,
    -- and a batch is claimed in item order whatever order its rows go in.
    new_ids := ARRAY(
        SELECT coalesce(u.given_id, gen_random_uuid())
        FROM generate_series(1, item_count) AS g (position)
        LEFT JOIN unnest(ids) WITH ORDINALITY AS u (given_id, position) ON g.position = u.position
        ORDER BY g.position
    );
    new_seqs := ARRAY(SELECT nextval('"queue"."thumbnails_id_seq"') FROM generate_series(1, item_count));

    -- Each item's first: the earliest earlier item sharing its key or its client id, followed to
    -- the first of that chain (the SQL Server twin's rule); an item that is its own first is offered
    -- for insertion, any other duplicates its first.
    roots := ARRAY(
        SELECT least(
            u.position,
            min(u.position) OVER (PARTITION BY u.new_id)
        )::integer
        FROM unnest(new_ids) WITH ORDINALITY AS u (new_id, position)
        LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, position) ON u.position = k.position
        ORDER BY u.position
    );
    LOOP
        chased := ARRAY(SELECT roots[r.root] FROM unnest(roots) WITH ORDINALITY AS r (root, position) ORDER BY r.position);
        EXIT WHEN chased IS NOT DISTINCT FROM roots;
        roots := chased;
    END LOOP;

    -- The firsts go in in id order: two batches that share ids then wait for each other
    -- instead of deadlocking (each would hold one the other waits for). ON CONFLICT skips one whose id
    -- is queued already (waiting for a racing insert of it first).
    LOOP
        BEGIN
            WITH items AS (
                SELECT
                    u.new_id,
                    s.new_seq,
                    u.payload,
                    u.position,
                    d.due_at,
                    k.dedupe_key,
                    p.priority,
                    e.enqueued_at
                FROM unnest(new_ids, payloads) WITH ORDINALITY AS u (new_id, payload, position)
                INNER JOIN unnest(new_seqs) WITH ORDINALITY AS s (new_seq, position) ON u.position = s.position
                LEFT JOIN unnest(due_ats) WITH ORDINALITY AS d (due_at, position) ON u.position = d.position
                LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, position) ON u.position = k.position
                LEFT JOIN unnest(priorities) WITH ORDINALITY AS p (priority, position) ON u.position = p.position
                LEFT JOIN unnest(enqueued_ats) WITH ORDINALITY AS e (enqueued_at, position) ON u.position = e.position
                WHERE roots[u.position] = u.position
            ),

            queued AS (
                SELECT
                    i.position,
                    by_id.id AS id
                FROM items AS i
                LEFT JOIN "queue"."thumbnails" AS by_id ON i.new_id = by_id.id
            ),

            inserted AS (
                INSERT INTO "queue"."thumbnails" AS m (
                    id, seq, enqueued_at, due_at, visible_at, priority, payload
                )
                OVERRIDING SYSTEM VALUE
                SELECT
                    i.new_id,
                    i.new_seq,
                    coalesce(i.enqueued_at, now_utc),
                    coalesce(i.due_at, now_utc),
                    coalesce(i.due_at, now_utc),
                    coalesce(i.priority, 0),
                    i.payload
                FROM items AS i
                ORDER BY i.new_id, i.position
                ON CONFLICT DO NOTHING
                RETURNING m.seq
            )

            SELECT
                coalesce((SELECT array_agg(n.seq) FROM inserted AS n), '{}'),
                (SELECT array_agg(q.position ORDER BY q.position) FROM queued AS q WHERE q.id IS NOT NULL),
                (SELECT array_agg(q.id ORDER BY q.position) FROM queued AS q WHERE q.id IS NOT NULL)
            INTO inserted_ties, queued_positions, queued_ids;

            -- A first's id: its own when its row went in; else the message now queued with its key or id (a
            -- new statement sees what racing transactions committed while this one waited on them); else,
            -- when that message has been consumed since, the one the insert's own snapshot saw.
            result_ids := ARRAY(
                SELECT
                    CASE
                        WHEN roots[u.position] <> u.position THEN NULL
                        WHEN own.tie IS NOT NULL THEN u.new_id
                        ELSE coalesce(
                            (SELECT m.id FROM "queue"."thumbnails" AS m WHERE m.id = u.new_id),
                            q.id
                        )
                    END
                FROM unnest(new_ids, new_seqs) WITH ORDINALITY AS u (new_id, new_tie, position)
                LEFT JOIN unnest(inserted_ties) AS own (tie) ON u.new_tie = own.tie
                LEFT JOIN unnest(queued_positions, queued_ids) AS q (position, id) ON u.position = q.position
                LEFT JOIN unnest(dedupe_keys) WITH ORDINALITY AS k (dedupe_key, position) ON u.position = k.position
                ORDER BY u.position
            );
            IF EXISTS (SELECT FROM unnest(result_ids, roots) WITH ORDINALITY AS r (result_id, root, position) WHERE r.root = r.position AND r.result_id IS NULL) THEN
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
        u.position::integer,
        result_ids[roots[u.position]],
        own.tie IS NULL
    FROM unnest(new_seqs) WITH ORDINALITY AS u (new_tie, position)
    LEFT JOIN unnest(inserted_ties) AS own (tie) ON u.new_tie = own.tie
    ORDER BY u.position;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_enqueue_batch" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_enqueue_batch" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_enqueue_batch" TO "queue_producer";

-- tablequeue:unit queue.thumbnails_dequeue code

-- A dequeue by worker W first takes back W's own unfinished messages: W declares, by asking, that
-- it holds nothing else. A worker name is therefore one single-threaded consumer at a time.
-- Claimed rows whose lease had already expired max_attempts times go to the dead-letter table
-- ('lease expired') instead of to the worker: the claim would be one attempt too many.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_dequeue"(
    batch_size integer DEFAULT 1,
    worker text DEFAULT NULL,
    lease_seconds integer DEFAULT NULL
)
RETURNS TABLE (
    id uuid, payload jsonb, enqueued_at timestamptz, due_at timestamptz, attempts integer, lease_token uuid
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
    now_utc timestamptz := clock_timestamp();
    effective_lease integer := coalesce(thumbnails_dequeue.lease_seconds, 120);
    lease_until timestamptz;
    claimed_ids uuid[] := '{}';
    step_ids uuid[];
    buried_count bigint;
    exhausted_ids uuid[];
    exhausted_workers text[];
    remaining integer;
    -- '<time>|<worker>': when this session last found none of that worker's messages leased.
    -- Every lease the worker has taken since was taken at that time or later, so its own claim
    -- need not read back through the entries of the messages it has finished (docs/work-queue.md).
    own_state text := current_setting('tablequeue.queue.thumbnails.own', true);
    own_since timestamptz := '-infinity';
    -- When this session's next look for expired leases is due (w.expired_due).
    expired_state text := current_setting('tablequeue.queue.thumbnails.expired', true);
    current_level integer;
    level_ids uuid[];
    level_buried bigint;
BEGIN
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_dequeue: batch_size must be between 1 and 1000, got %s.', coalesce(batch_size::text, 'NULL'));
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ008', MESSAGE = format('queue.thumbnails_dequeue: runs only at READ COMMITTED, and this transaction is %s.', upper(current_setting('transaction_isolation')));
    END IF;
    IF thumbnails_dequeue.worker IS NULL OR length(thumbnails_dequeue.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_dequeue: worker must be a name of 1 to 200 characters.';
    END IF;
    IF effective_lease NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_dequeue: lease_seconds must be between 1 and 604800, got %s.', effective_lease);
    END IF;
    lease_until := now_utc + make_interval(secs => effective_lease);

    -- 1. Own messages first (leased, even unexpired: a restarted worker): the probe and the claim on
    -- ix_thumbnails_lease_start (the claim sorts the worker's few leases). The claim the probe guards is needed
    -- only after a restart. A worker name is one single-threaded consumer (contract), so no lease can
    -- come to this worker between the probe and the claim. `>=`: the claim below leases at the
    -- very time it records.
    IF substr(own_state, strpos(own_state, '|') + 1) = thumbnails_dequeue.worker AND strpos(own_state, '|') <= 18
        AND own_state ~ '^(-?[0-9]+)?\|' THEN
        own_since := coalesce('epoch'::timestamptz + nullif(split_part(own_state, '|', 1), '')::bigint * interval '1 microsecond', '-infinity');
    END IF;
    IF EXISTS (
        SELECT FROM "queue"."thumbnails" AS m WHERE m.leased_by = thumbnails_dequeue.worker AND m.leased_at >= own_since
    ) THEN
        WITH next_messages AS (
            SELECT
                m.id,
                m.seq AS tie,
                m.visible_at,
                m.leased_by
            FROM "queue"."thumbnails" AS m
            WHERE m.leased_by = thumbnails_dequeue.worker AND m.leased_at >= own_since
            ORDER BY m.visible_at, m.seq
            LIMIT batch_size
            FOR UPDATE SKIP LOCKED
        ),

        leased AS (
            UPDATE "queue"."thumbnails" AS m
            SET
                -- The worker's own messages come back as they are while their lease lives (the same
                -- attempt, the same expiry: asking again neither spends an attempt nor buys time); one
                -- whose lease has expired is leased anew, as anyone's would be.
                attempts = m.attempts + CASE WHEN m.visible_at <= now_utc THEN 1 ELSE 0 END,
                visible_at = CASE WHEN m.visible_at <= now_utc THEN lease_until ELSE m.visible_at END,
                leased_by = thumbnails_dequeue.worker,
                leased_at = CASE WHEN m.visible_at <= now_utc THEN now_utc ELSE m.leased_at END,
                lease_token = CASE WHEN m.visible_at <= now_utc THEN gen_random_uuid() ELSE m.lease_token END
            WHERE m.id = ANY(ARRAY(SELECT n.id FROM next_messages AS n))
            RETURNING m.id, m.attempts
        )

        SELECT
            array_agg(l.id ORDER BY n.visible_at, n.tie) FILTER (WHERE NOT (l.attempts > 4 AND n.visible_at <= now_utc)),
            array_agg(l.id) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc)),
            array_agg(n.leased_by) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc))
        INTO step_ids, exhausted_ids, exhausted_workers
        FROM leased AS l
        INNER JOIN next_messages AS n ON l.id = n.id;
        buried_count := 0;
        IF exhausted_ids IS NOT NULL THEN
            WITH gone AS (
                DELETE FROM "queue"."thumbnails" AS m
                WHERE m.id = ANY(exhausted_ids)
                RETURNING m.*
            ),

            buried AS (
                INSERT INTO "queue"."thumbnails_dead" (
                    id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
                )
                SELECT
                    g.id,
                    g.enqueued_at,
                    g.due_at,
                    g.priority,
                    g.attempts - 1,
                    'lease expired',
                    exhausted_workers[array_position(exhausted_ids, g.id)],
                    now_utc,
                    g.payload
                FROM gone AS g
                ON CONFLICT (id) DO UPDATE SET
                    enqueued_at = excluded.enqueued_at,
                    due_at = excluded.due_at,
                    priority = excluded.priority,
                    attempts = excluded.attempts,
                    last_error = excluded.last_error,
                    last_worker = excluded.last_worker,
                    dead_at = excluded.dead_at,
                    payload = excluded.payload
                RETURNING 1
            )

            SELECT count(*) INTO buried_count FROM buried;
        END IF;
        claimed_ids := claimed_ids || coalesce(step_ids, '{}');
    ELSE
        own_state := set_config('tablequeue.queue.thumbnails.own', CASE WHEN isfinite(now_utc) THEN (extract(EPOCH FROM now_utc) * 1000000)::bigint::text ELSE '' END || '|' || thumbnails_dequeue.worker, false);
    END IF;
    remaining := batch_size - cardinality(claimed_ids);

    -- 2. Expired leases: a crashed or stopped worker's messages. A lease takes a message out of ix_thumbnails_ready, so they are
    -- found on ix_thumbnails_lease_start, which this reads whole: at most once a second per session
    -- (w.expired_due; docs/work-queue.md, Expired leases), in that index's order. A look that filled the
    -- batch may have left more behind (a crashed worker's whole batch): the next call looks again.
    IF remaining > 0 AND (expired_state IS NULL OR length(expired_state) <> 16 OR expired_state COLLATE "C" <= (extract(EPOCH FROM now_utc) * 1000000)::bigint::text
        OR expired_state COLLATE "C" > ((extract(EPOCH FROM now_utc) * 1000000)::bigint + 1000000)::text) THEN
        WHILE remaining > 0 LOOP
            IF remaining = 1 THEN
                WITH next_messages AS (
                    SELECT
                        m.id,
                        m.seq AS tie,
                        m.visible_at,
                        m.leased_by
                    FROM "queue"."thumbnails" AS m
                    WHERE m.leased_by IS NOT NULL AND m.visible_at <= now_utc
                    ORDER BY m.leased_by, m.leased_at
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED
                ),

                leased AS (
                    UPDATE "queue"."thumbnails" AS m
                    SET
                        attempts = m.attempts + 1,
                        visible_at = lease_until,
                        leased_by = thumbnails_dequeue.worker,
                        leased_at = now_utc,
                        lease_token = gen_random_uuid()
                    FROM next_messages AS n
                    WHERE m.id = n.id
                    RETURNING m.id, m.attempts
                )

                SELECT
                    array_agg(l.id ORDER BY n.visible_at, n.tie) FILTER (WHERE NOT (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(l.id) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(n.leased_by) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc))
                INTO step_ids, exhausted_ids, exhausted_workers
                FROM leased AS l
                INNER JOIN next_messages AS n ON l.id = n.id;
                buried_count := 0;
                IF exhausted_ids IS NOT NULL THEN
                    WITH gone AS (
                        DELETE FROM "queue"."thumbnails" AS m
                        WHERE m.id = ANY(exhausted_ids)
                        RETURNING m.*
                    ),

                    buried AS (
                        INSERT INTO "queue"."thumbnails_dead" (
                            id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
                        )
                        SELECT
                            g.id,
                            g.enqueued_at,
                            g.due_at,
                            g.priority,
                            g.attempts - 1,
                            'lease expired',
                            exhausted_workers[array_position(exhausted_ids, g.id)],
                            now_utc,
                            g.payload
                        FROM gone AS g
                        ON CONFLICT (id) DO UPDATE SET
                            enqueued_at = excluded.enqueued_at,
                            due_at = excluded.due_at,
                            priority = excluded.priority,
                            attempts = excluded.attempts,
                            last_error = excluded.last_error,
                            last_worker = excluded.last_worker,
                            dead_at = excluded.dead_at,
                            payload = excluded.payload
                        RETURNING 1
                    )

                    SELECT count(*) INTO buried_count FROM buried;
                END IF;
            ELSE
                WITH next_messages AS (
                    SELECT
                        m.id,
                        m.seq AS tie,
                        m.visible_at,
                        m.leased_by
                    FROM "queue"."thumbnails" AS m
                    WHERE m.leased_by IS NOT NULL AND m.visible_at <= now_utc
                    ORDER BY m.leased_by, m.leased_at
                    LIMIT remaining
                    FOR UPDATE SKIP LOCKED
                ),

                leased AS (
                    UPDATE "queue"."thumbnails" AS m
                    SET
                        attempts = m.attempts + 1,
                        visible_at = lease_until,
                        leased_by = thumbnails_dequeue.worker,
                        leased_at = now_utc,
                        lease_token = gen_random_uuid()
                    WHERE m.id = ANY(ARRAY(SELECT n.id FROM next_messages AS n))
                    RETURNING m.id, m.attempts
                )

                SELECT
                    array_agg(l.id ORDER BY n.visible_at, n.tie) FILTER (WHERE NOT (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(l.id) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(n.leased_by) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc))
                INTO step_ids, exhausted_ids, exhausted_workers
                FROM leased AS l
                INNER JOIN next_messages AS n ON l.id = n.id;
                buried_count := 0;
                IF exhausted_ids IS NOT NULL THEN
                    WITH gone AS (
                        DELETE FROM "queue"."thumbnails" AS m
                        WHERE m.id = ANY(exhausted_ids)
                        RETURNING m.*
                    ),

                    buried AS (
                        INSERT INTO "queue"."thumbnails_dead" (
                            id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
                        )
                        SELECT
                            g.id,
                            g.enqueued_at,
                            g.due_at,
                            g.priority,
                            g.attempts - 1,
                            'lease expired',
                            exhausted_workers[array_position(exhausted_ids, g.id)],
                            now_utc,
                            g.payload
                        FROM gone AS g
                        ON CONFLICT (id) DO UPDATE SET
                            enqueued_at = excluded.enqueued_at,
                            due_at = excluded.due_at,
                            priority = excluded.priority,
                            attempts = excluded.attempts,
                            last_error = excluded.last_error,
                            last_worker = excluded.last_worker,
                            dead_at = excluded.dead_at,
                            payload = excluded.payload
                        RETURNING 1
                    )

                    SELECT count(*) INTO buried_count FROM buried;
                END IF;
            END IF;
            claimed_ids := claimed_ids || coalesce(step_ids, '{}');
            remaining := batch_size - cardinality(claimed_ids);
            EXIT WHEN buried_count = 0;
        END LOOP;
        IF remaining > 0 THEN
        expired_state := set_config('tablequeue.queue.thumbnails.expired', ((extract(EPOCH FROM now_utc) * 1000000)::bigint + 1000000)::text, false);
        END IF;
    END IF;

    -- 3. Messages nobody leases (new, due, retried, released), on ix_thumbnails_ready. Separate statements,
    -- never an OR (DESIGN.md §4). A row that goes to the dead-letter table frees its place in the
    -- batch, so claim again until the batch is full or nothing visible is left.
    -- Priority levels claim from the head of each level (no claim position: docs/work-queue.md).
    WHILE remaining > 0 LOOP
        -- A loose index scan: one range scan per priority level present. A single ORDER BY
        -- priority DESC would read past every delayed or leased row of the higher levels on each
        -- claim, and the whole index when nothing is ready.
        step_ids := '{}';
        buried_count := 0;
        current_level := (SELECT m.priority FROM "queue"."thumbnails" AS m WHERE m.leased_by IS NULL ORDER BY m.priority DESC LIMIT 1);
        WHILE current_level IS NOT NULL AND cardinality(step_ids) < remaining LOOP
            IF remaining - cardinality(step_ids) = 1 THEN
                WITH next_messages AS (
                    SELECT
                        m.id,
                        m.seq AS tie,
                        m.visible_at,
                        m.leased_by
                    FROM "queue"."thumbnails" AS m
                    WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at <= now_utc
                    ORDER BY m.visible_at, m.seq
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED
                ),

                leased AS (
                    UPDATE "queue"."thumbnails" AS m
                    SET
                        attempts = m.attempts + 1,
                        visible_at = lease_until,
                        leased_by = thumbnails_dequeue.worker,
                        leased_at = now_utc,
                        lease_token = gen_random_uuid()
                    FROM next_messages AS n
                    WHERE m.id = n.id
                    RETURNING m.id, m.attempts
                )

                SELECT
                    array_agg(l.id ORDER BY n.visible_at, n.tie) FILTER (WHERE NOT (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(l.id) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(n.leased_by) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc))
                INTO level_ids, exhausted_ids, exhausted_workers
                FROM leased AS l
                INNER JOIN next_messages AS n ON l.id = n.id;
                level_buried := 0;
                IF exhausted_ids IS NOT NULL THEN
                    WITH gone AS (
                        DELETE FROM "queue"."thumbnails" AS m
                        WHERE m.id = ANY(exhausted_ids)
                        RETURNING m.*
                    ),

                    buried AS (
                        INSERT INTO "queue"."thumbnails_dead" (
                            id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
                        )
                        SELECT
                            g.id,
                            g.enqueued_at,
                            g.due_at,
                            g.priority,
                            g.attempts - 1,
                            'lease expired',
                            exhausted_workers[array_position(exhausted_ids, g.id)],
                            now_utc,
                            g.payload
                        FROM gone AS g
                        ON CONFLICT (id) DO UPDATE SET
                            enqueued_at = excluded.enqueued_at,
                            due_at = excluded.due_at,
                            priority = excluded.priority,
                            attempts = excluded.attempts,
                            last_error = excluded.last_error,
                            last_worker = excluded.last_worker,
                            dead_at = excluded.dead_at,
                            payload = excluded.payload
                        RETURNING 1
                    )

                    SELECT count(*) INTO level_buried FROM buried;
                END IF;
            ELSE
                WITH next_messages AS (
                    SELECT
                        m.id,
                        m.seq AS tie,
                        m.visible_at,
                        m.leased_by
                    FROM "queue"."thumbnails" AS m
                    WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at <= now_utc
                    ORDER BY m.visible_at, m.seq
                    LIMIT remaining - cardinality(step_ids)
                    FOR UPDATE SKIP LOCKED
                ),

                leased AS (
                    UPDATE "queue"."thumbnails" AS m
                    SET
                        attempts = m.attempts + 1,
                        visible_at = lease_until,
                        leased_by = thumbnails_dequeue.worker,
                        leased_at = now_utc,
                        lease_token = gen_random_uuid()
                    WHERE m.id = ANY(ARRAY(SELECT n.id FROM next_messages AS n))
                    RETURNING m.id, m.attempts
                )

                SELECT
                    array_agg(l.id ORDER BY n.visible_at, n.tie) FILTER (WHERE NOT (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(l.id) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc)),
                    array_agg(n.leased_by) FILTER (WHERE (l.attempts > 4 AND n.visible_at <= now_utc))
                INTO level_ids, exhausted_ids, exhausted_workers
                FROM leased AS l
                INNER JOIN next_messages AS n ON l.id = n.id;
                level_buried := 0;
                IF exhausted_ids IS NOT NULL THEN
                    WITH gone AS (
                        DELETE FROM "queue"."thumbnails" AS m
                        WHERE m.id = ANY(exhausted_ids)
                        RETURNING m.*
                    ),

                    buried AS (
                        INSERT INTO "queue"."thumbnails_dead" (
                            id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
                        )
                        SELECT
                            g.id,
                            g.enqueued_at,
                            g.due_at,
                            g.priority,
                            g.attempts - 1,
                            'lease expired',
                            exhausted_workers[array_position(exhausted_ids, g.id)],
                            now_utc,
                            g.payload
                        FROM gone AS g
                        ON CONFLICT (id) DO UPDATE SET
                            enqueued_at = excluded.enqueued_at,
                            due_at = excluded.due_at,
                            priority = excluded.priority,
                            attempts = excluded.attempts,
                            last_error = excluded.last_error,
                            last_worker = excluded.last_worker,
                            dead_at = excluded.dead_at,
                            payload = excluded.payload
                        RETURNING 1
                    )

                    SELECT count(*) INTO level_buried FROM buried;
                END IF;
            END IF;
            step_ids := step_ids || coalesce(level_ids, '{}');
            buried_count := buried_count + level_buried;
            current_level := (
                SELECT m.priority FROM "queue"."thumbnails" AS m
                WHERE m.priority < current_level AND m.leased_by IS NULL
                ORDER BY m.priority DESC
                LIMIT 1
            );
        END LOOP;
        claimed_ids := claimed_ids || coalesce(step_ids, '{}');
        remaining := batch_size - cardinality(claimed_ids);
        EXIT WHEN buried_count = 0;
    END LOOP;

    -- The rows, in claim order (the array's: ORDINALITY), in one statement: a primary-key probe per id
    -- inside it. LATERAL ... OFFSET 0 keeps each probe a nested loop whatever the plan's estimate of
    -- the array (a join over unnest chose a hash join over the whole table at batch 10). One statement
    -- per id, as before, started the executor for each: 20,000 server instructions a message at batch
    -- 100 (docs/BENCHMARKS.md). Its generic plan is kept: no planning per call. Not run when nothing
    -- was claimed: an idle poll would plan it first, and on a drained queue that VACUUM has cut to no
    -- pages (reltuples 0) the plan is a sequential scan per id, kept after the queue fills again.
    IF cardinality(claimed_ids) > 0 THEN
        RETURN QUERY
        SELECT q.id, q.payload, q.enqueued_at, q.due_at, q.attempts, q.lease_token
        FROM unnest(claimed_ids) WITH ORDINALITY AS c (id, n)
        CROSS JOIN LATERAL (SELECT m.* FROM "queue"."thumbnails" AS m WHERE m.id = c.id OFFSET 0) AS q
        ORDER BY c.n;
    END IF;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_dequeue" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_dequeue" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_dequeue" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_complete code

-- Only the holder of a live lease (given a token, of that very lease): a late complete after the
-- lease moved on changes nothing.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_complete"(
    id uuid,
    worker text,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (completed boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    done_count bigint;
BEGIN
    IF thumbnails_complete.worker IS NULL OR length(thumbnails_complete.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_complete: worker must be a name of 1 to 200 characters.';
    END IF;
    DELETE FROM "queue"."thumbnails" AS m
    WHERE m.id = thumbnails_complete.id AND m.leased_by IS NOT DISTINCT FROM thumbnails_complete.worker
        AND (thumbnails_complete.lease_token IS NULL OR m.lease_token = thumbnails_complete.lease_token)
        AND m.visible_at > now_utc;
    GET DIAGNOSTICS done_count = ROW_COUNT;
    IF done_count = 0 THEN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_complete.id FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    END IF;
    END IF;
    completed := done_count > 0;
    RETURN NEXT;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_complete" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_complete" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_complete" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_fail code

-- With attempts left: release the lease, visible again after retry_after_seconds. On the last
-- attempt: to the dead-letter table with the error. outcome: retrying | dead | lost (the caller's
-- lease had expired or moved on: nothing changed).
CREATE OR REPLACE FUNCTION "queue"."thumbnails_fail"(
    id uuid,
    worker text,
    error text DEFAULT NULL,
    retry_after_seconds integer DEFAULT NULL,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (outcome text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    retry_after integer := coalesce(thumbnails_fail.retry_after_seconds, 0);
    changed bigint;
BEGIN
    IF thumbnails_fail.worker IS NULL OR length(thumbnails_fail.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_fail: worker must be a name of 1 to 200 characters.';
    END IF;
    IF retry_after NOT BETWEEN 0 AND 2592000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_fail: retry_after_seconds must be between 0 and 2592000, got %s.', retry_after);
    END IF;

    UPDATE "queue"."thumbnails" AS m
    SET
        leased_by = NULL,
        lease_token = NULL,
        visible_at = now_utc + make_interval(secs => retry_after),
        last_error = left(thumbnails_fail.error, 4000)
    WHERE
        m.id = thumbnails_fail.id AND m.leased_by IS NOT DISTINCT FROM thumbnails_fail.worker
        AND (thumbnails_fail.lease_token IS NULL OR m.lease_token = thumbnails_fail.lease_token)
        AND m.visible_at > now_utc
        AND m.attempts < 4;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed > 0 THEN
        outcome := 'retrying';
        RETURN NEXT;
        RETURN;
    END IF;

    WITH gone AS (
        DELETE FROM "queue"."thumbnails" AS m
        WHERE m.id = thumbnails_fail.id AND m.leased_by IS NOT DISTINCT FROM thumbnails_fail.worker
        AND (thumbnails_fail.lease_token IS NULL OR m.lease_token = thumbnails_fail.lease_token)
        AND m.visible_at > now_utc
        RETURNING m.*
    ),

    buried AS (
        INSERT INTO "queue"."thumbnails_dead" (
            id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
        )
        SELECT
            g.id,
            g.enqueued_at,
            g.due_at,
            g.priority,
            g.attempts,
            left(thumbnails_fail.error, 4000),
            g.leased_by,
            now_utc,
            g.payload
        FROM gone AS g
        ON CONFLICT (id) DO UPDATE SET
            enqueued_at = excluded.enqueued_at,
            due_at = excluded.due_at,
            priority = excluded.priority,
            attempts = excluded.attempts,
            last_error = excluded.last_error,
            last_worker = excluded.last_worker,
            dead_at = excluded.dead_at,
            payload = excluded.payload
        RETURNING 1
    )

    SELECT count(*) INTO changed FROM buried;
    IF changed = 0 THEN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_fail.id FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    END IF;
    END IF;
    outcome := CASE WHEN changed > 0 THEN 'dead' ELSE 'lost' END;
    RETURN NEXT;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_fail" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_fail" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_fail" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_extend_lease code

-- The new lease runs from now; an extend begun after the lease expired cannot revive it (another
-- worker may have it).
CREATE OR REPLACE FUNCTION "queue"."thumbnails_extend_lease"(
    id uuid,
    worker text,
    lease_seconds integer DEFAULT NULL,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (extended boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    effective_lease integer := coalesce(thumbnails_extend_lease.lease_seconds, 120);
    changed bigint;
BEGIN
    IF thumbnails_extend_lease.worker IS NULL OR length(thumbnails_extend_lease.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_extend_lease: worker must be a name of 1 to 200 characters.';
    END IF;
    IF effective_lease NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_extend_lease: lease_seconds must be between 1 and 604800, got %s.', effective_lease);
    END IF;
    UPDATE "queue"."thumbnails" AS m
    SET visible_at = now_utc + make_interval(secs => effective_lease)
    WHERE m.id = thumbnails_extend_lease.id AND m.leased_by IS NOT DISTINCT FROM thumbnails_extend_lease.worker
        AND (thumbnails_extend_lease.lease_token IS NULL OR m.lease_token = thumbnails_extend_lease.lease_token)
        AND m.visible_at > now_utc;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_extend_lease.id FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    ELSE
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m
            WHERE
                m.id = thumbnails_extend_lease.id AND m.leased_by IS NOT DISTINCT FROM thumbnails_extend_lease.worker
                AND (thumbnails_extend_lease.lease_token IS NULL OR m.lease_token = thumbnails_extend_lease.lease_token)
            FOR KEY SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    END IF;
    END IF;
    extended := changed > 0;
    RETURN NEXT;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_extend_lease" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_extend_lease" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_extend_lease" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_release code

-- Gives a leased message back at once, with its attempt: a consumer shutting down gracefully (or
-- handing work it will not start to another) spends none of max_attempts. Only the holder of the
-- live lease; a lost lease changes nothing (released = false).
CREATE OR REPLACE FUNCTION "queue"."thumbnails_release"(
    id uuid,
    worker text,
    lease_token uuid DEFAULT NULL
)
RETURNS TABLE (released boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    changed bigint;
BEGIN
    IF thumbnails_release.worker IS NULL OR length(thumbnails_release.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_release: worker must be a name of 1 to 200 characters.';
    END IF;
    -- visible_at = now: at or after every claim position a consumer can have stored, so the next
    -- dequeue finds it.
    UPDATE "queue"."thumbnails" AS m
    SET
        leased_by = NULL,
        leased_at = NULL,
        lease_token = NULL,
        visible_at = now_utc,
        attempts = greatest(m.attempts - 1, 0)
    WHERE m.id = thumbnails_release.id AND m.leased_by IS NOT DISTINCT FROM thumbnails_release.worker
        AND (thumbnails_release.lease_token IS NULL OR m.lease_token = thumbnails_release.lease_token)
        AND m.visible_at > now_utc;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_release.id FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    END IF;
    END IF;
    released := changed > 0;
    RETURN NEXT;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_release" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_release" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_release" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_lease_status code

-- What became of up to 1,000 leases, each named by its message id and lease token: held (the
-- message is in the queue under this live lease), expired (in the queue under this lease, which ran
-- out: no acknowledgement that reads its clock from now on takes it, one that read it before may),
-- lost (in the queue under no lease or another one: released, failed for a retry or leased again;
-- this lease never completes), dead (in the dead-letter table) or gone (in neither: completed, or
-- purged). A consumer whose complete's answer never arrived (the connection dropped at COMMIT)
-- learns whether it committed. It first waits for each transaction that, when it looks, has changed,
-- deleted or locked for update one of these messages' rows (a complete, a fail, a release in
-- flight), so the answer is what that transaction left, not what it may still undo. Changes nothing,
-- locks nothing after it returns. One row per item, in id order.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_lease_status"(
    ids uuid[],
    lease_tokens uuid[]
)
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz;
    sorted_ids uuid[];
    sorted_tokens uuid[];
    distinct_count bigint;
    remaining_ids uuid[];
    free_ids uuid[];
    wait_id uuid;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ008', MESSAGE = format('queue.thumbnails_lease_status: runs only at READ COMMITTED, and this transaction is %s.', upper(current_setting('transaction_isolation')));
    END IF;
    IF thumbnails_lease_status.ids IS NULL OR cardinality(thumbnails_lease_status.ids) > 1000 OR array_ndims(thumbnails_lease_status.ids) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_lease_status: ids must be a one-dimensional array of at most 1000 ids, got %s.', coalesce(cardinality(thumbnails_lease_status.ids)::text, 'NULL'));
    END IF;
    IF cardinality(thumbnails_lease_status.lease_tokens) IS DISTINCT FROM cardinality(thumbnails_lease_status.ids) OR array_ndims(thumbnails_lease_status.lease_tokens) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_lease_status: lease_tokens must have one element per id (NULL for none), got %s for %s ids.', coalesce(cardinality(thumbnails_lease_status.lease_tokens)::text, 'NULL'), cardinality(thumbnails_lease_status.ids));
    END IF;
    IF array_position(thumbnails_lease_status.ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_lease_status: ids[%s] is NULL.', array_position(thumbnails_lease_status.ids, NULL));
    END IF;
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.lease_token ORDER BY u.id), count(DISTINCT u.id)
    INTO sorted_ids, sorted_tokens, distinct_count
    FROM unnest(thumbnails_lease_status.ids, thumbnails_lease_status.lease_tokens) AS u (id, lease_token);
    IF distinct_count < cardinality(thumbnails_lease_status.ids) THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_lease_status: an id is listed twice.';
    END IF;
    IF array_position(sorted_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_lease_status: the lease token of id %s is NULL.', sorted_ids[array_position(sorted_tokens, NULL)]);
    END IF;
    IF cardinality(sorted_ids) IS NULL THEN
        RETURN;
    END IF;
    -- The wait: FOR SHARE waits for a transaction that updates, deletes or locks a row for update;
    -- each lock is taken in a subtransaction rolled back at once, so none outlives it. A pass takes
    -- every row nobody holds, without waiting; then the first row still held alone; then a pass over
    -- the rest again (what was held may be free by then): no share is kept while waiting for another
    -- row (a complete of a row passed would wait behind this call, and could deadlock with it), and
    -- a subtransaction that locks takes a transaction id only per wait, not per held row.
    remaining_ids := sorted_ids;
    LOOP
        BEGIN
            free_ids := ARRAY(SELECT m.id FROM "queue"."thumbnails" AS m WHERE m.id = ANY(remaining_ids) ORDER BY m.id FOR SHARE SKIP LOCKED);
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
        wait_id := (
            SELECT m.id FROM "queue"."thumbnails" AS m
            WHERE m.id = ANY(remaining_ids) AND m.id <> ALL(free_ids)
            ORDER BY m.id
            LIMIT 1
        );
        EXIT WHEN wait_id IS NULL;
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = wait_id FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
        remaining_ids := ARRAY(SELECT r.id FROM unnest(remaining_ids) AS r (id) WHERE r.id > wait_id ORDER BY r.id);
    END LOOP;
    -- After the wait: this statement's snapshot sees what those transactions committed.
    now_utc := clock_timestamp();
    RETURN QUERY
    SELECT
        u.id,
        CASE
            WHEN q.id IS NOT NULL AND q.lease_token = u.lease_token AND q.visible_at > now_utc THEN 'held'
            WHEN q.id IS NOT NULL AND q.lease_token = u.lease_token THEN 'expired'
            WHEN q.id IS NOT NULL THEN 'lost'
            WHEN EXISTS (SELECT FROM "queue"."thumbnails_dead" AS d WHERE d.id = u.id) THEN 'dead'
            ELSE 'gone'
        END
    FROM unnest(sorted_ids, sorted_tokens) AS u (id, lease_token)
    LEFT JOIN LATERAL (
        SELECT m.id, m.lease_token, m.visible_at FROM "queue"."thumbnails" AS m WHERE m.id = u.id OFFSET 0
    ) AS q ON true
    ORDER BY u.id;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_lease_status" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_lease_status" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_lease_status" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_complete_batch code

-- complete for up to 1,000 messages in one statement: each item fenced by its own token (NULL: by
-- worker name), one row per item in id order, completed = false where the lease was lost.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_complete_batch"(
    ids uuid[],
    lease_tokens uuid[],
    worker text
)
RETURNS TABLE (id uuid, completed boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    sorted_ids uuid[];
    sorted_tokens uuid[];
    distinct_count bigint;
    done_ids uuid[];
BEGIN
    IF thumbnails_complete_batch.worker IS NULL OR length(thumbnails_complete_batch.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_complete_batch: worker must be a name of 1 to 200 characters.';
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ008', MESSAGE = format('queue.thumbnails_complete_batch: runs only at READ COMMITTED, and this transaction is %s.', upper(current_setting('transaction_isolation')));
    END IF;
    IF thumbnails_complete_batch.ids IS NULL OR cardinality(thumbnails_complete_batch.ids) > 1000 OR array_ndims(thumbnails_complete_batch.ids) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_complete_batch: ids must be a one-dimensional array of at most 1000 ids, got %s.', coalesce(cardinality(thumbnails_complete_batch.ids)::text, 'NULL'));
    END IF;
    IF cardinality(thumbnails_complete_batch.lease_tokens) IS DISTINCT FROM cardinality(thumbnails_complete_batch.ids) OR array_ndims(thumbnails_complete_batch.lease_tokens) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_complete_batch: lease_tokens must have one element per id (NULL for none), got %s for %s ids.', coalesce(cardinality(thumbnails_complete_batch.lease_tokens)::text, 'NULL'), cardinality(thumbnails_complete_batch.ids));
    END IF;
    IF array_position(thumbnails_complete_batch.ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_complete_batch: ids[%s] is NULL.', array_position(thumbnails_complete_batch.ids, NULL));
    END IF;
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.lease_token ORDER BY u.id), count(DISTINCT u.id)
    INTO sorted_ids, sorted_tokens, distinct_count
    FROM unnest(thumbnails_complete_batch.ids, thumbnails_complete_batch.lease_tokens) AS u (id, lease_token);
    IF distinct_count < cardinality(thumbnails_complete_batch.ids) THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_complete_batch: an id is listed twice.';
    END IF;
    IF cardinality(sorted_ids) IS NULL THEN
        RETURN;
    END IF;

    -- One statement: the queue rows, then the history table (complete's order). One walk of the
    -- primary key by = ANY(sorted_ids) deletes the rows in id order (the fixed lock order: with
    -- sequential and bitmap scans off, the plan is that index scan); each row's token is the one at
    -- its id's place in sorted_ids, found by width_bucket's binary search (the ids are sorted and
    -- distinct). A join to unnest(ids, tokens) instead would be planned as a nested loop rescanning
    -- the array for every row. A row another transaction changed meanwhile is judged again on its
    -- new version.
    WITH done AS (
        DELETE FROM "queue"."thumbnails" AS m
        WHERE
            m.id = ANY(sorted_ids) AND m.leased_by IS NOT DISTINCT FROM thumbnails_complete_batch.worker
            AND m.visible_at > now_utc
            AND (
                sorted_tokens[width_bucket(m.id, sorted_ids)] IS NULL
                OR m.lease_token = sorted_tokens[width_bucket(m.id, sorted_ids)]
            )
        RETURNING m.*
    )
    SELECT array_agg(d.id) INTO done_ids FROM done AS d;
    IF cardinality(done_ids) IS DISTINCT FROM cardinality(sorted_ids) THEN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = ANY(sorted_ids) FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    END IF;
    END IF;
    RETURN QUERY
    SELECT u.id, coalesce(u.id = ANY(done_ids), false)
    FROM unnest(sorted_ids) AS u (id)
    ORDER BY u.id;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_complete_batch" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_complete_batch" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_complete_batch" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_fail_batch code

-- fail for up to 1,000 messages in one statement, with one error for all: each item fenced by its
-- own token (NULL: by worker name); one row per item in id order, outcome as fail's.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_fail_batch"(
    ids uuid[],
    lease_tokens uuid[],
    worker text,
    error text DEFAULT NULL,
    retry_after_seconds integer DEFAULT NULL
)
RETURNS TABLE (id uuid, outcome text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    retry_after integer := coalesce(thumbnails_fail_batch.retry_after_seconds, 0);
    sorted_ids uuid[];
    sorted_tokens uuid[];
    distinct_count bigint;
    retried_ids uuid[];
    buried_ids uuid[];
BEGIN
    IF thumbnails_fail_batch.worker IS NULL OR length(thumbnails_fail_batch.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_fail_batch: worker must be a name of 1 to 200 characters.';
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ008', MESSAGE = format('queue.thumbnails_fail_batch: runs only at READ COMMITTED, and this transaction is %s.', upper(current_setting('transaction_isolation')));
    END IF;
    IF retry_after NOT BETWEEN 0 AND 2592000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_fail_batch: retry_after_seconds must be between 0 and 2592000, got %s.', retry_after);
    END IF;
    IF thumbnails_fail_batch.ids IS NULL OR cardinality(thumbnails_fail_batch.ids) > 1000 OR array_ndims(thumbnails_fail_batch.ids) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_fail_batch: ids must be a one-dimensional array of at most 1000 ids, got %s.', coalesce(cardinality(thumbnails_fail_batch.ids)::text, 'NULL'));
    END IF;
    IF cardinality(thumbnails_fail_batch.lease_tokens) IS DISTINCT FROM cardinality(thumbnails_fail_batch.ids) OR array_ndims(thumbnails_fail_batch.lease_tokens) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_fail_batch: lease_tokens must have one element per id (NULL for none), got %s for %s ids.', coalesce(cardinality(thumbnails_fail_batch.lease_tokens)::text, 'NULL'), cardinality(thumbnails_fail_batch.ids));
    END IF;
    IF array_position(thumbnails_fail_batch.ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_fail_batch: ids[%s] is NULL.', array_position(thumbnails_fail_batch.ids, NULL));
    END IF;
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.lease_token ORDER BY u.id), count(DISTINCT u.id)
    INTO sorted_ids, sorted_tokens, distinct_count
    FROM unnest(thumbnails_fail_batch.ids, thumbnails_fail_batch.lease_tokens) AS u (id, lease_token);
    IF distinct_count < cardinality(thumbnails_fail_batch.ids) THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_fail_batch: an id is listed twice.';
    END IF;
    IF cardinality(sorted_ids) IS NULL THEN
        RETURN;
    END IF;

    -- One statement: the queue rows (locked in id order), then the dead-letter table (fail's order).
    WITH held AS MATERIALIZED (
        SELECT h.id, h.attempts
        FROM unnest(sorted_ids, sorted_tokens) AS i (id, lease_token)
        CROSS JOIN LATERAL (
            SELECT q.id, q.attempts
            FROM "queue"."thumbnails" AS q
            WHERE
                q.id = i.id AND q.leased_by IS NOT DISTINCT FROM thumbnails_fail_batch.worker
                AND (i.lease_token IS NULL OR q.lease_token = i.lease_token) AND q.visible_at > now_utc
            LIMIT 1
            FOR UPDATE
        ) AS h
    ),

    retried AS (
        UPDATE "queue"."thumbnails" AS m
        SET
            leased_by = NULL,
            lease_token = NULL,
            visible_at = now_utc + make_interval(secs => retry_after),
            last_error = left(thumbnails_fail_batch.error, 4000)
        WHERE m.id = ANY(ARRAY(SELECT h.id FROM held AS h WHERE h.attempts < 4))
        RETURNING m.id
    ),

    gone AS (
        DELETE FROM "queue"."thumbnails" AS m
        WHERE m.id = ANY(ARRAY(SELECT h.id FROM held AS h WHERE h.attempts >= 4))
        RETURNING m.*
    ),

    buried AS (
        INSERT INTO "queue"."thumbnails_dead" (
            id, enqueued_at, due_at, priority, attempts, last_error, last_worker, dead_at, payload
        )
        SELECT
            g.id,
            g.enqueued_at,
            g.due_at,
            g.priority,
            g.attempts,
            left(thumbnails_fail_batch.error, 4000),
            g.leased_by,
            now_utc,
            g.payload
        FROM gone AS g
        ON CONFLICT (id) DO UPDATE SET
            enqueued_at = excluded.enqueued_at,
            due_at = excluded.due_at,
            priority = excluded.priority,
            attempts = excluded.attempts,
            last_error = excluded.last_error,
            last_worker = excluded.last_worker,
            dead_at = excluded.dead_at,
            payload = excluded.payload
        RETURNING id
    )

    SELECT
        (SELECT array_agg(r.id) FROM retried AS r),
        (SELECT array_agg(b.id) FROM buried AS b)
    INTO retried_ids, buried_ids;
    IF coalesce(cardinality(retried_ids), 0) + coalesce(cardinality(buried_ids), 0) < cardinality(sorted_ids) THEN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = ANY(sorted_ids) FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    END IF;
    END IF;
    RETURN QUERY
    SELECT
        u.id,
        CASE
            WHEN u.id = ANY(retried_ids) THEN 'retrying'
            WHEN u.id = ANY(buried_ids) THEN 'dead'
            ELSE 'lost'
        END
    FROM unnest(sorted_ids) AS u (id)
    ORDER BY u.id;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_fail_batch" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_fail_batch" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_fail_batch" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_complete_next code

-- complete, then dequeue, in the caller's one transaction: one commit per message instead of two.
-- The rows are dequeue's with previous_completed (complete's answer) added; when nothing is ready,
-- one row with a NULL id carries it.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_complete_next"(
    id uuid,
    worker text,
    lease_token uuid DEFAULT NULL,
    batch_size integer DEFAULT 1,
    lease_seconds integer DEFAULT NULL
)
RETURNS SETOF "queue"."thumbnails_complete_next_result"
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    done_count bigint;
    completed_now boolean;
    effective_lease integer := coalesce(thumbnails_complete_next.lease_seconds, 120);
BEGIN
    IF thumbnails_complete_next.worker IS NULL OR length(thumbnails_complete_next.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_complete_next: worker must be a name of 1 to 200 characters.';
    END IF;
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_complete_next: batch_size must be between 1 and 1000, got %s.', coalesce(batch_size::text, 'NULL'));
    END IF;
    IF effective_lease NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_complete_next: lease_seconds must be between 1 and 604800, got %s.', effective_lease);
    END IF;
    -- complete's statements in this function's body (a call of complete would cost a function entry).
    DELETE FROM "queue"."thumbnails" AS m
    WHERE m.id = thumbnails_complete_next.id AND m.leased_by IS NOT DISTINCT FROM thumbnails_complete_next.worker
        AND (thumbnails_complete_next.lease_token IS NULL OR m.lease_token = thumbnails_complete_next.lease_token)
        AND m.visible_at > now_utc;
    GET DIAGNOSTICS done_count = ROW_COUNT;
    IF done_count = 0 THEN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        BEGIN
            PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_complete_next.id FOR SHARE;
            RAISE SQLSTATE 'TQ900';
        EXCEPTION WHEN SQLSTATE 'TQ900' THEN
            NULL;
        END;
    END IF;
    END IF;
    completed_now := done_count > 0;
    RETURN QUERY
    SELECT d.id, d.payload, d.enqueued_at, d.due_at, d.attempts, d.lease_token, completed_now
    FROM "queue"."thumbnails_dequeue"(thumbnails_complete_next.batch_size, thumbnails_complete_next.worker, thumbnails_complete_next.lease_seconds) AS d;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::uuid, NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::integer, NULL::uuid, completed_now;
    END IF;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_complete_next" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_complete_next" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_complete_next" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_wait_step code

-- One step of S.Q_wait: true when a message is ready that this session's dequeue would hand out
-- now; otherwise a sleep, then false, or NULL once wait_ms have passed since started_at. The sleep
-- is a quarter of the time waited so far, at least 5 ms and at most 50 ms: a message that comes
-- soon after a consumer started waiting wakes it within a few ms, while a consumer that stays idle
-- probes 20 times a second (each step costs a commit and a wake-up, not only the probe).
-- A row an open dequeue (or complete, fail, release) has locked is not ready: FOR KEY
-- SHARE SKIP LOCKED passes over it, as READPAST does on SQL Server; the weakest row lock there is,
-- on the one row found, which the caller's next COMMIT ends at once.
-- Everything but the COMMITs is here, with definer rights and a pinned search_path: PostgreSQL
-- refuses COMMIT in such a procedure (2D000), and the procedure, run with the caller's search_path,
-- evaluates no operator.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_wait_step"(wait_ms integer, started_at timestamptz)
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
    current_level integer;
    expired_state text := current_setting('tablequeue.queue.thumbnails.expired', true);
BEGIN
    IF wait_ms IS NULL OR wait_ms NOT BETWEEN 0 AND 20000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_wait: wait_ms must be between 0 and 20000, got %s.', coalesce(wait_ms::text, 'NULL'));
    END IF;
    deadline := started_at + make_interval(secs => wait_ms / 1000.0);
    -- One probe per priority level present, from the top (the loose index scan of dequeue).
    current_level := (SELECT m.priority FROM "queue"."thumbnails" AS m WHERE m.leased_by IS NULL ORDER BY m.priority DESC LIMIT 1);
    WHILE current_level IS NOT NULL LOOP
        PERFORM
        FROM "queue"."thumbnails" AS m
        WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at <= now_utc
        ORDER BY m.visible_at, m.seq
        LIMIT 1
        FOR KEY SHARE SKIP LOCKED;
        IF FOUND THEN
            RETURN true;
        END IF;
        current_level := (
            SELECT m.priority FROM "queue"."thumbnails" AS m
            WHERE m.priority < current_level AND m.leased_by IS NULL
            ORDER BY m.priority DESC
            LIMIT 1
        );
    END LOOP;
    -- An expired lease, when this session's dequeue would look for one now (w.expired_due): not
    -- sooner, or the caller would dequeue nothing and be woken again at once until its look is due.
    -- A probe that finds none counts as the session's look (the next is due a second later), as
    -- dequeue's does: it reads every lease the queue holds, and would otherwise at every step.
    IF (expired_state IS NULL OR length(expired_state) <> 16 OR expired_state COLLATE "C" <= (extract(EPOCH FROM now_utc) * 1000000)::bigint::text
        OR expired_state COLLATE "C" > ((extract(EPOCH FROM now_utc) * 1000000)::bigint + 1000000)::text) THEN
        PERFORM
        FROM "queue"."thumbnails" AS m
        WHERE m.leased_by IS NOT NULL AND m.visible_at <= now_utc
        ORDER BY m.leased_by, m.leased_at
        LIMIT 1
        FOR KEY SHARE SKIP LOCKED;
        IF FOUND THEN
            RETURN true;
        END IF;
        expired_state := set_config('tablequeue.queue.thumbnails.expired', ((extract(EPOCH FROM now_utc) * 1000000)::bigint + 1000000)::text, false);
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

ALTER FUNCTION "queue"."thumbnails_wait_step" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_wait_step" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_wait_step" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_wait code

-- Returns ready = true as soon as a message is ready to dequeue, false after wait_ms. Each step is a
-- transaction of its own: COMMIT, then S.Q_wait_step (a probe, a sleep of 5 to 50 ms); so it holds
-- no lock and no transaction between steps, and the snapshot it holds while it sleeps is renewed
-- every step (backend_xmin moves on: vacuum is not held back). It claims nothing: the caller
-- dequeues next, in its own transaction. Because it commits it must be CALLed outside a transaction
-- block (autocommit): a caller that has written is refused (TQ003), any other open transaction
-- block by PostgreSQL at the first COMMIT (2D000). No definer rights and no pinned search_path, as
-- S.Q_process; its step is schema-qualified and it evaluates no operator the caller's search_path
-- could resolve. With notify: true, LISTEN on the queue's channel wakes a client sooner.
CREATE OR REPLACE PROCEDURE "queue"."thumbnails_wait"(
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
        RAISE EXCEPTION USING ERRCODE = 'TQ003', MESSAGE = 'queue.thumbnails_wait: commits between its steps and cannot run inside an open transaction.';
    END IF;
    LOOP
        COMMIT;
        step_ready := "queue"."thumbnails_wait_step"(wait_ms, started_at);
        EXIT WHEN step_ready OR step_ready IS NULL;
    END LOOP;
    ready := step_ready IS NOT NULL;
    COMMIT;
END;
$procedure$;

ALTER PROCEDURE "queue"."thumbnails_wait" OWNER TO "queue_owner";
REVOKE ALL ON PROCEDURE "queue"."thumbnails_wait" FROM public;
GRANT EXECUTE ON PROCEDURE "queue"."thumbnails_wait" TO "queue_consumer";

-- tablequeue:unit queue.thumbnails_stats code

-- ready: visible_at <= now (new, due, retried, or with an expired lease: all claimable);
-- delayed: not yet due and not leased; in_flight: under a live lease; dead: in S.Q_dead.
-- Messages nobody leases are counted on ix_thumbnails_ready, leased ones (expired or live) on
-- ix_thumbnails_lease_start: as many as leases held.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_stats"()
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
    -- Every count stops at exact_limit rows and reads only an index range that the count matches
    -- (each in its index's order: a plan made with statistics costs LIMIT against a guessed share of
    -- the rows and would take a sequential scan that reads the whole table when few rows match);
    -- past the limit the planner's row estimate stands in, so a deep queue never costs a full scan.
    exact_limit constant bigint := 10000;
    now_utc timestamptz := clock_timestamp();
    ready_count bigint := 0;
    expired_count bigint;
    ready_capped boolean := false;
    delayed_capped boolean := false;
    grouped_capped boolean := false;
    expired_oldest timestamptz;
    delayed_count bigint := 0;
    in_flight_count bigint;
    dead_count bigint;
    total_estimate bigint;
    is_estimate boolean := false;
    oldest_ready timestamptz;
    current_level integer;
    level_oldest timestamptz;
BEGIN
    -- One priority level at a time, as the claim reads the index, until both counts passed the limit
    -- (one that did reads no more: LIMIT 0); each level visited gives its oldest.
    current_level := (SELECT m.priority FROM "queue"."thumbnails" AS m WHERE m.leased_by IS NULL ORDER BY m.priority DESC LIMIT 1);
    WHILE current_level IS NOT NULL AND (ready_count <= exact_limit OR delayed_count <= exact_limit) LOOP
        ready_count := ready_count + (SELECT count(*) FROM (
            SELECT 1 FROM "queue"."thumbnails" AS m
            WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at <= now_utc
            ORDER BY m.visible_at, m.seq
            LIMIT greatest(exact_limit + 1 - ready_count, 0)
        ) AS counted);
        delayed_count := delayed_count + (SELECT count(*) FROM (
            SELECT 1 FROM "queue"."thumbnails" AS m
            WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at > now_utc
            ORDER BY m.visible_at, m.seq
            LIMIT greatest(exact_limit + 1 - delayed_count, 0)
        ) AS counted);
        level_oldest := (
            SELECT m.visible_at FROM "queue"."thumbnails" AS m
            WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at <= now_utc
            ORDER BY m.visible_at, m.seq
            LIMIT 1
        );
        oldest_ready := least(oldest_ready, level_oldest);
        current_level := (
            SELECT m.priority FROM "queue"."thumbnails" AS m
            WHERE m.priority < current_level AND m.leased_by IS NULL
            ORDER BY m.priority DESC
            LIMIT 1
        );
    END LOOP;
    ready_capped := ready_count > exact_limit;
    delayed_capped := delayed_count > exact_limit;
    -- Expired leases are ready too, the oldest expiry maybe the oldest of all.
    -- Along ix_thumbnails_lease_start's order, so that the plan walks it (w.expired_order).
    SELECT count(*), min(e.visible_at) INTO expired_count, expired_oldest FROM (
        SELECT m.visible_at FROM "queue"."thumbnails" AS m
        WHERE m.leased_by IS NOT NULL AND m.visible_at <= now_utc
        ORDER BY m.leased_by, m.leased_at
        LIMIT exact_limit + 1
    ) AS e;
    -- Each count stopped at exact_limit on its own: only one that did is an estimate.
    ready_capped := ready_capped OR expired_count > exact_limit;
    ready_count := ready_count + expired_count;
    oldest_ready := least(oldest_ready, expired_oldest);
    SELECT count(*) INTO in_flight_count FROM (
        SELECT 1 FROM "queue"."thumbnails" AS m
        WHERE m.leased_by IS NOT NULL AND m.visible_at > now_utc
        ORDER BY m.leased_by, m.leased_at
        LIMIT exact_limit + 1
    ) AS counted;
    SELECT count(*) INTO dead_count FROM (
        SELECT 1 FROM "queue"."thumbnails_dead" AS d LIMIT exact_limit + 1
    ) AS counted;

    IF ready_capped OR delayed_capped OR grouped_capped OR in_flight_count > exact_limit THEN
        is_estimate := true;
        total_estimate := (
            SELECT CASE
                WHEN c.reltuples > 0 AND c.relpages > 0
                    THEN (c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::integer))::bigint
                ELSE 0
            END
            FROM pg_class AS c
            WHERE c.oid = '"queue"."thumbnails"'::regclass
        );
        IF ready_capped THEN
            ready_count := greatest(ready_count, total_estimate - delayed_count - in_flight_count);
        ELSIF delayed_capped THEN
            delayed_count := greatest(delayed_count, total_estimate - ready_count - in_flight_count);
        ELSE
            in_flight_count := greatest(in_flight_count, total_estimate - ready_count - delayed_count);
        END IF;
    END IF;
    IF dead_count > exact_limit THEN
        is_estimate := true;
        dead_count := greatest(dead_count, (
            SELECT CASE
                WHEN c.reltuples > 0 AND c.relpages > 0
                    THEN (c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::integer))::bigint
                ELSE 0
            END
            FROM pg_class AS c
            WHERE c.oid = '"queue"."thumbnails_dead"'::regclass
        ));
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

ALTER FUNCTION "queue"."thumbnails_stats" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_stats" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_stats" TO "queue_admin";

-- tablequeue:unit queue.thumbnails_purge code

-- Removes queue messages (leased ones too: their complete then reports false). The dead-letter
-- table is emptied with dead_delete / dead_requeue, the history with history_purge.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_purge"(
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
    leased_count bigint;
BEGIN
    IF thumbnails_purge.max_rows < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_purge: max_rows must be at least 1, got %s.', thumbnails_purge.max_rows);
    END IF;
    IF thumbnails_purge.max_rows IS NULL AND pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_purge: max_rows is required in a transaction.';
    END IF;
    -- SKIP LOCKED leaves the rows a claim holds right now. Oldest first; LIMIT NULL is no limit.
    -- The doomed ids as an array, not a join: a generic plan (PL/pgSQL's own after a few calls, or
    -- plan_cache_mode) costs LIMIT max_rows at a tenth of the table and joins by hashing a sequential
    -- scan of all of it; an array is probed on the primary key whatever its size.
    -- No index leads on seq: the messages nobody leases in claim order along ix_thumbnails_ready, then
    -- the leased ones along ix_thumbnails_lease_start.
    WITH doomed AS (
        SELECT m.id FROM "queue"."thumbnails" AS m
        WHERE m.leased_by IS NULL AND (thumbnails_purge.older_than IS NULL OR m.enqueued_at < thumbnails_purge.older_than)
        ORDER BY m.priority DESC, m.visible_at, m.seq
        LIMIT thumbnails_purge.max_rows
        FOR UPDATE SKIP LOCKED
    ),

    deleted AS (
        DELETE FROM "queue"."thumbnails" AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
    )

    SELECT count(*) INTO purged_count FROM deleted;
    IF thumbnails_purge.max_rows IS NULL OR purged_count < thumbnails_purge.max_rows THEN
        WITH doomed AS (
            SELECT m.id FROM "queue"."thumbnails" AS m
            WHERE m.leased_by IS NOT NULL AND (thumbnails_purge.older_than IS NULL OR m.enqueued_at < thumbnails_purge.older_than)
            ORDER BY m.leased_by, m.leased_at
            LIMIT thumbnails_purge.max_rows - purged_count
            FOR UPDATE SKIP LOCKED
        ),

        deleted AS (
            DELETE FROM "queue"."thumbnails" AS m WHERE m.id = ANY(ARRAY(SELECT d.id FROM doomed AS d)) RETURNING 1
        )

        SELECT count(*) INTO leased_count FROM deleted;
        purged_count := purged_count + leased_count;
    END IF;
    RETURN QUERY SELECT purged_count;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_purge" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_purge" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_purge" TO "queue_admin";

-- tablequeue:unit queue.thumbnails_dead_list code

-- Paged by id: pass the last id of a page as after_id to read the next one. (page_size, not
-- `limit`: a reserved word in PostgreSQL would need quoting at every call.)
CREATE OR REPLACE FUNCTION "queue"."thumbnails_dead_list"(
    after_id uuid DEFAULT NULL,
    page_size integer DEFAULT 100
)
RETURNS TABLE (
    id uuid,
    payload jsonb,
    enqueued_at timestamptz,
    due_at timestamptz,
    priority integer,
    attempts integer,
    last_error text,
    last_worker text,
    dead_at timestamptz
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
BEGIN
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_dead_list: page_size must be between 1 and 1000, got %s.', coalesce(page_size::text, 'NULL'));
    END IF;
    RETURN QUERY
    SELECT
        d.id,
        d.payload,
        d.enqueued_at,
        d.due_at,
        d.priority,
        d.attempts,
        d.last_error,
        d.last_worker,
        d.dead_at
    FROM "queue"."thumbnails_dead" AS d
    WHERE thumbnails_dead_list.after_id IS NULL OR d.id > thumbnails_dead_list.after_id
    ORDER BY d.id
    LIMIT page_size;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_dead_list" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_dead_list" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_dead_list" TO "queue_admin";

-- tablequeue:unit queue.thumbnails_dead_requeue code

-- Back to the queue under the same id, visible now, attempts reset; the last error stays on the
-- row for reference.
CREATE OR REPLACE FUNCTION "queue"."thumbnails_dead_requeue"(id uuid)
RETURNS TABLE (requeued boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    dead_row record;
    moved bigint;
BEGIN
    IF thumbnails_dead_requeue.id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_dead_requeue: id must not be NULL.';
    END IF;
    -- Queue table first (the fixed lock order): the same client id may have been enqueued again.
    PERFORM FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_dead_requeue.id FOR UPDATE;
    IF FOUND THEN
        IF NOT EXISTS (SELECT FROM "queue"."thumbnails_dead" AS d WHERE d.id = thumbnails_dead_requeue.id) THEN
            RAISE EXCEPTION USING ERRCODE = 'TQ004', MESSAGE = format('queue.thumbnails_dead_requeue: no dead-letter message with id %s.', thumbnails_dead_requeue.id);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_dead_requeue: a message with id %s is in the queue already.', thumbnails_dead_requeue.id);
    END IF;
    -- The dead row, locked: a concurrent requeue or delete of the same id waits here and then finds
    -- it gone (not_found), instead of colliding with this one's insert.
    SELECT d.* INTO dead_row FROM "queue"."thumbnails_dead" AS d WHERE d.id = thumbnails_dead_requeue.id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ004', MESSAGE = format('queue.thumbnails_dead_requeue: no dead-letter message with id %s.', thumbnails_dead_requeue.id);
    END IF;
    INSERT INTO "queue"."thumbnails" AS m (id, enqueued_at, due_at, visible_at, priority, attempts, last_error, payload)
    VALUES (
        dead_row.id, dead_row.enqueued_at, dead_row.due_at, now_utc, dead_row.priority, 0,
        dead_row.last_error, dead_row.payload
    )
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved = 0 THEN
        IF EXISTS (SELECT FROM "queue"."thumbnails" AS m WHERE m.id = thumbnails_dead_requeue.id) THEN
            RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = format('queue.thumbnails_dead_requeue: a message with id %s is in the queue already.', thumbnails_dead_requeue.id);
        END IF;
        -- No ON CONFLICT: whatever
        -- collides now raises rather than losing the message.
        INSERT INTO "queue"."thumbnails" AS m (id, enqueued_at, due_at, visible_at, priority, attempts, last_error, payload)
        VALUES (
            dead_row.id, dead_row.enqueued_at, dead_row.due_at, now_utc, dead_row.priority, 0,
            dead_row.last_error, dead_row.payload
        );
    END IF;
    DELETE FROM "queue"."thumbnails_dead" AS d WHERE d.id = thumbnails_dead_requeue.id;
    RETURN QUERY SELECT true;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_dead_requeue" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_dead_requeue" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_dead_requeue" TO "queue_admin";

-- tablequeue:unit queue.thumbnails_dead_delete code

CREATE OR REPLACE FUNCTION "queue"."thumbnails_dead_delete"(id uuid)
RETURNS TABLE (deleted boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $function$
#variable_conflict use_column
DECLARE
    removed bigint;
BEGIN
    IF thumbnails_dead_delete.id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = 'queue.thumbnails_dead_delete: id must not be NULL.';
    END IF;
    DELETE FROM "queue"."thumbnails_dead" AS d WHERE d.id = thumbnails_dead_delete.id;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ004', MESSAGE = format('queue.thumbnails_dead_delete: no dead-letter message with id %s.', thumbnails_dead_delete.id);
    END IF;
    RETURN QUERY SELECT true;
END;
$function$;

ALTER FUNCTION "queue"."thumbnails_dead_delete" OWNER TO "queue_owner";
REVOKE ALL ON FUNCTION "queue"."thumbnails_dead_delete" FROM public;
GRANT EXECUTE ON FUNCTION "queue"."thumbnails_dead_delete" TO "queue_admin";

-- tablequeue:unit queue.thumbnails_process code

-- The in-database worker (Darling's loop): claim one message and COMMIT (the attempt and the lease
-- are durable before the handler runs, so a session that dies mid-message still counts it), CALL
-- the handler, complete in the same transaction as the handler's own writes, COMMIT; or, when the
-- handler raises, roll its writes back and record its error with fail. Safe to run from many
-- sessions at once (each is its own worker, 'process:<backend pid>').
--
-- Unlike every function here it has no definer rights and no pinned search_path: PostgreSQL refuses
-- COMMIT in a procedure that has either (SQLSTATE 2D000). Nothing is lost by it: the procedure
-- touches no table itself; it calls the definer functions dequeue / complete / fail, so its
-- caller needs EXECUTE on those (S_consumer) and on the handler. It runs with the caller's rights
-- and search_path, and the schemas on that path may be writable by others: every routine it calls
-- is schema-qualified, and every operator it evaluates is pg_catalog's, written out where
-- pg_catalog has no exact match (an operator of exact types elsewhere on the path would win).
CREATE OR REPLACE PROCEDURE "queue"."thumbnails_process"(
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
    handler_unrunnable boolean;
    handler_found oid;
    handler_problem text;
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
        RAISE EXCEPTION USING ERRCODE = 'TQ003', MESSAGE = 'queue.thumbnails_process: commits once per message and cannot run inside an open transaction.';
    END IF;
    IF time_budget_seconds IS NULL OR time_budget_seconds NOT BETWEEN 1 AND 86400 THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ001', MESSAGE = pg_catalog.format('queue.thumbnails_process: time_budget_seconds must be between 1 and 86400, got %s.', coalesce(time_budget_seconds::text, 'NULL'));
    END IF;
    COMMIT;
    -- Every transaction this procedure begins, right after each COMMIT, before any query.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    -- A handler the CALL cannot run would fail every message at the CALL until each one is
    -- dead-lettered: no schema (3F000) or no USAGE on it, no procedure of this signature (PostgreSQL
    -- overloads: one of other types is 42883), no EXECUTE (42501; the handler runs with the
    -- caller's rights), or an overload with defaults that makes the call ambiguous (42725).
    SELECT
        CASE
            WHEN n.oid IS NULL THEN 'schema queue of handler procedure queue.make_thumbnail does not exist.'
            WHEN NOT coalesce(pg_catalog.has_schema_privilege(n.oid, 'USAGE'), false)
                THEN 'the caller has no USAGE on schema queue of handler procedure queue.make_thumbnail: grant it.'
            WHEN p.oid IS NULL
                THEN 'handler procedure queue.make_thumbnail(id uuid, payload jsonb) does not exist.'
            WHEN NOT coalesce(pg_catalog.has_function_privilege(p.oid, 'EXECUTE'), false)
                THEN 'the caller may not execute handler procedure queue.make_thumbnail: grant EXECUTE on it.'
            WHEN EXISTS (
                SELECT FROM pg_catalog.pg_proc AS o
                WHERE
                    o.pronamespace OPERATOR(pg_catalog.=) n.oid
                    AND o.proname OPERATOR(pg_catalog.=) 'make_thumbnail'
                    AND o.oid OPERATOR(pg_catalog.<>) p.oid
                    AND o.pronargs OPERATOR(pg_catalog.>) 2
                    AND pg_catalog.int2mi(o.pronargs, o.pronargdefaults) OPERATOR(pg_catalog.<=) 2
                    AND o.proargtypes[0] OPERATOR(pg_catalog.=) p.proargtypes[0]
                    AND o.proargtypes[1] OPERATOR(pg_catalog.=) p.proargtypes[1]
            ) THEN 'another routine queue.make_thumbnail(uuid, jsonb, ...) with defaults makes its call ambiguous.'
        END,
        p.oid
    INTO handler_problem, handler_found
    FROM (VALUES (1)) AS one (x)
    LEFT JOIN pg_catalog.pg_namespace AS n ON n.nspname OPERATOR(pg_catalog.=) 'queue'
    LEFT JOIN pg_catalog.pg_proc AS p
        ON
            p.pronamespace OPERATOR(pg_catalog.=) n.oid
            AND p.proname OPERATOR(pg_catalog.=) 'make_thumbnail'
            AND p.prokind OPERATOR(pg_catalog.=) 'p'
            AND pg_catalog.oidvectortypes(p.proargtypes) OPERATOR(pg_catalog.=) 'uuid, jsonb';
    IF handler_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ005', MESSAGE = pg_catalog.format('queue.thumbnails_process: %s', handler_problem);
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
        transient_retries := 0;
        LOOP
            BEGIN
                SELECT d.id, d.payload INTO message
                FROM "queue"."thumbnails_dequeue"(batch_size => 1, worker => worker_name) AS d;
                claimed := FOUND;
                EXIT;
            EXCEPTION WHEN deadlock_detected OR lock_not_available OR serialization_failure THEN
                IF transient_retries >= 3 THEN
                    RAISE;
                END IF;
                transient_retries := transient_retries + 1;
                PERFORM pg_catalog.pg_sleep(pg_catalog.float8pl(0.02, pg_catalog.float8mul(pg_catalog.random(), 0.18)));
            END;
        END LOOP;
        EXIT WHEN NOT claimed;
        COMMIT;
        SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
        processed := processed + 1;
        transient_retries := 0;

        handler_unrunnable := false;
        LOOP
            lease_lost := false;
            BEGIN
                EXECUTE pg_catalog.format('CALL %I.%I($1, $2)', 'queue', 'make_thumbnail')
                USING message.id, message.payload;
                SELECT c.completed INTO lease_kept
                FROM "queue"."thumbnails_complete"(id => message.id, worker => worker_name) AS c;
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
                -- An error that can mean the handler cannot be run (dropped, renamed, moved, its
                -- schema renamed or dropped, USAGE or EXECUTE revoked, an ambiguous overload added
                -- while process runs: 42883, 42501, 3F000, 42725) is not the message's fault when
                -- the handler check, by name as the CALL looks it up, now fails: handled after
                -- this block (no COMMIT inside a block with a handler). Raised inside a handler
                -- that is still there and runnable (a handler replaced under the run by DROP and
                -- CREATE too: the check goes by name, as the CALL), it is the handler's own error,
                -- recorded with fail as any other, as on SQL Server. 42809: replaced by a function.
                IF error_state IN ('42883', '42501', '3F000', '42725', '42809') THEN
                    SELECT
                        CASE
                            WHEN n.oid IS NULL THEN 'schema queue of handler procedure queue.make_thumbnail does not exist.'
                            WHEN NOT coalesce(pg_catalog.has_schema_privilege(n.oid, 'USAGE'), false)
                                THEN 'the caller has no USAGE on schema queue of handler procedure queue.make_thumbnail: grant it.'
                            WHEN p.oid IS NULL
                                THEN 'handler procedure queue.make_thumbnail(id uuid, payload jsonb) does not exist.'
                            WHEN NOT coalesce(pg_catalog.has_function_privilege(p.oid, 'EXECUTE'), false)
                                THEN 'the caller may not execute handler procedure queue.make_thumbnail: grant EXECUTE on it.'
                            WHEN EXISTS (
                                SELECT FROM pg_catalog.pg_proc AS o
                                WHERE
                                    o.pronamespace OPERATOR(pg_catalog.=) n.oid
                                    AND o.proname OPERATOR(pg_catalog.=) 'make_thumbnail'
                                    AND o.oid OPERATOR(pg_catalog.<>) p.oid
                                    AND o.pronargs OPERATOR(pg_catalog.>) 2
                                    AND pg_catalog.int2mi(o.pronargs, o.pronargdefaults) OPERATOR(pg_catalog.<=) 2
                                    AND o.proargtypes[0] OPERATOR(pg_catalog.=) p.proargtypes[0]
                                    AND o.proargtypes[1] OPERATOR(pg_catalog.=) p.proargtypes[1]
                            ) THEN 'another routine queue.make_thumbnail(uuid, jsonb, ...) with defaults makes its call ambiguous.'
                        END,
                        p.oid
                    INTO handler_problem, handler_found
                    FROM (VALUES (1)) AS one (x)
                    LEFT JOIN pg_catalog.pg_namespace AS n ON n.nspname OPERATOR(pg_catalog.=) 'queue'
                    LEFT JOIN pg_catalog.pg_proc AS p
                        ON
                            p.pronamespace OPERATOR(pg_catalog.=) n.oid
                            AND p.proname OPERATOR(pg_catalog.=) 'make_thumbnail'
                            AND p.prokind OPERATOR(pg_catalog.=) 'p'
                            AND pg_catalog.oidvectortypes(p.proargtypes) OPERATOR(pg_catalog.=) 'uuid, jsonb';
                    IF handler_problem IS NOT NULL THEN
                        handler_unrunnable := true;
                        EXIT;
                    END IF;
                END IF;
                IF error_state IN ('40P01', '55P03', '40001') AND transient_retries < 3 THEN
                    transient_retries := transient_retries + 1;
                    PERFORM pg_catalog.pg_sleep(pg_catalog.float8pl(0.02, pg_catalog.float8mul(pg_catalog.random(), 0.18)));
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
                transient_retries := 0;
                LOOP
                    BEGIN
                        SELECT f.outcome INTO outcome_text
                        FROM "queue"."thumbnails_fail"(
                            id => message.id, worker => worker_name, error => error_text, retry_after_seconds => 0
                        ) AS f;
                        EXIT;
                    EXCEPTION WHEN deadlock_detected OR lock_not_available OR serialization_failure THEN
                        IF transient_retries >= 3 THEN
                            RAISE;
                        END IF;
                        transient_retries := transient_retries + 1;
                        PERFORM pg_catalog.pg_sleep(pg_catalog.float8pl(0.02, pg_catalog.float8mul(pg_catalog.random(), 0.18)));
                    END;
                END LOOP;
                IF outcome_text <> 'lost' THEN
                    failed := failed + 1;
                END IF;
                EXIT;
            END;
        END LOOP;
        IF handler_unrunnable THEN
            -- The lease goes back with its attempt, as release gives it (nothing if the lease had
            -- already expired), and process stops.
            transient_retries := 0;
            LOOP
                BEGIN
                    SELECT r.released INTO lease_kept
                    FROM "queue"."thumbnails_release"(id => message.id, worker => worker_name) AS r;
                    EXIT;
                EXCEPTION WHEN deadlock_detected OR lock_not_available OR serialization_failure THEN
                    IF transient_retries >= 3 THEN
                        RAISE;
                    END IF;
                    transient_retries := transient_retries + 1;
                    PERFORM pg_catalog.pg_sleep(pg_catalog.float8pl(0.02, pg_catalog.float8mul(pg_catalog.random(), 0.18)));
                END;
            END LOOP;
            COMMIT;
            -- What the run did is in the message: the refusal ends it without its row.
            RAISE EXCEPTION USING ERRCODE = 'TQ005', MESSAGE = pg_catalog.format('queue.thumbnails_process: the handler can no longer be run; message %s %s after %s processed, %s completed, %s failed; the handler''s call raised: SQLSTATE %s: %s', message.id, CASE WHEN lease_kept THEN 'handed back' ELSE 'not handed back (its lease was no longer held)' END, processed, completed, failed, error_state, error_text);
        END IF;
        COMMIT;
        SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    END LOOP;
END;
$procedure$;

ALTER PROCEDURE "queue"."thumbnails_process" OWNER TO "queue_owner";
REVOKE ALL ON PROCEDURE "queue"."thumbnails_process" FROM public;
GRANT EXECUTE ON PROCEDURE "queue"."thumbnails_process" TO "queue_admin";
-- process cannot be SECURITY DEFINER (PostgreSQL refuses COMMIT there), so the functions it calls
-- check its caller's rights: the admin role that runs it needs dequeue, complete, fail and release too
-- (SQL Server's ownership chain needs no such grant). The handler runs with the caller's rights as
-- well: grant the admin role what it does (database/examples/handlers/postgres).
GRANT EXECUTE ON FUNCTION
"queue"."thumbnails_dequeue",
"queue"."thumbnails_complete",
"queue"."thumbnails_fail",
"queue"."thumbnails_release"
TO "queue_admin";
