{#- fifo: option groups turned off, once the code units no longer use them: the group indexes, then
    the columns; every message waiting becomes a message without a group, in its enqueue order. The
    groups table stays (a storage unit of its own, left as tablequeue leaves every table it no longer
    renders), emptied: its rows meant nothing without the columns, and a later groups: true starts
    from none. -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{% set groups_t = names.obj('_groups') %}
{% include 'migrations/_drop_group_storage.sql' %}
