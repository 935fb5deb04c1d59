{#-
  tSQLt test class for one queue of the work kind, rendered per queue by render.render_tsqlt (the
  option set decides which tests exist). Every test fakes the tables it touches (tSQLt.FakeTable: no
  constraints, no indexes, nullable columns; @Identity = 1 and @Defaults = 1 where the procedure
  relies on the identity or a default), puts rows in place relative to @now, runs one verb and
  compares #Actual with #Expected. tSQLt runs each test in a transaction that it rolls back, so the
  procedures never open their own here (they only do when @@TRANCOUNT = 0 and the caller is not in
  IMPLICIT_TRANSACTIONS mode: that path, and two sessions racing, are covered by the conformance
  suite against a real server). An argument check throws before XACT_ABORT is set and leaves that
  transaction usable; any later THROW dooms it: tSQLt rolls it back completely and still reports the
  test by its ExpectException, so nothing may follow the Act in such a test.
  S.Q_process refuses any open transaction: its refusal is tested in tSQLt's transaction, its loop
  (and a manual-commit caller's first call, IMPLICIT_TRANSACTIONS ON at @@TRANCOUNT = 0) by tests
  annotated --[@tSQLt:NoTransaction] (tSQLt 1.0.8083.3529), which run outside it and name a
  clean-up; tSQLt.UndoTestDoubles then puts back what they faked. tests/test_work_process.py covers
  the loop against a real SQL Server too. Two sessions racing stay with the conformance suite.
-#}
{% set cls = test_class %}
{% import '_pinned_indexes.sql' as pins with context %}
{% set t = names.obj() %}
{% set dead_t = names.obj('_dead') %}
{% set history_t = names.obj('_history') %}
{% set items = names.obj('_items') %}
{% set acks = names.obj('_acks') %}
{% set client_ids = opt.client_ids %}
{% set id_type = 'uniqueidentifier' if client_ids else 'bigint' %}
{% set has_priority = opt.priority %}
{% set dedupe = opt.dedupe %}
{% set history = opt.history %}
{% set max_attempts = opt.max_attempts %}
{% set groups = opt.get('groups', false) %}
{#- With groups, dequeue and complete_next return group_key after lease_token. -#}
{% set gk = ', group_key' if groups else '' %}
{#- A payload literal of the queue's type; n tells messages apart. -#}
{% macro sample(n) -%}
{% if queue.payload == 'json' %}N'{"n": {{ n }}}'{% elif queue.payload == 'text' %}N'message {{ n }}'{% else %}0x{{ '%02X' % n }}{% endif %}
{%- endmacro %}
{#- Message n's id: n itself, or a GUID that sorts by n (SQL Server orders uniqueidentifier by its
    last group first). -#}
{% macro mid(n) -%}
{% if client_ids %}'00000000-0000-0000-0000-{{ '%012d' % n }}'{% else %}{{ n }}{% endif %}
{%- endmacro %}
{#- Lease token n: a literal GUID that tells leases apart. -#}
{% macro token(n) -%}
'7e57ab1e-0000-0000-0000-{{ '%012d' % n }}'
{%- endmacro %}
{#- One message straight into the faked queue table (faked without @Identity: ids are given).
    visible: seconds from @now to visible_at; leased_by: the lease holder or none; lease: the number
    of its lease token (token(lease)) or none. -#}
{% macro insert_message(n, visible=-60, leased_by=none, attempts=0, priority=0, key=none, lease=none) %}
    INSERT INTO {{ t }} (
        id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}attempts, leased_by, leased_at,
        lease_token, {{ 'dedupe_key, ' if dedupe }}payload
    )
    VALUES (
        {{ mid(n) }}, {{ (n ~ ', ') if client_ids }}DATEADD(SECOND, -3600, @now), DATEADD(SECOND, {{ visible if not leased_by else -600 }}, @now),
        DATEADD(SECOND, {{ visible }}, @now), {{ (priority ~ ', ') if has_priority }}{{ attempts }},
        {{ ("N'" ~ leased_by ~ "'") if leased_by else 'NULL' }}, {{ 'DATEADD(SECOND, -10, @now)' if leased_by else 'NULL' }},
        {{ token(lease) if lease is not none else 'NULL' }}, {{ (("N'" ~ key ~ "'") if key else 'NULL') ~ ', ' if dedupe }}{{ sample(n) }}
    );
{%- endmacro %}
{#- One message straight into the faked dead-letter table. -#}
{% macro insert_dead(n, error='boom') %}
    INSERT INTO {{ dead_t }} (
        id, enqueued_at, due_at, {{ 'priority, ' if has_priority }}attempts, last_error, last_worker, dead_at, payload
    )
    VALUES (
        {{ mid(n) }}, DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now), {{ '0, ' if has_priority }}{{ max_attempts }},
        N'{{ error }}', N'w', DATEADD(SECOND, -60, @now), {{ sample(n) }}
    );
{%- endmacro %}
{#- The Act of a stats test: its one row into #Stats. -#}
{% macro stats_into_temp() %}
    CREATE TABLE #Stats (
        ready bigint NOT NULL,
        delayed bigint NOT NULL,
        in_flight bigint NOT NULL,
        dead bigint NOT NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NOT NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC {{ names.verb('stats') }};
{%- endmacro %}
{#- The columns of dequeue's result set, for a #table that INSERT ... EXEC fills. -#}
{% macro dequeue_columns() %}
        id {{ id_type }} NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
        attempts int NOT NULL,
        lease_token uniqueidentifier NULL{% if groups %},
        group_key nvarchar(200) NULL{% endif %}

{%- endmacro %}
{#- dequeue's result set, in the order it came, as #Actual (position, id, attempts); tag tells the
    #tables of a second dequeue in the same test apart. -#}
{% macro dequeue_into_actual(batch_size, worker, lease_seconds='NULL', tag='') %}
    CREATE TABLE #Dequeued{{ tag }} (
        position int IDENTITY (1, 1) NOT NULL,
{{ dequeue_columns() }}
    );

    -- {{ 'Act: ' if not tag }}INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Dequeued{{ tag }} (id, payload, enqueued_at, due_at, attempts, lease_token{{ gk }})
    EXEC {{ names.verb('dequeue') }}
        @batch_size = {{ batch_size }},
        @worker = N'{{ worker }}',
        @lease_seconds = {{ lease_seconds }};

    SELECT
        d.position,
        d.id,
        d.attempts
    INTO #Actual{{ tag }}
    FROM #Dequeued{{ tag }} AS d;
{%- endmacro %}
{#- #Expected for dequeue_into_actual: (n, attempts) in the order they must come. -#}
{% macro expect_dequeued(rows, tag='') %}
    CREATE TABLE #Expected{{ tag }} (position int NOT NULL, id {{ id_type }} NOT NULL, attempts int NOT NULL);
{% if rows %}
    INSERT INTO #Expected{{ tag }} (position, id, attempts)
    VALUES
{% for n, attempts in rows %}
    ({{ loop.index }}, {{ mid(n) }}, {{ attempts }}){{ ';' if loop.last else ',' }}
{% endfor %}
{% endif %}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected{{ tag }}', @Actual = N'#Actual{{ tag }}';
{%- endmacro %}
{#- The queue's rows (id, attempts, leased_by, is the message visible now) against the expected ones. -#}
{% macro assert_queue(rows) %}
    SELECT
        m.id,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.visible_at <= SYSUTCDATETIME(), 1, 0)) AS visible
    INTO #Queue
    FROM {{ t }} AS m;

    CREATE TABLE #ExpectedQueue (
        id {{ id_type }} NULL,
        attempts int NULL,
        leased_by nvarchar(200) NULL,
        visible bit NULL
    );
{% if rows %}
    INSERT INTO #ExpectedQueue (id, attempts, leased_by, visible)
    VALUES
{% for n, attempts, worker, visible in rows %}
    ({{ mid(n) }}, {{ attempts }}, {{ ("N'" ~ worker ~ "'") if worker else 'NULL' }}, {{ 1 if visible else 0 }}){{ ';' if loop.last else ',' }}
{% endfor %}
{% endif %}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedQueue', @Actual = N'#Queue';
{%- endmacro %}
{#- The dead-letter table's rows (id, attempts, last_error, last_worker) against the expected ones. -#}
{% macro assert_dead(rows) %}
    SELECT
        d.id,
        d.attempts,
        d.last_error,
        d.last_worker
    INTO #Dead
    FROM {{ dead_t }} AS d;

    CREATE TABLE #ExpectedDead (
        id {{ id_type }} NULL,
        attempts int NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL
    );
{% if rows %}
    INSERT INTO #ExpectedDead (id, attempts, last_error, last_worker)
    VALUES
{% for n, attempts, error, worker in rows %}
    ({{ mid(n) }}, {{ attempts }}, N'{{ error }}', N'{{ worker }}'){{ ';' if loop.last else ',' }}
{% endfor %}
{% endif %}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedDead', @Actual = N'#Dead';
{%- endmacro %}
-- noqa: disable=CP02, RF05
-- tSQLt's own names are mixed case (tSQLt.FakeTable, #Expected, #Actual) and a test is named by a
-- sentence in brackets ([test enqueue ...]), as tSQLt documents: sqlfluff's identifier casing (CP02)
-- and special-character (RF05) rules cannot hold for them. Every other rule applies.
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

EXEC tSQLt.NewTestClass 'test_{{ schema }}_{{ queue.name }}';
GO

{{ pins.fake_helper(cls, t) }}

{{ pins.fake_helper(cls, dead_t, pins.dead_pinned, 'dead-letter') }}

{% if opt.handler %}
{% set handler_parts = opt.handler.split('.') if '.' in opt.handler else [schema, opt.handler] %}
{% set handler_name = '[' ~ handler_parts[0] ~ '].[' ~ handler_parts[1] ~ ']' %}
{% endif %}
CREATE PROCEDURE {{ cls }}.[undo what a test outside a transaction left]
AS
BEGIN
    -- The clean-up of the NoTransaction tests (--[@tSQLt:NoTransaction]), which tSQLt runs after
    -- such a test and before tSQLt.UndoTestDoubles puts back what it faked or moved away: a
    -- transaction the test left open{% if opt.handler %}, the handler double (only it carries the marker:
    -- a real handler that tSQLt.RemoveObjectIfExists moved away comes back untouched) and the handler's
    -- schema if the test created it{% endif %}.
    -- Rolling back here ends this procedure with a lower @@TRANCOUNT than it began with: Msg 266,
    -- on which tSQLt's handler skips its own tSQLt.UndoTestDoubles and the real tables would stay
    -- renamed. So, after such a rollback, the doubles are undone here{% if opt.handler %} (the handler double
    -- first: it sits under the real handler's name){% endif %}.
    DECLARE @left_open bit = IIF(@@TRANCOUNT > 0, 1, 0);
    IF @left_open = 1 ROLLBACK TRANSACTION;
{% if opt.handler %}
    IF OBJECT_DEFINITION(OBJECT_ID(N'{{ handler_name }}', N'P')) LIKE N'%tablequeue tSQLt handler double%'
        BEGIN
            DROP PROCEDURE {{ handler_name }};
        END;
    -- The flag is read and cleared before the DROP, so that a DROP that fails cannot leave it set for
    -- the next test of the session (which did not create the schema).
    DECLARE @created_schema int = CONVERT(int, SESSION_CONTEXT(N'tablequeue test created schema'));
    EXEC sys.sp_set_session_context @key = N'tablequeue test created schema', @value = NULL;
    IF
        @created_schema = 1
        AND NOT EXISTS (
            SELECT 1 FROM sys.objects AS o
            WHERE o.schema_id = SCHEMA_ID(N'{{ handler_parts[0] }}')
        )
        BEGIN
            EXEC (N'DROP SCHEMA [{{ handler_parts[0] }}];');
        END;
{% endif %}
    IF @left_open = 1
        BEGIN
            EXEC tSQLt.UndoTestDoubles;
        END;
END;
GO

CREATE PROCEDURE {{ cls }}.[SetUp]
AS
BEGIN
    -- tSQLt runs this before every test of the class. The session's look for expired leases is due
    -- at the start of each test: SESSION_CONTEXT belongs to the session, not to the transaction tSQLt
    -- rolls back, so one test's dequeue would otherwise decide whether the next one looks.
    EXEC sys.sp_set_session_context @key = N'tablequeue.{{ schema }}.{{ queue.name }}.expired', @value = NULL;
END;
GO

-- enqueue -----------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test enqueue stores a message due now, no attempt, and returns its id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Returned (id {{ id_type }} NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Returned (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }};

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    SELECT
        m.id,
        m.payload,
        m.attempts,
        m.leased_by,
        CONVERT(bit, IIF(m.due_at = m.visible_at AND m.visible_at BETWEEN @before AND @after, 1, 0)) AS due_now
    INTO #Actual
    FROM {{ t }} AS m;

    SELECT TOP (0)
        a.id,
        a.payload,
        a.attempts,
        a.leased_by,
        a.due_now
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (id, payload, attempts, leased_by, due_now)
    SELECT
        r.id,
        {{ sample(1) }} AS payload,
        0 AS attempts,
        NULL AS leased_by,
        1 AS due_now
    FROM #Returned AS r
    WHERE r.duplicate = 0;
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue with due_at schedules the message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @due datetime2(7) = DATEADD(HOUR, 3, SYSUTCDATETIME());
    CREATE TABLE #Ignored (id {{ id_type }} NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @due_at = @due;

    -- Assert
    DECLARE @scheduled int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.due_at = @due AND m.visible_at = @due
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @scheduled, @Message = N'due_at / visible_at not kept';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a NULL payload with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_payload }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = NULL;
END;
GO
{% if is_json %}

CREATE PROCEDURE {{ cls }}.[test enqueue refuses invalid JSON with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_payload }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = N'{"unterminated": ';
END;
GO

CREATE PROCEDURE {{ cls }}.[test the table itself refuses invalid JSON]
AS
BEGIN
    -- Storage v4 dropped PostgreSQL's CHECKs (it evaluates them on every UPDATE); SQL Server keeps
    -- this one, which costs a lease nothing (no UPDATE sets payload: check-tsql's update-payload).
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ApplyConstraint
        @TableName = N'{{ t }}',
        @ConstraintName = N'{{ names.index_name('ck', 'payload_json') }}';
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = 547,
        @ExpectedMessagePattern = N'%{{ names.index_name('ck', 'payload_json') }}%';

    -- Act
    INSERT INTO {{ t }} (payload) VALUES (N'not json');
END;
GO
{% endif %}
{% if dedupe %}

CREATE PROCEDURE {{ cls }}.[test enqueue of a queued dedupe_key returns the queued id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, leased_by='w', visible=60, attempts=1, key='order-42') }}
    CREATE TABLE #Actual (id {{ id_type }} NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(2) }}, @dedupe_key = N'order-42';

    -- Assert: a leased message is still queued, so still a duplicate; nothing new was stored.
    CREATE TABLE #Expected (id {{ id_type }} NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES ({{ mid(1) }}, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 1, 'w', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a dedupe_key over 200 characters]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @long_key nvarchar(MAX) = REPLICATE(N'k', 201);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @dedupe_key = @long_key;
END;
GO
{% else %}

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a dedupe_key without option dedupe]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @dedupe_key = N'k';
END;
GO
{% endif %}
{% if has_priority %}

CREATE PROCEDURE {{ cls }}.[test enqueue stores the priority, 0 by default]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    CREATE TABLE #Ignored (id {{ id_type }} NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @priority = 7;
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(2) }};

    -- Assert
    SELECT m.priority
    INTO #Actual
    FROM {{ t }} AS m;

    CREATE TABLE #Expected (priority int NULL);
    INSERT INTO #Expected (priority) VALUES (7), (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% endif %}
{% if client_ids %}

CREATE PROCEDURE {{ cls }}.[test enqueue keeps the client id and created time]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @created datetime2(7) = '2024-05-01T12:30:15.1234567';
    CREATE TABLE #Actual (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }}
        @payload = {{ sample(1) }},
        @id = {{ mid(5) }},
        @enqueued_at = @created;

    -- Assert
    CREATE TABLE #Expected (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES ({{ mid(5) }}, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @stored datetime2(7) = (SELECT m.enqueued_at FROM {{ t }} AS m);
    EXEC tSQLt.AssertEquals @Expected = @created, @Actual = @stored;
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue of a queued client id is a duplicate]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(5) }}
    CREATE TABLE #Actual (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }}
        @payload = {{ sample(6) }},
        @id = {{ mid(5) }};

    -- Assert
    CREATE TABLE #Expected (id uniqueidentifier NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES ({{ mid(5) }}, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(5, 0, none, true)]) }}
END;
GO
{% endif %}

-- enqueue_batch -----------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test enqueue_batch returns a row per item in item order]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    -- Filled out of order on purpose: the ordinal, not the insertion order, is the item order.
    INSERT INTO @items (ordinal, payload{{ ', id' if client_ids }})
    VALUES
    (3, {{ sample(3) }}{{ (', ' ~ mid(3)) if client_ids }}),
    (1, {{ sample(1) }}{{ (', ' ~ mid(1)) if client_ids }}),
    (2, {{ sample(2) }}{{ (', ' ~ mid(2)) if client_ids }});
    CREATE TABLE #Actual (ordinal int NOT NULL, id {{ id_type }} NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert: new ids follow the item order.
    CREATE TABLE #Expected (ordinal int NOT NULL, id {{ id_type }} NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (ordinal, id, duplicate)
    VALUES
    (1, {{ mid(1) }}, 0),
    (2, {{ mid(2) }}, 0),
    (3, {{ mid(3) }}, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.payload
    INTO #Stored
    FROM {{ t }} AS m;

    SELECT TOP (0)
        s.id,
        s.payload
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, payload)
    VALUES
    ({{ mid(1) }}, {{ sample(1) }}),
    ({{ mid(2) }}, {{ sample(2) }}),
    ({{ mid(3) }}, {{ sample(3) }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses a NULL payload with 51002, naming it]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload) VALUES (1, {{ sample(1) }}), (2, NULL);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_payload }}, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;
END;
GO
{% if dedupe %}

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses more than 1000 items with 51001]
AS
BEGIN
    -- Assemble: past ~5,000 row locks a batch would escalate to a table lock READPAST cannot skip.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload)
    SELECT TOP (1001)
        ROW_NUMBER() OVER (ORDER BY c.object_id, c.column_id) AS ordinal,
        {{ sample(1) }} AS payload
    FROM sys.all_columns AS c;
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }}, @ExpectedMessagePattern = N'%at most 1000 items%';

    -- Act
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue_batch reports queued and in-batch duplicates]
AS
BEGIN
    -- Assemble: key a is queued as message 1; the batch repeats a, brings b twice and one without a key.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO {{ t }} ({{ 'id, ' if client_ids }}due_at, visible_at, attempts, dedupe_key, payload)
    VALUES ({{ (mid(1) ~ ', ') if client_ids }}@now, @now, 0, N'a', {{ sample(9) }});
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, dedupe_key{{ ', id' if client_ids }})
    VALUES
    (1, {{ sample(1) }}, N'a'{{ (', ' ~ mid(11)) if client_ids }}),
    (2, {{ sample(2) }}, N'b'{{ (', ' ~ mid(2)) if client_ids }}),
    (3, {{ sample(3) }}, N'b'{{ (', ' ~ mid(13)) if client_ids }}),
    (4, {{ sample(4) }}, NULL{{ (', ' ~ mid(3)) if client_ids }});
    CREATE TABLE #Actual (ordinal int NOT NULL, id {{ id_type }} NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert: new rows get ids 2 and 3 in item order; a duplicate carries the id that was kept.
    CREATE TABLE #Expected (ordinal int NOT NULL, id {{ id_type }} NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (ordinal, id, duplicate)
    VALUES
    (1, {{ mid(1) }}, 1),
    (2, {{ mid(2) }}, 0),
    (3, {{ mid(2) }}, 1),
    (4, {{ mid(3) }}, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% endif %}
{% for column, option, value in (('dedupe_key', 'dedupe', "N'k'"), ('priority', 'priority', '1'), ('id', 'client_ids', 'NEWID()'), ('enqueued_at', 'client_ids', 'SYSUTCDATETIME()')) if not opt[option] %}

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses {{ column }} without option {{ option }}]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, {{ column }}) VALUES (1, {{ sample(1) }}, {{ value }});
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;
END;
GO
{% endfor %}

-- dequeue -----------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test dequeue leases visible messages in order, one attempt each]
AS
BEGIN
    -- Assemble: ids and visible times disagree, so only the visible order passes.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-10) }}
{{ insert_message(2, visible=-30) }}
{{ insert_message(3, visible=-20) }}
{{ dequeue_into_actual(2, 'w', 600) }}

    -- Assert
{{ expect_dequeued([(2, 1), (3, 1)]) }}
{{ assert_queue([(1, 0, none, true), (2, 1, 'w', false), (3, 1, 'w', false)]) }}
    DECLARE @lease_ends int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.leased_by = N'w' AND m.visible_at > DATEADD(SECOND, 590, @now) AND m.leased_at >= @now
    );
    EXEC tSQLt.AssertEquals @Expected = 2, @Actual = @lease_ends, @Message = N'lease not from now';
END;
GO

CREATE PROCEDURE {{ cls }}.[test a later dequeue takes an earlier-visible message first]
AS
BEGIN
    -- Assemble: a dequeue has taken message 1; then message 3 arrives, visible since long before
    -- (an enqueue with a due time in the past). The claim order starts at its head on every call
    -- (the PostgreSQL twin keeps a claim position and moves it back: docs/queue-kinds.md).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-30) }}
{{ insert_message(2, visible=-20) }}
    CREATE TABLE #Earlier (
{{ dequeue_columns() }}
    );
    INSERT INTO #Earlier (id, payload, enqueued_at, due_at, attempts, lease_token{{ gk }})
    EXEC {{ names.verb('dequeue') }} @batch_size = 1, @worker = N'w', @lease_seconds = 600;
{{ insert_message(3, visible=-3600) }}
{{ dequeue_into_actual(1, 'v', 600) }}

    -- Assert
{{ expect_dequeued([(3, 1)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue skips messages not yet due and live leases]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=3600) }}
{{ insert_message(2, visible=60, leased_by='other', attempts=1) }}
{{ dequeue_into_actual(10, 'w') }}

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
{{ assert_queue([(1, 0, none, false), (2, 1, 'other', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue gives a worker its own leased messages first]
AS
BEGIN
    -- Assemble: message 1 is visible and older than anything, yet w gets its own leased 2 first.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-3000) }}
{{ insert_message(2, visible=60, leased_by='w', attempts=1) }}
{{ dequeue_into_actual(2, 'w', 600) }}

    -- Assert: 2 comes back in the attempt it is in (its lease is live).
{{ expect_dequeued([(2, 1), (1, 1)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue again returns a live own lease as it is]
AS
BEGIN
    -- Assemble: w holds 2 with a minute left; asking three times must neither spend an attempt nor
    -- move the lease's expiry (0.1.0 counted an attempt each time and buried it as 'lease expired').
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(2, visible=60, leased_by='w', attempts=max_attempts) }}
    DECLARE @expiry datetime2(7) = (SELECT m.visible_at FROM {{ t }} AS m);
    CREATE TABLE #Ignored (
{{ dequeue_columns() }}
    );

    -- Act
    INSERT INTO #Ignored
    EXEC {{ names.verb('dequeue') }} @batch_size = 1, @worker = N'w', @lease_seconds = 600;
    INSERT INTO #Ignored
    EXEC {{ names.verb('dequeue') }} @batch_size = 1, @worker = N'w', @lease_seconds = 600;
{{ dequeue_into_actual(1, 'w', 600) }}

    -- Assert
{{ expect_dequeued([(2, max_attempts)]) }}
    DECLARE @expiry_after datetime2(7) = (SELECT m.visible_at FROM {{ t }} AS m);
    EXEC tSQLt.AssertEquals @Expected = @expiry, @Actual = @expiry_after;
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test a refused argument leaves the caller's transaction usable]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's transaction.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @error int;

    -- Act: as a driver's session has it (engines.connect sets it; tSQLt's session has it off, where
    -- the test would pass whatever the procedure did). The argument check throws with XACT_ABORT
    -- off, its own setting, so the transaction is not doomed.
    SET XACT_ABORT ON;
    BEGIN TRY
        EXEC {{ names.verb('dequeue') }} @batch_size = 1, @worker = NULL;
    END TRY
    BEGIN CATCH
        SET @error = ERROR_NUMBER();
    END CATCH;

    -- Assert
    DECLARE @state smallint = XACT_STATE();
    EXEC tSQLt.AssertEquals @Expected = {{ errors.invalid_argument }}, @Actual = @error;
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @state;
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue takes an expired lease as the next attempt]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-5, leased_by='crashed', attempts=1) }}
{{ dequeue_into_actual(1, 'w') }}

    -- Assert
{{ expect_dequeued([(1, 2)]) }}
{{ assert_queue([(1, 2, 'w', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue leaves an expired lease until the look is due]
AS
BEGIN
    -- Assemble: 1's lease expired, 2 is ready; this session looked for expired leases a moment ago.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @next_look datetime2(7);
    -- A first call on the empty fake compiles the procedure, so that the second runs within the
    -- second the key is set for; it finds nothing.
{{ dequeue_into_actual(1, 'w', tag='Compile') }}
{{ expect_dequeued([], tag='Compile') }}
{{ insert_message(1, visible=-5, leased_by='crashed', attempts=1) }}
{{ insert_message(2, visible=-10) }}
    SET @next_look = DATEADD(MILLISECOND, 1000, SYSUTCDATETIME());
    EXEC sys.sp_set_session_context @key = N'tablequeue.{{ schema }}.{{ queue.name }}.expired', @value = @next_look;
{{ dequeue_into_actual(2, 'w') }}
    IF SYSUTCDATETIME() >= @next_look
        EXEC tSQLt.Fail N'inconclusive: the dequeue took longer than the second the key was set for';

    -- Assert: only the ready message; the expired lease waits for the session's next look.
{{ expect_dequeued([(2, 1)]) }}
{{ assert_queue([(1, 1, 'crashed', true), (2, 1, 'w', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test the look takes every holder's expired leases and no live one]
AS
BEGIN
    -- Assemble: a's lease is live; b's and c's expired. The look walks the holders one at a time.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='a', attempts=1) }}
{{ insert_message(2, visible=-5, leased_by='b', attempts=1) }}
{{ insert_message(3, visible=-6, leased_by='c', attempts=1) }}
{{ dequeue_into_actual(5, 'w') }}

    -- Assert: both expired leases, oldest expiry first; a's lease as it was.
{{ expect_dequeued([(3, 2), (2, 2)]) }}
{{ assert_queue([(1, 1, 'a', false), (2, 2, 'w', false), (3, 2, 'w', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test the look stays on a holder whose expired lease it buried]
AS
BEGIN
    -- Assemble: holder 'x' (sorting after the caller 'w') crashed with two expired leases, the older
    -- one out of attempts; nothing else is ready. The batch of one is the second of them.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-20, leased_by='x', attempts=max_attempts) }}
{{ insert_message(2, visible=-10, leased_by='x', attempts=1) }}
{{ dequeue_into_actual(1, 'w') }}

    -- Assert: the buried lease freed the batch's place, and the look took x's next expired lease.
{{ expect_dequeued([(2, 2)]) }}
{{ assert_dead([(1, max_attempts, 'lease expired', 'x')]) }}
{{ assert_queue([(2, 2, 'w', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test a look short of the batch makes the next due in a second]
AS
BEGIN
    -- Assemble: one expired lease, a batch of two.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-5, leased_by='crashed', attempts=1) }}
{{ dequeue_into_actual(2, 'w') }}

    -- Assert
{{ expect_dequeued([(1, 2)]) }}
    DECLARE @next_look sql_variant = SESSION_CONTEXT(N'tablequeue.{{ schema }}.{{ queue.name }}.expired');
    DECLARE @next_look_type sysname = CONVERT(sysname, SQL_VARIANT_PROPERTY(@next_look, 'BaseType'));
    EXEC tSQLt.AssertEqualsString @Expected = N'datetime2', @Actual = @next_look_type;
    IF CONVERT(datetime2(7), @next_look) NOT BETWEEN DATEADD(SECOND, 1, @now) AND DATEADD(SECOND, 1, SYSUTCDATETIME())
        BEGIN
            EXEC tSQLt.Fail N'the next look is not due a second after this one';
        END;
END;
GO

CREATE PROCEDURE {{ cls }}.[test a look that fills the batch leaves the look due]
AS
BEGIN
    -- Assemble: a crashed worker's two expired leases, a batch of one.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-5, leased_by='crashed', attempts=1) }}
{{ insert_message(2, visible=-5, leased_by='crashed', attempts=1) }}
{{ dequeue_into_actual(1, 'w') }}
{{ dequeue_into_actual(1, 'v', tag='Again') }}

    -- Assert: the second call looked again and took the other one.
{{ expect_dequeued([(1, 2)]) }}
{{ expect_dequeued([(2, 2)], tag='Again') }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test an untrusted look setting leaves the look due]
AS
BEGIN
    -- Assemble: the session's own values for the key (any type, any time): not one the procedures
    -- wrote, or more than a second ahead, so the look is due.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @far datetime2(7) = DATEADD(HOUR, 1, SYSUTCDATETIME());
{{ insert_message(1, visible=-5, leased_by='crashed', attempts=1) }}
{{ insert_message(2, visible=-5, leased_by='crashed', attempts=1) }}
    EXEC sys.sp_set_session_context @key = N'tablequeue.{{ schema }}.{{ queue.name }}.expired', @value = N'soon';
{{ dequeue_into_actual(1, 'w') }}
    EXEC sys.sp_set_session_context @key = N'tablequeue.{{ schema }}.{{ queue.name }}.expired', @value = @far;
{{ dequeue_into_actual(1, 'v', tag='Again') }}

    -- Assert
{{ expect_dequeued([(1, 2)]) }}
{{ expect_dequeued([(2, 2)], tag='Again') }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue buries a message out of attempts and fills the batch]
AS
BEGIN
    -- Assemble: message 1 used its {{ max_attempts }} attempts and its last lease expired; 2 is ready.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-20, leased_by='crashed', attempts=max_attempts) }}
{{ insert_message(2, visible=-10) }}
{{ dequeue_into_actual(1, 'w') }}

    -- Assert
{{ expect_dequeued([(2, 1)]) }}
{{ assert_dead([(1, max_attempts, 'lease expired', 'crashed')]) }}
{{ assert_queue([(2, 1, 'w', false)]) }}
END;
GO
{% if has_priority %}

CREATE PROCEDURE {{ cls }}.[test dequeue hands out higher priorities first]
AS
BEGIN
    -- Assemble: a delayed message at the top level must not hide the ready ones below it.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-50, priority=0) }}
{{ insert_message(2, visible=-10, priority=5) }}
{{ insert_message(3, visible=-30, priority=1) }}
{{ insert_message(4, visible=-40, priority=1) }}
{{ insert_message(5, visible=3600, priority=9) }}
{{ dequeue_into_actual(10, 'w') }}

    -- Assert
{{ expect_dequeued([(2, 1), (4, 1), (3, 1), (1, 1)]) }}
END;
GO
{% endif %}
{% for arguments, label in (("@batch_size = 0, @worker = N'w'", 'batch_size 0'), ("@batch_size = 1001, @worker = N'w'", 'batch_size 1001'), ('@batch_size = 1, @worker = NULL', 'a NULL worker'), ("@batch_size = 1, @worker = N'w', @lease_seconds = 0", 'lease_seconds 0')) %}

CREATE PROCEDURE {{ cls }}.[test dequeue refuses {{ label }} with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('dequeue') }} {{ arguments }};
END;
GO
{% endfor %}

-- complete ----------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test complete by the lease holder removes the message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=2) }}
{{ insert_message(2) }}
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC {{ names.verb('complete') }}
        @id = {{ mid(1) }},
        @worker = N'w';

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(2, 0, none, true)]) }}
{% if history %}

    SELECT
        h.id,
        h.worker,
        h.attempts,
        CONVERT(bit, IIF(h.started_at = DATEADD(SECOND, -10, @now) AND h.finished_at >= @now, 1, 0)) AS times_kept,
        CONVERT(bit, IIF(h.duration_ms >= 10000, 1, 0)) AS duration_kept
    INTO #History
    FROM {{ history_t }} AS h;

    SELECT TOP (0)
        h.id,
        h.worker,
        h.attempts,
        h.times_kept,
        h.duration_kept
    INTO #ExpectedHistory
    FROM #History AS h;

    INSERT INTO #ExpectedHistory (id, worker, attempts, times_kept, duration_kept)
    VALUES ({{ mid(1) }}, N'w', 2, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedHistory', @Actual = N'#History';
{% endif %}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete by another worker returns 0]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1) }}
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC {{ names.verb('complete') }}
        @id = {{ mid(1) }},
        @worker = N'late';

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 1, 'w', false)]) }}
{% if history %}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ history_t }}';
{% endif %}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete after the lease expired returns 0]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-1, leased_by='w', attempts=1) }}
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC {{ names.verb('complete') }}
        @id = {{ mid(1) }},
        @worker = N'w';

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 1, 'w', true)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete refuses a NULL worker with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('complete') }}
        @id = {{ mid(1) }},
        @worker = NULL;
END;
GO

-- fail --------------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test fail with attempts left retries after the delay]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=max_attempts - 1) }}
    CREATE TABLE #Actual (outcome varchar(8) NOT NULL);

    -- Act
    INSERT INTO #Actual (outcome)
    EXEC {{ names.verb('fail') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @error = N'timeout',
        @retry_after_seconds = 300;

    -- Assert
    CREATE TABLE #Expected (outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (outcome) VALUES ('retrying');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, max_attempts - 1, none, false)]) }}
    DECLARE @retry_kept int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.last_error = N'timeout' AND m.visible_at > DATEADD(SECOND, 290, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @retry_kept, @Message = N'error or retry time not kept';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test fail on the last attempt moves the message to dead]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=max_attempts) }}
    CREATE TABLE #Actual (outcome varchar(8) NOT NULL);

    -- Act
    INSERT INTO #Actual (outcome)
    EXEC {{ names.verb('fail') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @error = N'poison';

    -- Assert
    CREATE TABLE #Expected (outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (outcome) VALUES ('dead');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_dead([(1, max_attempts, 'poison', 'w')]) }}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ t }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test fail without the live lease is lost]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=max_attempts) }}
    CREATE TABLE #Actual (outcome varchar(8) NOT NULL);

    -- Act
    INSERT INTO #Actual (outcome)
    EXEC {{ names.verb('fail') }}
        @id = {{ mid(1) }},
        @worker = N'late',
        @error = N'x';

    -- Assert
    CREATE TABLE #Expected (outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (outcome) VALUES ('lost');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, max_attempts, 'w', false)]) }}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
END;
GO

--[@tSQLt:NoTransaction]('{{ cls }}.[undo what a test outside a transaction left]')
CREATE PROCEDURE {{ cls }}.[test fail in implicit-transaction mode joins the caller's transaction]
AS
BEGIN
    -- Assemble: outside tSQLt's transaction (NoTransaction), as a manual-commit caller (ODBC/JDBC
    -- autocommit off) calls: IMPLICIT_TRANSACTIONS ON at @@TRANCOUNT = 0. fail opens a transaction
    -- of its own only for an autocommit caller; here its first statement opens the caller's, and
    -- fail neither commits nor ends the caller's implicit transaction. The fakes come back
    -- through tSQLt.UndoTestDoubles.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=max_attempts) }}
    DECLARE @open_after int;

    -- Act: the last attempt fails (to dead), then the caller rolls its transaction back. Plain
    -- EXEC: INSERT ... EXEC would open the transaction before the call. Should fail raise, the
    -- catch rolls back and leaves implicit-transaction mode before re-raising: the clean-up then
    -- finds no transaction open.
    BEGIN TRY
        SET IMPLICIT_TRANSACTIONS ON;
        EXEC {{ names.verb('fail') }}
            @id = {{ mid(1) }},
            @worker = N'w',
            @error = N'poison';
        SET @open_after = @@TRANCOUNT;
        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        SET IMPLICIT_TRANSACTIONS OFF;
    END TRY
    BEGIN CATCH
        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        SET IMPLICIT_TRANSACTIONS OFF;
        THROW;
    END CATCH;

    -- Assert: the caller's transaction was still open, and its rollback undid the move.
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @open_after, @Message = N'fail ended the caller''s transaction';
{{ assert_queue([(1, max_attempts, 'w', false)]) }}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test fail refuses a negative retry_after_seconds with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('fail') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @error = N'x',
        @retry_after_seconds = -1;
END;
GO

-- extend_lease ------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test extend_lease by the holder runs from now]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=5, leased_by='w', attempts=1) }}
    CREATE TABLE #Actual (extended bit NOT NULL);

    -- Act
    INSERT INTO #Actual (extended)
    EXEC {{ names.verb('extend_lease') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert
    CREATE TABLE #Expected (extended bit NOT NULL);
    INSERT INTO #Expected (extended) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @extended int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.visible_at > DATEADD(SECOND, 590, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @extended;
END;
GO

CREATE PROCEDURE {{ cls }}.[test extend_lease of an expired lease returns 0]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-5, leased_by='w', attempts=1) }}
    CREATE TABLE #Actual (extended bit NOT NULL);

    -- Act
    INSERT INTO #Actual (extended)
    EXEC {{ names.verb('extend_lease') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert
    CREATE TABLE #Expected (extended bit NOT NULL);
    INSERT INTO #Expected (extended) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 1, 'w', true)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test extend_lease by another worker returns 0 and leaves the lease]
AS
BEGIN
    -- Assemble: w holds a live lease (token 1) for another 60 seconds.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=1) }}
    CREATE TABLE #Actual (extended bit NOT NULL);

    -- Act: another worker, by name alone and with w's token.
    INSERT INTO #Actual (extended)
    EXEC {{ names.verb('extend_lease') }}
        @id = {{ mid(1) }},
        @worker = N'intruder',
        @lease_seconds = 600;
    INSERT INTO #Actual (extended)
    EXEC {{ names.verb('extend_lease') }}
        @id = {{ mid(1) }},
        @worker = N'intruder',
        @lease_seconds = 600,
        @lease_token = {{ token(1) }};

    -- Assert: nothing extended; the lease is still w's, with its token, ending when it did.
    CREATE TABLE #Expected (extended bit NOT NULL);
    INSERT INTO #Expected (extended) VALUES (0), (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @unchanged int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE
            m.leased_by = N'w'
            AND m.lease_token = {{ token(1) }}
            AND m.visible_at = DATEADD(SECOND, 60, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @unchanged, @Message = N'the lease changed';
END;
GO

-- lease tokens ------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test dequeue gives a new lease a new token, a live lease its own]
AS
BEGIN
    -- Assemble: w holds 1 (token 1, live); 2 and 3 are visible.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=1) }}
{{ insert_message(2, visible=-20) }}
{{ insert_message(3, visible=-10) }}
    CREATE TABLE #Dequeued (
{{ dequeue_columns() }}
    );

    -- Act
    INSERT INTO #Dequeued (id, payload, enqueued_at, due_at, attempts, lease_token{{ gk }})
    EXEC {{ names.verb('dequeue') }}
        @batch_size = 3,
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert: what dequeue returned is each row's token; 1 kept its own; 2 and 3 got two new ones.
    SELECT
        d.id,
        CONVERT(bit, IIF(d.lease_token = m.lease_token, 1, 0)) AS returned_the_stored_token,
        CONVERT(bit, IIF(d.lease_token = {{ token(1) }}, 1, 0)) AS the_old_token
    INTO #Actual
    FROM #Dequeued AS d
    INNER JOIN {{ t }} AS m ON d.id = m.id;

    CREATE TABLE #Expected (id {{ id_type }} NOT NULL, returned_the_stored_token bit NULL, the_old_token bit NULL);
    INSERT INTO #Expected (id, returned_the_stored_token, the_old_token)
    VALUES
    ({{ mid(1) }}, 1, 1),
    ({{ mid(2) }}, 1, 0),
    ({{ mid(3) }}, 1, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @distinct_tokens int = (SELECT COUNT(DISTINCT d.lease_token) FROM #Dequeued AS d);
    EXEC tSQLt.AssertEquals @Expected = 3, @Actual = @distinct_tokens, @Message = N'two leases share a token';
END;
GO

CREATE PROCEDURE {{ cls }}.[test a stale token changes nothing, even for the same worker]
AS
BEGIN
    -- Assemble: w's first lease (token 1) expired and w leased the message again (token 2); w's
    -- late calls from the first attempt carry token 1.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=max_attempts, lease=2) }}
    DECLARE @expiry datetime2(7) = (SELECT m.visible_at FROM {{ t }} AS m);
    DECLARE @stale uniqueidentifier = {{ token(1) }};
    CREATE TABLE #Completed (completed bit NOT NULL);
    CREATE TABLE #Failed (outcome varchar(8) NOT NULL);
    CREATE TABLE #Extended (extended bit NOT NULL);
    CREATE TABLE #Released (released bit NOT NULL);

    -- Act
    INSERT INTO #Completed (completed)
    EXEC {{ names.verb('complete') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = @stale;
    INSERT INTO #Failed (outcome)
    EXEC {{ names.verb('fail') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @error = N'late',
        @lease_token = @stale;
    INSERT INTO #Extended (extended)
    EXEC {{ names.verb('extend_lease') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_seconds = 3600,
        @lease_token = @stale;
    INSERT INTO #Released (released)
    EXEC {{ names.verb('release') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = @stale;

    -- Assert: every verb reports the lease lost; the message is as it was (on its last attempt, a
    -- fail that got through would have buried it).
    DECLARE @completed bit = (SELECT c.completed FROM #Completed AS c);
    DECLARE @outcome varchar(8) = (SELECT f.outcome FROM #Failed AS f);
    DECLARE @extended bit = (SELECT e.extended FROM #Extended AS e);
    DECLARE @released bit = (SELECT r.released FROM #Released AS r);
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @completed, @Message = N'complete';
    EXEC tSQLt.AssertEqualsString @Expected = 'lost', @Actual = @outcome, @Message = N'fail';
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @extended, @Message = N'extend_lease';
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @released, @Message = N'release';
{{ assert_queue([(1, max_attempts, 'w', false)]) }}
    DECLARE @unchanged int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.visible_at = @expiry AND m.lease_token = {{ token(2) }} AND m.last_error IS NULL
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @unchanged, @Message = N'lease, token or error changed';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
{% if history %}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ history_t }}';
{% endif %}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete with the current token removes the message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=2) }}
    DECLARE @current uniqueidentifier = {{ token(2) }};
    CREATE TABLE #Actual (completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (completed)
    EXEC {{ names.verb('complete') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = @current;

    -- Assert
    CREATE TABLE #Expected (completed bit NOT NULL);
    INSERT INTO #Expected (completed) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ t }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test a NULL token keeps the check by worker name]
AS
BEGIN
    -- Assemble: w holds 1 under token 2; v holds nothing (0.1.0's calls pass no token).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=5, leased_by='w', attempts=1, lease=2) }}
    CREATE TABLE #ByAnother (extended bit NOT NULL);
    CREATE TABLE #ByTheHolder (extended bit NOT NULL);

    -- Act
    INSERT INTO #ByAnother (extended)
    EXEC {{ names.verb('extend_lease') }}
        @id = {{ mid(1) }},
        @worker = N'v',
        @lease_seconds = 600;
    INSERT INTO #ByTheHolder (extended)
    EXEC {{ names.verb('extend_lease') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_seconds = 600;

    -- Assert: another name is refused, the holder's name is enough, and the token stays.
    DECLARE @by_another bit = (SELECT a.extended FROM #ByAnother AS a);
    DECLARE @by_the_holder bit = (SELECT h.extended FROM #ByTheHolder AS h);
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @by_another, @Message = N'another worker extended it';
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @by_the_holder, @Message = N'the holder could not extend it';
    DECLARE @kept int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.lease_token = {{ token(2) }} AND m.visible_at > DATEADD(SECOND, 590, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @kept, @Message = N'lease not extended under its token';
END;
GO

-- release -----------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test release returns the attempt and makes the message visible now]
AS
BEGIN
    -- Assemble: w holds 1 on its second attempt (token 1), with ten minutes left.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=600, leased_by='w', attempts=2, lease=1) }}
    DECLARE @current uniqueidentifier = {{ token(1) }};
    CREATE TABLE #Released (released bit NOT NULL);

    -- Act
    INSERT INTO #Released (released)
    EXEC {{ names.verb('release') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = @current;

    -- Assert: no lease left at all, one attempt fewer, and another worker gets it at once, its
    -- second attempt again.
    DECLARE @released bit = (SELECT r.released FROM #Released AS r);
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @released;
{{ assert_queue([(1, 1, none, true)]) }}
    DECLARE @lease_gone int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.leased_at IS NULL AND m.lease_token IS NULL
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @lease_gone, @Message = N'leased_at or lease_token kept';
{{ dequeue_into_actual(1, 'v', 600) }}
{{ expect_dequeued([(1, 2)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test release never takes attempts below 0]
AS
BEGIN
    -- Assemble: a lease with no attempt counted (a row put back by hand, say).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=600, leased_by='w', attempts=0, lease=1) }}
    CREATE TABLE #Ignored (released bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (released)
    EXEC {{ names.verb('release') }} @id = {{ mid(1) }}, @worker = N'w';

    -- Assert
{{ assert_queue([(1, 0, none, true)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test release of an expired lease returns 0 and changes nothing]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-5, leased_by='w', attempts=2, lease=1) }}
    DECLARE @current uniqueidentifier = {{ token(1) }};
    CREATE TABLE #Actual (released bit NOT NULL);

    -- Act
    INSERT INTO #Actual (released)
    EXEC {{ names.verb('release') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = @current;

    -- Assert
    CREATE TABLE #Expected (released bit NOT NULL);
    INSERT INTO #Expected (released) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 2, 'w', true)]) }}
END;
GO

-- complete_batch ----------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test complete_batch completes the held leases and reports a stale item]
AS
BEGIN
    -- Assemble: w holds 1, 2 and 3 (tokens 1, 2, 3); the batch, out of order, carries a stale
    -- token for 2 (an earlier lease of it); 4 is w's too but not in the batch.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=1) }}
{{ insert_message(2, visible=60, leased_by='w', attempts=2, lease=2) }}
{{ insert_message(3, visible=60, leased_by='w', attempts=1, lease=3) }}
{{ insert_message(4, visible=60, leased_by='w', attempts=1, lease=4) }}
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(3) }}, {{ token(3) }}),
    ({{ mid(2) }}, {{ token(9) }}),
    ({{ mid(1) }}, {{ token(1) }});
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id {{ id_type }} NOT NULL,
        completed bit NOT NULL
    );

    -- Act
    INSERT INTO #Actual (id, completed)
    EXEC {{ names.verb('complete_batch') }} @acks = @acks, @worker = N'w';

    -- Assert: one row per item, in id order.
    CREATE TABLE #Expected (position int NOT NULL, id {{ id_type }} NOT NULL, completed bit NOT NULL);
    INSERT INTO #Expected (position, id, completed)
    VALUES
    (1, {{ mid(1) }}, 1),
    (2, {{ mid(2) }}, 0),
    (3, {{ mid(3) }}, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(2, 2, 'w', false), (4, 1, 'w', false)]) }}
{% if history %}

    SELECT
        h.id,
        h.worker,
        h.attempts
    INTO #History
    FROM {{ history_t }} AS h;

    CREATE TABLE #ExpectedHistory (id {{ id_type }} NULL, worker nvarchar(200) NULL, attempts int NULL);
    INSERT INTO #ExpectedHistory (id, worker, attempts)
    VALUES
    ({{ mid(1) }}, N'w', 1),
    ({{ mid(3) }}, N'w', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedHistory', @Actual = N'#History';
{% endif %}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete_batch with a NULL token checks the worker name]
AS
BEGIN
    -- Assemble: w holds 1, v holds 2; w acknowledges both without tokens.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=1) }}
{{ insert_message(2, visible=60, leased_by='v', attempts=1, lease=2) }}
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(1) }}, NULL),
    ({{ mid(2) }}, NULL);
    CREATE TABLE #Actual (id {{ id_type }} NOT NULL, completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, completed)
    EXEC {{ names.verb('complete_batch') }} @acks = @acks, @worker = N'w';

    -- Assert
    CREATE TABLE #Expected (id {{ id_type }} NOT NULL, completed bit NOT NULL);
    INSERT INTO #Expected (id, completed)
    VALUES
    ({{ mid(1) }}, 1),
    ({{ mid(2) }}, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(2, 1, 'v', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete_batch of no items returns no rows]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @acks {{ acks }};
    CREATE TABLE #Actual (id {{ id_type }} NOT NULL, completed bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, completed)
    EXEC {{ names.verb('complete_batch') }} @acks = @acks, @worker = N'w';

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
END;
GO
{% for verb in ('complete_batch', 'fail_batch') %}

CREATE PROCEDURE {{ cls }}.[test {{ verb }} refuses more than 1000 items with 51001]
AS
BEGIN
    -- Assemble: past ~5,000 row locks a batch would escalate to a table lock READPAST cannot skip.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id)
{% if client_ids %}
    SELECT TOP (1001) NEWID() AS id
    FROM sys.all_columns;
{% else %}
    SELECT TOP (1001) ROW_NUMBER() OVER (ORDER BY c.object_id, c.column_id) AS id
    FROM sys.all_columns AS c;
{% endif %}
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = {{ errors.invalid_argument }},
        @ExpectedMessagePattern = N'%{{ verb }}: at most 1000 items%';

    -- Act
    EXEC {{ names.verb(verb) }} @acks = @acks, @worker = N'w';
END;
GO

CREATE PROCEDURE {{ cls }}.[test {{ verb }} refuses a repeated id, the transaction usable]
AS
BEGIN
    -- Assemble: the caller's session runs with XACT_ABORT ON (as drivers often set it); this test's
    -- own transaction (tSQLt's) is the caller's transaction.
    SET XACT_ABORT ON;
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(1) }}, {{ token(1) }}),
    ({{ mid(1) }}, {{ token(2) }});
    DECLARE @error int;
    DECLARE @message nvarchar(2048);

    -- Act: the check throws before the procedure's XACT_ABORT ON, with the session's set OFF.
    BEGIN TRY
        EXEC {{ names.verb(verb) }} @acks = @acks, @worker = N'w';
    END TRY
    BEGIN CATCH
        SET @error = ERROR_NUMBER();
        SET @message = ERROR_MESSAGE();
    END CATCH;

    -- Assert
    DECLARE @state smallint = XACT_STATE();
    EXEC tSQLt.AssertEquals @Expected = {{ errors.invalid_argument }}, @Actual = @error;
    EXEC tSQLt.AssertLike @ExpectedPattern = N'%{{ verb }}: acks holds id % more than once.', @Actual = @message;
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @state;
END;
GO
{% endfor %}

-- lease_status ------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test lease_status tells held, expired, lost, dead and gone apart]
AS
BEGIN
    -- Assemble: 1 held by its token; 2 under another token (leased again); 3 expired under its
    -- token; 4 not leased (released, or failed for a retry); 5 in the dead-letter table; 6 nowhere.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    EXEC {{ cls }}.[index the faked dead-letter table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=1) }}
{{ insert_message(2, visible=60, leased_by='v', attempts=2, lease=9) }}
{{ insert_message(3, visible=-5, leased_by='w', attempts=1, lease=3) }}
{{ insert_message(4, visible=-5, attempts=1) }}
{{ insert_dead(5) }}
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(6) }}, {{ token(6) }}),
    ({{ mid(5) }}, {{ token(5) }}),
    ({{ mid(4) }}, {{ token(4) }}),
    ({{ mid(3) }}, {{ token(3) }}),
    ({{ mid(2) }}, {{ token(2) }}),
    ({{ mid(1) }}, {{ token(1) }});
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id {{ id_type }} NOT NULL,
        status varchar(7) NOT NULL
    );

    -- Act
    INSERT INTO #Actual (id, status)
    EXEC {{ names.verb('lease_status') }} @acks = @acks;

    -- Assert: one row per item, in id order; nothing changed.
    CREATE TABLE #Expected (position int NOT NULL, id {{ id_type }} NOT NULL, status varchar(7) NOT NULL);
    INSERT INTO #Expected (position, id, status)
    VALUES
    (1, {{ mid(1) }}, 'held'),
    (2, {{ mid(2) }}, 'lost'),
    (3, {{ mid(3) }}, 'expired'),
    (4, {{ mid(4) }}, 'lost'),
    (5, {{ mid(5) }}, 'dead'),
    (6, {{ mid(6) }}, 'gone');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 1, 'w', false), (2, 2, 'v', false), (3, 1, 'w', true), (4, 1, none, true)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test lease_status refuses a NULL token, the transaction usable]
AS
BEGIN
    -- Assemble: as the batch acknowledgements' check, inside the caller's (tSQLt's) transaction.
    SET XACT_ABORT ON;
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(1) }}, {{ token(1) }}),
    ({{ mid(2) }}, NULL);
    DECLARE @error int;
    DECLARE @message nvarchar(2048);

    -- Act
    BEGIN TRY
        EXEC {{ names.verb('lease_status') }} @acks = @acks;
    END TRY
    BEGIN CATCH
        SET @error = ERROR_NUMBER();
        SET @message = ERROR_MESSAGE();
    END CATCH;

    -- Assert
    DECLARE @state smallint = XACT_STATE();
    EXEC tSQLt.AssertEquals @Expected = {{ errors.invalid_argument }}, @Actual = @error;
    EXEC tSQLt.AssertLike @ExpectedPattern = N'%lease_status: the lease token of id % is NULL.', @Actual = @message;
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @state;
END;
GO

CREATE PROCEDURE {{ cls }}.[test lease_status refuses 1001 items and a repeated id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @many {{ acks }};
    INSERT INTO @many (id, lease_token)
{% if client_ids %}
    SELECT TOP (1001)
        NEWID() AS id,
        NEWID() AS lease_token
    FROM sys.all_columns;
{% else %}
    SELECT TOP (1001)
        ROW_NUMBER() OVER (ORDER BY c.object_id, c.column_id) AS id,
        NEWID() AS lease_token
    FROM sys.all_columns AS c;
{% endif %}
    DECLARE @twice {{ acks }};
    INSERT INTO @twice (id, lease_token)
    VALUES
    ({{ mid(1) }}, {{ token(1) }}),
    ({{ mid(1) }}, {{ token(2) }});
    DECLARE @many_error int;
    DECLARE @twice_error int;

    -- Act
    BEGIN TRY
        EXEC {{ names.verb('lease_status') }} @acks = @many;
    END TRY
    BEGIN CATCH
        SET @many_error = ERROR_NUMBER();
    END CATCH;
    BEGIN TRY
        EXEC {{ names.verb('lease_status') }} @acks = @twice;
    END TRY
    BEGIN CATCH
        SET @twice_error = ERROR_NUMBER();
    END CATCH;

    -- Assert
    EXEC tSQLt.AssertEquals @Expected = {{ errors.invalid_argument }}, @Actual = @many_error;
    EXEC tSQLt.AssertEquals @Expected = {{ errors.invalid_argument }}, @Actual = @twice_error;
END;
GO

-- fail_batch --------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test fail_batch retries, buries and reports a stale item as lost]
AS
BEGIN
    -- Assemble: w holds 1 (attempts left), 2 (its token in the batch is stale) and 3 (on its last
    -- attempt).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=1) }}
{{ insert_message(2, visible=60, leased_by='w', attempts=1, lease=2) }}
{{ insert_message(3, visible=60, leased_by='w', attempts=max_attempts, lease=3) }}
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(2) }}, {{ token(8) }}),
    ({{ mid(3) }}, {{ token(3) }}),
    ({{ mid(1) }}, {{ token(1) }});
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id {{ id_type }} NOT NULL,
        outcome varchar(8) NOT NULL
    );

    -- Act
    INSERT INTO #Actual (id, outcome)
    EXEC {{ names.verb('fail_batch') }}
        @acks = @acks,
        @worker = N'w',
        @error = N'timeout',
        @retry_after_seconds = 300;

    -- Assert: one row per item, in id order.
    CREATE TABLE #Expected (position int NOT NULL, id {{ id_type }} NOT NULL, outcome varchar(8) NOT NULL);
    INSERT INTO #Expected (position, id, outcome)
    VALUES
    (1, {{ mid(1) }}, 'retrying'),
    (2, {{ mid(2) }}, 'lost'),
    (3, {{ mid(3) }}, 'dead');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 1, none, false), (2, 1, 'w', false)]) }}
    DECLARE @retry_kept int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE
            m.id = {{ mid(1) }} AND m.last_error = N'timeout' AND m.lease_token IS NULL
            AND m.visible_at > DATEADD(SECOND, 290, @now)
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @retry_kept, @Message = N'error, token or retry time not kept';
    DECLARE @stale_untouched int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE
            m.id = {{ mid(2) }} AND m.last_error IS NULL
            AND m.lease_token = {{ token(2) }}
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @stale_untouched, @Message = N'the stale item changed its message';
{{ assert_dead([(3, max_attempts, 'timeout', 'w')]) }}
END;
GO

-- complete_next -----------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test complete_next completes and leases the next messages]
AS
BEGIN
    -- Assemble: w holds 1 (token 1); 2 and 3 are visible.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='w', attempts=1, lease=1) }}
{{ insert_message(2, visible=-30) }}
{{ insert_message(3, visible=-20) }}
    DECLARE @current uniqueidentifier = {{ token(1) }};
    CREATE TABLE #Next (
        position int IDENTITY (1, 1) NOT NULL,
{{ dequeue_columns() | replace(' NOT NULL', ' NULL') }},
        previous_completed bit NULL
    );

    -- Act
    INSERT INTO #Next (id, payload, enqueued_at, due_at, attempts, lease_token{{ gk }}, previous_completed)
    EXEC {{ names.verb('complete_next') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = @current,
        @batch_size = 2,
        @lease_seconds = 600;

    -- Assert: 1 is gone; 2 and 3 are w's, in claim order, each row carrying the completion.
    SELECT
        n.position,
        n.id,
        n.attempts,
        n.previous_completed,
        CONVERT(bit, IIF(n.lease_token = m.lease_token, 1, 0)) AS returned_the_stored_token
    INTO #Actual
    FROM #Next AS n
    INNER JOIN {{ t }} AS m ON n.id = m.id;

    CREATE TABLE #Expected (
        position int NOT NULL,
        id {{ id_type }} NULL,
        attempts int NULL,
        previous_completed bit NULL,
        returned_the_stored_token bit NULL
    );
    INSERT INTO #Expected (position, id, attempts, previous_completed, returned_the_stored_token)
    VALUES
    (1, {{ mid(2) }}, 1, 1, 1),
    (2, {{ mid(3) }}, 1, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(2, 1, 'w', false), (3, 1, 'w', false)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete_next with nothing ready returns one row with a NULL id]
AS
BEGIN
    -- Assemble: 2 is not due yet, and w's message 1 is gone (completed already, say).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(2, visible=3600) }}
    CREATE TABLE #Actual (
{{ dequeue_columns() | replace(' NOT NULL', ' NULL') }},
        previous_completed bit NULL
    );

    -- Act
    INSERT INTO #Actual (id, payload, enqueued_at, due_at, attempts, lease_token{{ gk }}, previous_completed)
    EXEC {{ names.verb('complete_next') }} @id = {{ mid(1) }}, @worker = N'w';

    -- Assert
    SELECT TOP (0)
        a.id,
        a.payload,
        a.enqueued_at,
        a.due_at,
        a.attempts,
        a.lease_token,
{% if groups %}
        a.group_key,
{% endif %}
        a.previous_completed
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (id, payload, enqueued_at, due_at, attempts, lease_token{{ gk }}, previous_completed)
    VALUES (NULL, NULL, NULL, NULL, NULL, NULL, {{ 'NULL, ' if groups }}0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(2, 0, none, false)]) }}
END;
GO
{% for arguments, label in ((["@id = " ~ mid(1), "@worker = N'w'", "@batch_size = 0"], 'batch_size 0'), (["@id = " ~ mid(1), "@worker = NULL"], 'a NULL worker')) %}

CREATE PROCEDURE {{ cls }}.[test complete_next refuses {{ label }} with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('complete_next') }}
        {{ arguments | join(',\n        ') }};
END;
GO
{% endfor %}

-- wait --------------------------------------------------------------------------------------------
-- A probe skips a row another session holds (READPAST): tSQLt runs in one session, whose own locks
-- never block it, so that case (and the wake-up by another connection's commit) is the
-- conformance suite's, against a real server.

CREATE PROCEDURE {{ cls }}.[test wait returns ready at once for a visible message]
AS
BEGIN
    -- Assemble: 1 is leased, 2 delayed, 3 visible since its lease expired.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='v', attempts=1, lease=1) }}
{{ insert_message(2, visible=3600) }}
{{ insert_message(3, visible=-1, leased_by='crashed', attempts=1, lease=3) }}
    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act: a timeout far longer than a test may take, so only "ready" ends it in time.
    INSERT INTO #Actual (ready)
    EXEC {{ names.verb('wait') }} @wait_ms = 20000;

    -- Assert: it claimed nothing.
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(1, 1, 'v', false), (2, 0, none, false), (3, 1, 'crashed', true)]) }}
END;
GO

{% if has_priority %}
CREATE PROCEDURE {{ cls }}.[test wait walks down to a lower priority level with a ready message]
AS
BEGIN
    -- Assemble: the top level holds only a live lease and a delayed message; a lower level holds
    -- a visible one. A probe of the top level alone would wait out the timeout and say 0.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='v', attempts=1, priority=9, lease=1) }}
{{ insert_message(2, visible=3600, priority=9) }}
{{ insert_message(3, priority=1) }}
    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ready)
    EXEC {{ names.verb('wait') }} @wait_ms = 120;

    -- Assert
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

{% endif %}
CREATE PROCEDURE {{ cls }}.[test wait returns 0 at the timeout when nothing is ready]
AS
BEGIN
    -- Assemble: a live lease and a delayed message only.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=60, leased_by='v', attempts=1, lease=1) }}
{{ insert_message(2, visible=3600) }}
    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ready)
    EXEC {{ names.verb('wait') }} @wait_ms = 120;

    -- Assert
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test wait in implicit-transaction mode leaves the transaction count]
AS
BEGIN
    -- Assemble: a manual-commit caller (IMPLICIT_TRANSACTIONS ON). tSQLt's own transaction is open,
    -- so this shows that wait leaves the caller's transaction count as it was (no BEGIN, no
    -- COMMIT, no error 266); the first probe opening a caller's implicit transaction at
    -- @@TRANCOUNT = 0 needs a session of its own (the conformance suite).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-5) }}
    CREATE TABLE #Actual (ready bit NOT NULL);
    SET IMPLICIT_TRANSACTIONS ON;
    DECLARE @before int = @@TRANCOUNT;

    -- Act
    INSERT INTO #Actual (ready)
    EXEC {{ names.verb('wait') }} @wait_ms = 100;

    -- Assert
    DECLARE @after int = @@TRANCOUNT;
    SET IMPLICIT_TRANSACTIONS OFF;
    EXEC tSQLt.AssertEquals @Expected = @before, @Actual = @after, @Message = N'wait changed the transaction count';
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% for value in ('NULL', '-1', '20001') %}

CREATE PROCEDURE {{ cls }}.[test wait refuses wait_ms {{ value }} with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = {{ errors.invalid_argument }},
        @ExpectedMessagePattern = N'%wait_ms must be between 0 and 20000%';

    -- Act
    EXEC {{ names.verb('wait') }} @wait_ms = {{ value }};
END;
GO
{% endfor %}

-- stats -------------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test stats counts ready, delayed, in_flight and dead]
AS
BEGIN
    -- Assemble: 1 and 2 ready (2's lease expired), 3 delayed, 4 and 5 in flight, 6 dead.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1, visible=-120) }}
{{ insert_message(2, visible=-5, leased_by='crashed', attempts=1) }}
{{ insert_message(3, visible=3600) }}
{{ insert_message(4, visible=60, leased_by='w', attempts=1) }}
{{ insert_message(5, visible=60, leased_by='w', attempts=1) }}
{{ insert_dead(6) }}
{{ stats_into_temp() }}

    -- Assert
    SELECT
        s.ready,
        s.delayed,
        s.in_flight,
        s.dead,
        s.estimated,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 119 AND 180, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.ready,
        a.delayed,
        a.in_flight,
        a.dead,
        a.estimated,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, delayed, in_flight, dead, estimated, age_of_the_oldest)
    VALUES (2, 1, 2, 1, 0, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

{# Expired leases of holders 'a' and 'b' around the count's limit: (case, a's count, b's count, b's
    lease expiry in seconds ago, estimated, exact ready or none). #}
{% for case, a_count, b_count, b_expired, estimated, ready in [
    ('10000 of one holder are exact', 10000, 0, 60, 0, 10000),
    ('5000 and 5001 of two are past the limit', 5000, 5001, 60, 1, none),
    ('past the limit the oldest is exact', 10001, 1, 600, 1, none)] %}
CREATE PROCEDURE {{ cls }}.[test stats of expired leases, {{ case }}]
AS
BEGIN
    -- Assemble: {{ a_count }} leases of 'a' that expired a minute ago{% if b_count %}, {{ b_count }} of 'b' that expired {{ b_expired }} seconds ago{% endif %}.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{% for holder, count, expired, first_id in [('a', a_count, 60, 0), ('b', b_count, b_expired, 100000)] if count %}
    INSERT INTO {{ t }} (
        id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}attempts, leased_by, leased_at, payload
    )
    SELECT TOP ({{ count }})
{% if client_ids %}
        NEWID() AS id,
        {{ first_id }} + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
{% else %}
        {{ first_id }} + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS id,
{% endif %}
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -3600, @now) AS due_at,
        DATEADD(SECOND, -{{ expired }}, @now) AS visible_at,
{% if has_priority %}
        0 AS priority,
{% endif %}
        1 AS attempts,
        N'{{ holder }}' AS leased_by,
        DATEADD(SECOND, -1800, @now) AS leased_at,
        {{ sample(1) }} AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
{% endfor %}
{{ stats_into_temp() }}

    -- Assert: the oldest expiry, exact whatever the count; the count exact up to the limit, and past
    -- it an estimate (the catalog's row count) of at least the limit and one.
    SELECT
        s.estimated,
        CONVERT(bit, IIF(s.ready {{ '= %d' % ready if ready is not none else '>= 10001' }}, 1, 0)) AS ready_as_expected,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN {{ [60, b_expired if b_count else 60] | max - 1 }} AND {{ ([60, b_expired if b_count else 60] | max) + 60 }}, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.estimated,
        a.ready_as_expected,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (estimated, ready_as_expected, age_of_the_oldest)
    VALUES ({{ estimated }}, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

{% endfor %}
{% if has_priority %}
CREATE PROCEDURE {{ cls }}.[test stats counts a lower level past a delayed count over the limit]
AS
BEGIN
    -- Assemble: 10,001 delayed messages at priority 5 and 3 ready ones at priority 1. The delayed
    -- count passes the limit at the top level; the walk still counts the ready ones below (it
    -- stopped there, and reported ready 0 as exact, with no oldest).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO {{ t }} (
        id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, priority, attempts, payload
    )
    SELECT TOP (10001)
{% if client_ids %}
        NEWID() AS id,
        ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
{% else %}
        ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS id,
{% endif %}
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, 3600, @now) AS due_at,
        DATEADD(SECOND, 3600, @now) AS visible_at,
        5 AS priority,
        0 AS attempts,
        {{ sample(1) }} AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
{{ insert_message(20001, visible=-120, priority=1) }}
{{ insert_message(20002, visible=-60, priority=1) }}
{{ insert_message(20003, visible=-60, priority=1) }}
{{ stats_into_temp() }}

    -- Assert: ready exact, the estimate on delayed, and the oldest is 20001's.
    SELECT
        s.ready,
        s.in_flight,
        s.estimated,
        CONVERT(bit, IIF(s.delayed >= 10001, 1, 0)) AS delayed_past_the_exact_limit,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 119 AND 180, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.ready,
        a.in_flight,
        a.estimated,
        a.delayed_past_the_exact_limit,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, in_flight, estimated, delayed_past_the_exact_limit, age_of_the_oldest)
    VALUES (3, 0, 1, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

{% endif %}
CREATE PROCEDURE {{ cls }}.[test stats past 10000 rows estimates from the catalog row count]
AS
BEGIN
    -- Assemble: 10,050 ready messages and 3 delayed ones. Each count stops at 10,001 rows; past that
    -- the table's row count in sys.partitions (which counts this transaction's own rows) less the
    -- exact counts stands in: ready comes out above 10,001 only through that estimate.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO {{ t }} (
        id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}attempts, payload
    )
    SELECT TOP (10050)
{% if client_ids %}
        NEWID() AS id,
        ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS seq,
{% else %}
        ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS id,
{% endif %}
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, -60, @now) AS due_at,
        DATEADD(SECOND, -60, @now) AS visible_at,
{% if has_priority %}
        0 AS priority,
{% endif %}
        0 AS attempts,
        {{ sample(1) }} AS payload
    FROM sys.all_columns AS a
    CROSS JOIN sys.all_columns AS b;
{{ insert_message(20001, visible=3600) }}
{{ insert_message(20002, visible=3600) }}
{{ insert_message(20003, visible=3600) }}
{{ stats_into_temp() }}

    -- Assert
    SELECT
        s.delayed,
        s.in_flight,
        s.dead,
        s.estimated,
        CONVERT(bit, IIF(s.ready > 10001, 1, 0)) AS ready_past_the_exact_limit
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.delayed,
        a.in_flight,
        a.dead,
        a.estimated,
        a.ready_past_the_exact_limit
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (delayed, in_flight, dead, estimated, ready_past_the_exact_limit)
    VALUES (3, 0, 0, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- purge -------------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test purge with older_than removes only older messages]
AS
BEGIN
    -- Assemble: every test message is enqueued an hour ago; 9 is newer.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1) }}
{{ insert_message(2, visible=60, leased_by='w', attempts=1) }}
    INSERT INTO {{ t }} (id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}attempts, payload)
    VALUES ({{ mid(9) }}, {{ '9, ' if client_ids }}@now, @now, @now, {{ '0, ' if has_priority }}0, {{ sample(9) }});
    DECLARE @cutoff datetime2(7) = DATEADD(MINUTE, -1, @now);
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('purge') }} @older_than = @cutoff, @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(9, 0, none, true)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge without older_than removes every message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1) }}
{{ insert_message(2, visible=3600) }}
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('purge') }} @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ t }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge takes at most max_rows, oldest first]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_message(1) }}
{{ insert_message(2) }}
{{ insert_message(3) }}
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('purge') }} @max_rows = 2;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(3, 0, none, true)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge refuses max_rows 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('purge') }} @max_rows = 0;
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge without max_rows in a transaction fails with 51001]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's: every chunk's locks would
    -- last until it ends.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('purge') }};
END;
GO

-- dead-letter handling ----------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test dead_list pages by id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    EXEC {{ cls }}.[index the faked dead-letter table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_dead(3) }}
{{ insert_dead(1) }}
{{ insert_dead(2) }}
    DECLARE @after {{ id_type }} = {{ mid(1) }};
    CREATE TABLE #Page (
        id {{ id_type }} NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
{% if has_priority %}
        priority int NOT NULL,
{% endif %}
{% if dedupe %}
        dedupe_key nvarchar(200) NULL,
{% endif %}
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL
    );

    -- Act: the page after message 1, one message long.
    INSERT INTO #Page
    EXEC {{ names.verb('dead_list') }} @after_id = @after, @page_size = 1;

    -- Assert
    SELECT
        p.id,
        p.attempts,
        p.last_error
    INTO #Actual
    FROM #Page AS p;

    SELECT TOP (0)
        a.id,
        a.attempts,
        a.last_error
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (id, attempts, last_error) VALUES ({{ mid(2) }}, {{ max_attempts }}, N'boom');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test dead_list without after_id starts at the lowest id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    EXEC {{ cls }}.[index the faked dead-letter table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_dead(3) }}
{{ insert_dead(1) }}
{{ insert_dead(2) }}
    CREATE TABLE #Page (
        position int IDENTITY (1, 1) NOT NULL,
        id {{ id_type }} NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL,
{% if has_priority %}
        priority int NOT NULL,
{% endif %}
{% if dedupe %}
        dedupe_key nvarchar(200) NULL,
{% endif %}
        attempts int NOT NULL,
        last_error nvarchar(4000) NULL,
        last_worker nvarchar(200) NULL,
        dead_at datetime2(7) NOT NULL
    );

    -- Act: the first page, two messages long, in the order it came.
    INSERT INTO #Page (
        id, payload, enqueued_at, due_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}attempts, last_error, last_worker, dead_at
    )
    EXEC {{ names.verb('dead_list') }} @page_size = 2;

    -- Assert
    SELECT
        p.position,
        p.id
    INTO #Actual
    FROM #Page AS p;

    CREATE TABLE #Expected (position int NOT NULL, id {{ id_type }} NOT NULL);
    INSERT INTO #Expected (position, id)
    VALUES
    (1, {{ mid(1) }}),
    (2, {{ mid(2) }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test dead_list refuses page_size 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    EXEC {{ cls }}.[index the faked dead-letter table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('dead_list') }} @page_size = 0;
END;
GO

CREATE PROCEDURE {{ cls }}.[test dead_requeue puts the message back with attempts reset]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_dead(7, 'poison') }}
    CREATE TABLE #Actual (requeued bit NOT NULL);

    -- Act
    INSERT INTO #Actual (requeued)
    EXEC {{ names.verb('dead_requeue') }} @id = {{ mid(7) }};

    -- Assert
    CREATE TABLE #Expected (requeued bit NOT NULL);
    INSERT INTO #Expected (requeued) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_queue([(7, 0, none, true)]) }}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test dead_requeue of an unknown id fails with 51004]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.not_found }};

    -- Act
    EXEC {{ names.verb('dead_requeue') }} @id = {{ mid(7) }};
END;
GO

CREATE PROCEDURE {{ cls }}.[test dead_requeue of an id queued again fails with 51001]
AS
BEGIN
    -- Assemble: message 7 is dead and its id is in the queue again ({% if client_ids %}a producer enqueued the same
    -- client id since{% else %}identity ids never repeat: a row put
    -- there by hand{% endif %}). The requeue must refuse it, not collide (2627).
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    SET IDENTITY_INSERT {{ t }} ON;
{{ insert_message(7) }}
    SET IDENTITY_INSERT {{ t }} OFF;
{{ insert_dead(7) }}
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = {{ errors.invalid_argument }},
        @ExpectedMessagePattern = N'%is queued already%';

    -- Act
    EXEC {{ names.verb('dead_requeue') }} @id = {{ mid(7) }};
END;
GO
{% if dedupe %}

CREATE PROCEDURE {{ cls }}.[test dead_requeue of a key enqueued again brings it back keyless]
AS
BEGIN
    -- Assemble: dead message 7 had key order-42, which message 1 holds now.
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    SET IDENTITY_INSERT {{ t }} ON;
{{ insert_message(1, key='order-42') }}
    SET IDENTITY_INSERT {{ t }} OFF;
{{ insert_dead(7) }}
    UPDATE {{ dead_t }}
    SET dedupe_key = N'order-42'
    WHERE id = {{ mid(7) }};
    CREATE TABLE #Actual (requeued bit NOT NULL);

    -- Act
    INSERT INTO #Actual (requeued)
    EXEC {{ names.verb('dead_requeue') }} @id = {{ mid(7) }};

    -- Assert: 7 is back, visible, without the key; 1 keeps it.
    CREATE TABLE #Expected (requeued bit NOT NULL);
    INSERT INTO #Expected (requeued) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    SELECT
        m.id,
        m.dedupe_key
    INTO #Keys
    FROM {{ t }} AS m;

    -- #ExpectedKeys takes #Keys' columns: dedupe_key keeps its BIN2 collation (a CREATE TABLE
    -- column has tempdb's, and AssertEqualsTable fails on the mix with Msg 451).
    SELECT TOP (0)
        k.id,
        k.dedupe_key
    INTO #ExpectedKeys
    FROM #Keys AS k;
    INSERT INTO #ExpectedKeys (id, dedupe_key)
    VALUES ({{ mid(1) }}, N'order-42'), ({{ mid(7) }}, NULL);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedKeys', @Actual = N'#Keys';
{{ assert_queue([(1, 0, none, true), (7, 0, none, true)]) }}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
END;
GO
{% endif %}

CREATE PROCEDURE {{ cls }}.[test dead_delete removes the dead-letter message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_dead(7) }}
{{ insert_dead(8) }}
    CREATE TABLE #Ignored (deleted bit NOT NULL); -- noqa: RF04

    -- Act
    INSERT INTO #Ignored
    EXEC {{ names.verb('dead_delete') }} @id = {{ mid(7) }};

    -- Assert
{{ assert_dead([(8, max_attempts, 'boom', 'w')]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dead_delete of an unknown id fails with 51004]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.not_found }};

    -- Act
    EXEC {{ names.verb('dead_delete') }} @id = {{ mid(7) }};
END;
GO
{% if history %}

-- history -----------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test history_purge removes history older than the cutoff]
AS
BEGIN
    -- Assemble: finished {{ opt.history_retention_days + 1 }} days ago, 1 day ago and now.
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1;
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO {{ history_t }} (
        id, enqueued_at, due_at, {{ 'priority, ' if has_priority }}started_at, finished_at, worker, attempts, payload
    )
    VALUES
    ({{ mid(1) }}, @now, @now, {{ '0, ' if has_priority }}@now, DATEADD(DAY, -{{ opt.history_retention_days + 1 }}, @now), N'w', 1, {{ sample(1) }}),
    ({{ mid(2) }}, @now, @now, {{ '0, ' if has_priority }}@now, DATEADD(DAY, -1, @now), N'w', 1, {{ sample(2) }}),
    ({{ mid(3) }}, @now, @now, {{ '0, ' if has_priority }}@now, @now, N'w', 1, {{ sample(3) }});
    CREATE TABLE #Actual (purged bigint NOT NULL);
    DECLARE @cutoff datetime2(7) = DATEADD(HOUR, -1, @now);

    -- Act: the retention default, then an explicit cutoff.
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('history_purge') }} @max_rows = 100;
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('history_purge') }} @older_than = @cutoff, @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (1), (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @left {{ id_type }} = (SELECT h.id FROM {{ history_t }} AS h);
    DECLARE @kept {{ id_type }} = {{ mid(3) }};
    EXEC tSQLt.AssertEquals @Expected = @kept, @Actual = @left;
END;
GO

CREATE PROCEDURE {{ cls }}.[test history_purge without max_rows in a transaction fails with 51001]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's: every chunk's locks would
    -- last until it ends.
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}';
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('history_purge') }};
END;
GO
{% endif %}
{% if opt.handler %}

-- process -----------------------------------------------------------------------------------------

{% set handler_parts = opt.handler.split('.') if '.' in opt.handler else [schema, opt.handler] %}
{% set handler_q = '[' ~ handler_parts[0] ~ '].[' ~ handler_parts[1] ~ ']' %}
{% set admin_role = '[' ~ schema ~ '_admin]' %}
{#- Act: process run as the admin-only user; Assert: what it raised, `expected` (`why` says what it
    means). Leaves @visible for the caller's own assertion. -#}
{% macro process_as_admin_only_user(expected, why) %}
    DECLARE @visible int;
    DECLARE @error_number int;

    -- Act
    EXEC {{ cls }}.[as test_admin_only_user]
        @visible = @visible OUTPUT, @error_number = @error_number OUTPUT;

    -- Assert: {{ expected }}, {{ why }}.
    EXEC tSQLt.AssertEquals @Expected = {{ expected }}, @Actual = @error_number;
{%- endmacro %}
-- The handler process calls, of the queue's signature; any procedure of that name is set aside
-- first (tSQLt.RemoveObject renames it, and the test's rollback brings it back).
CREATE PROCEDURE {{ cls }}.[create the handler]
AS
BEGIN
    IF SCHEMA_ID(N'{{ handler_parts[0] }}') IS NULL EXEC (N'CREATE SCHEMA [{{ handler_parts[0] }}];');
    EXEC tSQLt.RemoveObject @ObjectName = N'{{ handler_q }}', @IfExists = 1;
    EXEC (N'CREATE PROCEDURE {{ handler_q }} @id {{ id_type }}, @payload {{ payload_type }}
        AS SET NOCOUNT ON;');
END;
GO

-- A handler of the handler's name whose payload parameter is not the queue's payload type (a
-- varbinary(4000) would also cut every longer binary payload short without an error).
CREATE PROCEDURE {{ cls }}.[create a handler of other parameter types]
AS
BEGIN
    IF SCHEMA_ID(N'{{ handler_parts[0] }}') IS NULL EXEC (N'CREATE SCHEMA [{{ handler_parts[0] }}];');
    EXEC tSQLt.RemoveObject @ObjectName = N'{{ handler_q }}', @IfExists = 1;
    EXEC (N'CREATE PROCEDURE {{ handler_q }} @id {{ id_type }}, @payload varbinary(4000)
        AS SET NOCOUNT ON;');
END;
GO

CREATE PROCEDURE {{ cls }}.[test process refuses an open transaction with 51003]
AS
BEGIN
    -- Assemble: tSQLt runs every test in a transaction, which is exactly the caller's transaction
    -- process must refuse (it commits once per message). Its handler exists: process checks the
    -- handler first.
    EXEC {{ cls }}.[create the handler];
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.in_transaction }};

    -- Act
    EXEC {{ names.verb('process') }} @time_budget_seconds = 1;
END;
GO

-- A user in the admin role alone, [test_admin_only_user], and [as test_admin_only_user], which runs
-- process as that user: a procedure WITH EXECUTE AS it (sqlfluff cannot parse a statement EXECUTE AS /
-- REVERT; the user and the procedure go with tSQLt's rollback), process by dynamic SQL, so that the
-- user's own EXECUTE permission is checked, not the ownership chain. @visible is the handler's
-- OBJECT_ID as the user sees it, @error_number what process raised (tSQLt's own transaction hides
-- the loop: process refuses it, 51003, right after the handler check, so 51003 and not 51005,
-- no_handler, shows that the check let the user pass).
CREATE PROCEDURE {{ cls }}.[create the admin-only user]
AS
BEGIN
    CREATE USER [test_admin_only_user] WITHOUT LOGIN;
    ALTER ROLE {{ admin_role }} ADD MEMBER [test_admin_only_user];
    EXEC (N'CREATE PROCEDURE {{ cls }}.[as test_admin_only_user]
    @visible int OUTPUT,
    @error_number int OUTPUT
WITH EXECUTE AS ''test_admin_only_user''
AS
BEGIN
    SET NOCOUNT ON;
    SET @visible = OBJECT_ID(N''{{ handler_q }}'', N''P'');
    BEGIN TRY
        EXEC (N''EXEC {{ names.verb('process') }} @time_budget_seconds = 1;'');
    END TRY
    BEGIN CATCH
        SET @error_number = ERROR_NUMBER();
    END CATCH;
END;');
END;
GO

-- The handler double given another owner than process's: process no longer reaches it through the
-- ownership chain, and SQL Server checks the caller's EXECUTE on it at the call.
CREATE PROCEDURE {{ cls }}.[give the handler another owner]
AS
BEGIN
    EXEC {{ cls }}.[create the handler];
    CREATE USER [test_handler_owner] WITHOUT LOGIN;
    ALTER AUTHORIZATION ON OBJECT::{{ handler_q }} TO [test_handler_owner];
END;
GO

CREATE PROCEDURE {{ cls }}.[test process finds its handler for a caller in the admin role only]
AS
BEGIN
    -- Assemble: a user in the admin role alone holds no permission on the handler and sees none of
    -- its metadata (OBJECT_ID is NULL for it); process runs the handler through the ownership chain.
    EXEC {{ cls }}.[create the handler];
    EXEC {{ cls }}.[create the admin-only user];
{{ process_as_admin_only_user(errors.in_transaction, 'the check passed') }}
    EXEC tSQLt.AssertEquals @Expected = NULL, @Actual = @visible, @Message = N'the user sees the handler: no test';
END;
GO

CREATE PROCEDURE {{ cls }}.[test process refuses an unchained handler without EXECUTE]
AS
BEGIN
    -- Assemble: the handler has another owner, and the admin-only user holds no EXECUTE on it:
    -- every call would fail with 229 (review fix19 SHOULD-1).
    EXEC {{ cls }}.[give the handler another owner];
    EXEC {{ cls }}.[create the admin-only user];
{{ process_as_admin_only_user(errors.no_handler, 'no_handler, before the transaction check (51003: the check let it pass)') }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test process accepts an unchained handler with EXECUTE]
AS
BEGIN
    -- Assemble: the same, and the admin-only user granted EXECUTE on the handler: process asks in
    -- the caller's context (HAS_PERMS_BY_NAME of the handler's bracketed name, class OBJECT).
    EXEC {{ cls }}.[give the handler another owner];
    EXEC {{ cls }}.[create the admin-only user];
    GRANT EXECUTE ON OBJECT::{{ handler_q }} TO [test_admin_only_user];
{{ process_as_admin_only_user(errors.in_transaction, 'the handler check passed (51005 if it refused)') }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test process refuses a handler of other parameter types with 51005]
AS
BEGIN
    -- Assemble
    EXEC {{ cls }}.[create a handler of other parameter types];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.no_handler }};

    -- Act
    EXEC {{ names.verb('process') }} @time_budget_seconds = 1;
END;
GO

CREATE PROCEDURE {{ cls }}.[test process refuses a missing handler with 51005]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.RemoveObject @ObjectName = N'{{ handler_q }}', @IfExists = 1;
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = {{ errors.no_handler }}, @ExpectedMessagePattern = N'%does not exist%';

    -- Act
    EXEC {{ names.verb('process') }} @time_budget_seconds = 1;
END;
GO

CREATE PROCEDURE {{ cls }}.[test process refuses with 51005 when its handler check could not run]
AS
BEGIN
    -- Assemble: the check replaced by a spy, which leaves its outputs NULL. This proves the branch
    -- after a check that could not run, not the sequence on a server (15517 at the EXECUTE AS entry,
    -- ending that statement only, process going on to this branch): unproven here, and under tSQLt's
    -- TRY a real 15517 would reach the test as 15517, not as 51005.
    EXEC tSQLt.SpyProcedure @ProcedureName = N'{{ names.verb('process_handler') }}';
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = {{ errors.no_handler }}, @ExpectedMessagePattern = N'%could not check handler procedure%';

    -- Act
    EXEC {{ names.verb('process') }} @time_budget_seconds = 1;
END;
GO

{# The NoTransaction process tests' Assemble: the tables faked (process commits once per message,
    so it refuses tSQLt's transaction: these run outside it, and tSQLt.UndoTestDoubles drops the fakes
    with whatever was committed into them), and the catalog's handler replaced by a double whose
    body is `body` (a real handler is moved away by tSQLt.RemoveObjectIfExists and comes back after
    the test; the double carries the marker the clean-up drops it by). -#}
{% macro process_assemble(body) %}
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1;
{% endif %}
    -- The handler's schema may not exist (deploy creates the queue's schema only): created here,
    -- remembered in the session context, dropped by the clean-up once the double is gone.
    IF SCHEMA_ID(N'{{ handler_parts[0] }}') IS NULL
        BEGIN
            EXEC (N'CREATE SCHEMA [{{ handler_parts[0] }}];');
            EXEC sys.sp_set_session_context @key = N'tablequeue test created schema', @value = 1;
        END;
    EXEC tSQLt.RemoveObjectIfExists @ObjectName = N'{{ handler_name }}';
    EXEC (N'CREATE PROCEDURE {{ handler_name }}
    @id {{ id_type }},
    @payload {{ payload_type }}
AS
BEGIN
    /* tablequeue tSQLt handler double */
    SET NOCOUNT ON;
    {{ body }}
END;');
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{%- endmacro %}
{#- The handler's quoted name (handler_name) is set with the clean-up procedure. -#}

--[@tSQLt:NoTransaction]('{{ cls }}.[undo what a test outside a transaction left]')
CREATE PROCEDURE {{ cls }}.[test process runs the handler on each message and completes it]
AS
BEGIN
    -- Assemble: a handler that fails unless it is given a queued message's id with its payload,
    -- and counts its calls in the session context (not transactional: process's commits and
    -- rollbacks leave it; a #temp table would be unknown where the double is created).
    EXEC sys.sp_set_session_context @key = N'test process calls', @value = 0;
{{ process_assemble("IF NOT EXISTS (SELECT 1 FROM " ~ t ~ " AS m WHERE m.id = @id AND m.payload = @payload) THROW 50000, N''not the queued message'', 1;
    DECLARE @calls int = CONVERT(int, SESSION_CONTEXT(N''test process calls'')) + 1;
    EXEC sys.sp_set_session_context @key = N''test process calls'', @value = @calls;") }}
{{ insert_message(1) }}
{{ insert_message(2) }}

    -- Act: its one row (processed, completed, failed) goes to the caller: INSERT ... EXEC would run it
    -- inside the INSERT's transaction, which it refuses.
    EXEC {{ names.verb('process') }} @time_budget_seconds = 60;

    -- Assert: the handler ran once on each message (a call with another id or payload raises, and
    -- the message would then not be completed); both completed{% if history %} (into the history){% endif %}, none failed.
    DECLARE @calls int = CONVERT(int, SESSION_CONTEXT(N'test process calls'));
    EXEC tSQLt.AssertEquals @Expected = 2, @Actual = @calls, @Message = N'handler calls';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ t }}';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
{% if history %}
    SELECT h.id
    INTO #Done
    FROM {{ history_t }} AS h
    WHERE h.worker LIKE N'process:%';

    CREATE TABLE #ExpectedDone (id {{ id_type }} NOT NULL);
    INSERT INTO #ExpectedDone (id)
    VALUES ({{ mid(1) }}), ({{ mid(2) }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedDone', @Actual = N'#Done';
{% endif %}
END;
GO

--[@tSQLt:NoTransaction]('{{ cls }}.[undo what a test outside a transaction left]')
CREATE PROCEDURE {{ cls }}.[test process fails with the handler's error until the message is dead]
AS
BEGIN
    -- Assemble: a handler that always raises. process fails the message with no retry delay, so it
    -- takes it again at once, until the {{ max_attempts }}th attempt buries it.
{{ process_assemble("THROW 50000, N''handler says no'', 1;") }}
{{ insert_message(1) }}

    -- Act
    EXEC {{ names.verb('process') }} @time_budget_seconds = 60;

    -- Assert: dead after {{ max_attempts }} attempts, with the handler's error and the process worker.
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ t }}';
    SELECT
        d.id,
        d.attempts,
        CONVERT(bit, IIF(d.last_error LIKE N'error 50000 in %handler says no%', 1, 0)) AS handler_error,
        CONVERT(bit, IIF(d.last_worker LIKE N'process:%', 1, 0)) AS by_process
    INTO #Actual
    FROM {{ dead_t }} AS d;

    CREATE TABLE #Expected (
        id {{ id_type }} NOT NULL,
        attempts int NULL,
        handler_error bit NULL,
        by_process bit NULL
    );
    INSERT INTO #Expected (id, attempts, handler_error, by_process)
    VALUES ({{ mid(1) }}, {{ max_attempts }}, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

--[@tSQLt:NoTransaction]('{{ cls }}.[undo what a test outside a transaction left]')
CREATE PROCEDURE {{ cls }}.[test process takes no message after its time budget ends]
AS
BEGIN
    -- Assemble: three ready messages and a handler that takes longer than the whole budget (1
    -- second): whatever the server's speed, the budget has ended when the first message is done.
{{ process_assemble("WAITFOR DELAY ''00:00:01.200'';") }}
{{ insert_message(1) }}
{{ insert_message(2) }}
{{ insert_message(3) }}

    -- Act
    EXEC {{ names.verb('process') }} @time_budget_seconds = 1;

    -- Assert: 1 completed; 2 and 3 never claimed (no attempt, no lease).
{{ assert_queue([(2, 0, none, true), (3, 0, none, true)]) }}
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ dead_t }}';
END;
GO
{% endif %}
{% if groups %}

-- message groups (docs/queue-kinds.md, "SQL Server (work)") -------------------------------------
-- tSQLt runs each test in one transaction of one session, and a session never skips its own locks:
-- here a group is busy only through its in-flight message, which one session shows; a group that
-- another session's claim or acknowledgement holds for an instant (skipped by READPAST, waited for
-- by an acknowledgement), and producers that never wait, need two sessions: the conformance suite
-- (tests/conformance/test_groups.py) runs those against a real server.
{% set groups_t = names.obj('_groups') %}
{{ pins.fake_helper(cls, groups_t, pins.groups_pinned, 'groups') }}
{#- The queue table and the groups table faked, each with the indexes the verbs pin (the groups
    table's key is the index its hints name, built from its DDL's one source, _pinned_indexes.sql);
    identity: the queue table keeps its identity and defaults, for the tests that enqueue. -#}
{% macro fake_groups(identity=false) %}
    EXEC tSQLt.FakeTable @TableName = N'{{ t }}'{{ ', @Identity = 1, @Defaults = 1' if identity }};
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ groups_t }}';
    EXEC {{ cls }}.[index the faked groups table];
{%- endmacro %}
{#- Both tables faked, grouped messages and their groups' rows in place: rows (n, group, head,
    visible, leased_by, attempts, lease), in_flight {group: n}. -#}
{% macro assemble_groups(rows, in_flight={}) %}
{{ fake_groups() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{% if rows %}
    INSERT INTO {{ t }} (
        id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, attempts, leased_by, leased_at, lease_token,
        group_key, group_head, payload
    )
    VALUES
{% for n, group, head, visible, leased_by, attempts, lease in rows %}
    (
        {{ mid(n) }}, {{ (n ~ ', ') if client_ids }}DATEADD(SECOND, -3600, @now), DATEADD(SECOND, -3600, @now),
        DATEADD(SECOND, {{ visible }}, @now), {{ attempts }}, {{ ("N'" ~ leased_by ~ "'") if leased_by else 'NULL' }},
        {{ 'DATEADD(SECOND, -10, @now)' if leased_by else 'NULL' }}, {{ token(lease) if lease else 'NULL' }},
        N'{{ group }}', {{ head }}, {{ sample(n) }}
    ){{ ';' if loop.last else ',' }}
{% endfor %}
    INSERT INTO {{ groups_t }} (group_key, in_flight)
    VALUES
{% for group in rows | map(attribute=1) | unique %}
    (N'{{ group }}', {{ mid(in_flight[group]) if group in in_flight else 'NULL' }}){{ ';' if loop.last else ',' }}
{% endfor %}
{% endif %}
{%- endmacro %}
{#- The rows of `source` (its `columns`: (name, #table type)) against `rows` (SQL literals), as
    #<name> and #Expected<name>. -#}
{% macro assert_rows(name, source, columns, rows) %}
    SELECT
{% for column, _ in columns %}
        s.{{ column }}{{ ',' if not loop.last }}
{% endfor %}
    INTO #{{ name }}
    FROM {{ source }} AS s;

    CREATE TABLE #Expected{{ name }} ({% for column, type in columns %}{{ column }} {{ type }}{{ ', ' if not loop.last }}{% endfor %});
{% if rows %}
    INSERT INTO #Expected{{ name }} ({{ columns | map(attribute=0) | join(', ') }})
    VALUES
{% for row in rows %}
    ({{ row | join(', ') }}){{ ';' if loop.last else ',' }}
{% endfor %}
{% endif %}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected{{ name }}', @Actual = N'#{{ name }}';
{%- endmacro %}
{#- The groups' in-flight messages against (group, n or none); tag: a second check in one test. -#}
{% macro assert_in_flight(expected, tag='') %}
{% set rows = [] %}
{% for group, n in expected %}{% set _ = rows.append(["N'" ~ group ~ "'", mid(n) if n else 'NULL']) %}{% endfor %}
{{ assert_rows('InFlight' ~ tag, groups_t, [('group_key', 'nvarchar(200) NOT NULL'), ('in_flight', id_type ~ ' NULL')], rows) }}
{%- endmacro %}
{#- Every queued message's group_head flag against (n, flag or none): a settle that leaves a stale
    flag (a second head candidate, or none) shows here before any claim trips over it. -#}
{% macro assert_heads(expected, tag='') %}
{% set rows = [] %}
{% for n, head in expected %}{% set _ = rows.append([mid(n), 'NULL' if head is none else head]) %}{% endfor %}
{{ assert_rows('Heads' ~ tag, t, [('id', id_type ~ ' NOT NULL'), ('group_head', 'bit NULL')], rows) }}
{%- endmacro %}
{#- The groups' rows and the messages' flags: what a settle leaves. -#}
{% macro assert_group(in_flight, heads, tag='') %}
{{ assert_in_flight(in_flight, tag) }}
{{ assert_heads(heads, tag) }}
{%- endmacro %}
{#- Message n enqueued into group (its id: the faked identity's next value, or n's client id). -#}
{% macro enqueue_grouped(n, group) %}
    INSERT INTO #Enqueued (id, duplicate)
    EXEC {{ names.verb('enqueue') }}
        @payload = {{ sample(n) }},{% if client_ids %}

        @id = {{ mid(n) }},{% endif %}

        @group_key = N'{{ group }}';
{%- endmacro %}
{#- 1 enqueued into group a (a new key), then leased to w: a's in-flight message. -#}
{% macro enqueue_in_flight() %}
{{ fake_groups(identity=true) }}
    CREATE TABLE #Enqueued (id {{ id_type }} NOT NULL, duplicate bit NOT NULL);
{{ enqueue_grouped(1, 'a') }}
{{ dequeue_into_actual(1, 'w', 600, tag='1') }}
{{ expect_dequeued([(1, 1)], tag='1') }}
{%- endmacro %}

CREATE PROCEDURE {{ cls }}.[test enqueue and enqueue_batch head only a group's first message]
AS
BEGIN
    -- Assemble: 1 into group a, a new key (its groups row is created and 1 heads it), then leased.
{{ enqueue_in_flight() }}
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, group_key{{ ', id' if client_ids }})
    VALUES
{% for n, group in [(3, 'b'), (4, 'a'), (5, 'b'), (6, 'c'), (7, none)] %}
    ({{ loop.index }}, {{ sample(n) }}, {{ ("N'" ~ group ~ "'") if group else 'NULL' }}{{ (', ' ~ mid(n)) if client_ids }}){{ ';' if loop.last else ',' }}
{% endfor %}
    CREATE TABLE #Returned (ordinal int NOT NULL, id {{ id_type }} NOT NULL, duplicate bit NOT NULL);

    -- Act: 2 into a, whose message is in flight; then a batch into b (a new key), a, b, c (new) and
    -- no group.
{{ enqueue_grouped(2, 'a') }}
    INSERT INTO #Returned (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert: 3 heads b (5, b's second item, waits), 6 heads c; 2 and 4 wait behind a's in-flight 1;
    -- a's row keeps 1 in flight.
{{ assert_group([('a', 1), ('b', none), ('c', none)],
                [(1, 1), (2, 0), (3, 1), (4, 0), (5, 0), (6, 1), (7, none)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue hands out the head of each group, one message per group]
AS
BEGIN
    -- Assemble: a holds 1 (its head) and 2, b only 3; a batch of ten. (Review M1: the head search
    -- kept the tie of a's waiting 2 when b had no waiting message, picked the NULL id and gave b
    -- nothing.)
{{ assemble_groups([(1, 'a', 1, -60, none, 0, none), (2, 'a', 0, -50, none, 0, none),
                    (3, 'b', 1, -40, none, 0, none)]) }}
{{ dequeue_into_actual(10, 'w', 600) }}

    -- Assert: the heads, oldest first, each now its group's in-flight message; 2 waits.
{{ expect_dequeued([(1, 1), (3, 1)]) }}
{{ assert_group([('a', 1), ('b', 3)], [(1, 1), (2, 0), (3, 1)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue in a batch takes the oldest heads of different groups]
AS
BEGIN
    -- Assemble: three groups with one due head each; a batch of two.
{{ assemble_groups([(1, 'c', 1, -20, none, 0, none), (2, 'a', 1, -60, none, 0, none),
                    (3, 'b', 1, -40, none, 0, none), (4, 'a', 0, -50, none, 0, none)]) }}
{{ dequeue_into_actual(2, 'w', 600) }}

    -- Assert
{{ expect_dequeued([(2, 1), (3, 1)]) }}
{{ assert_in_flight([('a', 2), ('b', 3), ('c', none)]) }}
END;
GO

{#- w fails 1 under lease token `token` (an expression) with `retry_after`; the outcome must be
    `outcome`. -#}
{% macro fail_one(token, retry_after, outcome) %}
    CREATE TABLE #Outcome (outcome varchar(8) NULL);
    INSERT INTO #Outcome (outcome)
    EXEC {{ names.verb('fail') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @error = N'boom',
        @retry_after_seconds = {{ retry_after }},
        @lease_token = {{ token }};
    DECLARE @outcome varchar(8) = (SELECT o.outcome FROM #Outcome AS o);
    EXEC tSQLt.AssertEquals @Expected = '{{ outcome }}', @Actual = @outcome, @Message = N'fail';
{%- endmacro %}
{#- w fails 1, leased in #Dequeued1, with that lease's token: a retry. -#}
{% macro fail_leased(retry_after) %}
    DECLARE @token uniqueidentifier = (
        SELECT d.lease_token
        FROM #Dequeued1 AS d
        WHERE d.id = {{ mid(1) }}
    );
{{ fail_one('@token', retry_after, 'retrying') }}
{%- endmacro %}

CREATE PROCEDURE {{ cls }}.[test a failed head retries before the group's later messages]
AS
BEGIN
    -- Assemble: 1 heads group a, 2 waits behind it; w leases 1 and fails it, no retry delay.
{{ assemble_groups([(1, 'a', 1, -60, none, 0, none), (2, 'a', 0, -50, none, 0, none)]) }}
{{ dequeue_into_actual(1, 'w', 600, tag='1') }}
{{ expect_dequeued([(1, 1)], tag='1') }}
{{ fail_leased(0) }}
    -- The retry keeps its group: 1 in flight, still the head.
{{ assert_group([('a', 1)], [(1, 1), (2, 0)], tag='1') }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert: the retry, its second attempt; 2 still waits.
{{ expect_dequeued([(1, 2)]) }}
{{ assert_group([('a', 1)], [(1, 1), (2, 0)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test a group whose head waits for its retry hands out nothing]
AS
BEGIN
    -- Assemble: as above, the retry a minute away.
{{ assemble_groups([(1, 'a', 1, -60, none, 0, none), (2, 'a', 0, -50, none, 0, none)]) }}
{{ dequeue_into_actual(1, 'w', 600, tag='1') }}
{{ expect_dequeued([(1, 1)], tag='1') }}
{{ fail_leased(60) }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert: nothing, 2 included.
{{ expect_dequeued([]) }}
{{ assert_group([('a', 1)], [(1, 1), (2, 0)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test an older id behind the in-flight message waits for it]
AS
BEGIN
    -- Assemble: 2 failed (in flight, its retry due now); 1, older, waits behind it: the state a
    -- dead_requeue of 1 leaves while 2 is in flight (fail never makes it: a retry keeps its head,
    -- see the two tests above for fail's own sequence).
{{ assemble_groups([(1, 'a', 0, -60, none, 0, none), (2, 'a', 1, -5, none, 1, none)], {'a': 2}) }}
{{ dequeue_into_actual(10, 'w', 600) }}

    -- Assert: the retry, its second attempt; 1 still waits.
{{ expect_dequeued([(2, 2)]) }}
{{ assert_in_flight([('a', 2)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test release keeps the group: the same message comes back next]
AS
BEGIN
    -- Assemble: 1 is leased to w (in flight, its first attempt), 2 waits behind it.
{{ assemble_groups([(1, 'a', 1, 600, 'w', 1, 1), (2, 'a', 0, -60, none, 0, none)], {'a': 1}) }}
    CREATE TABLE #Released (released bit NULL);
    INSERT INTO #Released (released)
    EXEC {{ names.verb('release') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = {{ token(1) }};
    DECLARE @released bit = (SELECT r.released FROM #Released AS r);
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @released, @Message = N'released';
    -- release changes no group: 1 in flight, still the head.
{{ assert_group([('a', 1)], [(1, 1), (2, 0)], tag='1') }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert: 1 again, on the attempt release gave back; 2 still waits.
{{ expect_dequeued([(1, 1)]) }}
{{ assert_group([('a', 1)], [(1, 1), (2, 0)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete of the head unblocks its group]
AS
BEGIN
    -- Assemble: 1 is leased to w (in flight), 2 waits behind it.
{{ assemble_groups([(1, 'a', 1, 600, 'w', 1, 1), (2, 'a', 0, -60, none, 0, none)], {'a': 1}) }}
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    CREATE TABLE #Completed (completed bit NULL);
    INSERT INTO #Completed (completed)
    EXEC {{ names.verb('complete') }}
        @id = {{ mid(1) }},
        @worker = N'w',
        @lease_token = {{ token(1) }};
{{ assert_group([('a', none)], [(2, 1)], tag='1') }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert: 2 is the group's head and goes to the next worker.
{{ expect_dequeued([(2, 1)]) }}
{{ assert_in_flight([('a', 2)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test complete_batch settles each group of the batch]
AS
BEGIN
    -- Assemble: w holds 1 (group a) and 3 (group b), each in flight; 2 and 4 wait behind them.
{{ assemble_groups([(1, 'a', 1, 600, 'w', 1, 1), (2, 'a', 0, -60, none, 0, none),
                    (3, 'b', 1, 600, 'w', 1, 3), (4, 'b', 0, -50, none, 0, none)], {'a': 1, 'b': 3}) }}
{% if history %}
    EXEC tSQLt.FakeTable @TableName = N'{{ history_t }}', @Identity = 1, @ComputedColumns = 1;
{% endif %}
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(3) }}, {{ token(3) }}),
    ({{ mid(1) }}, {{ token(1) }});
    CREATE TABLE #Completed (id {{ id_type }} NOT NULL, completed bit NOT NULL);
    INSERT INTO #Completed (id, completed)
    EXEC {{ names.verb('complete_batch') }} @acks = @acks, @worker = N'w';
    DECLARE @completed int = (
        SELECT COUNT(*)
        FROM #Completed AS c
        WHERE c.completed = 1
    );
    EXEC tSQLt.AssertEquals @Expected = 2, @Actual = @completed, @Message = N'completed';
    -- Both groups settled: nothing in flight, 2 and 4 their heads.
{{ assert_group([('a', none), ('b', none)], [(2, 1), (4, 1)], tag='1') }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert
{{ expect_dequeued([(2, 1), (4, 1)]) }}
{{ assert_in_flight([('a', 2), ('b', 4)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test fail_batch keeps a retry in flight and settles a burial]
AS
BEGIN
    -- Assemble: w holds 1 (group a, attempts left) and 3 (group b, its last attempt), each in
    -- flight; 2 and 4 wait behind them.
{{ assemble_groups([(1, 'a', 1, 600, 'w', 1, 1), (2, 'a', 0, -60, none, 0, none),
                    (3, 'b', 1, 600, 'w', max_attempts, 3), (4, 'b', 0, -50, none, 0, none)],
                   {'a': 1, 'b': 3}) }}
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @acks {{ acks }};
    INSERT INTO @acks (id, lease_token)
    VALUES
    ({{ mid(3) }}, {{ token(3) }}),
    ({{ mid(1) }}, {{ token(1) }});
    CREATE TABLE #Outcomes (id {{ id_type }} NOT NULL, outcome varchar(8) NOT NULL);
    INSERT INTO #Outcomes (id, outcome)
    EXEC {{ names.verb('fail_batch') }}
        @acks = @acks,
        @worker = N'w',
        @error = N'boom',
        @retry_after_seconds = 0;
    CREATE TABLE #ExpectedOutcomes (id {{ id_type }} NOT NULL, outcome varchar(8) NOT NULL);
    INSERT INTO #ExpectedOutcomes (id, outcome)
    VALUES
    ({{ mid(1) }}, 'retrying'),
    ({{ mid(3) }}, 'dead');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedOutcomes', @Actual = N'#Outcomes';
    -- a keeps 1 in flight (its head); b's next message, 4, is its head.
{{ assert_group([('a', 1), ('b', none)], [(1, 1), (2, 0), (4, 1)], tag='1') }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert: 4 (its due time is the older), then 1's retry; 2 still waits.
{{ expect_dequeued([(4, 1), (1, 2)]) }}
{{ assert_in_flight([('a', 1), ('b', 4)]) }}
{{ assert_dead([(3, max_attempts, 'boom', 'w')]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test an expired lease unblocks the group with its head]
AS
BEGIN
    -- Assemble: w's lease of 1 expired 5 seconds ago; 2 waits behind it.
{{ assemble_groups([(1, 'a', 1, -5, 'w', 1, 1), (2, 'a', 0, -60, none, 0, none)], {'a': 1}) }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert: v gets 1 again (its second attempt), not 2.
{{ expect_dequeued([(1, 2)]) }}
{{ assert_in_flight([('a', 1)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue buries an exhausted head and hands out the next]
AS
BEGIN
    -- Assemble: w's lease of 1, its last attempt, expired 5 seconds ago; 2 waits behind it.
{{ assemble_groups([(1, 'a', 1, -5, 'w', max_attempts, 1), (2, 'a', 0, -60, none, 0, none)], {'a': 1}) }}
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert: the claim buried 1 and moved the group on in the same call: 2 is out.
{{ expect_dequeued([(2, 1)]) }}
{{ assert_group([('a', 2)], [(2, 1)]) }}
{{ assert_dead([(1, max_attempts, 'lease expired', 'w')]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test fail to the dead-letter table unblocks the group]
AS
BEGIN
    -- Assemble: 1 is leased to w on its last attempt; 2 waits behind it.
{{ assemble_groups([(1, 'a', 1, 600, 'w', max_attempts, 1), (2, 'a', 0, -60, none, 0, none)], {'a': 1}) }}
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
{{ fail_one(token(1), 0, 'dead') }}
{{ assert_group([('a', none)], [(2, 1)], tag='1') }}
{{ dequeue_into_actual(10, 'v', 600) }}

    -- Assert
{{ expect_dequeued([(2, 1)]) }}
{{ assert_in_flight([('a', 2)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge of the in-flight head lets the next one out]
AS
BEGIN
    -- Assemble: 1 is leased to w (in flight), 2 waits behind it.
{{ assemble_groups([(1, 'a', 1, 600, 'w', 1, 1), (2, 'a', 0, -60, none, 0, none)], {'a': 1}) }}
    CREATE TABLE #Purged (purged bigint NULL);

    -- Act: the oldest message, 1. (max_rows: in a transaction, tSQLt's here, purge requires it, and
    -- it runs each chunk in that transaction instead of one of its own.)
    INSERT INTO #Purged (purged)
    EXEC {{ names.verb('purge') }} @max_rows = 1;

    -- Assert: 1 is gone and its group settled: nothing in flight, 2 the head, and out next.
    DECLARE @purged bigint = (SELECT p.purged FROM #Purged AS p);
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @purged, @Message = N'purged';
{{ assert_group([('a', none)], [(2, 1)], tag='1') }}
{{ dequeue_into_actual(10, 'v', 600, tag='2') }}
{{ expect_dequeued([(2, 1)], tag='2') }}
{{ assert_in_flight([('a', 2)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test stats counts every state of grouped and other messages]
AS
BEGIN
    -- Assemble: a's head 1 under a live lease, 2 behind it; b's head 3 not yet due, 4 behind it; c's
    -- head 5 under an expired lease; 6 and 7 have no group, 6 due, 7 not yet.
{{ assemble_groups([(1, 'a', 1, 600, 'w', 1, 1), (2, 'a', 0, -60, none, 0, none),
                    (3, 'b', 1, 3600, none, 0, none), (4, 'b', 0, -60, none, 0, none),
                    (5, 'c', 1, -5, 'crashed', 1, 5)], in_flight={'a': 1, 'c': 5}) }}
{{ insert_message(6, visible=-120) }}
{{ insert_message(7, visible=3600) }}
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
{{ stats_into_temp() }}

    -- Assert: ready 2, 4, 5 (its lease expired) and 6; delayed 3 and 7; 1 in flight; the oldest of
    -- what a dequeue could take is 6.
    SELECT
        s.ready,
        s.delayed,
        s.in_flight,
        s.dead,
        s.estimated,
        CONVERT(bit, IIF(s.oldest_ready_age_seconds BETWEEN 119 AND 180, 1, 0)) AS age_of_the_oldest
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.ready,
        a.delayed,
        a.in_flight,
        a.dead,
        a.estimated,
        a.age_of_the_oldest
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, delayed, in_flight, dead, estimated, age_of_the_oldest)
    VALUES (4, 2, 1, 0, 0, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

{% for grouped_due, tail in [(10000, 'ungrouped'), (10001, 'grouped'), (15000, 'split')] %}
{% if tail == 'split' %}
CREATE PROCEDURE {{ cls }}.[test stats of 15000 delayed grouped messages estimates them delayed]
{% else %}
CREATE PROCEDURE {{ cls }}.[test stats of {{ grouped_due }} due grouped messages and one more {{ tail }}]
{% endif %}
AS
BEGIN
{% if tail == 'split' %}
    -- Assemble: 15,000 grouped messages, none due yet: 10,001 are read, all delayed, and the rest of
    -- the catalog's row count (which counts this transaction's own rows) goes to delayed as well:
    -- none to ready (before the split, all of it did).
{% elif tail == 'ungrouped' %}
    -- Assemble: 10,000 grouped messages, all due, in 100 groups, and one due without a group: two
    -- exact counts whose sum passes the limit, which is not an estimate (stats reads no groups row).
{% else %}
    -- Assemble: 10,001 grouped messages, all due, in 100 groups, and a delayed one in group z, which
    -- sorts after them in ix_group: past the first 10,001 along it, so not read (delayed is a lower
    -- bound) and the figures an estimate.
{% endif %}
{{ fake_groups() }}
    EXEC tSQLt.FakeTable @TableName = N'{{ dead_t }}';
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    INSERT INTO {{ t }} (
        id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, attempts, group_key, group_head, payload
    )
    SELECT
{% if client_ids %}
        NEWID() AS id,
        n.n AS seq,
{% else %}
        n.n AS id,
{% endif %}
        DATEADD(SECOND, -3600, @now) AS enqueued_at,
        DATEADD(SECOND, {{ 3600 if tail == 'split' else -60 }}, @now) AS due_at,
        DATEADD(SECOND, {{ 3600 if tail == 'split' else -60 }}, @now) AS visible_at,
        0 AS attempts,
        CONCAT(N'g', n.n % 100) AS group_key,
        IIF(n.n <= 100, 1, 0) AS group_head,
        {{ sample(1) }} AS payload
    FROM (
        SELECT TOP ({{ grouped_due }}) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS n
        FROM sys.all_columns AS a
        CROSS JOIN sys.all_columns AS b
    ) AS n;
{% if tail == 'ungrouped' %}
{{ insert_message(20001, visible=-60) }}
{% elif tail == 'grouped' %}
    INSERT INTO {{ t }} (
        id, {{ 'seq, ' if client_ids }}enqueued_at, due_at, visible_at, attempts, group_key, group_head, payload
    )
    VALUES (
        {{ mid(20001) }}, {{ '20001, ' if client_ids }}DATEADD(SECOND, -3600, @now), DATEADD(SECOND, 3600, @now),
        DATEADD(SECOND, 3600, @now), 0, N'z', 1, {{ sample(1) }}
    );
{% endif %}
{{ stats_into_temp() }}

    -- Assert
    SELECT
        s.in_flight,
        s.estimated,
        CONVERT(bit, IIF(s.delayed {{ '> 10001' if tail == 'split' else '= 0' }}, 1, 0)) AS delayed_as_expected,
        CONVERT(bit, IIF(s.ready {{ {'ungrouped': '= 10001', 'grouped': '>= 10001', 'split': '= 0'}[tail] }}, 1, 0)) AS ready_as_expected
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.in_flight,
        a.estimated,
        a.delayed_as_expected,
        a.ready_as_expected
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (in_flight, estimated, delayed_as_expected, ready_as_expected)
    VALUES (0, {{ 0 if tail == 'ungrouped' else 1 }}, 1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% endfor %}

--[@tSQLt:NoTransaction]('{{ cls }}.[undo what a test outside a transaction left]')
CREATE PROCEDURE {{ cls }}.[test purge keeps the row of a group with a message in flight]
AS
BEGIN
    -- Assemble: a's row names 7 in flight, a message purge's lock-free probes cannot see (on a
    -- server: its row locked for an instant by extend_lease or release, which do not hold the group;
    -- here: absent from the faked table); b's row has no message and none in flight. Outside tSQLt's
    -- transaction (NoTransaction): purge drops empty groups' rows only outside a caller's
    -- transaction, so inside tSQLt's it would skip both rows (and fail: b's row would stay).
{{ fake_groups() }}
    INSERT INTO {{ groups_t }} (group_key, in_flight)
    VALUES
    (N'a', {{ mid(7) }}),
    (N'b', NULL);

    -- Act: its one row goes to the caller (INSERT ... EXEC would run it inside the INSERT's
    -- transaction, and the pass would not run).
    EXEC {{ names.verb('purge') }};

    -- Assert: a's row stays, with 7 in flight (review S3: it was deleted, and put back only with a
    -- message the probes saw, so without its in_flight); b's empty row is gone: the pass ran.
{{ assert_in_flight([('a', 7)]) }}
END;
GO
{% endif %}
{% set timed_tables = [t, dead_t] + ([history_t] if history else []) %}
{% set hidden_tables = [] %}
{% set internal_procedures = [names.verb('process_handler')] if opt.handler else [] %}
{% set granted_types = [(items, verb_roles['enqueue_batch']), (acks, verb_roles['complete_batch'])] %}
{% include '_test_real_objects.sql' %}
