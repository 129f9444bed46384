-- Replay, grown up (issue 30, item 1): a replay may start from a chosen step, on the run's
-- version or the workflow's current one, with an edited input for the chosen step.
-- `replay_from` is the step key it started from (NULL: from the first failure), set once at
-- insert; `replay_by` who asked (the ops principal's label).
ALTER TABLE workflow_runs ADD COLUMN replay_from text;
ALTER TABLE workflow_runs ADD COLUMN replay_by text;

-- A person's edit of a restarted step's input: the block runs on this object instead of the
-- rendered config. Written once, when the replay creates the step; `input_edited_by` says who.
ALTER TABLE workflow_steps ADD COLUMN input_override jsonb;
ALTER TABLE workflow_steps ADD COLUMN input_edited_by text;
