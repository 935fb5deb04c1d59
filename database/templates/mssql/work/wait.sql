{#- T-SQL: S.Q_wait of the work kind (included by work.sql, whose variables and imports it uses).
    Ready: visible now and nobody's lease (new, due, retried, released), as dequeue's claim sees it,
    or an expired lease when this session's look for them is due (w.look_for_expired_leases): not
    sooner, or the caller would dequeue nothing and be woken again at once until its look is due. -#}
{#- A probe that finds no expired lease counts as the session's look (the next is due a second later),
    as dequeue's does: the probe reads the lease index, one lease holder at a time (w.next_lease_holder),
    and would otherwise do so at every step of the wait. -#}
{% macro expired_probe() %}
            IF @ready = 0
                BEGIN
                    SET @next_look = SESSION_CONTEXT({{ w.look_key }});
                    SET @look_due = {{ w.look_due() | indent(16) }};
                    IF @look_due = 1
                        BEGIN
{{ w.next_lease_holder(after=false) | indent(24, first=true) }}
                            WHILE @look_worker IS NOT NULL AND @ready = 0
                                BEGIN
                                    SELECT TOP (1) @ready = 1
                                    FROM {{ t }} AS m WITH (INDEX ({{ lease_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                                    WHERE
                                        {{ w.expired_where | replace('\n            ', '\n                                        ') }};
                                    IF @ready = 0
                                        BEGIN
{{ w.next_lease_holder() | indent(40, first=true) }}
                                        END;
                                END;
                            IF @ready = 0
                                BEGIN
{{ w.record_look() | indent(32, first=true) }}
                                END;
                        END;
                END;
{%- endmacro %}
{% set look_declarations = '    DECLARE @next_look sql_variant;\n    DECLARE @look_due bit;\n    DECLARE @look_after datetime2(7);\n    DECLARE @look_worker nvarchar(200);' %}
{% if has_priority %}
{% call m.wait_procedure('    DECLARE @now datetime2(7);\n    DECLARE @priority int;\n' ~ look_declarations) %}
            -- One seek per priority level present, as the claim walks them (a single range on
            -- visible_at would read every delayed or leased row of the higher levels).
            SET @now = SYSUTCDATETIME();
{{ w.next_level(false) | indent(8, first=true) }}
            WHILE @priority IS NOT NULL AND @ready = 0
                BEGIN
                    SELECT TOP (1) @ready = 1
                    FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.priority = @priority AND m.leased_by IS NULL AND m.visible_at <= @now;
{{ w.next_level(true) | indent(16, first=true) }}
                END;
{{ expired_probe() }}
{% endcall %}
{% elif groups %}
{% set wait_declarations %}
    DECLARE @now datetime2(7);
    DECLARE @after_at datetime2(7) = '00010101';
    DECLARE @after_tie bigint = 0;
    DECLARE @window TABLE (
        visible_at datetime2(7) NOT NULL,
        tie bigint NOT NULL,
        group_key {{ key_type }} NOT NULL, -- noqa: CP02
        PRIMARY KEY (visible_at, tie)
    );
{{ look_declarations }}
{%- endset %}
{% call m.wait_procedure(wait_declarations) %}
            -- A due message without a group on its claim index, else a due head candidate of a
            -- group nobody holds right now, each with its groups row read past a holder (the
            -- predicate on locked_at, true for every row, makes the seek look the heap row up, on
            -- which a holder's stamp holds X; the key's U would let a read through). A group busy
            -- with an in-flight message has no due candidate but a producer's spurious one, which
            -- the next claim to visit the group demotes. Only READPAST, READCOMMITTEDLOCK probes,
            -- no U lock.
            -- Bounded: a step reads a window of 100 candidates in claim order, and the window
            -- slides across the steps (the next starts after this one's last, and from the start
            -- again once a window reaches the end), as fifo's wait: 100 or more spurious candidates
            -- of held groups ahead of a free group's head delay ready by a step per 100, not for
            -- the whole hold.
            SET @now = SYSUTCDATETIME();
            SELECT TOP (1) @ready = 1
            FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.group_key IS NULL AND m.leased_by IS NULL AND m.visible_at <= @now;
            IF @ready = 0
                BEGIN
                    DELETE FROM @window;
                    INSERT INTO @window (visible_at, tie, group_key)
                    SELECT TOP (100)
                        m.visible_at,
                        m.{{ tie }},
                        m.group_key
                    FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE
                        m.group_head = 1 AND m.visible_at >= @after_at AND m.visible_at <= @now
                        -- after the last window's last candidate (residual: no OR, the seek stays)
                        AND NOT (m.visible_at = @after_at AND m.{{ tie }} <= @after_tie)
                    ORDER BY m.visible_at, m.{{ tie }};
                    SELECT TOP (1) @ready = 1
                    FROM @window AS c
                    WHERE {{ grp.not_held('c.group_key') | indent(20) }};
                    -- The next window: after this one, or from the start when this one was the last.
                    IF (SELECT COUNT(*) FROM @window) < 100
                        BEGIN
                            SET @after_at = '00010101';
                            SET @after_tie = 0;
                        END;
                    ELSE
                        BEGIN
                            SELECT TOP (1)
                                @after_at = c.visible_at,
                                @after_tie = c.tie
                            FROM @window AS c
                            ORDER BY c.visible_at DESC, c.tie DESC;
                        END;
                END;
{{ expired_probe() }}
{% endcall %}
{% else %}
{% call m.wait_procedure('    DECLARE @now datetime2(7);\n' ~ look_declarations) %}
            SET @now = SYSUTCDATETIME();
            SELECT TOP (1) @ready = 1
            FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.leased_by IS NULL AND m.visible_at <= @now;
{{ expired_probe() }}
{% endcall %}
{% endif %}
