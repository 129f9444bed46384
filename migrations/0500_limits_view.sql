-- What each limit holds back (issue 29, item 7: `GET /v1/limits`).
--
-- A window row records the limit it counts against when it is claimed (`limit_max`), so ops
-- can show "3 of 5 admitted" without re-reading the definition or connection that set it (they
-- may have changed since; the window counts against what it was claimed with). NULL on rows
-- claimed before this migration: they end within their window.
ALTER TABLE throttle_windows ADD COLUMN limit_max integer;

-- Steps parked `THROTTLED` (waiting_for_retry until their limit's window ends): the limits view
-- counts them per limit. The sweep's due index holds every waiting step (delays, event waits,
-- approvals, ordinary retries); this one holds only the throttled ones, so the view reads no
-- other parked step.
CREATE INDEX workflow_steps_throttled ON workflow_steps (run_id)
    WHERE status = 'waiting_for_retry' AND outcome_code = 'THROTTLED';
