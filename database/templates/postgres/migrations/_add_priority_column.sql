{#- work: option priority turned on for the dead-letter or history table (role: dead | history);
    the rows already there get priority 0. A fresh install's column has no default (every insert
    names it), but the old code units, in place until the deploy replaces them, insert without it:
    the default stays until they are gone. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'add column priority', 'the ' ~ role ~ ' table, ACCESS EXCLUSIVE for catalog updates (a constant default: no rewrite)') }}
ALTER TABLE {{ names.obj('_' ~ role) }} ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0;

{{ m.step('transaction', 'drop the default of column priority', 'the ' ~ role ~ ' table, ACCESS EXCLUSIVE for a catalog update',
          after_code=true) }}
ALTER TABLE {{ names.obj('_' ~ role) }} ALTER COLUMN priority DROP DEFAULT;
