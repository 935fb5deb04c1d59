{#- work: the queue table's storage v1 (0.1.0) to v2: the lease token (issue 20). A message leased
    before the upgrade keeps its lease with a NULL token: its worker completes, fails or extends it
    as 0.1.0 did (by name, a NULL token), and its next lease gets a token. The column comes last
    here, where a fresh install has it after leased_at: no procedure depends on column order. With priority,
    0.1.0's claim index has the name 0.2.0 gives the key without priority: the index the 0.2.0 code
    units pin is built under its own name and 0.1.0's dropped after them (_switch_claim_index.sql;
    0.1.0's code names no index in a hint). -#}
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

{% set priority = true %}
{% include 'migrations/_switch_claim_index.sql' %}
{% endif %}
