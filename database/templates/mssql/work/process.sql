{#- T-SQL: S.Q_process of the work kind (included by work.sql, whose variables and imports it uses). -#}
{%- set handler_q = '[' ~ handler_parts[0] ~ '].[' ~ handler_parts[1] ~ ']' %}
{%- set payload_base = payload_type.split('(')[0] | lower %}
{%- set handler_signature = handler_parts[0] ~ '.' ~ handler_parts[1] ~ '(@id ' ~ id_type ~ ', @payload ' ~ payload_type | lower ~ ')' %}
{{ m.unit(names.plain('_process_handler'), 'code') }}
-- process's check of its handler: @found is 1 when the handler procedure exists with exactly the
-- parameters process passes (@id, @payload, of the queue's types: a narrower payload parameter
-- would cut the payload short without an error), else 0; the same contract as PostgreSQL's check by
-- signature. @chained is 1 when the handler has process's owner: process then reaches it through
-- the ownership chain, with no permission of the caller's checked. EXECUTE AS OWNER: sys.objects and
-- sys.parameters show a caller only objects it holds a permission on, and the admin role runs the
-- handler through the ownership chain without any permission on it, so a check in process itself
-- saw no handler (OBJECT_ID NULL: no_handler for a handler that exists). It needs a database owner
-- that can be impersonated (docs/work-queue.md). No role is granted it: process reaches it through
-- the ownership chain.
CREATE OR ALTER PROCEDURE {{ names.verb('process_handler') }}
    @found bit OUTPUT,
    @chained bit OUTPUT
    WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    -- ON, as every procedure that reads (check-tsql's rule): a run-time error of its catalog reads (a
    -- lock wait, 1222 under the caller's LOCK_TIMEOUT while a handler's ALTER is open) then dooms a
    -- caller's transaction instead of process refusing it with 51003. Rare, and it fails closed.
    SET XACT_ABORT ON;
    DECLARE @handler_name nvarchar(300) = N'{{ handler_q }}';
    DECLARE @handler_id int = OBJECT_ID(@handler_name, N'P');
    -- OwnerId: the object's own owner, else its schema's.
    DECLARE @process_id int = OBJECT_ID(N'{{ names.verb('process') }}', N'P');
    SET @chained = IIF(OBJECTPROPERTY(@handler_id, 'OwnerId') = OBJECTPROPERTY(@process_id, 'OwnerId'), 1, 0);
    SET @found = (
        SELECT
            IIF(
                COUNT(*) = 2
                AND COUNT(
                    CASE
                        WHEN
                            p.name = N'@id' AND p.user_type_id = TYPE_ID(N'{{ id_type }}')
                            AND p.is_output = 0
                            THEN 1
                        WHEN
                            p.name = N'@payload' AND p.user_type_id = TYPE_ID(N'{{ payload_base }}')
                            AND p.max_length = -1 AND p.is_output = 0
                            THEN 1
                    END
                ) = 2,
                1, 0
            )
        FROM sys.parameters AS p
        WHERE p.object_id = @handler_id AND p.parameter_id > 0
    );
END;
GO

{{ m.unit(names.plain('_process'), 'code') }}
-- The in-database worker (Darling's loop): claim one message and commit (the attempt and the lease
-- are durable before the handler runs, so a session that dies mid-message still counts it), run
-- the handler, complete in the same transaction as the handler's own writes, commit; or, when the
-- handler raises, roll its writes back and record its error with fail. Safe to run from many
-- sessions (SQL Agent jobs) at once: each is its own worker, 'process:<session id>', and completes
-- or fails with the token of its lease, as any consumer does.
CREATE OR ALTER PROCEDURE {{ names.verb('process') }}
    @time_budget_seconds int = 60
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);
    -- The handler first, before the transaction check: tSQLt, whose tests all run in a transaction,
    -- can then tell a caller that gets past it (51003 next) from one that does not (51005).
    -- NULL when the check could not run (the database owner cannot be impersonated: 15517): refused
    -- as no handler, never taken for one.
    -- The handler's name is a validated catalog value, quoted here; EXEC @name calls it without
    -- building any SQL text.
    DECLARE @handler_name nvarchar(300) = QUOTENAME(N'{{ handler_parts[0] }}') + N'.' + QUOTENAME(N'{{ handler_parts[1] }}');
    DECLARE @handler_found bit;
    DECLARE @handler_chained bit;
    EXEC {{ names.verb('process_handler') }}
        @found = @handler_found OUTPUT, @chained = @handler_chained OUTPUT;
    IF @handler_found IS NULL
        BEGIN
{{ w.throw('no_handler', ["N'" ~ names.plain('_process') ~ ": could not check handler procedure '", "N'" ~ handler_signature ~ ": '", "N'see the error raised just before this one (most often 15517: its check runs as its owner, '", "N'normally the database owner, who cannot be impersonated; docs/work-queue.md).'"]) }}
        END;
    IF @handler_found = 0
        BEGIN
{{ w.throw('no_handler', ["N'" ~ names.plain('_process') ~ ": handler procedure '", "N'" ~ handler_signature ~ " does not exist.'"]) }}
        END;
    -- A handler of another owner (its schema another principal's) is outside the ownership chain:
    -- SQL Server checks the caller's EXECUTE on it at each call, and without it every message would
    -- fail with 229 until it is dead. Here, in the caller's context, process asks first.
    IF
        COALESCE(@handler_chained, 0) = 0
        AND COALESCE(HAS_PERMS_BY_NAME(@handler_name, N'OBJECT', N'EXECUTE'), 0) = 0
        BEGIN
{{ w.throw('no_handler', ["N'" ~ names.plain('_process') ~ ": handler procedure '", "N'" ~ handler_signature ~ " has another owner than '", "N'" ~ names.plain('_process') ~ " and the caller may not execute it: grant EXECUTE on it, or '", "N'give it process''s owner.'"]) }}
        END;

    -- It commits once per message, so it must not run inside a caller's transaction, nor for a
    -- caller in implicit-transaction mode (ODBC/JDBC autocommit off), whose driver commits or rolls
    -- back what the session did as one transaction: an error would undo earlier messages' work.
    IF @@TRANCOUNT > 0 OR (@@OPTIONS & 2) <> 0
        BEGIN
{{ w.throw('in_transaction', ["N'" ~ names.plain('_process') ~ ": commits once per message: call it in autocommit mode, '", "N'outside any transaction (not with IMPLICIT_TRANSACTIONS ON).'"]) }}
        END;
    IF @time_budget_seconds IS NULL OR @time_budget_seconds NOT BETWEEN 1 AND 86400
        BEGIN
{{ w.throw('invalid_argument', ["N'" ~ names.plain('_process') ~ ": time_budget_seconds must be between 1 and 86400, got '", "COALESCE(CONVERT(nvarchar(12), @time_budget_seconds), N'NULL')", "N'.'"]) }}
        END;

    SET XACT_ABORT ON;

    DECLARE @batch_size int = 1;
    DECLARE @worker nvarchar(200) = CONCAT(N'process:', @@SPID);
    DECLARE @lease_seconds int = {{ lease_seconds }};
    DECLARE @deadline datetime2(7) = DATEADD(SECOND, @time_budget_seconds, SYSUTCDATETIME());
    DECLARE @processed bigint = 0;
    DECLARE @completed bigint = 0;
    DECLARE @failed bigint = 0;
    DECLARE @id {{ id_type }};
    DECLARE @payload {{ payload_type }};
    DECLARE @lease_token uniqueidentifier;
    DECLARE @error nvarchar(4000);
    DECLARE @error_number int;
    DECLARE @transient_retries int;
    DECLARE @pause datetime;
    DECLARE @outcome varchar(8);
{% if groups %}
    DECLARE @step_rows int;
{% endif %}
    DECLARE @handler_unrunnable bit = 0;
    DECLARE @released int;
{{ w.claimed_table() }}

    -- A deadlock (1205), a lock timeout (1222) or a snapshot conflict (3960) says nothing about a
    -- message: whether in the claim, in the handler or in recording a failure, the step runs again
    -- after a short random pause (so that it does not meet the same peer at once), up to 3 times,
    -- without spending an attempt. Any other error of the handler is recorded with fail.
    DECLARE @claim_retries int = 0;
    WHILE SYSUTCDATETIME() < @deadline
        BEGIN
            BEGIN TRY
                -- The claim's DECLAREs that carry a value run again on every pass.
                DELETE FROM @claimed;
{{ w.claim() | indent(12, first=true) }}
            END TRY
            BEGIN CATCH
                IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @claim_retries >= 3 THROW;
                SET @claim_retries = @claim_retries + 1;
{{ w.transient_pause() | indent(12, first=true) }}
                CONTINUE;
            END CATCH;
            SET @claim_retries = 0;

            SET @id = NULL;
            SELECT
                @id = c.id,
                @payload = c.payload,
                @lease_token = c.lease_token{% if groups %},
                @group = c.group_key{% endif %}

            FROM @claimed AS c;
            IF @id IS NULL BREAK;
            SET @processed = @processed + 1;

            -- The handler and complete, in one transaction. @error stays NULL unless the handler
            -- raised something that is to be recorded with fail.
            SET @error = NULL;
            SET @transient_retries = 0;
            WHILE 1 = 1
                BEGIN
                    BEGIN TRY
                        BEGIN TRANSACTION;

                        EXEC @handler_name @id = @id, @payload = @payload;

                        SET @now = SYSUTCDATETIME();
{% if groups %}
                        -- The message's group, waiting (as complete): after the handler's writes,
                        -- which may have joined other groups (a deadlock is retried, as below).
                        IF @group IS NOT NULL
                            BEGIN
                                {{ grp.hold_group() | indent(32) }}
                            END;
{% endif %}
{{ w.complete_statement('@id', '@worker', '@lease_token') | indent(20, first=true) }}
{% if groups %}
                        SET @step_rows = @@ROWCOUNT;
                        IF @group IS NOT NULL AND @step_rows = 1
                            BEGIN
                                {{ grp.settle_work(true) | indent(32) }}
                            END;
                        IF @step_rows = 1
{% else %}
                        IF @@ROWCOUNT = 1
{% endif %}
                            BEGIN
                                COMMIT TRANSACTION;
                                SET @completed = @completed + 1;
                            END;
                        ELSE
                            BEGIN
                                -- The lease expired under the handler and may be another worker's
                                -- now: undo the handler's writes; the message runs again elsewhere.
                                ROLLBACK TRANSACTION;
                            END;
                        BREAK;
                    END TRY
                    BEGIN CATCH
                        SET @error_number = ERROR_NUMBER();
                        SET @error = LEFT(CONCAT(
                            N'error ', @error_number, N' in ', COALESCE(ERROR_PROCEDURE(), N'a batch'),
                            N' line ', ERROR_LINE(), N': ', ERROR_MESSAGE()
                        ), 4000);
                        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                        -- An error that can mean the handler cannot be run (dropped, altered to
                        -- other parameters, EXECUTE revoked: 2812, 201, 8144, 8145, 229) is not
                        -- the message's fault when the handler check now fails: handled after
                        -- this loop. Raised inside a handler that is still there and runnable, it
                        -- is the handler's own error, recorded with fail as any other.
                        -- The check runs inside this CATCH: an error of its own (1222 on the catalog
                        -- read of a handler whose ALTER is still open) ends process with that error,
                        -- the message's attempt counted and its lease left to expire: closed, not lost.
                        IF @error_number IN (229, 2812, 201, 8144, 8145)
                            BEGIN
                                EXEC {{ names.verb('process_handler') }}
                                    @found = @handler_found OUTPUT, @chained = @handler_chained OUTPUT;
                                IF
                                    COALESCE(@handler_found, 0) = 0
                                    OR (
                                        COALESCE(@handler_chained, 0) = 0
                                        AND COALESCE(HAS_PERMS_BY_NAME(@handler_name, N'OBJECT', N'EXECUTE'), 0) = 0
                                    )
                                    BEGIN
                                        SET @handler_unrunnable = 1;
                                        BREAK;
                                    END;
                            END;
                        IF @error_number NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 BREAK;
                        SET @transient_retries = @transient_retries + 1;
                        SET @error = NULL;
{{ w.transient_pause() | indent(20, first=true) }}
                    END CATCH;
                END;

            -- The handler cannot be run: the lease goes back with its attempt, as release gives it
            -- (nothing if the lease had already expired), and process stops with no_handler.
            SET @transient_retries = 0;
            WHILE @handler_unrunnable = 1
                BEGIN
                    BEGIN TRY
                        SET @now = SYSUTCDATETIME();
{{ w.release_statement('@id', '@worker', '@lease_token') | indent(20, first=true) }}
                        SET @released = @@ROWCOUNT;
                        -- What the run did is in the message: the refusal ends it without its row.
{{ w.throw('no_handler', ["N'" ~ names.plain('_process') ~ ": the handler can no longer be run; message '", "@id",
                          "IIF(@released = 1, N' handed back', N' not handed back (its lease was no longer held)')",
                          "N' after '", "@processed", "N' processed, '", "@completed", "N' completed, '", "@failed",
                          "N' failed; the handler''s call raised: '", "@error"]) | indent(12, first=true) }}
                    END TRY
                    BEGIN CATCH
                        IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 THROW;
                        SET @transient_retries = @transient_retries + 1;
{{ w.transient_pause() | indent(20, first=true) }}
                    END CATCH;
                END;

            -- The handler's error, recorded with fail.
            SET @transient_retries = 0;
            WHILE @error IS NOT NULL
                BEGIN
                    BEGIN TRY
                        SET @now = SYSUTCDATETIME();
                        BEGIN TRANSACTION;
{% if groups %}
                        IF @group IS NOT NULL
                            BEGIN
                                {{ grp.hold_group() | indent(32) }}
                            END;
{% endif %}
{{ w.fail_statements('@id', '@worker', '@error', '0', '@lease_token') | indent(20, first=true) }}
{% if groups %}
                        IF @group IS NOT NULL AND @outcome = 'dead'
                            BEGIN
                                {{ grp.settle_work(true) | indent(32) }}
                            END;
{% endif %}
                        COMMIT TRANSACTION;
                        IF @outcome <> 'lost' SET @failed = @failed + 1;
                        SET @error = NULL;
                    END TRY
                    BEGIN CATCH
                        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
                        IF ERROR_NUMBER() NOT IN (1205, 1222, 3960) OR @transient_retries >= 3 THROW;
                        SET @transient_retries = @transient_retries + 1;
{{ w.transient_pause() | indent(20, first=true) }}
                    END CATCH;
                END;
        END;

    SELECT
        @processed AS processed,
        @completed AS completed,
        @failed AS failed;
END;
GO

{{ m.grant('process') }}
GO
