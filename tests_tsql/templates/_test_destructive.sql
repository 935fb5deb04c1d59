{#-
  tSQLt test class for one queue of a destructive kind (heap, fifo, lifo, pending), rendered per queue
  by render.render_tsqlt. The including template sets, as the kind's production template does:
    claim_order  'none' | 'oldest' | 'newest' | 'due'
    strict       true only for strict FIFO
  Every test fakes the queue table (tSQLt.FakeTable: no constraints, no indexes, nullable columns;
  @Identity = 1 and @Defaults = 1 where the procedure relies on the identity or on enqueued_at's
  default), runs one verb, and compares #Actual with #Expected. tSQLt runs each test in a
  transaction that it rolls back, so nothing a test does survives it, and a procedure never opens a
  transaction of its own here: its path for a caller without one (@@TRANCOUNT = 0, with or without
  IMPLICIT_TRANSACTIONS) is covered by the conformance suite against a real server. One exception:
  grouped fifo's purge deletes empty groups' rows only outside a caller's transaction, so that
  test is annotated --[@tSQLt:NoTransaction](DEFAULT) (a function call: DEFAULT, not "()", for no
  clean-up procedure) and tSQLt.UndoTestDoubles drops its fakes with what it committed; two
  sessions (a held group, a producer's pin) stay with the conformance suite. An argument
  check throws before XACT_ABORT is set and leaves that transaction usable; any later THROW dooms
  it: tSQLt rolls it back and still reports the test by its ExpectException, so nothing may follow
  the Act in such a test.
-#}
{% set has_due = claim_order == 'due' %}
{% set dedupe = opt.dedupe %}
{% set groups = opt.get('groups', false) %}
{% set t = names.obj() %}
{% set cls = test_class %}
{% import '_pinned_indexes.sql' as pins with context %}
{% set items = names.obj('_items') %}
{% set table_name = names.obj() %}
{#- A payload literal of the queue's type; n tells messages apart. -#}
{% macro sample(n) -%}
{% if queue.payload == 'json' %}N'{"n": {{ n }}}'{% elif queue.payload == 'text' %}N'message {{ n }}'{% else %}0x{{ '%02X' % n }}{% endif %}
{%- endmacro %}
{#- Rows straight into the faked table: id, age in seconds before @now, due in seconds after @now, key, n. -#}
{% macro insert_messages(rows) %}
    INSERT INTO {{ t }} (id, enqueued_at, {% if has_due %}due_at, {% endif %}{% if dedupe %}dedupe_key, {% endif %}payload)
    VALUES
{% for r in rows %}
    ({{ r.id }}, DATEADD(SECOND, -{{ r.age }}, @now), {% if has_due %}DATEADD(SECOND, {{ r.due }}, @now), {% endif %}{% if dedupe %}{{ ("N'" ~ r.key ~ "'") if r.key else 'NULL' }}, {% endif %}{{ sample(r.n) }}){{ ';' if loop.last else ',' }}
{% endfor %}
{%- endmacro %}
{#- The dequeue result set (id, payload, enqueued_at[, due_at][, group_key]) in the order it came, as
    #Actual. -#}
{% macro dequeue_into_actual(batch_size) %}
    CREATE TABLE #Actual (
        position int IDENTITY (1, 1) NOT NULL,
        id bigint NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL{% if has_due %},
        due_at datetime2(7) NOT NULL{% endif %}{% if groups %},
        group_key nvarchar(200) NULL{% endif %}

    );

    -- Act: INSERT ... EXEC keeps the rows in the order the procedure returned them.
    INSERT INTO #Actual (id, payload, enqueued_at{% if has_due %}, due_at{% endif %}{% if groups %}, group_key{% endif %})
    EXEC {{ names.verb('dequeue') }} @batch_size = {{ batch_size }};
{%- endmacro %}
{#- #Expected for dequeue_into_actual: (position, id, age, due, n[, group]) of the rows it must return. -#}
{% macro expect_dequeued(rows) %}
    CREATE TABLE #Expected (
        position int NOT NULL,
        id bigint NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL{% if has_due %},
        due_at datetime2(7) NOT NULL{% endif %}{% if groups %},
        group_key nvarchar(200) NULL{% endif %}

    );
{% if rows %}
    INSERT INTO #Expected (position, id, payload, enqueued_at{% if has_due %}, due_at{% endif %}{% if groups %}, group_key{% endif %})
    VALUES
{% for r in rows %}
    ({{ loop.index }}, {{ r.id }}, {{ sample(r.n) }}, DATEADD(SECOND, -{{ r.age }}, @now){% if has_due %}, DATEADD(SECOND, {{ r.due }}, @now){% endif %}{% if groups %}, {{ ("N'" ~ r.group ~ "'") if r.get('group') else 'NULL' }}{% endif %}){{ ';' if loop.last else ',' }}
{% endfor %}
{% endif %}
{%- endmacro %}
{#- The ids left in the faked table, against the ids expected there. -#}
{% macro assert_remaining(remaining_ids) %}
    SELECT m.id
    INTO #Remaining
    FROM {{ t }} AS m;

    CREATE TABLE #ExpectedRemaining (id bigint NOT NULL);
{% if remaining_ids %}
    INSERT INTO #ExpectedRemaining (id) VALUES ({{ remaining_ids | join('), (') }});
{% endif %}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedRemaining', @Actual = N'#Remaining';
{%- endmacro %}
{#- Three ready messages with distinct ids, ages and (pending) due times, used by the order tests. -#}
{% set three = [
    {'id': 11, 'age': 30, 'due': -10, 'key': 'k11', 'n': 1},
    {'id': 12, 'age': 20, 'due': -30, 'key': 'k12', 'n': 2},
    {'id': 13, 'age': 10, 'due': -20, 'key': 'k13', 'n': 3},
] %}
{% if has_due %}
{% set first_two = [three[1], three[2]] %}
{% set left_over = [three[0].id] %}
{% elif claim_order == 'newest' %}
{% set first_two = [three[2], three[1]] %}
{% set left_over = [three[0].id] %}
{% else %}
{% set first_two = [three[0], three[1]] %}
{% set left_over = [three[2].id] %}
{% endif %}
-- noqa: disable=CP02, RF05
-- tSQLt's own names are mixed case (tSQLt.FakeTable, #Expected, #Actual) and a test is named by a
-- sentence in brackets ([test enqueue ...]), as tSQLt documents: sqlfluff's identifier casing (CP02)
-- and special-character (RF05) rules cannot hold for them. Every other rule applies.
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

EXEC tSQLt.NewTestClass 'test_{{ schema }}_{{ queue.name }}';
GO

{{ pins.fake_helper(cls, table_name) }}

-- enqueue -----------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test enqueue stores the message and returns its new id]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }};

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (1, 0);
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

    INSERT INTO #ExpectedStored (id, payload) VALUES (1, {{ sample(1) }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue stamps enqueued_at with the UTC time]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }};

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    DECLARE @stamped int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.enqueued_at BETWEEN @before AND @after
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @stamped, @Message = N'enqueued_at is not SYSUTCDATETIME()';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a NULL payload with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
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
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_payload }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = N'{"unterminated": ';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a JSON scalar with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_payload }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = N'42';
END;
GO

CREATE PROCEDURE {{ cls }}.[test the table itself refuses invalid JSON]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ApplyConstraint
        @TableName = N'{{ table_name }}',
        @ConstraintName = N'{{ 'ck_' ~ queue.name ~ '_payload_json' }}';
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 547;

    -- Act
    INSERT INTO {{ t }} (id, payload) VALUES (1, N'not json');
END;
GO
{% endif %}
{% if dedupe %}

CREATE PROCEDURE {{ cls }}.[test enqueue of a queued dedupe_key returns that id, duplicate]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}dedupe_key, payload)
    VALUES ({% if has_due %}SYSUTCDATETIME(), {% endif %}N'order-42', {{ sample(1) }});
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(2) }}, @dedupe_key = N'order-42';

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (1, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_remaining([1]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue with a new dedupe_key stores it]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}dedupe_key, payload)
    VALUES ({% if has_due %}SYSUTCDATETIME(), {% endif %}N'order-41', {{ sample(1) }});
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(2) }}, @dedupe_key = N'order-42';

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (2, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.dedupe_key
    INTO #Stored
    FROM {{ t }} AS m;

    SELECT TOP (0)
        s.id,
        s.dedupe_key
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, dedupe_key) VALUES (1, N'order-41'), (2, N'order-42');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue compares dedupe keys exactly, case included]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}dedupe_key, payload)
    VALUES ({% if has_due %}SYSUTCDATETIME(), {% endif %}N'order-42', {{ sample(1) }});
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(2) }}, @dedupe_key = N'ORDER-42';

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (2, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue without a dedupe_key is never a duplicate]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    CREATE TABLE #Actual (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }};
    INSERT INTO #Actual (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @dedupe_key = NULL;

    -- Assert
    CREATE TABLE #Expected (id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (id, duplicate) VALUES (1, 0), (2, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a dedupe_key over 200 characters with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @long_key nvarchar(MAX) = REPLICATE(N'k', 201);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @dedupe_key = @long_key;
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue takes a dedupe_key of exactly 200 characters]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @key nvarchar(MAX) = REPLICATE(N'k', 200);
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @dedupe_key = @key;

    -- Assert
    DECLARE @stored nvarchar(MAX) = (SELECT m.dedupe_key FROM {{ t }} AS m);
    EXEC tSQLt.AssertEqualsString @Expected = @key, @Actual = @stored;
END;
GO
{% else %}

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a dedupe_key without option dedupe]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @dedupe_key = N'k';
END;
GO
{% endif %}
{% if has_due %}

CREATE PROCEDURE {{ cls }}.[test enqueue keeps the given due_at]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @due datetime2(7) = DATEADD(HOUR, 3, SYSUTCDATETIME());
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @due_at = @due;

    -- Assert
    DECLARE @stored datetime2(7) = (SELECT m.due_at FROM {{ t }} AS m);
    EXEC tSQLt.AssertEquals @Expected = @due, @Actual = @stored;
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue without due_at makes the message due now in UTC]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }};

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    DECLARE @due_now int = (
        SELECT COUNT(*)
        FROM {{ t }} AS m
        WHERE m.due_at BETWEEN @before AND @after
    );
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @due_now, @Message = N'due_at is not SYSUTCDATETIME()';
END;
GO
{% endif %}

-- enqueue_batch -----------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test enqueue_batch gives one row per item, ids in item order]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    -- Filled out of order on purpose: the ordinal, not the insertion order, is the item order.
    INSERT INTO @items (ordinal, payload) VALUES (3, {{ sample(3) }}), (1, {{ sample(1) }}), (2, {{ sample(2) }});
    CREATE TABLE #Actual (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert
    CREATE TABLE #Expected (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (ordinal, id, duplicate) VALUES (1, 1, 0), (2, 2, 0), (3, 3, 0);
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

    INSERT INTO #ExpectedStored (id, payload) VALUES (1, {{ sample(1) }}), (2, {{ sample(2) }}), (3, {{ sample(3) }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue_batch with no items returns no rows]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    CREATE TABLE #Actual (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ table_name }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses more than 1000 items with 51001]
AS
BEGIN
    -- Assemble: past ~5,000 row locks a batch would escalate to a table lock READPAST cannot skip.
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
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

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses a NULL payload item with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload) VALUES (1, {{ sample(1) }}), (2, NULL);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_payload }}, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;
END;
GO
{% if is_json %}

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses an invalid JSON item with 51002]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload) VALUES (1, {{ sample(1) }}), (2, N'{"unterminated": ');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_payload }}, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;
END;
GO
{% endif %}
{% if dedupe %}

CREATE PROCEDURE {{ cls }}.[test enqueue_batch reports duplicates with the kept id]
AS
BEGIN
    -- Assemble: key a is queued (id 1); the batch repeats a, brings b twice, c once, and two without a key.
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    INSERT INTO {{ t }} ({% if has_due %}due_at, {% endif %}dedupe_key, payload)
    VALUES ({% if has_due %}SYSUTCDATETIME(), {% endif %}N'a', {{ sample(9) }});
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, dedupe_key)
    VALUES
    (1, {{ sample(1) }}, N'a'),
    (2, {{ sample(2) }}, N'b'),
    (3, {{ sample(3) }}, N'b'),
    (4, {{ sample(4) }}, NULL),
    (5, {{ sample(5) }}, N'c'),
    (6, {{ sample(6) }}, N'a'),
    (7, {{ sample(7) }}, NULL);
    CREATE TABLE #Actual (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Actual (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert: new rows get ids 2.. in item order; a duplicate carries the id that was kept.
    CREATE TABLE #Expected (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);
    INSERT INTO #Expected (ordinal, id, duplicate)
    VALUES (1, 1, 1), (2, 2, 0), (3, 2, 1), (4, 3, 0), (5, 4, 0), (6, 1, 1), (7, 5, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';

    SELECT
        m.id,
        m.dedupe_key,
        m.payload
    INTO #Stored
    FROM {{ t }} AS m;

    SELECT TOP (0)
        s.id,
        s.dedupe_key,
        s.payload
    INTO #ExpectedStored
    FROM #Stored AS s;

    INSERT INTO #ExpectedStored (id, dedupe_key, payload)
    VALUES
    (1, N'a', {{ sample(9) }}),
    (2, N'b', {{ sample(2) }}),
    (3, NULL, {{ sample(4) }}),
    (4, N'c', {{ sample(5) }}),
    (5, NULL, {{ sample(7) }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedStored', @Actual = N'#Stored';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses a key over 200 characters with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, dedupe_key)
    VALUES (1, {{ sample(1) }}, N'a'), (2, {{ sample(2) }}, REPLICATE(N'k', 201));
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }}, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;
END;
GO
{% else %}

CREATE PROCEDURE {{ cls }}.[test enqueue_batch refuses a dedupe_key without option dedupe]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, dedupe_key) VALUES (1, {{ sample(1) }}, NULL), (2, {{ sample(2) }}, N'k');
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }}, @ExpectedMessagePattern = N'%item 2 %';

    -- Act
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;
END;
GO
{% endif %}
{% if has_due %}

CREATE PROCEDURE {{ cls }}.[test enqueue_batch takes the due_at of each item or now]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}', @Identity = 1, @Defaults = 1;
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @due datetime2(7) = DATEADD(HOUR, 2, SYSUTCDATETIME());
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, due_at) VALUES (1, {{ sample(1) }}, @due), (2, {{ sample(2) }}, NULL);
    DECLARE @before datetime2(7) = SYSUTCDATETIME();
    CREATE TABLE #Ignored (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert
    DECLARE @after datetime2(7) = SYSUTCDATETIME();
    SELECT
        m.id,
        CASE WHEN m.due_at = @due THEN N'given' WHEN m.due_at BETWEEN @before AND @after THEN N'now' END AS due
    INTO #Actual
    FROM {{ t }} AS m;

    CREATE TABLE #Expected (id bigint NOT NULL, due nvarchar(5) NULL);
    INSERT INTO #Expected (id, due) VALUES (1, N'given'), (2, N'now');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% endif %}

-- dequeue -----------------------------------------------------------------------------------------
{% if claim_order == 'none' %}

CREATE PROCEDURE {{ cls }}.[test dequeue hands out batch_size messages and deletes them]
AS
BEGIN
    -- Assemble: a heap promises no order, only that what is handed out is gone.
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages(three) }}
{{ dequeue_into_actual(2) }}

    -- Assert
    DECLARE @handed_out int = (SELECT COUNT(*) FROM #Actual);
    EXEC tSQLt.AssertEquals @Expected = 2, @Actual = @handed_out;
    DECLARE @still_there int = (
        SELECT COUNT(*)
        FROM #Actual AS a
        INNER JOIN {{ t }} AS m ON a.id = m.id
    );
    EXEC tSQLt.AssertEquals @Expected = 0, @Actual = @still_there, @Message = N'a handed-out message is still queued';
    DECLARE @left int = (SELECT COUNT(*) FROM {{ t }});
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @left;
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue returns the message as it was stored]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages([three[0]]) }}
{{ dequeue_into_actual(10) }}

    -- Assert
{{ expect_dequeued([three[0]]) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO
{% else %}

CREATE PROCEDURE {{ cls }}.[test dequeue hands out batch_size messages, {{ {'oldest': 'oldest', 'newest': 'newest', 'due': 'earliest due'}[claim_order] }} first]
AS
BEGIN
    -- Assemble: ids, enqueue times and due times disagree, so only the right order passes.
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages(three) }}
{{ dequeue_into_actual(2) }}

    -- Assert
{{ expect_dequeued(first_two) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_remaining(left_over) }}
END;
GO
{% endif %}
{% if strict %}

CREATE PROCEDURE {{ cls }}.[test strict dequeue hands a rolled-back head out again, then the rest]
AS
BEGIN
    -- Assemble: strict order is between sessions: a consumer waits on the head another one holds (no
    -- READPAST) and gets it when that one rolls back. A session never waits on its own locks, so
    -- the waiting itself is proven by tests/test_destructive_concurrency.py (four consumers, some
    -- rolling back, against a real server); this test asserts what one caller observes: a hand-out
    -- rolled back (to a savepoint in tSQLt's transaction) is the head again, and hand-outs come in
    -- id (enqueue) order, not in enqueued_at order: the ages here put 12, 13, 11 in enqueued_at
    -- order, so only id order passes.
{% set by_id = [
    {'id': 11, 'age': 10, 'due': -10, 'key': 'k11', 'n': 1},
    {'id': 12, 'age': 30, 'due': -30, 'key': 'k12', 'n': 2},
    {'id': 13, 'age': 20, 'due': -20, 'key': 'k13', 'n': 3},
] %}
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages(by_id) }}
    -- A table variable keeps its rows through the rollback to the savepoint.
    DECLARE @first TABLE (id bigint NOT NULL, payload {{ payload_type }} NOT NULL, enqueued_at datetime2(7) NOT NULL);
    SAVE TRANSACTION before_first_dequeue;
    INSERT INTO @first (id, payload, enqueued_at)
    EXEC {{ names.verb('dequeue') }} @batch_size = 1;
    ROLLBACK TRANSACTION before_first_dequeue;
{{ dequeue_into_actual(3) }}

    -- Assert
    DECLARE @first_id bigint = (SELECT f.id FROM @first AS f);
    EXEC tSQLt.AssertEquals @Expected = {{ by_id[0].id }}, @Actual = @first_id, @Message = N'the first hand-out was not the head';
{{ expect_dequeued(by_id) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_remaining([]) }}
END;
GO
{% endif %}
{% if has_due %}

CREATE PROCEDURE {{ cls }}.[test dequeue hands out nothing that is not due yet]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages([{'id': 21, 'age': 5, 'due': 3600, 'key': 'k21', 'n': 1}, {'id': 22, 'age': 5, 'due': -1, 'key': 'k22', 'n': 2}]) }}
{{ dequeue_into_actual(10) }}

    -- Assert
{{ expect_dequeued([{'id': 22, 'age': 5, 'due': -1, 'n': 2}]) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_remaining([21]) }}
END;
GO
{% endif %}

{% if has_due %}
CREATE PROCEDURE {{ cls }}.[test dequeue after an earlier one takes a message due before it first]
AS
BEGIN
    -- Assemble: a dequeue has taken message 31; then message 33 arrives, due long before it (an
    -- enqueue with a due time in the past). The claim order starts at its head on every call (the
    -- PostgreSQL twin keeps a claim position and moves it back: docs/queue-kinds.md).
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages([{'id': 31, 'age': 5, 'due': -30, 'key': 'k31', 'n': 1}, {'id': 32, 'age': 5, 'due': -20, 'key': 'k32', 'n': 2}]) }}
    CREATE TABLE #Earlier (
        id bigint NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        due_at datetime2(7) NOT NULL
    );
    INSERT INTO #Earlier (id, payload, enqueued_at, due_at)
    EXEC {{ names.verb('dequeue') }} @batch_size = 1;
{{ insert_messages([{'id': 33, 'age': 1, 'due': -3600, 'key': 'k33', 'n': 3}]) }}
{{ dequeue_into_actual(1) }}

    -- Assert
{{ expect_dequeued([{'id': 33, 'age': 1, 'due': -3600, 'n': 3}]) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_remaining([32]) }}
END;
GO

{% endif %}
CREATE PROCEDURE {{ cls }}.[test dequeue on an empty queue returns no rows]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
{{ dequeue_into_actual(1) }}

    -- Assert
    EXEC tSQLt.AssertEmptyTable @TableName = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue takes at most 1000 messages at once]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    INSERT INTO {{ t }} (id, enqueued_at, {% if has_due %}due_at, {% endif %}payload)
    SELECT TOP (1001)
        ROW_NUMBER() OVER (ORDER BY c.object_id, c.column_id) AS id,
        SYSUTCDATETIME() AS enqueued_at,
{% if has_due %}
        SYSUTCDATETIME() AS due_at,
{% endif %}
        {{ sample(1) }} AS payload
    FROM sys.all_columns AS c;
{{ dequeue_into_actual(1000) }}

    -- Assert
    DECLARE @handed_out int = (SELECT COUNT(*) FROM #Actual);
    EXEC tSQLt.AssertEquals @Expected = 1000, @Actual = @handed_out;
END;
GO
{% for bad, label in [('0', '0'), ('1001', '1001'), ('NULL', 'NULL')] %}

CREATE PROCEDURE {{ cls }}.[test dequeue refuses batch_size {{ label }} with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('dequeue') }} @batch_size = {{ bad }};
END;
GO
{% endfor %}

CREATE PROCEDURE {{ cls }}.[test a refused argument leaves the caller's transaction usable]
AS
BEGIN
    -- Assemble: this test's own transaction (tSQLt's) is the caller's transaction.
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @error int;

    -- Act: as a driver's session has it (engines.connect sets it; tSQLt's session has it off, where
    -- the test would pass whatever the procedure did). The argument check throws with XACT_ABORT
    -- off, its own setting, so the transaction is not doomed.
    SET XACT_ABORT ON;
    BEGIN TRY
        EXEC {{ names.verb('dequeue') }} @batch_size = 0;
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

-- wait --------------------------------------------------------------------------------------------
-- A probe skips a row another session holds (READPAST): tSQLt runs in one session, whose own locks
-- never block it, so that case (and the wake-up by another connection's commit) is the
-- conformance suite's, against a real server.

CREATE PROCEDURE {{ cls }}.[test wait returns ready at once for a {{ 'due ' if has_due }}message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages([{'id': 41, 'age': 5, 'due': -1, 'key': 'k41', 'n': 1}]) }}
    CREATE TABLE #Actual (ready bit NOT NULL);

    -- Act: a timeout far longer than a test may take, so only "ready" ends it in time.
    INSERT INTO #Actual (ready)
    EXEC {{ names.verb('wait') }} @wait_ms = 20000;

    -- Assert: it claimed nothing.
    CREATE TABLE #Expected (ready bit NOT NULL);
    INSERT INTO #Expected (ready) VALUES (1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    DECLARE @left int = (SELECT COUNT(*) FROM {{ t }});
    EXEC tSQLt.AssertEquals @Expected = 1, @Actual = @left, @Message = N'wait took the message';
END;
GO

CREATE PROCEDURE {{ cls }}.[test wait returns 0 at the timeout {{ 'when nothing is due' if has_due else 'on an empty queue' }}]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
{% if has_due %}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages([{'id': 42, 'age': 5, 'due': 3600, 'key': 'k42', 'n': 2}]) }}
{% endif %}
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

CREATE PROCEDURE {{ cls }}.[test wait refuses wait_ms over 20000 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException
        @ExpectedErrorNumber = {{ errors.invalid_argument }},
        @ExpectedMessagePattern = N'%wait_ms must be between 0 and 20000%';

    -- Act
    EXEC {{ names.verb('wait') }} @wait_ms = 20001;
END;
GO

-- stats -------------------------------------------------------------------------------------------

CREATE PROCEDURE {{ cls }}.[test stats of an empty queue are zero with no age]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    CREATE TABLE #Actual (
        ready bigint NULL,
        delayed bigint NULL,
        in_flight bigint NULL,
        dead bigint NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NULL
    );

    -- Act
    INSERT INTO #Actual (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC {{ names.verb('stats') }};

    -- Assert
    SELECT TOP (0)
        a.ready,
        a.delayed,
        a.in_flight,
        a.dead,
        a.oldest_ready_age_seconds,
        a.estimated
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    VALUES (0, 0, 0, 0, NULL, 0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test stats count {% if has_due %}due and delayed, age the oldest from due_at{% else %}ready messages, age the oldest from enqueued_at{% endif %}]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{% if has_due %}
{{ insert_messages([
    {'id': 31, 'age': 10, 'due': -90, 'key': 'k31', 'n': 1},
    {'id': 32, 'age': 500, 'due': -5, 'key': 'k32', 'n': 2},
    {'id': 33, 'age': 900, 'due': 600, 'key': 'k33', 'n': 3},
]) }}
{% else %}
{{ insert_messages([
    {'id': 31, 'age': 90, 'due': 0, 'key': 'k31', 'n': 1},
    {'id': 32, 'age': 60, 'due': 0, 'key': 'k32', 'n': 2},
    {'id': 33, 'age': 5, 'due': 0, 'key': 'k33', 'n': 3},
]) }}
{% endif %}
    CREATE TABLE #Stats (
        ready bigint NULL,
        delayed bigint NULL,
        in_flight bigint NULL,
        dead bigint NULL,
        oldest_ready_age_seconds float NULL,
        estimated bit NULL
    );

    -- Act
    INSERT INTO #Stats (ready, delayed, in_flight, dead, oldest_ready_age_seconds, estimated)
    EXEC {{ names.verb('stats') }};

    -- Assert: the age is 90 seconds plus however long the test took to get here.
    SELECT
        s.ready,
        s.delayed,
        s.in_flight,
        s.dead,
        s.estimated,
        CASE
            WHEN s.oldest_ready_age_seconds >= 90 AND s.oldest_ready_age_seconds < 150 THEN 1 ELSE 0
        END AS age_is_90_seconds
    INTO #Actual
    FROM #Stats AS s;

    SELECT TOP (0)
        a.ready,
        a.delayed,
        a.in_flight,
        a.dead,
        a.estimated,
        a.age_is_90_seconds
    INTO #Expected
    FROM #Actual AS a;

    INSERT INTO #Expected (ready, delayed, in_flight, dead, estimated, age_is_90_seconds)
    VALUES ({{ '2, 1' if has_due else '3, 0' }}, 0, 0, 0, 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

-- purge -------------------------------------------------------------------------------------------
{#- Act: purge with `args` into #Actual; Assert: it reports `purged`. -#}
{% macro expect_purged(args, purged) %}
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('purge') }} {{ args }};

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES ({{ purged }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{%- endmacro %}


CREATE PROCEDURE {{ cls }}.[test purge without older_than removes and counts every message]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages(three) }}
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('purge') }} @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (3);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
    EXEC tSQLt.AssertEmptyTable @TableName = N'{{ table_name }}';
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge removes only messages enqueued before older_than]
AS
BEGIN
    -- Assemble: 30 and 20 seconds old go, 10 seconds old stays; the cut-off is 15 seconds ago.
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages(three) }}
    DECLARE @cutoff datetime2(7) = DATEADD(SECOND, -15, @now);
{{ expect_purged('@older_than = @cutoff, @max_rows = 100', 2) }}
{{ assert_remaining([13]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge of an empty queue purges nothing]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('purge') }} @max_rows = 100;

    -- Assert
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (0);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge takes at most max_rows, oldest first]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_messages(three) }}
    CREATE TABLE #Actual (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Actual (purged)
    EXEC {{ names.verb('purge') }} @max_rows = 2;

    -- Assert: the first two in the clustered index's order{% if has_due %} (due_at, id){% endif %}.
    CREATE TABLE #Expected (purged bigint NOT NULL);
    INSERT INTO #Expected (purged) VALUES (2);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_remaining([three[0].id] if has_due else [three[2].id]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge refuses max_rows 0 with 51001]
AS
BEGIN
    -- Assemble
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
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
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}';
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = {{ errors.invalid_argument }};

    -- Act
    EXEC {{ names.verb('purge') }};
END;
GO
{% if groups %}

-- message groups (docs/queue-kinds.md, "Message groups") ------------------------------------------

{{ pins.fake_helper(cls, names.obj('_groups'), pins.groups_pinned, 'groups') }}
{# Both tables faked, each with the indexes the verbs pin (the groups table's key is the group's
    lock: its unique key, rebuilt from _pinned_indexes.sql, keeps the seeks and the key locks the
    verbs take), so no row of the real groups table is read or written. -#}
{% macro fake_grouped(options='') %}
    EXEC tSQLt.FakeTable @TableName = N'{{ table_name }}'{{ options }};
    EXEC {{ cls }}.[index the faked queue table];
    EXEC tSQLt.FakeTable @TableName = N'{{ names.obj('_groups') }}';
    EXEC {{ cls }}.[index the faked groups table];
{%- endmacro %}
{# Grouped rows straight into the faked table (id, age, group, head, n), their groups' rows into the
    faked groups table. -#}
{% macro insert_grouped(rows) %}
    INSERT INTO {{ t }} (id, enqueued_at, group_key, group_head, payload)
    VALUES
{% for r in rows %}
    ({{ r.id }}, DATEADD(SECOND, -{{ r.age }}, @now), N'{{ r.group }}', {{ r.head }}, {{ sample(r.n) }}){{ ';' if loop.last else ',' }}
{% endfor %}
    INSERT INTO {{ names.obj('_groups') }} (group_key)
    VALUES (N'{{ rows | map(attribute='group') | unique | join("'), (N'") }}');
{%- endmacro %}
{#- The rows of the faked groups table, against the keys expected. -#}
{% macro assert_groups(keys) %}
    SELECT g.group_key
    INTO #Groups
    FROM {{ names.obj('_groups') }} AS g;

    SELECT TOP (0) g.group_key
    INTO #ExpectedGroups
    FROM #Groups AS g;
    INSERT INTO #ExpectedGroups (group_key) VALUES (N'{{ keys | join("'), (N'") }}');
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedGroups', @Actual = N'#Groups';
{%- endmacro %}
{#- The heads of the faked table, against (id, head) expected. -#}
{% macro assert_heads(expected) %}
    SELECT
        m.id,
        m.group_head
    INTO #Heads
    FROM {{ t }} AS m
    WHERE m.group_key IS NOT NULL;

    CREATE TABLE #ExpectedHeads (id bigint NOT NULL, group_head bit NULL);
    INSERT INTO #ExpectedHeads (id, group_head) VALUES ({{ expected | map('join', ', ') | join('), (') }});
    EXEC tSQLt.AssertEqualsTable @Expected = N'#ExpectedHeads', @Actual = N'#Heads';
{%- endmacro %}
{% set grouped = [
    {'id': 41, 'age': 40, 'group': 'a', 'head': 1, 'n': 1},
    {'id': 42, 'age': 30, 'group': 'a', 'head': 0, 'n': 2},
    {'id': 43, 'age': 20, 'group': 'b', 'head': 1, 'n': 3},
    {'id': 44, 'age': 10, 'group': 'a', 'head': 0, 'n': 4}] %}

CREATE PROCEDURE {{ cls }}.[test dequeue hands out the head of each group, one message per group]
AS
BEGIN
    -- Assemble: group a holds 41, 42 and 44, group b 43; a batch of ten takes one of each group.
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped(grouped) }}
{{ dequeue_into_actual(10) }}

    -- Assert: the heads, oldest first; a's next message is its head now, 44 still waits behind it.
{{ expect_dequeued([grouped[0], grouped[2]]) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_heads([(42, 1), (44, 0)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue takes a group's oldest, not a flagged later one]
AS
BEGIN
    -- Assemble: 52 was flagged by a producer that found group a held (a spurious candidate); 51 is
    -- a's head. The claim follows 52 to the group and hands out 51, and demotes 52.
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped([{'id': 51, 'age': 20, 'group': 'a', 'head': 0, 'n': 1},
                   {'id': 52, 'age': 10, 'group': 'a', 'head': 1, 'n': 2},
                   {'id': 53, 'age': 5, 'group': 'a', 'head': 1, 'n': 3}]) }}
{{ dequeue_into_actual(1) }}

    -- Assert
{{ expect_dequeued([{'id': 51, 'age': 20, 'group': 'a', 'n': 1}]) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_heads([(52, 1), (53, 0)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test a rolled-back dequeue gives the group its head back first]
AS
BEGIN
    -- Assemble
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped(grouped) }}
    CREATE TABLE #Ignored (
        id bigint NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        group_key nvarchar(200) NULL
    );
    SAVE TRANSACTION before_dequeue;
    INSERT INTO #Ignored (id, payload, enqueued_at, group_key)
    EXEC {{ names.verb('dequeue') }} @batch_size = 10;
    ROLLBACK TRANSACTION before_dequeue;

    -- Assert: the rollback restored 41 and 43 and every flag (the dequeue had made 42 a's head),
    -- and the next dequeue hands out 41 again, first.
{{ assert_heads([(41, 1), (42, 0), (43, 1), (44, 0)]) }}
{{ dequeue_into_actual(1) }}
{{ expect_dequeued([grouped[0]]) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test dequeue again in the holding transaction gets the next one]
AS
BEGIN
    -- Assemble: tSQLt runs the test in one transaction of one session, and a session never skips
    -- its own locks: the skip of a group that another consumer holds (and that its enqueues do not
    -- wait) needs two sessions, which tests/conformance/test_groups.py runs against a real server
    -- (test_fifo_a_group_is_held_until_the_dequeuing_transaction_ends_and_a_rollback_gives_it_back).
    -- What one transaction sees: the group it holds goes on in order.
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped([grouped[0], grouped[1]]) }}
    CREATE TABLE #Ignored (
        id bigint NOT NULL,
        payload {{ payload_type }} NOT NULL,
        enqueued_at datetime2(7) NOT NULL,
        group_key nvarchar(200) NULL
    );
    INSERT INTO #Ignored (id, payload, enqueued_at, group_key)
    EXEC {{ names.verb('dequeue') }} @batch_size = 1;
{{ dequeue_into_actual(1) }}

    -- Assert
{{ expect_dequeued([grouped[1]]) }}
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue flags only a message that leads an empty group]
AS
BEGIN
    -- Assemble: a new key creates its group's row; a group with a message gets a waiting one.
{{ fake_grouped(', @Identity = 1, @Defaults = 1') }}
    CREATE TABLE #Ignored (id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @group_key = N'a';
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(2) }}, @group_key = N'a';
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(3) }}, @group_key = N'c';
    INSERT INTO #Ignored (id, duplicate)
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(4) }};

    -- Assert
    SELECT
        m.group_key,
        m.group_head
    INTO #Actual
    FROM {{ t }} AS m;
    CREATE TABLE #Expected (group_key nvarchar(200) NULL, group_head bit NULL);
    INSERT INTO #Expected (group_key, group_head) VALUES (N'a', 1), (N'a', 0), (N'c', 1), (NULL, NULL);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
{{ assert_groups(['a', 'c']) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue_batch flags the first item of each empty group]
AS
BEGIN
    -- Assemble
{{ fake_grouped(', @Identity = 1, @Defaults = 1') }}
    DECLARE @items {{ items }};
    INSERT INTO @items (ordinal, payload, group_key)
    VALUES (1, {{ sample(1) }}, N'a'), (2, {{ sample(2) }}, N'a'), (3, {{ sample(3) }}, NULL), (4, {{ sample(4) }}, N'b');
    CREATE TABLE #Ignored (ordinal int NOT NULL, id bigint NOT NULL, duplicate bit NOT NULL);

    -- Act
    INSERT INTO #Ignored (ordinal, id, duplicate)
    EXEC {{ names.verb('enqueue_batch') }} @items = @items;

    -- Assert
    SELECT
        i.ordinal,
        m.group_key,
        m.group_head
    INTO #Actual
    FROM #Ignored AS i
    INNER JOIN {{ t }} AS m ON i.id = m.id;
    CREATE TABLE #Expected (ordinal int NOT NULL, group_key nvarchar(200) NULL, group_head bit NULL);
    INSERT INTO #Expected (ordinal, group_key, group_head)
    VALUES (1, N'a', 1), (2, N'a', 0), (3, NULL, NULL), (4, N'b', 1);
    EXEC tSQLt.AssertEqualsTable @Expected = N'#Expected', @Actual = N'#Actual';
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge promotes the next message of a group whose head it purged]
AS
BEGIN
    -- Assemble: a's head 41 and 42 are older than the cutoff, 44 is not; b's 43 neither.
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped(grouped) }}
    DECLARE @cutoff datetime2(7) = DATEADD(SECOND, -25, @now);
{{ expect_purged('@older_than = @cutoff, @max_rows = 100', 2) }}
    -- 44 leads a now, b is untouched, both groups keep their rows.
{{ assert_heads([(43, 1), (44, 1)]) }}
{{ assert_groups(['a', 'b']) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge settles a group: the oldest left leads, the rest wait]
AS
BEGIN
    -- Assemble: 51 leads a; 52 and 53 are flagged (producers that found a held). Purging 51 makes
    -- 52, the oldest left, the head, and demotes 53.
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped([{'id': 51, 'age': 40, 'group': 'a', 'head': 1, 'n': 1},
                   {'id': 52, 'age': 20, 'group': 'a', 'head': 1, 'n': 2},
                   {'id': 53, 'age': 10, 'group': 'a', 'head': 1, 'n': 3}]) }}
    DECLARE @cutoff datetime2(7) = DATEADD(SECOND, -30, @now);
    CREATE TABLE #Ignored (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Ignored (purged)
    EXEC {{ names.verb('purge') }} @older_than = @cutoff, @max_rows = 100;

    -- Assert
{{ assert_heads([(52, 1), (53, 0)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test purge in a transaction keeps the row of a group it emptied]
AS
BEGIN
    -- Assemble: tSQLt's transaction is a caller's: purge deletes no groups row in it (it would hold
    -- every deleted key to the caller's commit), the row of a group it emptied stays for a purge
    -- outside one (the NoTransaction test below).
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped([grouped[0], grouped[2]]) }}
    CREATE TABLE #Ignored (purged bigint NOT NULL);

    -- Act
    INSERT INTO #Ignored (purged)
    EXEC {{ names.verb('purge') }} @max_rows = 100;

    -- Assert
{{ assert_groups(['a', 'b']) }}
END;
GO

--[@tSQLt:NoTransaction](DEFAULT)
CREATE PROCEDURE {{ cls }}.[test purge outside a transaction drops the row of an emptied group]
AS
BEGIN
    -- Assemble: outside tSQLt's transaction (NoTransaction), as an autocommit caller: each chunk and
    -- each empty group's delete is a transaction of purge's own. tSQLt.UndoTestDoubles drops the
    -- fakes with what was committed into them. One session: the delete that meets a producer's pin
    -- (1222, the group left for the next purge) and the holder it must not wait for need two
    -- sessions: tests/conformance/test_groups.py, against a real server.
{{ fake_grouped() }}
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
{{ insert_grouped([grouped[0], grouped[2]]) }}
    INSERT INTO {{ names.obj('_groups') }} (group_key) VALUES (N'c');
    DECLARE @cutoff datetime2(7) = DATEADD(SECOND, -30, @now);

    -- Act: 41, a's only message, is purged; c had no message left. Plain EXEC: INSERT ... EXEC
    -- would run purge in a transaction, where it deletes no groups row.
    EXEC {{ names.verb('purge') }} @older_than = @cutoff;

    -- Assert: a's and c's rows are gone, b (43) keeps its own and its head.
{{ assert_groups(['b']) }}
{{ assert_heads([(43, 1)]) }}
END;
GO

CREATE PROCEDURE {{ cls }}.[test enqueue refuses a group_key over 200 characters with 51001]
AS
BEGIN
    -- Assemble
{{ fake_grouped(', @Identity = 1, @Defaults = 1') }}
    DECLARE @long nvarchar(MAX) = REPLICATE(CONVERT(nvarchar(MAX), N'k'), 201);
    EXEC tSQLt.ExpectException @ExpectedErrorNumber = 51001;

    -- Act
    EXEC {{ names.verb('enqueue') }} @payload = {{ sample(1) }}, @group_key = @long;
END;
GO
{% endif %}
{% set timed_tables = [t] %}
{% set hidden_tables = [names.obj('_groups')] if groups else [] %}
{% set internal_procedures = [] %}
{% set granted_types = [(items, verb_roles['enqueue_batch'])] %}
{% include '_test_real_objects.sql' %}
