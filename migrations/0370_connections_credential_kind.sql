-- The kind of credential a connection holds, explicit (issue 26 item 3). Until now a
-- connection's credential was "a token in the variable api_credentials_env names" unless a
-- sealed OAuth grant existed for it. HubSpot now has a third kind: service keys, which replace
-- private-app tokens for single-portal integrations (legacy private apps can no longer be
-- created since 28 Sep / 26 Oct 2026; existing ones keep working). Like a token, a service key
-- is a static bearer named by api_credentials_env: it does not expire and has no refresh, and
-- a revoked or rotated one is refused with 401. Unlike one, it cannot be used for webhooks.
--   token        a static API token the provider's account admin made (a HubSpot private
--                app's access token, a Pipedrive API token)
--   service_key  a static service key (HubSpot service keys)
--   oauth        an app install's OAuth grant (connection_oauth_tokens); set when the grant
--                is stored (shared/accounts/oauth_tokens.py store_grant)
ALTER TABLE connections
    ADD COLUMN credential_kind text NOT NULL DEFAULT 'token'
        CHECK (credential_kind IN ('token', 'service_key', 'oauth'));

UPDATE connections c SET credential_kind = 'oauth'
 WHERE EXISTS (SELECT 1 FROM connection_oauth_tokens t WHERE t.connection_id = c.id);
