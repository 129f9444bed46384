-- A workflow's `priority` (evaluated at admission over the rule scope, clamped to -10..10,
-- shared/admission/priority.py) is stored on a pairing admission holds back, so the run its
-- start creates later (a debounce burst's or batch's fire, a throttled or keyed-concurrency
-- start) carries the priority its event was admitted with: nothing evaluates it again.
ALTER TABLE run_start_queue ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT run_start_queue_priority_range CHECK (priority BETWEEN -10 AND 10);
ALTER TABLE debounce_bursts ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT debounce_bursts_priority_range CHECK (priority BETWEEN -10 AND 10);
