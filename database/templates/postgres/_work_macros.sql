{#-
  PL/pgSQL fragments of the work kind used by more than one function: argument checks, the claim
  statement and the move to the dead-letter table. Imported "with context" by work.sql, which sets:
  t, dead_t, fn, tie, has_priority, dedupe, client_ids, max_attempts.
-#}
{% import '_macros.sql' as m with context %}
{% import '_group_macros.sql' as grp with context %}

{#- After a lease-guarded statement changed nothing: at READ COMMITTED the lease is simply not the
    caller's (any more). In a REPEATABLE READ or SERIALIZABLE transaction the statement judged the
    lease by the transaction's old snapshot, so a lease renewed since (extend_lease on another
    connection) looks lost: locking the row raises serialization_failure (40001) instead of a wrong
    answer, and the caller retries its transaction as it must at those levels anyway. The lock is
    wanted only for that error: a subtransaction takes it and is rolled back at once (a private
    condition), so a row whose lease really is lost stays unlocked for the rest of the caller's
    transaction; 40001 is not caught and reaches the caller. id_sql: the row(s) the verb addressed.
    wait_verb (extend_lease passes its name): at READ COMMITTED too, wait for a transaction that holds the
    caller's lease's row (a complete deleting it, a claim): the statement judged the row version it
    could see, and one whose lease had run out was passed over without waiting. SQL Server's UPDATE
    waits on the row's update lock; so false then means that no complete of the lease is in flight
    (the Spark drain's sweep relies on it). FOR KEY SHARE, filtered on the caller's lease (worker and
    token, not the expiry): a transaction of the message's new holder is not waited for. -#}
{% macro lost_under_snapshot(id_sql, wait_verb=none) %}
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
{{ m.locked_a_moment('PERFORM FROM ' ~ t ~ ' AS m WHERE ' ~ id_sql ~ ' FOR SHARE;') | indent(4, first=true) }}
{% if wait_verb %}
{% set here = fn ~ '_' ~ wait_verb %}
    ELSE
{% set wait_for_lease %}
PERFORM FROM {{ t }} AS m
WHERE
    {{ id_sql }} AND m.leased_by IS NOT DISTINCT FROM {{ here }}.worker
    AND ({{ here }}.lease_token IS NULL OR m.lease_token = {{ here }}.lease_token)
FOR KEY SHARE;
{%- endset %}
{{ m.locked_a_moment(wait_for_lease) | indent(4, first=true) }}
{% endif %}
    END IF;
{%- endmacro %}

{#- ix_<q>_ready's predicate over alias `alias`: every claim from it repeats it, so that the planner
    can use the partial index. -#}
{% macro ready_filter(alias=none) %}{{ m.ready_predicate(groups, alias) }}{% endmacro %}

{#- Leased messages whose lease has expired (a crashed or stopped worker's), over alias `alias`: in
    ix_<q>_lease_start, not in ix_<q>_ready (with groups: of those without a group; a grouped head is
    found again on ix_<q>_heads, whose entries a lease keeps). -#}
{#- The look's order: ix_<q>_lease_start's own, so that its plan walks that index and stops at the batch
    (a plan cached on an empty queue for an order no index gives, visible_at, is a sort over a
    sequential scan of the whole table; tests/test_plans_at_depth.py). -#}
{% set expired_order = 'm.leased_by, m.leased_at' %}
{#- With groups `coalesce(group_key IS NULL, false)`, which means group_key IS NULL: the planner
    costs IS NULL of a column it has no statistics for (a plan cached on an empty queue) at 0.5 %, and
    chose a sort over a sequential scan of the whole table for the one-message look; a coalesce() it
    costs at half, and walks ix_<q>_lease_start. -#}
{% macro expired_filter(alias) -%}
{{ alias }}.leased_by IS NOT NULL{% if groups %} AND coalesce({{ alias }}.group_key IS NULL, false){% endif %} AND {{ alias }}.visible_at <= now_utc
{%- endmacro %}

{#- A session looks for expired leases at most once a second (dequeue, and wait_step's probe), so that
    the look, which reads every lease the queue holds, costs a busy consumer once a second and not on
    every call. The setting holds when the next look is due: epoch microseconds (16 digits from 2001
    to 2286) as text, compared as text in the C collation, so that no value a session sets (the
    settings are the session's to change) can raise; one more than a second ahead is not trusted. -#}
{% macro expired_setting() %}{{ m.position_setting('.expired') }}{% endmacro %}
{% macro epoch_us(expr) %}(extract(EPOCH FROM {{ expr }}) * 1000000)::bigint{% endmacro %}
{% macro expired_due(state) -%}
({{ state }} IS NULL OR length({{ state }}) <> 16 OR {{ state }} COLLATE "C" <= {{ epoch_us('now_utc') }}::text
        OR {{ state }} COLLATE "C" > ({{ epoch_us('now_utc') }} + 1000000)::text)
{%- endmacro %}
{% macro expired_looked(state) %}
    {{ state }} := set_config({{ expired_setting() }}, ({{ epoch_us('now_utc') }} + 1000000)::text, false);
{%- endmacro %}

{#- The lease guard of complete, fail, extend_lease, release: the message, leased by this worker,
    the lease still live and, given a token, the lease that token names (0.1.0 callers pass none and
    keep the check by name, deprecated). IS NOT DISTINCT FROM (worker is never NULL here): with `=`
    the planner may pick ix_lease_start over the primary key, and read through every dead entry of
    the worker's finished leases while an old snapshot holds them back. -#}
{% macro lease_guard(verb) -%}
m.id = {{ fn }}_{{ verb }}.id AND m.leased_by IS NOT DISTINCT FROM {{ fn }}_{{ verb }}.worker
        AND ({{ fn }}_{{ verb }}.lease_token IS NULL OR m.lease_token = {{ fn }}_{{ verb }}.lease_token)
        AND m.visible_at > now_utc
{%- endmacro %}

{% macro check_worker(verb) %}
    IF {{ fn }}_{{ verb }}.worker IS NULL OR length({{ fn }}_{{ verb }}.worker) NOT BETWEEN 1 AND 200 THEN
{{ m.throw('invalid_argument', "'" ~ names.plain('_' ~ verb) ~ ": worker must be a name of 1 to 200 characters.'") }}
    END IF;
{%- endmacro %}

{% macro check_retry_after(verb, variable) %}
    IF {{ variable }} NOT BETWEEN 0 AND 2592000 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": retry_after_seconds must be between 0 and 2592000, got %s.', " ~ variable ~ ")") }}
    END IF;
{%- endmacro %}

{#- The arguments of complete_batch and fail_batch: ids and lease_tokens side by side (a NULL token:
    the check by worker name), at most 1,000, no NULL id, no id twice. Sets sorted_ids and
    sorted_tokens to the items in id order: the order the verb locks the messages in, so two batch
    acks never wait for each other in a cycle, whatever order their callers list the ids in. -#}
{% macro check_acks(verb) %}
{% set here = fn ~ '_' ~ verb %}
    IF {{ here }}.ids IS NULL OR cardinality({{ here }}.ids) > 1000 OR array_ndims({{ here }}.ids) > 1 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": ids must be a one-dimensional array of at most 1000 ids, got %s.', coalesce(cardinality(" ~ here ~ ".ids)::text, 'NULL'))") }}
    END IF;
    IF cardinality({{ here }}.lease_tokens) IS DISTINCT FROM cardinality({{ here }}.ids) OR array_ndims({{ here }}.lease_tokens) > 1 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": lease_tokens must have one element per id (NULL for none), got %s for %s ids.', coalesce(cardinality(" ~ here ~ ".lease_tokens)::text, 'NULL'), cardinality(" ~ here ~ ".ids))") }}
    END IF;
    IF array_position({{ here }}.ids, NULL) IS NOT NULL THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": ids[%s] is NULL.', array_position(" ~ here ~ ".ids, NULL))") }}
    END IF;
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.lease_token ORDER BY u.id), count(DISTINCT u.id)
    INTO sorted_ids, sorted_tokens, distinct_count
    FROM unnest({{ here }}.ids, {{ here }}.lease_tokens) AS u (id, lease_token);
    IF distinct_count < cardinality({{ here }}.ids) THEN
{{ m.throw('invalid_argument', "'" ~ names.plain('_' ~ verb) ~ ": an id is listed twice.'") }}
    END IF;
{%- endmacro %}

{#- complete's statements, for complete and complete_next (`verb`: whose id, worker and lease_token):
    delete the message if the caller holds its lease (to the history table too, with option history)
    and set done_count. Expects now_utc and done_count (with groups: held_keys, head_ids). -#}
{% macro complete_statements(verb) %}
{% if groups %}
    -- The message's group first (the fixed lock order): completing its in-flight message moves its head.
{{ grp.lock_groups_of('ARRAY[' ~ fn ~ '_' ~ verb ~ '.id]', 'held_keys') }}
{% endif %}
{% if history %}
    -- One statement: queue table, then history table (the fixed lock order).
    WITH done AS (
        DELETE FROM {{ t }} AS m
        WHERE {{ lease_guard(verb) | indent(4) }}
        RETURNING m.*
    ),

    kept AS (
{{ history_insert() }}
    )

    SELECT count(*) INTO done_count FROM kept;
{% else %}
    DELETE FROM {{ t }} AS m
    WHERE {{ lease_guard(verb) }};
    GET DIAGNOSTICS done_count = ROW_COUNT;
{% endif %}
    IF done_count = 0 THEN
{{ lost_under_snapshot('m.id = ' ~ fn ~ '_' ~ verb ~ '.id') }}
{% if groups %}
    ELSIF cardinality(held_keys) > 0 THEN
{{ grp.settle('held_keys') | indent(4, first=true) }}
{% endif %}
    END IF;
{%- endmacro %}

{#- Lock the batch's messages whose lease the caller holds, one primary-key probe each, in id order
    (sorted_ids): the CTE `held` (id, attempts). LATERAL ... LIMIT 1 keeps each probe a nested loop
    in that order: a join the cached plan may turn into a hash join locks in whatever order it reads. -#}
{% macro held_cte(verb) %}
    WITH held AS MATERIALIZED (
        SELECT h.id, h.attempts
        FROM unnest(sorted_ids, sorted_tokens) AS i (id, lease_token)
        CROSS JOIN LATERAL (
            SELECT q.id, q.attempts
            FROM {{ t }} AS q
            WHERE
                q.id = i.id AND q.leased_by IS NOT DISTINCT FROM {{ fn }}_{{ verb }}.worker
                AND (i.lease_token IS NULL OR q.lease_token = i.lease_token) AND q.visible_at > now_utc
            LIMIT 1
            FOR UPDATE
        ) AS h
    )
{%- endmacro %}

{#- The storage parameters of a work table whose rows are updated (the queue table, the groups
    table): room on the page for a row's next version, and vacuum and analyze after a fixed number of
    changed rows. -#}
{% macro updated_table_parameters() %}
WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);
{%- endmacro %}

{#- INSERT the rows of CTE `done` (queue rows a DELETE ... RETURNING m.* completed) into the history table. -#}
{% macro history_insert() %}
        INSERT INTO {{ history_t }} (
            id, enqueued_at, due_at, {% if has_priority %}priority, {% endif %}{% if groups %}group_key, {% endif %}started_at, finished_at, duration_ms, worker, attempts, payload
        )
        SELECT
            d.id,
            d.enqueued_at,
            d.due_at,
{% if has_priority %}
            d.priority,
{% endif %}
{% if groups %}
            d.group_key,
{% endif %}
            d.leased_at,
            now_utc,
            (extract(EPOCH FROM now_utc - d.leased_at) * 1000)::bigint,
            d.leased_by,
            d.attempts,
            d.payload
        FROM done AS d
        RETURNING 1
{%- endmacro %}

{% macro check_lease(verb, variable) %}
    IF {{ variable }} NOT BETWEEN 1 AND 604800 THEN
{{ m.throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": lease_seconds must be between 1 and 604800, got %s.', " ~ variable ~ ")") }}
    END IF;
{%- endmacro %}

{#- The planner's own row estimate of a table: tuples per page from the last ANALYZE times pages now. -#}
{% macro row_estimate(table) -%}
(
            SELECT CASE
                WHEN c.reltuples > 0 AND c.relpages > 0
                    THEN (c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::integer))::bigint
                ELSE 0
            END
            FROM pg_class AS c
            WHERE c.oid = '{{ table }}'::regclass
        )
{%- endmacro %}

{#- INSERT the rows of CTE `gone` (deleted queue rows) into the dead-letter table. With client ids an
    older dead-letter copy of the same id (the id was enqueued again) is replaced. -#}
{% macro dead_insert(attempts_sql, error_sql, worker_sql, returning='1') %}
        INSERT INTO {{ dead_t }} (
            id, enqueued_at, due_at, {% if has_priority %}priority, {% endif %}{% if dedupe %}dedupe_key, {% endif %}{% if groups %}group_key, {% endif %}attempts, last_error, last_worker, dead_at, payload
        )
        SELECT
            g.id,
            g.enqueued_at,
            g.due_at,
{% if has_priority %}
            g.priority,
{% endif %}
{% if dedupe %}
            g.dedupe_key,
{% endif %}
{% if groups %}
            g.group_key,
{% endif %}
            {{ attempts_sql }},
            {{ error_sql }},
            {{ worker_sql }},
            now_utc,
            g.payload
        FROM gone AS g
{% if client_ids %}
        ON CONFLICT (id) DO UPDATE SET
            enqueued_at = excluded.enqueued_at,
            due_at = excluded.due_at,
{% if has_priority %}
            priority = excluded.priority,
{% endif %}
{% if dedupe %}
            dedupe_key = excluded.dedupe_key,
{% endif %}
{% if groups %}
            group_key = excluded.group_key,
{% endif %}
            attempts = excluded.attempts,
            last_error = excluded.last_error,
            last_worker = excluded.last_worker,
            dead_at = excluded.dead_at,
            payload = excluded.payload
{% endif %}
        RETURNING {{ returning }}
{%- endmacro %}

{#- Move the queue rows matching where_sql to the dead-letter table (queue table, then dead table:
    the fixed lock order) and count them into count_var. -#}
{% macro bury(where_sql, attempts_sql, error_sql, worker_sql, count_var) %}
    WITH gone AS (
        DELETE FROM {{ t }} AS m
        WHERE {{ where_sql }}
        RETURNING m.*
    ),

    buried AS (
{{ dead_insert(attempts_sql, error_sql, worker_sql) }}
    )

    SELECT count(*) INTO {{ count_var }} FROM buried;
{%- endmacro %}

{#- The claim's two CTEs: lock up to limit_sql visible rows matching where_sql in claim order (SKIP
    LOCKED), next_messages (the rows as claimed: id, tie, visible_at, leased_by), and lease them to
    the worker, leased (returning `returning`, over m, the leased row; join next_messages on id for
    the rows as they were). For a variable limit the lease finds its rows by `id = ANY(the claimed
    ids)`, not by a join with next_messages: the generic plan of the join costs `LIMIT limit_sql` at a
    tenth of the claim index's rows, and on a deep queue chose a hash join over a sequential scan of
    the whole table for every batch (67 messages/s at batch 10 over 40,000 waiting); an array of ids
    is costed at ten probes of the primary key whatever the depth. A literal `LIMIT 1` is costed at
    one row, so its join is a nested loop, about 19,000 server instructions cheaper than the array. -#}
{% macro claim_ctes(where_sql, limit_sql, own=false, returning="m.id, m.attempts", order_sql=none) %}
    WITH next_messages AS (
        SELECT
            m.id,
            m.{{ tie }} AS tie,
            m.visible_at,
            m.leased_by
        FROM {{ t }} AS m
        WHERE {{ where_sql }}
        ORDER BY {{ order_sql or ('m.visible_at, m.' ~ tie) }}
        LIMIT {{ limit_sql }}
        FOR UPDATE SKIP LOCKED
    ),

    leased AS (
        UPDATE {{ t }} AS m
        SET
{% if own %}
            -- The worker's own messages come back as they are while their lease lives (the same
            -- attempt, the same expiry: asking again neither spends an attempt nor buys time); one
            -- whose lease has expired is leased anew, as anyone's would be.
            attempts = m.attempts + CASE WHEN m.visible_at <= now_utc THEN 1 ELSE 0 END,
            visible_at = CASE WHEN m.visible_at <= now_utc THEN lease_until ELSE m.visible_at END,
            leased_by = {{ fn }}_dequeue.worker,
            leased_at = CASE WHEN m.visible_at <= now_utc THEN now_utc ELSE m.leased_at END,
            lease_token = CASE WHEN m.visible_at <= now_utc THEN gen_random_uuid() ELSE m.lease_token END
{% else %}
            attempts = m.attempts + 1,
            visible_at = lease_until,
            leased_by = {{ fn }}_dequeue.worker,
            leased_at = now_utc,
            lease_token = gen_random_uuid()
{% endif %}
{% if limit_sql == '1' %}
        FROM next_messages AS n
        WHERE m.id = n.id
{% else %}
        WHERE m.id = ANY(ARRAY(SELECT n.id FROM next_messages AS n))
{% endif %}
        RETURNING {{ returning }}
    )
{%- endmacro %}

{#- One claim statement: lock up to limit_sql visible rows matching where_sql in claim order
    (SKIP LOCKED) and lease them to the worker. Sets ids_var to the leased ids in claim order (NULL
    for none) and buried_var to the number of claimed rows whose lease had already expired
    max_attempts times: the claim would be one attempt too many, so a second statement, which runs
    only then, moves them to the dead-letter table ('lease expired') with the attempts and the
    worker they had. Keeping that move out of the claim keeps the claim a two-node statement that
    never touches the dead-letter table (the SQL Server twin has the same shape). Expects the
    variables exhausted_ids and exhausted_workers. -#}
{#- A claimed row the claim would give one attempt too many (attempts_sql: its attempts with this
    claim's; visible_sql: its visible_at as claimed): only a lease that had expired is buried, a live
    own lease comes back unchanged, even with max_attempts lowered below its attempts since. -#}
{% macro exhausted(attempts_sql, visible_sql) -%}
({{ attempts_sql }} > {{ max_attempts }} AND {{ visible_sql }} <= now_utc)
{%- endmacro %}

{% macro claim_statement(where_sql, limit_sql, ids_var='step_ids', buried_var='buried_count', own=false, order_sql=none) %}
{% set exhausted = exhausted('l.attempts', 'n.visible_at') %}
{{ claim_ctes(where_sql, limit_sql, own, order_sql=order_sql) }}

    SELECT
        array_agg(l.id ORDER BY n.visible_at, n.tie) FILTER (WHERE NOT {{ exhausted }}),
        array_agg(l.id) FILTER (WHERE {{ exhausted }}),
        array_agg(n.leased_by) FILTER (WHERE {{ exhausted }})
    INTO {{ ids_var }}, exhausted_ids, exhausted_workers
    FROM leased AS l
    INNER JOIN next_messages AS n ON l.id = n.id;
    {{ buried_var }} := 0;
    IF exhausted_ids IS NOT NULL THEN
{{ bury("m.id = ANY(exhausted_ids)", "g.attempts - 1", "'lease expired'",
        "exhausted_workers[array_position(exhausted_ids, g.id)]", buried_var) | indent(4, first=true) }}
    END IF;
{%- endmacro %}

{#- claim_statement, with its own statement for a limit of 1. PL/pgSQL caches one plan per statement,
    and the generic plan of a LIMIT given by a variable (costed for an unknown limit) is a sort of
    the whole queue, so such a statement is planned again on every call; with a literal LIMIT 1 the
    generic plan is the index scan and is kept for the session (docs/BENCHMARKS.md, The ceiling). -#}
{% macro claim_by_limit(where_sql, limit_sql, ids_var='step_ids', buried_var='buried_count', order_sql=none) %}
    IF {{ limit_sql }} = 1 THEN
{{ claim_statement(where_sql, '1', ids_var, buried_var, order_sql=order_sql) | indent(4, first=true) }}
    ELSE
{{ claim_statement(where_sql, limit_sql, ids_var, buried_var, order_sql=order_sql) | indent(4, first=true) }}
    END IF;
{%- endmacro %}

{#- The in-database worker's steps: run the statements, and again after a short random pause (so
    that they do not meet the same peer at once) on a deadlock, a lock timeout or a serialization
    failure, up to 3 times. Expects transient_retries integer. -#}
{#- The pause is written with pg_catalog's functions, not + and *: pg_catalog has no exact
    operator for numeric + double precision or double precision * numeric, so an exact one in a
    schema on the caller's search_path (process runs with it) would be chosen. -#}
{% macro transient_pause() %}
PERFORM pg_catalog.pg_sleep(pg_catalog.float8pl(0.02, pg_catalog.float8mul(pg_catalog.random(), 0.18)));
{%- endmacro %}

{#- process's handler check, before the loop and again after a call error that can mean the handler
    cannot be run: by schema name, name and signature, as the CALL finds it, in the caller's rights
    (the CALL runs in them). Sets handler_problem (NULL: runnable) and handler_found (its oid). A
    routine of the same name and schema that takes the same two types first and defaults the rest
    makes the CALL ambiguous (42725); an overload with other types does not (the exact match wins).
    Every operator is pg_catalog's, written out: process runs with the caller's search_path. The
    privilege functions give NULL for an object dropped since the join read it: not runnable. -#}
{% macro handler_check(handler_schema, handler_name, id_type, payload_type) %}
{%- set handler = handler_schema ~ '.' ~ handler_name %}
SELECT
    CASE
        WHEN n.oid IS NULL THEN 'schema {{ handler_schema }} of handler procedure {{ handler }} does not exist.'
        WHEN NOT coalesce(pg_catalog.has_schema_privilege(n.oid, 'USAGE'), false)
            THEN 'the caller has no USAGE on schema {{ handler_schema }} of handler procedure {{ handler }}: grant it.'
        WHEN p.oid IS NULL
            THEN 'handler procedure {{ handler }}(id {{ id_type }}, payload {{ payload_type }}) does not exist.'
        WHEN NOT coalesce(pg_catalog.has_function_privilege(p.oid, 'EXECUTE'), false)
            THEN 'the caller may not execute handler procedure {{ handler }}: grant EXECUTE on it.'
        WHEN EXISTS (
            SELECT FROM pg_catalog.pg_proc AS o
            WHERE
                o.pronamespace OPERATOR(pg_catalog.=) n.oid
                AND o.proname OPERATOR(pg_catalog.=) '{{ handler_name }}'
                AND o.oid OPERATOR(pg_catalog.<>) p.oid
                AND o.pronargs OPERATOR(pg_catalog.>) 2
                AND pg_catalog.int2mi(o.pronargs, o.pronargdefaults) OPERATOR(pg_catalog.<=) 2
                AND o.proargtypes[0] OPERATOR(pg_catalog.=) p.proargtypes[0]
                AND o.proargtypes[1] OPERATOR(pg_catalog.=) p.proargtypes[1]
        ) THEN 'another routine {{ handler }}({{ id_type }}, {{ payload_type }}, ...) with defaults makes its call ambiguous.'
    END,
    p.oid
INTO handler_problem, handler_found
FROM (VALUES (1)) AS one (x)
LEFT JOIN pg_catalog.pg_namespace AS n ON n.nspname OPERATOR(pg_catalog.=) '{{ handler_schema }}'
LEFT JOIN pg_catalog.pg_proc AS p
    ON
        p.pronamespace OPERATOR(pg_catalog.=) n.oid
        AND p.proname OPERATOR(pg_catalog.=) '{{ handler_name }}'
        AND p.prokind OPERATOR(pg_catalog.=) 'p'
        AND pg_catalog.oidvectortypes(p.proargtypes) OPERATOR(pg_catalog.=) '{{ id_type }}, {{ payload_type }}';
{%- endmacro %}

{% macro retry_transient() %}
transient_retries := 0;
LOOP
    BEGIN
{{ caller() | trim | indent(8, first=true) }}
        EXIT;
    EXCEPTION WHEN deadlock_detected OR lock_not_available OR serialization_failure THEN
        IF transient_retries >= 3 THEN
            RAISE;
        END IF;
        transient_retries := transient_retries + 1;
        {{ transient_pause() }}
    END;
END LOOP;
{%- endmacro %}
