{% import '_macros.sql' as m with context %}
{% set history = names.qualified("tablequeue_deploy_history") %}
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

{{ m.unit(schema ~ '.tablequeue_deploy_history', 'storage', version=2, object='table') }}
IF SCHEMA_ID(N'{{ schema }}') IS NULL
    BEGIN
        -- CREATE SCHEMA must be alone in its batch; the name is a validated, quoted catalog identifier.
        EXEC (N'CREATE SCHEMA {{ schema_q }} AUTHORIZATION [dbo];');
    END;
GO

IF OBJECT_ID(N'{{ history }}', N'U') IS NULL
    BEGIN
        CREATE TABLE {{ history }} (
            history_id bigint IDENTITY (1, 1) NOT NULL,
            unit_name nvarchar(256) NOT NULL,
            unit_type varchar(16) NOT NULL,
            queue_name nvarchar(128) NULL,
            tool_version varchar(32) NOT NULL,
            unit_checksum char(64) NOT NULL,
            object_checksum varchar(64) NULL,
            applied_at datetime2(3) NOT NULL
            CONSTRAINT df_tablequeue_deploy_history_applied_at DEFAULT (SYSUTCDATETIME()),
            applied_by nvarchar(128) NOT NULL
            CONSTRAINT df_tablequeue_deploy_history_applied_by DEFAULT (ORIGINAL_LOGIN()),
            duration_ms int NOT NULL,
            -- Storage units: the version and shape the unit has from this row on (0.1.0 recorded
            -- neither: its storage was version 1), and the migration that made it so (NULL: created).
            storage_version int NULL,
            storage_shape varchar(400) NULL,
            migration varchar(200) NULL,
            CONSTRAINT pk_tablequeue_deploy_history PRIMARY KEY CLUSTERED (history_id)
        );

        CREATE INDEX ix_tablequeue_deploy_history_unit ON {{ history }} (unit_name, history_id);
    END;
GO

{{ m.unit(schema ~ '.tablequeue_roles', 'code') }}
{% for role in ('producer', 'consumer', 'admin') %}
IF DATABASE_PRINCIPAL_ID(N'{{ schema }}_{{ role }}') IS NULL
    BEGIN
        CREATE ROLE {{ roles[role] }} AUTHORIZATION [dbo];
    END;
GO
{% if not loop.last %}

{% endif %}
{% endfor %}
