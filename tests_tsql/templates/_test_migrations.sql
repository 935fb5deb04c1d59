{#-
  tSQLt tests of the storage migrations this queue's tables can take, appended to the queue's test
  class by render.render_tsqlt (docs/upgrades.md). Each puts two rows in the deployed table as the
  storage is before the migration, runs the migration's steps batch by batch as `tablequeue deploy`
  runs them, and checks that both rows are still there and that the column came or went. Unlike the
  verb tests these use the real tables (a migration is about their columns and indexes), inside the
  transaction tSQLt rolls back after each test, so nothing survives it.
  migration_cases: dicts with name, role, table, key (the option), adds, before (the shape's values
  before the migration) and batches (the migration's SQL, one batch each, GO removed).
-#}
{#- A payload literal of the queue's type; n tells rows apart. -#}
{% macro sample(n) -%}
{% if queue.payload == 'json' %}N'{"n": {{ n }}}'{% elif queue.payload == 'text' %}N'message {{ n }}'{% else %}0x{{ '%02X' % n }}{% endif %}
{%- endmacro %}
{% macro new_id(n, client_ids) -%}
{% if client_ids %}NEWID(){% else %}{{ n }}{% endif %}
{%- endmacro %}
{% for case in migration_cases %}
{% set row_id = 'history_id' if case.role == 'history' else 'id' %}

CREATE PROCEDURE {{ test_class }}.[test {{ case.name }} keeps the rows of {{ case.role }}]
AS
BEGIN
    SET NOCOUNT ON;

    -- Assemble: two rows, as the table is before the migration.
{% if case.role == 'table' and kind == 'work' %}
    INSERT INTO {{ case.table }} ({% if case.before.client_ids == 'on' %}id, {% endif %}due_at, visible_at, payload)
    VALUES
    ({% if case.before.client_ids == 'on' %}NEWID(), {% endif %}SYSUTCDATETIME(), SYSUTCDATETIME(), {{ sample(1) }}),
    ({% if case.before.client_ids == 'on' %}NEWID(), {% endif %}SYSUTCDATETIME(), SYSUTCDATETIME(), {{ sample(2) }});
{% elif case.role == 'table' %}
    INSERT INTO {{ case.table }} ({% if kind == 'pending' %}due_at, {% endif %}payload)
    VALUES
    ({% if kind == 'pending' %}SYSUTCDATETIME(), {% endif %}{{ sample(1) }}),
    ({% if kind == 'pending' %}SYSUTCDATETIME(), {% endif %}{{ sample(2) }});
{% elif case.role == 'dead' %}
    INSERT INTO {{ case.table }} (
        id, enqueued_at, due_at, {% if case.before.priority == 'on' %}priority, {% endif %}attempts, dead_at, payload
    )
    VALUES
    ({{ new_id(-1, case.before.client_ids == 'on') }}, SYSUTCDATETIME(), SYSUTCDATETIME(), {% if case.before.priority == 'on' %}0, {% endif %}1, SYSUTCDATETIME(), {{ sample(1) }}),
    ({{ new_id(-2, case.before.client_ids == 'on') }}, SYSUTCDATETIME(), SYSUTCDATETIME(), {% if case.before.priority == 'on' %}0, {% endif %}1, SYSUTCDATETIME(), {{ sample(2) }});
{% else %}
    INSERT INTO {{ case.table }} (
        id, enqueued_at, due_at, {% if case.before.priority == 'on' %}priority, {% endif %}started_at, finished_at, worker, attempts, payload
    )
    VALUES
    ({{ new_id(-1, case.before.client_ids == 'on') }}, SYSUTCDATETIME(), SYSUTCDATETIME(), {% if case.before.priority == 'on' %}0, {% endif %}SYSUTCDATETIME(), SYSUTCDATETIME(), N'w', 1, {{ sample(1) }}),
    ({{ new_id(-2, case.before.client_ids == 'on') }}, SYSUTCDATETIME(), SYSUTCDATETIME(), {% if case.before.priority == 'on' %}0, {% endif %}SYSUTCDATETIME(), SYSUTCDATETIME(), N'w', 1, {{ sample(2) }});
{% endif %}

    SELECT
        r.{{ row_id }},
        r.payload
    INTO #Expected
    FROM {{ case.table }} AS r;

    -- Act: the migration's steps, as the deploy runs them.
{% for batch in case.batches %}
{{ batch | indent(4, first=true) }}

{% endfor %}
    -- Assert
    SELECT
        r.{{ row_id }},
        r.payload
    INTO #Actual
    FROM {{ case.table }} AS r;

    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF COL_LENGTH(N'{{ case.table }}', N'{{ case.column }}') IS {{ 'NULL' if case.adds else 'NOT NULL' }}
        BEGIN
            EXEC tSQLt.Fail N'{{ case.name }}: column {{ case.column }} {{ 'was not added' if case.adds else 'is still there' }}';
        END;
END;
GO
{% endfor %}
