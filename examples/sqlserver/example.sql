-- The SQL Server twin of examples/postgres/example.sql, for sqlcmd: enqueue, wait, dequeue with a
-- lease token, complete, and an error told by its number (docs/errors.md), through the queue's
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
DECLARE @waited TABLE (ready bit NOT NULL);
DECLARE @leased TABLE (
    id bigint NOT NULL,
    payload nvarchar(MAX) NOT NULL,
    enqueued_at datetime2(7) NOT NULL,
    due_at datetime2(7) NOT NULL,
    attempts int NOT NULL,
    lease_token uniqueidentifier NULL
);
DECLARE @acknowledged TABLE (completed bit NOT NULL);
DECLARE @enqueued_id bigint;
DECLARE @id bigint;
DECLARE @lease_token uniqueidentifier;

-- Producer: one message.
INSERT INTO @enqueued (id, duplicate)
EXEC queue.emails_enqueue @payload = N'{"to": "a@example.com", "template": "welcome"}';
SET @enqueued_id = (SELECT e.id FROM @enqueued AS e);
PRINT CONCAT(N'enqueued message ', @enqueued_id);

-- Consumer: wait for a message instead of polling (WAITFOR steps of 50 ms; give sqlcmd's query
-- timeout, -t, more than wait_ms).
INSERT INTO @waited (ready)
EXEC queue.emails_wait @wait_ms = 5000;
IF NOT EXISTS (SELECT 1 FROM @waited AS w WHERE w.ready = 1)
    THROW 50000, N'FAILED: nothing was ready within 5 s', 1;

-- Lease it, do the work, complete it with the lease token: one transaction, so the work's own
-- writes (none here) commit together with the acknowledgement.
BEGIN TRANSACTION;
INSERT INTO @leased (id, payload, enqueued_at, due_at, attempts, lease_token)
EXEC queue.emails_dequeue @batch_size = 1, @worker = @worker, @lease_seconds = 60;
SELECT
    @id = l.id,
    @lease_token = l.lease_token
FROM @leased AS l;
IF @id IS NULL OR @id <> @enqueued_id
    THROW 50000, N'FAILED: the message dequeued is not the one enqueued', 1;
PRINT CONCAT(N'dequeued message ', @id);
INSERT INTO @acknowledged (completed)
EXEC queue.emails_complete @id = @id, @worker = @worker, @lease_token = @lease_token;
IF NOT EXISTS (SELECT 1 FROM @acknowledged AS a WHERE a.completed = 1)
    THROW 50000, N'FAILED: complete did not complete the message', 1;
COMMIT TRANSACTION;
PRINT CONCAT(N'completed message ', @id);

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
