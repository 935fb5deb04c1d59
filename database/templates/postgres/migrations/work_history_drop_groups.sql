{#- work: option groups turned off, once the code units no longer name the column. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'drop column group_key', 'the history table, ACCESS EXCLUSIVE for a catalog update (no rewrite)',
          after_code=true) }}
ALTER TABLE {{ names.obj('_history') }} DROP COLUMN IF EXISTS group_key;
