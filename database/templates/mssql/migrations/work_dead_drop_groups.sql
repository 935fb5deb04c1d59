{#- work: option groups turned off, once the code units no longer name the column. -#}
{% set role = 'dead' %}
{% include 'migrations/_drop_group_key_column.sql' %}
