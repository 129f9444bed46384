-- The waiting line behind a step limit: priorities and fair shares (issue 29, item 4;
-- shared/gates/limit_queue.py). A limit is 'scope|subject' (`limit_key`), its window the
-- fixed window of shared/sql/throttle.sql; a grant is '<limit_key>@<window index>', valid in
-- the window it was counted in only.

-- name: limit_queue_claim
-- The gate's one statement (issue 27: one round trip, as the bare claim was): a grant this
-- step holds for this limit is taken (and cleared, with its place in the line); else, when no
-- step waits in the line, a slot is claimed as throttle_claim does (the same upsert, so the
-- same exactness under racing instances); when steps wait (or are bound to the line), nothing
-- is counted and the caller joins the line. The step row is written only when it holds a
-- grant or a place (a guarded UPDATE; zero rows is the common case: nothing to clear). No
-- `max` row: a connection that doesn't exist — nothing to count against.
-- A connection's window is also narrowed by the portal's rate budget (connection_rate_budgets,
-- shared/port/budget.py): its max is the configured one, LEAST'd with `shrunk_max` while a 429
-- shrank it (`shrunk_until`; the same rule as throttle_connection_limit), and a spent daily
-- budget (else short window) refuses with `spent` and `spent_until` before anything is
-- counted. The budget row is locked FOR UPDATE first and read from the lock (not the
-- statement's snapshot): racing claims queue on it, each seeing what the one before it left,
-- so exactly `remaining` of them take a call. A call is taken from each live figure by every
-- step that goes — the one whose claim fits the window AND the one that holds a grant (a grant
-- counted a window slot, never the portal's budget: a grant must not bypass a spent day); a
-- step refused by the window or sent to the line makes no call and takes none.
WITH b AS (
    SELECT connection_id, remaining, remaining_until, daily_remaining, daily_until,
           shrunk_max, shrunk_until
      FROM connection_rate_budgets WHERE connection_id = CAST(:connection_id AS uuid)
       FOR UPDATE
), limits AS (
    SELECT CAST(:limit_max AS integer) AS max, CAST(:window_seconds AS integer) AS window_seconds,
           CAST(NULL AS text) AS spent, CAST(NULL AS timestamptz) AS spent_until,
           CAST(NULL AS uuid) AS budget_row
     WHERE CAST(:connection_id AS text) IS NULL
    UNION ALL
    SELECT CASE WHEN b.shrunk_until > now() THEN LEAST(c.rate_limit_per_window, b.shrunk_max)
                ELSE c.rate_limit_per_window END,
           c.rate_limit_window_seconds,
           CASE WHEN b.daily_until > now() AND b.daily_remaining <= 0 THEN 'daily'
                WHEN b.remaining_until > now() AND b.remaining <= 0 THEN 'window' END,
           CASE WHEN b.daily_until > now() AND b.daily_remaining <= 0 THEN b.daily_until
                ELSE b.remaining_until END,
           b.connection_id
      FROM connections c
      LEFT JOIN b ON b.connection_id = c.id
     WHERE c.id = CAST(:connection_id AS uuid)
), previous AS (
    SELECT s.limit_granted FROM workflow_steps s WHERE s.id = CAST(:step_id AS uuid)
), cleared AS (
    UPDATE workflow_steps s
       SET limit_granted = CASE WHEN s.limit_granted LIKE :limit_key || '@%' THEN NULL
                                ELSE s.limit_granted END,
           limit_wait = CASE WHEN s.limit_wait = :limit_key THEN NULL ELSE s.limit_wait END
     WHERE s.id = CAST(:step_id AS uuid) AND s.status = 'running'
       AND (s.limit_granted LIKE :limit_key || '@%' OR s.limit_wait = :limit_key)
    RETURNING s.id
), granted AS (
    SELECT EXISTS (
        SELECT 1 FROM previous p, limits l, cleared c
         WHERE p.limit_granted = :limit_key || '@'
               || CAST(floor(extract(epoch FROM now()) / l.window_seconds) AS bigint)
    ) AS fresh
), waiting AS (
    -- parked in the line, or bound to it and not parked yet (refused a moment ago, its
    -- settle not committed; reclaimed): both index probes (limit_line, limit_bound)
    SELECT EXISTS (SELECT 1 FROM workflow_steps w
                    WHERE w.limit_wait = :limit_key AND w.status = 'waiting_for_retry')
        OR EXISTS (SELECT 1 FROM workflow_steps w
                    WHERE w.limit_wait = :limit_key AND w.status IN ('pending', 'running')
                      AND w.id <> CAST(:step_id AS uuid))
           AS anyone
), claimed AS (
    INSERT INTO throttle_windows (scope, subject, window_seconds, window_start, used, limit_max)
    SELECT :scope, :subject, l.window_seconds,
           to_timestamp(floor(extract(epoch FROM now()) / l.window_seconds) * l.window_seconds),
           1, l.max
      FROM limits l
     WHERE l.spent IS NULL
       AND NOT (SELECT fresh FROM granted) AND NOT (SELECT anyone FROM waiting)
    ON CONFLICT (scope, subject, window_seconds, window_start)
    DO UPDATE SET used = throttle_windows.used + 1, limit_max = excluded.limit_max
    RETURNING used
), taken AS (
    -- the call is taken by a step that goes only: a grant, or a claim that fits the window
    UPDATE connection_rate_budgets r
       SET remaining = CASE WHEN r.remaining_until > now() THEN r.remaining - 1
                            ELSE r.remaining END,
           daily_remaining = CASE WHEN r.daily_until > now() THEN r.daily_remaining - 1
                                  ELSE r.daily_remaining END
      FROM limits l
     WHERE r.connection_id = l.budget_row AND l.spent IS NULL
       AND ((SELECT fresh FROM granted)
            OR EXISTS (SELECT 1 FROM claimed c WHERE c.used <= l.max))
    RETURNING r.connection_id
)
SELECT l.max, l.window_seconds, g.fresh AS granted, w.anyone AS waiting, c.used,
       l.spent, l.spent_until,
       to_timestamp((floor(extract(epoch FROM now()) / l.window_seconds) + 1)
                    * l.window_seconds) AS window_end,
       extract(epoch FROM to_timestamp((floor(extract(epoch FROM now()) / l.window_seconds) + 1)
                                       * l.window_seconds) - now())::float8 AS seconds_left,
       extract(epoch FROM (l.spent_until - now()))::float8 AS spent_seconds_left
  FROM limits l CROSS JOIN granted g CROSS JOIN waiting w LEFT JOIN claimed c ON true

-- name: limit_queue_join
-- The step (running, refused) takes its place in the line: its share's next turn, numbered
-- from the turn the limit has served up to, so a share that joins late is served in the next
-- round rather than behind another share's backlog. The limit's row says when its next window
-- opens (the sweep's due index). A step that was in this line already (woken by its safety
-- deadline, refused again) keeps its turn. Zero rows: the step is not running under us (its
-- lease was lost): it joins nothing.
WITH queue AS (
    INSERT INTO limit_queues (limit_key, scope, subject, limit_max, window_seconds, due_at)
    VALUES (:limit_key, :scope, :subject, CAST(:limit_max AS integer),
            CAST(:window_seconds AS integer), CAST(:due_at AS timestamptz))
    ON CONFLICT (limit_key) DO UPDATE
       SET limit_max = excluded.limit_max, window_seconds = excluded.window_seconds,
           due_at = least(coalesce(limit_queues.due_at, excluded.due_at), excluded.due_at)
    RETURNING served_turn
), turn AS (
    INSERT INTO limit_shares (limit_key, share, last_turn)
    SELECT :limit_key, :share, q.served_turn + 1 FROM queue q
    ON CONFLICT (limit_key, share) DO UPDATE
       SET last_turn = greatest(limit_shares.last_turn + 1, excluded.last_turn)
    RETURNING last_turn
)
UPDATE workflow_steps s
   SET limit_wait = :limit_key,
       limit_turn = CASE WHEN s.limit_wait = :limit_key AND s.limit_turn IS NOT NULL
                         THEN s.limit_turn ELSE t.last_turn END
  FROM turn t
 WHERE s.id = CAST(:step_id AS uuid) AND s.status = 'running'
RETURNING s.limit_turn

-- name: limit_queue_due
-- The sweep's batch: lines whose next window has opened (by the due index), oldest first.
SELECT limit_key FROM limit_queues
 WHERE due_at IS NOT NULL AND due_at <= now()
 ORDER BY due_at
 LIMIT CAST(:batch AS integer)

-- name: limit_queue_lock
-- The grantor's lock on the line: two grantors of one limit take turns, so the second reads
-- the window the first counted its grants in. A connection's line is served by the
-- connection's window as it is now (shrunk after a 429, the rule of throttle_connection_limit),
-- not the one stored when a step joined; and while the portal's budget is spent
-- (`spent_until`) nothing is granted: every grant would be refused at its gate.
SELECT q.scope, q.subject,
       CASE WHEN c.id IS NULL THEN q.limit_max
            WHEN b.shrunk_until > now() THEN LEAST(c.rate_limit_per_window, b.shrunk_max)
            ELSE c.rate_limit_per_window END AS limit_max,
       coalesce(c.rate_limit_window_seconds, q.window_seconds) AS window_seconds,
       q.served_turn,
       CASE WHEN b.daily_until > now() AND b.daily_remaining <= 0 THEN b.daily_until
            WHEN b.remaining_until > now() AND b.remaining <= 0 THEN b.remaining_until
            END AS spent_until
  FROM limit_queues q
  LEFT JOIN connections c
    ON c.id = CASE WHEN q.scope = 'connection' THEN CAST(q.subject AS uuid) END
  LEFT JOIN connection_rate_budgets b ON b.connection_id = c.id
 WHERE q.limit_key = :limit_key
   FOR UPDATE OF q

-- name: limit_queue_window
-- The current window of the limit, created uncounted when no claim opened it yet, and locked
-- (the no-op update) until the grants are counted in it: a gate's claim in between waits.
INSERT INTO throttle_windows (scope, subject, window_seconds, window_start, used, limit_max)
VALUES (:scope, :subject, CAST(:window_seconds AS integer),
        to_timestamp(floor(extract(epoch FROM now()) / CAST(:window_seconds AS integer))
                     * CAST(:window_seconds AS integer)),
        0, CAST(:limit_max AS integer))
ON CONFLICT (scope, subject, window_seconds, window_start)
DO UPDATE SET used = throttle_windows.used
RETURNING used, window_start,
          CAST(floor(extract(epoch FROM window_start) / window_seconds) AS bigint) AS window_index,
          window_start + make_interval(secs => window_seconds) AS window_end

-- name: limit_queue_grant
-- The first `room` steps of the line, in grant order (priority, then round, then arrival: the
-- line's index, no sort), back to pending with a grant for this window, and counted in it.
-- Each move is guarded on `status = 'waiting_for_retry' AND limit_wait = :limit_key`: a step
-- cancelled or woken meanwhile is not granted (zero rows for it), and its slot is not counted.
WITH picked AS (
    SELECT s.id FROM workflow_steps s
     WHERE s.limit_wait = :limit_key AND s.status = 'waiting_for_retry'
     ORDER BY s.priority DESC, s.limit_turn, s.id
     LIMIT CAST(:room AS integer)
       FOR UPDATE SKIP LOCKED
), granted AS (
    UPDATE workflow_steps s
       SET status = 'pending', wake_at = NULL, dispatched_at = now(), limit_wait = NULL,
           limit_granted = :limit_key || '@' || CAST(:window_index AS text)
      FROM picked p
     WHERE s.id = p.id AND s.status = 'waiting_for_retry' AND s.limit_wait = :limit_key
    RETURNING s.id, s.limit_turn
), counted AS (
    UPDATE throttle_windows w SET used = w.used + (SELECT count(*) FROM granted)
     WHERE w.scope = :scope AND w.subject = :subject
       AND w.window_seconds = CAST(:window_seconds AS integer)
       AND w.window_start = CAST(:window_start AS timestamptz)
)
SELECT CAST(id AS text) AS id, limit_turn FROM granted

-- name: limit_queue_served
-- After a grant: the turn served up to, and when the line is due again — the next window
-- while any step still waits in it or is bound to it (refused, not parked yet), else never.
UPDATE limit_queues q
   SET served_turn = greatest(q.served_turn, coalesce(CAST(:turn AS bigint), 0)),
       due_at = CASE WHEN EXISTS (SELECT 1 FROM workflow_steps s
                                   WHERE s.limit_wait = q.limit_key
                                     AND s.status = 'waiting_for_retry')
                       OR EXISTS (SELECT 1 FROM workflow_steps s
                                   WHERE s.limit_wait = q.limit_key
                                     AND s.status IN ('pending', 'running'))
                     THEN CAST(:next_due AS timestamptz) END
 WHERE q.limit_key = :limit_key
