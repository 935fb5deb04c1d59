{% set claim_order = 'newest' %}
{% set strict = false %}
{% include '_destructive.sql' %}
