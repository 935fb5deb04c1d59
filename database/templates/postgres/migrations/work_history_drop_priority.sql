{#- work: option priority turned off; the history rows stay. -#}
{% set role = 'history' %}
{% include 'migrations/_drop_priority_column.sql' %}
