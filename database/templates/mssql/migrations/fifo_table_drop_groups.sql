{#- fifo: option groups turned off, once the code units no longer use them: the group indexes, then
    the columns; every message waiting becomes a message without a group, in its enqueue order. The
    groups table stays (a storage unit of its own, left as tablequeue leaves every table it no longer
    renders), emptied: its rows meant nothing without the columns, and a later groups: true starts
    from none. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set groups_t = names.obj('_groups') %}
{{ m.step('transaction', 'drop the group indexes and columns, empty the groups table',
          'the table, Sch-M for metadata changes (the column space is reclaimed by the next index rebuild), every edition; the groups table, X on its rows (one per live key) to delete them',
          after_code=true) }}
{% for purpose in ('heads', 'group', 'ungrouped') %}
DROP INDEX IF EXISTS {{ names.index('ix', purpose) }} ON {{ t }};
GO

{% endfor %}
IF COL_LENGTH(N'{{ t }}', N'group_key') IS NOT NULL
    BEGIN
        ALTER TABLE {{ t }} DROP COLUMN group_key;
    END;
GO

IF COL_LENGTH(N'{{ t }}', N'group_head') IS NOT NULL
    BEGIN
        ALTER TABLE {{ t }} DROP COLUMN group_head;
    END;
GO

IF OBJECT_ID(N'{{ groups_t }}', N'U') IS NOT NULL
    BEGIN
        DELETE FROM {{ groups_t }};
    END;
GO
