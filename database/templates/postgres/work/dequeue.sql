{#- PostgreSQL: S.Q_dequeue of the work kind (included by work.sql, whose variables and imports it uses). -#}
{% if groups %}
{#- The claim of messages without a group: the kind's claim, on the partial ix_<q>_ready. -#}
{% macro ungrouped_claim() %}
        WHILE remaining > 0 LOOP
{{ w.claim_by_limit(w.ready_filter('m') ~ " AND m.visible_at <= now_utc", "remaining") | indent(8, first=true) }}
            claimed_ids := claimed_ids || coalesce(step_ids, '{}');
            remaining := batch_size - cardinality(claimed_ids);
            EXIT WHEN buried_count = 0;
        END LOOP;
{%- endmacro %}
{#- The claim of grouped messages, in rounds: lock up to `remaining` groups with a due candidate
    (stepping over held ones and those this call has been to), settle each (its real head, flags
    exact), lease the heads that are due and make them their groups' in-flight message. A head
    buried instead ('lease expired') frees its group: its next message is flagged, and the group
    may be found again in the next round (each such round buries a message: the loop ends). At most
    one message per group, so a batch never holds two of a group. -#}
{% macro grouped_claim() %}
    WHILE remaining > 0 LOOP
{{ grp.discover_round() }}
{{ grp.settle('locked_keys') | indent(4, first=true) }}
{{ w.claim_statement("m.id = ANY(head_ids) AND m.visible_at <= now_utc", "remaining") | indent(4, first=true) }}
        UPDATE {{ grp.groups_t }} AS g
        SET in_flight = m.id
        FROM {{ t }} AS m
        WHERE m.id = ANY(step_ids) AND g.group_key = m.group_key AND g.in_flight IS DISTINCT FROM m.id;
        IF buried_count > 0 THEN
{{ grp.settle('locked_keys') | indent(8, first=true) }}
            -- Their next heads may be due: this round's groups may be found again.
            visited_keys := ARRAY(SELECT v.key FROM unnest(visited_keys) AS v (key) WHERE NOT v.key = ANY(locked_keys));
        END IF;
        claimed_ids := claimed_ids || coalesce(step_ids, '{}');
        remaining := batch_size - cardinality(claimed_ids);
    END LOOP;
{%- endmacro %}
{% endif %}
{% if not has_priority and not groups %}
{#- The claim of one visible message into the OUT parameters, with where it leaves this session's
    claim position (seen_time, seen_id: m.position_seen over the claimed row as the claim found it)
    and whether its lease had expired max_attempts times (claimed_exhausted, w.exhausted; such a row
    goes to the dead-letter table instead). Its LIMIT 1 lease is a join with
    next_messages (claim_ctes), so it returns the rows as they were itself: no second join. -#}
{% macro claim_one() %}
{{ w.claim_ctes(m.position_predicate(position_key) ~ " AND m.visible_at <= now_utc", "1",
   returning="m.id, m.payload, m.enqueued_at, m.due_at, m.attempts, m.lease_token, n.tie, n.visible_at, n.leased_by")
   | indent(8, first=true) }}

            SELECT
                l.id, l.payload, l.enqueued_at, l.due_at, l.attempts, l.lease_token,
                {{ w.exhausted('l.attempts', 'l.visible_at') }}, l.leased_by, l.tie, l.visible_at,
                seen.visible_at, seen.{{ tie }}
            INTO
                id, payload, enqueued_at, due_at, attempts, lease_token,
                claimed_exhausted, claimed_worker, claimed_tie, claimed_time,
                seen_time, seen_id
            FROM leased AS l
{{ m.position_seen(position_key, 'l') | indent(12, first=true) }};
{%- endmacro %}
{% endif %}
{{ m.unit(names.plain('_dequeue'), 'code') }}
-- A dequeue by worker W first takes back W's own unfinished messages: W declares, by asking, that
-- it holds nothing else. A worker name is therefore one single-threaded consumer at a time.
-- Claimed rows whose lease had already expired max_attempts times go to the dead-letter table
-- ('lease expired') instead of to the worker: the claim would be one attempt too many.
CREATE OR REPLACE FUNCTION {{ names.verb('dequeue') }}(
    batch_size integer DEFAULT 1,
    worker text DEFAULT NULL,
    lease_seconds integer DEFAULT NULL
)
RETURNS TABLE (
    id {{ id_type }}, payload {{ payload_type }}, enqueued_at timestamptz, due_at timestamptz, attempts integer, lease_token uuid{% if groups %},
    group_key text{% endif %}

)
{{ m.definer() }}
AS $function$
#variable_conflict use_column
DECLARE
    now_utc timestamptz := clock_timestamp();
    effective_lease integer := coalesce({{ fn }}_dequeue.lease_seconds, {{ lease_seconds }});
    lease_until timestamptz;
    claimed_ids {{ id_type }}[] := '{}';
    step_ids {{ id_type }}[];
    buried_count bigint;
    exhausted_ids {{ id_type }}[];
    exhausted_workers text[];
    remaining integer;
    -- '<time>|<worker>': when this session last found none of that worker's messages leased.
    -- Every lease the worker has taken since was taken at that time or later, so its own claim
    -- need not read back through the entries of the messages it has finished (docs/work-queue.md).
    own_state text := current_setting({{ m.position_setting('.own') }}, true);
    own_since timestamptz := '-infinity';
    -- When this session's next look for expired leases is due (w.expired_due).
    expired_state text := current_setting({{ w.expired_setting() }}, true);
{% if has_priority %}
    current_level integer;
    level_ids {{ id_type }}[];
    level_buried bigint;
{% elif groups %}
    own_keys text[];
    locked_keys text[];
    visited_keys text[] := '{}';
    head_ids {{ id_type }}[];
    ungrouped_at timestamptz;
    ungrouped_tie bigint;
    head_at timestamptz;
    head_tie bigint;
    grouped_first boolean;
{% else %}
    -- How many the steps before the claim from the position took (own messages, expired leases).
    before_ready integer;
    claimed_exhausted boolean;
    claimed_worker text;
    claimed_tie bigint;
    claimed_time timestamptz;
{{ m.position_declare(position_key) }}
{% endif %}
BEGIN
{{ m.check_batch_size('dequeue') }}
{{ m.check_read_committed('dequeue') }}
{{ w.check_worker('dequeue') }}
{{ w.check_lease('dequeue', 'effective_lease') }}
    lease_until := now_utc + make_interval(secs => effective_lease);

    -- 1. Own messages first (leased, even unexpired: a restarted worker): the probe and the claim on
    -- ix_{{ queue.name }}_lease_start (the claim sorts the worker's few leases). The claim the probe guards is needed
    -- only after a restart. A worker name is one single-threaded consumer (contract), so no lease can
    -- come to this worker between the probe and the claim. `>=`: the claim below leases at the
    -- very time it records.
    IF substr(own_state, strpos(own_state, '|') + 1) = {{ fn }}_dequeue.worker AND strpos(own_state, '|') <= 18
        AND own_state ~ '^{{ m.time_pattern() }}\|' THEN
        own_since := {{ m.text_to_time("split_part(own_state, '|', 1)") }};
    END IF;
    IF EXISTS (
        SELECT FROM {{ t }} AS m WHERE m.leased_by = {{ fn }}_dequeue.worker AND m.leased_at >= own_since
    ) THEN
{% if groups %}
{#- An own message the claim will bury: its lease expired with max_attempts used (the claim's
    `exhausted`, read before the claim adds the attempt: claim_statement in _work_macros.sql). -#}
{% set spent = "m.visible_at <= now_utc AND m.attempts >= " ~ max_attempts %}
{% set own = "m.leased_by = " ~ fn ~ "_dequeue.worker AND m.leased_at >= own_since" %}
        -- Re-leasing its own messages changes no group (they are their groups' in-flight messages),
        -- so only the groups of those the claim will bury are locked, first (the fixed lock order):
        -- a message whose expired lease used up max_attempts goes to the dead-letter table, and its
        -- group's next message becomes the head. Whoever holds one of those groups (a producer's or
        -- an acknowledgement's open transaction, purge, another consumer's claim, a wait probe for
        -- an instant) is not waited for: SKIP LOCKED, and the claim leaves out what it would bury in
        -- a group it could not lock. That message stays expired for the next claim, this worker's
        -- or the one that takes its group; until then it keeps this step running on each call of
        -- the worker (docs/work-queue.md, Claim plans). Nobody else leases to this worker and
        -- now_utc is fixed, so the claim buries no message outside this set.
        own_keys := ARRAY(
            SELECT g.group_key FROM {{ grp.groups_t }} AS g
            WHERE g.group_key IN (
                SELECT m.group_key FROM {{ t }} AS m
                WHERE {{ own }} AND {{ spent }}
            )
            ORDER BY g.group_key
            FOR NO KEY UPDATE SKIP LOCKED
        );
{% set own_where %}{{ own }}
            AND NOT (m.group_key IS NOT NULL AND {{ spent }} AND NOT m.group_key = ANY(own_keys)){% endset %}
{{ w.claim_statement(own_where, "batch_size", own=true) | indent(4, first=true) }}
{% else %}
{{ w.claim_statement("m.leased_by = " ~ fn ~ "_dequeue.worker AND m.leased_at >= own_since", "batch_size", own=true) | indent(4, first=true) }}
{% endif %}
        claimed_ids := claimed_ids || coalesce(step_ids, '{}');
{% if groups %}
        IF buried_count > 0 THEN
{{ grp.settle('own_keys') | indent(8, first=true) }}
        END IF;
{% endif %}
    ELSE
        own_state := set_config({{ m.position_setting('.own') }}, {{ m.time_to_text('now_utc') }} || '|' || {{ fn }}_dequeue.worker, false);
    END IF;
    remaining := batch_size - cardinality(claimed_ids);

    -- 2. Expired leases: a crashed or stopped worker's messages{% if groups %} without a group (a grouped head comes
    -- back on ix_{{ queue.name }}_heads){% endif %}. A lease takes a message out of ix_{{ queue.name }}_ready, so they are
    -- found on ix_{{ queue.name }}_lease_start, which this reads whole: at most once a second per session
    -- (w.expired_due; docs/work-queue.md, Expired leases), in that index's order. A look that filled the
    -- batch may have left more behind (a crashed worker's whole batch): the next call looks again.
    IF remaining > 0 AND {{ w.expired_due('expired_state') }} THEN
        WHILE remaining > 0 LOOP
{{ w.claim_by_limit(w.expired_filter('m'), "remaining", order_sql=w.expired_order) | indent(8, first=true) }}
            claimed_ids := claimed_ids || coalesce(step_ids, '{}');
            remaining := batch_size - cardinality(claimed_ids);
            EXIT WHEN buried_count = 0;
        END LOOP;
        IF remaining > 0 THEN
    {{ w.expired_looked('expired_state') }}
        END IF;
    END IF;

    -- 3. Messages nobody leases (new, due, retried, released), on ix_{{ queue.name }}_ready. Separate statements,
    -- never an OR (DESIGN.md §4). A row that goes to the dead-letter table frees its place in the
    -- batch, so claim again until the batch is full or nothing visible is left.
{% if has_priority %}
    -- Priority levels claim from the head of each level (no claim position: docs/work-queue.md).
{% elif groups %}
    -- Messages without a group on ix_{{ queue.name }}_ready, grouped ones on ix_{{ queue.name }}_heads, each from the head of
    -- its index (no claim position: a promoted head can be old). The source with the older first
    -- message is claimed from first, the other fills the batch (docs/queue-kinds.md, Message groups).
    SELECT m.visible_at, m.{{ tie }} INTO ungrouped_at, ungrouped_tie
    FROM {{ t }} AS m
    WHERE {{ w.ready_filter('m') }} AND m.visible_at <= now_utc
    ORDER BY m.visible_at, m.{{ tie }}
    LIMIT 1;
    SELECT m.visible_at, m.{{ tie }} INTO head_at, head_tie
    FROM {{ t }} AS m
    WHERE m.group_head AND m.visible_at <= now_utc
    ORDER BY m.visible_at, m.{{ tie }}
    LIMIT 1;
    grouped_first := head_at IS NOT NULL AND (ungrouped_at IS NULL OR (head_at, head_tie) < (ungrouped_at, ungrouped_tie));
    IF NOT grouped_first THEN
{{ ungrouped_claim() }}
    END IF;
{{ grouped_claim() }}
    IF grouped_first THEN
{{ ungrouped_claim() }}
    END IF;
{% else %}
    -- From this session's claim position (docs/queue-kinds.md, The claim position).
    before_ready := cardinality(claimed_ids);
{{ m.position_load(position_key) }}

    -- One message and nothing taken before: the hot path. The claim fills the OUT parameters (no
    -- read-back) and finds this session's next position itself (m.position_seen: no probe after it).
    IF remaining = 1 AND before_ready = 0 THEN
        LOOP
{{ claim_one() }}
            EXIT WHEN NOT FOUND;
            IF NOT claimed_exhausted THEN
{{ m.position_after_claim(position_key, 'claimed_tie', 'claimed_time') | indent(12, first=true) }}
                RETURN NEXT;
                RETURN;
            END IF;
{{ w.bury("m.id = " ~ fn ~ "_dequeue.id", "g.attempts - 1", "'lease expired'", "claimed_worker", "buried_count") | indent(8, first=true) }}
        END LOOP;
        RETURN;
    END IF;
{% endif %}
{% if not groups %}
    WHILE remaining > 0 LOOP
{% if has_priority %}
        -- A loose index scan: one range scan per priority level present. A single ORDER BY
        -- priority DESC would read past every delayed or leased row of the higher levels on each
        -- claim, and the whole index when nothing is ready.
        step_ids := '{}';
        buried_count := 0;
        current_level := (SELECT m.priority FROM {{ t }} AS m WHERE {{ w.ready_filter('m') }} ORDER BY m.priority DESC LIMIT 1);
        WHILE current_level IS NOT NULL AND cardinality(step_ids) < remaining LOOP
{{ w.claim_by_limit("m.priority = current_level AND " ~ w.ready_filter('m') ~ " AND m.visible_at <= now_utc", "remaining - cardinality(step_ids)", "level_ids", "level_buried") | indent(8, first=true) }}
            step_ids := step_ids || coalesce(level_ids, '{}');
            buried_count := buried_count + level_buried;
            current_level := (
                SELECT m.priority FROM {{ t }} AS m
                WHERE m.priority < current_level AND {{ w.ready_filter('m') }}
                ORDER BY m.priority DESC
                LIMIT 1
            );
        END LOOP;
{% else %}
{{ w.claim_by_limit(m.position_predicate(position_key) ~ " AND m.visible_at <= now_utc", "remaining") | indent(4, first=true) }}
{% endif %}
        claimed_ids := claimed_ids || coalesce(step_ids, '{}');
        remaining := batch_size - cardinality(claimed_ids);
        EXIT WHEN buried_count = 0;
    END LOOP;
{% endif %}
{% if not has_priority and not groups %}
    IF cardinality(claimed_ids) > before_ready THEN
{{ m.position_find(position_key) | indent(4, first=true) }}
    END IF;
{% endif %}

    -- The rows, in claim order (the array's: ORDINALITY), in one statement: a primary-key probe per id
    -- inside it. LATERAL ... OFFSET 0 keeps each probe a nested loop whatever the plan's estimate of
    -- the array (a join over unnest chose a hash join over the whole table at batch 10). One statement
    -- per id, as before, started the executor for each: 20,000 server instructions a message at batch
    -- 100 (docs/BENCHMARKS.md). Its generic plan is kept: no planning per call. Not run when nothing
    -- was claimed: an idle poll would plan it first, and on a drained queue that VACUUM has cut to no
    -- pages (reltuples 0) the plan is a sequential scan per id, kept after the queue fills again.
    IF cardinality(claimed_ids) > 0 THEN
        RETURN QUERY
        SELECT q.id, q.payload, q.enqueued_at, q.due_at, q.attempts, q.lease_token{% if groups %}, q.group_key{% endif %}

        FROM unnest(claimed_ids) WITH ORDINALITY AS c (id, n)
        CROSS JOIN LATERAL (SELECT m.* FROM {{ t }} AS m WHERE m.id = c.id OFFSET 0) AS q
        ORDER BY c.n;
    END IF;
END;
$function$;

{{ m.grant('dequeue') }}
