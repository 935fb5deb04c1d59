{#- work: option dedupe turned off for a deployed queue (the dead-letter table: work_dead_drop_dedupe). -#}
{% include 'migrations/_drop_dedupe_key.sql' %}
