{#- work: option priority turned on for a deployed queue. Every message waiting gets priority 0 (what
    enqueue gives a message without one); the claim index is built again with priority leading, under
    its own name (DROP_EXISTING). -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set tie = 'seq' if opt.client_ids else 'id' %}
{% set claim = names.index_name('ix', 'claim') %}
{{ m.step('transaction', 'add column priority (default 0)',
          'the table, Sch-M: Enterprise, Developer, Azure SQL a metadata change (the default is stored once); Standard, Express every row is written under it (size of data)') }}
IF COL_LENGTH(N'{{ t }}', N'priority') IS NULL
    BEGIN
        ALTER TABLE {{ t }} ADD priority int NOT NULL
        CONSTRAINT {{ names.index('df', 'priority') }} DEFAULT (0);
    END;
GO

{{ m.step('transaction', 'build ' ~ claim ~ ' again with priority leading',
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start, Sch-M briefly at the end); Standard, Express: S on the table for the build (writes wait)') }}
DECLARE @claim_first_key sysname = INDEX_COL(
    N'{{ t }}',
    INDEXPROPERTY(OBJECT_ID(N'{{ t }}'), N'{{ claim }}', 'IndexID'),
    1
);

IF COALESCE(@claim_first_key, N'') <> N'priority'
    BEGIN
{{ m.create_index_online('CREATE NONCLUSTERED INDEX ' ~ names.index('ix', 'claim') ~ '\n    ON ' ~ t ~ ' (priority DESC, visible_at, ' ~ tie ~ ')', 'DROP_EXISTING = ON') | indent(8, first=true) }}
    END;
GO
