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
{#- The lock-free probe of the queue table on ix_<q>_group (a seek on the key). -#}
{% set group_probe = 'INDEX (' ~ group_ix ~ '), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK' %}
{% set group_claim = 'INDEX (' ~ group_ix ~ '), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK' %}
{% set groups_claim = 'INDEX (' ~ groups_pk ~ '), FORCESEEK, ROWLOCK, READPAST, UPDLOCK, READCOMMITTEDLOCK' %}

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
{% macro join_group() %}
SET @group_joined = 0;
WHILE @group_joined = 0
    BEGIN
        {{ take_group('@group') | indent(8) }}
        IF @@ROWCOUNT = 1
            BEGIN
                -- Nobody else holds the group until this transaction ends, so its head stays. The
                -- message leads only an empty group (a message READPAST skips is a producer's
                -- uncommitted one, a head candidate itself: at worst both are flagged).
                SET @group_head = CASE
                    WHEN EXISTS (
                        SELECT 1
                        FROM {{ t }} AS m WITH ({{ group_probe }}) -- noqa: LT05
                        WHERE m.group_key = @group AND m.group_key IS NOT NULL
                    ) THEN 0
                    ELSE 1
                END;
                SET @group_joined = 1;
            END;
        ELSE
            BEGIN
                -- Held by a consumer (or another producer), or missing. Held: the message is a head
                -- candidate, maybe a spurious one that the group's next holder demotes. The pin (an S
                -- lock on the key to the end of the transaction, compatible with a holder's U) keeps
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
                        -- A new key: a plain insert, no range lock (UPDLOCK, HOLDLOCK would take
                        -- RangeS-U on the next key, and wait for the consumer holding that group). The
                        -- unique key waits only for a racing producer's uncommitted insert of the same
                        -- key; its duplicate error (2627, 2601) leaves the transaction committable
                        -- under XACT_ABORT OFF for this one statement, and the loop pins the row.
                        -- Anything else is thrown under XACT_ABORT ON, as everywhere.
                        SET XACT_ABORT OFF;
                        BEGIN TRY
                            INSERT INTO {{ groups_t }} (group_key) VALUES (@group);
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
        WHERE g.group_key = @group;
        INSERT INTO {{ groups_t }} (group_key)
        SELECT @group
        WHERE EXISTS (
            SELECT 1
            FROM {{ t }} AS m WITH (INDEX ({{ group_ix }}), FORCESEEK, ROWLOCK, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.group_key = @group AND m.group_key IS NOT NULL
        );
    END;
{%- endmacro %}
