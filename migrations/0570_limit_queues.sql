-- Priorities and fair shares behind the step limits (issue 29, item 4;
-- shared/gates/limit_queue.py tells the whole story).
--
-- A run's `priority` (its workflow's `priority` expression, evaluated at admission and
-- clamped to -10..10) is copied onto each of its steps, so a waiting line is ordered from the
-- step row's own index.
ALTER TABLE workflow_runs ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT workflow_runs_priority_range CHECK (priority BETWEEN -10 AND 10);
ALTER TABLE workflow_steps ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT workflow_steps_priority_range CHECK (priority BETWEEN -10 AND 10);

-- A step refused by a limit while others wait joins that limit's line instead of racing for
-- the next window: `limit_wait` names the limit ('scope|subject'), `limit_turn` its turn in
-- its share's round (round-robin: see limit_shares). The grantor moves the first in line to
-- pending with `limit_granted` set: the slot is counted already, its gate passes without a
-- second claim.
ALTER TABLE workflow_steps ADD COLUMN limit_wait text;
ALTER TABLE workflow_steps ADD COLUMN limit_turn bigint;
ALTER TABLE workflow_steps ADD COLUMN limit_granted text;

-- One row per limit that has had a line: what the grantor needs (the limit it counts against,
-- the turn it has served up to) and when its next window opens (`due_at`, the sweep's index;
-- NULL when nothing waits).
CREATE TABLE limit_queues (
    limit_key      text PRIMARY KEY,
    scope          text NOT NULL,
    subject        text NOT NULL,
    limit_max      integer NOT NULL CHECK (limit_max > 0),
    window_seconds integer NOT NULL CHECK (window_seconds > 0),
    served_turn    bigint NOT NULL DEFAULT 0,
    due_at         timestamptz
);
CREATE INDEX limit_queues_due ON limit_queues (due_at) WHERE due_at IS NOT NULL;

-- Each share (tenant|workflow) of a limit numbers its waiting steps from the turn the limit
-- has served up to: a share that joins late starts at the front of the next round instead of
-- behind another share's backlog.
CREATE TABLE limit_shares (
    limit_key  text NOT NULL REFERENCES limit_queues (limit_key) ON DELETE CASCADE,
    share      text NOT NULL,
    last_turn  bigint NOT NULL,
    PRIMARY KEY (limit_key, share)
);

-- The line, in grant order: priority first, then the round, then arrival.
CREATE INDEX workflow_steps_limit_line
    ON workflow_steps (limit_wait, priority DESC, limit_turn, id)
    WHERE status = 'waiting_for_retry' AND limit_wait IS NOT NULL;
-- Steps still bound to a line that are not waiting in it (refused, not settled yet; reclaimed):
-- the grantor keeps the line due while any exists.
CREATE INDEX workflow_steps_limit_bound ON workflow_steps (limit_wait)
    WHERE limit_wait IS NOT NULL AND status IN ('pending', 'running');
