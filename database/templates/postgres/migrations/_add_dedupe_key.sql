{#- A queue table gains dedupe (shared by every kind): the column and, on a destructive kind's table,
    its length check, then the partial unique index, as a fresh install of the kind has them (a work
    table has no CHECK since storage v4: work.sql). The check is added NOT VALID and validated in a
    step of its own, so that no step scans the table under an exclusive lock. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set checked = queue.kind != 'work' %}
{{ m.step('transaction', 'add column dedupe_key' ~ (' and its length check (NOT VALID)' if checked else ''),
          'the table, ACCESS EXCLUSIVE for a catalog update (no rewrite, no scan)') }}
ALTER TABLE {{ t }} ADD COLUMN IF NOT EXISTS dedupe_key text;
{% if checked %}

{{ m.add_length_check_not_valid('dedupe_key') }}

{{ m.step('transaction', 'validate the length check',
          'the table, SHARE UPDATE EXCLUSIVE (reads and writes go on) for one scan of the table') }}
ALTER TABLE {{ t }} VALIDATE CONSTRAINT {{ names.index('ck', 'dedupe_key') }};
{% endif %}

{{ m.step('concurrent', 'build the unique index ' ~ names.index_name('ux', 'dedupe') ~ ' CONCURRENTLY',
          'nothing that blocks reads or writes (SHARE UPDATE EXCLUSIVE); two scans of the table, after waiting for older transactions') }}
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ux', 'dedupe') }}
ON {{ t }} (dedupe_key)
WHERE dedupe_key IS NOT NULL;
