{#- The claim index built under its temporary name (ix_Q_claim_new) takes the place and the name of
    the old one. Running it again after it did is harmless: the temporary name is gone. -#}
DO $swap$
BEGIN
    IF to_regclass('{{ names.qualified(names.index_name('ix', 'claim_new')) }}') IS NOT NULL THEN
        DROP INDEX IF EXISTS {{ names.qualified(names.index_name('ix', 'claim')) }};
        ALTER INDEX {{ names.qualified(names.index_name('ix', 'claim_new')) }} RENAME TO {{ names.index('ix', 'claim') }};
    END IF;
END
$swap$;
