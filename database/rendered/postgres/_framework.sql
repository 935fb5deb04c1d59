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

-- Roles are cluster-wide in PostgreSQL: another database may create the same role concurrently.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queue_producer') THEN
        BEGIN
            CREATE ROLE "queue_producer" NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queue_consumer') THEN
        BEGIN
            CREATE ROLE "queue_consumer" NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queue_admin') THEN
        BEGIN
            CREATE ROLE "queue_admin" NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
END
$roles$;

GRANT USAGE ON SCHEMA "queue" TO "queue_producer", "queue_consumer", "queue_admin";
