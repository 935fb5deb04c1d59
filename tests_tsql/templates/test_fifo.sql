{#- tSQLt test class for a fifo queue (lax or strict): see _test_destructive.sql. -#}
{% set claim_order = 'oldest' %}
{% set strict = opt.strict %}
{% include '_test_destructive.sql' %}
