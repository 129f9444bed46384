-- Cancel: ops stop a live run. The run ends `cancelled` with who and why, kept on the row
-- (the audit trail has the call too); its pending and parked steps become `skipped`. A
-- rehearsal's stop also ends in `cancelled`, without a person: only live runs must say who.
ALTER TABLE workflow_runs ADD COLUMN cancelled_by text;
ALTER TABLE workflow_runs ADD COLUMN cancel_reason text;
ALTER TABLE workflow_runs ADD CONSTRAINT runs_cancelled_says_who CHECK (
    (cancelled_by IS NULL OR status = 'cancelled')
    AND (status <> 'cancelled' OR namespace <> 'live' OR cancelled_by IS NOT NULL));
