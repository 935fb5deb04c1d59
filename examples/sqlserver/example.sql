-- The SQL Server twin of examples/postgres/example.sql, for sqlcmd: enqueue, wait, dequeue with a
-- lease token, complete, fail, and an error told by its number (docs/errors.md), through the queue's
-- procedures only. Not run on this project's machines (no SQL Server there): tests/test_examples.py
-- checks with check-tsql that every procedure, parameter and column it uses is one that the
-- example catalog (database/queues.yml) deploys: the golden files database/rendered/mssql/.
--
--   sqlcmd -S host -d db -U app -P secret -b -I -i examples/sqlserver/example.sql
--
-- -b: exit code 1 when a statement fails (the THROWs below); -I: QUOTED_IDENTIFIER ON.
SET NOCOUNT ON;
SET XACT_ABORT ON;

DECLARE @worker nvarchar(200) = N'sqlcmd-example';
DECLARE @enqueued TABLE (id bigint NOT NULL, duplicate bit NOT NULL);
DECLARE @leased TABLE (
    id bigint NOT NULL,
    payload nvarchar(MAX) NOT NULL,
    enqueued_at datetime2(7) NOT NULL,
    due_at datetime2(7) NOT NULL,
    attempts int NOT NULL,
    lease_token uniqueidentifier NULL
);
DECLARE @acknowledged TABLE (completed bit NOT NULL);
DECLARE @failed TABLE (outcome varchar(10) NOT NULL);
DECLARE @enqueued_id bigint;
DECLARE @id bigint;
DECLARE @lease_token uniqueidentifier;
DECLARE @payload nvarchar(MAX);
DECLARE @error nvarchar(4000);

-- Producer: one message.
INSERT INTO @enqueued (id, duplicate)
EXEC queue.emails_enqueue @payload = N'{"to": "a@example.com", "template": "welcome"}';
SET @enqueued_id = (SELECT e.id FROM @enqueued AS e);
PRINT CONCAT(N'enqueued message ', @enqueued_id);

-- Consumer: wait for a message instead of polling (WAITFOR steps of 50 ms; give sqlcmd's query
-- timeout, -t, more than wait_ms). Its result, ready, is printed: no transaction is open while it
-- waits (INSERT ... EXEC would wait inside the INSERT's).
EXEC queue.emails_wait @wait_ms = 5000;

-- Lease it on its own, in autocommit: the lease and the attempt it counts commit at once, so a
-- consumer that dies during the work still spends the attempt (and a message that kills every
-- consumer reaches max_attempts and the dead letters).
INSERT INTO @leased (id, payload, enqueued_at, due_at, attempts, lease_token)
EXEC queue.emails_dequeue @batch_size = 1, @worker = @worker, @lease_seconds = 60;
SELECT
    @id = l.id,
    @lease_token = l.lease_token
FROM @leased AS l;
IF @id IS NULL OR @id <> @enqueued_id
    THROW 50000, N'FAILED: the message dequeued is not the one enqueued', 1;
PRINT CONCAT(N'dequeued message ', @id);
-- Then the work and complete with the lease token in one transaction: the work's own writes (none
-- here) commit together with the acknowledgement, or neither does.
BEGIN TRANSACTION;
INSERT INTO @acknowledged (completed)
EXEC queue.emails_complete @id = @id, @worker = @worker, @lease_token = @lease_token;
IF NOT EXISTS (SELECT 1 FROM @acknowledged AS a WHERE a.completed = 1)
    THROW 50000, N'FAILED: complete did not complete the message', 1;
COMMIT TRANSACTION;
PRINT CONCAT(N'completed message ', @id);

-- Work that fails: a message without a recipient. The work's transaction rolls back, and fail
-- records the error: the attempt is spent, the message comes back after retry_after_seconds.
DELETE FROM @enqueued;
INSERT INTO @enqueued (id, duplicate)
EXEC queue.emails_enqueue @payload = N'{"template": "welcome"}';
SET @enqueued_id = (SELECT e.id FROM @enqueued AS e);
DELETE FROM @leased;
INSERT INTO @leased (id, payload, enqueued_at, due_at, attempts, lease_token)
EXEC queue.emails_dequeue @batch_size = 1, @worker = @worker, @lease_seconds = 60;
SELECT
    @id = l.id,
    @lease_token = l.lease_token,
    @payload = l.payload
FROM @leased AS l;
IF @id IS NULL OR @id <> @enqueued_id
    THROW 50000, N'FAILED: the message dequeued is not the one enqueued', 1;
BEGIN TRY
    BEGIN TRANSACTION;
    -- The work: a stand-in for sending the email (its writes would go here).
    IF JSON_VALUE(@payload, N'$.to') IS NULL
        THROW 50000, N'no recipient (payload.to)', 1;
    DELETE FROM @acknowledged;
    INSERT INTO @acknowledged (completed)
    EXEC queue.emails_complete @id = @id, @worker = @worker, @lease_token = @lease_token;
    COMMIT TRANSACTION;
    THROW 50000, N'FAILED: the message without a recipient was completed', 1;
END TRY
BEGIN CATCH
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    IF ERROR_MESSAGE() <> N'no recipient (payload.to)' THROW;
    SET @error = ERROR_MESSAGE();
    INSERT INTO @failed (outcome)
    EXEC queue.emails_fail @id = @id, @worker = @worker, @error = @error, @retry_after_seconds = 60,
        @lease_token = @lease_token;
    IF NOT EXISTS (SELECT 1 FROM @failed AS f WHERE f.outcome = N'retrying')
        THROW 50000, N'FAILED: fail did not record the failed attempt', 1;
    PRINT CONCAT(N'failed message ', @id, N': retrying');
END CATCH;

-- An error told by its number: a batch size of 0 is invalid_argument, 51001. The procedure checks
-- its arguments before it sets XACT_ABORT ON, so a caller's open transaction would survive it.
BEGIN TRY
    EXEC queue.emails_dequeue @batch_size = 0, @worker = @worker;
    THROW 50000, N'FAILED: a batch size of 0 was not refused', 1;
END TRY
BEGIN CATCH
    IF ERROR_NUMBER() <> 51001 THROW;
    PRINT N'refused as documented: 51001 invalid_argument';
END CATCH;
