-- The one definition of the dedup rule (issue 32): what once_per_record and not_while_running
-- find for each (workflow, mode, record) — the enrollment, or the oldest live running run —
-- the refusal it means (`duplicate` before `already_running`) and its words. Admission's
-- decision statement (`admission_admit`) and "would this record enroll?"
-- (`admission_would_run_history`, shared/admission/would_run.py) both read it, so the answer
-- and the decision can't drift apart. A single-SELECT STABLE SQL function: Postgres inlines it
-- into the calling statement (as echo_markers_alive), which keeps the statement's snapshot
-- (taken after admission's locks) and its indexes, and the not_while_running scan stays one
-- sort for all bindings. Times in ISO 8601.
CREATE FUNCTION admission_dedup(
    p_workflow_ids uuid[], p_dedup_modes text[], p_record_keys text[])
RETURNS TABLE (workflow_id uuid, reason text, detail text, blocking_run_id uuid,
               enrolled_run_id uuid, enrolled_at timestamptz,
               active_run_id uuid, active_since timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT i.workflow_id,
           CASE WHEN en.run_id IS NOT NULL THEN 'duplicate'
                WHEN act.id IS NOT NULL THEN 'already_running' END,
           CASE WHEN en.run_id IS NOT NULL THEN
                    'record ' || i.record_key || ' already enrolled by run '
                    || CAST(en.run_id AS text) || ' at ' || (to_json(en.enrolled_at) #>> '{}')
                    || ' (dedup once_per_record)'
                WHEN act.id IS NOT NULL THEN
                    'run ' || CAST(act.id AS text) || ' for record ' || i.record_key
                    || ' is still running (started ' || (to_json(act.created_at) #>> '{}')
                    || '; dedup not_while_running)'
           END,
           coalesce(en.run_id, act.id),
           en.run_id, en.enrolled_at, act.id, act.created_at
    FROM unnest(p_workflow_ids, p_dedup_modes, p_record_keys)
         AS i (workflow_id, dedup_mode, record_key)
    LEFT JOIN workflow_enrollments en
           ON i.dedup_mode = 'once_per_record' AND en.workflow_id = i.workflow_id
          AND en.record_key = i.record_key
    LEFT JOIN (
        -- The oldest live running run per binding, in one sort for all of them.
        SELECT DISTINCT ON (j.workflow_id) j.workflow_id, ar.id, ar.created_at
        FROM unnest(p_workflow_ids, p_dedup_modes, p_record_keys)
             AS j (workflow_id, dedup_mode, record_key)
        JOIN workflow_runs ar ON ar.workflow_id = j.workflow_id AND ar.record_key = j.record_key
        WHERE j.dedup_mode = 'not_while_running' AND ar.status = 'running'
          AND ar.namespace = 'live'
        ORDER BY j.workflow_id, ar.created_at
    ) act ON act.workflow_id = i.workflow_id
$$;
