{#- work: option groups turned off: the messages waiting lose their groups, not their order. -#}
{% set tie = 'seq' if opt.client_ids else 'id' %}
{% include 'migrations/_drop_groups.sql' %}
