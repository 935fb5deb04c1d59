{#-
  Message groups on SQL Server (option groups, fifo so far; docs/queue-kinds.md, "Message groups",
  its SQL Server paragraph): the T-SQL fragments producers and consumers share. Imported "with
  context" by _destructive.sql, which sets t (the queue table) and pk (its clustered key).
  S.Q_groups is a heap under a NONCLUSTERED primary key (group_key). Its row is the group's lock:
  a holder reads the key WITH (UPDLOCK, READPAST) in a CTE whose UPDATE stamps locked_at, so the
  key keeps its U lock (the heap row takes the X) until the holder's transaction ends. A producer
  that cannot take it pins the key with a REPEATABLEREAD S lock, which a U lock lets through: a
  producer never waits for a consumer. Fixed lock order everywhere: the groups row, then message
  rows.
-#}
{% set groups_t = names.obj('_groups') %}
{% set groups_pk = names.index('pk', 'groups') %}
{% set heads_ix = names.index('ix', 'heads') %}
{% set group_ix = names.index('ix', 'group') %}
{% set ungrouped_ix = names.index('ix', 'ungrouped') %}
{% set group_key_type = 'nvarchar(200) COLLATE Latin1_General_100_BIN2' %}
{% set is_work = kind == 'work' %}
{% set group_tie = tie if is_work else 'id' %}
{#- The lock-free probe of the queue table on ix_<q>_group (a seek on the key). -#}
{% set group_probe = 'INDEX (' ~ group_ix ~ '), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK' %}
{% set group_claim = 'INDEX (' ~ group_ix ~ '), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK' %}
{% set groups_claim = 'INDEX (' ~ groups_pk ~ '), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK' %}

{#- wait's condition: the group key_sql has a row that nobody holds right now (READPAST, no U lock). -#}
{% macro not_held(key_sql) %}
EXISTS (
    SELECT g.locked_at
    FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
    WHERE
        g.group_key = {{ key_sql }}
        -- true for every row, without OR (claim-pin): it makes the seek read the
        -- heap row, which a holder's stamp holds X on, so READPAST skips held groups
        AND COALESCE(g.locked_at, '00010102') > '00010101'
)
{%- endmacro %}

{#- Take the group key_sql's row without waiting (READPAST): @@ROWCOUNT is 1 when this transaction
    now holds it (or already did), 0 when someone else does or there is no row. -#}
{% macro take_group(key_sql) %}
WITH held_group AS (
    SELECT g.locked_at
    FROM {{ groups_t }} AS g WITH ({{ groups_claim }}) -- noqa: LT05
    WHERE g.group_key = {{ key_sql }}
)

UPDATE held_group
SET locked_at = SYSUTCDATETIME();
{%- endmacro %}

{#- A producer joins the group @group (not NULL) and learns whether its message is a head
    candidate (@group_head). It waits only for another producer's uncommitted first insert of the
    same new key (or for a purge deleting the row: then it inserts the row again). Needs
    @group_head bit and @group_joined bit. A producer takes no key-range lock on the groups table
    (a range lock on the next key would wait for the consumer holding that neighbouring group). -#}
{% macro join_group(held_var=none) %}
SET @group_joined = 0;
WHILE @group_joined = 0
    BEGIN
        {{ take_group('@group') | indent(8) }}
        IF @@ROWCOUNT = 1
            BEGIN
                -- Nobody else holds the group until this transaction ends, so
                -- its head stays. The message leads only an empty group (a
                -- message READPAST skips is a producer's uncommitted one, a head
                -- candidate itself: at worst both are flagged).
                SET @group_head = CASE
                    WHEN EXISTS (
                        SELECT 1
                        FROM {{ t }} AS m WITH ({{ group_probe }}) -- noqa: LT05
                        WHERE m.group_key = @group AND m.group_key IS NOT NULL
                    ) THEN 0
                    ELSE 1
                END;
                SET @group_joined = 1;{% if held_var %}

                SET {{ held_var }} = 1;{% endif %}

            END;
        ELSE
            BEGIN
                -- Held by a consumer (or another producer), or missing. Held:
                -- the message is a head candidate, maybe a spurious one that the
                -- group's next holder demotes. The pin (an S lock on the key to
                -- the end of the transaction, compatible with a holder's U) keeps
                -- purge from deleting the row while the message is uncommitted.
                SELECT @group_joined = 1
                FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), FORCESEEK, ROWLOCK, REPEATABLEREAD) -- noqa: LT05
                WHERE g.group_key = @group;
                IF @group_joined = 1
                    BEGIN
                        SET @group_head = 1;
                    END;
                ELSE
                    BEGIN
                        -- A new key: a plain insert, no range lock (UPDLOCK,
                        -- HOLDLOCK would take RangeS-U on the next key, and wait
                        -- for the consumer holding that group). The unique key
                        -- waits only for a racing producer's uncommitted insert
                        -- of the same key; its duplicate error (2627, 2601) leaves
                        -- the transaction committable under XACT_ABORT OFF for
                        -- this one statement, and the loop pins the row. Anything
                        -- else is thrown under XACT_ABORT ON, as everywhere.
                        SET XACT_ABORT OFF;
                        BEGIN TRY
                            INSERT INTO {{ groups_t }} (group_key)
                            VALUES (@group);
                            SET XACT_ABORT ON;
                        END TRY
                        BEGIN CATCH
                            SET XACT_ABORT ON;
                            IF ERROR_NUMBER() NOT IN (2601, 2627) OR XACT_STATE() <> 1 THROW;
                        END CATCH;
                    END;
            END;
    END;
{%- endmacro %}

{#- The head of the held group @group into head_var: its oldest message this statement can see
    (two one-row seeks on ix_<q>_group, the waiting ones and the flagged ones; the smaller id).
    Needs @waiting_id and @flagged_id bigint. -#}
{% macro find_head(head_var) %}
SET @waiting_id = NULL;
SET @flagged_id = NULL;
SELECT TOP (1) @waiting_id = m.id
FROM {{ t }} AS m WITH ({{ group_probe }}) -- noqa: LT05
WHERE m.group_key = @group AND m.group_head = 0 AND m.group_key IS NOT NULL
ORDER BY m.id;
SELECT TOP (1) @flagged_id = m.id
FROM {{ t }} AS m WITH ({{ group_probe }}) -- noqa: LT05
WHERE m.group_key = @group AND m.group_head = 1 AND m.group_key IS NOT NULL
ORDER BY m.id;
SET {{ head_var }} = IIF(
    @flagged_id IS NULL OR @waiting_id < @flagged_id, @waiting_id, @flagged_id
);
{%- endmacro %}

{#- A holder of @group makes its flags exact: its head (find_head) is flagged, every other
    candidate it sees is demoted (a producer's uncommitted one stays, for the next holder). With no
    head it sees (@next_id NULL) there is no candidate it could see either. At most 1,000 demoted a
    statement (~2 key locks a row: far below lock escalation, which READPAST could not skip); a
    leftover flag is harmless, the head is the smaller of find_head's two probes. -#}
{% macro settle() %}
{{ find_head('@next_id') }}
{{ flag_head() }}
{%- endmacro %}

{#- settle's second half: @next_id (the head, or NULL) flagged, the other candidates demoted. -#}
{% macro flag_head() %}
WITH other_candidates AS (
    SELECT m.group_head
    FROM {{ t }} AS m WITH ({{ group_claim }}) -- noqa: LT05
    WHERE
        m.group_key = @group AND m.group_head = 1 AND m.group_key IS NOT NULL
        AND m.id <> @next_id
)

UPDATE TOP (1000) other_candidates
SET group_head = 0;
WITH next_head AS (
    SELECT m.group_head
    FROM {{ t }} AS m WITH (INDEX ({{ pk }}), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK) -- noqa: LT05
    WHERE m.id = @next_id
)

UPDATE next_head
SET group_head = 1;
{%- endmacro %}

{#- A holder of @group whose head it sees is none (@next_id NULL) deletes the group's row, in a
    transaction of purge's own (never a caller's). The delete never waits: a producer that pinned the
    row (its message uncommitted) makes it fail at once with 1222 (LOCK_TIMEOUT 0, to the end of the
    procedure, whose every later statement reads past locks anyway; SQL Server restores the caller's
    setting on return), and the caller of this macro leaves the group for the next purge. Then a new
    statement, which sees what committed, puts the row back if the group has messages. -#}
{% macro drop_if_empty() %}
IF @next_id IS NULL
    BEGIN
        SET LOCK_TIMEOUT 0;
        DELETE FROM g
        FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), FORCESEEK, ROWLOCK) -- noqa: LT05
{% if is_work %}
        {#- A group with a message in flight is never empty: the probes read past that message's row
            while something that does not hold the group (extend_lease, release) has it locked, and a
            groups row put back without its in_flight would let a second message of the group out. #}
        WHERE g.group_key = @group AND g.in_flight IS NULL;
{% else %}
        WHERE g.group_key = @group;
{% endif %}
        IF @@ROWCOUNT = 1
            BEGIN
                INSERT INTO {{ groups_t }} (group_key)
                SELECT @group
                WHERE EXISTS (
                    SELECT 1
                    FROM {{ t }} AS m WITH (INDEX ({{ group_ix }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.group_key = @group AND m.group_key IS NOT NULL
                );
            END;
    END;
{%- endmacro %}


{#- ---- work (docs/queue-kinds.md, Message groups, SQL Server): a group is busy while it has an
    in-flight message (groups.in_flight: leased, or waiting for its retry) or while its head is not
    yet due; its row is held only by the statements that change its head: a claim (READPAST, never
    waiting), an acknowledgement (waiting), purge (READPAST). Work's tie is seq with client ids. -#}

{#- The variables the work macros below use. -#}
{% macro work_declare() %}
    DECLARE @group nvarchar(200);
    DECLARE @group_head bit;
    DECLARE @group_joined bit;
    DECLARE @in_flight {{ id_type }};
    DECLARE @next_id {{ id_type }};
    DECLARE @waiting_id {{ id_type }};
    DECLARE @flagged_id {{ id_type }};
    DECLARE @waiting_tie bigint;
    DECLARE @flagged_tie bigint;
{%- endmacro %}

{#- An acknowledgement's hold of the group @group: waiting (it must act), a U lock on the key to the
    end of the transaction (HOLDLOCK on an existing key of a unique index locks that key alone: the
    row exists while the group has a message). Only a claim (short), purge's settling, or a
    producer's open transaction can hold it meanwhile (docs/queue-kinds.md, "A crosswise
    deadlock"). Reads in_flight into @in_flight, then @now again: a lease judged by the time before
    a long wait may have run out meanwhile (lease_status, which waits only for a message row, would
    have answered lost for a lease completed after). -#}
{% macro hold_group() %}
SET @in_flight = NULL;
SELECT @in_flight = g.in_flight
FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), FORCESEEK, ROWLOCK, UPDLOCK, HOLDLOCK) -- noqa: LT05
WHERE g.group_key = @group;
SET @now = SYSUTCDATETIME();
{%- endmacro %}

{#- A holder reads the in-flight id of the group @group it holds (its own locked row). -#}
{% macro read_in_flight() %}
SET @in_flight = NULL;
SELECT @in_flight = g.in_flight
FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
WHERE g.group_key = @group;
{%- endmacro %}

{#- The head of the held group @group into @next_id: its oldest message this statement can see by
    tie (two one-row seeks on ix_<q>_group, the waiting ones and the flagged ones). -#}
{% macro find_work_head() %}
-- Ties too: a probe that finds no row assigns nothing, and a tie left from
-- another group (or from process's last turn: a DECLARE resets nothing)
-- would pick the NULL id.
SET @waiting_id = NULL;
SET @waiting_tie = NULL;
SET @flagged_id = NULL;
SET @flagged_tie = NULL;
SELECT TOP (1)
    @waiting_id = m.id,
    @waiting_tie = m.{{ tie }}
FROM {{ t }} AS m WITH ({{ group_probe }}) -- noqa: LT05
WHERE m.group_key = @group AND m.group_head = 0 AND m.group_key IS NOT NULL
ORDER BY m.{{ tie }};
SELECT TOP (1)
    @flagged_id = m.id,
    @flagged_tie = m.{{ tie }}
FROM {{ t }} AS m WITH ({{ group_probe }}) -- noqa: LT05
WHERE m.group_key = @group AND m.group_head = 1 AND m.group_key IS NOT NULL
ORDER BY m.{{ tie }};
SET @next_id = IIF(
    @flagged_id IS NULL OR @waiting_tie < @flagged_tie,
    @waiting_id,
    @flagged_id
);
{%- endmacro %}

{#- A holder of @group makes it exact: its head is the in-flight message while it has one (a failed
    head retries before later ones), else the oldest (find_work_head); the head is flagged, the other
    candidates it sees demoted, and in_flight written. checked: an in-flight id whose message is gone
    (completed, dead, purged in this transaction) is cleared first; the acknowledgements and purge
    check, a claim knows (it reads no message row it might have to wait for). -#}
{% macro settle_work(checked) %}
{% if checked %}
SET @in_flight = (
    SELECT m.id
    FROM {{ t }} AS m WITH (INDEX ({{ pk }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
    WHERE m.id = @in_flight
);
{% endif %}
IF @in_flight IS NULL
    BEGIN
        {{ find_work_head() | indent(8) }}
    END;
ELSE
    BEGIN
        SET @next_id = @in_flight;
    END;
{{ flag_head() }}
UPDATE g
SET in_flight = @in_flight
FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), FORCESEEK, ROWLOCK) -- noqa: LT05
WHERE g.group_key = @group;
{%- endmacro %}

{#- The body the caller gives, once for each group of @acked_groups, as @group, in key order. -#}
{% macro each_acked_group() %}
SET @group = (SELECT MIN(a.group_key) FROM @acked_groups AS a);
WHILE @group IS NOT NULL
    BEGIN
        {{ caller() | indent(8) }}
        SET @group = (
            SELECT MIN(a.group_key)
            FROM @acked_groups AS a
            WHERE a.group_key > @group
        );
    END;
{%- endmacro %}
{#- An acknowledgement holds the groups of its messages, waiting, one at
    a time in key order (the fixed lock order: groups rows in key order, then message rows). Expects
    @acked_groups (group_key) filled with their distinct keys. -#}
{#- Each group of @acked_groups taken without waiting (take_group); one someone else holds leaves the
    set. -#}
{% macro take_acked_groups() %}
{% call each_acked_group() %}{{ take_group('@group') }}
IF @@ROWCOUNT = 0
    BEGIN
        DELETE FROM @acked_groups
        WHERE group_key = @group;
    END;{% endcall %}
{%- endmacro %}

{% macro hold_groups_in_order() %}
{% call each_acked_group() %}{{ hold_group() }}{% endcall %}
{%- endmacro %}

{#- A batch acknowledgement's groups (@batch: the acks in id order), into @acked_groups. -#}
{% macro acked_groups_of_batch() %}
{{ work_declare() }}
    -- The batch's groups (a message's group never changes: read without a lock), held first,
    -- waiting, one at a time in key order (the fixed lock order), settled after the change.
    DECLARE @acked_groups TABLE (
        group_key {{ group_key_type }} NOT NULL PRIMARY KEY -- noqa: CP02
    );
    INSERT INTO @acked_groups (group_key)
    SELECT DISTINCT m.group_key
    FROM @batch AS b
    INNER JOIN {{ t }} AS m ON b.id = m.id
    WHERE m.group_key IS NOT NULL
    -- As the acknowledgement's own join: a seek per item, whatever a table variable's estimate says.
    OPTION (LOOP JOIN, FORCE ORDER);
{%- endmacro %}

{#- A batch enqueue joins the groups of @joined (group_key, group_head) one at a time in key order
    (the fixed lock order) and records whether each one's first item is a head candidate. -#}
{% macro join_groups_in_order() %}
SET @group = (SELECT MIN(j.group_key) FROM @joined AS j);
WHILE @group IS NOT NULL
    BEGIN
        {{ join_group() | indent(8) }}
        UPDATE @joined
        SET group_head = @group_head
        WHERE group_key = @group;
        SET @group = (
            SELECT MIN(j.group_key)
            FROM @joined AS j
            WHERE j.group_key > @group
        );
    END;
{%- endmacro %}

{#- After the acknowledgement: each held group of @acked_groups settled (checked). -#}
{% macro settle_groups_in_order() %}
{% call each_acked_group() %}{{ read_in_flight() }}
{{ settle_work(true) }}{% endcall %}
{%- endmacro %}

{#- purge with groups (fifo and work): grouped messages go only with their group held (READPAST: the
    messages of a group a consumer or producer holds stay for the next purge), the groups row first
    (the fixed lock order); the holder then settles the group. Groups left empty lose their rows
    afterwards, outside any caller's transaction, each without waiting (drop_if_empty). Each chunk
    is a transaction of its own without the caller's, and the purge is the deadlock victim: a
    deadlock in its own transaction retries the chunk. Chunks follow the clustered key (work with
    client ids: seq). -#}
{% set p_order = group_tie %}
{% set p_index = names.index('ux', 'seq') if is_work and client_ids else pk %}
{% set p_id_type = id_type if is_work else 'bigint' %}
{% macro purge_body() %}
    -- The bound that stops a purge from chasing producers: one seek to the clustered index's end.
    DECLARE @last_id bigint = (
        SELECT MAX(m.{{ p_order }})
        FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
    );
    DECLARE @after_id bigint = 0;
    DECLARE @chunk_start bigint;
    DECLARE @purged bigint = 0;
    DECLARE @chunk_purged bigint;
    DECLARE @chunk int = 1;
    DECLARE @doomed TABLE (
        id {{ p_id_type }} NOT NULL PRIMARY KEY,
{% if p_order != 'id' %}
        {{ p_order }} bigint NOT NULL,
{% endif %}
        group_key {{ group_key_type }} NULL, -- noqa: CP02
        enqueued_at datetime2(7) NOT NULL
    );
{% if is_work %}
{{ work_declare() }}
{% else %}
    DECLARE @group nvarchar(200);
    DECLARE @next_id bigint;
    DECLARE @waiting_id bigint;
    DECLARE @flagged_id bigint;
{% endif %}
    DECLARE @started_transaction bit;
    DECLARE @deadlock_retries int = 0;
    DECLARE @pause datetime;
    DECLARE @keys TABLE (group_key {{ group_key_type }} NOT NULL PRIMARY KEY); -- noqa: CP02
    DECLARE @found int = 1;

    WHILE @chunk > 0
        BEGIN
            SET @chunk = {{ m.purge_chunk_size() }};
            SET @chunk_start = @after_id;
            SET @chunk_purged = 0;
            SET @started_transaction = 0;
            DELETE FROM @doomed;
            BEGIN TRY
                -- In implicit-transaction mode the caller owns the transaction the next statement opens.
                IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
                    BEGIN
                        BEGIN TRANSACTION;
                        SET @started_transaction = 1;
                    END;

                -- The chunk's messages, oldest first, read without a lock; those enqueued since
                -- older_than stay.
                INSERT INTO @doomed (id, {{ p_order ~ ', ' if p_order != 'id' }}group_key, enqueued_at)
                SELECT TOP (@chunk)
                    m.id,
{% if p_order != 'id' %}
                    m.{{ p_order }},
{% endif %}
                    m.group_key,
                    m.enqueued_at
                FROM {{ t }} AS m WITH (INDEX ({{ p_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.{{ p_order }} > @after_id AND m.{{ p_order }} <= @last_id
                ORDER BY m.{{ p_order }};
                SET @chunk = @@ROWCOUNT;
                SET @after_id = COALESCE((SELECT MAX(d.{{ p_order }}) FROM @doomed AS d), @after_id);
                DELETE FROM @doomed
                WHERE enqueued_at >= @older_than;

                WITH doomed AS (
                    SELECT m.id
                    FROM {{ t }} AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
                    WHERE m.id IN (
                        SELECT d.id
                        FROM @doomed AS d
                        WHERE d.group_key IS NULL
                    )
                )

                DELETE FROM doomed;
                SET @chunk_purged = @@ROWCOUNT;

                -- The chunk's groups, one at a time in key order.
                SET @group = (SELECT MIN(d.group_key) FROM @doomed AS d);
                WHILE @group IS NOT NULL
                    BEGIN
                        {{ take_group('@group') | indent(24) }}
                        IF @@ROWCOUNT = 1
                            BEGIN
                                WITH doomed AS (
                                    SELECT m.id
                                    FROM {{ t }} AS m WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE m.id IN (
                                        SELECT d.id
                                        FROM @doomed AS d
                                        WHERE d.group_key = @group
                                    )
                                )

                                DELETE FROM doomed;
                                SET @chunk_purged = @chunk_purged + @@ROWCOUNT;
{% if is_work %}
                                {{ read_in_flight() | indent(32) }}
                                {{ settle_work(true) | indent(32) }}
{% else %}
                                {{ settle() | indent(32) }}
{% endif %}
                            END;
                        SET @group = (
                            SELECT MIN(d.group_key)
                            FROM @doomed AS d
                            WHERE d.group_key > @group
                        );
                    END;

                IF @started_transaction = 1 COMMIT TRANSACTION;
                SET @purged = @purged + @chunk_purged;
            END TRY
            BEGIN CATCH
                IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                IF ERROR_NUMBER() <> 1205 OR @started_transaction = 0 OR @deadlock_retries >= 3 THROW;
                SET @deadlock_retries = @deadlock_retries + 1;
                SET @after_id = @chunk_start;
                SET @chunk = 1;
                SET @pause = DATEADD(MILLISECOND, 20 + ABS(CHECKSUM(NEWID()) % 180), CONVERT(datetime, 0));
                WAITFOR DELAY @pause;
            END CATCH;
        END;

    -- Groups left empty (by consumers, or by the chunks above) lose their rows, in key order, 1,000
    -- keys a round: each one taken without waiting (a held group stays for the next purge), in a
    -- transaction of its own; a deadlock, or a producer's pin that the delete would wait for (lock
    -- timeout 0: 1222), leaves the group for the next purge. Never inside a caller's transaction
    -- (or IMPLICIT_TRANSACTIONS): it would walk every key and hold the deleted ones till the
    -- caller commits; such a purge leaves empty groups' rows for a later purge outside one.
    IF @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0 SET @found = 0;
    SET @group = NULL;
    WHILE @found > 0
        BEGIN
            DELETE FROM @keys;
            IF @group IS NULL
                BEGIN
                    INSERT INTO @keys (group_key)
                    SELECT TOP (1000) g.group_key
                    FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    ORDER BY g.group_key;
                END;
            ELSE
                BEGIN
                    INSERT INTO @keys (group_key)
                    SELECT TOP (1000) g.group_key
                    FROM {{ groups_t }} AS g WITH (INDEX ({{ groups_pk }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE g.group_key > @group
                    ORDER BY g.group_key;
                END;
            SET @found = @@ROWCOUNT;
            SET @group = (SELECT MIN(k.group_key) FROM @keys AS k);
            WHILE @group IS NOT NULL
                BEGIN
                    SET @next_id = NULL;
                    SELECT TOP (1) @next_id = m.id
                    FROM {{ t }} AS m WITH ({{ group_probe }}) -- noqa: LT05
                    WHERE m.group_key = @group AND m.group_key IS NOT NULL;
                    IF @next_id IS NULL
                        BEGIN
                            SET @started_transaction = 0;
                            BEGIN TRY
                                IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
                                    BEGIN
                                        BEGIN TRANSACTION;
                                        SET @started_transaction = 1;
                                    END;
                                {{ take_group('@group') | indent(32) }}
                                IF @@ROWCOUNT = 1
                                    BEGIN
{% if is_work %}
                                        {{ find_work_head() | indent(40) }}
{% else %}
                                        {{ find_head('@next_id') | indent(40) }}
{% endif %}
                                        {{ drop_if_empty() | indent(40) }}
                                    END;
                                IF @started_transaction = 1 COMMIT TRANSACTION;
                            END TRY
                            BEGIN CATCH
                                IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                                -- A deadlock (1205) or the delete's lock timeout (1222) of its own
                                -- transaction: the group is left for the next purge.
                                IF ERROR_NUMBER() <> 1222 OR @started_transaction = 0
                                    BEGIN
                                        IF ERROR_NUMBER() <> 1205 OR @started_transaction = 0 THROW;
                                    END;
                            END CATCH;
                        END;
                    SET @group = (
                        SELECT MIN(k.group_key)
                        FROM @keys AS k
                        WHERE k.group_key > @group
                    );
                END;
            SET @group = (SELECT MAX(k.group_key) FROM @keys AS k);
        END;

    SELECT @purged AS purged;
{%- endmacro %}
