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

-- name: sweep_next_due
-- Seconds until the earliest row one of the sweep's repairs would take (0 or less: due now),
-- NULL when no row will ever come due by time alone. Read-only; each part mirrors its
-- repair's filter (steps_reclaim_expired, steps_wake_due, steps_redispatch_lost,
-- outbox_requeue_undecided, debounce_due, run_throttle_due_heads) and reads the head of that repair's index (ORDER BY … LIMIT 1),
-- the approvals' reminders, escalations and messages included (shared/steps/approval_messages.py),
-- so an idle sweep asks it once and ends instead of polling. A part that filtered less than
-- its repair would make the sweep wait for a row the repair never takes.
SELECT EXTRACT(EPOCH FROM least(
    (SELECT s.lease_expires_at
     FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
     WHERE s.status = 'running' AND r.namespace = 'live'
     ORDER BY s.lease_expires_at LIMIT 1),
    (SELECT s.wake_at
     FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
     WHERE s.status IN ('waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                        'waiting_for_approval')
       AND s.wake_at IS NOT NULL AND r.status = 'running' AND r.namespace = 'live'
     ORDER BY s.wake_at LIMIT 1),
    (SELECT s.dispatched_at
            + make_interval(secs => CAST(:redispatch_after_seconds AS double precision))
     FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
     WHERE s.status = 'pending' AND s.dispatched_at IS NOT NULL
       AND r.status = 'running' AND r.namespace = 'live'
     ORDER BY s.dispatched_at LIMIT 1),
    (SELECT s.created_at
            + make_interval(secs => CAST(:redispatch_after_seconds AS double precision))
     FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
     WHERE s.status = 'pending' AND s.dispatched_at IS NULL
       AND r.status = 'running' AND r.namespace = 'live'
     ORDER BY s.created_at LIMIT 1),
    (SELECT published_at
            + make_interval(secs => CAST(:redeliver_after_seconds AS double precision))
     FROM workflow_trigger_events
     WHERE decided_at IS NULL AND undelivered_at IS NULL AND published_at IS NOT NULL
     ORDER BY published_at LIMIT 1),
    -- debounce_due: a burst not fired yet, by its fire time (debounce_bursts_due)
    (SELECT fire_at FROM debounce_bursts WHERE status <> 'fired' ORDER BY fire_at LIMIT 1),
    -- run_throttle_due_heads: a throttled start waiting for its window, and
    -- concurrency_granted: a run handed a slot (run_start_queue_due); a run still waiting for
    -- a slot is due at 'infinity' (a run's end grants it, no clock does)
    (SELECT due_at FROM run_start_queue WHERE status = 'queued' AND due_at < 'infinity'
     ORDER BY due_at LIMIT 1),
    -- deliver_approval_messages: a message to send, an update of a posted one
    -- (approval_messages_claim_sends, approval_messages_claim_updates)
    (SELECT due_at FROM approval_messages WHERE sent_at IS NULL AND due_at IS NOT NULL
     ORDER BY due_at LIMIT 1),
    (SELECT update_due_at FROM approval_messages
     WHERE update_due_at IS NOT NULL AND sent_at IS NOT NULL ORDER BY update_due_at LIMIT 1),
    (SELECT p.resumed_at FROM approval_messages m JOIN step_parks p ON p.id = m.park_id
     WHERE m.shows_open AND m.sent_at IS NOT NULL AND p.resumed_at IS NOT NULL
     ORDER BY p.resumed_at LIMIT 1),
    -- remind_and_escalate_approvals (approvals_remind_due, approvals_escalate_due)
    (SELECT remind_at FROM step_parks
     WHERE kind = 'approval' AND resumed_at IS NULL AND reminded_at IS NULL
       AND remind_at IS NOT NULL
     ORDER BY remind_at LIMIT 1),
    (SELECT escalate_at FROM step_parks
     WHERE kind = 'approval' AND resumed_at IS NULL AND escalated_at IS NULL
       AND escalate_at IS NOT NULL
     ORDER BY escalate_at LIMIT 1)
) - now()) AS seconds
