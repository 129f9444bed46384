-- Webhook triggers: the workflow a POST is addressed to, idempotency keys, refusals.

-- name: webhook_trigger_target
-- The active version of the tenant's workflow `name`, if its trigger is a webhook trigger.
SELECT w.id::text AS workflow_id, a.version_id::text AS version_id,
       v.definition -> 'trigger' -> 'webhook' AS webhook
  FROM workflows w
  JOIN workflow_activations a ON a.workflow_id = w.id
  JOIN workflow_versions v ON v.id = a.version_id
 WHERE w.tenant_id = :tenant_id AND w.name = :name
   AND v.definition -> 'trigger' -> 'webhook' IS NOT NULL
   AND jsonb_typeof(v.definition -> 'trigger' -> 'webhook') = 'object'

-- name: webhook_trigger_key_claim
-- One row back: this POST owns the key (first sight, or the previous claim's TTL ran out:
-- a new generation). None: a live claim exists; a concurrent first POST's row is waited for
-- (the INSERT blocks on it), so the caller then reads a committed event id.
INSERT INTO webhook_trigger_keys (workflow_id, key, expires_at)
VALUES (CAST(:workflow_id AS uuid), :key,
        now() + make_interval(secs => CAST(:ttl_seconds AS double precision)))
ON CONFLICT (workflow_id, key) DO UPDATE
   SET generation = webhook_trigger_keys.generation + 1, event_id = NULL, claimed_at = now(),
       expires_at = EXCLUDED.expires_at
 WHERE webhook_trigger_keys.expires_at <= now()
RETURNING generation, claimed_at

-- name: webhook_trigger_key_get
SELECT event_id, generation, claimed_at, expires_at FROM webhook_trigger_keys
 WHERE workflow_id = CAST(:workflow_id AS uuid) AND key = :key

-- name: webhook_trigger_key_set_event
UPDATE webhook_trigger_keys SET event_id = :event_id
 WHERE workflow_id = CAST(:workflow_id AS uuid) AND key = :key

-- name: webhook_trigger_refusal_insert
INSERT INTO webhook_trigger_refusals (workflow_id, connection_id, reason, detail)
VALUES (CAST(:workflow_id AS uuid), CAST(:connection_id AS uuid), :reason, :detail)
RETURNING id

-- name: webhook_trigger_keys_expire
-- Bounded, like every sweep deletion; the next period takes the rest.
DELETE FROM webhook_trigger_keys
 WHERE (workflow_id, key) IN (SELECT workflow_id, key FROM webhook_trigger_keys
                               WHERE expires_at < now() ORDER BY expires_at
                               LIMIT CAST(:batch AS integer))

-- name: webhook_trigger_refusals_recent
SELECT id, connection_id::text AS connection_id, reason, detail, created_at
  FROM webhook_trigger_refusals
 WHERE workflow_id = CAST(:workflow_id AS uuid)
 ORDER BY created_at DESC, id DESC
 LIMIT :limit
