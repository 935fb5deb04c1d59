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
{% else %}
{% call m.wait_procedure() %}
            SELECT TOP (1) @ready = 1
            FROM {{ t }} AS m WITH (INDEX ({{ claim_index }}), FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) -- noqa: LT05
            WHERE m.visible_at <= SYSUTCDATETIME();
{% endcall %}
{% endif %}
