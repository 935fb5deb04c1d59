{#- work: option priority turned off for a deployed queue: the claim index without priority is built
    under its own name before the code units, the old one dropped after them (_switch_claim_index.sql),
    then, the code units no longer naming it, the column and its default go. The messages waiting keep
    their order by visible time. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set priority = false %}
{% include 'migrations/_switch_claim_index.sql' %}

{{ m.step('transaction', 'drop column priority and its default',
          'the table, Sch-M for metadata changes, every edition', after_code=true) }}
IF COL_LENGTH(N'{{ t }}', N'priority') IS NOT NULL
    BEGIN
        ALTER TABLE {{ t }} DROP CONSTRAINT IF EXISTS {{ names.index('df', 'priority') }};

        ALTER TABLE {{ t }} DROP COLUMN priority;
    END;
GO
