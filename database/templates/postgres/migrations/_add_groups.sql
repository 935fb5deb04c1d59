{#- A queue table gains message groups (fifo, work): the columns (fifo: and the key's length check;
    a work table has no CHECK since storage v4, work.sql), then the indexes a fresh install of the kind
    has, built CONCURRENTLY. The messages already waiting have no group and keep their order. work:
    the partial claim index replaces the full one only after the code units, so that the old claim
    (no group predicate) keeps its index until it is gone. The check is added NOT VALID and validated
    in a step of its own, so that no step scans the table under an exclusive lock. The including
    template sets tie (work: the claim order's tie-breaker; fifo: id). -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set is_work = queue.kind == 'work' %}
{% set build_locks = 'nothing that blocks reads or writes (SHARE UPDATE EXCLUSIVE); two scans of the table, after waiting for older transactions' %}
{{ m.step('transaction', 'add columns group_key' ~ (' (its length check NOT VALID)' if not is_work else '') ~ ' and group_head',
          'the table, ACCESS EXCLUSIVE for catalog updates (no rewrite, no scan)') }}
ALTER TABLE {{ t }} ADD COLUMN IF NOT EXISTS group_key text;

ALTER TABLE {{ t }} ADD COLUMN IF NOT EXISTS group_head boolean;
{% if not is_work %}

{{ m.add_length_check_not_valid('group_key') }}

{{ m.step('transaction', 'validate the length check',
          'the table, SHARE UPDATE EXCLUSIVE (reads and writes go on) for one scan of the table') }}
ALTER TABLE {{ t }} VALIDATE CONSTRAINT {{ names.index('ck', 'group_key') }};
{% endif %}

{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'heads') ~ ' CONCURRENTLY', build_locks) }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'heads') }}
ON {{ t }} ({% if is_work %}visible_at, {% endif %}{{ tie }})
WHERE group_head;

{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'group') ~ ' CONCURRENTLY', build_locks) }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'group') }}
ON {{ t }} (group_key, group_head, {{ tie }})
WHERE group_key IS NOT NULL;
{% if is_work %}

{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'ready_new') ~ ' (messages without a group) CONCURRENTLY', build_locks) }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'ready_new') }}
ON {{ t }} (visible_at, {{ tie }})
WHERE {{ m.ready_predicate(true) }};

{{ m.step('transaction', 'replace ' ~ names.index_name('ix', 'ready') ~ ' with it',
          'the table, ACCESS EXCLUSIVE to drop the old index and rename the new one (catalog updates)', after_code=true) }}
{% include 'migrations/_replace_claim_index.sql' %}
{% else %}

{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'ungrouped') ~ ' CONCURRENTLY', build_locks) }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'ungrouped') }}
ON {{ t }} (id)
WHERE group_key IS NULL;
{% endif %}
