{#-
  T-SQL fragments of the work kind that more than one procedure runs: argument checks, the claim
  (dequeue, complete_next and the in-database worker), the lease check, complete, fail and the move
  to the dead-letter table. They
  are macros, not procedure calls, because a called procedure's SELECT would reach the caller of
  S.Q_process as a result set (and INSERT ... EXEC cannot nest).
  Imported "with context" by work.sql, which sets: t, dead_t, history_t, id_type, tie, has_priority,
  dedupe, client_ids, history, max_attempts, key_type.
  Indentation: a macro renders at procedure-body level (4 spaces); callers nest it with indent().
-#}

{#- Raise a contract error. Every procedure that throws declares @error_message nvarchar(2048) once,
    after SET NOCOUNT / XACT_ABORT: a DECLARE per THROW would declare the name twice in one
    procedure, which SQL Server refuses when it creates the procedure (Msg 134). -#}
{% macro throw(error, message) %}
{% if message is string %}
            SET @error_message = {{ message }};
{% else %}
            SET @error_message = CONCAT(
                {{ message | join(',\n                ') }}
            );
{% endif %}
            THROW {{ errors[error] }}, @error_message, 1;
{%- endmacro %}

{% macro check_batch_size(verb) %}
    IF @batch_size IS NULL OR @batch_size NOT BETWEEN 1 AND 1000
        BEGIN
{{ throw('invalid_argument', ["N'" ~ names.plain('_' ~ verb) ~ ": batch_size must be between 1 and 1000, got '",
                              "COALESCE(CONVERT(nvarchar(12), @batch_size), N'NULL')", "N'.'"]) }}
        END;
{%- endmacro %}

{% macro check_worker(verb) %}
    IF @worker IS NULL OR LEN(@worker) = 0 OR LEN(@worker) > 200
        BEGIN
{{ throw('invalid_argument', ["N'" ~ names.plain('_' ~ verb) ~ ": '", "N'worker must be a name of 1 to 200 characters.'"]) }}
        END;
{%- endmacro %}

{% macro check_lease(verb) %}
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 1 AND 604800
        BEGIN
{{ throw('invalid_argument', ["N'" ~ names.plain('_' ~ verb) ~ ": lease_seconds must be between 1 and 604800, got '",
                              "COALESCE(CONVERT(nvarchar(12), @lease_seconds), N'NULL')", "N'.'"]) }}
        END;
{%- endmacro %}

{#- A fail's retry delay: NULL is 0 (visible again at once), at most 30 days. -#}
{% macro check_retry_after(verb) %}
    SET @retry_after_seconds = COALESCE(@retry_after_seconds, 0);
    IF @retry_after_seconds NOT BETWEEN 0 AND 2592000
        BEGIN
{{ throw('invalid_argument', ["N'" ~ names.plain('_' ~ verb) ~ ": retry_after_seconds must be between 0 and 2592000, got '", "@retry_after_seconds", "N'.'"]) }}
        END;
{%- endmacro %}

{#- Columns a message keeps when it moves to the dead-letter table, in this order. -#}
{% set dead_cols = ['id', 'enqueued_at', 'due_at'] + (['priority'] if has_priority else []) + (['dedupe_key'] if dedupe else []) + (['group_key'] if groups else []) + ['attempts', 'last_error', 'last_worker', 'dead_at', 'payload'] %}
{% macro dead_columns() %}
id, enqueued_at, due_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}{{ 'group_key, ' if groups }}attempts,
last_error, last_worker, dead_at, payload
{%- endmacro %}

{#- The rows a claim hands out; `own` and `previous_visible_at` keep the claim order for the result. -#}
{% macro claimed_table() %}
    DECLARE @claimed TABLE (
        id {{ id_type }} NOT NULL PRIMARY KEY,
{% if client_ids %}
        seq bigint NOT NULL,
{% endif %}
        own bit NOT NULL,
{% if has_priority %}
        priority int NOT NULL,
{% endif %}
        previous_visible_at datetime2(7) NOT NULL,
        previous_worker nvarchar(200) NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        -- NULL only for a live lease taken before storage v2 that its worker asked for again.
        lease_token uniqueidentifier NULL,
{% if groups %}
        group_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
        payload {{ payload_type }} NOT NULL
    );
{%- endmacro %}

{#- The fence of every verb that acts on a lease: the live lease of worker_sql and, given a token
    (token_sql not NULL), that very lease: a worker whose lease expired and that leased the message
    again holds a new token, so a late call from its first attempt changes nothing. A NULL token
    checks the worker's name alone, as 0.1.0 did (deprecated: a worker name that is reused, or a
    restarted worker, cannot tell its leases apart). prefix: the table alias and its dot, or ''; the
    token's test goes on a line of its own, at the indentation `indent` (spaces). -#}
{% macro holds_lease(worker_sql, token_sql, prefix='', indent=8) -%}
{{ prefix }}leased_by = {{ worker_sql }} AND {{ prefix }}visible_at > @now
{{ ' ' * indent }}AND ({{ token_sql }} IS NULL OR {{ prefix }}lease_token = {{ token_sql }})
{%- endmacro %}

{#- release's statement: the live lease given back with the attempt it counted, visible now (release,
    and process when its handler cannot be run). -#}
{#- One statement: process reads its @@ROWCOUNT right after it. -#}
{% macro release_statement(id_sql, worker_sql, token_sql) %}
    UPDATE {{ t }}
    SET
        leased_by = NULL,
        leased_at = NULL,
        lease_token = NULL,
        visible_at = @now,
        attempts = IIF(attempts > 0, attempts - 1, 0)
    WHERE
        id = {{ id_sql }} AND {{ holds_lease(worker_sql, token_sql) }};
{%- endmacro %}

{#- With client ids, a dead-letter copy of the same id may exist (the id was enqueued again): the
    message goes through @buried so that the older copy can be replaced, queue table first. -#}
{% macro buried_table() %}
{% if client_ids %}
    DECLARE @buried TABLE (
        id {{ id_type }} NOT NULL PRIMARY KEY,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
{% if has_priority %}
        priority int NOT NULL,
{% endif %}
{% if dedupe %}
        dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
{% if groups %}
        group_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL,
        payload {{ payload_type }} NOT NULL
    );
{% endif %}
    DECLARE @buried_count int = 0;
{%- endmacro %}

{#- Move queue rows to the dead-letter table: queue table, then dead table (the fixed lock order).
    Runs inside a transaction. from_sql is the FROM ... WHERE that picks the rows of `m`; the *_sql
    arguments are OUTPUT expressions. Sets @buried_count. -#}
{% macro bury(from_sql, attempts_sql, error_sql, worker_sql) %}
{% if client_ids %}
    -- A table variable keeps its rows through a rollback:
    -- a burial rolled back in an earlier pass of a retry
    -- (process after a deadlock) must leave none here.
    DELETE FROM @buried;

{% endif %}
    DELETE m
    OUTPUT
        DELETED.id,
        DELETED.enqueued_at,
        DELETED.due_at,
{% if has_priority %}
        DELETED.priority,
{% endif %}
{% if dedupe %}
        DELETED.dedupe_key,
{% endif %}
{% if groups %}
        DELETED.group_key,
{% endif %}
        {{ attempts_sql }},
        {{ error_sql }},
        {{ worker_sql }},
        @now,
        DELETED.payload
{% if client_ids %}
    INTO
        @buried (
            {{ dead_columns() | indent(12) }}
        )
{% else %}
    INTO
        {{ dead_t }} (
            {{ dead_columns() | indent(12) }}
        )
{% endif %}
    {{ from_sql | indent(4) }};
    SET @buried_count = @@ROWCOUNT;
{%- if client_ids %}


    IF @buried_count > 0
        BEGIN
            DELETE d
            FROM {{ dead_t }} AS d
            INNER JOIN @buried AS b ON d.id = b.id;

            INSERT INTO {{ dead_t }} (
                {{ dead_columns() | indent(16) }}
            )
            SELECT
                {{ dead_cols | join(',\n                ') }}
            FROM @buried;

            DELETE FROM @buried;
        END;
{%- endif %}
{%- endmacro %}

{#- One claim statement: lease up to top_sql rows matching where_sql to @worker, in claim order,
    seeking on `index` (docs/queue-kinds.md, "Plans at depth": a plan compiled on an empty queue
    must still seek at depth). top_sql none: the one row where_sql names by its key (a group's
    head), leased only if due_sql holds, tested by the UPDATE, outside the seek's predicate. -#}
{% macro claim_statement(cte, top_sql, where_sql, own, index, due_sql=none) %}
    WITH {{ cte }} AS (
{% if top_sql %}
        SELECT TOP ({{ top_sql }})
{% else %}
        SELECT
{% endif %}
            m.id,
{% if client_ids %}
            m.seq,
{% endif %}
{% if has_priority %}
            m.priority,
{% endif %}
            m.enqueued_at,
            m.due_at,
            m.visible_at,
            m.attempts,
            m.leased_by,
            m.leased_at,
            m.lease_token,
{% if groups %}
            m.group_key,
{% endif %}
            m.payload
        FROM {{ t }} AS m WITH (INDEX ({{ index }}), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
{% if '\n' in where_sql %}
        WHERE
            {{ where_sql }}
{% else %}
        WHERE {{ where_sql }}
{% endif %}
{% if top_sql %}
        ORDER BY m.visible_at, m.{{ tie }}
{% endif %}
    )

    UPDATE {{ cte }}
    SET
{% if own %}
        -- The worker's own messages come back as they are while their lease lives (the same
        -- attempt, the same expiry, the same token: it is the same lease, and asking again neither
        -- spends an attempt nor buys time); one whose lease has expired is leased anew, as anyone's
        -- would be, with a new token. (Every right-hand side reads the row as it was before this
        -- statement; NEWID() is drawn for each row.)
        attempts = attempts + IIF(visible_at <= @now, 1, 0),
        visible_at = IIF(visible_at <= @now, @lease_until, visible_at),
        leased_by = @worker,
        leased_at = IIF(visible_at <= @now, @now, leased_at),
        lease_token = IIF(visible_at <= @now, NEWID(), lease_token)
{% else %}
        attempts = attempts + 1,
        visible_at = @lease_until,
        leased_by = @worker,
        leased_at = @now,
        lease_token = NEWID()
{% endif %}
    OUTPUT
        INSERTED.id,
{% if client_ids %}
        INSERTED.seq,
{% endif %}
        {{ 1 if own else 0 }},
{% if has_priority %}
        INSERTED.priority,
{% endif %}
        DELETED.visible_at,
        DELETED.leased_by,
        INSERTED.enqueued_at,
        INSERTED.due_at,
        INSERTED.attempts,
        INSERTED.lease_token,
{% if groups %}
        INSERTED.group_key,
{% endif %}
        INSERTED.payload
{% if due_sql %}
    INTO
        @claimed (
            id, {{ 'seq, ' if client_ids }}own, previous_visible_at, previous_worker,
            enqueued_at, due_at, attempts, lease_token, {{ 'group_key, ' if groups }}payload
        )
    WHERE {{ due_sql }};
{%- else %}
    INTO @claimed (
        id, {{ 'seq, ' if client_ids }}own, {{ 'priority, ' if has_priority }}previous_visible_at, previous_worker,
        enqueued_at, due_at, attempts, lease_token, {{ 'group_key, ' if groups }}payload
    );
{%- endif %}
{%- endmacro %}

{#- Claimed rows whose lease had already expired max_attempts times: the claim would be one attempt
    too many, so they go to the dead-letter table ('lease expired') instead of to the worker. -#}
{% macro bury_exhausted() %}
{#- Only a lease that had expired: a live own lease comes back unchanged, even with max_attempts
    lowered below its attempts since it was taken. -#}
{% set exhausted = "c.attempts > " ~ max_attempts ~ " AND c.previous_visible_at <= @now" %}
    SET @exhausted = (
        SELECT COUNT(*)
        FROM @claimed AS c
        WHERE {{ exhausted }}
    );
    IF @exhausted > 0
        BEGIN
{{ bury("FROM " ~ t ~ " AS m\nINNER JOIN @claimed AS c ON m.id = c.id\nWHERE " ~ exhausted,
        "c.attempts - 1", "N'lease expired'", "c.previous_worker") | indent(8, first=true) }}

            DELETE c
            FROM @claimed AS c
            WHERE {{ exhausted }};
        END;
{%- endmacro %}

{#- A pause of 20-200 ms before a transient error's retry (the in-database worker, dead_requeue):
    expects @pause datetime. The remainder is taken before ABS: ABS of CHECKSUM's -2147483648 would
    overflow (8115) inside the CATCH that retries. -#}
{% macro transient_pause() %}
    SET @pause = DATEADD(MILLISECOND, 20 + ABS(CHECKSUM(NEWID()) % 180), CONVERT(datetime, 0));
    WAITFOR DELAY @pause;
{%- endmacro %}

{#- The next priority level below @priority (or the highest, first) among rows the claim could take.
    A probe, not a claim: it takes no lock it keeps (an update lock would be held to the end of the
    claim's transaction and block other workers' complete of that row); READPAST steps over rows
    other claims hold (ROWLOCK: READPAST skips row locks, not a page lock the engine might choose),
    READCOMMITTEDLOCK keeps it from reading versions under RCSI. The claim index leads with
    priority: the first level is its first entry (no predicate to seek on: INDEX alone), the next
    ones a seek below the current one; `leased_by IS NULL` repeats its filter (8622 otherwise). -#}
{% macro next_level(below) %}
    SET @priority = (
        SELECT TOP (1) m.priority
{% if below %}
        FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
{% else %}
        FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
{% endif %}
        WHERE {% if below %}m.priority < @priority AND {% endif %}m.leased_by IS NULL
        ORDER BY m.priority DESC
    );
{%- endmacro %}

{#- The look for expired leases (docs/work-queue.md, Expired leases). A lease moves a message out of the
    claim index (filtered WHERE leased_by IS NULL), so one whose lease expired (a crashed or stopped
    worker's) is found on ix_<q>_lease, (leased_by, visible_at, id): one lease holder at a time, a
    range seek `leased_by = @look_worker AND visible_at <= @now` each, so that the look reads the
    expired leases and two index entries per holder, never a live lease (the walk of the priority
    levels, on the lease index). So that it costs a busy consumer once a second and not every call,
    a session looks at most once a second: SESSION_CONTEXT(look_key) holds when its next look is due
    (SQL Server 2016 and later, Azure SQL); a value of another type, in the past, or more than a
    second ahead (the session's to set) means due. A look that filled the batch may have left more
    behind (a crashed worker's whole batch): then the next call looks again. A connection reset on
    reuse from a pool (sp_reset_connection) loses the key: such a session looks on its first call. -#}
{% set look_key = "N'tablequeue." ~ schema ~ "." ~ queue.name ~ ".expired'" %}
{#- Whether the session's look is due at @now, given @next_look (SESSION_CONTEXT(look_key)): a CASE,
    whose conditions are tried in order, so that CONVERT only meets a datetime2. -#}
{% macro look_due() -%}
CASE
        WHEN @next_look IS NULL THEN 1
        WHEN CONVERT(sysname, SQL_VARIANT_PROPERTY(@next_look, 'BaseType')) <> N'datetime2' THEN 1
        WHEN CONVERT(datetime2(7), @next_look) <= @now THEN 1
        WHEN CONVERT(datetime2(7), @next_look) > DATEADD(SECOND, 1, @now) THEN 1
        ELSE 0
    END
{%- endmacro %}

{#- One lease holder's expired leases (of messages without a group, with groups): the look's and the
    wait probe's seek. -#}
{% set expired_where = 'm.leased_by = @look_worker AND m.leased_by IS NOT NULL\n            AND ' ~ ('m.group_key IS NULL AND ' if groups else '') ~ 'm.visible_at <= @now' %}

{#- The next lease holder after @look_worker (after=false: the first), into @look_worker: a lock-free
    probe of ix_<q>_lease (READPAST: a row a claim or an acknowledgement holds is read past). -#}
{% macro next_lease_holder(after=true) %}
    SET @look_worker = (
        SELECT TOP (1) m.leased_by
{% if after %}
        FROM {{ t }} AS m WITH (INDEX ({{ lease_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.leased_by > @look_worker AND m.leased_by IS NOT NULL
{% else %}
        FROM {{ t }} AS m WITH (INDEX ({{ lease_index }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.leased_by IS NOT NULL
{% endif %}
        ORDER BY m.leased_by
    );
{%- endmacro %}

{#- Record the session's look: its next one is due a second after @now. Best effort, under XACT_ABORT
    OFF for this one statement: sp_set_session_context refuses a key the session made read-only
    (15664) or a session context over its size limit (15665), and under XACT_ABORT ON either would
    roll back the caller's transaction; a refused write only makes the session look again next call.
    Only where this call holds no lock of its own: a client's attention (a timeout, a cancel) that
    ends the batch under XACT_ABORT OFF rolls nothing back. `recorded`: a bit set once it is written. -#}
{% macro record_look(recorded=none) %}
    SET @look_after = DATEADD(SECOND, 1, @now);
    SET XACT_ABORT OFF;
    BEGIN TRY
        -- Not transactional: a caller that rolls back still waits its second.
        EXEC sys.sp_set_session_context
            @key = {{ look_key }},
            @value = @look_after;
        SET XACT_ABORT ON;
{% if recorded %}
        SET {{ recorded }} = 1;
{% endif %}
    END TRY
    BEGIN CATCH
        SET XACT_ABORT ON;
        IF ERROR_NUMBER() NOT IN (15664, 15665) OR XACT_STATE() = -1 THROW;
    END CATCH;
{%- endmacro %}

{% macro look_declarations() %}
    DECLARE @next_look sql_variant = SESSION_CONTEXT({{ look_key }});
    DECLARE @look_due bit = {{ look_due() }};
    DECLARE @look_after datetime2(7);
    DECLARE @look_recorded bit = 0;
    DECLARE @look_worker nvarchar(200);
{%- endmacro %}

{#- Take the session's record of its look back (the next call looks): only after this call's own write
    (@look_recorded), which clearing cannot be refused. -#}
{% macro clear_look() %}
    EXEC sys.sp_set_session_context
        @key = {{ look_key }},
        @value = NULL;
{%- endmacro %}

{#- A claim that failed after record_due_look may not have looked: the next call looks, also after a
    caller's doomed transaction (the session context is not transactional and not logged). Best
    effort: the claim's own error is what the CATCH rethrows, never one of the clear. -#}
{% macro forget_failed_look() %}
        IF @look_recorded = 1
            BEGIN
                -- An error of the clear is dropped: the claim's, rethrown next, is the caller's.
                BEGIN TRY
{{ clear_look() | indent(16, first=true) }}
                END TRY
                BEGIN CATCH
                END CATCH;
            END;
{%- endmacro %}

{#- A due look is recorded before the claim's transaction opens and before any table is read
    (record_look: no lock of this call is held in its window); look_for_expired_leases takes the
    record back where the look must stay due. -#}
{% macro record_due_look() %}
    -- This session's look for expired leases, when due, is recorded first (record_look).
    IF @look_due = 1
        BEGIN
{{ record_look('@look_recorded') | indent(8, first=true) }}
        END;
{%- endmacro %}

{% macro look_for_expired_leases() %}
    -- 2. Expired leases, at most once a second per session (look_declarations), one lease holder
    -- at a time; a holder whose expired lease went to the dead-letter table is looked at again.
{% if groups %}
    -- Only messages without a group: an expired grouped head comes back on {{ grp.heads_ix }}.
{% endif %}
    IF @look_due = 1
        BEGIN
            IF @remaining > 0
                BEGIN
{{ next_lease_holder(after=false) | indent(16, first=true) }}
                    WHILE @look_worker IS NOT NULL AND @remaining > 0
                        BEGIN
{{ claim_statement('expired_leases', '@remaining', expired_where, false, lease_index) | indent(24, first=true) }}
                            IF @@ROWCOUNT = 0
                                BEGIN
{{ next_lease_holder() | indent(32, first=true) }}
                                    CONTINUE;
                                END;
                            SET @buried_count = 0;
{{ bury_exhausted() | indent(24, first=true) }}
                            SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                            IF @buried_count = 0
                                BEGIN
{{ next_lease_holder() | indent(32, first=true) }}
                                END;
                        END;
                END;
            -- A look that filled the batch may have left more behind, and one the own
            -- messages left no room for has not happened: either stays due. The key is this
            -- call's own write (record_due_look), so that clearing it is never refused.
            IF @remaining = 0 AND @look_recorded = 1
                BEGIN
{{ clear_look() | indent(16, first=true) }}
                END;
        END;
{%- endmacro %}

{#- The claim: expects @batch_size, @worker, @lease_seconds (validated) and @claimed. Two claim
    statements, never an OR (DESIGN.md §4):
      1. the worker's own unfinished messages (leased, even unexpired: a restarted worker; a live
         lease comes back as it is), on ix_<queue>_lease;
      2. anyone's visible messages (visible_at <= now: new, due, retried or lease expired),
         on ix_<queue>_claim{% if has_priority %}, one priority level at a time{% endif %}.
    claim() is the whole of it: it opens a transaction when the caller has none, so that the lease
    and any move to the dead-letter table are one unit. complete_next runs the parts itself, to
    complete in the same transaction first: claim_declarations() (declares @now and
    @started_transaction), then claim_statements() inside its transaction. -#}
{% macro claim_declarations() %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @lease_until datetime2(7) = DATEADD(SECOND, @lease_seconds, @now);
    DECLARE @remaining int = @batch_size;
    DECLARE @claimed_now int = 0;
    DECLARE @exhausted int;
{% if has_priority %}
    DECLARE @priority int;
{% endif %}
    DECLARE @started_transaction bit = 0;
{{ look_declarations() }}
{{ buried_table() }}
{%- if groups %}

{{ grp.work_declare() }}
    -- The groups this call has been to (taken or not): a group is tried once a call, and the probe
    -- steps over the other candidates of a group it could not take.
    DECLARE @visited TABLE (
        group_key {{ key_type }} NOT NULL PRIMARY KEY -- noqa: CP02
    );
    DECLARE @acked_groups TABLE (
        group_key {{ key_type }} NOT NULL PRIMARY KEY -- noqa: CP02
    );
    DECLARE @after_at datetime2(7);
    DECLARE @head_due datetime2(7);
    DECLARE @oldest_ungrouped_at datetime2(7);
    DECLARE @oldest_ungrouped_tie bigint;
    DECLARE @oldest_head_at datetime2(7);
    DECLARE @oldest_head_tie bigint;
    DECLARE @grouped_first bit;
{%- endif %}
{%- endmacro %}

{% macro claim_statements() %}
{% if groups %}
{{ grouped_claim_statements() }}
{%- else %}
    -- 1. Own messages first. `leased_by IS NOT NULL` repeats the filter of the filtered index,
    -- so that the optimizer can match it whatever @worker is.
{{ claim_statement('own_messages', '@remaining', 'm.leased_by = @worker AND m.leased_by IS NOT NULL', true, lease_index) }}

{{ bury_exhausted() }}

    SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);

{{ look_for_expired_leases() }}

    -- 3. Messages nobody leases (new, due, retried, released), on the filtered claim index, whose
    -- filter the claims repeat. A claimed row that goes to the dead-letter table frees its place in
    -- the batch: claim again until the batch is full or nothing visible is left.
    WHILE @remaining > 0
        BEGIN
{% if has_priority %}
            -- A loose index scan: one seek per priority level present, each claim an equality
            -- and range seek on (priority DESC, visible_at, {{ tie }}). A single ORDER BY
            -- priority DESC would read past every delayed or leased row of the higher levels
            -- on each claim, and the whole index whenever nothing is ready.
            SET @claimed_now = 0;
{{ next_level(false) | indent(8, first=true) }}
            WHILE @priority IS NOT NULL AND @claimed_now < @remaining
                BEGIN
{{ claim_statement('next_messages', '@remaining - @claimed_now', 'm.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now', false, claim_index) | indent(16, first=true) }}
                    SET @claimed_now = @claimed_now + @@ROWCOUNT;
{{ next_level(true) | indent(16, first=true) }}
                END;
{% else %}
{{ claim_statement('next_messages', '@remaining', 'm.leased_by IS NULL AND m.visible_at <= @now', false, claim_index) | indent(8, first=true) }}
            SET @claimed_now = @@ROWCOUNT;
{% endif %}

            IF @claimed_now = 0 BREAK;

            SET @buried_count = 0;
{{ bury_exhausted() | indent(8, first=true) }}

            SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
            IF @buried_count = 0 BREAK;
        END;
{%- endif %}
{%- endmacro %}

{#- The claim of messages without a group (grouped_claim_statements): a buried one frees its place. -#}
{% macro ungrouped_claim() %}
            WHILE @remaining > 0
                BEGIN
{{ claim_statement('next_messages', '@remaining', 'm.group_key IS NULL AND m.leased_by IS NULL AND m.visible_at <= @now', false, claim_index) | indent(16, first=true) }}
                    IF @@ROWCOUNT = 0 BREAK;
                    SET @buried_count = 0;
{{ bury_exhausted() | indent(16, first=true) }}
                    SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
                    IF @buried_count = 0 BREAK;
                END;
{%- endmacro %}

{#- The claim with message groups (docs/queue-kinds.md, Message groups, SQL Server):
      1. own messages first, as without groups; they are their groups' in-flight messages, so only
         the groups of those it will bury (lease expired, max_attempts used) are held first,
         waiting, in key order, and settled after it;
      2. messages without a group on ix_<q>_ungrouped, as the plain claim;
      3. grouped ones a group at a time: the next due head candidate of ix_<q>_heads (a lock-free
         probe), its group taken without waiting, settled (its head: the in-flight message, else
         its oldest), the head leased if due and made the in-flight message. At most one message
         per group, so a batch holds heads of up to batch_size groups.
    2 and 3 in the order of their oldest due entry, the other filling the batch. -#}
{% macro grouped_claim_statements() %}
    -- (Table variables keep their rows when their DECLARE runs again: the in-database worker's loop.)
    DELETE FROM @visited;
    DELETE FROM @acked_groups;

    -- 1. Own messages first; the groups of those the claim will bury are taken first, without
    -- waiting (a group's row before its messages, the fixed lock order). A group someone holds (a
    -- producer's open transaction, an acknowledgement) is left out, and so are its messages this
    -- claim would bury: they stay expired for the next claim, this worker's or the group's taker's.
    -- (A lock-free probe of the worker's expired leases; attempts is tested outside the seek.)
    INSERT INTO @acked_groups (group_key)
    SELECT DISTINCT o.group_key
    FROM (
        SELECT
            m.group_key,
            m.attempts
        FROM {{ t }} AS m WITH (INDEX ({{ lease_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE
            m.leased_by = @worker AND m.leased_by IS NOT NULL AND m.visible_at <= @now
            AND m.group_key IS NOT NULL
    ) AS o
    WHERE o.attempts >= {{ max_attempts }};
    {{ grp.take_acked_groups() | indent(4) }}
{% set own_where %}m.leased_by = @worker AND m.leased_by IS NOT NULL
            -- Not one it would bury in a group it did not take (residual: no OR, the seek stays).
            AND NOT EXISTS (
                SELECT 1
                WHERE
                    m.group_key IS NOT NULL AND m.visible_at <= @now AND m.attempts >= {{ max_attempts }}
                    AND NOT EXISTS (
                        SELECT 1
                        FROM @acked_groups AS a
                        WHERE a.group_key = m.group_key
                    )
            ){% endset %}
{{ claim_statement('own_messages', '@remaining', own_where, true, lease_index) }}

{{ bury_exhausted() }}
    {{ grp.settle_groups_in_order() | indent(4) }}

    SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);

{{ look_for_expired_leases() }}

    -- Which source first: the one whose oldest due entry is older (lock-free probes; reset first:
    -- a probe that finds nothing assigns nothing, and process's loop runs this again).
    SET @oldest_ungrouped_at = NULL;
    SET @oldest_ungrouped_tie = NULL;
    SET @oldest_head_at = NULL;
    SET @oldest_head_tie = NULL;
    SELECT TOP (1)
        @oldest_ungrouped_at = m.visible_at,
        @oldest_ungrouped_tie = m.{{ tie }}
    FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
    WHERE m.group_key IS NULL AND m.leased_by IS NULL AND m.visible_at <= @now
    ORDER BY m.visible_at, m.{{ tie }};
    SELECT TOP (1)
        @oldest_head_at = m.visible_at,
        @oldest_head_tie = m.{{ tie }}
    FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
    WHERE m.group_head = 1 AND m.visible_at <= @now
    ORDER BY m.visible_at, m.{{ tie }};
    SET @grouped_first = CASE
        WHEN @oldest_head_at IS NULL THEN 0
        WHEN @oldest_ungrouped_at IS NULL OR @oldest_head_at < @oldest_ungrouped_at THEN 1
        WHEN @oldest_head_at = @oldest_ungrouped_at AND @oldest_head_tie < @oldest_ungrouped_tie THEN 1
        ELSE 0
    END;

    IF @grouped_first = 0
        BEGIN
{{ ungrouped_claim() }}
        END;

    -- 3. Grouped messages, a group at a time.
    SET @after_at = '00010101';
    WHILE @remaining > 0
        BEGIN
            -- The next due head candidate of a group not tried yet (lock-free: a row a claim or an
            -- acknowledgement is changing is read past).
            SET @group = NULL;
            SELECT TOP (1)
                @group = m.group_key,
                @after_at = m.visible_at
            FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE
                m.group_head = 1 AND m.visible_at >= @after_at AND m.visible_at <= @now
                AND NOT EXISTS (
                    SELECT 1
                    FROM @visited AS v
                    WHERE v.group_key = m.group_key
                )
            ORDER BY m.visible_at, m.{{ tie }};
            IF @group IS NULL BREAK;
            INSERT INTO @visited (group_key) VALUES (@group);
            -- The candidate only led here: take the group (never waiting), then its real head.
            {{ grp.take_group('@group') | indent(12) }}
            IF @@ROWCOUNT = 0 CONTINUE;
            {{ grp.read_in_flight() | indent(12) }}
            {{ grp.settle_work(false) | indent(12) }}
            -- Leased only when due (a retry, or a due time ahead, keeps the group busy); the
            -- UPDATE's own test covers a change since this probe.
            SET @head_due = NULL;
            SELECT @head_due = m.visible_at
            FROM {{ t }} AS m WITH (INDEX ({{ pk }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.id = @next_id;
            IF @head_due IS NULL OR @head_due > @now CONTINUE;
{{ claim_statement('group_head', none, 'm.id = @next_id', false, pk, 'visible_at <= @now') | indent(8, first=true) }}
            IF @@ROWCOUNT = 1 AND @in_flight IS NULL
                BEGIN
                    SET @in_flight = @next_id;
                    UPDATE g
                    SET in_flight = @in_flight
                    FROM {{ grp.groups_t }} AS g WITH (INDEX ({{ grp.groups_pk }}), FORCESEEK, ROWLOCK) -- noqa: LT05
                    WHERE g.group_key = @group;
                END;
            SET @buried_count = 0;
{{ bury_exhausted() | indent(8, first=true) }}
            IF @buried_count > 0
                BEGIN
                    -- The head went to the dead-letter table: the group's next message is its head,
                    -- maybe due, so the group may be found again.
                    SET @in_flight = NULL;
                    {{ grp.settle_work(false) | indent(20) }}
                    DELETE FROM @visited
                    WHERE group_key = @group;
                    SET @after_at = '00010101';
                END;
            SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
        END;

    IF @grouped_first = 1
        BEGIN
{{ ungrouped_claim() }}
        END;
{%- endmacro %}

{% macro claim() %}
{{ claim_declarations() }}
{{ record_due_look() }}

    BEGIN TRY
        -- A caller in implicit-transaction mode (ODBC/JDBC autocommit off) owns the transaction
        -- that the next statement opens, and the verb neither commits nor ends it (a BEGIN
        -- TRANSACTION there would only nest in it: its COMMIT would commit nothing).
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;

{{ claim_statements() | indent(4, first=true) }}

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
{{ forget_failed_look() }}
        THROW;
    END CATCH;
{%- endmacro %}

{#- The columns of a history row that a completing DELETE writes, in this order, with their types:
    the history table's definition, complete_batch's table variable and every column list of the
    completing statements take them from here. -#}
{% set history_row = [('id', id_type), ('enqueued_at', 'datetime2(7)'), ('due_at', 'datetime2(7)')]
    + ([('priority', 'int')] if has_priority else [])
    + ([('group_key', key_type)] if groups else [])
    + [('started_at', 'datetime2(7)'), ('finished_at', 'datetime2(7)'), ('worker', 'nvarchar(200)'),
       ('attempts', 'int'), ('payload', payload_type)] %}

{% macro history_columns() -%}
{% for name, _ in history_row %}{{ name }}{{ ', ' if not loop.last }}{% endfor %}
{%- endmacro %}

{#- history_row as column definitions, one a line, each followed by a comma; with_duration: and the
    history table's computed duration after finished_at. -#}
{% macro history_column_definitions(with_duration=false) -%}
{% set lines %}
{% for name, type in history_row %}
{% if name == 'group_key' %}
{{ name }} {{ type }} NULL, -- noqa: CP02
{% else %}
{{ name }} {{ type }} NOT NULL,
{% endif %}
{% if with_duration and name == 'finished_at' %}
duration_ms AS DATEDIFF_BIG(MILLISECOND, started_at, finished_at),
{% endif %}
{% endfor %}
{% endset %}
{{- lines | trim }}
{%- endmacro %}

{#- The OUTPUT clause of a completing DELETE: the history row, into `into` (the history table, or
    a table variable with the history_columns()). Expects @now. -#}
{% macro history_output(into) %}
    OUTPUT
        DELETED.id,
        DELETED.enqueued_at,
        DELETED.due_at,
{% if has_priority %}
        DELETED.priority,
{% endif %}
{% if groups %}
        DELETED.group_key,
{% endif %}
        DELETED.leased_at,
        @now,
        DELETED.leased_by,
        DELETED.attempts,
        DELETED.payload
    INTO
        {{ into }} (
            {{ history_columns() }}
        )
{%- endmacro %}

{#- Complete: delete the row if, and only if, worker_sql holds its live lease (token_sql, when not
    NULL, its current token); with history the same statement writes the history row (queue table,
    then history table). Expects @now. The caller reads @@ROWCOUNT right after. -#}
{% macro complete_statement(id_sql, worker_sql, token_sql) %}
    DELETE FROM {{ t }}
{% if history %}
{{ history_output(history_t) }}
{% endif %}
    WHERE
        id = {{ id_sql }} AND {{ holds_lease(worker_sql, token_sql) }};
{%- endmacro %}

{#- Fail: with attempts left, end the lease and make the message visible again after the retry
    delay; on the last attempt, move it to the dead-letter table. Only the holder of the live lease
    (token_sql, when not NULL, its current token) changes anything. Expects @now, @outcome
    varchar(8) and the buried_table() declarations; runs inside a transaction. -#}
{% macro fail_statements(id_sql, worker_sql, error_sql, retry_sql, token_sql) %}
    UPDATE {{ t }}
    SET
        leased_by = NULL,
        lease_token = NULL,
        visible_at = DATEADD(SECOND, {{ retry_sql }}, @now),
        last_error = {{ error_sql }}
    WHERE
        id = {{ id_sql }} AND {{ holds_lease(worker_sql, token_sql) }}
        AND attempts < {{ max_attempts }};

    IF @@ROWCOUNT = 1
        BEGIN
            SET @outcome = 'retrying';
        END;
    ELSE
        BEGIN
{{ bury("FROM " ~ t ~ " AS m\nWHERE\n    m.id = " ~ id_sql ~ " AND " ~ holds_lease(worker_sql, token_sql, 'm.', 4),
        "DELETED.attempts", error_sql, "DELETED.leased_by") | indent(8, first=true) }}
            SET @outcome = IIF(@buried_count = 1, 'dead', 'lost');
        END;
{%- endmacro %}

{#- The argument checks of a batch acknowledgement (complete_batch, fail_batch) on @acks, after the
    cap (m.check_batch_items): an id twice is refused (its two tokens could not both be the lease's,
    and one row per item would not say which was meant). A NULL id cannot reach it: the type's id is
    NOT NULL. -#}
{% macro check_acks(verb) %}
    DECLARE @null_ids int = (
        SELECT COUNT(*)
        FROM @acks AS a
        WHERE a.id IS NULL
    );
    IF @null_ids > 0
        BEGIN
{{ throw('invalid_argument', "N'" ~ names.plain('_' ~ verb) ~ ": acks holds a NULL id.'") }}
        END;
    DECLARE @repeated_id {{ id_type }} = (
        SELECT TOP (1) a.id
        FROM @acks AS a
        GROUP BY a.id
        HAVING COUNT(*) > 1
        ORDER BY a.id
    );
    IF @repeated_id IS NOT NULL
        BEGIN
{{ throw('invalid_argument', ["N'" ~ names.plain('_' ~ verb) ~ ": acks holds id '", "@repeated_id", "N' more than once.'"]) }}
        END;
{%- endmacro %}

{#- The acks in id order (declares @batch and fills it from @acks). The batch statements walk it
    first, one seek per item (LOOP JOIN, FORCE ORDER), so a batch locks its messages in id order
    whatever the order of its items: two batches with overlapping ids wait for each other instead of
    deadlocking. ROWLOCK on the queue table keeps the engine from locking pages, which a claim's
    READPAST could not skip. -#}
{% macro batch_in_id_order() %}
    DECLARE @batch TABLE (
        id {{ id_type }} NOT NULL PRIMARY KEY,
        lease_token uniqueidentifier NULL
    );
    INSERT INTO @batch (id, lease_token)
    SELECT
        a.id,
        a.lease_token
    FROM @acks AS a;
{%- endmacro %}
