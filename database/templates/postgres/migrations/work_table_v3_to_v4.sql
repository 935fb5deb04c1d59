{#- work table, storage version 3 to 4: the table's CHECK constraints go (work.sql says why: PostgreSQL
    evaluates them on every UPDATE, a lease's included). enqueue and enqueue_batch check the same
    before they insert. Dropping a CHECK is a catalog change: no scan, no rewrite, but ACCESS
    EXCLUSIVE on the table for that instant, taken under the deploy's lock timeout and retried like
    every step; while it waits, every call on the queue waits behind it (reads too: stats, a metrics
    scrape). So a shape that had no CHECK (a text or binary payload without dedupe or groups) takes
    no lock: its migration only records v4. A constraint already gone (a step run again) is skipped. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set checks = (['payload_json'] if queue.payload == 'json' else []) + (['dedupe_key'] if opt.dedupe else [])
    + (['group_key'] if opt.get('groups', false) else []) %}
{% if checks %}
{{ m.step('transaction', 'drop the CHECK constraints',
          'the table, ACCESS EXCLUSIVE for a catalog update (no rewrite, no scan); every call on the queue waits behind it, reads too') }}
ALTER TABLE {{ t }}
{% for check in checks %}
DROP CONSTRAINT IF EXISTS {{ names.index('ck', check) }}{{ ',' if not loop.last else ';' }}
{% endfor %}
{% else %}
{{ m.step('transaction', 'record v4: nothing to change (this shape has no CHECK)',
          'the deploy history table only (one row inserted); nothing on the queue tables') }}
-- Nothing to run: this shape's table has no CHECK constraint.
{% endif %}
