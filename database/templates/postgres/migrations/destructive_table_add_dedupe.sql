{#- heap, fifo, lifo, pending: option dedupe turned on for a deployed queue. -#}
{% include 'migrations/_add_dedupe_key.sql' %}
