-- Retention (shared/sweep/retention.py): finished runs, decided events and processed inbox rows are
-- deleted after a retention, in small batches found through an index, never by a full scan.

-- Money and promise records outlive the runs they name. The credit ledger and its refunds
-- (money: kept for good), budget reservations (the spend a budget window counts) and
-- enrollments (once_per_record: the record must never enroll again) keep the run and step ids
-- they were written for as plain history; those runs may be pruned, so the ids are no longer
-- foreign keys. Nothing reads them expecting the run to exist: admission reads an enrollment's
-- run id only to name it in a refusal's detail.
ALTER TABLE credit_ledger DROP CONSTRAINT credit_ledger_run_id_fkey;
ALTER TABLE credit_ledger DROP CONSTRAINT credit_ledger_step_id_fkey;
ALTER TABLE credit_refunds DROP CONSTRAINT credit_refunds_step_id_fkey;
ALTER TABLE budget_reservations DROP CONSTRAINT budget_reservations_run_id_fkey;
ALTER TABLE budget_reservations DROP CONSTRAINT budget_reservations_step_id_fkey;
ALTER TABLE workflow_enrollments DROP CONSTRAINT workflow_enrollments_run_id_fkey;

-- Where a batch starts: finished runs by age, per namespace (rehearsals have their own,
-- shorter retention). Running runs are not in the index at all.
CREATE INDEX workflow_runs_finished ON workflow_runs (namespace, finished_at)
    WHERE finished_at IS NOT NULL;
-- Decided (or given-up) events by age; undecided ones are the outbox's and the sweep's.
CREATE INDEX workflow_trigger_events_decided ON workflow_trigger_events (decided_at)
    WHERE decided_at IS NOT NULL;
CREATE INDEX workflow_trigger_events_given_up ON workflow_trigger_events (undelivered_at)
    WHERE undelivered_at IS NOT NULL AND decided_at IS NULL;
-- Processed inbox rows by age.
CREATE INDEX webhook_inbox_processed ON webhook_inbox (finished_at)
    WHERE status = 'processed';

-- Every foreign key into a row retention deletes needs an index on the referencing column:
-- without one, deleting a parent row checks the child table by a full scan, once per row.
-- Partial where the column is mostly null, so the hot paths that write these rows pay little.
CREATE INDEX workflow_runs_replay_of ON workflow_runs (replay_of) WHERE replay_of IS NOT NULL;
CREATE INDEX workflow_runs_event ON workflow_runs (event_id) WHERE event_id IS NOT NULL;
CREATE INDEX workflow_steps_copied_from ON workflow_steps (copied_from)
    WHERE copied_from IS NOT NULL;
CREATE INDEX workflow_steps_park ON workflow_steps (park_id) WHERE park_id IS NOT NULL;
CREATE INDEX delivery_claims_run ON delivery_claims (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX echo_markers_step ON echo_markers (step_id) WHERE step_id IS NOT NULL;
CREATE INDEX step_parks_early_event ON step_parks (early_event_id)
    WHERE early_event_id IS NOT NULL;
CREATE INDEX step_parks_resumed_event ON step_parks (resumed_event_id)
    WHERE resumed_event_id IS NOT NULL;
CREATE INDEX cron_ticks_event ON cron_ticks (event_id) WHERE event_id IS NOT NULL;
CREATE INDEX webhook_trigger_keys_event ON webhook_trigger_keys (event_id)
    WHERE event_id IS NOT NULL;
CREATE INDEX poll_records_event ON poll_records (event_id) WHERE event_id IS NOT NULL;
CREATE INDEX workflow_trigger_events_inbox ON workflow_trigger_events (inbox_id)
    WHERE inbox_id IS NOT NULL;
CREATE INDEX unrouted_provider_events_inbox ON unrouted_provider_events (inbox_id)
    WHERE inbox_id IS NOT NULL;
