{#- Shared T-SQL fragments. Imported "with context" so they see names, errors and the queue. -#}
{#- A storage unit records the queue's kind, so a new kind for an existing queue is a changed
    storage unit, which the deploy tool refuses even when the tables would happen to look alike. -#}
{% macro unit(name, type) %}
-- tablequeue:unit {{ name }} {{ type }}
{% if type == 'storage' and queue is defined %}
-- queue {{ names.plain() }}: kind {{ queue.kind }}, created once and never rebuilt by the deploy tool
{% endif %}
{%- endmacro %}

{% macro grant(verb) %}
GRANT EXECUTE ON OBJECT::{{ names.verb(verb) }} TO {{ names.role(verb) }};
{%- endmacro %}

{#- message: an nvarchar literal (thrown as it is), or a list of expressions to CONCAT (two or
    more), which needs @error_message: use that form at most once per procedure. -#}
{% macro throw(error, message) %}
{% if message is string %}
            THROW {{ errors[error] }}, {{ message }}, 1;
{% else %}
            DECLARE @error_message nvarchar(2048) = CONCAT(
                {{ message | join(',\n                ') }}
            );
            THROW {{ errors[error] }}, @error_message, 1;
{% endif %}
{%- endmacro %}

{% macro check_batch_size(verb) %}
    IF @batch_size IS NULL OR @batch_size NOT BETWEEN 1 AND 1000
        BEGIN
{{ throw('invalid_argument', ["N'" ~ names.plain('_' ~ verb) ~ ": batch_size must be between 1 and 1000, got '",
                              "COALESCE(CONVERT(nvarchar(12), @batch_size), N'NULL')", "N'.'"]) }}
        END;
{%- endmacro %}

{#- Batches of every verb are capped at 1,000 items: past ~5,000 row locks on one table SQL Server
    escalates to a table lock, which READPAST cannot skip, and every consumer would wait. -#}
{% macro check_batch_items(verb, tvp='@items') %}
    IF (SELECT COUNT_BIG(*) FROM {{ tvp }}) > 1000
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain('_' ~ verb) }}: at most 1000 items per call.', 1;
        END;
{%- endmacro %}

{#- max_rows bounds one purge call (NULL: everything matching, in chunks); a caller that wants short
    transactions loops until a call purges fewer than max_rows. -#}
{% macro check_max_rows(verb) %}
    IF @max_rows < 1
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain('_' ~ verb) }}: max_rows must be at least 1.', 1;
        END;
{%- endmacro %}

{#- One chunk of a purge: at most 1,000 rows (under the lock-escalation threshold however wide the
    rows), never more than max_rows in all. -#}
{% macro purge_chunk_size() -%}
IIF(@max_rows IS NULL OR @max_rows - @purged > 1000, 1000, @max_rows - @purged)
{%- endmacro %}

{#- Payload validation shared by enqueue: NULL never, and JSON queues only take valid JSON. -#}
{% macro check_payload(verb) %}
    IF @payload IS NULL{% if is_json %} OR ISJSON(@payload) = 0{% endif %}

        BEGIN
{{ throw('invalid_payload', "N'" ~ names.plain('_' ~ verb) ~ ": payload must not be NULL" ~ (" and must be valid JSON" if is_json else "") ~ ".'") }}
        END;
{%- endmacro %}

{% macro check_dedupe_key(verb) %}
    IF LEN(@dedupe_key) > 200
        BEGIN
{{ throw('invalid_argument', "N'" ~ names.plain('_' ~ verb) ~ ": dedupe_key is longer than 200 characters.'") }}
        END;
{%- endmacro %}
