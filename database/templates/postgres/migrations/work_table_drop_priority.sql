{#- work: option priority turned off for a deployed queue: the claim index is built again without
    priority under a temporary name before the code units (the new claims walk it), and once they no
    longer use the old one it takes the name a fresh install gives it, and the column goes. The messages
    waiting keep their order by visible time. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set tie = 'seq' if opt.client_ids else 'id' %}
{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'ready_new') ~ ' (no priority) CONCURRENTLY',
          'nothing that blocks reads or writes (SHARE UPDATE EXCLUSIVE); two scans of the table, after waiting for older transactions') }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'ready_new') }}
ON {{ t }} (visible_at, {{ tie }})
WHERE {{ m.ready_predicate(false) }};

{{ m.step('transaction', 'replace ' ~ names.index_name('ix', 'ready') ~ ' with it, drop column priority',
          'the table, ACCESS EXCLUSIVE for catalog updates (no rewrite)', after_code=true) }}
{% include 'migrations/_replace_claim_index.sql' %}

ALTER TABLE {{ t }} DROP COLUMN IF EXISTS priority;
