-- The raw webhook inbox: store verified bodies, lease them to drainers, settle them.

-- name: inbox_store
-- A provider's identical retry (same connection, same body) is the same row: count it.
INSERT INTO webhook_inbox (connection_id, body_sha256, body, headers)
VALUES (CAST(:connection_id AS uuid), :body_sha256, :body, CAST(:headers AS jsonb))
ON CONFLICT (connection_id, body_sha256)
DO UPDATE SET deliveries = webhook_inbox.deliveries + 1
RETURNING id, deliveries

-- name: inbox_store_for_app
-- A delivery to an app's URL (events of several portals): stored once, as sent; the drain
-- routes each event to its connection. An identical redelivery to the app is the same row.
INSERT INTO webhook_inbox (app_provider, app_id, body_sha256, body, headers)
VALUES (:app_provider, :app_id, :body_sha256, :body, CAST(:headers AS jsonb))
ON CONFLICT (app_provider, app_id, body_sha256) WHERE app_id IS NOT NULL
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
RETURNING i.id, i.connection_id::text AS connection_id, i.app_provider, i.app_id, i.body,
          i.headers, i.attempts

-- name: inbox_lock_leased
-- Inside the processing transaction: still ours? (A lease that expired and was re-claimed
-- has another lease id; then this row is someone else's and we must write nothing.)
SELECT id FROM webhook_inbox
 WHERE id = :id AND lease_id = :lease_id AND status = 'pending'
   FOR UPDATE

-- name: inbox_lock_leased_batch
-- The batch's fence: the claimed rows still ours, locked in id order (two drainers never hold
-- the same row, but a fixed order costs nothing). A row missing here was re-claimed by
-- another drainer after our lease ran out: we write nothing for it.
SELECT id FROM webhook_inbox
 WHERE id = ANY(CAST(:ids AS bigint[])) AND lease_id = :lease_id AND status = 'pending'
 ORDER BY id
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

-- name: inbox_requeue_dead
-- Ops: a dead row (its transient failures ran out) goes back to pending with a fresh attempt
-- budget, to be drained again once its cause is fixed. Rejected rows are not re-queued: they
-- were verified but can never parse. Zero rows: no dead row with that id for the tenant. A
-- provider app's row (many portals, so many tenants) is the operator's only.
UPDATE webhook_inbox i
   SET status = 'pending', attempts = 0, next_attempt_at = now(), finished_at = NULL,
       last_error = 'requeued by ops after: ' || coalesce(i.last_error, 'no recorded error')
 WHERE i.id = CAST(:inbox_id AS bigint) AND i.status = 'dead'
   AND (CAST(:tenant_id AS text) IS NULL
        OR EXISTS (SELECT 1 FROM connections c
                    WHERE c.id = i.connection_id AND c.tenant_id = CAST(:tenant_id AS text)))
RETURNING i.id

-- name: inbox_dead_list
-- Ops: inbox rows that will not be drained again by themselves (dead) or ever (rejected),
-- newest first, for a tenant and optionally one connection. Bodies are never shown. A
-- provider app's rows (app_id set, no connection) are listed for the operator only.
SELECT i.id, CAST(i.connection_id AS text) AS connection_id, i.app_id, i.status, i.attempts,
       i.deliveries, i.received_at, i.finished_at, i.last_error
  FROM webhook_inbox i LEFT JOIN connections c ON c.id = i.connection_id
 WHERE i.status IN ('dead', 'rejected')
   AND (CAST(:tenant_id AS text) IS NULL OR c.tenant_id = CAST(:tenant_id AS text))
   AND (CAST(:connection_id AS uuid) IS NULL OR i.connection_id = CAST(:connection_id AS uuid))
 ORDER BY i.id DESC
 LIMIT CAST(:limit AS integer)
