{#- Shared PL/pgSQL fragments. Imported "with context" so they see names, errors and the queue. -#}
{#- A storage unit records the queue's kind, so a new kind for an existing queue is a changed
    storage unit, which the deploy tool refuses even when the tables would happen to look alike. -#}
{% macro unit(name, type) %}
-- tablequeue:unit {{ name }} {{ type }}
{% if type == 'storage' and queue is defined %}
-- queue {{ names.plain() }}: kind {{ queue.kind }}, created once and never rebuilt by the deploy tool
{% endif %}
{%- endmacro %}

{#- Functions are granted by name only: the deploy tool drops stale overloads, so the name is unique. -#}
{% macro grant(verb, routine='FUNCTION') %}
REVOKE ALL ON {{ routine }} {{ names.verb(verb) }} FROM public;
GRANT EXECUTE ON {{ routine }} {{ names.verb(verb) }} TO {{ names.role(verb) }};
{%- endmacro %}

{#- Every function runs as its owner with a pinned search_path (DESIGN.md §5). -#}
{% macro definer() %}
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
{%- endmacro %}

{% macro throw(error, message_sql) %}
        RAISE EXCEPTION USING ERRCODE = '{{ errors[error] }}', MESSAGE = {{ message_sql }};
{%- endmacro %}

{% macro check_batch_size(verb) %}
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
{{ throw('invalid_argument', "format('" ~ names.plain('_' ~ verb) ~ ": batch_size must be between 1 and 1000, got %s.', coalesce(batch_size::text, 'NULL'))") }}
    END IF;
{%- endmacro %}

{% macro check_payload(verb) %}
    IF payload IS NULL THEN
{{ throw('invalid_payload', "'" ~ names.plain('_' ~ verb) ~ ": payload must not be NULL.'") }}
    END IF;
{%- endmacro %}

{% macro check_dedupe_key(verb) %}
    IF length(dedupe_key) > 200 THEN
{{ throw('invalid_argument', "'" ~ names.plain('_' ~ verb) ~ ": dedupe_key is longer than 200 characters.'") }}
    END IF;
{%- endmacro %}
