{#- The claim index built under its temporary name (ix_Q_ready_new) takes the place and the name of
    the old one (ix_Q_ready). Running it again after it did is harmless: the temporary name is gone. -#}
DO $swap$
BEGIN
    IF to_regclass('{{ names.qualified(names.index_name('ix', 'ready_new')) }}') IS NOT NULL THEN
        DROP INDEX IF EXISTS {{ names.qualified(names.index_name('ix', 'ready')) }};
        ALTER INDEX {{ names.qualified(names.index_name('ix', 'ready_new')) }} RENAME TO {{ names.index('ix', 'ready') }};
    END IF;
END
$swap$;
