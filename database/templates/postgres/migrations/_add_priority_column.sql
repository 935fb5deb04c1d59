{#- work: option priority turned on for the dead-letter or history table (role: dead | history);
    the rows already there get priority 0. A fresh install's column has no default (every insert
    names it): the default fills the existing rows, then goes. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'add column priority', 'the ' ~ role ~ ' table, ACCESS EXCLUSIVE for catalog updates (a constant default: no rewrite)') }}
ALTER TABLE {{ names.obj('_' ~ role) }} ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0;

ALTER TABLE {{ names.obj('_' ~ role) }} ALTER COLUMN priority DROP DEFAULT;
