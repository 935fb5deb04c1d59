-- A producer and a consumer in psql of the work queue queue.emails of the example catalog
-- (database/queues.yml, what `make demo` deploys), through the queue's functions only: enqueue,
-- wait, dequeue with a lease token, complete, fail, and an error told by its SQLSTATE
-- (docs/errors.md).
--
--   psql "postgresql://app:secret@host:5432/db" -v ON_ERROR_STOP=1 -f examples/postgres/example.sql
--
-- Exit code 0 when every step did what the contract says, 3 otherwise (psql's code for a script that
-- stopped on an error).
\set QUIET on
\set ON_ERROR_STOP on
\set worker 'psql-example'

-- Producer: one message.
SELECT e.id AS enqueued
FROM queue.emails_enqueue(payload => '{"to": "a@example.com", "template": "welcome"}') AS e \gset
\echo enqueued message :enqueued

-- Consumer: wait for a message instead of polling. The wait procedure commits between its 50 ms
-- steps, so it runs outside any transaction (psql's autocommit).
CALL queue.emails_wait(wait_ms => 5000, ready => NULL) \gset
\if :ready
\else
    DO $$ BEGIN RAISE EXCEPTION 'FAILED: nothing was ready within 5 s'; END $$;
\endif

-- Lease it on its own, in autocommit: the lease and the attempt it counts commit at once, so a
-- consumer that dies during the work still spends the attempt (and a message that kills every
-- consumer reaches max_attempts and the dead letters).
SELECT d.id, d.lease_token, d.attempts
FROM queue.emails_dequeue(batch_size => 1, worker => :'worker', lease_seconds => 60) AS d \gset
\echo dequeued message :id (attempt :attempts)
SELECT :id = :enqueued AS same_message \gset
\if :same_message
\else
    DO $$ BEGIN RAISE EXCEPTION 'FAILED: the message dequeued is not the one enqueued'; END $$;
\endif
-- Then the work and complete with the lease token in one transaction: the work's own writes (none
-- here) commit together with the acknowledgement, or neither does.
BEGIN;
SELECT c.completed
FROM queue.emails_complete(id => :id, worker => :'worker', lease_token => :'lease_token') AS c \gset
COMMIT;
\if :completed
    \echo completed message :id
\else
    DO $$ BEGIN RAISE EXCEPTION 'FAILED: complete did not complete the message'; END $$;
\endif

-- Work that fails: a message without a recipient. The work's transaction rolls back, and fail
-- records the error: the attempt is spent, the message comes back after retry_after_seconds.
SELECT e.id AS poison FROM queue.emails_enqueue(payload => '{"template": "welcome"}') AS e \gset
SELECT d.id, d.lease_token, d.payload ? 'to' AS deliverable
FROM queue.emails_dequeue(batch_size => 1, worker => :'worker', lease_seconds => 60) AS d \gset
\if :deliverable
    DO $$ BEGIN RAISE EXCEPTION 'FAILED: the message without a recipient has one'; END $$;
\endif
SELECT f.outcome
FROM queue.emails_fail(id => :id, worker => :'worker', error => 'no recipient (payload.to)',
                       retry_after_seconds => 60, lease_token => :'lease_token') AS f \gset
SELECT :id = :poison AND :'outcome' = 'retrying' AS failed_as_documented \gset
\if :failed_as_documented
    \echo failed message :id: :outcome
\else
    DO $$ BEGIN RAISE EXCEPTION 'FAILED: fail did not record the failed attempt'; END $$;
\endif

-- An error told by its number: a batch size of 0 is invalid_argument (TQ001). psql prints the
-- error; the script carries on and checks which one it was.
\set ON_ERROR_STOP off
SELECT d.id FROM queue.emails_dequeue(batch_size => 0, worker => :'worker') AS d;
\set ON_ERROR_STOP on
SELECT :'LAST_ERROR_SQLSTATE' = 'TQ001' AS refused_as_documented \gset
\if :refused_as_documented
    \echo refused as documented: :LAST_ERROR_SQLSTATE invalid_argument
\else
    DO $$ BEGIN RAISE EXCEPTION 'FAILED: a batch size of 0 was not refused with TQ001'; END $$;
\endif
