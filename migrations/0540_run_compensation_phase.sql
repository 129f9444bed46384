-- Undo (issue 30, item 6): a run whose step failed after steps that declare `compensate:`
-- succeeded stays `running` in the `compensating` phase while those compensations run, one
-- step row each (step_key `compensate:<key>`), advanced by the same engine; the last one ends
-- the run `failed`. Every existing run is in its main phase.
ALTER TABLE workflow_runs
    ADD COLUMN phase text NOT NULL DEFAULT 'main'
        CONSTRAINT workflow_runs_phase_check CHECK (phase IN ('main', 'compensating'));

-- A compensation's row is journaled under `compensate:<step key>` (shared/steps/journal.py):
-- a step id never holds ':', so no node's own key can take a compensation's place.
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_step_key_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_step_key_check
    CHECK (step_key ~ '^(compensate:)?[A-Za-z_][A-Za-z0-9_-]*(\[[0-9]+\])*$');
