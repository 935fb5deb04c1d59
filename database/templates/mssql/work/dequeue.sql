{#- T-SQL: S.Q_dequeue of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_dequeue'), 'code') }}
-- A dequeue by worker W first takes back W's own unfinished messages: by asking, W declares that it
-- holds nothing else. A worker name is therefore one single-threaded consumer at a time.
-- lease_token identifies the lease: complete, fail, extend_lease and release take it back, and a
-- live lease handed out again is the same lease with the same token.
-- @worker is one character wider than leased_by, so that an over-long name reaches the check
-- (invalid_argument) instead of being cut to 200 characters silently.
CREATE OR ALTER PROCEDURE {{ names.verb('dequeue') }}
    @batch_size int = 1,
    @worker nvarchar(201) = NULL,
    @lease_seconds int = NULL
AS
BEGIN
    SET NOCOUNT ON;
{{ m.begin_argument_checks() }}
    -- The claim's hints are refused (READPAST) or lock differently under SERIALIZABLE and SNAPSHOT:
    -- READ COMMITTED whatever the caller's level (SQL Server resets it on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @error_message nvarchar(2048);

{{ w.check_batch_size('dequeue') }}
{{ w.check_worker('dequeue') }}
    SET @lease_seconds = COALESCE(@lease_seconds, {{ lease_seconds }});
{{ w.check_lease('dequeue') }}
    SET XACT_ABORT ON;

{{ w.claimed_table() }}

{{ w.claim() }}

    SELECT
        c.id,
        c.payload,
        c.enqueued_at,
        c.due_at,
        c.attempts,
        c.lease_token{% if groups %},
        c.group_key{% endif %}

    FROM @claimed AS c
    ORDER BY c.own DESC, {{ 'c.priority DESC, ' if has_priority }}c.previous_visible_at ASC, c.{{ tie }} ASC;
END;
GO

{{ m.grant('dequeue') }}
GO
