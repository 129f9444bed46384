-- What the demo reads and seeds (devstack only; not part of the deploy bundle).

-- name: demo_tenant_insert
INSERT INTO tenants (id, name, credit_balance) VALUES (:id, :name, :credits)

-- name: demo_inbox_rows
SELECT id, status, deliveries, attempts, outcome::text AS outcome, last_error
FROM webhook_inbox WHERE connection_id = :connection_id ORDER BY id

-- name: demo_trigger_events
SELECT id, event_type, source_event_id, record_object_type, record_object_id,
       changed_fields::text AS changed, published_at IS NOT NULL AS published
FROM workflow_trigger_events WHERE connection_id = :connection_id ORDER BY id

-- name: demo_claims
SELECT c.event_id, w.name AS workflow, c.run_id
FROM delivery_claims c JOIN workflows w ON w.id = c.workflow_id
WHERE c.event_id = ANY(:event_ids) ORDER BY c.claimed_at

-- name: demo_refusals
-- In the order the changes happened, not the order admission decided them: two events pushed
-- at once are admitted concurrently, in either order.
SELECT r.event_id, w.name AS workflow, r.reason, r.detail
FROM admission_refusals r JOIN workflows w ON w.id = r.workflow_id
JOIN workflow_trigger_events e ON e.id = r.event_id
WHERE r.event_id = ANY(:event_ids) ORDER BY e.occurred_at, e.id, w.name

-- name: demo_runs
SELECT id, status, event_id, error FROM workflow_runs
WHERE tenant_id = :tenant_id ORDER BY created_at

-- name: demo_steps
SELECT step_key, block_type, status, attempt, error, outcome_code
FROM workflow_steps WHERE run_id = :run_id ORDER BY created_at, step_key

-- name: demo_poisoned
SELECT source, reason, data FROM poisoned_messages
WHERE received_at >= :since ORDER BY id

-- name: demo_bindings
SELECT count(*) FROM trigger_bindings WHERE tenant_id = :tenant_id

-- name: demo_binding_events
SELECT event_type FROM trigger_bindings WHERE tenant_id = :tenant_id ORDER BY event_type

-- name: demo_app_connection
SELECT id::text AS id, status, provider_account_id, provider_app_id
FROM connections WHERE tenant_id = :tenant_id ORDER BY created_at

-- name: demo_set_idempotency_property
-- The portal has a unique-value property reserved for onceflow's key (item 6 of issue 13).
UPDATE connections SET idempotency_property = :property WHERE id = CAST(:connection_id AS uuid)

-- name: demo_grant_refreshed
SELECT refreshed_at FROM connection_oauth_tokens WHERE connection_id = CAST(:connection_id AS uuid)

-- name: demo_journal_rows
-- The app's inbox rows since `since` that came from a journal (the reader puts the journal's
-- name and the entry's offset in the row's headers, shared/ingest/journal.py).
SELECT id, status, headers->>'x-onceflow-journal' AS journal
FROM webhook_inbox
WHERE app_id = :app_id AND received_at >= :since AND headers ? 'x-onceflow-journal-offset'
ORDER BY id

-- name: demo_app_inbox_rows
SELECT count(*) FROM webhook_inbox WHERE app_id = :app_id AND received_at >= :since

-- name: demo_retry_now
-- The demo does not sit out the step's 60 s backoff: the tenant's parked retry wakes on the
-- sweep's next pass instead (the tests skip it the same way). Only a step still waiting for
-- its retry moves; zero rows means it already woke.
UPDATE workflow_steps s SET wake_at = now()
FROM workflow_runs r
WHERE r.id = s.run_id AND r.tenant_id = :tenant_id AND s.status = 'waiting_for_retry'

-- name: demo_ai_run
-- The tenant's lead-reply-classify runs that ended: the classify step's answer and tokens, what
-- its charge came to, and the steps that succeeded (the route the answer took).
SELECT r.id::text AS run_id, r.status,
       c.output -> 'answer' AS answer,
       c.output -> 'usage' ->> 'total_tokens' AS tokens,
       (SELECT l.amount FROM credit_ledger l
         WHERE l.step_id = c.id AND l.refunded_at IS NULL) AS charged,
       (SELECT string_agg(s.step_key, ', ' ORDER BY s.created_at, s.step_key)
          FROM workflow_steps s WHERE s.run_id = r.id AND s.status = 'succeeded') AS steps
  FROM workflow_runs r
  JOIN workflows w ON w.id = r.workflow_id
  JOIN workflow_steps c ON c.run_id = r.id AND c.step_key = 'classify'
 WHERE r.tenant_id = :tenant_id AND w.name = 'lead-reply-classify'
   AND r.status IN ('succeeded', 'failed')
 ORDER BY r.created_at
