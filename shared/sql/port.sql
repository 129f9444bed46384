-- What building a CRM port for a connection needs: provider, base URL, the env var holding the
-- API credentials (never the credentials), and the provider app id for subscriptions.

-- name: port_connection_get
-- An OAuth connection (a public app's install) has a sealed grant instead of a token variable;
-- its refreshes take the app's OAuth client, named on the app (HubSpot's OAuth client secret
-- is the app's client secret). Its credential_kind says which (0370).
SELECT c.id::text AS id, c.tenant_id, c.provider, c.status, c.api_base_url,
       c.api_credentials_env, c.provider_app_id, c.idempotency_property, c.webhook_secret_env,
       c.credential_kind, c.credential_kind = 'oauth' AS oauth,
       a.oauth_client_id_env, a.client_secret_env AS oauth_client_secret_env
  FROM connections c
  LEFT JOIN provider_apps a ON a.provider = c.provider AND a.app_id = c.provider_app_id
 WHERE c.id = CAST(:connection_id AS uuid)

-- name: port_connection_set_app_id
UPDATE connections SET provider_app_id = :provider_app_id
 WHERE id = CAST(:connection_id AS uuid)
