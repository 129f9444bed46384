-- Installing a provider app on a portal through OAuth (shared/oauth_install.py).

-- name: oauth_install_state_insert
INSERT INTO oauth_install_states (state_sha256, tenant_id, provider, app_id, redirect_uri,
                                  started_by, expires_at)
VALUES (:state_sha256, :tenant_id, :provider, :app_id, :redirect_uri,
        CAST(:started_by AS uuid), now() + make_interval(secs => :ttl_seconds))
RETURNING expires_at

-- name: oauth_install_state_consume
-- Guarded: only an unused, unexpired state moves, so of two callbacks with one state (a
-- replay, a double click) exactly one goes on to exchange its code.
UPDATE oauth_install_states SET used_at = now()
 WHERE state_sha256 = :state_sha256 AND used_at IS NULL AND expires_at > now()
RETURNING tenant_id, provider, app_id, redirect_uri, started_by::text AS started_by

-- name: oauth_install_state_why
-- Why a state did not move (for the page and the audit): unknown, used or expired.
SELECT tenant_id, app_id, started_by::text AS started_by, used_at IS NOT NULL AS used
  FROM oauth_install_states
 WHERE state_sha256 = :state_sha256

-- name: oauth_install_state_done
UPDATE oauth_install_states SET connection_id = CAST(:connection_id AS uuid)
 WHERE state_sha256 = :state_sha256

-- name: oauth_install_connection_lock
-- The live connection of the portal for this app, if any (the unique index
-- connections_app_account makes it at most one), locked while the grant is replaced.
SELECT id::text AS id, tenant_id, status
  FROM connections
 WHERE provider = :provider AND provider_app_id = :app_id AND provider_account_id = :account_id
   AND status <> 'disconnected'
   FOR UPDATE

-- name: oauth_install_reauthorized
-- Guarded: only a connection waiting for reauthorization becomes active again; a paused one
-- stays paused (its operator paused it), with its new grant.
UPDATE connections SET status = 'active'
 WHERE id = CAST(:connection_id AS uuid) AND status = 'needs_reauthorization'
RETURNING id

-- name: oauth_install_states_trim
-- Retention: an install state is worth keeping only to say "already used" or "expired" to a
-- late or replayed callback; a day past its expiry nobody is coming back with it.
DELETE FROM oauth_install_states
 WHERE expires_at < now() - make_interval(hours => :keep_hours)
