{#- work: option dedupe turned off; the dead letters' keys are forgotten, the dead letters stay. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'drop column dedupe_key',
          'the dead-letter table, ACCESS EXCLUSIVE for a catalog update (no rewrite)', after_code=true) }}
ALTER TABLE {{ names.obj('_dead') }} DROP COLUMN IF EXISTS dedupe_key;
