{#- work: option priority turned on for a deployed queue. Every message waiting gets priority 0 (what
    enqueue gives a message without one); the claim index with priority leading is built under its
    own name before the code units, the old one dropped after them (_switch_claim_index.sql). -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{{ m.step('transaction', 'add column priority (default 0)',
          'the table, Sch-M: Enterprise, Developer, Azure SQL a metadata change (the default is stored once); Standard, Express every row is written under it (size of data)') }}
IF COL_LENGTH(N'{{ t }}', N'priority') IS NULL
    BEGIN
        ALTER TABLE {{ t }} ADD priority int NOT NULL
        CONSTRAINT {{ names.index('df', 'priority') }} DEFAULT (0);
    END;
GO

{% set priority = true %}
{% include 'migrations/_switch_claim_index.sql' %}
