-- Installs that start at the provider (issue 26, item 5): a HubSpot admin installs the app from
-- its install URL or a Marketplace listing, and the browser comes back to the app's own
-- callback (`/oauth/<provider>/callback/<app id>`) with a code and no onceflow `state`. Nobody in
-- onceflow started it, so it can't be bound to a tenant at the callback: the code is exchanged
-- and the grant kept here, sealed, bound to nothing, with the hash of a claim code that only
-- the consenting browser was shown. An operator of a tenant claims it in ops with that code
-- and the portal id (shared/providers/install.py `claim`); then, and only then, the portal's
-- connection is made for that tenant.
--
-- Pending: claimed_at IS NULL AND claim_by > now(). Claimed: claimed_at, tenant_id and
-- claimed_by set by the one guarded claim, which clears the sealed grant (the connection holds
-- it), and connection_id in the claim's transaction. Lapsed: claim_by passed; the sweep drops its grant, and the row a day later.
CREATE TABLE pending_app_installs (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider          text NOT NULL,
    app_id            text NOT NULL,
    portal_id         text NOT NULL,
    grant_sealed      bytea,
    grant_kek_env     text,
    claim_code_sha256 bytea NOT NULL UNIQUE,
    created_at        timestamptz NOT NULL DEFAULT now(),
    claim_by          timestamptz NOT NULL,
    claimed_at        timestamptz,
    tenant_id         text REFERENCES tenants (id),
    claimed_by        uuid REFERENCES ops_tokens (id),
    connection_id     uuid REFERENCES connections (id),
    FOREIGN KEY (provider, app_id) REFERENCES provider_apps (provider, app_id),
    CONSTRAINT pending_app_installs_grant_whole
        CHECK ((grant_sealed IS NULL) = (grant_kek_env IS NULL)),
    CONSTRAINT pending_app_installs_claimed_whole
        CHECK ((claimed_at IS NULL) = (tenant_id IS NULL)
               AND (claimed_at IS NULL OR grant_sealed IS NULL)
               AND (connection_id IS NULL OR claimed_at IS NOT NULL))
);
CREATE INDEX pending_app_installs_lapse ON pending_app_installs (claim_by)
    WHERE claimed_at IS NULL;
