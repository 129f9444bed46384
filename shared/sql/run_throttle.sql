-- A throttle on starting runs (shared/admission/run_throttle.py): events over a trigger's
-- `throttle` wait in `run_start_queue`, in order, until a window has room. Every writer holds
-- the (workflow, key) advisory lock (run_throttle_lock) while it decides, so the queue's head
-- and the window's count are read and changed by one racer at a time; each state change is
-- still a guarded UPDATE, so a racer that skipped the lock changes nothing twice.

-- name: run_throttle_lock
-- The (workflow, key) queue lock, for this transaction. Admission takes it after its record
-- locks, and the sweep after the head's record lock: one order, no deadlock.
SELECT pg_advisory_xact_lock(hashtextextended('run_start|' || :workflow_id || '|' || :throttle_key, 0))
    IS NOT NULL AS locked

-- name: run_throttle_queued
-- How many wait in the (workflow, key)'s queue (by its head index): admission's fast path
-- starts a run only when none does, so a new event never overtakes a waiting one.
SELECT count(*) AS waiting FROM run_start_queue
WHERE workflow_id = CAST(:workflow_id AS uuid) AND throttle_key = :throttle_key
  AND status = 'queued' AND gate = 'throttle'

-- name: run_throttle_enqueue
-- The pairing waits, after every event already queued for its key, until `due_at` (the end
-- of the current window; behind others, the queue's own due time, so a queue is due as one). ON CONFLICT DO NOTHING: a redelivery of a queued pairing (the
-- unique (event_id, workflow_id)) changes nothing; it returns the row either way.
WITH ins AS (
    INSERT INTO run_start_queue (tenant_id, workflow_id, throttle_key, event_id, run_id,
                                 version_id, dedup_mode, record_key, trigger_record,
                                 entry_node, entry_type, limit_per_window, window_seconds,
                                 due_at, priority)
    VALUES (:tenant_id, CAST(:workflow_id AS uuid), :throttle_key, :event_id,
            CAST(:run_id AS uuid), CAST(:version_id AS uuid), :dedup_mode, :record_key,
            CAST(:trigger_record AS jsonb), :entry_node, :entry_type,
            CAST(:limit_per_window AS integer), CAST(:window_seconds AS integer),
            -- behind others: due when the queue is (the sweep starts heads only)
            coalesce(CAST(:due_at AS timestamptz),
                     (SELECT max(w.due_at) FROM run_start_queue w
                       WHERE w.workflow_id = CAST(:workflow_id AS uuid)
                         AND w.throttle_key = :throttle_key AND w.status = 'queued'
                         AND w.gate = 'throttle'),
                     now()),
            CAST(:priority AS smallint))
    ON CONFLICT (event_id, workflow_id) DO NOTHING
    RETURNING id, due_at, true AS queued_now
)
SELECT id, due_at, queued_now FROM ins
UNION ALL
SELECT q.id, q.due_at, false FROM run_start_queue q
WHERE q.event_id = :event_id AND q.workflow_id = CAST(:workflow_id AS uuid)
  AND NOT EXISTS (SELECT 1 FROM ins)

-- name: run_throttle_due_heads
-- The sweep's batch: the head of every (workflow, key) queue that is due (by the due index),
-- oldest first. Read-only: each is started under its lock by run_throttle_start.
-- An entry is a head when no earlier one of its queue waits (run_start_queue_head).
SELECT q.id, CAST(q.workflow_id AS text) AS workflow_id, q.throttle_key, q.record_key,
       q.dedup_mode
FROM run_start_queue q
WHERE q.status = 'queued' AND q.due_at <= now() AND q.gate = 'throttle'
  AND NOT EXISTS (SELECT 1 FROM run_start_queue e
                  WHERE e.workflow_id = q.workflow_id AND e.throttle_key = q.throttle_key
                    AND e.status = 'queued' AND e.gate = 'throttle' AND e.id < q.id)
ORDER BY q.due_at, q.id
LIMIT CAST(:batch AS integer)

-- name: run_throttle_head
-- Under the queue lock: the (workflow, key)'s head now.
SELECT q.id, q.record_key, q.dedup_mode, q.limit_per_window, q.window_seconds
FROM run_start_queue q
WHERE q.workflow_id = CAST(:workflow_id AS uuid) AND q.throttle_key = :throttle_key
  AND q.status = 'queued' AND q.gate = 'throttle'
ORDER BY q.id
LIMIT 1

-- name: run_throttle_start
-- queued → started for the head the caller holds the lock of and claimed a window slot for.
-- Guarded on `status = 'queued'`: another sweep instance that started it first (it held the
-- lock before us) leaves zero rows here, and nothing is started twice.
UPDATE run_start_queue SET status = 'started', started_at = now()
WHERE id = :id AND status = 'queued'
RETURNING id, event_id, CAST(workflow_id AS text) AS workflow_id,
          CAST(run_id AS text) AS run_id, CAST(version_id AS text) AS version_id, dedup_mode,
          record_key, trigger_record, entry_node, entry_type, priority,
          -- The workflow's circuit breaker now: a start due while it is paused is refused
          -- workflow_paused (a wait is no way around the breaker).
          (SELECT wb.state FROM workflow_breakers wb
            WHERE wb.workflow_id = run_start_queue.workflow_id) AS breaker_state,
          (SELECT wb.opened_at FROM workflow_breakers wb
            WHERE wb.workflow_id = run_start_queue.workflow_id) AS breaker_opened_at,
          (SELECT wb.reason FROM workflow_breakers wb
            WHERE wb.workflow_id = run_start_queue.workflow_id) AS breaker_reason

-- name: run_throttle_outcome
-- What admission's decision made of a started entry (admitted, or the last refusal reason).
-- Guarded on `outcome IS NULL`: written once, by the start's transaction.
UPDATE run_start_queue SET outcome = :outcome
WHERE id = :id AND status = 'started' AND outcome IS NULL

-- name: run_throttle_defer
-- The window is full: every queued entry of the (workflow, key) waits for the next one. Under
-- the queue lock; zero rows: nothing queued any more.
UPDATE run_start_queue SET due_at = CAST(:due_at AS timestamptz)
WHERE workflow_id = CAST(:workflow_id AS uuid) AND throttle_key = :throttle_key
  AND status = 'queued' AND gate = 'throttle' AND due_at < CAST(:due_at AS timestamptz)

-- name: run_throttle_waiting_for_events
-- Ops' "why didn't it run?": the pairings of these events waiting in a run-start queue.
-- Read-only; by the unique (event_id, workflow_id).
SELECT q.event_id, CAST(q.workflow_id AS text) AS workflow_id, q.id AS queue_id, q.due_at,
       q.limit_per_window, q.window_seconds,
       (SELECT count(*) FROM run_start_queue e
         WHERE e.workflow_id = q.workflow_id AND e.throttle_key = q.throttle_key
           AND e.status = 'queued' AND e.gate = q.gate AND e.id < q.id) AS ahead, q.gate
FROM run_start_queue q
WHERE q.event_id = ANY(CAST(:event_ids AS bigint[])) AND q.tenant_id = :tenant_id
  AND q.status = 'queued'
