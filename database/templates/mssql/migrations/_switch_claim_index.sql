{#-
  work: the claim index for the new priority shape (priority: on or off), built under its own name
  before the code units and the old shape's dropped after them (docs/operations.md): the old code
  units pin the old index and the new ones the new index, each with the key it seeks on, so neither
  fails with 8622 while the deploy runs. One extra index is maintained for that long.
  Included by work_table_add_priority.sql and work_table_drop_priority.sql, which set `priority`.
-#}
{% import '_pinned_indexes.sql' as pins with context %}
{% set t = names.obj() %}
{% set new_index = pins.claim_name(priority, quoted=false) %}
{% set old_index = pins.claim_name(not priority, quoted=false) %}
{{ m.step('transaction', 'build ' ~ new_index ~ (' (priority leading)' if priority else ' (without priority)'),
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start and at the end); Standard, Express: S on the table for the build (writes wait)') }}
IF
    INDEXPROPERTY(
        OBJECT_ID(N'{{ t }}'), N'{{ new_index }}', 'IndexID'
    ) IS NULL
    BEGIN
{{ m.create_index_online(pins.create_index(('NONCLUSTERED', pins.claim_name(priority), pins.claim_key(priority), none), t)) | indent(8, first=true) }}
    END;
GO

{{ m.step('transaction', 'drop ' ~ old_index, 'the table, Sch-M briefly, every edition', after_code=true) }}
DROP INDEX IF EXISTS {{ pins.claim_name(not priority) }} ON {{ t }};
GO
