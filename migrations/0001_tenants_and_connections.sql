-- Tenants and their connections to CRM providers.
-- A connection names *where* its secrets come from (environment variables filled from Secret
-- Manager in the cloud), never the secrets themselves.

CREATE TABLE tenants (
    id                text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_-]{1,62}$'),
    name              text NOT NULL,
    -- Credits: one conditional UPDATE keeps this from going negative under concurrency.
    credit_balance    bigint NOT NULL DEFAULT 0 CHECK (credit_balance >= 0),
    -- Authors (provider user/app ids) whose changes must never trigger workflows.
    excluded_authors  text[] NOT NULL DEFAULT '{}',
    -- Per-tenant HMAC secret for outbound http.request signatures: the *name* of the env var.
    signing_secret_env text,
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE connections (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id           text NOT NULL REFERENCES tenants (id),
    provider            text NOT NULL CHECK (provider IN ('hubspot', 'standard', 'pipedrive')),
    status              text NOT NULL DEFAULT 'active'
                        CHECK (status IN ('active', 'paused', 'disconnected')),
    -- Names of environment variables, never values.
    webhook_secret_env  text NOT NULL CHECK (webhook_secret_env ~ '^[A-Z][A-Z0-9_]*$'),
    api_credentials_env text CHECK (api_credentials_env ~ '^[A-Z][A-Z0-9_]*$'),
    -- HubSpot signature versions this connection accepts; v1/v2 only by explicit opt-in.
    signature_versions  text[] NOT NULL DEFAULT '{v3}',
    -- Base URL of the provider API (the fake CRM locally; the vendor default when null).
    api_base_url        text,
    -- The provider account (HubSpot portalId) this connection is for.
    provider_account_id text,
    -- Watched fields per object type, used until active workflows define the union.
    watched_fields      jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- Author ids whose changes are suppressed for this connection only.
    excluded_authors    text[] NOT NULL DEFAULT '{}',
    -- Per-connection throttle: calls per window.
    rate_limit_per_window integer NOT NULL DEFAULT 100 CHECK (rate_limit_per_window > 0),
    rate_limit_window_seconds integer NOT NULL DEFAULT 10 CHECK (rate_limit_window_seconds > 0),
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX connections_tenant ON connections (tenant_id);
