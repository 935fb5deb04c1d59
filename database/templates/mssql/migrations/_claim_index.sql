{#-
  The guarded build of a claim index (work): `index` (words, quoted name, key, filter, as
  _pinned_indexes.sql declares it) on table t, unless an index of that name already has exactly that
  key and filter (pins.has_key). A name that holds another index (another key, another filter, or a
  disabled one) gets the right one built under `temporary` and put in its place in the same
  transaction (DROP INDEX and sp_rename: Sch-M briefly), not by DROP_EXISTING, whose offline form
  holds Sch-M for the whole build. Import with context (names, pins, m).
-#}
{% macro build_claim_index(t, index, temporary) %}
{% set words, quoted, key, filter = index %}
{% set name = quoted | replace('[', '') | replace(']', '') %}
IF
    NOT {{ pins.has_key(t, name, key, filter=filter) | indent(4) }}
    BEGIN
        IF
            INDEXPROPERTY(
                OBJECT_ID(N'{{ t }}'), N'{{ name }}', 'IndexID'
            ) IS NULL
            BEGIN
{{ m.create_index_online(pins.create_index((words, quoted, key, filter), t)) | indent(16, first=true) }}
            END;
        ELSE
            BEGIN
                DROP INDEX IF EXISTS {{ temporary }} ON {{ t }};
{{ m.create_index_online(pins.create_index((words, temporary, key, filter), t)) | indent(16, first=true) }}
                DROP INDEX {{ quoted }} ON {{ t }};
                EXEC sys.sp_rename
                    @objname = N'{{ t }}.{{ temporary }}',
                    @newname = N'{{ name }}',
                    @objtype = N'INDEX';
            END;
    END;
{%- endmacro %}
