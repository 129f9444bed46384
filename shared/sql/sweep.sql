-- The sweep's own bookkeeping and the small duties that need nothing but SQL.

-- name: sweep_duty_claim
-- One row back means this invocation owns the duty for this period; none means another
-- invocation ran it less than `every_seconds` ago (or is running it now).
INSERT INTO sweep_duties (name, last_started_at) VALUES (CAST(:name AS text), now())
ON CONFLICT (name) DO UPDATE SET last_started_at = now()
WHERE sweep_duties.last_started_at
      < now() - make_interval(secs => CAST(:every_seconds AS double precision))
RETURNING name

-- name: sweep_duty_record
UPDATE sweep_duties
SET last_finished_at = now(), last_ok = CAST(:ok AS boolean),
    last_result = CAST(:result AS jsonb), last_error = CAST(:error AS text)
WHERE name = CAST(:name AS text)

-- name: step_leases_trim
-- Lease history of runs that finished more than :days ago (the runs and their steps are kept).
-- No lease is claimed after its run finished (the claim wants a running run; an ops retry
-- reopens the run and clears finished_at), so "claimed before the cutoff" loses nothing and
-- lets the BRIN index on claimed_at narrow the scan. Bounded; the caller repeats.
DELETE FROM workflow_step_leases
WHERE lease_id IN (
    SELECT l.lease_id
    FROM workflow_step_leases l
    JOIN workflow_steps s ON s.id = l.step_id
    JOIN workflow_runs r ON r.id = s.run_id
    WHERE l.claimed_at < now() - make_interval(days => CAST(:days AS integer))
      AND r.finished_at < now() - make_interval(days => CAST(:days AS integer))
    LIMIT CAST(:batch AS integer))
