{#- A queue table loses message groups (fifo, work), once the code units no longer use them: every
    message waiting becomes a message without a group, in its enqueue order. The groups table stays
    (a storage unit of its own, left as tablequeue leaves every table it no longer renders), emptied:
    its rows meant nothing without the columns, and a later groups: true starts from none. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set is_work = queue.kind == 'work' %}
{% if is_work %}
{#- Built before the code units, whose claims walk it; the old one replaced after them. -#}
{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'ready_new') ~ ' (every message) CONCURRENTLY',
          'nothing that blocks reads or writes (SHARE UPDATE EXCLUSIVE); two scans of the table, after waiting for older transactions') }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'ready_new') }}
ON {{ t }} (visible_at, {{ tie }})
WHERE {{ m.ready_predicate(false) }};

{{ m.step('transaction', 'replace ' ~ names.index_name('ix', 'ready') ~ ' with it',
          'the table, ACCESS EXCLUSIVE to drop the old index and rename the new one (catalog updates)', after_code=true) }}
{% include 'migrations/_replace_claim_index.sql' %}

{% endif %}
{{ m.step('transaction', 'drop the group indexes and columns, empty the groups table',
          'the table, ACCESS EXCLUSIVE for catalog updates (no rewrite); the groups table, ACCESS EXCLUSIVE to truncate it',
          after_code=true) }}
DROP INDEX IF EXISTS {{ names.qualified(names.index_name('ix', 'heads')) }};

DROP INDEX IF EXISTS {{ names.qualified(names.index_name('ix', 'group')) }};
{% if not is_work %}

DROP INDEX IF EXISTS {{ names.qualified(names.index_name('ix', 'ungrouped')) }};
{% endif %}

ALTER TABLE {{ t }} DROP COLUMN IF EXISTS group_key, DROP COLUMN IF EXISTS group_head;

DO $groups$
BEGIN
    IF to_regclass('{{ names.obj("_groups") }}') IS NOT NULL THEN
        TRUNCATE {{ names.obj('_groups') }};
    END IF;
END
$groups$;
