-- The sweep's reclaim of an expired lease whose run has already ended (cancelled by ops, or
-- failed by another branch) ends the step instead of putting it back to pending, where nothing
-- could claim it again (issue 23, item 12): `skipped` when nothing at-most-once may have left,
-- else `failed` OUTCOME_UNKNOWN. The lease's history row records that end.
ALTER TABLE workflow_step_leases DROP CONSTRAINT step_leases_end_status_fits_kind;
ALTER TABLE workflow_step_leases ADD CONSTRAINT step_leases_end_status_fits_kind CHECK (
    (end_kind IS NULL AND end_status IS NULL)
    OR (end_kind = 'settled'
        AND end_status IN ('succeeded', 'failed', 'waiting_for_delay', 'waiting_for_retry',
                           'waiting_for_event', 'waiting_for_approval'))
    OR (end_kind = 'reclaimed' AND end_status IN ('pending', 'failed', 'skipped')));
