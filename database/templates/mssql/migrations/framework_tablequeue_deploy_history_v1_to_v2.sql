{#- The deploy history as 0.1.0 created it (version 1) gains what later releases record for storage
    units. Only deploys write this table, under the deploy lock: no queue traffic waits on it. -#}
{% import '_macros.sql' as m with context %}
{% set history = names.qualified("tablequeue_deploy_history") %}
{{ m.step('transaction', 'add storage_version, storage_shape and migration to the deploy history',
          'the deploy history table, Sch-M for a metadata change (nullable columns); only deploys use it') }}
IF COL_LENGTH(N'{{ history }}', N'storage_version') IS NULL
    BEGIN
        ALTER TABLE {{ history }} ADD
        storage_version int NULL,
        storage_shape varchar(400) NULL,
        migration varchar(200) NULL;
    END;
GO
