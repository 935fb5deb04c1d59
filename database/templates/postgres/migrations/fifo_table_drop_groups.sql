{#- fifo: option groups turned off: the messages waiting lose their groups, not their order. -#}
{% set tie = 'id' %}
{% include 'migrations/_drop_groups.sql' %}
