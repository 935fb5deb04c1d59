{#- work: option groups turned on; the history rows already there have no group. -#}
{% set role = 'history' %}
{% include 'migrations/_add_group_key_column.sql' %}
