{#- work: option groups turned on; the dead rows already there have no group. -#}
{% set role = 'dead' %}
{% include 'migrations/_add_group_key_column.sql' %}
