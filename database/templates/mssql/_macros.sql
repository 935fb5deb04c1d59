{#- Shared T-SQL fragments. Imported "with context" so they see names, errors and the queue. -#}
{#- A storage unit declares its storage version and object, and its shape: the kind and the options
    (shape: payload, dedupe, priority, client_ids) that decide its columns and indexes. The deploy
    tool tracks it by version and shape, never by its text: a change of the SQL beyond comments is a
    new version with a migration from the one before (docs/upgrades.md; tests/test_storage_versions.py
    fails otherwise), and a kind change is refused. -#}
{% macro unit(name, type, version=none, object=none, shape=()) %}
{% if type == 'storage' %}
-- tablequeue:unit {{ name }} storage v{{ version }} {{ object }}
{% if queue is defined %}
-- tablequeue:shape {{ shape_of(queue, shape) }}
{% endif %}
{% else %}
-- tablequeue:unit {{ name }} {{ type }}
{% endif %}
{%- endmacro %}

{#- A migration step (migrations/*.sql): it runs on its own, in a transaction with a lock timeout
    (retried) or, mode concurrent (PostgreSQL), outside any transaction for CREATE/DROP INDEX
    CONCURRENTLY; it says what it does and what it locks, which the deploy plan prints. after_code:
    it runs once the deploy has replaced the code units (a removal the old procedures still need). -#}
{% macro step(mode, what, locks, after_code=false) %}
-- tablequeue:step {{ mode }}{{ ' after-code' if after_code }} {{ what }}
-- locks: {{ locks | wordwrap(100, wrapstring='\n--        ') }}
{%- endmacro %}

{#- An index built on a table that already holds messages: ONLINE where the edition has online index
    operations (EngineEdition 3: Enterprise, Developer, Evaluation; 5: Azure SQL Database; 8: Azure
    SQL Managed Instance); Standard and Express refuse ONLINE = ON and build it offline. statement:
    the CREATE INDEX without its WITH clause (lines after the first indented by 4); with: other index
    options. -#}
{% macro create_index_online(statement, with='') %}
IF SERVERPROPERTY('EngineEdition') IN (3, 5, 8)
    BEGIN
        {{ statement | indent(8) }}
            WITH ({% if with %}{{ with }}, {% endif %}ONLINE = ON);
    END;
ELSE
    BEGIN
        {{ statement | indent(8) }}{% if with %}

            WITH ({{ with }}){% endif %};
    END;
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

{#- Opens a procedure's argument checks: they run with XACT_ABORT off whatever the caller's session
    has (THROW honours the session setting, and drivers often turn it on), so a refused argument fails
    the call and leaves the caller's open transaction as it was. SQL Server restores the setting when
    the procedure returns; the procedure sets XACT_ABORT ON once the checks are done. -#}
{% macro begin_argument_checks() %}
    -- Arguments first, with XACT_ABORT off: a refused argument leaves the caller's transaction as it was.
    SET XACT_ABORT OFF;
{%- endmacro %}

{#- Batches of every verb are capped at 1,000 items: past ~5,000 row locks on one table SQL Server
    escalates to a table lock, which READPAST cannot skip, and every consumer would wait. -#}
{% macro check_batch_items(verb, tvp='@items') %}
    IF (SELECT COUNT_BIG(*) FROM {{ tvp }}) > 1000
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain('_' ~ verb) }}: at most 1000 items per call.', 1;
        END;
{%- endmacro %}

{#- max_rows bounds one purge call (NULL: everything matching, in chunks that each commit on their
    own); a caller that wants short transactions loops until a call purges fewer than max_rows. In a
    transaction (the caller's, or an implicit one: a driver with autocommit off) every chunk's locks
    would last until it ends, so there max_rows is required. -#}
{% macro check_max_rows(verb) %}
    IF @max_rows < 1
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain('_' ~ verb) }}: max_rows must be at least 1.', 1;
        END;
    IF @max_rows IS NULL AND (@@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0)
        BEGIN
            THROW {{ errors.invalid_argument }}, N'{{ names.plain('_' ~ verb) }}: max_rows is required in a transaction.', 1;
        END;
{%- endmacro %}

{#- One chunk of a purge: at most 1,000 rows (under the lock-escalation threshold however wide the
    rows), never more than max_rows in all. Each chunk seeks from where the last one ended (a keyset
    over the clustered index), so no chunk reads again through the ghosts of the rows before it or the
    rows READPAST left to a consumer. -#}
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


{#- S.Q_wait, every kind: ready = 1 as soon as a message is ready to dequeue, 0 once wait_ms have
    passed; it claims nothing. The caller's block ({% call %}) is the probe, statements that set
    @ready to 1 when what the kind's dequeue would hand out now exists; they read WITH (ROWLOCK,
    READPAST, READCOMMITTEDLOCK): a row a consumer holds is not ready, and the read takes no lock it
    keeps (ROWLOCK: READPAST skips row locks, not a page lock the engine might choose) and no
    snapshot (READCOMMITTEDLOCK under READ_COMMITTED_SNAPSHOT). declarations: what the probe needs. -#}
{% macro wait_procedure(declarations='') %}
{{ unit(names.plain('_wait'), 'code') }}
-- Waiting instead of polling: a probe, then a pause of 50 ms, until a message is ready or wait_ms
-- have passed (the answer comes at most one pause after the timeout). It holds no lock and no
-- snapshot between its probes and never opens a transaction of its own: the caller dequeues
-- afterwards, in its own transaction. In IMPLICIT_TRANSACTIONS mode (a manual-commit caller) the
-- first probe opens the caller's implicit transaction, as any statement would; it holds nothing
-- (READ COMMITTED releases each probe's locks) and the caller ends it as usual. Called inside an
-- open transaction, the caller's own locks stay held while it waits: call it outside one.
CREATE OR ALTER PROCEDURE {{ names.verb('wait') }}
    @wait_ms int = 20000
AS
BEGIN
    SET NOCOUNT ON;
{{ begin_argument_checks() }}
    -- READPAST needs READ COMMITTED (or REPEATABLE READ, which would keep the probe's locks): READ
    -- COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF @wait_ms IS NULL OR @wait_ms NOT BETWEEN 0 AND 20000
        BEGIN
{{ throw('invalid_argument', ["N'" ~ names.plain('_wait') ~ ": wait_ms must be between 0 and 20000, got '",
                              "COALESCE(CONVERT(nvarchar(12), @wait_ms), N'NULL')", "N'.'"]) }}
        END;
    SET XACT_ABORT ON;

    DECLARE @deadline datetime2(7) = DATEADD(MILLISECOND, @wait_ms, SYSUTCDATETIME());
    DECLARE @ready bit = 0;
{% if declarations %}
{{ declarations }}
{% endif %}

    WHILE 1 = 1
        BEGIN
{{ caller() }}
            IF @ready = 1 OR SYSUTCDATETIME() >= @deadline BREAK;
            WAITFOR DELAY '00:00:00.050';
        END;

    SELECT @ready AS ready;
END;
GO

{{ grant('wait') }}
GO
{% endmacro %}
