-- The retention rule "this lineage is still needed" had two homes in shared/sql/retention.sql
-- (retention_lineages_lock picks the roots, retention_lineages_delete checks again after the
-- lock): it is now this one function that both call (issue 25 item 7).

-- Whether any run of the lineage rooted at `p_root` is still needed: not finished, finished less
-- than `p_days` ago, holding an open budget reservation (the reconcile settles it from the step),
-- or owning a step with an unexpired echo marker. STABLE: now() is the statement's transaction
-- time, as it was inline; a single SELECT, so the planner can inline it into both statements.
CREATE FUNCTION retention_lineage_needed(p_root uuid, p_days integer) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT EXISTS (
    SELECT 1 FROM workflow_runs o
    WHERE o.lineage_root = p_root
      AND (o.finished_at IS NULL
           OR o.finished_at >= now() - make_interval(days => p_days)
           OR EXISTS (SELECT 1 FROM budget_reservations b
                      WHERE b.run_id = o.id AND b.status = 'reserved')
           OR EXISTS (SELECT 1 FROM workflow_steps s
                      JOIN echo_markers m ON m.step_id = s.id
                      WHERE s.run_id = o.id AND m.keep_until >= now())))
$$;
