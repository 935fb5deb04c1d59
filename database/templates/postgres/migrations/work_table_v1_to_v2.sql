{#- work table, storage version 1 (0.1.0) to 2: the lease token. Messages leased before the upgrade
    keep a NULL token: their holders (0.1.0 clients) complete them by worker name, as before. -#}
{% import '_macros.sql' as m with context %}
{{ m.step('transaction', 'add column lease_token',
          'the table, ACCESS EXCLUSIVE for a catalog update (a nullable column without a default: no rewrite)') }}
ALTER TABLE {{ names.obj() }} ADD COLUMN IF NOT EXISTS lease_token uuid;
