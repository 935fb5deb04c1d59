{#- work: option dedupe turned on; dead letters keep their key (dead_requeue puts it back). -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'add column dedupe_key', 'the dead-letter table, ACCESS EXCLUSIVE for a catalog update (no rewrite)') }}
ALTER TABLE {{ names.obj('_dead') }} ADD COLUMN IF NOT EXISTS dedupe_key text;
