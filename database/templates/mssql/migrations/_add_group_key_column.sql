{#- work: option groups turned on for the dead-letter or history table (role: dead | history); the
    rows already there have no group. The old code units insert without the column until the deploy
    replaces them: NULL, no group, as they had. -#}
{% import '_macros.sql' as m with context %}
{% set table = names.obj('_' ~ role) %}
{{ m.step('transaction', 'add column group_key',
          'the ' ~ role ~ ' table, Sch-M for a metadata change (a nullable column: no row is touched), every edition') }}
IF COL_LENGTH(N'{{ table }}', N'group_key') IS NULL
    BEGIN
        ALTER TABLE {{ table }}
        ADD group_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL; -- noqa: CP02
    END;
GO
