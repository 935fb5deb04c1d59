{#- work: the queue table's storage v2 to v3 (docs/queue-kinds.md, What a lease writes): the claim
    index of the messages nobody leases, filtered WHERE leased_by IS NULL (ix_<q>_ready, with priority
    ix_<q>_ready_priority, with groups ix_<q>_ready_ungrouped), takes the place of storage v2's
    unfiltered one (ix_<q>_claim, ix_<q>_claim_priority, ix_<q>_ungrouped): a lease then deletes one
    entry there and inserts one in ix_<q>_lease, where v2 moved its key within the claim index and
    inserted into ix_<q>_lease; a complete deletes from ix_<q>_lease only. Built under its own name
    before the code units, which pin it; the v2 index dropped after them, as the old code pins it until
    then. Messages, leases and attempts stay as they are: a message leased before the upgrade is in
    ix_<q>_lease already, where the look for expired leases finds it. -#}
{% import '_macros.sql' as m with context %}
{% import '_pinned_indexes.sql' as pins with context %}
{% import 'migrations/_claim_index.sql' as ci with context %}
{% set t = names.obj() %}
{% set claim = pins.pinned[0] %}
{% set claim_name = claim[1] | replace('[', '') | replace(']', '') %}
{% set v2_index = names.index('ix', 'ungrouped') if pins.has_groups else pins.claim_name_v2(pins.has_priority) %}
{{ m.step('transaction', 'build the filtered index ' ~ claim_name,
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start and at the end); Standard, Express: S on the table for the build (writes wait, reads go on); a name holding another key or filter: the same build under a temporary name, then Sch-M briefly to drop the old index and rename the new one') }}
{{ ci.build_claim_index(t, claim, names.index('ix', 'ready_new')) }}
GO

{{ m.step('transaction', 'drop ' ~ (v2_index | replace('[', '') | replace(']', '')), 'the table, Sch-M briefly, every edition', after_code=true) }}
DROP INDEX IF EXISTS {{ v2_index }} ON {{ t }};
GO
