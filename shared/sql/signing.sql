-- Outbound request signing: which environment variable holds a tenant's HMAC secret.

-- name: tenant_signing_secret_env
SELECT signing_secret_env FROM tenants WHERE id = :tenant_id
