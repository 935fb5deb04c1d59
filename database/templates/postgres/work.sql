{#-
  The work kind: a reliable, lease-based queue (at-least-once). See docs/work-queue.md.
  A dequeue leases rows to a worker, counts an attempt and hands out the lease's token; complete /
  fail / extend_lease / release (and the batch forms) need the live lease, fenced by its token; a
  lease that expires makes the message visible again; max_attempts ends in S.Q_dead.
  This file holds the storage units; each procedure is a template of its own under work/, one per
  verb with the same file names in both dialects, so that a reviewer reads one verb at a time.
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
{% set groups = opt.groups %}
{% set group_shape = ('groups',) if groups else () %}
{% set position_key = ['visible_at', tie] %}
{% import '_macros.sql' as m with context %}
{% import '_work_macros.sql' as w with context %}
{% import '_group_macros.sql' as grp with context %}
{# Version 2: lease_token (migrations/work_table_v1_to_v2.sql). Version 3: the claim index ix_Q_ready of
   messages nobody leases replaces ix_Q_claim and ix_Q_lease (migrations/work_table_v2_to_v3.sql).
   Version 4: no CHECK constraints (migrations/work_table_v3_to_v4.sql). #}
{{ m.unit(names.plain(), 'storage', version=4, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids') + group_shape) }}
-- Every claim, fail and extend writes a new row version, never a HOT update (visible_at is indexed:
-- a HOT update needs every indexed column unchanged, a partial index's predicate columns included).
-- No CHECK constraints (storage v4): PostgreSQL evaluates every CHECK of a table on every UPDATE,
-- whatever columns it sets, and parses and plans them again for each statement that updates, so a
-- lease paid for checks of columns it never writes (about 35,000 instructions a work cycle,
-- docs/BENCHMARKS.md). enqueue and enqueue_batch check the payload's JSON shape and the keys'
-- lengths before they insert, and only the functions write this table (no role has a table
-- privilege). The destructive kinds keep theirs: their claims delete, and only a group's next head
-- is ever updated.
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
    -- New for every lease: complete, fail, extend_lease and release given a token act only while
    -- it is the message's current one (a stale holder is fenced off even under the same name).
    lease_token uuid,
    last_error text,
{% if dedupe %}
    dedupe_key text,
{% endif %}
{% if groups %}
    group_key text,
    -- NULL: no group; true: a head candidate of its group (in ix_{{ queue.name }}_heads); false: it
    -- waits behind its group's head (docs/queue-kinds.md, Message groups).
    group_head boolean,
{% endif %}
    payload {{ payload_type }} NOT NULL,
    CONSTRAINT {{ names.index('pk') }} PRIMARY KEY (id)
)
-- fillfactor leaves room on the page for the row's next version; vacuum and analyze run after a
-- fixed number of changed rows rather than a fraction of a (small, or huge) live count, so index
-- scans from the head do not wade through dead entries (as the destructive kinds).
{{ w.updated_table_parameters() }}

-- The claim's exact WHERE and ORDER BY, of the messages nobody leases (new, due, retrying, released).
{% if groups %}
-- Messages with a group are claimed from ix_{{ queue.name }}_heads.
{% endif %}
{% if has_priority %}
-- One priority level per range scan.
{% endif %}
-- Partial, so that a lease (leased_by set) writes no entry here: a leased row version is in the
-- primary key and the lease start index only (docs/queue-kinds.md, What a lease writes), where the
-- look for expired leases finds it.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'ready') }}
ON {{ t }} ({% if has_priority %}priority DESC, {% endif %}visible_at, {{ tie }})
WHERE {{ w.ready_filter() }};
{% if groups %}

-- The claim of grouped messages: only head candidates, so a held group's backlog is never read.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'heads') }}
ON {{ t }} (visible_at, {{ tie }})
WHERE group_head;

-- One group's head (the oldest waiting or flagged message) and its candidates.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'group') }}
ON {{ t }} (group_key, group_head, {{ tie }})
WHERE group_key IS NOT NULL;
{% endif %}
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

{{ m.unit(names.plain('_complete_next_result'), 'storage', version=1, object='type', shape=('payload', 'client_ids') + group_shape) }}
-- complete_next's result row: dequeue's columns and previous_completed. A type for the reason of
-- _enqueue_result: the contract names parameters and result columns alike (id, lease_token).
DO $type$
BEGIN
    IF to_regtype('{{ names.obj("_complete_next_result") }}') IS NULL THEN
        CREATE TYPE {{ names.obj("_complete_next_result") }} AS (
            id {{ id_type }},
            payload {{ payload_type }},
            enqueued_at timestamptz,
            due_at timestamptz,
            attempts integer,
            lease_token uuid,
{% if groups %}
            group_key text,
{% endif %}
            previous_completed boolean
        );
    END IF;
END
$type$;

{{ m.rewinds_unit() }}

{{ m.unit(names.index_plain('ix', 'lease_start'), 'storage', version=1, object='index') }}
-- Leased messages: the own-messages probe (a worker's leases taken since this session last found it
-- holding none), the look for expired leases (dequeue, at most once a second per session) and the
-- in-flight count. An index of its own, so that queues deployed before it gain it without a rebuild.
CREATE INDEX IF NOT EXISTS {{ names.index('ix', 'lease_start') }}
ON {{ t }} (leased_by, leased_at)
WHERE leased_by IS NOT NULL;

{# Storage v2: SQL Server's clustering with client ids; nothing changed here (migrations/work_dead_v1_to_v2.sql). #}
{{ m.unit(names.plain('_dead'), 'storage', version=2, object='table', shape=('payload', 'dedupe', 'priority', 'client_ids') + group_shape) }}
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
{% if groups %}
    group_key text,
{% endif %}
    attempts integer NOT NULL,
    last_error text,
    last_worker text,
    dead_at timestamptz NOT NULL,
    payload {{ payload_type }} NOT NULL,
    CONSTRAINT {{ names.index('pk', 'dead') }} PRIMARY KEY (id)
);
{% if history %}

{{ m.unit(names.plain('_history'), 'storage', version=1, object='table', shape=('payload', 'priority', 'client_ids') + group_shape) }}
-- Completed messages; history_purge deletes by finish time.
CREATE TABLE IF NOT EXISTS {{ history_t }} (
    history_id bigint GENERATED ALWAYS AS IDENTITY,
    id {{ id_type }} NOT NULL,
    enqueued_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
{% if has_priority %}
    priority integer NOT NULL,
{% endif %}
{% if groups %}
    group_key text,
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
{% if groups %}

{{ m.unit(names.plain('_groups'), 'storage', version=1, object='table', shape=('client_ids',)) }}
-- One row per group key that has messages: the group's lock (docs/queue-kinds.md, Message groups).
-- in_flight: the group's message that is leased or waiting for its retry, written only by a holder.
CREATE TABLE IF NOT EXISTS {{ names.obj('_groups') }} (
    group_key text NOT NULL,
    in_flight {{ id_type }},
    CONSTRAINT {{ names.index('pk', 'groups') }} PRIMARY KEY (group_key)
)
-- in_flight is not indexed: its updates are HOT, on the page's free space.
{{ w.updated_table_parameters() }}
{% endif %}

{{ m.ownership_unit(['', '_dead', '_rewinds'] + (['_history'] if history else []) + (['_enqueue_result'] if client_ids else []) + ['_complete_next_result'] + (['_groups'] if groups else [])) }}

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

{% include 'wait.sql' %}

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
