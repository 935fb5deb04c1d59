{% set claim_order = 'due' %}
{% set strict = false %}
{% include '_destructive.sql' %}
