{#- work table, storage version 3 to 4: the table's CHECK constraints go (work.sql says why: PostgreSQL
    evaluates them on every UPDATE, a lease's included). enqueue and enqueue_batch check the same
    before they insert. Dropping a CHECK is a catalog change: no scan, no rewrite, but ACCESS
    EXCLUSIVE on the table for that instant, taken under the deploy's lock timeout and retried like
    every step. A constraint already gone (a step run again) is skipped. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{{ m.step('transaction', 'drop the CHECK constraints',
          'the table, ACCESS EXCLUSIVE for a catalog update (no rewrite, no scan)') }}
ALTER TABLE {{ t }}
DROP CONSTRAINT IF EXISTS {{ names.index('ck', 'payload_json') }},
DROP CONSTRAINT IF EXISTS {{ names.index('ck', 'dedupe_key') }},
DROP CONSTRAINT IF EXISTS {{ names.index('ck', 'group_key') }};
