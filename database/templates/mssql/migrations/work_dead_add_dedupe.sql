{#- work: option dedupe turned on; dead letters keep their key (dead_requeue puts it back). -#}
{% import '_macros.sql' as m with context %}
{% set dead_t = names.obj('_dead') %}
{{ m.step('transaction', 'add column dedupe_key',
          'the dead-letter table, Sch-M for a metadata change (a nullable column), every edition') }}
IF COL_LENGTH(N'{{ dead_t }}', N'dedupe_key') IS NULL
    BEGIN
        ALTER TABLE {{ dead_t }}
        ADD dedupe_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL; -- noqa: CP02
    END;
GO
