{#- A table whose id type changes (option client_ids) keeps no data: it is created again, and only
    while it is empty. The deploy planner counted no row; this step checks again under an exclusive
    table lock held to the end of the step's transaction. -#}
{% import '_macros.sql' as m with context %}
{% set table = names.qualified(unit.name.split('.', 1)[1]) %}
{{ m.step('transaction', 'drop the empty table and create it with the other id type',
          'the table, X then Sch-M while it is dropped and created (it is empty: milliseconds)') }}
IF EXISTS (SELECT 1 / 0 FROM {{ table }} WITH (TABLOCKX, HOLDLOCK))
    BEGIN
        THROW {{ errors.deploy_refused }}, N'{{ unit.name }} is not empty any more: it is not created again (client_ids changes the id type). Nothing of this step was applied.', 1; -- noqa: LT05
    END;
GO

DROP TABLE {{ table }};
GO

{{ create_sql }}
