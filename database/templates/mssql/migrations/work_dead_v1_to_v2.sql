{#- work: the dead-letter table's storage v1 to v2. With client ids (random GUIDs) v1 clustered the
    table on id, so every dead letter landed on a random page; v2 clusters it on dead_seq, an
    IDENTITY, and keeps the primary key on id NONCLUSTERED for dead_list, dead_requeue and
    dead_delete, as a fresh install has it. Without client ids the id is a bigint IDENTITY already:
    nothing changes, and the migration only records v2 (docs/upgrades.md).
    Every step runs again after a failure: the column is added only while missing, the table is
    rebuilt only while ux_<queue>_dead_seq is not there with its key, and the primary key is added
    only while missing. The rebuild is one step, one transaction: a failure inside it rolls back to
    the table clustered on id. -#}
{% import '_macros.sql' as m with context %}
{% import '_pinned_indexes.sql' as pins with context %}
{% set dead_t = names.obj('_dead') %}
{% set pk = names.index_name('pk', 'dead') %}
{% set ux = names.index_name('ux', 'dead_seq') %}
{% if opt.client_ids %}
{{ m.step('transaction', 'add column dead_seq (bigint IDENTITY)',
          'the dead-letter table, Sch-M for the whole step, every edition: size of data, every row is '
          'written to give it its dead_seq (fail and the dequeue that buries an expired lease wait for it)') }}
IF COL_LENGTH(N'{{ dead_t }}', N'dead_seq') IS NULL
    BEGIN
        ALTER TABLE {{ dead_t }}
        ADD dead_seq bigint IDENTITY (1, 1) NOT NULL;
    END;
GO

{{ m.step('transaction', 'rebuild: clustered on dead_seq, the primary key on id NONCLUSTERED',
          'the dead-letter table, Sch-M for the whole step, every edition: size of data, the table is '
          'rebuilt (dropping the clustered ' ~ pk ~ ' leaves a heap, ' ~ ux ~ ' sorts and writes every '
          'row, then ' ~ pk ~ ' is built again); fail and the dequeue that buries an expired lease wait '
          'for it') }}
IF
    NOT {{ pins.has_key(dead_t, ux, 'dead_seq', clustered=true) | indent(4) }}
    BEGIN
        IF
            INDEXPROPERTY(
                OBJECT_ID(N'{{ dead_t }}'), N'{{ pk }}', 'IsClustered'
            ) = 1
            BEGIN
                ALTER TABLE {{ dead_t }}
                DROP CONSTRAINT {{ names.index('pk', 'dead') }};
            END;

        CREATE UNIQUE CLUSTERED INDEX {{ names.index('ux', 'dead_seq') }}
            ON {{ dead_t }} (dead_seq);
    END;

IF
    INDEXPROPERTY(
        OBJECT_ID(N'{{ dead_t }}'), N'{{ pk }}', 'IndexID'
    ) IS NULL
    BEGIN
        ALTER TABLE {{ dead_t }}
        ADD CONSTRAINT {{ names.index('pk', 'dead') }} PRIMARY KEY NONCLUSTERED (id);
    END;
GO
{% else %}
{{ m.step('transaction', 'record v2: nothing to change (bigint ids are sequential, the table stays clustered on id)',
          'nothing: no statement runs, the deploy history records the new version') }}
-- Nothing to run: v2 changes only the dead-letter table of a queue with client ids.
{% endif %}
