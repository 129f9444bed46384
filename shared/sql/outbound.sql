-- Outbound events (migrations/0520_outbound_events.sql): subscriptions, the emit, and the
-- deliveries the sweep sends (shared/publishing/outbound.py).

-- name: outbound_emit
-- One row per enabled subscription of the tenant listening to :event_type, in the caller's
-- transaction; a key written before (a re-executed transaction) writes nothing.
SELECT outbound_emit(CAST(:tenant_id AS text), CAST(:event_type AS text),
                     CAST(:event_key AS text), CAST(:data AS jsonb)) AS written

-- name: outbound_subscription_insert
INSERT INTO outbound_subscriptions (tenant_id, url, event_types, secret_env)
VALUES (:tenant_id, :url, CAST(:event_types AS text[]), :secret_env)
RETURNING id, tenant_id, url, event_types, secret_env, enabled, created_at

-- name: outbound_subscriptions_list
SELECT id, tenant_id, url, event_types, secret_env, enabled, created_at
FROM outbound_subscriptions
WHERE (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
ORDER BY created_at, id

-- name: outbound_subscription_set_enabled
-- Zero rows: no such subscription for the tenant.
UPDATE outbound_subscriptions SET enabled = :enabled
WHERE id = CAST(:subscription_id AS uuid)
  AND (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
RETURNING id, tenant_id, url, event_types, secret_env, enabled, created_at

-- name: outbound_claim
-- Take a time-boxed lease on up to :limit due deliveries and count the attempt. Two sweeps
-- never take one row: FOR UPDATE SKIP LOCKED makes the second skip a row the first is
-- claiming, and once claimed a live lease keeps it out of the subquery; an expired lease (its
-- sender died) is taken over, and that attempt was counted already.
UPDATE outbound_deliveries d
   SET lease_id = CAST(:lease_id AS uuid),
       lease_expires_at = now() + make_interval(secs => CAST(:lease_seconds AS double precision)),
       attempts = d.attempts + 1,
       last_attempt_at = now()
  FROM outbound_subscriptions s
 WHERE s.id = d.subscription_id
   AND d.id IN (SELECT id FROM outbound_deliveries
                 WHERE status = 'pending' AND next_attempt_at <= now()
                   AND (lease_expires_at IS NULL OR lease_expires_at < now())
                 ORDER BY next_attempt_at
                 LIMIT CAST(:limit AS integer)
                   FOR UPDATE SKIP LOCKED)
RETURNING d.id, d.event_type, d.data, d.created_at, d.attempts, d.retry_from, s.url,
          s.secret_env

-- name: outbound_mark_delivered
-- Fenced on our lease: zero rows means the lease expired and another sender took the row over
-- (it sends again: at least once, never marked by a sender that no longer holds it).
UPDATE outbound_deliveries
   SET status = 'delivered', delivered_at = now(), last_status = :last_status,
       last_error = NULL, lease_id = NULL, lease_expires_at = NULL
 WHERE id = :id AND lease_id = CAST(:lease_id AS uuid) AND status = ANY('{pending}')
RETURNING id

-- name: outbound_mark_failed
-- Fenced on our lease as above. Back to pending after :delay_seconds, or given up when this
-- was the last attempt of the budget (attempts - retry_from >= :max_attempts).
UPDATE outbound_deliveries
   SET status = CASE WHEN attempts - retry_from >= CAST(:max_attempts AS integer)
                     THEN 'given_up' ELSE 'pending' END,
       given_up_at = CASE WHEN attempts - retry_from >= CAST(:max_attempts AS integer)
                          THEN now() END,
       next_attempt_at = now() + make_interval(secs => CAST(:delay_seconds AS double precision)),
       last_status = :last_status, last_error = :last_error,
       lease_id = NULL, lease_expires_at = NULL
 WHERE id = :id AND lease_id = CAST(:lease_id AS uuid) AND status = ANY('{pending}')
RETURNING id, status

-- name: outbound_resend
-- Ops: one more round of attempts now, same id (the receiver dedupes on webhook-id). Refused
-- (zero rows) for another tenant's delivery or while an attempt holds a live lease.
UPDATE outbound_deliveries
   SET status = 'pending', next_attempt_at = now(), retry_from = attempts,
       delivered_at = NULL, given_up_at = NULL
 WHERE id = :id
   AND (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
   AND status = ANY('{pending,delivered,given_up}')
   AND (lease_expires_at IS NULL OR lease_expires_at < now())
RETURNING id

-- name: outbound_deliveries_list
SELECT d.id, d.subscription_id, d.tenant_id, d.event_type, d.event_key, d.status, d.attempts,
       d.next_attempt_at, d.last_status, d.last_error, d.last_attempt_at, d.delivered_at,
       d.given_up_at, d.created_at, s.url
FROM outbound_deliveries d JOIN outbound_subscriptions s ON s.id = d.subscription_id
WHERE (CAST(:tenant_id AS text) IS NULL OR d.tenant_id = CAST(:tenant_id AS text))
  AND (CAST(:status AS text) IS NULL OR d.status = CAST(:status AS text))
ORDER BY d.created_at DESC, d.id
LIMIT CAST(:limit AS integer)

-- name: outbound_deliveries_expire
-- Retention: delivered and given-up deliveries finished more than :days ago, a batch at a
-- time (a pending one is never deleted: it is a promise still being kept). SKIP LOCKED so two
-- sweeps never wait on one row.
DELETE FROM outbound_deliveries
WHERE id IN (SELECT id FROM outbound_deliveries
              WHERE status = ANY('{delivered,given_up}')
                AND coalesce(delivered_at, given_up_at)
                    < now() - make_interval(days => CAST(:days AS integer))
              LIMIT CAST(:batch AS integer)
                FOR UPDATE SKIP LOCKED)
