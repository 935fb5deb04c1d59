{% import '_macros.sql' as m with context %}
{{ m.unit(schema ~ '.tablequeue_deploy_history', 'storage', version=2, object='table') }}
CREATE SCHEMA IF NOT EXISTS {{ schema_q }};

CREATE TABLE IF NOT EXISTS {{ names.qualified("tablequeue_deploy_history") }} (
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
ON {{ names.qualified("tablequeue_deploy_history") }} (unit_name, history_id);

{{ m.unit(schema ~ '.tablequeue_roles', 'code') }}
-- Roles belong to the cluster, not to a database: {{ schema }}_consumer here is {{ schema }}_consumer of a
-- schema {{ schema }} in every other database of the cluster too, and its members could call those
-- queues wherever they may connect. Each role records in its comment the database it serves; a
-- deploy from another database refuses to share it unless told to (tablequeue deploy --share-roles,
-- which sets tablequeue.share_roles; the deploy tool checks before it applies anything, this block
-- checks again for the hand-run script). Another database may create the same role concurrently.
-- {{ schema }}_owner owns the queues' tables and functions: a SECURITY DEFINER function runs with
-- its owner's rights, which must not be those of whoever deployed it (a superuser, often).
DO $roles$
DECLARE
    claim text := pg_catalog.format('tablequeue: schema %s of database %s', '{{ schema }}', pg_catalog.current_database());
    role_claim text;
BEGIN
{% for role in ('producer', 'consumer', 'admin', 'owner') %}
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{{ schema }}_{{ role }}') THEN
        BEGIN
            CREATE ROLE {{ names.quote(schema ~ '_' ~ role) }} NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
    role_claim := (
        SELECT pg_catalog.shobj_description(r.oid, 'pg_authid') FROM pg_catalog.pg_roles AS r
        WHERE r.rolname = '{{ schema }}_{{ role }}'
    );
    IF role_claim LIKE 'tablequeue: %' AND role_claim <> claim
        AND coalesce(pg_catalog.current_setting('tablequeue.share_roles', true), '') <> 'on' THEN
        RAISE EXCEPTION USING
            ERRCODE = '{{ errors.deploy_refused }}',
            MESSAGE = pg_catalog.format('role {{ schema }}_{{ role }} already serves %s: not shared with %s', substr(role_claim, 13), claim),
            HINT = 'Deploy under another schema name, or share the roles on purpose (tablequeue deploy --share-roles).';
    END IF;
    IF role_claim IS NULL THEN
        EXECUTE pg_catalog.format('COMMENT ON ROLE %I IS %L', '{{ schema }}_{{ role }}', claim);
    END IF;
{% endfor %}
END
$roles$;

-- The deploying role must be a member of the owner role to create or replace what it owns.
GRANT {{ names.quote(schema ~ "_owner") }} TO current_user;
GRANT USAGE ON SCHEMA {{ schema_q }} TO {{ roles.producer }}, {{ roles.consumer }}, {{ roles.admin }};
-- CREATE: PostgreSQL gives a table or function only to an owner that may create in its schema.
GRANT USAGE, CREATE ON SCHEMA {{ schema_q }} TO {{ names.quote(schema ~ '_owner') }};
