{#- work: option priority turned on for the dead-letter or history table (role: dead | history);
    the rows already there get priority 0. A fresh install's column has no default (every insert
    names it), but the old code units, in place until the deploy replaces them, insert without it
    (error 515): the default stays until they are gone. -#}
{% import '_macros.sql' as m with context %}
{% set table = names.obj('_' ~ role) %}
{% set default = names.index('df', role ~ '_priority') %}
{{ m.step('transaction', 'add column priority',
          'the ' ~ role ~ ' table, Sch-M: Enterprise, Developer, Azure SQL a metadata change; Standard, Express every row is written (size of data)') }}
IF COL_LENGTH(N'{{ table }}', N'priority') IS NULL
    BEGIN
        ALTER TABLE {{ table }} ADD priority int NOT NULL
        CONSTRAINT {{ default }} DEFAULT (0);
    END;
GO

{{ m.step('transaction', 'drop the default of column priority', 'the ' ~ role ~ ' table, Sch-M for a metadata change, every edition',
          after_code=true) }}
ALTER TABLE {{ table }}
DROP CONSTRAINT IF EXISTS {{ default }};
GO
