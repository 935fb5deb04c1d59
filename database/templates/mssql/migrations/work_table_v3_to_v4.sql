{#- work table, storage version 3 to 4, a recorded no-op on SQL Server. v4 is PostgreSQL's change: it
    evaluates every CHECK constraint of a table on every UPDATE, so it dropped them. SQL Server checks
    a CHECK constraint in an UPDATE only when the statement sets a column the constraint names: a
    lease, a fail or an extend sets none of ck_<queue>_payload_json's, and pays nothing for it, so the
    constraint stays. The version moves on both engines so that a storage version means one thing
    (docs/upgrades.md); here the migration only records it. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'record v4: nothing to change (a CHECK costs an UPDATE only when it sets its column)',
          'nothing: no statement runs, the deploy history records the new version') }}
-- Nothing to run: v4 changes only PostgreSQL's table.
