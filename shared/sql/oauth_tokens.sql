-- Sealed OAuth tokens per connection (shared/accounts/oauth_tokens.py).

-- name: oauth_tokens_get
SELECT kek_env, data_key_sealed, refresh_token_sealed, access_token_sealed, access_expires_at,
       access_expires_at > now() + make_interval(secs => :margin_seconds) AS fresh
  FROM connection_oauth_tokens
 WHERE connection_id = CAST(:connection_id AS uuid)

-- name: oauth_tokens_lock
-- One refresh in flight per connection across instances: the row lock is held while the
-- refresh request is out; a second caller waits, then finds the token fresh.
SELECT kek_env, data_key_sealed, refresh_token_sealed, access_token_sealed, access_expires_at,
       access_expires_at > now() + make_interval(secs => :margin_seconds) AS fresh
  FROM connection_oauth_tokens
 WHERE connection_id = CAST(:connection_id AS uuid)
   FOR UPDATE

-- name: oauth_tokens_put
-- The grant, and the connection's credential kind made `oauth` in the same statement
-- (migrations/0370): the kind changes only with a grant to back it. The CTE's guard
-- (credential_kind <> 'oauth') makes a refresh's put, which finds the kind already set, update
-- no connection row.
WITH credential AS (
    UPDATE connections SET credential_kind = 'oauth'
     WHERE id = CAST(:connection_id AS uuid) AND credential_kind <> 'oauth'
    RETURNING id
)
INSERT INTO connection_oauth_tokens (connection_id, kek_env, data_key_sealed,
                                     refresh_token_sealed, access_token_sealed,
                                     access_expires_at, refreshed_at)
VALUES (CAST(:connection_id AS uuid), :kek_env, :data_key_sealed, :refresh_token_sealed,
        :access_token_sealed, now() + make_interval(secs => :expires_in), now())
ON CONFLICT (connection_id) DO UPDATE
   SET kek_env = EXCLUDED.kek_env, data_key_sealed = EXCLUDED.data_key_sealed,
       refresh_token_sealed = EXCLUDED.refresh_token_sealed,
       access_token_sealed = EXCLUDED.access_token_sealed,
       access_expires_at = EXCLUDED.access_expires_at, refreshed_at = now()

-- name: oauth_tokens_needs_reauthorization
-- Guarded: only a live connection moves; a disconnected one stays disconnected.
UPDATE connections SET status = 'needs_reauthorization'
 WHERE id = CAST(:connection_id AS uuid) AND status IN ('active', 'paused')
RETURNING id
