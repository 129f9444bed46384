-- Step journal and the step engine's transitions. Every state change is one guarded UPDATE;
-- zero rows is an answer (see the docstring of the Python function that runs it).

-- name: steps_insert_many
-- New step rows for one run; a row that already exists (a redelivered settle, a resumed
-- admission) is left alone. Returns every wanted row that is still pending: the newly inserted
-- ones from the CTE, the pre-existing ones from the statement's snapshot (which does not see
-- the CTE's inserts), so no id appears twice.
WITH wanted AS (
    SELECT w.step_key, w.node_id, w.block_type
    FROM unnest(CAST(:step_keys AS text[]), CAST(:node_ids AS text[]),
                CAST(:block_types AS text[])) AS w (step_key, node_id, block_type)
), inserted AS (
    INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key,
                                dispatched_at)
    SELECT CAST(:run_id AS uuid), w.step_key, w.node_id, w.block_type,
           'onceflow:' || CAST(:lineage_root AS text) || ':' || w.step_key,
           CASE WHEN CAST(:stamp_dispatched AS boolean) THEN now() END
    FROM wanted w
    ON CONFLICT (run_id, step_key) DO NOTHING
    RETURNING id
)
SELECT CAST(id AS text) AS id FROM inserted
UNION ALL
SELECT CAST(s.id AS text) AS id
FROM workflow_steps s JOIN wanted w ON w.step_key = s.step_key
WHERE s.run_id = CAST(:run_id AS uuid) AND s.status = 'pending'

-- name: steps_pending_for_run
SELECT CAST(id AS text) AS id FROM workflow_steps
WHERE run_id = CAST(:run_id AS uuid) AND status = 'pending'
ORDER BY created_at, step_key

-- name: steps_mark_dispatched
UPDATE workflow_steps SET dispatched_at = now()
WHERE id = ANY(CAST(:step_ids AS uuid[])) AND status = 'pending'
