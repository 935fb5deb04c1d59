{#- After the code units: the group indexes, the columns, the groups table's rows, for
    fifo_table_drop_groups and work_table_drop_groups, which set t and groups_t and import m. The
    ungrouped claim index: fifo's ix_<q>_ungrouped, work's ix_<q>_ready_ungrouped (storage v3). -#}
{% set ungrouped_purpose = 'ready_ungrouped' if queue.kind == 'work' else 'ungrouped' %}
{{ m.step('transaction', 'drop the group indexes and columns, empty the groups table',
          'the table, Sch-M for metadata changes (the column space is reclaimed by the next index rebuild), every edition; the groups table, X on its rows (one per live key) to delete them',
          after_code=true) }}
{% for purpose in ('heads', 'group', ungrouped_purpose) %}
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
