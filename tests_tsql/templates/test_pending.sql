{#- tSQLt test class for a pending queue: see _test_destructive.sql. -#}
{% set claim_order = 'due' %}
{% set strict = false %}
{% include '_test_destructive.sql' %}
