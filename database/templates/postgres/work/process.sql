{#- PostgreSQL: S.Q_process of the work kind (included by work.sql, whose variables and imports it uses). -#}
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
-- caller needs EXECUTE on those (S_consumer) and on the handler. It runs with the caller's rights
-- and search_path, and the schemas on that path may be writable by others: every routine it calls
-- is schema-qualified, and every operator it evaluates is pg_catalog's, written out where
-- pg_catalog has no exact match (an operator of exact types elsewhere on the path would win).
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
{{ m.throw('in_transaction', "'" ~ names.plain('_process') ~ ": commits once per message and cannot run inside an open transaction.'") }}
    END IF;
    IF time_budget_seconds IS NULL OR time_budget_seconds NOT BETWEEN 1 AND 86400 THEN
{{ m.throw('invalid_argument', "pg_catalog.format('" ~ names.plain('_process') ~ ": time_budget_seconds must be between 1 and 86400, got %s.', coalesce(time_budget_seconds::text, 'NULL'))") }}
    END IF;
    COMMIT;
    -- Every transaction this procedure begins, right after each COMMIT, before any query.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    -- A handler the CALL cannot run would fail every message at the CALL until each one is
    -- dead-lettered: no schema (3F000) or no USAGE on it, no procedure of this signature (PostgreSQL
    -- overloads: one of other types is 42883), no EXECUTE (42501; the handler runs with the
    -- caller's rights), or an overload with defaults that makes the call ambiguous (42725).
{% filter indent(4, first=true) %}
{{ w.handler_check(handler_parts[0], handler_parts[1], id_type, payload_type) }}
{% endfilter %}
    IF handler_problem IS NOT NULL THEN
{{ m.throw('no_handler', "pg_catalog.format('" ~ names.plain('_process') ~ ": %s', handler_problem)") }}
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

        handler_unrunnable := false;
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
                -- An error that can mean the handler cannot be run (dropped, renamed, moved, its
                -- schema renamed or dropped, USAGE or EXECUTE revoked, an ambiguous overload added
                -- while process runs: 42883, 42501, 3F000, 42725) is not the message's fault when
                -- the handler check, by name as the CALL looks it up, now fails: handled after
                -- this block (no COMMIT inside a block with a handler). Raised inside a handler
                -- that is still there and runnable (a handler replaced under the run by DROP and
                -- CREATE too: the check goes by name, as the CALL), it is the handler's own error,
                -- recorded with fail as any other, as on SQL Server. 42809: replaced by a function.
                IF error_state IN ('42883', '42501', '3F000', '42725', '42809') THEN
{% filter indent(20, first=true) %}
{{ w.handler_check(handler_parts[0], handler_parts[1], id_type, payload_type) }}
{% endfilter %}
                    IF handler_problem IS NOT NULL THEN
                        handler_unrunnable := true;
                        EXIT;
                    END IF;
                END IF;
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
        IF handler_unrunnable THEN
            -- The lease goes back with its attempt, as release gives it (nothing if the lease had
            -- already expired), and process stops.
{% filter indent(12, first=true) %}
{% call w.retry_transient() %}
SELECT r.released INTO lease_kept
FROM {{ names.verb('release') }}(id => message.id, worker => worker_name) AS r;
{% endcall %}
{% endfilter %}

            COMMIT;
            -- What the run did is in the message: the refusal ends it without its row.
{{ m.throw('no_handler', "pg_catalog.format('" ~ names.plain('_process') ~ ": the handler can no longer be run; message %s %s after %s processed, %s completed, %s failed; the handler''s call raised: SQLSTATE %s: %s', message.id, CASE WHEN lease_kept THEN 'handed back' ELSE 'not handed back (its lease was no longer held)' END, processed, completed, failed, error_state, error_text)") | indent(4, first=true) }}
        END IF;
        COMMIT;
        SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    END LOOP;
END;
$procedure$;

{{ m.grant('process', 'PROCEDURE') }}
-- process cannot be SECURITY DEFINER (PostgreSQL refuses COMMIT there), so the functions it calls
-- check its caller's rights: the admin role that runs it needs dequeue, complete, fail and release too
-- (SQL Server's ownership chain needs no such grant). The handler runs with the caller's rights as
-- well: grant the admin role what it does (database/examples/handlers/postgres).
GRANT EXECUTE ON FUNCTION
{{ names.verb('dequeue') }},
{{ names.verb('complete') }},
{{ names.verb('fail') }},
{{ names.verb('release') }}
TO {{ names.role('process') }};
