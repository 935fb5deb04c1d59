{#-
  The indexes a queue's claims, probes and counts name in their INDEX hints (docs/queue-kinds.md,
  "Plans at depth"). With a pin, a missing index, or one with another key or filter, is a compile
  error on every call (Msg 308, 8622), not a slower plan: names, keys and filters are part of the
  contract (docs/operations.md). This file is their one source: the table's DDL, the hints, the
  priority migrations and the tSQLt helper that builds them again on a faked table all read it.
  Import it with context (names, kind, opt).
-#}
{% set tie = 'seq' if kind == 'work' and opt.client_ids else 'id' %}
{% set pk = names.index('pk') %}
{#- The destructive kinds pin their clustered primary key, whose key is the claim's ORDER BY. -#}
{% set pk_key = 'due_at, id' if kind == 'pending' else 'id' %}
{#- The work kind's claim index has one name per key and filter: an option or storage migration
    builds the new one before the code units and drops the old one after them, so that the old code
    and the new code each find the index they name, with the key and filter they seek on, for the
    whole deploy. Storage v3 (docs/queue-kinds.md, What a lease writes): ix_<q>_ready, the messages
    nobody leases, filtered WHERE leased_by IS NULL, so that a lease deletes its entry here and
    inserts one in ix_<q>_lease, and moves no key within one index. -#}
{% macro claim_name(priority, quoted=true) %}{{ (names.index if quoted else names.index_name)('ix', 'ready_priority' if priority else 'ready') }}{% endmacro %}
{% macro claim_key(priority) %}{{ 'priority DESC, ' if priority }}visible_at, {{ tie }}{% endmacro %}
{% set ready_filter = 'leased_by IS NULL' %}
{#- Storage v2's names (ix_<q>_claim, ix_<q>_claim_priority, ix_<q>_ungrouped: the same keys, no
    lease filter), for the migrations that reach v2 and the one that leaves it. -#}
{% macro claim_name_v2(priority, quoted=true) %}{{ (names.index if quoted else names.index_name)('ix', 'claim_priority' if priority else 'claim') }}{% endmacro %}
{% set has_priority = kind == 'work' and opt.priority %}
{% set has_groups = opt.get('groups', false) %}
{#- work with groups claims its ungrouped messages on ix_<q>_ready_ungrouped, the claim key filtered
    WHERE group_key IS NULL AND leased_by IS NULL: a name of its own, as the key shapes above (the
    option migrations build it beside ix_<q>_ready before the code units and drop the other one after
    them). -#}
{% set ungrouped_name = names.index('ix', 'ready_ungrouped') %}
{% set ungrouped_filter = 'group_key IS NULL AND leased_by IS NULL' %}
{% set claim_index = ungrouped_name if kind == 'work' and has_groups else claim_name(has_priority) %}
{% set claim_filter = ungrouped_filter if kind == 'work' and has_groups else ready_filter %}
{#- The leased messages: a worker's own (the restart claim), the in-flight count, and the look for
    expired leases (dequeue, at most once a second per session), which walks it in its key order. -#}
{% set lease_index = names.index('ix', 'lease') %}
{% set lease_key = 'leased_by, visible_at, ' ~ tie %}
{% set lease_filter = 'leased_by IS NOT NULL' %}
{#- Every index a pin names, as (CREATE ... INDEX words, name, key, filter or none). -#}
{% if kind == 'work' %}
{% set pinned = [('NONCLUSTERED', claim_index, claim_key(has_priority), claim_filter),
                 ('NONCLUSTERED', lease_index, lease_key, lease_filter)] %}
{% else %}
{% set pinned = [('CLUSTERED', pk, pk_key, none)] %}
{% endif %}
{#- fifo with groups (docs/queue-kinds.md, Message groups): the claim of ungrouped messages, the head
    candidates (group_key in the key: the claim's probe reads no row), one group's messages. -#}
{% set group_pinned = [('NONCLUSTERED', names.index('ix', 'ungrouped'), 'id', 'group_key IS NULL'),
                       ('NONCLUSTERED', names.index('ix', 'heads'), 'group_head, id, group_key', 'group_head = 1'),
                       ('NONCLUSTERED', names.index('ix', 'group'), 'group_key, group_head, id', 'group_key IS NOT NULL')]
    if kind == 'fifo' and has_groups else [] %}
{#- work with groups: the ungrouped claim index is pinned[0] above; the head candidates in claim order
    (visible_at: a leased or retrying head leaves the range until it is due again), one group's
    messages in tie order. -#}
{% if kind == 'work' and has_groups %}
{% set group_pinned = [('NONCLUSTERED', names.index('ix', 'heads'), 'group_head, visible_at, ' ~ tie ~ ', group_key', 'group_head = 1'),
                       ('NONCLUSTERED', names.index('ix', 'group'), 'group_key, group_head, ' ~ tie, 'group_key IS NOT NULL')] %}
{% endif %}
{#- work: its keys. lease_status seeks each message by its primary key (FORCESEEK; with client ids the
    key's entry, then the row by seq, one lock at a time), the grouped settle and head lease seek by
    it too, and purge walks the clustered key: pinned, so the tSQLt fake gets them (clustered first). -#}
{% if kind == 'work' %}
{% set key_pinned = [('UNIQUE CLUSTERED', names.index('ux', 'seq'), 'seq', none), ('UNIQUE NONCLUSTERED', pk, 'id', none)]
    if opt.client_ids else [('UNIQUE CLUSTERED', pk, 'id', none)] %}
{% set pinned = pinned + group_pinned + key_pinned %}
{% else %}
{% set pinned = pinned + group_pinned %}
{% endif %}
{#- With groups (fifo and work): the groups table's primary key, which every group claim, pin and probe
    names (a heap under a nonclustered key: a holder's U lock stays on the key while its stamp takes the
    heap row's X, the lock semantics the groups rest on). On a fake, a unique index under the key's name. -#}
{% set groups_pinned = [('UNIQUE NONCLUSTERED', names.index('pk', 'groups'), 'group_key', none)]
    if has_groups else [] %}

{#- work: the dead-letter table's primary key on id, which dead_list reads in order (with client ids
    the table is clustered on dead_seq since storage v2, and the key on id is NONCLUSTERED: unpinned, a
    plan compiled on a small table could scan and sort the whole table on every page). -#}
{% set dead_pinned = [('NONCLUSTERED' if opt.client_ids else 'CLUSTERED', names.index('pk', 'dead'), 'id', none)]
    if kind == 'work' else [] %}

{#- A condition: index `name` (unquoted) of table t (quoted) exists with exactly the key `key`, written
    as claim_key writes it (columns in key order, ', ' between them, ' DESC' after a descending one),
    as a usable nonclustered index with exactly the filter `filter` (none: without a filter): a
    disabled one (a bulk load's habit) fails every pinned claim with Msg 315, one with another filter
    or clustered is another index, so neither counts as having the key, and the migration builds it
    again. The filter is compared as sys.indexes.filter_definition keeps it ('([leased_by] IS NULL)'),
    without spaces, brackets and parentheses, which `filter` (a pinned index's) never needs.
    Migrations guard on the key, not on the name alone: 0.1.0 named the claim index with priority
    ix_q_claim, the name 0.2.0 gives the key without priority. STRING_AGG: SQL Server 2017. -#}
{% macro has_key(t, name, key, clustered=false, filter=none) %}
COALESCE(
    (
        SELECT
            STRING_AGG(
                CONCAT(c.name, CASE WHEN ic.is_descending_key = 1 THEN N' DESC' END), N', '
            ) WITHIN GROUP (ORDER BY ic.key_ordinal)
        FROM sys.indexes AS i
        INNER JOIN sys.index_columns AS ic
            ON i.object_id = ic.object_id AND i.index_id = ic.index_id
        INNER JOIN sys.columns AS c
            ON ic.object_id = c.object_id AND ic.column_id = c.column_id
        WHERE
            i.object_id = OBJECT_ID(N'{{ t }}')
            AND i.name = N'{{ name }}'
{% if filter %}
            AND i.type = {{ 1 if clustered else 2 }} AND i.is_disabled = 0 AND i.has_filter = 1
            AND REPLACE(TRANSLATE(i.filter_definition, N'[]()', N'    '), N' ', N'') = N'{{ filter | replace(' ', '') }}'
{% else %}
            AND i.type = {{ 1 if clustered else 2 }} AND i.is_disabled = 0 AND i.has_filter = 0
{% endif %}
            AND ic.key_ordinal > 0
    ),
    N''
) = N'{{ key }}'
{%- endmacro %}

{#- CREATE INDEX for one pinned index (on a table already holding messages, see create_index_online). -#}
{% macro create_index(index, on) %}
{% set words, name, key, filter = index %}
CREATE {{ words }} INDEX {{ name }}
    ON {{ on }} ({{ key }}){% if filter %}

    WHERE {{ filter }}{% endif %}
{%- endmacro %}

{#- The tSQLt class's helper (cls: the class, on: the queue table). tSQLt.FakeTable replaces the table
    with a heap without indexes, and the verbs name theirs in INDEX hints (Msg 308 otherwise): every
    test runs it right after faking the queue table (check-tsql rule fake-pin). Index names belong to
    their table, so they do not clash with the renamed original's (a primary key is a constraint,
    whose name the original keeps: the fake gets a plain clustered index under that name, which is
    all an INDEX hint needs). -#}
{% macro fake_helper(cls, on, indexes=pinned, what='queue') %}
CREATE PROCEDURE {{ cls }}.[index the faked {{ what }} table]
AS
BEGIN
{% for index in indexes %}
    {{ create_index(index, on) | indent(4) }};
{% endfor %}
END;
GO
{%- endmacro %}
