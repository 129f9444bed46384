-- What building a CRM port for a connection needs: provider, base URL, the env var holding the
-- API credentials (never the credentials), and the provider app id for subscriptions.

-- name: port_connection_get
SELECT id::text AS id, tenant_id, provider, status, api_base_url, api_credentials_env,
       provider_app_id, idempotency_property
  FROM connections
 WHERE id = CAST(:connection_id AS uuid)

-- name: port_connection_set_app_id
UPDATE connections SET provider_app_id = :provider_app_id
 WHERE id = CAST(:connection_id AS uuid)
