-- A step may wait more than once: an ops retry of a run whose wait timed out, or whose
-- approval was rejected with `on_reject: fail`, starts the step again, and its wait must open
-- a new park (a fresh deadline, offered to events again; an approval that asks again) rather
-- than get the closed one back. One park per step became one OPEN park per step: an attempt
-- that crashed after writing its park row and runs again still finds that row (the first
-- deadline holds), and the closed parks stay as the record of the earlier waits (who
-- decided, which event or deadline resumed them).
ALTER TABLE step_parks DROP CONSTRAINT step_parks_step_id_key;
CREATE UNIQUE INDEX step_parks_one_open_per_step ON step_parks (step_id)
    WHERE resumed_at IS NULL;
-- A step's parks, for the run card's history and the foreign key's deletes.
CREATE INDEX step_parks_step ON step_parks (step_id);
