-- The sweep's periodic duties (subscription repair, marker expiry, later cron/timeouts):
-- when each last started, so that across overlapping sweep invocations and instances a duty
-- runs once per period. A duty is claimed with one conditional upsert on this row.
CREATE TABLE sweep_duties (
    name              text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]*$'),
    last_started_at   timestamptz NOT NULL,
    last_finished_at  timestamptz,
    last_ok           boolean,
    last_result       jsonb,
    last_error        text
);
