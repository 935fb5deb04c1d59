{#- work: the queue table's storage v1 (0.1.0) to v2: the lease token (issue 20). A message leased
    before the upgrade keeps its lease with a NULL token: its worker completes, fails or extends it
    as 0.1.0 did (by name, a NULL token), and its next lease gets a token. The column comes last
    here, where a fresh install has it after leased_at: no procedure depends on column order. With priority,
    0.1.0's claim index has the name 0.2.0 gives the key without priority (ix_q_claim): its key
    already is the one the 0.2.0 code units pin under ix_q_claim_priority, so it is renamed (0.1.0's
    code names no index in a hint), not built again. Were it not there with that key, the switch
    builds it; after the code units it drops an ix_q_claim still led by priority, and only that: a
    priority-off migration in the same deploy has built ix_q_claim without priority by then for the
    new code (_switch_claim_index.sql). -#}
{% import '_macros.sql' as m with context %}
{% set t = names.obj() %}
{{ m.step('transaction', 'add column lease_token',
          'the table, Sch-M for a metadata change (a nullable column: no row is touched), every edition') }}
IF COL_LENGTH(N'{{ t }}', N'lease_token') IS NULL
    BEGIN
        ALTER TABLE {{ t }}
        ADD lease_token uniqueidentifier NULL;
    END;
GO
{% if opt.priority %}

{% import '_pinned_indexes.sql' as pins with context %}
{% set v010_index = pins.claim_name_v2(false, quoted=false) %}
{% set new_index = pins.claim_name_v2(true, quoted=false) %}
{{ m.step('transaction', 'rename ' ~ v010_index ~ ' (priority leading) to ' ~ new_index,
          'the table, Sch-M briefly for a metadata change (no row is read), every edition') }}
IF
    {{ pins.has_key(t, v010_index, pins.claim_key(true)) | indent(4) }}
    AND INDEXPROPERTY(
        OBJECT_ID(N'{{ t }}'), N'{{ new_index }}', 'IndexID'
    ) IS NULL
    BEGIN
        EXEC sys.sp_rename
            @objname = N'{{ t }}.{{ pins.claim_name_v2(false) }}',
            @newname = N'{{ new_index }}',
            @objtype = N'INDEX';
    END;
GO

{% set priority = true %}
{% set v2 = true %}
{% set old_key = pins.claim_key(true) %}
{% include 'migrations/_switch_claim_index.sql' %}
{% endif %}
