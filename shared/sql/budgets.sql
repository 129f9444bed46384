-- Spend budgets (shared/gates/budgets.py): reservations written before the side effect, checked
-- under a per-budget lock, settled by outcome, reconciled when the outcome never came.

-- name: budget_lock
-- The per-budget lock: every reservation of one budget is decided one at a time, so the sum
-- read below cannot be stale when the row is written. Released at commit.
SELECT pg_advisory_xact_lock(hashtextextended('budget:' || :budget_key, 0)) IS NOT NULL AS locked

-- name: budget_reserve
-- The reservation in one statement (one round trip, issue 27), run after `budget_lock` — in a
-- statement of its own, since a statement's snapshot is taken when it starts: this one's must
-- come after the lock was granted, so that the sum sees every reservation decided before it.
-- The window's live reservations + settled spend, this application's own reservation if it has
-- one — one per application: the lineage's key and the step row (a replay's new step row finds
-- none and reserves against the cap; the attempts of one step find theirs) — and, when it has
-- none and the amount fits under the cap, its new reservation (`inserted`). A released one is
-- reserved again by the caller (`budget_reserve_again`).
WITH state AS (
    SELECT (SELECT coalesce(sum(amount), 0)
              FROM budget_reservations
             WHERE budget_key = :budget_key AND status <> 'released'
               AND reserved_at > now() - make_interval(secs => CAST(:window_seconds AS integer)))
               AS used,
           (SELECT status FROM budget_reservations
             WHERE idempotency_key = :idempotency_key
               AND step_id IS NOT DISTINCT FROM CAST(:step_id AS uuid) LIMIT 1) AS existing
), reserved AS (
    INSERT INTO budget_reservations
           (budget_key, idempotency_key, tenant_id, run_id, step_id, amount, status, landed_query)
    SELECT :budget_key, :idempotency_key, :tenant_id, CAST(:run_id AS uuid),
           CAST(:step_id AS uuid), CAST(:amount AS bigint), 'reserved',
           CAST(:landed_query AS jsonb)
      FROM state
     WHERE existing IS NULL AND used + CAST(:amount AS bigint) <= CAST(:cap AS bigint)
    RETURNING id
)
SELECT used, existing, EXISTS (SELECT 1 FROM reserved) AS inserted FROM state

-- name: budget_reserve_again
-- A released reservation (its attempt provably never applied) reserved again by the retry.
UPDATE budget_reservations
   SET status = 'reserved', amount = :amount, reserved_at = now(), settled_at = NULL,
       settled_by = NULL, landed_query = CAST(:landed_query AS jsonb)
 WHERE idempotency_key = :idempotency_key AND step_id IS NOT DISTINCT FROM CAST(:step_id AS uuid)
   AND status = 'released'

-- name: budget_settle_spent
-- Spent, at `amount` when given (a token price settled at what the call used): LEAST, so a
-- reservation never grows past what was checked against the cap. Guarded on status: of two
-- settles of the same attempt one moves it, the other finds it spent and changes nothing.
UPDATE budget_reservations SET status = 'spent', settled_at = now(), settled_by = 'outcome',
       amount = LEAST(amount, coalesce(CAST(:amount AS bigint), amount))
 WHERE idempotency_key = :idempotency_key AND step_id IS NOT DISTINCT FROM CAST(:step_id AS uuid)
   AND status = 'reserved'

-- name: budget_settle_released
-- Only a reservation none of whose attempts had an unknown outcome is released.
UPDATE budget_reservations SET status = 'released', settled_at = now(), settled_by = 'outcome'
 WHERE idempotency_key = :idempotency_key AND step_id IS NOT DISTINCT FROM CAST(:step_id AS uuid)
   AND status = 'reserved'
   AND outcome_unknown_at IS NULL

-- name: budget_mark_outcome_unknown
UPDATE budget_reservations SET outcome_unknown_at = coalesce(outcome_unknown_at, now())
 WHERE idempotency_key = :idempotency_key AND step_id IS NOT DISTINCT FROM CAST(:step_id AS uuid)
   AND status = 'reserved'

-- name: budget_reconcile
-- Reservations still open whose step has ended (or whose run ended without it): the outcome
-- will never be reported. A succeeded step spent it; a failed, skipped or abandoned one may
-- have sent its request (a crash between reserve and settle, a timeout), so it counts as spent
-- too: the cap holds for whatever may have left — unless the provider can be asked
-- (`landed_query`): those are left to budget_reconcile_askable. Guarded on status, so two
-- sweeps settle each row once. Steps still pending, running or parked keep theirs (their next
-- attempt reuses it).
UPDATE budget_reservations b
   SET status = 'spent', settled_at = now(), settled_by = 'reconcile'
  FROM workflow_steps s
  JOIN workflow_runs r ON r.id = s.run_id
 WHERE b.id IN (SELECT id FROM budget_reservations
                 WHERE status = 'reserved'
                   AND reserved_at < now() - make_interval(secs => CAST(:older_than_seconds AS integer))
                 ORDER BY reserved_at LIMIT :batch)
   AND s.id = b.step_id
   AND b.status = 'reserved'
   AND (s.status IN ('succeeded', 'failed', 'skipped') OR r.status <> 'running')
   AND (b.landed_query IS NULL OR s.status = 'succeeded')
RETURNING b.idempotency_key, s.status AS step_status

-- name: budget_reconcile_askable
-- Open reservations of ended steps (as budget_reconcile) whose fate the provider can tell:
-- the reconcile duty asks it, then settles each with budget_reconcile_settle.
SELECT b.id, b.landed_query
  FROM budget_reservations b
  JOIN workflow_steps s ON s.id = b.step_id
  JOIN workflow_runs r ON r.id = s.run_id
 WHERE b.status = 'reserved' AND b.landed_query IS NOT NULL
   AND b.reserved_at < now() - make_interval(secs => CAST(:older_than_seconds AS integer))
   AND (s.status IN ('failed', 'skipped') OR r.status <> 'running')
 ORDER BY b.reserved_at
 LIMIT :batch

-- name: budget_reconcile_settle
-- What the provider answered: landed ⇒ spent, never landed ⇒ released. Guarded on status, so
-- of two sweeps asking at once exactly one settles the row; zero rows: settled already.
UPDATE budget_reservations
   SET status = CAST(:status AS text), settled_at = now(), settled_by = 'reconcile'
 WHERE id = :id AND status = 'reserved'
RETURNING id

-- name: budget_summary
SELECT coalesce(sum(amount) FILTER (WHERE status = 'reserved'), 0) AS reserved,
       coalesce(sum(amount) FILTER (WHERE status = 'spent'), 0) AS spent,
       coalesce(sum(amount) FILTER (WHERE status = 'released'), 0) AS released
  FROM budget_reservations
 WHERE budget_key = :budget_key
   AND reserved_at > now() - make_interval(secs => CAST(:window_seconds AS integer))

-- name: budget_active_definition
SELECT v.definition
  FROM workflow_activations a JOIN workflow_versions v ON v.id = a.version_id
 WHERE a.workflow_id = CAST(:workflow_id AS uuid)
