{#- tSQLt test class for a lifo queue: see _test_destructive.sql. -#}
{% set claim_order = 'newest' %}
{% set strict = false %}
{% include '_test_destructive.sql' %}
