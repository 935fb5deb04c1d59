{#- T-SQL: S.Q_stats of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_stats'), 'code') }}
-- EXECUTE AS OWNER: the estimate reads sys.partitions, whose rows a caller holding only the admin
-- role could not see. The procedure only reads.
CREATE OR ALTER PROCEDURE {{ names.verb('stats') }}
    WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    -- Every count stops at exact_limit rows and reads an index range that the count matches; past
    -- the limit the catalog's row count stands in (NServiceBus.SqlServer #481). READPAST: rows a
    -- claim holds right now are not counted, and stats never waits for them.
    -- ready: visible_at <= now (new, due, retried, or with an expired lease: all claimable);
    -- delayed: not yet due and not leased; in_flight: under a live lease. Messages nobody leases are
    -- counted on the claim index (filtered WHERE leased_by IS NULL), leased ones on ix_{{ queue.name }}_lease.
    DECLARE @exact_limit bigint = 10000;
    DECLARE @now datetime2(7) = SYSUTCDATETIME();
    DECLARE @estimated bit = 0;
    DECLARE @ready bigint = 0;
    DECLARE @delayed bigint = 0;
    -- Whether a count stopped at the limit (a sum of counts may pass it and still be exact).
    DECLARE @ready_capped bit = 0;
    DECLARE @delayed_capped bit = 0;
    DECLARE @grouped_capped bit = 0;
    DECLARE @oldest_ready datetime2(7);
{% if has_priority %}
    DECLARE @level_oldest datetime2(7);
    DECLARE @priority int;
{{ w.next_level(false) }}

    -- One priority level at a time on the claim index, as the claim reads it, until both counts
    -- passed the limit (one that did counts no more); each level visited gives its oldest.
    WHILE @priority IS NOT NULL AND (@ready <= @exact_limit OR @delayed <= @exact_limit)
        BEGIN
            IF @ready <= @exact_limit
                SET @ready = @ready + (
                    SELECT COUNT_BIG(*)
                    FROM (
                        SELECT TOP (@exact_limit + 1 - @ready) m.{{ tie }}
                        FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now
                    ) AS counted
                );
            IF @delayed <= @exact_limit
                SET @delayed = @delayed + (
                    SELECT COUNT_BIG(*)
                    FROM (
                        SELECT TOP (@exact_limit + 1 - @delayed) m.{{ tie }}
                        FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at > @now
                    ) AS counted
                );
            SET @level_oldest = (
                SELECT TOP (1) m.visible_at
                FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now
                ORDER BY m.visible_at ASC, m.{{ tie }} ASC
            );
            IF @oldest_ready IS NULL OR @level_oldest < @oldest_ready SET @oldest_ready = @level_oldest;
{{ w.next_level(true) | indent(8, first=true) }}
        END;
    SET @ready_capped = IIF(@ready > @exact_limit, 1, 0);
    SET @delayed_capped = IIF(@delayed > @exact_limit, 1, 0);
{% else %}
{% if groups %}
    -- Messages without a group on their claim index; grouped ones below.
{% endif %}
{% set unleased = 'm.group_key IS NULL AND m.leased_by IS NULL' if groups else 'm.leased_by IS NULL' %}
{% set unleased_hints = ('INDEX (' ~ claim_index ~ '), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05') if groups else 'READPAST, READCOMMITTEDLOCK)' %}
    SET @ready = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.{{ tie }}
            FROM {{ t }} AS m WITH ({{ unleased_hints }}
            WHERE {{ unleased }} AND m.visible_at <= @now
        ) AS counted
    );
    SET @delayed = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.{{ tie }}
            FROM {{ t }} AS m WITH ({{ unleased_hints }}
            WHERE {{ unleased }} AND m.visible_at > @now
        ) AS counted
    );
    SET @ready_capped = IIF(@ready > @exact_limit, 1, 0);
    SET @delayed_capped = IIF(@delayed > @exact_limit, 1, 0);
{% if groups %}
    -- Grouped messages: no index orders them by visible time, so the first @exact_limit + 1 along
    -- ix_{{ queue.name }}_group are read (a bounded read whatever their state). Past that, the figures
    -- are an estimate: the rest of the catalog's row count is split between ready and delayed as
    -- among the rows read (the first groups in key order). Whether there are more is read from the
    -- index alone: the figures' key lookups skip rows a claim holds (READPAST), which must not hide
    -- the cap.
    DECLARE @grouped_rows bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.{{ tie }}
            FROM {{ t }} AS m WITH (INDEX ({{ grp.group_ix }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.group_key IS NOT NULL
            ORDER BY m.group_key ASC, m.group_head ASC, m.{{ tie }} ASC
        ) AS counted
    );
    DECLARE @grouped_ready bigint;
    DECLARE @grouped_delayed bigint;
    SELECT
        @grouped_ready = COALESCE(SUM(IIF(g.leased_by IS NULL AND g.visible_at <= @now, CONVERT(bigint, 1), 0)), 0),
        @grouped_delayed = COALESCE(SUM(IIF(g.leased_by IS NULL AND g.visible_at > @now, CONVERT(bigint, 1), 0)), 0)
    FROM (
        SELECT TOP (@exact_limit + 1)
            m.leased_by,
            m.visible_at
        FROM {{ t }} AS m WITH (INDEX ({{ grp.group_ix }}), ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.group_key IS NOT NULL
        ORDER BY m.group_key ASC, m.group_head ASC, m.{{ tie }} ASC
    ) AS g;
    SET @ready = @ready + @grouped_ready;
    SET @delayed = @delayed + @grouped_delayed;
    SET @grouped_capped = IIF(@grouped_rows > @exact_limit, 1, 0);
    -- The oldest of either claim index: a message waiting behind its group's head is counted in
    -- ready but does not age it (it is not what a dequeue could take).
    DECLARE @oldest_head datetime2(7) = (
        SELECT TOP (1) m.visible_at
        FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.group_head = 1 AND m.visible_at <= @now
        ORDER BY m.visible_at ASC, m.{{ tie }} ASC
    );
    SET @oldest_ready = (
        SELECT TOP (1) m.visible_at
        FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
        WHERE m.group_key IS NULL AND m.leased_by IS NULL AND m.visible_at <= @now
        ORDER BY m.visible_at ASC, m.{{ tie }} ASC
    );
    IF @oldest_ready IS NULL OR @oldest_head < @oldest_ready SET @oldest_ready = @oldest_head;
{% else %}
    SET @oldest_ready = (
        SELECT TOP (1) m.visible_at
        FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
        WHERE m.leased_by IS NULL AND m.visible_at <= @now
        ORDER BY m.visible_at ASC, m.{{ tie }} ASC
    );
{% endif %}
{% endif %}
    -- Expired leases are ready too, the oldest expiry maybe the oldest of all: one lease holder at a
    -- time on ix_{{ queue.name }}_lease (w.next_lease_holder), each holder's oldest first. The count
    -- reads at most the limit and one row over all holders; once past it, only each remaining
    -- holder's oldest (one seek): the oldest stays exact.
    DECLARE @expired bigint = 0;
    DECLARE @oldest_expired datetime2(7);
    DECLARE @holder_oldest datetime2(7);
    DECLARE @look_worker nvarchar(200);
{{ w.next_lease_holder(after=false) }}
    WHILE @look_worker IS NOT NULL
        BEGIN
            -- What is left of the limit and one row; past the limit, the holder's oldest only (TOP (1)).
            SELECT
                @expired = @expired + IIF(@expired > @exact_limit, 0, COUNT_BIG(*)),
                @holder_oldest = MIN(e.visible_at)
            FROM (
                SELECT TOP (IIF(@expired > @exact_limit, 1, @exact_limit + 1 - @expired)) m.visible_at
                FROM {{ t }} AS m WITH (INDEX ({{ lease_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                WHERE m.leased_by = @look_worker AND m.leased_by IS NOT NULL AND m.visible_at <= @now
                ORDER BY m.visible_at
            ) AS e;
            IF @oldest_expired IS NULL OR @holder_oldest < @oldest_expired SET @oldest_expired = @holder_oldest;
{{ w.next_lease_holder() | indent(8, first=true) }}
        END;
    -- Each count stopped at the limit on its own: only one that did is an estimate.
    IF @expired > @exact_limit SET @ready_capped = 1;
    SET @ready = @ready + @expired;
    IF @oldest_ready IS NULL OR @oldest_expired < @oldest_ready SET @oldest_ready = @oldest_expired;
    DECLARE @in_flight bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) m.{{ tie }}
            FROM {{ t }} AS m WITH (READPAST, READCOMMITTEDLOCK)
            WHERE m.leased_by IS NOT NULL AND m.visible_at > @now
        ) AS counted
    );
    DECLARE @dead bigint = (
        SELECT COUNT_BIG(*)
        FROM (
            SELECT TOP (@exact_limit + 1) d.id
            FROM {{ dead_t }} AS d WITH (READPAST, READCOMMITTEDLOCK)
        ) AS counted
    );

    IF @ready_capped = 1 OR @delayed_capped = 1 OR @grouped_capped = 1 OR @in_flight > @exact_limit
        BEGIN
            DECLARE @total_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'{{ t }}') AND p.index_id IN (0, 1)
            );
            SET @estimated = 1;
            -- The catalog's total less the exact counts is the estimate of the one over the limit.
{% if groups %}
            DECLARE @unread bigint = @total_estimate - @ready - @delayed - @in_flight;
            IF @unread IS NULL OR @unread < 0 SET @unread = 0;
            DECLARE @unread_ready bigint = @unread;
            IF @grouped_ready + @grouped_delayed > 0
                SET @unread_ready = @unread * @grouped_ready / (@grouped_ready + @grouped_delayed);
            IF @grouped_capped = 1 AND @ready_capped = 0 AND @delayed_capped = 0 AND @in_flight <= @exact_limit
                BEGIN
                    SET @ready = @ready + @unread_ready;
                    SET @delayed = @delayed + @unread - @unread_ready;
                END;
            ELSE IF @ready_capped = 1 AND{% else %}
            IF @ready_capped = 1 AND{% endif %} @total_estimate - @delayed - @in_flight > @ready
                SET @ready = @total_estimate - @delayed - @in_flight;
            ELSE IF @delayed_capped = 1 AND @total_estimate - @ready - @in_flight > @delayed
                SET @delayed = @total_estimate - @ready - @in_flight;
            ELSE IF @in_flight > @exact_limit AND @total_estimate - @ready - @delayed > @in_flight
                SET @in_flight = @total_estimate - @ready - @delayed;
        END;
    IF @dead > @exact_limit
        BEGIN
            DECLARE @dead_estimate bigint = (
                SELECT SUM(p.rows)
                FROM sys.partitions AS p
                WHERE p.object_id = OBJECT_ID(N'{{ dead_t }}') AND p.index_id IN (0, 1)
            );
            SET @estimated = 1;
            SET @dead = IIF(@dead_estimate > @dead, @dead_estimate, @dead);
        END;

    SELECT
        @ready AS ready,
        @delayed AS delayed,
        @in_flight AS in_flight,
        @dead AS dead,
        CONVERT(float, DATEDIFF_BIG(MICROSECOND, @oldest_ready, @now)) / 1000000.0 AS oldest_ready_age_seconds,
        @estimated AS estimated;
END;
GO

{{ m.grant('stats') }}
GO
