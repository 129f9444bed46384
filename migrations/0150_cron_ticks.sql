-- Cron triggers: one row per (workflow, scheduled instant) the sweep has decided about. The
-- primary key is the tick's identity: firing a tick is an INSERT, so a retried or concurrent
-- sweep that decides the same tick again conflicts and emits nothing (shared/triggers/cron.py).
-- A tick that passed while nothing ran is kept as `missed` with the reason, so ops can say
-- "tick 09:00 was missed, catch_up is off" instead of showing nothing at all.
CREATE TABLE cron_ticks (
    workflow_id   uuid NOT NULL REFERENCES workflows (id),
    scheduled_at  timestamptz NOT NULL,
    status        text NOT NULL CHECK (status IN ('fired', 'missed')),
    -- The trigger event a fired tick emitted (set in the same transaction as the row).
    event_id      bigint REFERENCES workflow_trigger_events (id),
    detail        text NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, scheduled_at),
    CHECK (status = 'fired' OR event_id IS NULL)
);
