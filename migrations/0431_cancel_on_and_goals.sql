-- `cancel_on` and `goal` on a workflow (issue 31, item 3). A run whose goal was met by an
-- admitted event about its record ends `goal_met`: terminal, with finished_at, like the other
-- ends; its pending and parked steps are skipped (outcome GOAL_MET) and a wait it parked on is
-- closed as resumed by its `goal`. A `cancel_on` event ends the run `cancelled` through the ops
-- cancel's own statement, `cancelled_by` naming the event.
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check
    CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled', 'goal_met'));

ALTER TABLE step_parks DROP CONSTRAINT step_parks_resumed_by_check;
ALTER TABLE step_parks ADD CONSTRAINT step_parks_resumed_by_check
    CHECK (resumed_by IN ('event', 'decision', 'deadline', 'cancel', 'goal'));

-- Admission asks, per event, which running live runs are about its record (those whose
-- version declares `cancel_on` or a `goal` may stop): an index range on the running ones only,
-- not on every run the record ever had.
CREATE INDEX workflow_runs_running_record ON workflow_runs (tenant_id, record_key)
    WHERE status = 'running' AND namespace = 'live';

-- A polled row whose run met its goal is over, as a succeeded one is (else the poll would
-- take it for still running).
CREATE OR REPLACE FUNCTION poll_record_state(p_workflow_id uuid, p_record_key text)
RETURNS TABLE (generation integer, attempts integer, status text, outcome text)
LANGUAGE sql STABLE AS $$
    SELECT p.generation, p.attempts, p.status,
           CASE WHEN dc.event_id IS NULL AND e.undelivered_at IS NOT NULL THEN 'undelivered'
                WHEN dc.event_id IS NULL THEN 'unadmitted'
                WHEN dc.run_id IS NULL THEN 'refused'
                WHEN r.status IN ('succeeded', 'failed', 'cancelled') THEN r.status
                WHEN r.status = 'goal_met' THEN 'succeeded'
                ELSE 'running' END
      FROM poll_records p
      LEFT JOIN workflow_trigger_events e ON e.id = p.event_id
      LEFT JOIN delivery_claims dc ON dc.event_id = p.event_id
                                  AND dc.workflow_id = p.workflow_id
      LEFT JOIN workflow_runs r ON r.id = dc.run_id
     WHERE p.workflow_id = p_workflow_id AND p.record_key = p_record_key
$$;
