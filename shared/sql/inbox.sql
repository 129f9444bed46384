-- The raw webhook inbox: store verified bodies, lease them to drainers, settle them.

-- name: inbox_store
-- A provider's identical retry (same connection, same body) is the same row: count it.
INSERT INTO webhook_inbox (connection_id, body_sha256, body, headers)
VALUES (CAST(:connection_id AS uuid), :body_sha256, :body, CAST(:headers AS jsonb))
ON CONFLICT (connection_id, body_sha256)
DO UPDATE SET deliveries = webhook_inbox.deliveries + 1
RETURNING id, deliveries

-- name: inbox_claim
-- A lease is also a postponement: next_attempt_at moves to the lease expiry, so the pending
-- index alone says what is claimable, and a crashed drainer's rows come back by themselves.
UPDATE webhook_inbox i
   SET lease_id = :lease_id,
       lease_expires_at = now() + make_interval(secs => :lease_seconds),
       next_attempt_at = now() + make_interval(secs => :lease_seconds),
       attempts = i.attempts + 1
 WHERE i.id IN (SELECT id FROM webhook_inbox
                 WHERE status = 'pending' AND next_attempt_at <= now()
                 ORDER BY next_attempt_at, id
                 LIMIT :limit
                   FOR UPDATE SKIP LOCKED)
RETURNING i.id, i.connection_id::text AS connection_id, i.body, i.headers, i.attempts

-- name: inbox_lock_leased
-- Inside the processing transaction: still ours? (A lease that expired and was re-claimed
-- has another lease id; then this row is someone else's and we must write nothing.)
SELECT id FROM webhook_inbox
 WHERE id = :id AND lease_id = :lease_id AND status = 'pending'
   FOR UPDATE

-- name: inbox_mark_processed
UPDATE webhook_inbox
   SET status = 'processed', finished_at = now(), lease_id = NULL, lease_expires_at = NULL,
       last_error = NULL, outcome = CAST(:outcome AS jsonb)
 WHERE id = :id AND lease_id = :lease_id AND status = 'pending'

-- name: inbox_mark_rejected
UPDATE webhook_inbox
   SET status = 'rejected', finished_at = now(), lease_id = NULL, lease_expires_at = NULL,
       last_error = :error, outcome = CAST(:outcome AS jsonb)
 WHERE id = :id AND lease_id = :lease_id AND status = 'pending'

-- name: inbox_mark_dead
UPDATE webhook_inbox
   SET status = 'dead', finished_at = now(), lease_id = NULL, lease_expires_at = NULL,
       last_error = :error
 WHERE id = :id AND lease_id = :lease_id AND status = 'pending'

-- name: inbox_schedule_retry
UPDATE webhook_inbox
   SET next_attempt_at = now() + make_interval(secs => :delay_seconds),
       lease_id = NULL, lease_expires_at = NULL, last_error = :error
 WHERE id = :id AND lease_id = :lease_id AND status = 'pending'

-- name: inbox_get
SELECT id, connection_id::text AS connection_id, status, attempts, deliveries, last_error,
       outcome, next_attempt_at, lease_id::text AS lease_id, finished_at
  FROM webhook_inbox
 WHERE id = :id
