{#- work: option priority turned on for a deployed queue. Every message waiting gets priority 0 (what
    enqueue gives a message without one); the claim index is built again with priority leading, under a
    temporary name, before the code units (the new claims walk it), and takes the name a fresh install
    gives it after them (the old claims walk the old one until then). -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set tie = 'seq' if opt.client_ids else 'id' %}
{{ m.step('transaction', 'add column priority (default 0)',
          'the table, ACCESS EXCLUSIVE for a catalog update (a constant default: no rewrite since PostgreSQL 11)') }}
ALTER TABLE {{ t }} ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0;

{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'ready_new') ~ ' (priority leading) CONCURRENTLY',
          'nothing that blocks reads or writes (SHARE UPDATE EXCLUSIVE); two scans of the table, after waiting for older transactions') }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'ready_new') }}
ON {{ t }} (priority DESC, visible_at, {{ tie }})
WHERE {{ m.ready_predicate(false) }};

{{ m.step('transaction', 'replace ' ~ names.index_name('ix', 'ready') ~ ' with it',
          'the table, ACCESS EXCLUSIVE to drop the old index and rename the new one (catalog updates)', after_code=true) }}
{% include 'migrations/_replace_claim_index.sql' %}
