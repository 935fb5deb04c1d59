{#- work: option priority turned off; the dead letters stay. -#}
{% set role = 'dead' %}
{% include 'migrations/_drop_priority_column.sql' %}
