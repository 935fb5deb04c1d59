{#- PostgreSQL: S.Q_dead_delete of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_dead_delete'), 'code') }}
CREATE OR REPLACE FUNCTION {{ names.verb('dead_delete') }}(id {{ id_type }})
RETURNS TABLE (deleted boolean)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    removed bigint;
BEGIN
    IF {{ fn }}_dead_delete.id IS NULL THEN
{{ m.throw('invalid_argument', "'" ~ names.plain('_dead_delete') ~ ": id must not be NULL.'") }}
    END IF;
    DELETE FROM {{ dead_t }} AS d WHERE d.id = {{ fn }}_dead_delete.id;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed = 0 THEN
{{ m.throw('not_found', "format('" ~ names.plain('_dead_delete') ~ ": no dead-letter message with id %s.', " ~ fn ~ "_dead_delete.id)") }}
    END IF;
    RETURN QUERY SELECT true;
END;
$function$;

{{ m.grant('dead_delete') }}
