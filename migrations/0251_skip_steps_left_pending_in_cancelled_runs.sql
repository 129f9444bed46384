-- Repair what issue 23's item 12 left behind before its fix: steps `pending` under a cancelled
-- run, which nothing can ever claim (the claim wants a running run) and the backlog report
-- counts as the oldest pending step for good. Two paths made them: a cancel that read the
-- run's steps before a settle holding the run row committed the next step, and the sweep's
-- reclaim of an expired lease in a run cancelled meanwhile. Neither had started an
-- at-most-once call the step row knows of (the reclaim failed marked steps OUTCOME_UNKNOWN),
-- so they end as the cancel would have ended them: skipped, CANCELLED, saying why.
UPDATE workflow_steps s
SET status = 'skipped', finished_at = now(), wake_at = NULL, outcome_code = 'CANCELLED',
    error = 'left pending when its run was cancelled (issue 23, item 12); skipped by '
            'migration 0251'
FROM workflow_runs r
WHERE r.id = s.run_id AND r.status = 'cancelled' AND s.status = 'pending';
