{#- T-SQL: S.Q_enqueue_batch of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_enqueue_batch'), 'code') }}
CREATE OR ALTER PROCEDURE {{ names.verb('enqueue_batch') }}
    @items {{ items }} READONLY
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ m.check_batch_items('enqueue_batch') }}

    DECLARE @bad_ordinal int = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE i.payload IS NULL{% if is_json %} OR ISJSON(i.payload) = 0{% endif %}

    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
{{ w.throw('invalid_payload', ["N'" ~ names.plain('_enqueue_batch') ~ ": item '", "@bad_ordinal", "N' has a NULL" ~ (" or invalid JSON" if is_json else "") ~ " payload.'"]) }}
        END;
{% if dedupe %}

    SET @bad_ordinal = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE DATALENGTH(i.dedupe_key) > 400
    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_enqueue_batch') ~ ": item '", "@bad_ordinal", "N' has a dedupe_key over 200 characters.'"]) }}
        END;
{% endif %}
{% if groups %}

    SET @bad_ordinal = (
        SELECT MIN(i.ordinal)
        FROM @items AS i
        WHERE DATALENGTH(i.group_key) > 400
    );
    IF @bad_ordinal IS NOT NULL
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_enqueue_batch') ~ ": item '", "@bad_ordinal", "N' has a group_key over 200 characters.'"]) }}
        END;
{% endif %}
{% for column, option in (('dedupe_key', 'dedupe'), ('priority', 'priority'), ('id', 'client_ids'), ('enqueued_at', 'client_ids')) if not opt[option] %}

    IF (SELECT COUNT(i.{{ column }}) FROM @items AS i) > 0
        BEGIN
{{ w.throw('invalid_argument', "N'" ~ names.plain('_enqueue_batch') ~ ": " ~ column ~ " needs option " ~ option ~ ".'") }}
        END;
{% endfor %}
    SET XACT_ABORT ON;

    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    -- One row per item: the id it gets, or the queued message it duplicates.
    DECLARE @staged TABLE (
        ordinal int NOT NULL PRIMARY KEY,
{% if client_ids %}
        new_id uniqueidentifier NOT NULL,
{% endif %}
{% if dedupe %}
        dedupe_key {{ key_type }} NULL, -- noqa: CP02
{% endif %}
        first_ordinal int NULL,
        existing_id {{ id_type }} NULL,
        assigned_id {{ id_type }} NULL
    );
{% if dedupe %}
    DECLARE @keys TABLE (dedupe_key {{ key_type }} NOT NULL PRIMARY KEY); -- noqa: CP02
    DECLARE @existing_keys TABLE (
        dedupe_key {{ key_type }} NOT NULL PRIMARY KEY, -- noqa: CP02
        id {{ id_type }} NOT NULL
    );
{% endif %}
{% if client_ids %}
    DECLARE @given_ids TABLE (id uniqueidentifier NOT NULL PRIMARY KEY);
{% else %}
    DECLARE @new_ids TABLE (id bigint NOT NULL PRIMARY KEY);
{% endif %}
    DECLARE @started_transaction bit = 0;
{% if groups %}
    -- The batch's distinct groups, joined one at a time in key order (the fixed lock order, as
    -- enqueue) before any message row is locked. The first item the batch inserts into a group
    -- that was empty, or held by someone else, is a head candidate; every other item waits (a
    -- candidate per item would cost every claim a skipped row each while the group is held).
    DECLARE @joined TABLE (
        group_key {{ key_type }} NOT NULL PRIMARY KEY, -- noqa: CP02
        group_head bit NOT NULL
    );
    DECLARE @group nvarchar(200);
    DECLARE @group_head bit;
    DECLARE @group_joined bit;

    INSERT INTO @joined (group_key, group_head)
    SELECT DISTINCT
        i.group_key,
        CONVERT(bit, 0) AS group_head
    FROM @items AS i
    WHERE i.group_key IS NOT NULL;
{% endif %}

    INSERT INTO @staged (ordinal{% if client_ids %}, new_id{% endif %}{% if dedupe %}, dedupe_key{% endif %})
{% set staged_select = ['i.ordinal'] + (['COALESCE(i.id, NEWID()) AS new_id'] if client_ids else []) + (['i.dedupe_key'] if dedupe else []) %}
    SELECT{{ ' ' if staged_select | length == 1 else '\n        ' }}{{ staged_select | join(',\n        ') }}
    FROM @items AS i;
{% if dedupe or client_ids %}

    -- A later item with the key{% if client_ids %} or the client id{% endif %} of an earlier one duplicates that one.
    UPDATE s
    SET
        s.first_ordinal = (
            SELECT MIN(e.ordinal)
            FROM @staged AS e
            WHERE
                e.ordinal < s.ordinal
                AND ({{ 'e.dedupe_key = s.dedupe_key' if dedupe }}{{ ' OR ' if dedupe and client_ids }}{{ 'e.new_id = s.new_id' if client_ids }})
        )
    FROM @staged AS s;

    -- Point every duplicate at the first item of its chain (a key shared with one item, a client
    -- id with another), so that each one resolves to an id that is inserted or queued already.
    WHILE @@ROWCOUNT > 0
        BEGIN
            UPDATE s
            SET s.first_ordinal = f.first_ordinal
            FROM @staged AS s
            INNER JOIN @staged AS f ON s.first_ordinal = f.ordinal
            WHERE f.first_ordinal IS NOT NULL;
        END;
{% endif %}
{% if dedupe %}

    INSERT INTO @keys (dedupe_key)
    SELECT DISTINCT s.dedupe_key
    FROM @staged AS s
    WHERE s.dedupe_key IS NOT NULL;
{% endif %}
{% if client_ids %}

    INSERT INTO @given_ids (id)
    SELECT DISTINCT s.new_id
    FROM @staged AS s
    INNER JOIN @items AS i ON s.ordinal = i.ordinal
    WHERE i.id IS NOT NULL;
{% endif %}

    BEGIN TRY
        -- In implicit-transaction mode the caller owns the transaction the next statement opens.
        IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0
            BEGIN
                BEGIN TRANSACTION;
                SET @started_transaction = 1;
            END;
{% if groups %}

        {{ grp.join_groups_in_order() | indent(8) }}
{% endif %}
{% if dedupe %}

        -- Lock every key of the batch, present or not (see enqueue), walking the keys in index order:
        -- two batches that share keys then wait for each other instead of deadlocking.
        INSERT INTO @existing_keys (dedupe_key, id)
        SELECT
            m.dedupe_key,
            m.id
        FROM @keys AS k
        INNER JOIN {{ t }} AS m WITH (UPDLOCK, HOLDLOCK)
            ON k.dedupe_key = m.dedupe_key AND m.dedupe_key IS NOT NULL
        OPTION (LOOP JOIN, FORCE ORDER);

        UPDATE s
        SET s.existing_id = e.id
        FROM @staged AS s
        INNER JOIN @existing_keys AS e ON s.dedupe_key = e.dedupe_key;
{% endif %}
{% if client_ids %}

        -- Client ids that are queued already, locked in id order as the keys are.
        UPDATE s
        SET s.existing_id = m.id
        FROM @given_ids AS g
        INNER JOIN {{ t }} AS m WITH (UPDLOCK, HOLDLOCK) ON g.id = m.id
        INNER JOIN @staged AS s ON g.id = s.new_id
        WHERE s.existing_id IS NULL
        OPTION (LOOP JOIN, FORCE ORDER);
{% endif %}

        INSERT INTO {{ t }} (
            {{ 'id, ' if client_ids }}enqueued_at, due_at, visible_at, {{ 'priority, ' if has_priority }}{{ 'dedupe_key, ' if dedupe }}{{ 'group_key, group_head, ' if groups }}payload
        )
{% if not client_ids %}
        OUTPUT INSERTED.id INTO @new_ids (id)
{% endif %}
        SELECT
{% if client_ids %}
            s.new_id,
            COALESCE(i.enqueued_at, @now) AS enqueued_at,
{% else %}
            @now AS enqueued_at,
{% endif %}
            COALESCE(i.due_at, @now) AS due_at,
            COALESCE(i.due_at, @now) AS visible_at,
{% if has_priority %}
            COALESCE(i.priority, 0) AS priority,
{% endif %}
{% if dedupe %}
            s.dedupe_key,
{% endif %}
{% if groups %}
            i.group_key,
            -- The window runs over the rows the WHERE keeps: the first item inserted into its group.
            CONVERT(bit, CASE
                WHEN i.group_key IS NULL THEN NULL
                WHEN j.group_head = 1 AND ROW_NUMBER() OVER (PARTITION BY i.group_key ORDER BY s.ordinal) = 1 THEN 1
                ELSE 0
            END) AS group_head,
{% endif %}
            i.payload
        FROM @staged AS s
        INNER JOIN @items AS i ON s.ordinal = i.ordinal
{% if groups %}
        LEFT JOIN @joined AS j ON i.group_key = j.group_key
{% endif %}
        WHERE s.existing_id IS NULL AND s.first_ordinal IS NULL
        ORDER BY s.ordinal;

        IF @started_transaction = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @started_transaction = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

{% if client_ids %}
    UPDATE @staged
    SET assigned_id = new_id
    WHERE existing_id IS NULL AND first_ordinal IS NULL;
{% else %}
    -- Identity values are assigned in the ORDER BY of an INSERT ... SELECT: the n-th new id
    -- belongs to the n-th inserted item.
    WITH numbered_items AS (
        SELECT
            s.ordinal,
            ROW_NUMBER() OVER (ORDER BY s.ordinal) AS position
        FROM @staged AS s
        WHERE s.existing_id IS NULL AND s.first_ordinal IS NULL
    ),

    numbered_ids AS (
        SELECT
            n.id,
            ROW_NUMBER() OVER (ORDER BY n.id) AS position
        FROM @new_ids AS n
    )

    UPDATE s
    SET s.assigned_id = nid.id
    FROM @staged AS s
    INNER JOIN numbered_items AS ni ON s.ordinal = ni.ordinal
    INNER JOIN numbered_ids AS nid ON ni.position = nid.position;
{% endif %}

    SELECT
        s.ordinal,
        COALESCE(s.assigned_id, s.existing_id, f.assigned_id, f.existing_id) AS id,
        CONVERT(bit, IIF(s.assigned_id IS NULL, 1, 0)) AS duplicate
    FROM @staged AS s
    LEFT JOIN @staged AS f ON s.first_ordinal = f.ordinal
    ORDER BY s.ordinal;
END;
GO

GRANT EXECUTE ON TYPE::{{ items }} TO {{ names.role('enqueue_batch') }};
GO

{{ m.grant('enqueue_batch') }}
GO
