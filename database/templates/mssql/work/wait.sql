{#- T-SQL: S.Q_wait of the work kind (included by work.sql, whose variables and imports it uses).
    Ready: visible now (new, due, retried, or its lease expired), as dequeue's second claim sees it. -#}
{% if has_priority %}
{% call m.wait_procedure('    DECLARE @now datetime2(7);\n    DECLARE @priority int;') %}
            -- One seek per priority level present, as the claim walks them (a single range on
            -- visible_at would read every delayed or leased row of the higher levels).
            SET @now = SYSUTCDATETIME();
{{ w.next_level(false) | indent(8, first=true) }}
            WHILE @priority IS NOT NULL AND @ready = 0
                BEGIN
                    SELECT TOP (1) @ready = 1
                    FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                    WHERE m.priority = @priority AND m.visible_at <= @now;
{{ w.next_level(true) | indent(16, first=true) }}
                END;
{% endcall %}
{% elif groups %}
{% call m.wait_procedure() %}
            -- A due message without a group on its claim index, else a due head candidate of a
            -- group nobody holds right now: the first 100 due candidates, each with its groups row
            -- read past a holder (the predicate on locked_at, true for every row, makes the seek
            -- look the heap row up, on which a holder's stamp holds X; the key's U would let a read
            -- through). A group busy with an in-flight message has no due candidate but a producer's
            -- spurious one, which the next claim to visit the group demotes. Only READPAST,
            -- READCOMMITTEDLOCK probes, no U lock.
            SELECT TOP (1) @ready = 1
            FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.group_key IS NULL AND m.visible_at <= SYSUTCDATETIME();
            IF @ready = 0
                BEGIN
                    SELECT TOP (1) @ready = 1
                    FROM (
                        SELECT TOP (100) m.group_key
                        FROM {{ t }} AS m WITH (INDEX ({{ grp.heads_ix }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
                        WHERE m.group_head = 1 AND m.visible_at <= SYSUTCDATETIME()
                        ORDER BY m.visible_at, m.{{ tie }}
                    ) AS c
                    WHERE {{ grp.not_held('c.group_key') | indent(20) }};
                END;
{% endcall %}
{% else %}
{% call m.wait_procedure() %}
            SELECT TOP (1) @ready = 1
            FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.visible_at <= SYSUTCDATETIME();
{% endcall %}
{% endif %}
