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
-- Roles are cluster-wide in PostgreSQL: another database may create the same role concurrently.
DO $roles$
BEGIN
{% for role in ('producer', 'consumer', 'admin') %}
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{{ schema }}_{{ role }}') THEN
        BEGIN
            CREATE ROLE {{ roles[role] }} NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
    END IF;
{% endfor %}
END
$roles$;

GRANT USAGE ON SCHEMA {{ schema_q }} TO {{ roles.producer }}, {{ roles.consumer }}, {{ roles.admin }};
