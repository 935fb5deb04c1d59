{#- A table whose id type changes (option client_ids) keeps no data: it is created again, and only
    while it is empty. The deploy planner counted no row; this step checks again under the lock. The
    table's own indexes go with it (index units of their own are created again after it). -#}
{% import '_macros.sql' as m with context %}
{% set table = names.qualified(unit.name.split('.', 1)[1]) %}
{{ m.step('transaction', 'drop the empty table and create it with the other id type',
          'the table, ACCESS EXCLUSIVE while it is dropped and created (it is empty: milliseconds)') }}
LOCK TABLE {{ table }} IN ACCESS EXCLUSIVE MODE;

DO $empty$
BEGIN
    IF EXISTS (SELECT FROM {{ table }}) THEN
        RAISE EXCEPTION USING ERRCODE = '{{ errors.deploy_refused }}',
            MESSAGE = '{{ unit.name }} is not empty any more: it is not created again '
            'with the other id type (client_ids). Nothing of this step was applied.';
    END IF;
END
$empty$;

DROP TABLE {{ table }};

{{ create_sql }}
