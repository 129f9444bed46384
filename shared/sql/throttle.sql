-- Per-connection throttling: a fixed window per connection in Postgres, so the limit holds across
-- every instance of every function (an in-process limiter multiplies by the instance count).

-- name: throttle_claim
-- One statement claims a slot: the window row is created by the first caller and bumped by the
-- rest; ON CONFLICT makes concurrent first callers collapse onto one row instead of failing.
WITH c AS (
    SELECT id,
           rate_limit_per_window AS limit_per_window,
           rate_limit_window_seconds AS window_seconds,
           to_timestamp(floor(extract(epoch FROM now()) / rate_limit_window_seconds)
                        * rate_limit_window_seconds) AS window_start
      FROM connections
     WHERE id = CAST(:connection_id AS uuid)
)
INSERT INTO throttle_windows (connection_id, window_start, used)
SELECT id, window_start, 1 FROM c
ON CONFLICT (connection_id, window_start) DO UPDATE SET used = throttle_windows.used + 1
RETURNING used,
          (SELECT limit_per_window FROM c) AS limit_per_window,
          extract(epoch FROM (throttle_windows.window_start
                              + make_interval(secs => (SELECT window_seconds FROM c))
                              - now()))::float8 AS seconds_left

-- name: throttle_windows_delete_expired
-- Windows that ended more than an hour ago (the sweep calls this; rows are tiny either way).
DELETE FROM throttle_windows WHERE window_start < now() - interval '1 hour'
