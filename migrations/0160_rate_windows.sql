-- Rate limits beyond the connection: one fixed-window counter table keyed by (scope, subject),
-- so a workflow's `rate_limit` and a destination host's limit hold across instances the same
-- way the per-connection window does. The live connection windows are carried over, so the
-- migration does not reset a window that is running.
ALTER TABLE throttle_windows RENAME TO throttle_windows_0006;

CREATE TABLE throttle_windows (
    scope           text NOT NULL CHECK (scope IN ('connection', 'workflow', 'host')),
    -- connection id, workflow id, or "<tenant>|<host>"
    subject         text NOT NULL,
    window_seconds  integer NOT NULL CHECK (window_seconds > 0),
    window_start    timestamptz NOT NULL,
    used            integer NOT NULL,
    PRIMARY KEY (scope, subject, window_seconds, window_start)
);
CREATE INDEX throttle_windows_start ON throttle_windows (window_start);

INSERT INTO throttle_windows (scope, subject, window_seconds, window_start, used)
SELECT 'connection', w.connection_id::text, c.rate_limit_window_seconds, w.window_start, w.used
  FROM throttle_windows_0006 w JOIN connections c ON c.id = w.connection_id
 WHERE c.rate_limit_window_seconds > 0;

DROP TABLE throttle_windows_0006;
