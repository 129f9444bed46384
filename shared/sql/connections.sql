-- Connections: where a tenant's webhooks come from and where its secrets live (env var names).

-- name: connection_get
SELECT id::text AS id, tenant_id, provider, status, webhook_secret_env, api_credentials_env,
       signature_versions, api_base_url, provider_account_id, watched_fields, excluded_authors,
       credential_kind
  FROM connections
 WHERE id = CAST(:connection_id AS uuid)

-- name: connection_get_for_tenant
-- A tenant sees only its own connections: the tenant is part of the key, not a later filter.
SELECT id::text AS id, tenant_id, provider, status, webhook_secret_env, api_credentials_env,
       signature_versions, api_base_url, provider_account_id, watched_fields, excluded_authors,
       credential_kind
  FROM connections
 WHERE id = CAST(:connection_id AS uuid) AND tenant_id = :tenant_id

-- name: connection_insert
INSERT INTO connections (tenant_id, provider, webhook_secret_env, api_credentials_env,
                         signature_versions, api_base_url, provider_account_id, watched_fields,
                         provider_app_id, provider_user_id, credential_kind)
VALUES (:tenant_id, :provider, :webhook_secret_env, :api_credentials_env,
        CAST(:signature_versions AS text[]), :api_base_url, :provider_account_id,
        CAST(:watched_fields AS jsonb), :provider_app_id, :provider_user_id, :credential_kind)
RETURNING id::text AS id

-- name: connection_active_listeners
-- What ACTIVE versions of the tenant's workflows listen to: each trigger, its wait_for
-- steps (a wait can listen to a field no trigger watches), its cancel_on and goal; shared/workflows/listening.py keeps
-- the property changes of this provider. Read straight from the tables the workflows engine
-- owns, so a newly activated version counts on the next drained row.
SELECT v.definition -> 'trigger' AS trigger,
       jsonb_path_query_array(v.definition, '$.steps[*] ? (@.type == "wait_for")') AS waits,
       v.definition -> 'cancel_on' AS cancel_on, v.definition -> 'goal' AS goal
  FROM workflow_activations a
  JOIN workflow_versions v ON v.id = a.version_id
  JOIN workflows w ON w.id = a.workflow_id
 WHERE w.tenant_id = :tenant_id
