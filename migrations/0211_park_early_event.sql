-- An event admitted between a wait's park row commit and its step's parking matches the park
-- but finds the step still running, so the guarded resume can't move it; its lookback reads
-- only events recorded since the park row was written, so an event whose row was begun
-- earlier (and committed after the park) was lost to the wait. Now such an event is noted on
-- the park row (`early_event_id`, the first one that matched), and the settle that parks the
-- step marks the park `parked_at` in its transaction and resumes the step with the noted
-- event at once. Both are written on the park row itself, so one row lock orders them: a note
-- is taken only while `parked_at` is null, and the parking reads the note under the lock
-- (shared/steps/parks.py).
ALTER TABLE step_parks
    ADD COLUMN parked_at timestamptz,
    ADD COLUMN early_event_id bigint REFERENCES workflow_trigger_events (id),
    ADD CONSTRAINT parks_early_event_is_an_event_wait
        CHECK (early_event_id IS NULL OR kind = 'event');
