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
{% set dead_cols = ['id', 'enqueued_at', 'due_at'] + (['priority'] if has_priority else []) + (['dedupe_key'] if dedupe else []) + ['attempts', 'last_error', 'last_worker', 'dead_at', 'payload'] %}
{% macro dead_columns() %}
id, enqueued_at, due_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}attempts,
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
    must still seek at depth). -#}
{% macro claim_statement(cte, top_sql, where_sql, own, index) %}
    WITH {{ cte }} AS (
        SELECT TOP ({{ top_sql }})
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
            m.payload
        FROM {{ t }} AS m WITH (INDEX ({{ index }}), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE {{ where_sql }}
        ORDER BY m.visible_at, m.{{ tie }}
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
        INSERTED.payload
    INTO @claimed (
        id, {{ 'seq, ' if client_ids }}own, {{ 'priority, ' if has_priority }}previous_visible_at, previous_worker,
        enqueued_at, due_at, attempts, lease_token, payload
    );
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
    ones a seek below the current one. -#}
{% macro next_level(below) %}
    SET @priority = (
        SELECT TOP (1) m.priority
{% if below %}
        FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
{% else %}
        FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
{% endif %}
{% if below %}
        WHERE m.priority < @priority
{% endif %}
        ORDER BY m.priority DESC
    );
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
{{ buried_table() }}
{%- endmacro %}

{% macro claim_statements() %}
    -- 1. Own messages first. `leased_by IS NOT NULL` repeats the filter of the filtered index,
    -- so that the optimizer can match it whatever @worker is.
{{ claim_statement('own_messages', '@remaining', 'm.leased_by = @worker AND m.leased_by IS NOT NULL', true, lease_index) }}

{{ bury_exhausted() }}

    SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);

    -- 2. Visible messages. A claimed row that goes to the dead-letter table frees its place in
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
{{ claim_statement('next_messages', '@remaining - @claimed_now', 'm.priority = @priority AND m.visible_at <= @now', false, claim_index) | indent(16, first=true) }}
                    SET @claimed_now = @claimed_now + @@ROWCOUNT;
{{ next_level(true) | indent(16, first=true) }}
                END;
{% else %}
{{ claim_statement('next_messages', '@remaining', 'm.visible_at <= @now', false, claim_index) | indent(8, first=true) }}
            SET @claimed_now = @@ROWCOUNT;
{% endif %}

            IF @claimed_now = 0 BREAK;

            SET @buried_count = 0;
{{ bury_exhausted() | indent(8, first=true) }}

            SET @remaining = @batch_size - (SELECT COUNT(*) FROM @claimed);
            IF @buried_count = 0 BREAK;
        END;
{%- endmacro %}

{% macro claim() %}
{{ claim_declarations() }}

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
        THROW;
    END CATCH;
{%- endmacro %}

{#- The columns of a history row that a completing DELETE writes, in this order, with their types:
    the history table's definition, complete_batch's table variable and every column list of the
    completing statements take them from here. -#}
{% set history_row = [('id', id_type), ('enqueued_at', 'datetime2(7)'), ('due_at', 'datetime2(7)')]
    + ([('priority', 'int')] if has_priority else [])
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
{{ name }} {{ type }} NOT NULL,
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
