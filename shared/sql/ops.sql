-- The ops function: tokens, audit, and the read side of runs, steps, refusals and credits.
-- :tenant_id is NULL for an admin token and the caller's tenant otherwise; every read is
-- scoped with it, so a tenant token cannot see another tenant's rows (the API answers 404).

-- name: ops_token_insert
INSERT INTO ops_tokens (token_sha256, tenant_id, label, roles, expires_at, created_by)
VALUES (:token_sha256, :tenant_id, :label, CAST(:roles AS text[]),
        CAST(:expires_at AS timestamptz), CAST(:created_by AS uuid))
RETURNING id

-- name: ops_token_find
-- A revoked or expired token is no token: both answer 401 alike (ops_tokens_live, migration
-- 0600: a plain view, inlined, so the lookup is still the unique index's).
SELECT id, tenant_id, label, roles
FROM ops_tokens_live
WHERE token_sha256 = :token_sha256

-- name: ops_token_revoke
-- Scoped like every read (:tenant_id NULL for an admin caller). `revoked_at IS NULL` is the
-- guard: of two revocations the first sets it and the second matches zero rows, so the first
-- revocation's time and the audit row of the call that made it stay the truth. Zero rows: no
-- such token in the caller's scope, or revoked already (ops_token_get tells which).
UPDATE ops_tokens SET revoked_at = now()
WHERE id = CAST(:token_id AS uuid) AND revoked_at IS NULL
  AND (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
RETURNING id, tenant_id, label, roles, created_at, expires_at, revoked_at

-- name: ops_token_get
SELECT id, tenant_id, label, roles, created_at, expires_at, revoked_at
FROM ops_tokens
WHERE id = CAST(:token_id AS uuid)
  AND (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))

-- name: ops_tokens_list
-- Never the hash. Newest first; revoked and expired ones too (with when), so an operator sees
-- what was cut off.
SELECT id, tenant_id, label, roles, created_at, expires_at, revoked_at
FROM ops_tokens
WHERE (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
ORDER BY created_at DESC, id
LIMIT 1000

-- name: ops_bootstrap_claim
-- The one-time bootstrap: in the transaction that minted the first admin token. The primary
-- key is a constant, so of two concurrent bootstraps the second waits on the first's row and,
-- once it commits, conflicts: zero rows, its transaction (and its token) is rolled back.
INSERT INTO ops_bootstrap (token_id) VALUES (CAST(:token_id AS uuid))
ON CONFLICT (singleton) DO NOTHING
RETURNING token_id

-- name: ops_tenant_insert
-- Zero rows: a tenant with that id exists (the API answers 409).
INSERT INTO tenants (id, name) VALUES (:tenant_id, :name)
ON CONFLICT (id) DO NOTHING
RETURNING id, name, credit_balance, created_at

-- name: ops_tenants_list
SELECT t.id, t.name, t.credit_balance, t.created_at,
       (SELECT count(*) FROM connections c WHERE c.tenant_id = t.id) AS connections,
       (SELECT count(*) FROM workflows w WHERE w.tenant_id = t.id) AS workflows
FROM tenants t
WHERE (CAST(:tenant_id AS text) IS NULL OR t.id = CAST(:tenant_id AS text))
ORDER BY t.id

-- name: ops_connections_list
-- Names of environment variables only; the values never leave the functions' environment.
SELECT id, tenant_id, provider, status, provider_account_id, provider_app_id,
       provider_user_id, api_base_url, webhook_secret_env, api_credentials_env, credential_kind,
       watched_fields, created_at
FROM connections
WHERE (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
ORDER BY tenant_id, created_at, id

-- name: ops_audit_insert
INSERT INTO ops_audit (token_id, tenant_id, action, target, detail)
VALUES (:token_id, :tenant_id, :action, :target, CAST(:detail AS jsonb))

-- name: ops_tenant_exists
SELECT 1 FROM tenants WHERE id = :tenant_id

-- name: ops_runs_list
-- Newest first; the cursor is the (created_at, id) of the last row of the previous page.
SELECT r.id, r.tenant_id, r.workflow_id, w.name AS workflow_name, r.version_id, r.start_key,
       r.event_id, r.record_key, record_label(l.label, l.email) AS record_label, r.status,
       r.error, r.replay_of, r.lineage_root, r.created_at, r.finished_at, r.cancelled_by,
       r.cancel_reason
FROM workflow_runs r
JOIN workflows w ON w.id = r.workflow_id
LEFT JOIN record_labels l ON l.record_key = r.record_key
WHERE r.namespace = 'live'
  AND (CAST(:tenant_id AS text) IS NULL OR r.tenant_id = CAST(:tenant_id AS text))
  AND (CAST(:workflow_id AS uuid) IS NULL OR r.workflow_id = CAST(:workflow_id AS uuid))
  AND (CAST(:status AS text) IS NULL OR r.status = CAST(:status AS text))
  AND (CAST(:record_key AS text) IS NULL OR r.record_key = CAST(:record_key AS text))
  AND (CAST(:created_after AS timestamptz) IS NULL
       OR r.created_at >= CAST(:created_after AS timestamptz))
  AND (CAST(:created_before AS timestamptz) IS NULL
       OR r.created_at < CAST(:created_before AS timestamptz))
  AND (CAST(:event_type AS text) IS NULL
       OR EXISTS (SELECT 1 FROM workflow_trigger_events e
                  WHERE e.id = r.event_id AND e.event_type = CAST(:event_type AS text)))
  AND (CAST(:cursor_at AS timestamptz) IS NULL
       OR (r.created_at, r.id) < (CAST(:cursor_at AS timestamptz), CAST(:cursor_id AS uuid)))
ORDER BY r.created_at DESC, r.id DESC
LIMIT :limit

-- name: ops_run_get
SELECT r.id, r.tenant_id, r.workflow_id, w.name AS workflow_name, r.version_id,
       v.number AS version_number, r.start_key, r.event_id, r.record_key,
       record_label(l.label, l.email) AS record_label, r.dedup_mode,
       r.namespace, r.status, r.error, r.replay_of, r.lineage_root, r.trigger_payload,
       r.payload_truncated, r.created_at, r.finished_at, r.cancelled_by, r.cancel_reason,
       r.replay_from, r.replay_by, r.phase, r.final_status
FROM workflow_runs r
JOIN workflows w ON w.id = r.workflow_id
JOIN workflow_versions v ON v.id = r.version_id
LEFT JOIN record_labels l ON l.record_key = r.record_key
WHERE r.id = CAST(:run_id AS uuid)
  AND r.namespace = CAST(:namespace AS text)
  AND (CAST(:tenant_id AS text) IS NULL OR r.tenant_id = CAST(:tenant_id AS text))

-- name: ops_run_lock
-- Replays of one lineage are serialized on its root row: two people pressing "replay" at
-- once must not start two runs that both execute the reset steps.
SELECT id FROM workflow_runs WHERE id = CAST(:lineage_root AS uuid) FOR UPDATE

-- name: ops_run_steps
-- A step that waits (or waited) for an event or a decision shows its park row: what it waits
-- for, until when, and what resumed it.
SELECT s.id, s.step_key, s.node_id, s.block_type, s.status, s.attempt, s.lease_id,
       s.lease_expires_at, s.wake_at, s.dispatched_at, s.idempotency_key,
       s.side_effect_started_at, s.input, s.output, s.error, s.error_class, s.outcome_code,
       s.branch_choice, s.copied_from, s.created_at, s.started_at, s.finished_at,
       s.input_override, s.input_edited_by,
       CASE WHEN p.id IS NOT NULL THEN jsonb_build_object(
           'id', p.id, 'kind', p.kind, 'until', p.deadline, 'on_timeout', p.on_timeout,
           'timeout_goto', p.timeout_goto, 'event_type', p.event_type,
           'record_key', p.record_key, 'condition', p.condition, 'summary', p.summary,
           'approver_role', p.approver_role, 'approver_users', to_jsonb(p.approver_users),
           'resumed_at', p.resumed_at, 'resumed_by', p.resumed_by,
           'resumed_event_id', p.resumed_event_id, 'decision', p.decision,
           'decided_by', p.decided_by, 'decision_comment', p.decision_comment,
           'mode', p.mode, 'awaits', p.awaits,
           'matched', (SELECT coalesce(jsonb_agg(k ORDER BY k), '[]'::jsonb)
                         FROM jsonb_object_keys(p.matched) AS k),
           'required', p.required, 'reject_quorum', p.reject_quorum,
           -- An approval's votes so far, late ones (counted false) included.
           'votes', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                'voter', v.voter, 'decision', v.decision, 'via', v.via,
                                'counted', v.counted, 'at', v.created_at)
                              ORDER BY v.created_at, v.voter), '[]'::jsonb)
                     FROM approval_votes v WHERE v.park_id = p.id),
           -- What the sweep was to send and how far it got: sent; queued (due again, perhaps
           -- after failed attempts); failed (no longer due, never sent: the sweep gave up,
           -- approval_messages_sent_is_not_due). At most a handful per approval.
           'messages', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                   'channel', m.channel, 'purpose', m.purpose,
                                   'recipient', m.recipient,
                                   'state', CASE WHEN m.sent_at IS NOT NULL THEN 'sent'
                                                 WHEN m.due_at IS NOT NULL THEN 'queued'
                                                 ELSE 'failed' END,
                                   'attempts', m.attempts, 'last_error', m.last_error,
                                   'sent_at', m.sent_at, 'next_attempt_at', m.due_at,
                                   'update_pending', m.update_due_at IS NOT NULL)
                                 ORDER BY m.created_at, m.id), '[]'::jsonb)
                        FROM approval_messages m WHERE m.park_id = p.id)) END AS waits_for
FROM workflow_steps s
LEFT JOIN step_parks p ON p.id = s.park_id
WHERE s.run_id = CAST(:run_id AS uuid)
ORDER BY s.created_at, s.step_key

-- name: ops_run_leases
-- The attempt history of the run's steps, oldest first per step, as far as it is kept (the
-- sweep trims it for runs finished long ago). Scoped by the caller's run lookup.
SELECT l.step_id, l.attempt, l.lease_id, l.claimed_at, l.end_kind, l.end_status,
       l.outcome_code, l.error_class, l.error, l.ended_at
FROM workflow_step_leases l
JOIN workflow_steps s ON s.id = l.step_id
WHERE s.run_id = CAST(:run_id AS uuid)
ORDER BY l.step_id, l.claimed_at, l.lease_id

-- name: ops_run_charges
-- With the refund of each charge, if it was refunded (at most one: credit_refunds.charge_id).
SELECT l.lineage_key, l.amount, l.block_type, l.run_id, l.step_id, l.created_at,
       r.amount AS refunded, r.reason AS refund_reason, r.created_at AS refunded_at
FROM credit_ledger l
LEFT JOIN credit_refunds r ON r.charge_id = l.id
WHERE l.run_id = CAST(:run_id AS uuid)
   OR l.lineage_key = ANY(CAST(:keys AS text[]))
ORDER BY l.created_at, l.id

-- name: ops_lineage_runs
SELECT id, replay_of, status, start_key, created_at, finished_at
FROM workflow_runs
WHERE lineage_root = CAST(:lineage_root AS uuid) AND namespace = 'live'
ORDER BY created_at, id

-- name: ops_lineage_root_created
SELECT created_at FROM workflow_runs WHERE id = CAST(:lineage_root AS uuid)

-- name: ops_lineage_replays_of
SELECT id, status FROM workflow_runs
WHERE replay_of = CAST(:run_id AS uuid)
ORDER BY created_at
LIMIT 1

-- name: ops_lineage_oldest_keys
-- The idempotency key each step key first had in the lineage (invariant 12: the provider and
-- the ledger must see the same operation however many times it is replayed).
SELECT DISTINCT ON (s.step_key) s.step_key, s.idempotency_key
FROM workflow_steps s
JOIN workflow_runs r ON r.id = s.run_id
WHERE r.lineage_root = CAST(:lineage_root AS uuid)
  AND s.idempotency_key IS NOT NULL
ORDER BY s.step_key, r.created_at, s.created_at

-- name: ops_version_definition
SELECT definition FROM workflow_versions WHERE id = CAST(:version_id AS uuid)

-- name: ops_event_get
SELECT e.id, e.tenant_id, e.connection_id, e.event_type, e.source_event_id,
       e.record_object_type, e.record_object_id, e.author_id, e.changed_fields,
       e.occurred_at, e.payload, e.payload_truncated, e.created_at, e.published_at
FROM workflow_trigger_events e
WHERE e.id = :event_id
  AND (CAST(:tenant_id AS text) IS NULL OR e.tenant_id = CAST(:tenant_id AS text))

-- name: ops_replay_run_insert
-- The replay reads the payload and the record the original's rule saw, so its steps render
-- what the original's did. It runs on :version_id (the run's own, or the workflow's current
-- one when the operator asked for it), and names the step it started from and who asked.
INSERT INTO workflow_runs (tenant_id, workflow_id, version_id, start_key, event_id, record_key,
                           dedup_mode, namespace, status, trigger_payload, payload_truncated,
                           replay_of, lineage_root, trigger_record, replay_from, replay_by,
                           priority)
SELECT tenant_id, workflow_id, CAST(:version_id AS uuid), :start_key, event_id, record_key,
       dedup_mode, 'live', 'running', trigger_payload, payload_truncated, id, lineage_root,
       trigger_record, :replay_from, :replay_by, priority
FROM workflow_runs
WHERE id = CAST(:run_id AS uuid)
RETURNING id, lineage_root

-- name: ops_replay_steps_copy
-- Settled steps are copied verbatim, outputs, keys and branch choices included; copying
-- charges nothing (the ledger rows stay on the steps that earned them).
INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, status, attempt,
                            dispatched_at, idempotency_key, side_effect_started_at, input,
                            output, error, error_class, outcome_code, branch_choice,
                            copied_from, created_at, started_at, finished_at, priority)
SELECT CAST(:new_run_id AS uuid), step_key, node_id, block_type, status, attempt,
       dispatched_at, idempotency_key, side_effect_started_at, input, output, error,
       error_class, outcome_code, branch_choice, id, created_at, started_at, finished_at,
       priority
FROM workflow_steps
WHERE id = ANY(CAST(:step_ids AS uuid[]))

-- name: ops_replay_forget_ai_answers
-- A replay that asks for fresh model answers (ReplayRequest.fresh_ai_answers): the answers
-- journaled under the keys it runs again are forgotten, so its ai.generate steps ask the
-- model instead of reusing them (shared/blocks/ai.py). The charge stays one per lineage key.
DELETE FROM ai_answers WHERE idempotency_key = ANY(CAST(:keys AS text[]))

-- name: ops_replay_step_restart
-- A restarted step; :input_override (with :input_edited_by) is a person's edit of the chosen
-- step's input, which the engine runs instead of the rendered config (steps_claim returns it).
INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, status, idempotency_key,
                            input, input_override, input_edited_by, priority)
VALUES (CAST(:new_run_id AS uuid), :step_key, :node_id, :block_type, 'pending',
        :idempotency_key, CAST(:input AS jsonb), CAST(:input_override AS jsonb),
        :input_edited_by,
        -- the replay's priority (the original's, copied on its run row)
        (SELECT r.priority FROM workflow_runs r WHERE r.id = CAST(:new_run_id AS uuid)))
RETURNING id

-- name: ops_retry_run_reopen
-- Only a failed run is reopened; zero rows means someone else retried or replayed it first.
-- A compensated run goes back to its main phase: the compensations that ran keep their rows,
-- so a second failure undoes only what succeeded since (steps_next_compensation); finally
-- steps that ran keep theirs and do not run again (shared/steps/finale.py `start`).
UPDATE workflow_runs
SET status = 'running', finished_at = NULL, error = NULL, phase = 'main', final_status = NULL
WHERE id = CAST(:run_id AS uuid) AND status = 'failed'

-- name: ops_retry_step_reset
-- A failed step goes back to pending with a fresh attempt budget; its idempotency key stays,
-- so the provider and the ledger see the same operation. The last error is kept for people.
-- A wait that failed (timed out, rejected) no longer names its closed park: it waits again on
-- a new one when it runs (parks_open); the closed park row stays as the earlier wait's record.
-- A skipped step of a failed run is one the sweep's reclaim ended because another branch had
-- failed the run while its process died (RUN_ENDED): it restarts with the run, as it would
-- have pending (a retried run is only ever a failed one, so no cancel's skip is undone).
UPDATE workflow_steps
SET status = 'pending', attempt = 0, finished_at = NULL, lease_id = NULL,
    lease_expires_at = NULL, wake_at = NULL, side_effect_started_at = NULL,
    dispatched_at = NULL, park_id = NULL, park_kind = NULL
WHERE id = ANY(CAST(:step_ids AS uuid[]))
  AND status IN ('failed', 'skipped', 'pending', 'waiting_for_retry', 'waiting_for_delay')
RETURNING id

-- name: ops_refusals_list
-- Each refusal with its re-decisions beside it (shared/admission/redecide.py), oldest first,
-- by the index on refusal_id.
SELECT f.id, f.tenant_id, f.event_id, f.workflow_id, w.name AS workflow_name, f.version_id,
       f.record_key, f.reason, f.detail, f.created_at,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'version_id', rd.version_id, 'outcome', rd.outcome, 'detail', rd.detail,
                   'run_id', rd.run_id, 'bulk_id', rd.bulk_id, 'decided_at', rd.decided_at)
                   ORDER BY rd.id), '[]'::jsonb)
          FROM admission_redecisions rd WHERE rd.refusal_id = f.id) AS redecisions
FROM admission_refusals f
JOIN workflows w ON w.id = f.workflow_id
WHERE (CAST(:tenant_id AS text) IS NULL OR f.tenant_id = CAST(:tenant_id AS text))
  AND (CAST(:workflow_id AS uuid) IS NULL OR f.workflow_id = CAST(:workflow_id AS uuid))
  AND (CAST(:record_key AS text) IS NULL OR f.record_key = CAST(:record_key AS text))
  AND (CAST(:event_id AS bigint) IS NULL OR f.event_id = CAST(:event_id AS bigint))
  AND (CAST(:cursor_id AS bigint) IS NULL OR f.id < CAST(:cursor_id AS bigint))
ORDER BY f.id DESC
LIMIT :limit

-- name: ops_connection_tenant
SELECT tenant_id FROM connections WHERE id = CAST(:connection_id AS uuid)

-- name: ops_record_events
-- Every trigger event seen for one record, oldest first (the record's timeline).
SELECT e.id, e.event_type, e.source_event_id, e.author_id, e.changed_fields, e.occurred_at,
       e.created_at, e.published_at, e.payload_truncated, e.decided_at, e.redeliveries,
       e.undelivered_at, e.undelivered_reason
FROM workflow_trigger_events e
WHERE e.tenant_id = :tenant_id
  AND e.record_object_type = :object_type
  AND e.record_object_id = :object_id
  AND e.connection_id = CAST(:connection_id AS uuid)
ORDER BY e.id
LIMIT :limit

-- name: ops_record_runs
SELECT r.id, r.tenant_id, r.workflow_id, w.name AS workflow_name, r.version_id, r.start_key,
       r.event_id, r.record_key, r.status, r.error, r.replay_of, r.lineage_root,
       r.created_at, r.finished_at, r.cancelled_by, r.cancel_reason
FROM workflow_runs r
JOIN workflows w ON w.id = r.workflow_id
WHERE r.tenant_id = :tenant_id AND r.namespace = 'live'
  AND (r.record_key = :record_key OR r.event_id = ANY(CAST(:event_ids AS bigint[])))
ORDER BY r.created_at, r.id

-- name: ops_record_refusals
SELECT f.event_id, f.workflow_id, w.name AS workflow_name, f.reason, f.detail, f.created_at
FROM admission_refusals f
JOIN workflows w ON w.id = f.workflow_id
WHERE f.tenant_id = :tenant_id AND f.event_id = ANY(CAST(:event_ids AS bigint[]))

-- name: ops_record_claims
SELECT c.event_id, c.workflow_id, w.name AS workflow_name, c.run_id, c.claimed_at
FROM delivery_claims c
JOIN workflows w ON w.id = c.workflow_id
WHERE c.event_id = ANY(CAST(:event_ids AS bigint[])) AND w.tenant_id = :tenant_id

-- name: ops_bindings_for_tenant
SELECT b.event_type, b.workflow_id, w.name AS workflow_name
FROM trigger_bindings b
JOIN workflows w ON w.id = b.workflow_id
WHERE b.tenant_id = :tenant_id

-- name: ops_credit_balance
SELECT credit_balance FROM tenants WHERE id = :tenant_id

-- name: ops_credit_ledger
SELECT l.id, l.lineage_key, l.amount, l.block_type, l.run_id, l.step_id, l.created_at,
       r.amount AS refunded, r.reason AS refund_reason, r.created_at AS refunded_at
FROM credit_ledger l
LEFT JOIN credit_refunds r ON r.charge_id = l.id
WHERE l.tenant_id = :tenant_id
  AND (CAST(:cursor_id AS bigint) IS NULL OR l.id < CAST(:cursor_id AS bigint))
ORDER BY l.id DESC
LIMIT :limit

-- name: ops_workflows_list
SELECT w.id, w.tenant_id, w.name, w.created_at, a.version_id AS active_version_id,
       (SELECT max(v.number) FROM workflow_versions v WHERE v.workflow_id = w.id)
           AS latest_version
FROM workflows w
LEFT JOIN workflow_activations a ON a.workflow_id = w.id
WHERE (CAST(:tenant_id AS text) IS NULL OR w.tenant_id = CAST(:tenant_id AS text))
ORDER BY w.tenant_id, w.name

-- name: ops_workflow_get
SELECT w.id, w.tenant_id, w.name, w.created_at
FROM workflows w
WHERE w.id = CAST(:workflow_id AS uuid)
  AND (CAST(:tenant_id AS text) IS NULL OR w.tenant_id = CAST(:tenant_id AS text))

-- name: ops_workflow_versions
SELECT v.id, v.number, v.content_hash, v.created_at,
       (a.version_id IS NOT NULL) AS active
FROM workflow_versions v
LEFT JOIN workflow_activations a ON a.workflow_id = v.workflow_id AND a.version_id = v.id
WHERE v.workflow_id = CAST(:workflow_id AS uuid)
ORDER BY v.number DESC

-- name: ops_version_get
SELECT v.id, v.workflow_id, v.number, v.definition
FROM workflow_versions v
WHERE v.id = CAST(:version_id AS uuid) AND v.workflow_id = CAST(:workflow_id AS uuid)

-- name: ops_active_version
SELECT version_id FROM workflow_activations WHERE workflow_id = CAST(:workflow_id AS uuid)

-- name: ops_rehearsal_run_insert
-- A rehearsal run: its own namespace (so the live partial unique index, live claims and live
-- history never see it) and its own start key; it is its own lineage root, so its steps'
-- idempotency keys can never equal a live step's. Delivery claims and enrollments are not
-- written: a rehearsal decides nothing about the event. Its record is the one admission's rule
-- would see (shared/workflows/scope.py), so its steps render what a live run's would.
INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key, event_id,
                           record_key, dedup_mode, namespace, status, trigger_payload,
                           payload_truncated, lineage_root, trigger_record)
VALUES (CAST(:run_id AS uuid), :tenant_id, CAST(:workflow_id AS uuid),
        CAST(:version_id AS uuid), :start_key, :event_id, :record_key, :dedup_mode,
        'rehearsal', 'running', CAST(:payload AS jsonb), :payload_truncated,
        CAST(:run_id AS uuid), CAST(:record AS jsonb))

-- name: ops_rehearsal_pending
SELECT CAST(id AS text) AS id, status FROM workflow_steps
WHERE run_id = CAST(:run_id AS uuid) AND status IN ('pending', 'waiting_for_delay')
ORDER BY created_at, step_key

-- name: ops_rehearsal_serve_delays
-- A rehearsal does not sit out delays: the step is woken at once and the rehearsal's clock
-- jumps to the wake time; the row says the wait is served, as the sweep's wake does.
UPDATE workflow_steps
SET status = 'pending', wake_at = NULL,
    output = coalesce(output, '{}'::jsonb) || '{"delay_served": true}'::jsonb
WHERE run_id = CAST(:run_id AS uuid) AND status = 'waiting_for_delay'
RETURNING output

-- name: ops_rehearsal_stop
-- A rehearsal lives only as long as the ops call that drives it; whatever it did not finish
-- (a retry it would have waited for, the step budget) is cancelled, not left for anyone.
UPDATE workflow_runs SET status = 'cancelled', finished_at = now(), error = :error
WHERE id = CAST(:run_id AS uuid) AND namespace = 'rehearsal' AND status = 'running'

-- name: ops_rehearsal_result
SELECT step_key, node_id, block_type, status, output, error, outcome_code, branch_choice
FROM workflow_steps
WHERE run_id = CAST(:run_id AS uuid)
ORDER BY created_at, step_key

-- name: ops_rehearsal_status
SELECT status FROM workflow_runs WHERE id = CAST(:run_id AS uuid) AND namespace = 'rehearsal'

-- name: ops_connection_health
-- Each connection with its credentials (a token variable, or an OAuth grant: whose sealing key
-- variable and when its access token was last refreshed), its last real call to the provider
-- (shared/port/observed.py), and the outcome of its last subscription reconcile (the sweep's
-- hourly call with the connection's credentials). tenant_id NULL (admin) sees every tenant.
SELECT CAST(c.id AS text) AS connection_id, c.tenant_id, c.provider, c.status,
       c.credential_kind, c.api_credentials_env, t.kek_env AS oauth_kek_env, t.refreshed_at AS oauth_refreshed_at,
       c.last_call_at, c.last_call_ok, c.last_call_error,
       r.ok AS last_reconcile_ok, r.reconciled_at AS last_reconciled_at,
       r.result -> 'errors' AS last_reconcile_errors
FROM connections c
LEFT JOIN connection_oauth_tokens t ON t.connection_id = c.id
LEFT JOIN subscription_reconciles r ON r.connection_id = c.id
WHERE CAST(:tenant_id AS text) IS NULL OR c.tenant_id = CAST(:tenant_id AS text)
ORDER BY c.tenant_id, c.created_at, c.id
LIMIT 500

-- name: ops_sweep_duties
SELECT name, last_started_at, last_finished_at, last_ok, last_error
FROM sweep_duties
ORDER BY name

-- name: ops_approvals_open
-- Approvals waiting for a decision in the caller's scope (the API keeps those the caller may
-- decide, escalation included: parks.may_decide reads escalated_at and whom it adds), oldest
-- first, through the open-approvals partial index. One past its expiry takes
-- no decision any more (steps_resume_parked): not listed, though the sweep may not have
-- rejected (or let proceed) it yet.
SELECT p.id, CAST(p.run_id AS text) AS run_id, s.step_key, p.tenant_id, p.summary,
       p.approver_role, p.approver_users, p.deadline AS expires_at, p.on_timeout,
       p.created_at, p.required, p.escalated_at, p.escalate_role, p.escalate_users,
       -- the quorum so far (migration 0510): who approved, and how many
       ARRAY(SELECT v.voter FROM approval_votes v
             WHERE v.park_id = p.id AND v.counted AND v.decision = 'approved'
             ORDER BY v.created_at, v.voter) AS approved_by
FROM step_parks p
JOIN workflow_steps s ON s.id = p.step_id
WHERE p.kind = 'approval' AND p.resumed_at IS NULL AND s.status = 'waiting_for_approval'
  AND p.deadline > statement_timestamp()
  AND (CAST(:tenant_id AS text) IS NULL OR p.tenant_id = CAST(:tenant_id AS text))
ORDER BY p.created_at, p.id
LIMIT :limit

-- name: ops_bulk_insert
-- A bulk preview: exactly the targets it listed (sorted), the action and the caller's tenant.
INSERT INTO ops_bulk_previews (tenant_id, action, targets, reason, token_id, expires_at)
VALUES (:tenant_id, :action, CAST(:targets AS text[]), :reason, CAST(:token_id AS uuid),
        now() + make_interval(secs => CAST(:ttl_seconds AS double precision)))
RETURNING id, expires_at

-- name: ops_bulk_get
-- Scoped like every read: a tenant's token finds only its tenant's previews (an admin's, with
-- tenant_id NULL, neither); an admin finds any.
SELECT id, tenant_id, action, targets, reason, expires_at, acted_at, outcomes,
       expires_at <= now() AS expired
FROM ops_bulk_previews
WHERE id = CAST(:bulk_id AS uuid)
  AND (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))

-- name: ops_bulk_acted
-- The first act to finish records its outcomes; two acts racing on one token both ran each
-- target through its own guarded statement (one outcome per run), and exactly one of them
-- finds `acted_at IS NULL` here. Zero rows: another act recorded first (its outcomes stand).
UPDATE ops_bulk_previews
SET acted_at = now(), outcomes = CAST(:outcomes AS jsonb)
WHERE id = CAST(:bulk_id AS uuid) AND acted_at IS NULL
RETURNING id

-- name: ops_limits_windows
-- `GET /v1/limits`: the live windows (not yet ended) of every limit, with what each admitted
-- and the limit it counts against (`limit_max`, NULL for a window claimed before 0500). The
-- tenant comes from the subject: a connection's or workflow's row (by primary key), a run-start
-- subject's workflow (`<workflow_id>|<key>`), a host subject's prefix (`<tenant>|<host>`).
-- A NULL :tenant_id is an admin's every tenant. Read whole, on purpose: the table holds only
-- live windows and those ended within the hour (the sweep's delete_expired_throttle_windows
-- keeps it so), one row per limit that counted lately, and a window may be longer than any
-- bound an index range could assume (a connection's window is any number of seconds).
-- Bounded by :limit, newest first.
WITH w AS (
    SELECT w.scope, w.subject, w.window_seconds, w.window_start, w.used, w.limit_max,
           CASE WHEN w.scope IN ('workflow', 'run_start', 'connection')
                 AND split_part(w.subject, '|', 1)
                     ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN CAST(split_part(w.subject, '|', 1) AS uuid) END AS owner_id
      FROM throttle_windows w
     WHERE w.window_start + make_interval(secs => w.window_seconds) > now()
)
SELECT w.scope, w.subject, w.window_seconds, w.window_start,
       w.window_start + make_interval(secs => w.window_seconds) AS window_end,
       w.used, w.limit_max, t.tenant_id
  FROM w
 CROSS JOIN LATERAL (
    SELECT CASE w.scope
           WHEN 'connection' THEN (SELECT c.tenant_id FROM connections c WHERE c.id = w.owner_id)
           WHEN 'host' THEN split_part(w.subject, '|', 1)
           ELSE (SELECT f.tenant_id FROM workflows f WHERE f.id = w.owner_id) END AS tenant_id
 ) t
 WHERE t.tenant_id IS NOT NULL
   AND (CAST(:tenant_id AS text) IS NULL OR t.tenant_id = CAST(:tenant_id AS text))
 ORDER BY w.window_start DESC, w.scope, w.subject
 LIMIT CAST(:limit AS integer)

-- name: ops_limits_parked_steps
-- Steps parked behind a limit: `waiting_for_retry` with outcome THROTTLED, read from their own
-- partial index (workflow_steps_throttled, 0500), grouped by the limit their error names. The
-- error is written by shared/gates/throttle.py `throttled` as "throttled until T by <scope>
-- limit (<subject>: <max> per <seconds>s)"; tests/test_ops_limits.py checks this pattern
-- against that function's message. The oldest wait is the earliest first claim of a waiting
-- step (a throttled step re-parks each window; its first claim is when it began to wait).
SELECT m[1] AS scope, m[2] AS subject, CAST(max(m[3]) AS integer) AS limit_max,
       CAST(max(m[4]) AS integer) AS window_seconds, r.tenant_id,
       count(*) AS waiting, min(coalesce(s.started_at, s.created_at)) AS oldest_wait_since,
       min(s.wake_at) AS next_wake_at
  FROM workflow_steps s
  JOIN workflow_runs r ON r.id = s.run_id
 CROSS JOIN LATERAL regexp_match(
        s.error, '^throttled until \S+ by ([a-z_]+) limit \((.+): ([0-9]+) per ([0-9]+)s\)') m
 WHERE s.status = 'waiting_for_retry' AND s.outcome_code = 'THROTTLED'
   AND (CAST(:tenant_id AS text) IS NULL OR r.tenant_id = CAST(:tenant_id AS text))
 GROUP BY m[1], m[2], r.tenant_id
 ORDER BY min(coalesce(s.started_at, s.created_at))
 LIMIT CAST(:limit AS integer)

-- name: ops_limits_run_start_queue
-- Events waiting behind a run-start throttle (shared/admission/run_throttle.py) or a keyed
-- concurrency limit (shared/admission/concurrency.py: `gate`), per (workflow, key), from the
-- queue's partial head index (queued entries only). For a concurrency key, `running` is the
-- slots taken (concurrency_slots_key); `next_at` is set only once a run's end granted a slot.
SELECT q.tenant_id, CAST(q.workflow_id AS text) AS workflow_id, q.throttle_key, q.gate,
       max(q.limit_per_window) AS limit_max, max(q.window_seconds) AS window_seconds,
       count(*) AS waiting, min(q.queued_at) AS oldest_wait_since,
       CASE WHEN min(q.due_at) < 'infinity' THEN min(q.due_at) END AS next_at,
       (SELECT count(*) FROM concurrency_slots s
         WHERE q.gate = 'concurrency' AND s.workflow_id = q.workflow_id
           AND s.concurrency_key = q.throttle_key) AS running
  FROM run_start_queue q
 WHERE q.status = 'queued'
   AND (CAST(:tenant_id AS text) IS NULL OR q.tenant_id = CAST(:tenant_id AS text))
 GROUP BY q.tenant_id, q.workflow_id, q.throttle_key, q.gate
 ORDER BY min(q.queued_at)
 LIMIT CAST(:limit AS integer)

-- name: ops_limits_debounce_bursts
-- Events held in debounce bursts that have not fired (shared/admission/debounce.py): every
-- event of an unfired burst waits for its fire. From the sweep's due index
-- (debounce_bursts_due: status <> 'fired'), soonest fire first.
SELECT b.tenant_id, CAST(b.workflow_id AS text) AS workflow_id, b.burst_key,
       CAST(b.id AS text) AS burst_id, b.status, b.period_seconds,
       extract(epoch FROM (b.max_fire_at - b.first_event_at))::float8 AS max_wait_seconds,
       b.event_count AS waiting, b.first_event_at AS oldest_wait_since, b.fire_at AS next_at,
       -- a batch (max_size set) is the same gathering with a size as its limit
       b.max_size
  FROM debounce_bursts b
 WHERE b.status <> 'fired'
   AND (CAST(:tenant_id AS text) IS NULL OR b.tenant_id = CAST(:tenant_id AS text))
 ORDER BY b.fire_at
 LIMIT CAST(:limit AS integer)

-- name: ops_slack_settings
-- A tenant's Slack settings (migration 0510): the names of the variables holding its bot
-- token and its Slack app's signing secret. No row: no such tenant.
SELECT slack_bot_token_env, slack_signing_secret_env FROM tenants WHERE id = CAST(:tenant_id AS text)

-- name: ops_approver_identity
-- The onceflow user a verified Slack user id (or an email address) is in a tenant, and their
-- roles: those of the user's live ops tokens in the tenant (the one place roles are given).
-- No row: the identity is not mapped, and may decide nothing.
SELECT i.onceflow_user, onceflow_user_roles(i.tenant_id, i.onceflow_user) AS roles
FROM approver_identities i
WHERE i.tenant_id = CAST(:tenant_id AS text) AND i.channel = CAST(:channel AS text)
  AND i.external_id = CAST(:external_id AS text)

-- name: ops_messaging_settings
-- How a tenant's approvals reach people: the names of the variables holding its Slack app's
-- secrets and its SMTP server (migrations 0510, 0511); never a secret. No row: no such tenant.
SELECT id AS tenant_id, slack_bot_token_env, slack_signing_secret_env, smtp_host, smtp_port,
       smtp_from, smtp_username, smtp_password_env, smtp_starttls
FROM tenants WHERE id = CAST(:tenant_id AS text)

-- name: ops_slack_settings_set
-- A tenant's Slack app, set whole (both names, or neither: no Slack). Settings, not a state:
-- the last writer's pair stands, and a pair is never half of one writer's and half another's
-- (one row, one UPDATE). Zero rows: no such tenant.
UPDATE tenants
SET slack_bot_token_env = CAST(:bot_token_env AS text),
    slack_signing_secret_env = CAST(:signing_secret_env AS text)
WHERE id = CAST(:tenant_id AS text)
RETURNING id

-- name: ops_smtp_settings_set
-- A tenant's SMTP server, set whole (host NULL: no email, every other column cleared with it).
-- As for Slack: one UPDATE of one row, the last writer's settings stand. Zero rows: no such
-- tenant.
UPDATE tenants
SET smtp_host = CAST(:host AS text), smtp_port = CAST(:port AS integer),
    smtp_from = CAST(:sender AS text), smtp_username = CAST(:username AS text),
    smtp_password_env = CAST(:password_env AS text), smtp_starttls = CAST(:starttls AS boolean)
WHERE id = CAST(:tenant_id AS text)
RETURNING id

-- name: ops_user_roles
-- The roles a mailed link's user holds now (migration 0600): a link decides as its user, and
-- an approval named by role is theirs to decide while one of their live tokens carries it.
SELECT onceflow_user_roles(CAST(:tenant_id AS text), CAST(:user AS text)) AS roles

-- name: ops_tenant_user_known
-- Whether `user` is someone in the tenant: the label of one of its live ops tokens (the one
-- place users and their roles are given; an approval names users by that label).
SELECT 1 FROM ops_tokens_live
WHERE tenant_id = CAST(:tenant_id AS text) AND label = CAST(:user AS text)
LIMIT 1

-- name: ops_approver_identity_insert
-- Map a Slack user id or an email address to a onceflow user. An identity already mapped is
-- left as it is (no row returned: the caller answers 409 with who it is mapped to), so a
-- mistyped add never silently re-points someone else's clicks.
INSERT INTO approver_identities (tenant_id, channel, external_id, onceflow_user)
VALUES (CAST(:tenant_id AS text), CAST(:channel AS text), CAST(:external_id AS text),
        CAST(:user AS text))
ON CONFLICT (tenant_id, channel, external_id) DO NOTHING
RETURNING tenant_id, channel, external_id, onceflow_user AS user, created_at

-- name: ops_approver_identity_get
SELECT tenant_id, channel, external_id, onceflow_user AS user, created_at
FROM approver_identities
WHERE tenant_id = CAST(:tenant_id AS text) AND channel = CAST(:channel AS text)
  AND external_id = CAST(:external_id AS text)

-- name: ops_approver_identity_delete
-- Unmap an identity: a Slack user's clicks decide nothing from now on, and no more mail goes
-- to an address (both look it up when used). A link already mailed is signed for its user,
-- not the address, and votes until its deadline. Zero rows: it was not mapped (or a
-- concurrent remove took it first).
DELETE FROM approver_identities
WHERE tenant_id = CAST(:tenant_id AS text) AND channel = CAST(:channel AS text)
  AND external_id = CAST(:external_id AS text)
RETURNING tenant_id, channel, external_id, onceflow_user AS user, created_at

-- name: ops_approver_identities_list
SELECT tenant_id, channel, external_id, onceflow_user AS user, created_at
FROM approver_identities
WHERE (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
  AND (CAST(:user AS text) IS NULL OR onceflow_user = CAST(:user AS text))
ORDER BY tenant_id, onceflow_user, channel, external_id
LIMIT 1000
