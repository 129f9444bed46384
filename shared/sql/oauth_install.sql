-- Installing a provider app on a portal through OAuth (shared/providers/install.py).

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

-- name: oauth_install_state_pend
-- The callback's result, kept for the confirmation: the portal, the grant (sealed) and the
-- hash of the code only the callback's browser was shown. Guarded on a consumed state that
-- holds no pending install yet: the callback that consumed the state is the only writer.
UPDATE oauth_install_states
   SET portal_id = :portal_id, grant_sealed = :grant_sealed, grant_kek_env = :grant_kek_env,
       confirm_code_sha256 = :confirm_code_sha256,
       confirm_by = now() + make_interval(secs => CAST(:confirm_ttl_seconds AS double precision))
 WHERE state_sha256 = :state_sha256 AND used_at IS NOT NULL AND confirm_code_sha256 IS NULL
RETURNING confirm_by

-- name: oauth_install_confirm
-- The confirmation (ops): only a pending install of this app whose code matches, still in
-- time, not yet confirmed, and started by this very token moves; anything else is zero rows,
-- which the caller answers as an unknown install (it can't tell a wrong code from another
-- tenant's or another token's install, so it says neither). The row lock taken by the CTE
-- makes two confirmations with one code queue: the second re-reads confirmed_at and finds
-- nothing, so exactly one connects the portal. The sealed grant is handed back (from the
-- locked row) and cleared in the same statement.
WITH pending AS (
    SELECT state_sha256, tenant_id, portal_id, grant_sealed, grant_kek_env,
           extract(epoch FROM now() - used_at) AS pending_seconds
      FROM oauth_install_states
     WHERE confirm_code_sha256 = :confirm_code_sha256 AND provider = :provider
       AND app_id = :app_id AND confirmed_at IS NULL AND confirm_by > now()
       AND started_by IS NOT DISTINCT FROM CAST(:token_id AS uuid)
       FOR UPDATE
)
UPDATE oauth_install_states s
   SET confirmed_at = now(), grant_sealed = NULL, grant_kek_env = NULL
  FROM pending p
 WHERE s.state_sha256 = p.state_sha256 AND s.confirmed_at IS NULL
RETURNING s.state_sha256, s.tenant_id, s.portal_id, p.grant_sealed, p.grant_kek_env,
          p.pending_seconds, s.started_by::text AS started_by

-- name: oauth_install_state_done
UPDATE oauth_install_states SET connection_id = CAST(:connection_id AS uuid)
 WHERE state_sha256 = :state_sha256

-- name: oauth_install_portal_owner
-- The tenant the portal's live connection for this app belongs to, if any: the callback
-- refuses early a portal another tenant holds (the confirmation checks again, locked).
SELECT tenant_id
  FROM connections
 WHERE provider = :provider AND provider_app_id = :app_id AND provider_account_id = :account_id
   AND status <> 'disconnected'

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

-- name: oauth_install_lapsed_grants_clear
-- A grant whose install was not confirmed in time is of no use to anyone: the sweep drops it
-- (the row stays, to answer a late confirmation as unknown, until the trim above). Guarded on
-- an unconfirmed, lapsed install still holding a grant: a confirmation in time has already
-- cleared it itself, and a second pass finds zero rows.
UPDATE oauth_install_states SET grant_sealed = NULL, grant_kek_env = NULL
 WHERE grant_sealed IS NOT NULL AND confirmed_at IS NULL AND confirm_by < now()

-- name: pending_install_insert
-- An install that started at the provider (no state): the portal and its grant, sealed, bound
-- to no tenant until a claim (shared/providers/install.py finish_unclaimed). Only the claim
-- code's hash is kept.
INSERT INTO pending_app_installs (provider, app_id, portal_id, grant_sealed, grant_kek_env,
                                  claim_code_sha256, claim_by)
VALUES (:provider, :app_id, :portal_id, :grant_sealed, :grant_kek_env, :claim_code_sha256,
        now() + make_interval(secs => CAST(:claim_ttl_seconds AS double precision)))
RETURNING claim_by

-- name: pending_install_lock
-- The claim (ops), first half: the pending install of this app and portal whose claim code
-- matches, still in time and not yet claimed, locked for the claim's transaction. Zero rows is
-- answered as an unknown install: a wrong code, another portal, a lapsed or an already claimed
-- install look alike, so a guesser learns nothing. Of two claims with one code, the second
-- waits on the lock and, once the first commits, re-reads claimed_at and finds nothing.
SELECT id, grant_sealed, grant_kek_env, claim_code_sha256,
       extract(epoch FROM now() - created_at) AS pending_seconds
  FROM pending_app_installs
 WHERE claim_code_sha256 = :claim_code_sha256 AND provider = :provider
   AND app_id = :app_id AND portal_id = :portal_id
   AND claimed_at IS NULL AND claim_by > now()
   FOR UPDATE

-- name: pending_install_claim
-- The claim's second half, once the portal is known not to be another tenant's: guarded on the
-- row still unclaimed and in time, so exactly one claim moves it (the lock above already
-- queued the others; zero rows here means it lapsed in between). The sealed grant is cleared
-- (the connection holds it from this transaction on).
UPDATE pending_app_installs
   SET claimed_at = now(), tenant_id = :tenant_id, claimed_by = CAST(:token_id AS uuid),
       grant_sealed = NULL, grant_kek_env = NULL
 WHERE id = :id AND claimed_at IS NULL AND claim_by > now()
RETURNING id

-- name: pending_installs_waiting
-- Ops (operators only: the portals are no tenant's yet): installs that started at the provider
-- and wait for a claim, newest first, through the partial index on unclaimed rows.
SELECT provider, app_id, portal_id, created_at, claim_by
  FROM pending_app_installs
 WHERE claimed_at IS NULL AND claim_by > now()
 ORDER BY created_at DESC
 LIMIT 50

-- name: pending_install_done
UPDATE pending_app_installs SET connection_id = CAST(:connection_id AS uuid)
 WHERE id = :id AND claimed_at IS NOT NULL

-- name: pending_lapsed_grants_clear
-- A pending install's grant not claimed in time is of no use to anyone: the sweep drops it (the
-- row stays, to answer a late claim as unknown, until the trim below). Guarded on an
-- unclaimed, lapsed install still holding a grant: a claim in time has cleared it itself, and
-- a second pass finds zero rows.
UPDATE pending_app_installs SET grant_sealed = NULL, grant_kek_env = NULL
 WHERE grant_sealed IS NOT NULL AND claimed_at IS NULL AND claim_by < now()

-- name: pending_installs_trim
-- Retention: a pending install is kept a day past its deadline (claimed or not), then deleted.
DELETE FROM pending_app_installs
 WHERE claim_by < now() - make_interval(hours => :keep_hours)
