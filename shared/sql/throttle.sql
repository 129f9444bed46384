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

-- name: throttle_claim_connection
-- The connection-limit gate in one statement (one round trip, issue 27): is the portal's
-- budget spent by the vendor's headers (connection_rate_budgets, shared/port/budget.py: its
-- daily budget, else its short window)? If not, take one from each live figure and claim a slot
-- in the connection's window (`throttle_claim`'s upsert, so the same exactness under racing
-- instances), the limit read from the connection row. The budget row is locked FOR UPDATE
-- first: racing claims queue on it, each seeing what the one before it left, so exactly
-- `remaining` of them get through and the rest are told until when (`spent`, `until`); a
-- spent budget claims no slot. No budget row (the connection has made no call yet): nothing
-- narrows it. No row at all: the connection doesn't exist — nothing to count against (the
-- port refuses it clearly). The window's max is the configured one, halved while a 429 shrank
-- it (`shrunk_until`): the quiet period restores it by itself.
WITH b AS (
    SELECT connection_id, remaining, remaining_until, daily_remaining, daily_until,
           shrunk_max, shrunk_until
      FROM connection_rate_budgets WHERE connection_id = CAST(:connection_id AS uuid)
       FOR UPDATE
), limits AS (
    SELECT CASE WHEN b.shrunk_until > now() THEN LEAST(c.rate_limit_per_window, b.shrunk_max)
                ELSE c.rate_limit_per_window END AS max,
           c.rate_limit_window_seconds AS window_seconds,
           CASE WHEN b.daily_until > now() AND b.daily_remaining <= 0 THEN 'daily'
                WHEN b.remaining_until > now() AND b.remaining <= 0 THEN 'window' END AS spent,
           CASE WHEN b.daily_until > now() AND b.daily_remaining <= 0 THEN b.daily_until
                ELSE b.remaining_until END AS spent_until,
           b.connection_id AS budget_row
      FROM connections c
      LEFT JOIN b ON b.connection_id = c.id
     WHERE c.id = CAST(:connection_id AS uuid)
), taken AS (
    UPDATE connection_rate_budgets r
       SET remaining = CASE WHEN r.remaining_until > now() THEN r.remaining - 1
                            ELSE r.remaining END,
           daily_remaining = CASE WHEN r.daily_until > now() THEN r.daily_remaining - 1
                                  ELSE r.daily_remaining END
      FROM limits l
     WHERE r.connection_id = l.budget_row AND l.spent IS NULL
    RETURNING r.connection_id
), claimed AS (
    INSERT INTO throttle_windows (scope, subject, window_seconds, window_start, used, limit_max)
    SELECT 'connection', :connection_id, l.window_seconds,
           to_timestamp(floor(extract(epoch FROM now()) / l.window_seconds) * l.window_seconds),
           1, l.max
      FROM limits l
     WHERE l.spent IS NULL
    ON CONFLICT (scope, subject, window_seconds, window_start)
    DO UPDATE SET used = throttle_windows.used + 1, limit_max = excluded.limit_max
    RETURNING used,
              throttle_windows.window_start
                  + make_interval(secs => throttle_windows.window_seconds) AS window_end,
              extract(epoch FROM (throttle_windows.window_start
                                  + make_interval(secs => throttle_windows.window_seconds)
                                  - now()))::float8 AS seconds_left
)
SELECT l.spent,
       CASE WHEN l.spent IS NULL THEN c.used ELSE 0 END AS used,
       CASE WHEN l.spent IS NULL THEN c.window_end ELSE l.spent_until END AS window_end,
       CASE WHEN l.spent IS NULL THEN c.seconds_left
            ELSE extract(epoch FROM (l.spent_until - now()))::float8 END AS seconds_left,
       l.max, l.window_seconds
  FROM limits l LEFT JOIN claimed c ON true

-- name: throttle_connection_limit
-- The connection's window as throttle_claim_connection counts it (shrunk after a 429).
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
