{#- work: option dedupe turned off; the dead letters' keys are forgotten, the dead letters stay. -#}
{% import '_macros.sql' as m with context %}
{% set dead_t = names.obj('_dead') %}
{{ m.step('transaction', 'drop column dedupe_key',
          'the dead-letter table, Sch-M for a metadata change, every edition', after_code=true) }}
IF COL_LENGTH(N'{{ dead_t }}', N'dedupe_key') IS NOT NULL
    BEGIN
        ALTER TABLE {{ dead_t }} DROP COLUMN dedupe_key;
    END;
GO
