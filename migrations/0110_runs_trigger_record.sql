-- The record a run's trigger rule saw, kept with the run so its steps (and its replays) read the
-- same `record` in their expressions (shared/workflows/scope.py). Written by the admission
-- INSERT; copied by a replay; built by a rehearsal from the event it rehearses. NULL for runs
-- admitted before this column existed: their steps read the event's own record, built by the
-- same module, which is what their rule saw unless the trigger named its record by expression.
ALTER TABLE workflow_runs ADD COLUMN trigger_record jsonb;
