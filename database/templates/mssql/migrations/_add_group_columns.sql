{#- The columns group_key and group_head (nullable: no row is touched), for fifo_table_add_groups and
    work_table_add_groups, which set t and import m. -#}
{{ m.step('transaction', 'add columns group_key and group_head',
          'the table, Sch-M for a metadata change (nullable columns: no row is touched), every edition') }}
IF COL_LENGTH(N'{{ t }}', N'group_key') IS NULL
    BEGIN
        ALTER TABLE {{ t }}
        ADD group_key nvarchar(200) COLLATE Latin1_General_100_BIN2 NULL; -- noqa: CP02
    END;
GO

IF COL_LENGTH(N'{{ t }}', N'group_head') IS NULL
    BEGIN
        ALTER TABLE {{ t }}
        ADD group_head bit NULL;
    END;
GO
