{#- A queue table gains dedupe (shared by every kind): the column, then the filtered unique index, as
    a fresh install of the kind has them. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set ux = names.index_name('ux', 'dedupe') %}
{{ m.step('transaction', 'add column dedupe_key',
          'the table, Sch-M for a metadata change (a nullable column: no row is touched), every edition') }}
IF COL_LENGTH(N'{{ t }}', N'dedupe_key') IS NULL
    BEGIN
        ALTER TABLE {{ t }}
        ADD dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL; -- noqa: CP02
    END;
GO

{{ m.step('transaction', 'build the filtered unique index ' ~ ux,
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start and at the end); Standard, Express: S on the table for the build (writes wait)') }}
IF INDEXPROPERTY(OBJECT_ID(N'{{ t }}'), N'{{ ux }}', 'IndexID') IS NULL
    BEGIN
{{ m.create_index_online('CREATE UNIQUE NONCLUSTERED INDEX ' ~ names.index('ux', 'dedupe') ~ '\n    ON ' ~ t ~ ' (dedupe_key)\n    WHERE dedupe_key IS NOT NULL') | indent(8, first=true) }}
    END;
GO
