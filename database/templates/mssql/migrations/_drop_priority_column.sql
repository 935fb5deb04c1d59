{#- work: option priority turned off for the dead-letter or history table (role: dead | history).
    The new code units no longer name the column: it gets a default first, so that their inserts work
    while it is still there, and goes once they are in place. -#}
{% import '_macros.sql' as m with context %}
{% set table = names.obj('_' ~ role) %}
{% set default = names.index('df', role ~ '_priority') %}
{{ m.step('transaction', 'give column priority a default (0)', 'the ' ~ role ~ ' table, Sch-M for a metadata change, every edition') }}
IF COL_LENGTH(N'{{ table }}', N'priority') IS NOT NULL
    BEGIN
        IF OBJECT_ID(N'{{ names.qualified(names.index_name('df', role ~ '_priority')) }}', N'D') IS NULL
            BEGIN
                ALTER TABLE {{ table }}
                ADD CONSTRAINT {{ default }} DEFAULT (0) FOR priority;
            END;
    END;
GO

{{ m.step('transaction', 'drop column priority', 'the ' ~ role ~ ' table, Sch-M for metadata changes, every edition',
          after_code=true) }}
IF COL_LENGTH(N'{{ table }}', N'priority') IS NOT NULL
    BEGIN
        ALTER TABLE {{ table }}
        DROP CONSTRAINT IF EXISTS {{ default }};

        ALTER TABLE {{ table }} DROP COLUMN priority;
    END;
GO
