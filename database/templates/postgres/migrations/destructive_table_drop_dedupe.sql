{#- heap, fifo, lifo, pending: option dedupe turned off for a deployed queue. -#}
{% include 'migrations/_drop_dedupe_key.sql' %}
