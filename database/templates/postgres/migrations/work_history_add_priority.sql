{#- work: option priority turned on; the history rows stay. -#}
{% set role = 'history' %}
{% include 'migrations/_add_priority_column.sql' %}
