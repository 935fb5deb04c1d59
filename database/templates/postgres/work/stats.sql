{#- PostgreSQL: S.Q_stats of the work kind (included by work.sql, whose variables and imports it uses). -#}
{{ m.unit(names.plain('_stats'), 'code') }}
-- ready: visible_at <= now (new, due, retried, or with an expired lease: all claimable);
-- delayed: not yet due and not leased; in_flight: under a live lease; dead: in S.Q_dead.
-- Messages nobody leases are counted on ix_{{ queue.name }}_ready, leased ones (expired or live) on
-- ix_{{ queue.name }}_lease_start: as many as leases held.
CREATE OR REPLACE FUNCTION {{ names.verb('stats') }}()
RETURNS TABLE (
    ready bigint,
    delayed bigint,
    in_flight bigint,
    dead bigint,
    oldest_ready_age_seconds double precision,
    estimated boolean
)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    -- Every count stops at exact_limit rows and reads only an index range that the count matches
    -- (each in its index's order: a plan made with statistics costs LIMIT against a guessed share of
    -- the rows and would take a sequential scan that reads the whole table when few rows match);
    -- past the limit the planner's row estimate stands in, so a deep queue never costs a full scan.
    exact_limit constant bigint := 10000;
    now_utc timestamptz := clock_timestamp();
    ready_count bigint := 0;
    expired_count bigint;
    ready_capped boolean := false;
    delayed_capped boolean := false;
    grouped_capped boolean := false;
{% if groups %}
    grouped_ready bigint;
    grouped_delayed bigint;
    grouped_read bigint;
    unread bigint;
    unread_ready bigint;
{% endif %}
    expired_oldest timestamptz;
    delayed_count bigint := 0;
    in_flight_count bigint;
    dead_count bigint;
    total_estimate bigint;
    is_estimate boolean := false;
    oldest_ready timestamptz;
{% if has_priority %}
    current_level integer;
    level_oldest timestamptz;
{% endif %}
BEGIN
{% if has_priority %}
    -- One priority level at a time, as the claim reads the index, until both counts passed the limit
    -- (one that did reads no more: LIMIT 0); each level visited gives its oldest.
    current_level := (SELECT m.priority FROM {{ t }} AS m WHERE m.leased_by IS NULL ORDER BY m.priority DESC LIMIT 1);
    WHILE current_level IS NOT NULL AND (ready_count <= exact_limit OR delayed_count <= exact_limit) LOOP
        ready_count := ready_count + (SELECT count(*) FROM (
            SELECT 1 FROM {{ t }} AS m
            WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at <= now_utc
            ORDER BY m.visible_at, m.{{ tie }}
            LIMIT greatest(exact_limit + 1 - ready_count, 0)
        ) AS counted);
        delayed_count := delayed_count + (SELECT count(*) FROM (
            SELECT 1 FROM {{ t }} AS m
            WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at > now_utc
            ORDER BY m.visible_at, m.{{ tie }}
            LIMIT greatest(exact_limit + 1 - delayed_count, 0)
        ) AS counted);
        level_oldest := (
            SELECT m.visible_at FROM {{ t }} AS m
            WHERE m.priority = current_level AND m.leased_by IS NULL AND m.visible_at <= now_utc
            ORDER BY m.visible_at, m.{{ tie }}
            LIMIT 1
        );
        oldest_ready := least(oldest_ready, level_oldest);
        current_level := (
            SELECT m.priority FROM {{ t }} AS m
            WHERE m.priority < current_level AND m.leased_by IS NULL
            ORDER BY m.priority DESC
            LIMIT 1
        );
    END LOOP;
    ready_capped := ready_count > exact_limit;
    delayed_capped := delayed_count > exact_limit;
{% else %}
    SELECT count(*) INTO ready_count FROM (
        SELECT 1 FROM {{ t }} AS m WHERE {{ w.ready_filter('m') }} AND m.visible_at <= now_utc
        ORDER BY m.visible_at, m.{{ tie }}
        LIMIT exact_limit + 1
    ) AS counted;
    SELECT count(*) INTO delayed_count FROM (
        SELECT 1 FROM {{ t }} AS m WHERE {{ w.ready_filter('m') }} AND m.visible_at > now_utc
        ORDER BY m.visible_at, m.{{ tie }}
        LIMIT exact_limit + 1
    ) AS counted;
    ready_capped := ready_count > exact_limit;
    delayed_capped := delayed_count > exact_limit;
{% if groups %}
    -- Grouped messages: no index orders them by visible time (ix_{{ queue.name }}_ready holds only those
    -- without a group), so the first exact_limit + 1 along ix_{{ queue.name }}_group are read, a bounded
    -- read whatever their state; past that the figures are an estimate: the rest of the row estimate
    -- is split between ready and delayed as among the rows read (the first groups in key order).
    SELECT
        count(*) FILTER (WHERE g.leased_by IS NULL AND g.visible_at <= now_utc),
        count(*) FILTER (WHERE g.leased_by IS NULL AND g.visible_at > now_utc),
        count(*)
    INTO grouped_ready, grouped_delayed, grouped_read
    FROM (
        SELECT m.leased_by, m.visible_at FROM {{ t }} AS m
        WHERE m.group_key IS NOT NULL
        ORDER BY m.group_key, m.group_head, m.{{ tie }}
        LIMIT exact_limit + 1
    ) AS g;
    ready_count := ready_count + grouped_ready;
    delayed_count := delayed_count + grouped_delayed;
    grouped_capped := grouped_read > exact_limit;
    -- The oldest of either claim index (the ungrouped one is partial): no index orders them all.
    oldest_ready := least(
        (SELECT m.visible_at FROM {{ t }} AS m WHERE {{ w.ready_filter('m') }} AND m.visible_at <= now_utc ORDER BY m.visible_at, m.{{ tie }} LIMIT 1),
        (SELECT m.visible_at FROM {{ t }} AS m WHERE m.group_head AND m.visible_at <= now_utc ORDER BY m.visible_at, m.{{ tie }} LIMIT 1)
    );
{% else %}
    SELECT m.visible_at INTO oldest_ready
    FROM {{ t }} AS m
    WHERE m.leased_by IS NULL AND m.visible_at <= now_utc
    ORDER BY m.visible_at, m.{{ tie }}
    LIMIT 1;
{% endif %}
{% endif %}
    -- Expired leases are ready too, the oldest expiry maybe the oldest of all.
    -- Along ix_{{ queue.name }}_lease_start's order, so that the plan walks it (w.expired_order).
    SELECT count(*), min(e.visible_at) INTO expired_count, expired_oldest FROM (
        SELECT m.visible_at FROM {{ t }} AS m
        WHERE m.leased_by IS NOT NULL AND m.visible_at <= now_utc
        ORDER BY {{ w.expired_order }}
        LIMIT exact_limit + 1
    ) AS e;
    -- Each count stopped at exact_limit on its own: only one that did is an estimate.
    ready_capped := ready_capped OR expired_count > exact_limit;
    ready_count := ready_count + expired_count;
    oldest_ready := least(oldest_ready, expired_oldest);
    SELECT count(*) INTO in_flight_count FROM (
        SELECT 1 FROM {{ t }} AS m
        WHERE m.leased_by IS NOT NULL AND m.visible_at > now_utc
        ORDER BY {{ w.expired_order }}
        LIMIT exact_limit + 1
    ) AS counted;
    SELECT count(*) INTO dead_count FROM (
        SELECT 1 FROM {{ dead_t }} AS d LIMIT exact_limit + 1
    ) AS counted;

    IF ready_capped OR delayed_capped OR grouped_capped OR in_flight_count > exact_limit THEN
        is_estimate := true;
        total_estimate := {{ w.row_estimate(t) }};
{% if groups %}
        IF grouped_capped AND NOT ready_capped AND NOT delayed_capped AND in_flight_count <= exact_limit THEN
            unread := greatest(total_estimate - ready_count - delayed_count - in_flight_count, 0);
            unread_ready := CASE WHEN grouped_ready + grouped_delayed > 0
                THEN unread * grouped_ready / (grouped_ready + grouped_delayed) ELSE unread END;
            ready_count := ready_count + unread_ready;
            delayed_count := delayed_count + unread - unread_ready;
        ELSIF ready_capped THEN
{% else %}
        IF ready_capped THEN
{% endif %}
            ready_count := greatest(ready_count, total_estimate - delayed_count - in_flight_count);
        ELSIF delayed_capped THEN
            delayed_count := greatest(delayed_count, total_estimate - ready_count - in_flight_count);
        ELSE
            in_flight_count := greatest(in_flight_count, total_estimate - ready_count - delayed_count);
        END IF;
    END IF;
    IF dead_count > exact_limit THEN
        is_estimate := true;
        dead_count := greatest(dead_count, {{ w.row_estimate(dead_t) }});
    END IF;

    RETURN QUERY SELECT
        ready_count,
        delayed_count,
        in_flight_count,
        dead_count,
        extract(EPOCH FROM now_utc - oldest_ready)::double precision,
        is_estimate;
END;
$function$;

{{ m.grant('stats') }}
