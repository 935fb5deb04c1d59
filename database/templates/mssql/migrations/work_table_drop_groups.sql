{#- work: option groups turned off: the claim index of every message nobody leases (ix_<q>_ready) built before the
    code units; after them the group indexes, then the columns; every message waiting becomes a
    message without a group, in its claim order. The groups table stays (a storage unit of its own,
    left as tablequeue leaves every table it no longer renders), emptied: its rows meant nothing
    without the columns, and a later groups: true starts from none. -#}
{% import '_macros.sql' as m with context %}
{% import '_pinned_indexes.sql' as pins with context %}
{% set t = names.obj() %}
{% set groups_t = names.obj('_groups') %}
{% set claim_name = pins.claim_name(false, quoted=false) %}
{{ m.step('transaction', 'build ' ~ claim_name,
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start and at the end); Standard, Express: S on the table for the build (writes wait)') }}
IF
    INDEXPROPERTY(
        OBJECT_ID(N'{{ t }}'), N'{{ claim_name }}', 'IndexID'
    ) IS NULL
    BEGIN
{{ m.create_index_online(pins.create_index(('NONCLUSTERED', pins.claim_name(false), pins.claim_key(false), pins.ready_filter), t)) | indent(8, first=true) }}
    END;
GO

{% include 'migrations/_drop_group_storage.sql' %}
