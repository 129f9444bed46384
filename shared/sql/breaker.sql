-- The circuit breaker per workflow (shared/gates/breaker.py). Every state change is one guarded
-- UPDATE; the row lock serializes concurrent run outcomes of one workflow.

-- name: breaker_ensure
INSERT INTO workflow_breakers (workflow_id) VALUES (CAST(:workflow_id AS uuid))
ON CONFLICT (workflow_id) DO NOTHING

-- name: breaker_count_failure
-- Counts while open too (runs already in flight keep failing), so the count says how many.
UPDATE workflow_breakers SET consecutive_failures = consecutive_failures + 1, updated_at = now()
 WHERE workflow_id = CAST(:workflow_id AS uuid)
RETURNING state, consecutive_failures

-- name: breaker_trip
-- The one transition into `open`: closed at the threshold, or half_open on any failure. Run
-- after breaker_count_failure in the same transaction; of N racing failures exactly one finds
-- the breaker not yet open and trips it, the others update nothing.
UPDATE workflow_breakers
   SET state = 'open', opened_at = now(), reason = :reason, trips = trips + 1,
       probes_admitted = 0, updated_at = now()
 WHERE workflow_id = CAST(:workflow_id AS uuid)
   AND (state = 'half_open'
        OR (state = 'closed' AND consecutive_failures >= CAST(:threshold AS integer)))
RETURNING trips, consecutive_failures, opened_at

-- name: breaker_record_success
-- A succeeded run ends a failure streak (the rule is the function, migration 0340, which the
-- one-statement settle in steps.sql calls too). `state` is NULL when nothing changed.
SELECT onceflow_breaker_record_success(CAST(:workflow_id AS uuid)) AS state

-- name: breaker_resume
-- An explicit resume: closed (the count starts again) or half_open (with its trial runs all
-- to admit again). Zero rows: not open.
UPDATE workflow_breakers
   SET state = CAST(:to_state AS text), consecutive_failures = 0, probes_admitted = 0,
       opened_at = CASE WHEN CAST(:to_state AS text) = 'closed' THEN NULL ELSE opened_at END,
       updated_at = now()
 WHERE workflow_id = CAST(:workflow_id AS uuid) AND state = 'open'
RETURNING state

-- name: breaker_get
SELECT CAST(workflow_id AS text) AS workflow_id, state, consecutive_failures, trips, opened_at,
       reason, updated_at
  FROM workflow_breakers WHERE workflow_id = CAST(:workflow_id AS uuid)

-- name: breaker_audit_insert
-- Trips are audited like the ops calls that resume them (no token: the engine did it).
INSERT INTO ops_audit (token_id, tenant_id, action, target, detail)
SELECT NULL, w.tenant_id, :action, CAST(w.id AS text), CAST(:detail AS jsonb)
  FROM workflows w WHERE w.id = CAST(:workflow_id AS uuid)

-- name: breaker_run_settings
-- For a run something other than its step executor ended (the sweep's reclaim): its workflow
-- and the breaker settings of its pinned version (NULL: the defaults).
SELECT CAST(r.workflow_id AS text) AS workflow_id, r.namespace, v.definition -> 'breaker' AS breaker
  FROM workflow_runs r JOIN workflow_versions v ON v.id = r.version_id
 WHERE r.id = CAST(:run_id AS uuid)

-- name: breaker_probe_claim
-- Admission's claim of a trial run for each half-open workflow an event would start a run of.
-- The rows are locked in workflow order (so two admissions never wait on each other in
-- opposite orders) and read as they are after any wait; the guarded UPDATE then counts a
-- trial only while fewer than :probe_limit were admitted, so of any number of racing
-- admissions exactly the free slots win. Per workflow: its state now and whether this
-- admission got a trial (false: the trials are used up, or the breaker is no longer
-- half-open). Admission gives an unused slot back in `admission_admit`.
WITH target AS (
    SELECT workflow_id, state, probes_admitted
      FROM workflow_breakers
     WHERE workflow_id = ANY(CAST(:workflow_ids AS uuid[]))
     ORDER BY workflow_id
       FOR UPDATE
), claimed AS (
    UPDATE workflow_breakers b
       SET probes_admitted = b.probes_admitted + 1, updated_at = now()
      FROM target t
     WHERE b.workflow_id = t.workflow_id AND b.state = 'half_open'
       AND b.probes_admitted < CAST(:probe_limit AS integer)
    RETURNING b.workflow_id
)
SELECT CAST(t.workflow_id AS text) AS workflow_id, t.state, t.probes_admitted,
       EXISTS (SELECT 1 FROM claimed c WHERE c.workflow_id = t.workflow_id) AS granted
  FROM target t
