{#-
  The work kind: a reliable, lease-based queue (at-least-once). docs/work-queue.md explains the
  storage, the indexes, the claim and the lease/attempt rules; keep it in step.
  A dequeue leases rows to a worker, counts an attempt and hands out the lease's token; complete /
  fail / extend_lease / release (and their batch forms) need the live lease, fenced by its token; a
  lease that expires makes the message visible again; max_attempts ends in S.Q_dead.
  This file holds the storage units; each procedure is a template of its own under work/, one per
  verb with the same file names in both dialects, so that a reviewer reads one verb at a time.
-#}
{% set t = names.obj() %}
{% set dead_t = names.obj('_dead') %}
{% set history_t = names.obj('_history') %}
{% set items = names.obj('_items') %}
{% set acks = names.obj('_acks') %}
{% set client_ids = opt.client_ids %}
{% set id_type = 'uniqueidentifier' if client_ids else 'bigint' %}
{% set tie = 'seq' if client_ids else 'id' %}
{% set has_priority = opt.priority %}
{% set dedupe = opt.dedupe %}
{% set history = opt.history %}
{% set max_attempts = opt.max_attempts %}
{% set lease_seconds = opt.lease_seconds %}
{% set handler = opt.handler %}
{#- Message groups (docs/queue-kinds.md, Message groups, SQL Server): a group is busy while it has an
    in-flight message (leased, waiting for its retry, or a head not yet due), not while a transaction
    holds it; its groups row is taken only for the statements that change its head. -#}
{% set groups = opt.get('groups', false) %}
{% set group_shape = ('groups',) if groups else () %}
{#- Dedupe keys compare byte for byte, as text does on PostgreSQL (as in the destructive kinds). -#}
{% set key_type = 'nvarchar(200) COLLATE Latin1_General_100_BIN2' %}
{#- The indexes the claims, probes and counts name in their INDEX hints: one source for the CREATE
    INDEX below, the hints, the migrations and the tSQLt classes. -#}
{% import '_pinned_indexes.sql' as pins with context %}
{% set claim_index = pins.claim_index %}
{% set lease_index = pins.lease_index %}
{% set pk = pins.pk %}
{% import '_macros.sql' as m with context %}
{% if groups %}
{% import '_group_macros.sql' as grp with context %}
{% endif %}
{% import '_work_macros.sql' as w with context %}
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

{# Storage v2: lease_token (migrations/work_table_v1_to_v2.sql). Storage v3: the claim index of the
   messages nobody leases, filtered WHERE leased_by IS NULL (migrations/work_table_v2_to_v3.sql).
   Storage v4: PostgreSQL's table drops its CHECK constraints, which it evaluates on every UPDATE;
   here a recorded no-op: SQL Server checks ck_<queue>_payload_json only in a statement that writes
   payload, which no UPDATE here does (migrations/work_table_v3_to_v4.sql). #}
{{ m.unit(names.plain(), 'storage', version=4, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids') + group_shape) }}
IF OBJECT_ID(N'{{ t }}', N'U') IS NULL
    BEGIN
        CREATE TABLE {{ t }} (
{% if client_ids %}
            -- Client-supplied GUIDs (Pintér) are random: clustered on them, inserts would split
            -- pages all over the table. seq keeps inserts appending and breaks claim-order ties.
            id uniqueidentifier NOT NULL,
            seq bigint IDENTITY (1, 1) NOT NULL,
{% else %}
            id bigint IDENTITY (1, 1) NOT NULL,
{% endif %}
            enqueued_at datetime2(7) NOT NULL
            CONSTRAINT {{ names.index('df', 'enqueued_at') }} DEFAULT (SYSUTCDATETIME()),
            -- The scheduled start as enqueued (dequeue returns it).
            due_at datetime2(7) NOT NULL,
            -- When the message may next be claimed: due_at, then the lease's expiry while leased,
            -- then the retry time after a fail.
            visible_at datetime2(7) NOT NULL,
{% if has_priority %}
            priority int NOT NULL
            CONSTRAINT {{ names.index('df', 'priority') }} DEFAULT (0),
{% endif %}
            attempts int NOT NULL
            CONSTRAINT {{ names.index('df', 'attempts') }} DEFAULT (0),
            leased_by nvarchar(200) NULL,
            leased_at datetime2(7) NULL,
            -- The lease's fencing token, new for every lease: complete, fail, extend_lease and
            -- release given a token act only while it is the message's current one.
            lease_token uniqueidentifier NULL,
            last_error nvarchar(4000) NULL,
{% if dedupe %}
            dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
{% if groups %}
            group_key {{ key_type }} NULL, -- noqa: CP02
            -- NULL: no group; 1: a head candidate of its group (in ix_{{ queue.name }}_heads); 0: it
            -- waits behind its group's head (docs/queue-kinds.md, Message groups).
            group_head bit NULL,
{% endif %}
            payload {{ payload_type }} NOT NULL,
{% if is_json %}
            CONSTRAINT {{ names.index('ck', 'payload_json') }} CHECK (ISJSON(payload) = 1),
{% endif %}
{% if client_ids %}
            CONSTRAINT {{ names.index('pk') }} PRIMARY KEY NONCLUSTERED (id)
{% else %}
            -- Clustered on the immutable id: a claim, fail or extend updates the row in place (a
            -- claim moves its entry from the claim index to the lease index, an extend moves it
            -- within the lease index), complete is a clustered seek, and deleted rows leave no
            -- emptied heap pages behind.
            CONSTRAINT {{ names.index('pk') }} PRIMARY KEY CLUSTERED (id)
{% endif %}
        );
{% if client_ids %}

        CREATE UNIQUE CLUSTERED INDEX {{ names.index('ux', 'seq') }}
            ON {{ t }} (seq);
{% endif %}

        -- The claim's exact WHERE and ORDER BY, of the messages nobody leases: filtered, so that a
        -- lease moves a message's entry out of it into the lease index instead of moving its key
        -- within it (docs/queue-kinds.md, What a lease writes).
{% if has_priority %}
        -- One priority level per seek.
{% endif %}
{% if groups %}
        -- Messages with a group are claimed on the head candidates' index.
{% endif %}
        {{ pins.create_index(pins.pinned[0], t) | indent(8) }};

        -- Leased rows only: a worker's own messages (the restart path), the in-flight count and
        -- the look for expired leases (dequeue, at most once a second per session).
        {{ pins.create_index(pins.pinned[1], t) | indent(8) }};
{% if groups %}

        -- The claim of grouped messages (only head candidates, so a blocked group's backlog is never
        -- read); one group's head and its candidates.
{% for index in pins.group_pinned %}
        {{ pins.create_index(index, t) | indent(8) }};
{% endfor %}
{% endif %}
{% if dedupe %}

        -- Filtered: messages without a key cost nothing. IGNORE_DUP_KEY is not allowed on a filtered
        -- index, and would hide the existing id anyway: enqueue locks the key and reports it itself.
        CREATE UNIQUE NONCLUSTERED INDEX {{ names.index('ux', 'dedupe') }}
            ON {{ t }} (dedupe_key)
            WHERE dedupe_key IS NOT NULL;
{% endif %}

        -- Appending to an ever-increasing key latches the last page; past ~8 concurrent producers
        -- that is the bottleneck (NServiceBus.SqlServer #624). SQL Server 2019+ and Azure can queue
        -- the waiters fairly; 2017 cannot, hence the guard (a literal: nothing is concatenated).
        IF CONVERT(int, SERVERPROPERTY('ProductMajorVersion')) >= 15 OR SERVERPROPERTY('EngineEdition') IN (5, 8)
            BEGIN
                EXEC (N'ALTER INDEX {{ names.index('ux', 'seq') if client_ids else names.index('pk') }} ON {{ t }} SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);'); -- noqa: LT05
            END;
    END;
GO

{{ m.unit(names.plain('_items'), 'storage', version=1, object='type', shape=('payload',) + group_shape) }}
-- One shape whatever the options; columns an option does not use must be NULL (enqueue_batch
-- checks). dedupe_key is wider than the table's so that an over-long key reaches the procedure's
-- check (and its error number) instead of failing in the driver.
IF TYPE_ID(N'{{ items }}') IS NULL
    BEGIN
        CREATE TYPE {{ items }} AS TABLE (
            ordinal int NOT NULL PRIMARY KEY,
            payload {{ payload_type }} NULL,
            due_at datetime2(7) NULL,
            dedupe_key nvarchar(MAX) COLLATE Latin1_General_100_BIN2 NULL, -- noqa: CP02
            priority int NULL,
            id uniqueidentifier NULL,
            enqueued_at datetime2(7) NULL{% if groups %},
            group_key nvarchar(MAX) COLLATE Latin1_General_100_BIN2 NULL -- noqa: CP02{% endif %}

        );
    END;
GO

{{ m.unit(names.plain('_acks'), 'storage', version=1, object='type', shape=('client_ids',)) }}
-- complete_batch and fail_batch: one message each, by id with its lease token (NULL: the worker's
-- name alone, as 0.1.0 checked). No key on id and no NOT NULL: an id given twice or a NULL id
-- reaches the procedure, which refuses it naming the queue (the type would fail in the driver,
-- naming neither).
IF TYPE_ID(N'{{ acks }}') IS NULL
    BEGIN
        CREATE TYPE {{ acks }} AS TABLE (
            id {{ id_type }} NULL,
            lease_token uniqueidentifier NULL
        );
    END;
GO

{# Storage v2: with client ids, clustered on dead_seq, no longer on the random id
   (migrations/work_dead_v1_to_v2.sql); without them the table is as v1 made it. #}
{{ m.unit(names.plain('_dead'), 'storage', version=2, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids') + group_shape) }}
IF OBJECT_ID(N'{{ dead_t }}', N'U') IS NULL
    BEGIN
        -- Messages that used up max_attempts: a last fail, or a lease that expired once too often.
{% if client_ids %}
        -- Few inserts, paged reads by id (dead_list). Client ids are random GUIDs: clustered on them,
        -- every insert would land on a random page and split it. dead_seq keeps inserts appending;
        -- the primary key on id, nonclustered, is what dead_list, dead_requeue and dead_delete seek.
        -- No OPTIMIZE_FOR_SEQUENTIAL_KEY (the queue table has it): dead letters arrive one per
        -- message transaction, never in a convoy on the last page.
{% else %}
        -- Few inserts, paged reads by id (dead_list): clustered on id.
{% endif %}
        CREATE TABLE {{ dead_t }} (
            id {{ id_type }} NOT NULL,
{% if client_ids %}
            dead_seq bigint IDENTITY (1, 1) NOT NULL,
{% endif %}
            enqueued_at datetime2(7) NOT NULL,
            due_at datetime2(7) NOT NULL,
{% if has_priority %}
            priority int NOT NULL,
{% endif %}
{% if dedupe %}
            dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
{% if groups %}
            -- A buried message keeps its group: dead_requeue puts it back into it.
            group_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
            attempts int NOT NULL,
            last_error nvarchar(4000) NULL,
            last_worker nvarchar(200) NULL,
            dead_at datetime2(7) NOT NULL,
            payload {{ payload_type }} NOT NULL,
{% if client_ids %}
            CONSTRAINT {{ names.index('pk', 'dead') }} PRIMARY KEY NONCLUSTERED (id)
        );

        CREATE UNIQUE CLUSTERED INDEX {{ names.index('ux', 'dead_seq') }}
            ON {{ dead_t }} (dead_seq);
{% else %}
            CONSTRAINT {{ names.index('pk', 'dead') }} PRIMARY KEY CLUSTERED (id)
        );
{% endif %}
    END;
GO
{% if history %}

{{ m.unit(names.plain('_history'), 'storage', version=1, object='table', shape=('payload', 'priority', 'client_ids') + group_shape) }}
IF OBJECT_ID(N'{{ history_t }}', N'U') IS NULL
    BEGIN
        -- Completed messages. Clustered on the finish time: inserts append, and history_purge
        -- deletes a range at the start of the clustered index.
        CREATE TABLE {{ history_t }} (
            history_id bigint IDENTITY (1, 1) NOT NULL,
{{ w.history_column_definitions(with_duration=true) | indent(12, first=true) }}
            CONSTRAINT {{ names.index('pk', 'history') }} PRIMARY KEY CLUSTERED (finished_at, history_id)
        );

        CREATE NONCLUSTERED INDEX {{ names.index('ix', 'history_id') }}
            ON {{ history_t }} (id);
    END;
GO
{% endif %}
{% if groups %}

{{ m.unit(names.plain('_groups'), 'storage', version=1, object='table', shape=('client_ids',)) }}
IF OBJECT_ID(N'{{ grp.groups_t }}', N'U') IS NULL
    BEGIN
        -- One row per group key that has messages: the group's lock (docs/queue-kinds.md, Message
        -- groups), taken only by the statements that change the group's head. in_flight: the
        -- group's message that is leased or waiting for its retry (NULL: none), written only by a
        -- holder. A heap under a nonclustered key, as fifo's: a holder's U lock stays on the key
        -- while its writes (locked_at, in_flight: in no index, ever) take the heap row, so a
        -- producer's S lock on the key never waits for it. Only ever read by a seek on the key.
        CREATE TABLE {{ grp.groups_t }} (
            group_key {{ key_type }} NOT NULL, -- noqa: CP02
            locked_at datetime2(7) NULL,
            in_flight {{ id_type }} NULL,
            CONSTRAINT {{ grp.groups_pk }} PRIMARY KEY NONCLUSTERED (group_key)
        );
    END;
GO
{% endif %}

{% include 'work/enqueue.sql' %}

{% include 'work/enqueue_batch.sql' %}

{% include 'work/dequeue.sql' %}

{% include 'work/complete.sql' %}

{% include 'work/fail.sql' %}

{% include 'work/extend_lease.sql' %}

{% include 'work/release.sql' %}

{% include 'work/lease_status.sql' %}

{% include 'work/complete_batch.sql' %}

{% include 'work/fail_batch.sql' %}

{% include 'work/complete_next.sql' %}

{% include 'work/wait.sql' %}

{% include 'work/stats.sql' %}

{% include 'work/purge.sql' %}

{% include 'work/dead_list.sql' %}

{% include 'work/dead_requeue.sql' %}

{% include 'work/dead_delete.sql' %}
{% if history %}

{% include 'work/history_purge.sql' %}
{% endif %}
{% if handler %}
{% set handler_parts = handler.split('.') if '.' in handler else [schema, handler] %}

{% include 'work/process.sql' %}
{% endif %}
