{#- work: the dead-letter table's storage v1 to v2, a recorded no-op on PostgreSQL. v2 is SQL
    Server's change: with client ids it clustered the table on the random GUID, and clusters it on
    a sequential key now. A PostgreSQL table is a heap: rows go where there is room whatever the
    key, and the primary key on id is a separate btree, so there is no clustering to change. The
    version moves on both engines so that a storage version means one thing (docs/upgrades.md);
    here the migration only records it. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'record v2: nothing to change (a heap has no clustering key)',
          'nothing: no statement runs, the deploy history records the new version') }}
-- Nothing to run: v2 changes only SQL Server's clustering of the dead-letter table.
