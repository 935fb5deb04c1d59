{#- work: option groups turned on for a deployed queue (docs/queue-kinds.md, Message groups). -#}
{% set tie = 'seq' if opt.client_ids else 'id' %}
{% include 'migrations/_add_groups.sql' %}
