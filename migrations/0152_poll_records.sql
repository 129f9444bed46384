-- Polling triggers (shared/triggers/poll.py): per source, when it was last polled; per row
-- polled, which occurrence of it onceflow started and what became of it.

-- One conditional upsert on this row claims a source's poll for its period (like
-- sweep_duties), so overlapping sweeps poll a source once per `every_seconds`.
CREATE TABLE poll_sources (
    workflow_id     uuid PRIMARY KEY REFERENCES workflows (id),
    last_polled_at  timestamptz NOT NULL,
    last_finished_at timestamptz,
    last_result     jsonb,
    last_error      text
);

-- The poll key is (workflow, record, generation, attempt): the row's primary key holds the
-- record, and a new occurrence is claimed by moving (generation, attempt) strictly forward
-- in one guarded upsert, so two pollers that saw the same state claim it once. A generation
-- is one stretch of "not handled yet": it ends when the row is stamped; the application
-- clearing the stamp again starts the next one. Attempts count the runs started for it (the
-- after_attempts policy stops at N).
CREATE TABLE poll_records (
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    record_key   text NOT NULL,
    generation   integer NOT NULL CHECK (generation > 0),
    attempts     integer NOT NULL CHECK (attempts > 0),
    event_id     bigint REFERENCES workflow_trigger_events (id),
    status       text NOT NULL CHECK (status IN ('open', 'stamped', 'gave_up')),
    stamped_at   timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, record_key),
    CHECK ((status = 'open') = (stamped_at IS NULL))
);
