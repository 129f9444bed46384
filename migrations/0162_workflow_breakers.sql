-- The circuit breaker per workflow: after N consecutive failed runs the workflow is paused and
-- admission refuses its events with `workflow_paused` until a person resumes it (optionally
-- half-open: runs are admitted again and the next run's outcome closes or re-opens it).
CREATE TABLE workflow_breakers (
    workflow_id           uuid PRIMARY KEY REFERENCES workflows (id),
    state                 text NOT NULL DEFAULT 'closed'
                          CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive_failures  integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    trips                 integer NOT NULL DEFAULT 0,
    opened_at             timestamptz,
    reason                text,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- An open breaker says since when and why.
    CONSTRAINT workflow_breakers_open_has_reason
        CHECK (state <> 'open' OR (opened_at IS NOT NULL AND reason IS NOT NULL))
);

ALTER TABLE admission_refusals DROP CONSTRAINT admission_refusals_reason_check;
ALTER TABLE admission_refusals ADD CONSTRAINT admission_refusals_reason_check CHECK (reason IN (
    'duplicate', 'already_running', 'rule_not_matched', 'insufficient_credits',
    'echo_suppressed', 'provider_suppressed', 'missing_record_identity', 'workflow_paused'));
