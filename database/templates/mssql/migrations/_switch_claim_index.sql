{#-
  work: the claim index for the new priority shape (priority: on or off), built under its own name
  before the code units and the old shape's dropped after them (docs/operations.md): the old code
  units pin the old index and the new ones the new index, each with the key it seeks on, so neither
  fails with 8622 while the deploy runs. One extra index is maintained for that long.
  The build is guarded by the index's key, not its name alone: a name holding another key (0.1.0's
  ix_q_claim led by priority, seen by a priority-off migration after v1_to_v2) gets the key the new
  code seeks on. Not by DROP_EXISTING, whose offline form (Standard, Express) holds Sch-M on the
  table for the whole build, blocking reads too: the new key is built under a temporary name
  (ix_q_claim_new, as the PostgreSQL twin does; offline: S, writes wait, reads go on), then, in the
  same step's transaction, the old one dropped and the new one renamed (Sch-M briefly). One
  transaction: a failed step leaves neither half, and a re-run starts again from the guard.
  old_key (optional): drop the old index only while it has that key (v1_to_v2: 0.1.0's shape, so
  that a claim index without priority that a later migration of the same deploy built is kept).
  Included by work_table_add_priority.sql and work_table_drop_priority.sql (storage v3: the claim
  indexes ix_q_ready and ix_q_ready_priority, filtered WHERE leased_by IS NULL) and by
  work_table_v1_to_v2.sql (`v2` set: storage v2's ix_q_claim and ix_q_claim_priority, no filter),
  which set `priority`.
-#}
{% import '_pinned_indexes.sql' as pins with context %}
{% import 'migrations/_claim_index.sql' as ci with context %}
{% set t = names.obj() %}
{% set to_v2 = v2 is defined and v2 %}
{% set name_of = pins.claim_name_v2 if to_v2 else pins.claim_name %}
{% set filter = none if to_v2 else pins.ready_filter %}
{% set temporary = names.index('ix', 'claim_new' if to_v2 else 'ready_new') %}
{% set new_index = name_of(priority, quoted=false) %}
{% set old_index = name_of(not priority, quoted=false) %}
{{ m.step('transaction', 'build ' ~ new_index ~ (' (priority leading)' if priority else ' (without priority)'),
          'Enterprise, Developer, Azure SQL: ONLINE (S briefly at the start and at the end); Standard, Express: S on the table for the build (writes wait, reads go on); a name holding another key: the same build under a temporary name, then Sch-M briefly to drop the old index and rename the new one') }}
{{ ci.build_claim_index(t, ('NONCLUSTERED', name_of(priority), pins.claim_key(priority), filter), temporary) }}
GO

{{ m.step('transaction', 'drop ' ~ old_index, 'the table, Sch-M briefly, every edition', after_code=true) }}
{% if old_key is defined %}
IF
    {{ pins.has_key(t, old_index, old_key) | indent(4) }}
    BEGIN
        -- IF EXISTS under the guard: check-tsql does not model sp_rename, so after a build that
        -- renamed (above, or an earlier migration's) it no longer sees this name as there.
        DROP INDEX IF EXISTS {{ name_of(not priority) }} ON {{ t }};
    END;
{% else %}
DROP INDEX IF EXISTS {{ name_of(not priority) }} ON {{ t }};
{% endif %}
GO
