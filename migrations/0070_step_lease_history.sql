-- Lease history: every lease a step was claimed under, so ops see each attempt of a step and
-- how it ended, not only the current lease kept on the step row. Rows are written by the
-- statements that already move the step (the claim inserts one, the settle and the sweep's
-- reclaim close it), never in a round trip of their own.
CREATE TABLE workflow_step_leases (
    -- The identity of an attempt. (step_id, attempt) is not unique: an ops retry resets the
    -- attempt budget, and a throttled attempt gives its number back.
    lease_id      uuid PRIMARY KEY,
    step_id       uuid NOT NULL REFERENCES workflow_steps (id) ON DELETE CASCADE,
    attempt       integer NOT NULL CHECK (attempt >= 1),
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    -- settled: its holder settled the step (fenced on this lease).
    -- reclaimed: it expired and the sweep took the step back (a holder that was still alive
    --            learns on its next heartbeat or settle that the lease is gone).
    end_kind      text CHECK (end_kind IN ('settled', 'reclaimed')),
    -- The step status the ending moved the step to, and what that attempt answered: the step
    -- row keeps only the last attempt's outcome.
    end_status    text,
    outcome_code  text,
    error_class   text CHECK (error_class IN ('transient', 'permanent')),
    error         text,
    ended_at      timestamptz,
    CONSTRAINT step_leases_ended_iff_end_kind CHECK ((end_kind IS NULL) = (ended_at IS NULL)),
    CONSTRAINT step_leases_end_status_fits_kind CHECK (
        (end_kind IS NULL AND end_status IS NULL)
        OR (end_kind = 'settled'
            AND end_status IN ('succeeded', 'failed', 'waiting_for_delay', 'waiting_for_retry'))
        OR (end_kind = 'reclaimed' AND end_status IN ('pending', 'failed')))
)
-- A row is closed moments after it is inserted: room on its page lets that update be HOT
-- (no new index entries) on the claim/settle path.
WITH (fillfactor = 80);
-- A run's journal reads its steps' leases in order; the cascade from a step uses it too.
CREATE INDEX workflow_step_leases_step ON workflow_step_leases (step_id, claimed_at);
-- The retention duty's range: rows arrive in claimed_at order, so a BRIN index answers
-- "claimed before the cutoff" at almost no cost to the insert on the claim path.
CREATE INDEX workflow_step_leases_claimed ON workflow_step_leases USING brin (claimed_at);
