-- finally: (issue 30, item 6): a run whose version declares a `finally:` list does not end
-- when its main phase (or its compensations, a cancel, its goal met) decides how it ends: it stays
-- `running` in the `finally` phase, with that decision kept in `final_status`, while its
-- finally steps run (one step row each, step_key `finally:<id>`, shared/steps/finale.py); the
-- last one ends the run `final_status` (or `failed` when a finally step failed). Runs of
-- versions without `finally:` never enter it and never set `final_status`.
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_phase_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_phase_check
    CHECK (phase IN ('main', 'compensating', 'finally'));
ALTER TABLE workflow_runs
    ADD COLUMN final_status text
        CONSTRAINT workflow_runs_final_status_check
        CHECK (final_status IN ('succeeded', 'failed', 'cancelled', 'goal_met'));

-- A finally step's row is journaled under `finally:<step id>`: a step id never holds ':', so
-- neither a node's own key nor a compensation's can take its place.
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_step_key_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_step_key_check
    CHECK (step_key ~ '^(compensate:|finally:)?[A-Za-z_][A-Za-z0-9_-]*(\[[0-9]+\])*$');

-- A run cancelled into its finally phase says who cancelled it while its finally steps run,
-- still `running` (final_status `cancelled`), and after they end it `cancelled`.
ALTER TABLE workflow_runs DROP CONSTRAINT runs_cancelled_says_who;
ALTER TABLE workflow_runs ADD CONSTRAINT runs_cancelled_says_who CHECK (
    (cancelled_by IS NULL OR status = 'cancelled' OR final_status = 'cancelled')
    AND (status <> 'cancelled' OR namespace <> 'live' OR cancelled_by IS NOT NULL));
