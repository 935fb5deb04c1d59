{#- work: option priority turned off for a deployed queue, once the code units no longer use it: the
    claim index is built again without priority (DROP_EXISTING, its own name), then the column and
    its default go. The messages waiting keep their order by visible time. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set tie = 'seq' if opt.client_ids else 'id' %}
{% set claim = names.index_name('ix', 'claim') %}
{{ m.step('transaction', 'build ' ~ claim ~ ' again without priority',
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start, Sch-M briefly at the end); Standard, Express: S on the table for the build (writes wait)',
          after_code=true) }}
DECLARE @claim_first_key sysname = INDEX_COL(
    N'{{ t }}',
    INDEXPROPERTY(OBJECT_ID(N'{{ t }}'), N'{{ claim }}', 'IndexID'),
    1
);

IF COALESCE(@claim_first_key, N'') = N'priority'
    BEGIN
{{ m.create_index_online('CREATE NONCLUSTERED INDEX ' ~ names.index('ix', 'claim') ~ '\n    ON ' ~ t ~ ' (visible_at, ' ~ tie ~ ')', 'DROP_EXISTING = ON') | indent(8, first=true) }}
    END;
GO

{{ m.step('transaction', 'drop column priority and its default',
          'the table, Sch-M for metadata changes, every edition', after_code=true) }}
IF COL_LENGTH(N'{{ t }}', N'priority') IS NOT NULL
    BEGIN
        ALTER TABLE {{ t }} DROP CONSTRAINT IF EXISTS {{ names.index('df', 'priority') }};

        ALTER TABLE {{ t }} DROP COLUMN priority;
    END;
GO
