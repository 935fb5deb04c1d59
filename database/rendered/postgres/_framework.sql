-- tablequeue 0.2.0 | generated: do not edit
-- template: postgres/_framework.sql | dialect: postgres | kind: framework | schema: queue
-- tablequeue:unit queue.tablequeue_deploy_history storage v2 table

CREATE SCHEMA IF NOT EXISTS "queue";

CREATE TABLE IF NOT EXISTS "queue"."tablequeue_deploy_history" (
    history_id bigint GENERATED ALWAYS AS IDENTITY,
    unit_name text NOT NULL,
    unit_type text NOT NULL,
    queue_name text,
    tool_version text NOT NULL,
    unit_checksum char(64) NOT NULL,
    object_checksum text,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    applied_by text NOT NULL DEFAULT session_user,
    duration_ms integer NOT NULL,
    -- Storage units: the version and shape the unit has from this row on (0.1.0 recorded neither:
    -- its storage was version 1), and the migration that made it so (NULL: created).
    storage_version integer,
    storage_shape text,
    migration text,
    CONSTRAINT pk_tablequeue_deploy_history PRIMARY KEY (history_id)
);

CREATE INDEX IF NOT EXISTS ix_tablequeue_deploy_history_unit
ON "queue"."tablequeue_deploy_history" (unit_name, history_id);

-- tablequeue:unit queue.tablequeue_roles code

-- Roles belong to the cluster, not to a database: queue_consumer here is queue_consumer of a
-- schema queue in every other database of the cluster too, and its members could call those
-- queues wherever they may connect. Each role records in its comment the database it serves; a
-- deploy from another database refuses to share it unless told to (tablequeue deploy --share-roles,
-- which sets tablequeue.share_roles; the deploy tool checks before it applies anything, this block
-- checks again for the hand-run script). Another database may create the same role concurrently.
-- queue_owner owns the queues' tables and functions: a SECURITY DEFINER function runs with
-- its owner's rights, which must not be those of whoever deployed it (a superuser, often).
DO $roles$
DECLARE
    claim text := pg_catalog.format('tablequeue: schema %s of database %s', 'queue', pg_catalog.current_database());
    role_claim text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queue_producer') THEN
        BEGIN
            CREATE ROLE "queue_producer" NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
    role_claim := (
        SELECT pg_catalog.shobj_description(r.oid, 'pg_authid') FROM pg_catalog.pg_roles AS r
        WHERE r.rolname = 'queue_producer'
    );
    IF role_claim LIKE 'tablequeue: %' AND role_claim <> claim
        AND coalesce(pg_catalog.current_setting('tablequeue.share_roles', true), '') <> 'on' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TQ007',
            MESSAGE = pg_catalog.format('role queue_producer already serves %s: not shared with %s', substr(role_claim, 13), claim),
            HINT = 'Deploy under another schema name, or share the roles on purpose (tablequeue deploy --share-roles).';
    END IF;
    IF role_claim IS NULL THEN
        EXECUTE pg_catalog.format('COMMENT ON ROLE %I IS %L', 'queue_producer', claim);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queue_consumer') THEN
        BEGIN
            CREATE ROLE "queue_consumer" NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
    role_claim := (
        SELECT pg_catalog.shobj_description(r.oid, 'pg_authid') FROM pg_catalog.pg_roles AS r
        WHERE r.rolname = 'queue_consumer'
    );
    IF role_claim LIKE 'tablequeue: %' AND role_claim <> claim
        AND coalesce(pg_catalog.current_setting('tablequeue.share_roles', true), '') <> 'on' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TQ007',
            MESSAGE = pg_catalog.format('role queue_consumer already serves %s: not shared with %s', substr(role_claim, 13), claim),
            HINT = 'Deploy under another schema name, or share the roles on purpose (tablequeue deploy --share-roles).';
    END IF;
    IF role_claim IS NULL THEN
        EXECUTE pg_catalog.format('COMMENT ON ROLE %I IS %L', 'queue_consumer', claim);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queue_admin') THEN
        BEGIN
            CREATE ROLE "queue_admin" NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
    role_claim := (
        SELECT pg_catalog.shobj_description(r.oid, 'pg_authid') FROM pg_catalog.pg_roles AS r
        WHERE r.rolname = 'queue_admin'
    );
    IF role_claim LIKE 'tablequeue: %' AND role_claim <> claim
        AND coalesce(pg_catalog.current_setting('tablequeue.share_roles', true), '') <> 'on' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TQ007',
            MESSAGE = pg_catalog.format('role queue_admin already serves %s: not shared with %s', substr(role_claim, 13), claim),
            HINT = 'Deploy under another schema name, or share the roles on purpose (tablequeue deploy --share-roles).';
    END IF;
    IF role_claim IS NULL THEN
        EXECUTE pg_catalog.format('COMMENT ON ROLE %I IS %L', 'queue_admin', claim);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queue_owner') THEN
        BEGIN
            CREATE ROLE "queue_owner" NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
    role_claim := (
        SELECT pg_catalog.shobj_description(r.oid, 'pg_authid') FROM pg_catalog.pg_roles AS r
        WHERE r.rolname = 'queue_owner'
    );
    IF role_claim LIKE 'tablequeue: %' AND role_claim <> claim
        AND coalesce(pg_catalog.current_setting('tablequeue.share_roles', true), '') <> 'on' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TQ007',
            MESSAGE = pg_catalog.format('role queue_owner already serves %s: not shared with %s', substr(role_claim, 13), claim),
            HINT = 'Deploy under another schema name, or share the roles on purpose (tablequeue deploy --share-roles).';
    END IF;
    IF role_claim IS NULL THEN
        EXECUTE pg_catalog.format('COMMENT ON ROLE %I IS %L', 'queue_owner', claim);
    END IF;
END
$roles$;

-- The deploying role must be a member of the owner role to create or replace what it owns.
GRANT "queue_owner" TO current_user;
GRANT USAGE ON SCHEMA "queue" TO "queue_producer", "queue_consumer", "queue_admin";
-- CREATE: PostgreSQL gives a table or function only to an owner that may create in its schema.
GRANT USAGE, CREATE ON SCHEMA "queue" TO "queue_owner";
