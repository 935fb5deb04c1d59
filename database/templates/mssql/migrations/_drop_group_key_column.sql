{#- work: option groups turned off for the dead-letter or history table (role: dead | history), once
    the code units no longer name the column. -#}
{% import '_macros.sql' as m with context %}
{% set table = names.obj('_' ~ role) %}
{{ m.step('transaction', 'drop column group_key',
          'the ' ~ role ~ ' table, Sch-M for a metadata change (the space is reclaimed by the next rebuild), every edition',
          after_code=true) }}
IF COL_LENGTH(N'{{ table }}', N'group_key') IS NOT NULL
    BEGIN
        ALTER TABLE {{ table }} DROP COLUMN group_key;
    END;
GO
