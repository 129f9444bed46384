-- Workflows, their immutable versions, and trigger bindings (matching is one index lookup).

CREATE TABLE workflows (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id         text NOT NULL REFERENCES tenants (id),
    name              text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name),
    UNIQUE (id, tenant_id)
);

-- A version is immutable and keyed by the hash of its canonical content: publishing the same
-- content again returns the same row.
CREATE TABLE workflow_versions (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workflow_id   uuid NOT NULL REFERENCES workflows (id),
    number        integer NOT NULL CHECK (number > 0),
    content_hash  text NOT NULL CHECK (content_hash ~ '^[0-9a-f]{64}$'),
    definition    jsonb NOT NULL,
    source_text   text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workflow_id, content_hash),
    UNIQUE (workflow_id, number),
    UNIQUE (id, workflow_id)
);

-- Versions never change after publishing.
CREATE FUNCTION workflow_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'workflow versions are immutable (version %)', OLD.id
        USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER workflow_versions_no_update BEFORE UPDATE ON workflow_versions
    FOR EACH ROW EXECUTE FUNCTION workflow_versions_immutable();

-- Which version of a workflow is active (at most one).
CREATE TABLE workflow_activations (
    workflow_id   uuid PRIMARY KEY REFERENCES workflows (id),
    version_id    uuid NOT NULL,
    activated_at  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (version_id, workflow_id) REFERENCES workflow_versions (id, workflow_id)
);

-- One row per (tenant, event type, workflow) of an active version. The primary key's leading
-- columns make "which workflows listen to this event?" one index range scan.
CREATE TABLE trigger_bindings (
    tenant_id    text NOT NULL REFERENCES tenants (id),
    event_type   text NOT NULL,
    workflow_id  uuid NOT NULL,
    version_id   uuid NOT NULL,
    -- What admission needs without re-reading the definition: the trigger, compiled form.
    dedup_mode   text NOT NULL
                 CHECK (dedup_mode IN ('once_per_record', 'not_while_running', 'every_time')),
    PRIMARY KEY (tenant_id, event_type, workflow_id),
    FOREIGN KEY (workflow_id, tenant_id) REFERENCES workflows (id, tenant_id),
    FOREIGN KEY (version_id, workflow_id) REFERENCES workflow_versions (id, workflow_id)
);

-- Provider subscriptions: the last reconcile per connection.
CREATE TABLE subscription_reconciles (
    connection_id   uuid PRIMARY KEY REFERENCES connections (id),
    desired         jsonb NOT NULL,
    result          jsonb NOT NULL,
    ok              boolean NOT NULL,
    reconciled_at   timestamptz NOT NULL DEFAULT now()
);
