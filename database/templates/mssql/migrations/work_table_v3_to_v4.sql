{#- work table, storage version 3 to 4, a recorded no-op on SQL Server. v4 is PostgreSQL's change: it
    evaluates every CHECK constraint of a table on every UPDATE, so it dropped them. SQL Server compiles
    a CHECK constraint into an UPDATE's plan only when the SET list names a column the constraint uses
    (even SET payload = payload); an INSERT always checks it. No UPDATE tablequeue runs on this table
    sets payload (the claims, fail, fail_batch, extend_lease, release, the group-head updates), so none
    pays for ck_<queue>_payload_json (payload=json queues; payload=text and binary have no CHECK), and
    it stays. The dedupe and group keys' lengths are bounded by their nvarchar(200) types here. The
    version moves on both engines so that a storage version means one thing (docs/upgrades.md); here
    the migration only records it. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'record v4: nothing to change (no UPDATE sets payload, the only column a CHECK names)',
          'the deploy history table only (one row inserted); nothing on the queue tables') }}
-- Nothing to run: v4 changes only PostgreSQL's table.
