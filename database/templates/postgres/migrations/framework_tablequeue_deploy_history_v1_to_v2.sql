{#- The deploy history as 0.1.0 created it (version 1) gains what later releases record for storage
    units. Only deploys write this table, under the deploy lock: no queue traffic waits on it. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'add storage_version, storage_shape and migration to the deploy history',
          'the deploy history table, ACCESS EXCLUSIVE for a catalog update (no rewrite); only deploys use it') }}
ALTER TABLE {{ names.qualified("tablequeue_deploy_history") }}
ADD COLUMN IF NOT EXISTS storage_version integer,
ADD COLUMN IF NOT EXISTS storage_shape text,
ADD COLUMN IF NOT EXISTS migration text;
