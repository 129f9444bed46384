-- OAuth connections (issue 13, item 3): a public app's portal token is an OAuth access token
-- that lives 30 minutes, refreshed with a refresh token. Both are kept sealed (envelope
-- encryption: a per-row data key, itself sealed with a key-encryption key from Secret
-- Manager that the row names, never holds), so a database dump holds no usable credential.
-- A revoked refresh token (the portal uninstalled the app) leaves the connection in
-- needs_reauthorization: admission refuses its events as provider_suppressed.
ALTER TABLE connections DROP CONSTRAINT connections_status_check;
ALTER TABLE connections ADD CONSTRAINT connections_status_check
    CHECK (status IN ('active', 'paused', 'disconnected', 'needs_reauthorization'));

CREATE TABLE connection_oauth_tokens (
    connection_id        uuid PRIMARY KEY REFERENCES connections (id),
    -- The environment variable holding the key-encryption key that sealed data_key_sealed.
    kek_env              text NOT NULL CHECK (kek_env ~ '^[A-Z][A-Z0-9_]*$'),
    data_key_sealed      bytea NOT NULL,  -- nonce || AES-256-GCM(kek, data key)
    refresh_token_sealed bytea NOT NULL,  -- nonce || AES-256-GCM(data key, refresh token)
    access_token_sealed  bytea NOT NULL,  -- nonce || AES-256-GCM(data key, access token)
    access_expires_at    timestamptz NOT NULL,
    refreshed_at         timestamptz NOT NULL DEFAULT now()
);
