{#- A queue table loses dedupe (shared by every kind), once the code units no longer use it: the
    filtered index, then the column. The keys of the messages waiting are forgotten; the messages
    stay. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{{ m.step('transaction', 'drop the index ' ~ names.index_name('ux', 'dedupe') ~ ' and column dedupe_key',
          'the table, Sch-M for metadata changes (the column space is reclaimed by the next index rebuild), every edition',
          after_code=true) }}
DROP INDEX IF EXISTS {{ names.index('ux', 'dedupe') }} ON {{ t }};
GO

IF COL_LENGTH(N'{{ t }}', N'dedupe_key') IS NOT NULL
    BEGIN
        ALTER TABLE {{ t }} DROP COLUMN dedupe_key;
    END;
GO
