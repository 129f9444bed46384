-- OAuth installs of a HubSpot public app (issue 13, item 3): the ops function sends an
-- operator to the app's authorize URL and takes HubSpot's browser redirect back, exchanging
-- its one-time code for the portal's first grant (sealed in connection_oauth_tokens).

-- The app's OAuth client id: an env var NAME (filled from Secret Manager), never the value,
-- like client_secret_env; HubSpot's OAuth client secret is that same client secret (it also
-- keys the v3 signatures). The scopes the install asks for, and the authorize URL (null:
-- HubSpot's https://app.hubspot.com/oauth/authorize; the fake's locally).
ALTER TABLE provider_apps
    ADD COLUMN oauth_client_id_env text CHECK (oauth_client_id_env ~ '^[A-Z][A-Z0-9_]*$'),
    ADD COLUMN oauth_scopes        text[] NOT NULL DEFAULT '{}',
    ADD COLUMN oauth_authorize_url text;

-- An install in progress. The `state` sent to HubSpot is the only authenticator of the
-- browser redirect that comes back (it arrives without our login), so: unguessable (32 random
-- bytes), stored only as its SHA-256 (a dump does not let anyone finish an install), bound to
-- the tenant and app it was started for, expiring, and used at most once (used_at is set by
-- a guarded UPDATE; the first callback wins).
CREATE TABLE oauth_install_states (
    state_sha256 bytea PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (id),
    provider     text NOT NULL,
    app_id       text NOT NULL,
    redirect_uri text NOT NULL,
    started_by   uuid REFERENCES ops_tokens (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    used_at      timestamptz,
    -- What the callback did with it: the connection it created or re-authorized.
    connection_id uuid REFERENCES connections (id),
    FOREIGN KEY (provider, app_id) REFERENCES provider_apps (provider, app_id)
);
CREATE INDEX oauth_install_states_expiry ON oauth_install_states (expires_at)
    WHERE used_at IS NULL;
