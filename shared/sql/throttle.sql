-- Rate limits: fixed windows in Postgres per (scope, subject), so a limit holds across every
-- instance of every function (an in-process limiter multiplies by the instance count) and a
-- restart never resets a live window.

-- name: throttle_claim
-- One statement claims a slot: the window row is created by the first caller and bumped by the
-- rest; ON CONFLICT makes concurrent first callers collapse onto one row instead of failing,
-- and the row lock serializes the bumps, so `used` is exact however many instances race.
-- `limit_max`: the limit this claim counts against, kept for ops' view of the window
-- (the last claim's, should the limit change mid-window).
INSERT INTO throttle_windows (scope, subject, window_seconds, window_start, used, limit_max)
VALUES (:scope, :subject, CAST(:window_seconds AS integer),
        to_timestamp(floor(extract(epoch FROM now()) / CAST(:window_seconds AS integer))
                     * CAST(:window_seconds AS integer)),
        1, CAST(:limit_max AS integer))
ON CONFLICT (scope, subject, window_seconds, window_start)
DO UPDATE SET used = throttle_windows.used + 1, limit_max = excluded.limit_max
RETURNING used,
          throttle_windows.window_start
              + make_interval(secs => throttle_windows.window_seconds) AS window_end,
          extract(epoch FROM (throttle_windows.window_start
                              + make_interval(secs => throttle_windows.window_seconds)
                              - now()))::float8 AS seconds_left

-- name: throttle_connection_limit
-- The connection's window as the connection-limit gate counts it (limit_queue_claim,
-- shared/sql/limit_queue.sql: shrunk after a 429).
SELECT CASE WHEN b.shrunk_until > now() THEN LEAST(c.rate_limit_per_window, b.shrunk_max)
            ELSE c.rate_limit_per_window END AS max,
       c.rate_limit_window_seconds AS window_seconds
  FROM connections c
  LEFT JOIN connection_rate_budgets b ON b.connection_id = c.id
 WHERE c.id = CAST(:connection_id AS uuid)

-- name: throttle_windows_delete_expired
-- Windows that ended more than an hour ago (the sweep calls this; rows are tiny either way).
DELETE FROM throttle_windows
 WHERE window_start + make_interval(secs => window_seconds) < now() - interval '1 hour'
