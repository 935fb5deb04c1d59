{% set claim_order = 'none' %}
{% set strict = false %}
{% include '_destructive.sql' %}
