-- Batches (issue 29, item 2): a trigger's `batch: {max_size, max_wait, key?}` gathers up to
-- `max_size` events into one run (`event.batch`). A batch is the debounce burst's gathering
-- with another close rule, so it is a `debounce_bursts` row (one home for "events held for one
-- run, fired by a guarded statement, found by the sweep's due index"):
--   debounce: `max_size` NULL; `fire_at` moves to `period` after each event (≤ max_fire_at);
--   batch:    `max_size` set; `period_seconds` = max_wait, so `fire_at` stays at first event +
--             max_wait; the event that fills it sets `fire_at = now()` and fires it in its own
--             admission transaction. A full batch takes no more events.
-- The members of a fired batch are refused `batched`, naming the run (the debounce's are
-- `superseded`); the run's own event is the batch's last.
ALTER TABLE debounce_bursts ADD COLUMN max_size integer;
ALTER TABLE debounce_bursts ADD CONSTRAINT debounce_bursts_max_size
    CHECK (max_size IS NULL OR (max_size > 1 AND event_count <= max_size));

-- The reasons' one list is shared/admission/admit.py `Reason`; this CHECK mirrors it.
ALTER TABLE admission_refusals DROP CONSTRAINT admission_refusals_reason_check;
ALTER TABLE admission_refusals ADD CONSTRAINT admission_refusals_reason_check CHECK (reason IN (
    'duplicate', 'already_running', 'rule_not_matched', 'insufficient_credits',
    'echo_suppressed', 'provider_suppressed', 'missing_record_identity', 'workflow_paused',
    'definition_unreadable', 'superseded', 'batched'));
