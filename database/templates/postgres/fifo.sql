{% set claim_order = 'oldest' %}
{% set strict = opt.strict %}
{% include '_destructive.sql' %}
