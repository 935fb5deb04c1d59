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
{#- The claim index has one name per key shape: an option migration builds the new one before the
    code units and drops the old one after them, so that the old code and the new code each find the
    index they name, with the key they seek on, for the whole deploy. -#}
{% macro claim_name(priority, quoted=true) %}{{ (names.index if quoted else names.index_name)('ix', 'claim_priority' if priority else 'claim') }}{% endmacro %}
{% macro claim_key(priority) %}{{ 'priority DESC, ' if priority }}visible_at, {{ tie }}{% endmacro %}
{% set has_priority = kind == 'work' and opt.priority %}
{% set has_groups = opt.get('groups', false) %}
{#- work with groups claims its ungrouped messages on ix_<q>_ungrouped, the claim key filtered WHERE
    group_key IS NULL: a name of its own, as the key shapes above (the option migrations build it
    beside ix_<q>_claim before the code units and drop the other one after them). -#}
{% set claim_index = names.index('ix', 'ungrouped') if kind == 'work' and has_groups else claim_name(has_priority) %}
{% set lease_index = names.index('ix', 'lease') %}
{% set lease_key = 'leased_by, visible_at, ' ~ tie %}
{% set lease_filter = 'leased_by IS NOT NULL' %}
{#- Every index a pin names, as (CREATE ... INDEX words, name, key, filter or none). -#}
{% if kind == 'work' and has_groups %}
{% set pinned = [('NONCLUSTERED', claim_index, claim_key(false), 'group_key IS NULL'),
                 ('NONCLUSTERED', lease_index, lease_key, lease_filter)] %}
{% elif kind == 'work' %}
{% set pinned = [('NONCLUSTERED', claim_index, claim_key(has_priority), none),
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
{#- Its settle and head lease seek one message by its primary key, and purge walks the clustered key
    (seq with client ids): pinned too, so the tSQLt fake gets them. -#}
{% set key_pinned = [('NONCLUSTERED', pk, 'id', none), ('UNIQUE CLUSTERED', names.index('ux', 'seq'), 'seq', none)]
    if opt.client_ids else [('CLUSTERED', pk, 'id', none)] %}
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
    as a usable nonclustered index without a filter (the claim indexes' shape): a disabled one (a bulk
    load's habit) fails every pinned claim with Msg 315, a filtered or clustered one is another index,
    so neither counts as having the key, and the migration builds it again.
    Migrations guard on the key, not on the name alone: 0.1.0 named the claim index with priority
    ix_q_claim, the name 0.2.0 gives the key without priority. STRING_AGG: SQL Server 2017. -#}
{% macro has_key(t, name, key, clustered=false) %}
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
            AND i.type = {{ 1 if clustered else 2 }} AND i.is_disabled = 0 AND i.has_filter = 0
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
