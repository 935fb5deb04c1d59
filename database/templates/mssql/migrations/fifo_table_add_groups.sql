{#- fifo: option groups turned on for a deployed queue (docs/queue-kinds.md, Message groups): the
    columns, then the indexes a fresh install has (declared in _pinned_indexes.sql). The messages
    already waiting have no group and keep their order; the groups table is a storage unit of its
    own, created by the deploy. -#}
{% import '_macros.sql' as m with context %}
{% import '_pinned_indexes.sql' as pins with context %}
{% set t = names.obj() %}
{% include 'migrations/_add_group_columns.sql' %}
{% for index in pins.group_pinned %}
{% set name = index[1] | replace('[', '') | replace(']', '') %}

{{ m.step('transaction', 'build the filtered index ' ~ name,
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start and at the end: a new nonclustered index); Standard, Express: S on the table for the build (writes wait, reads go on)') }}
IF INDEXPROPERTY(OBJECT_ID(N'{{ t }}'), N'{{ name }}', 'IndexID') IS NULL
    BEGIN
{{ m.create_index_online(pins.create_index(index, t)) | indent(8, first=true) }}
    END;
GO
{% endfor %}
