{#- fifo: option groups turned on for a deployed queue (docs/queue-kinds.md, Message groups). -#}
{% set tie = 'id' %}
{% include 'migrations/_add_groups.sql' %}
