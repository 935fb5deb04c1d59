{#- work: option groups turned on for a deployed queue (docs/queue-kinds.md, Message groups): the
    columns, the indexes a fresh install has (declared in _pinned_indexes.sql: ix_<q>_ready_ungrouped,
    the claim key filtered WHERE group_key IS NULL AND leased_by IS NULL, the head and group indexes)
    built before the code units, and the old claim index ix_<q>_ready dropped after them, so that the old code and the new
    code each find the index they pin for the whole deploy. The messages already waiting have no
    group and keep their order; the groups table is a storage unit of its own, created by the deploy.
    (priority is refused with groups: the old claim index is the one without priority.) -#}
{% import '_macros.sql' as m with context %}
{% import '_pinned_indexes.sql' as pins with context %}
{% set t = names.obj() %}
{% include 'migrations/_add_group_columns.sql' %}
{% for index in [pins.pinned[0]] + pins.group_pinned %}
{% set name = index[1] | replace('[', '') | replace(']', '') %}

{{ m.step('transaction', 'build the filtered index ' ~ name,
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start and at the end); Standard, Express: S on the table for the build (writes wait)') }}
IF
    INDEXPROPERTY(
        OBJECT_ID(N'{{ t }}'), N'{{ name }}', 'IndexID'
    ) IS NULL
    BEGIN
{{ m.create_index_online(pins.create_index(index, t)) | indent(8, first=true) }}
    END;
GO
{% endfor %}

{{ m.step('transaction', 'drop ' ~ pins.claim_name(false, quoted=false), 'the table, Sch-M briefly, every edition', after_code=true) }}
DROP INDEX IF EXISTS {{ pins.claim_name(false) }} ON {{ t }};
GO
