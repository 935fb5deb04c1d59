{#- work: option priority turned off for the dead-letter or history table (role: dead | history).
    The new code units no longer name the column: it gets a default first, so that their inserts work
    while it is still there, and goes once they are in place. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'give column priority a default (0)', 'the ' ~ role ~ ' table, ACCESS EXCLUSIVE for a catalog update') }}
ALTER TABLE {{ names.obj('_' ~ role) }} ALTER COLUMN priority SET DEFAULT 0;

{{ m.step('transaction', 'drop column priority', 'the ' ~ role ~ ' table, ACCESS EXCLUSIVE for a catalog update (no rewrite)',
          after_code=true) }}
ALTER TABLE {{ names.obj('_' ~ role) }} DROP COLUMN IF EXISTS priority;
