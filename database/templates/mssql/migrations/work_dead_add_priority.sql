{#- work: option priority turned on; the dead letters stay. -#}
{% set role = 'dead' %}
{% include 'migrations/_add_priority_column.sql' %}
