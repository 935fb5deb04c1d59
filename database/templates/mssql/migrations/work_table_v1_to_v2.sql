{#- work: the queue table's storage v1 (0.1.0) to v2: the lease token (issue 20). A message leased
    before the upgrade keeps its lease with a NULL token: its worker completes, fails or extends it
    as 0.1.0 did (by name, a NULL token), and its next lease gets a token. The column comes last
    here, where a fresh install has it after leased_at: no procedure depends on column order. -#}
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
