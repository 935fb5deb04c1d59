{#- work: option dedupe turned on for a deployed queue (the dead-letter table: work_dead_add_dedupe). -#}
{% include 'migrations/_add_dedupe_key.sql' %}
