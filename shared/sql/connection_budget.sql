-- A portal's shared rate budget (issue 29, item 5; shared/port/budget.py): what the vendor's
-- rate-limit headers last said the portal has left, narrowing the connection's window for every
-- workflow and instance on the connection (migrations/0560_connection_rate_budgets.sql).

-- name: connection_budget_observe
-- What one answer's headers said. Within a live window the figure only goes down (LEAST): a
-- note written late, from an answer older than one already noted, never gives back what the
-- gate has since taken; a window that has ended takes the new figure whole. A NULL figure (the
-- answer said nothing of that window, e.g. HubSpot's OAuth calls carry no daily headers) keeps
-- what was there. INSERT … SELECT from connections: a connection deleted meanwhile writes
-- nothing (no foreign-key error spoiling the other notes of the flush).
INSERT INTO connection_rate_budgets AS b
       (connection_id, remaining, remaining_until, daily_remaining, daily_until, observed_at)
SELECT c.id, CAST(:remaining AS integer),
       now() + make_interval(secs => CAST(:reset_seconds AS float8)),
       CAST(:daily_remaining AS integer),
       now() + make_interval(secs => CAST(:daily_reset_seconds AS float8)),
       now()
  FROM connections c WHERE c.id = CAST(:connection_id AS uuid)
ON CONFLICT (connection_id) DO UPDATE SET
    remaining = CASE WHEN excluded.remaining IS NULL THEN b.remaining
                     WHEN b.remaining_until > now() THEN LEAST(b.remaining, excluded.remaining)
                     ELSE excluded.remaining END,
    remaining_until = CASE WHEN excluded.remaining IS NULL THEN b.remaining_until
                           WHEN b.remaining_until > now() THEN b.remaining_until
                           ELSE excluded.remaining_until END,
    daily_remaining = CASE WHEN excluded.daily_remaining IS NULL THEN b.daily_remaining
                           WHEN b.daily_until > now()
                               THEN LEAST(b.daily_remaining, excluded.daily_remaining)
                           ELSE excluded.daily_remaining END,
    daily_until = CASE WHEN excluded.daily_remaining IS NULL THEN b.daily_until
                       WHEN b.daily_until > now() THEN b.daily_until
                       ELSE excluded.daily_until END,
    observed_at = now()

-- name: connection_budget_shrink
-- A 429: nothing is left until its Retry-After, and the connection's window is halved (again,
-- if a 429 came within the quiet period) until a quiet period of :quiet_windows of the
-- connection's windows passes without one; each 429 pushes the end of the quiet period on.
INSERT INTO connection_rate_budgets AS b
       (connection_id, remaining, remaining_until, shrunk_max, shrunk_until, observed_at)
SELECT c.id, 0, now() + make_interval(secs => CAST(:retry_after AS float8)),
       GREATEST(c.rate_limit_per_window / 2, 1),
       now() + make_interval(secs => GREATEST(
           CAST(:quiet_windows AS integer) * c.rate_limit_window_seconds,
           CAST(:retry_after AS float8))),
       now()
  FROM connections c WHERE c.id = CAST(:connection_id AS uuid)
ON CONFLICT (connection_id) DO UPDATE SET
    remaining = 0,
    remaining_until = GREATEST(b.remaining_until, excluded.remaining_until),
    shrunk_max = CASE WHEN b.shrunk_until > now() THEN GREATEST(b.shrunk_max / 2, 1)
                      ELSE excluded.shrunk_max END,
    shrunk_until = excluded.shrunk_until,
    observed_at = now()

-- name: connection_budget_narrowed
-- `GET /v1/limits`: the connections whose window the portal's budget narrows now (a spent
-- daily budget or short window, or a window shrunk by a 429), with what the headers said.
-- A NULL :tenant_id is an admin's every tenant. Small: one row per connection that called.
SELECT CAST(b.connection_id AS text) AS connection_id, c.tenant_id, b.remaining,
       b.daily_remaining, b.shrunk_max,
       CASE WHEN b.daily_until > now() AND b.daily_remaining <= 0 THEN 'daily'
            WHEN b.remaining_until > now() AND b.remaining <= 0 THEN 'window'
            ELSE 'shrunk' END AS kind,
       CASE WHEN b.daily_until > now() AND b.daily_remaining <= 0 THEN b.daily_until
            WHEN b.remaining_until > now() AND b.remaining <= 0 THEN b.remaining_until
            ELSE b.shrunk_until END AS until,
       c.rate_limit_per_window AS configured_max,
       c.rate_limit_window_seconds AS window_seconds
  FROM connection_rate_budgets b
  JOIN connections c ON c.id = b.connection_id
 WHERE ((b.daily_until > now() AND b.daily_remaining <= 0)
        OR (b.remaining_until > now() AND b.remaining <= 0)
        OR b.shrunk_until > now())
   AND (CAST(:tenant_id AS text) IS NULL OR c.tenant_id = CAST(:tenant_id AS text))
 ORDER BY b.observed_at DESC
 LIMIT CAST(:limit AS integer)
