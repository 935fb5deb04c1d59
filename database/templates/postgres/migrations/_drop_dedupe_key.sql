{#- A queue table loses dedupe (shared by every kind), once the code units no longer use it: the
    index, then the column (and its check with it). The keys of the messages waiting are forgotten;
    the messages stay. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{{ m.step('concurrent', 'drop the unique index ' ~ names.index_name('ux', 'dedupe') ~ ' CONCURRENTLY',
          'nothing that blocks reads or writes; waits for transactions using the index', after_code=true) }}
DROP INDEX CONCURRENTLY IF EXISTS {{ names.qualified(names.index_name('ux', 'dedupe')) }};

{{ m.step('transaction', 'drop column dedupe_key and its check',
          'the table, ACCESS EXCLUSIVE for a catalog update (no rewrite: the space is reused as rows change)',
          after_code=true) }}
ALTER TABLE {{ t }} DROP COLUMN IF EXISTS dedupe_key;
