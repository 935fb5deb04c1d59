{#- work: option priority turned on for the dead-letter or history table (role: dead | history);
    the rows already there get priority 0. A fresh install's column has no default (every insert
    names it): the default fills the existing rows, then goes. -#}
{% import '_macros.sql' as m with context %}
{% set table = names.obj('_' ~ role) %}
{{ m.step('transaction', 'add column priority',
          'the ' ~ role ~ ' table, Sch-M: Enterprise, Developer, Azure SQL a metadata change; Standard, Express every row is written (size of data)') }}
IF COL_LENGTH(N'{{ table }}', N'priority') IS NULL
    BEGIN
        ALTER TABLE {{ table }} ADD priority int NOT NULL
        CONSTRAINT {{ names.index('df', role ~ '_priority') }} DEFAULT (0);

        ALTER TABLE {{ table }} DROP CONSTRAINT {{ names.index('df', role ~ '_priority') }};
    END;
GO
