{#- work: option groups turned on; the dead rows already there have no group. The old code units
    insert without the column until the deploy replaces them: NULL, no group, as they had. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'add column group_key', 'the dead table, ACCESS EXCLUSIVE for a catalog update (no rewrite)') }}
ALTER TABLE {{ names.obj('_dead') }} ADD COLUMN IF NOT EXISTS group_key text;
