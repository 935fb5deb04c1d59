{#- work table, storage version 2 to 3 (docs/queue-kinds.md, What a lease writes): ix_Q_ready, the claim
    index of the messages nobody leases, replaces ix_Q_claim (every message) and ix_Q_lease (the leased
    ones by worker), so that a lease writes two index entries instead of four. Built before the code
    units, which claim from it; the old indexes dropped after them, since the old claims read them until
    the new code is in. Messages, leases and attempts stay as they are: a message leased before the
    upgrade is found through ix_Q_lease_start as every lease is now. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set tie = 'seq' if opt.client_ids else 'id' %}
{% set build_locks = 'nothing that blocks reads or writes (SHARE UPDATE EXCLUSIVE); two scans of the table, after waiting for older transactions' %}
{% set drop_locks = 'nothing that blocks reads or writes (SHARE UPDATE EXCLUSIVE), after waiting for transactions that use the index' %}
{{ m.step('concurrent', 'build ' ~ names.index_name('ix', 'ready') ~ ' CONCURRENTLY', build_locks) }}
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{ names.index('ix', 'ready') }}
ON {{ t }} ({% if opt.priority %}priority DESC, {% endif %}visible_at, {{ tie }})
WHERE {{ m.ready_predicate(opt.get('groups', false)) }};

{{ m.step('concurrent', 'drop ' ~ names.index_name('ix', 'claim') ~ ' CONCURRENTLY', drop_locks, after_code=true) }}
DROP INDEX CONCURRENTLY IF EXISTS {{ names.qualified(names.index_name('ix', 'claim')) }};

{{ m.step('concurrent', 'drop ' ~ names.index_name('ix', 'lease') ~ ' CONCURRENTLY', drop_locks, after_code=true) }}
DROP INDEX CONCURRENTLY IF EXISTS {{ names.qualified(names.index_name('ix', 'lease')) }};
