{#-
  Tests of the deployed objects themselves, included at the end of every kind's class (test_work.sql,
  _test_destructive.sql), which set cls, t, pins (_pinned_indexes.sql), dedupe and sample().
  tSQLt.FakeTable replaces a table with a heap without indexes, constraints or defaults, so no verb
  test can see them: these read the real table's catalog views (sys.indexes, sys.index_columns,
  sys.columns, sys.default_constraints) inside the transaction tSQLt rolls back, and fake nothing.
  The role tests run the verbs as a user in one role (a user WITHOUT LOGIN, and a procedure WITH
  EXECUTE AS that user, both created in the test and dropped by tSQLt's rollback); verb_roles (render.py, from the contract's VERB_ROLES) says which
  role each of the queue's procedures belongs to.
  timed_tables: the queue's tables (time defaults checked, no role may touch them); hidden_tables:
  its other tables (no role may touch them); internal_procedures: procedures granted to no role;
  granted_types: (table type, the role of the verb that takes it).
-#}
{#- One pinned key column as sys.index_columns shows it: (name, is_descending_key). -#}
{% macro key_column(part) -%}
{{ part.split(' ')[0] }}{{ '|1' if part.endswith(' DESC') else '|0' }}
{%- endmacro %}
{#- A filter of one-column conditions joined by AND ('col IS NOT NULL', 'col = 1', 'a IS NULL AND b IS
    NULL') compared without spaces and parentheses: sys.indexes.filter_definition keeps SQL Server's own
    form of it ('([col]=(1))', '([a] IS NULL AND [b] IS NULL)'), which the test does not restate. -#}
{% macro compared_filter(filter) -%}
{% for condition in filter.split(' AND ') %}{% set column, rest = condition.split(' ', 1) %}{{ 'AND' if not loop.first }}[{{ column }}]{{ rest | replace(' ', '') }}{% endfor %}
{%- endmacro %}
{#- The same for the filter the catalog stores. -#}
{% macro compared_filter_sql(column_sql) -%}
REPLACE(REPLACE(REPLACE({{ column_sql }}, N' ', N''), N'(', N''), N')', N'')
{%- endmacro %}

{#- The FROM and WHERE of a query over the index key columns of `tables` (a list; aliases i, o, ic,
    c); the caller adds its own AND conditions. -#}
{% macro index_columns_of(tables) %}
    FROM sys.indexes AS i
    INNER JOIN sys.objects AS o
        ON i.object_id = o.object_id
    INNER JOIN sys.index_columns AS ic
        ON i.object_id = ic.object_id AND i.index_id = ic.index_id
    INNER JOIN sys.columns AS c
        ON ic.object_id = c.object_id AND ic.column_id = c.column_id
    WHERE
{% if tables | length == 1 %}
        i.object_id = OBJECT_ID(N'{{ tables[0] }}')
{%- else %}
        i.object_id IN (
{% for table in tables %}
            OBJECT_ID(N'{{ table }}'){{ ',' if not loop.last }}
{% endfor %}
        )
{%- endif %}
{%- endmacro %}

-- the deployed objects ----------------------------------------------------------------------------

{# Every table whose indexes a hint names (its suffix: names.obj), with those indexes
   (_pinned_indexes.sql). #}
{% set pinned_tables = [('', pins.pinned)] + ([('_dead', pins.dead_pinned)] if kind == 'work' else [])
    + ([('_groups', pins.groups_pinned)] if pins.has_groups else []) %}
{# A pinned primary key's fake is a plain index under the key's name (fake_helper); the real one is
   the constraint, unique. #}
{% set primary_keys = [names.index('pk'), names.index('pk', 'dead'), names.index('pk', 'groups')] %}
{% set pinned = namespace(tables=[], indexes=[]) %}
{% for suffix, indexes in pinned_tables %}
{% set pinned.tables = pinned.tables + [names.obj(suffix)] %}
{% set pinned.indexes = pinned.indexes + indexes %}
{% endfor %}
CREATE PROCEDURE {{ cls }}.[test the pinned indexes have the key and filter the claims seek on]
AS
BEGIN
    -- Act: every index a claim, probe, count or key seek names in an INDEX hint, on any of the
    -- queue's tables, as the catalog shows it (an index on another of them than the one its hint
    -- names is a row of that table). The index type is its number (1 clustered, 2 nonclustered),
    -- not type_desc, whose collation is the catalog's (Latin1_General_CI_AS_KS_WS); names have the
    -- database's catalog collation (CATALOG_COLLATION on Azure SQL, fixed on a contained database):
    -- #Expected takes #Actual's columns, so AssertEqualsTable meets no Msg 451 / 468 either way.
    SELECT
        o.name AS table_name,
        i.name AS index_name,
        i.is_unique,
        i.is_primary_key,
        i.is_disabled,
        c.name AS column_name,
        ic.is_descending_key,
        {{ compared_filter_sql('i.filter_definition') }} AS filter_definition,
        CONVERT(tinyint, i.type) AS index_type,
        CONVERT(int, ic.key_ordinal) AS key_ordinal
    INTO #Actual
{{ index_columns_of(pinned.tables) }}
        AND i.name IN (
{% for index in pinned.indexes %}
            N'{{ index[1][1:-1] }}'{{ ',' if not loop.last }}
{% endfor %}
        )
        AND ic.key_ordinal > 0;

    -- Assert: the table, key, filter and uniqueness that _pinned_indexes.sql declares once for the
    -- tables' DDL, the hints and this test, each index enabled (a claim's WHERE and ORDER BY are
    -- that key: a deep queue otherwise sorts, or Msg 308 / 8622 / 315; a seek under HOLDLOCK on a
    -- key that is not unique locks a range, and a seek by id may find two rows).
    SELECT TOP (0)
        a.table_name,
        a.index_name,
        a.is_unique,
        a.is_primary_key,
        a.is_disabled,
        a.filter_definition,
        a.column_name,
        a.is_descending_key,
        a.index_type,
        a.key_ordinal
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (
        table_name, index_name, index_type, is_unique, is_primary_key, is_disabled, filter_definition,
        column_name, is_descending_key, key_ordinal
    )
    VALUES
{% set found = namespace(rows=[]) %}
{% for suffix, indexes in pinned_tables %}
{% for words, name, key, filter in indexes %}
{% set primary = name in primary_keys %}
{% for part in key.split(', ') %}
{% set column, descending = key_column(part).split('|') %}
{% set found.rows = found.rows + ["(N'" ~ names.queue ~ suffix ~ "', N'" ~ name[1:-1] ~ "', " ~ (1 if 'CLUSTERED' in words.split() else 2) ~ ", " ~ (1 if primary or 'UNIQUE' in words.split() else 0) ~ ", " ~ (1 if primary else 0) ~ ", 0, " ~ (("N'" ~ compared_filter(filter) ~ "'") if filter else 'NULL') ~ ", N'" ~ column ~ "', " ~ descending ~ ", " ~ loop.index ~ ")"] %}
{% endfor %}
{% endfor %}
{% endfor %}
{% for row in found.rows %}
    {{ row }}{{ ';' if loop.last else ',' }}{{ ' -- noqa: LT05' if row | length > 115 }}
{% endfor %}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% if dedupe %}

CREATE PROCEDURE {{ cls }}.[test the dedupe index is unique on BIN2 keys, keyless rows left out]
AS
BEGIN
    -- Act: the dedupe index as the catalog shows it. Its strings have the catalog's collation
    -- (Latin1_General_CI_AS_KS_WS): #Expected takes #Actual's columns (a CREATE TABLE #Expected has
    -- tempdb's, and AssertEqualsTable fails on the mix with Msg 451 / 468).
    SELECT
        i.is_unique,
        i.has_filter,
        c.name AS column_name,
        c.collation_name,
        {{ compared_filter_sql('i.filter_definition') }} AS filter_definition,
        CONVERT(int, ic.key_ordinal) AS key_ordinal
    INTO #Actual
{{ index_columns_of([t]) }}
        AND i.name = N'{{ names.index_name('ux', 'dedupe') }}'
        AND ic.key_ordinal > 0;

    -- Assert: a unique index filtered on dedupe_key IS NOT NULL, over a column that compares byte
    -- for byte (Latin1_General_100_BIN2, as text compares on PostgreSQL), whatever the database's
    -- collation: 'K' and 'k', or 'k' and 'k ', are different keys.
    SELECT TOP (0)
        a.is_unique,
        a.has_filter,
        a.filter_definition,
        a.column_name,
        a.collation_name,
        a.key_ordinal
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (is_unique, has_filter, filter_definition, column_name, collation_name, key_ordinal)
    VALUES (1, 1, N'{{ compared_filter('dedupe_key IS NOT NULL') }}', N'dedupe_key', N'Latin1_General_100_BIN2', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% endif %}
{% if kind == 'work' and opt.get('client_ids') %}

CREATE PROCEDURE {{ cls }}.[test the dead letters are clustered on dead_seq, not on the random id]
AS
BEGIN
    -- Act: the dead-letter table's indexes with their keys. Client ids are random GUIDs: clustered
    -- on them, every dead letter would land on a random page (storage v2, work_dead_v1_to_v2).
    SELECT
        i.name AS index_name,
        i.is_unique,
        i.is_primary_key,
        c.name AS column_name,
        CONVERT(tinyint, i.type) AS index_type,
        CONVERT(int, ic.key_ordinal) AS key_ordinal
    INTO #Actual
{{ index_columns_of([dead_t]) }}
        AND ic.key_ordinal > 0;

    -- Assert: clustered (type 1) on the IDENTITY dead_seq, unique; the primary key on id nonclustered
    -- (type 2), which dead_list, dead_requeue and dead_delete seek. #Expected takes #Actual's columns
    -- (the catalog views' collation, see the pinned index test).
    SELECT TOP (0)
        a.index_name,
        a.is_unique,
        a.is_primary_key,
        a.column_name,
        a.index_type,
        a.key_ordinal
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (index_name, index_type, is_unique, is_primary_key, column_name, key_ordinal)
    VALUES
    (N'{{ names.index_name('ux', 'dead_seq') }}', 1, 1, 0, N'dead_seq', 1),
    (N'{{ names.index_name('pk', 'dead') }}', 2, 1, 1, N'id', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    IF
        COALESCE(
            COLUMNPROPERTY(OBJECT_ID(N'{{ dead_t }}'), N'dead_seq', 'IsIdentity'), 0
        ) <> 1
        BEGIN
            EXEC tSQLt.Fail N'dead_seq is not an IDENTITY column: inserts would not append';
        END;
END;
GO
{% endif %}

CREATE PROCEDURE {{ cls }}.[test every time default of the queue's tables is SYSUTCDATETIME]
AS
BEGIN
    -- Act: every default on a date or time column of the queue's tables.
    SELECT
        c.name AS column_name,
        OBJECT_NAME(dc.parent_object_id) AS table_name,
        REPLACE(REPLACE(LOWER(OBJECT_DEFINITION(dc.object_id)), N'(', N''), N')', N'') AS default_function
    INTO #Actual
    FROM sys.default_constraints AS dc
    INNER JOIN sys.columns AS c
        ON dc.parent_object_id = c.object_id AND dc.parent_column_id = c.column_id
    INNER JOIN sys.types AS ty
        ON c.user_type_id = ty.user_type_id
    WHERE
        dc.parent_object_id IN (
{% for table in timed_tables %}
            OBJECT_ID(N'{{ table }}'){{ ',' if not loop.last }}
{% endfor %}
        )
        AND ty.name IN (N'date', N'time', N'datetime', N'datetime2', N'smalldatetime', N'datetimeoffset');

    -- Assert: times are UTC. A GETDATE() default passes every enqueue test on a server whose
    -- clock is UTC and is off by the offset elsewhere, so the definition itself is checked (as
    -- sys.default_constraints stores it, lower case in parentheses; the parentheses are dropped).
    -- #Expected takes #Actual's columns: the catalog's names have the catalog's collation.
    SELECT TOP (0)
        a.column_name,
        a.table_name,
        a.default_function
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (column_name, table_name, default_function)
    VALUES (N'enqueued_at', N'{{ queue.name }}', N'sysutcdatetime');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- roles -------------------------------------------------------------------------------------------
{# Per role: one of its own verbs to run (a call that succeeds on any queue and changes nothing
   that outlives tSQLt's rollback) and one verb of another role that must fail with 229. #}
{% set worker_argument = ", @worker = N'w'" if kind == 'work' else '' %}
{% set own_call = {
    'producer': ('enqueue', '(id ' ~ ('uniqueidentifier' if opt.get('client_ids') else 'bigint') ~ ' NOT NULL, duplicate bit NOT NULL)', '@payload = ' ~ sample(1)),
    'consumer': ('wait', '(ready bit NOT NULL)', '@wait_ms = 0'),
    'admin': ('purge', '(purged bigint NOT NULL)', "@older_than = '1900-01-01', @max_rows = 1")} %}
{% set foreign_call = {
    'producer': ('dequeue', '@batch_size = 1' ~ worker_argument),
    'consumer': ('purge', "@older_than = '1900-01-01', @max_rows = 1"),
    'admin': ('enqueue', '@payload = ' ~ sample(1))} %}
{#- Creates {{ cls }}.[<prefix><user>], a procedure WITH EXECUTE AS the user whose body runs `body`
    (plain T-SQL; a procedure of its own per result: INSERT ... EXEC does not nest). sqlfluff cannot parse a statement EXECUTE AS / REVERT, a procedure's EXECUTE AS clause it
    can; the procedure is created in the test (the user exists only there), by EXEC of a literal,
    and goes with tSQLt's rollback. -#}
{% macro as_user(user, body, prefix='as ') %}
    EXEC (N'CREATE PROCEDURE {{ cls }}.[{{ prefix }}{{ user }}]
WITH EXECUTE AS ''{{ user }}''
AS
BEGIN
    SET NOCOUNT ON;
{{ body | replace("'", "''") }}
END;');
{%- endmacro %}
{#- EXEC of a verb inside as_user's body: as dynamic SQL, so that the user's own EXECUTE permission
    is checked (a direct call from a procedure of the same owner would pass on ownership chaining). -#}
{% macro dynamic_exec(verb, arguments) -%}
EXEC (N'EXEC {{ names.verb(verb) }} {{ arguments | replace("'", "''") }};');
{%- endmacro %}
{% for role in ('producer', 'consumer', 'admin') %}
{% set user = 'test_' ~ queue.name ~ '_' ~ role %}
{% set own_verb, own_columns, own_arguments = own_call[role] %}
{#- (securable, its class for HAS_PERMS_BY_NAME, permission, 1 when the role must have it): EXECUTE
    on each of the queue's verbs, on its table types for the role whose verb takes them, none on
    its internal procedures, and no right at all on its tables. -#}
{% set access = namespace(grid=[]) %}
{% for verb, verb_role in verb_roles.items() %}
{% set access.grid = access.grid + [(names.verb(verb), 'OBJECT', 'EXECUTE', 1 if verb_role == role else 0)] %}
{% endfor %}
{% for procedure in internal_procedures %}
{% set access.grid = access.grid + [(procedure, 'OBJECT', 'EXECUTE', 0)] %}
{% endfor %}
{% for type_name, type_role in granted_types %}
{% set access.grid = access.grid + [(type_name, 'TYPE', 'EXECUTE', 1 if type_role == role else 0)] %}
{% endfor %}
{% for table in timed_tables + hidden_tables %}
{% for permission in ('SELECT', 'INSERT', 'UPDATE', 'DELETE') %}
{% set access.grid = access.grid + [(table, 'OBJECT', permission, 0)] %}
{% endfor %}
{% endfor %}
{% set grid = access.grid %}
{% set own_body %}
    DECLARE @ran TABLE {{ own_columns }};
    INSERT INTO @ran
    {{ dynamic_exec(own_verb, own_arguments) }}
    IF NOT EXISTS (SELECT 1 FROM @ran) THROW 50000, N'{{ own_verb }} returned no row', 1;
{%- endset %}
{% set grid_body %}
    SELECT
        v.securable,
        v.securable_class,
        v.permission_name,
        COALESCE(HAS_PERMS_BY_NAME(v.securable, v.securable_class, v.permission_name), 0) AS has_right
    FROM (
        VALUES
{% for securable, securable_class, permission, _ in grid %}
        (N'{{ securable }}', N'{{ securable_class }}', N'{{ permission }}'){{ ',' if not loop.last }}
{% endfor %}
    ) AS v (securable, securable_class, permission_name);
{%- endset %}

CREATE PROCEDURE {{ cls }}.[test the {{ role }} role runs its verbs and may touch nothing else]
AS
BEGIN
    -- Assemble: a user in the {{ role }} role only, and a procedure that runs as that user. Nothing
    -- is faked: a fake carries none of the real tables' grants. {{ own_verb }} runs on the real table
    -- through the procedure (ownership chaining: the role has no right on any table), inside the
    -- transaction tSQLt rolls back{{ ': the message it adds goes with it' if own_verb == 'enqueue' else ', and changes nothing' }}.
    CREATE USER [{{ user }}] WITHOUT LOGIN;
    ALTER ROLE {{ roles[role] }} ADD MEMBER [{{ user }}];
    CREATE TABLE #Actual (
        securable nvarchar(300) NOT NULL,
        securable_class nvarchar(10) NOT NULL,
        permission_name sysname NOT NULL,
        has_right int NULL
    );
{{ as_user(user, own_body) }}
{{ as_user(user, grid_body, 'rights of ') }}

    -- Act: the verb (it raises unless it returned its row), then the user's rights.
    EXEC {{ cls }}.[as {{ user }}];
    INSERT INTO #Actual (securable, securable_class, permission_name, has_right)
    EXEC {{ cls }}.[rights of {{ user }}];

    -- Assert: every securable exists (HAS_PERMS_BY_NAME gives NULL for a misspelt name, which
    -- would pass as "no right"; checked here, as the test's owner: the user cannot see the tables).
    SELECT a.securable
    INTO #Missing
    FROM #Actual AS a
    WHERE IIF(a.securable_class = N'TYPE', TYPE_ID(a.securable), OBJECT_ID(a.securable)) IS NULL;
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Missing', @Message = N'securables that do not exist';
    SELECT TOP (0)
        a.securable,
        a.securable_class,
        a.permission_name,
        a.has_right
    INTO #Expected
    FROM #Actual AS a;
    INSERT INTO #Expected (securable, securable_class, permission_name, has_right)
    VALUES
{% for securable, securable_class, permission, has_right in grid %}
    (N'{{ securable }}', N'{{ securable_class }}', N'{{ permission }}', {{ has_right }}){{ ';' if loop.last else ',' }}
{% endfor %}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% set other_verb, other_arguments = foreign_call[role] %}

CREATE PROCEDURE {{ cls }}.[test the {{ role }} role may not run {{ other_verb }}: 229]
AS
BEGIN
    -- Assemble: a user in the {{ role }} role only; {{ other_verb }} belongs to the {{ verb_roles[other_verb] }} role, so the
    -- call is refused before it runs.
    CREATE USER [{{ user }}] WITHOUT LOGIN;
    ALTER ROLE {{ roles[role] }} ADD MEMBER [{{ user }}];
{{ as_user(user, '    ' ~ dynamic_exec(other_verb, other_arguments)) }}
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 229;

    -- Act
    EXEC {{ cls }}.[as {{ user }}];
END;
GO
{% endfor %}
