{#- tSQLt test class for a heap queue: see _test_destructive.sql. -#}
{% set claim_order = 'none' %}
{% set strict = false %}
{% include '_test_destructive.sql' %}
