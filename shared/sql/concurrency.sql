-- Keyed concurrency (shared/admission/concurrency.py): at most `limit` running runs per
-- (workflow, key); the others wait in `run_start_queue` (gate 'concurrency'), in order. A slot
-- is a `concurrency_slots` row; every writer of a key's slots and waiting entries holds the
-- key's advisory lock (`concurrency_lock`, and the same lock in the SQL function
-- onceflow_concurrency_pass_slot, migrations/0551_keyed_concurrency.sql), so a slot count
-- and a queue head are read and changed by one racer at a time.

-- name: concurrency_lock
-- The (workflow, key) lock, for this transaction: admission takes it after its record locks,
-- the starter after the entry's record lock, and a run's end inside the statement that ends
-- it (the trigger), which holds no record lock: one order, no deadlock.
SELECT pg_advisory_xact_lock(hashtextextended(
           'concurrency|' || :workflow_id || '|' || :concurrency_key, 0)) IS NOT NULL AS locked

-- name: concurrency_state
-- Under the lock: the slots taken and the entries waiting for one (not granted), each by its
-- index (concurrency_slots_key, run_start_queue_next_waiting).
SELECT (SELECT count(*) FROM concurrency_slots s
         WHERE s.workflow_id = CAST(:workflow_id AS uuid)
           AND s.concurrency_key = :concurrency_key) AS taken,
       (SELECT count(*) FROM run_start_queue q
         WHERE q.workflow_id = CAST(:workflow_id AS uuid) AND q.throttle_key = :concurrency_key
           AND q.status = 'queued' AND q.gate = 'concurrency'
           AND q.granted_at IS NULL) AS waiting

-- name: concurrency_take
-- Under the lock, nothing waiting and a slot free: the run about to be admitted holds it (by
-- the id admission chose for it). The primary key makes a second take of one run a conflict.
INSERT INTO concurrency_slots (run_id, workflow_id, concurrency_key)
VALUES (CAST(:run_id AS uuid), CAST(:workflow_id AS uuid), :concurrency_key)

-- name: concurrency_release_unstarted
-- After admission's decision statement, in its transaction: a slot taken for a run the
-- decision did not create (the pairing was refused duplicate/already_running) is given back.
-- Nobody waited when it was taken and the lock is still held, so there is no one to hand it to.
DELETE FROM concurrency_slots s
WHERE s.run_id = ANY(CAST(:run_ids AS uuid[]))
  AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = s.run_id)

-- name: concurrency_enqueue
-- The pairing waits behind the key's others (its id orders it) until a run's end hands it a
-- slot. `due_at` is 'infinity' until then: the sweep's due index holds granted entries only.
-- ON CONFLICT DO NOTHING: a redelivery of a waiting pairing finds it (returned either way).
WITH ins AS (
    INSERT INTO run_start_queue (tenant_id, workflow_id, throttle_key, event_id, run_id,
                                 version_id, dedup_mode, record_key, trigger_record,
                                 entry_node, entry_type, limit_per_window, window_seconds,
                                 due_at, gate, priority)
    VALUES (:tenant_id, CAST(:workflow_id AS uuid), :concurrency_key, :event_id,
            CAST(:run_id AS uuid), CAST(:version_id AS uuid), :dedup_mode, :record_key,
            CAST(:trigger_record AS jsonb), :entry_node, :entry_type,
            CAST(:limit AS integer), NULL, 'infinity', 'concurrency',
            CAST(:priority AS smallint))
    ON CONFLICT (event_id, workflow_id) DO NOTHING
    RETURNING id, true AS queued_now
)
SELECT id, queued_now FROM ins
UNION ALL
SELECT q.id, false FROM run_start_queue q
WHERE q.event_id = :event_id AND q.workflow_id = CAST(:workflow_id AS uuid)
  AND NOT EXISTS (SELECT 1 FROM ins)

-- name: concurrency_granted
-- The entries a run's end handed a slot to and whose run has not started yet, oldest grant
-- first (by run_start_queue_due: granted entries are due at their grant). Read-only: each is
-- started by its own guarded `concurrency_start`.
SELECT q.id, CAST(q.workflow_id AS text) AS workflow_id, q.throttle_key, q.record_key,
       q.dedup_mode
FROM run_start_queue q
WHERE q.status = 'queued' AND q.due_at <= now() AND q.gate = 'concurrency'
  AND q.granted_at IS NOT NULL
ORDER BY q.due_at, q.id
LIMIT CAST(:batch AS integer)

-- name: concurrency_start
-- queued → started for an entry holding a granted slot. Guarded on `status = 'queued' AND
-- granted_at IS NOT NULL`: a second starter (the step function and the sweep racing) finds
-- zero rows and starts nothing; nor is an entry still waiting for a slot ever started.
UPDATE run_start_queue SET status = 'started', started_at = now()
WHERE id = :id AND status = 'queued' AND gate = 'concurrency' AND granted_at IS NOT NULL
RETURNING id, event_id, CAST(workflow_id AS text) AS workflow_id,
          CAST(run_id AS text) AS run_id, CAST(version_id AS text) AS version_id, dedup_mode,
          record_key, trigger_record, entry_node, entry_type, priority,
          (SELECT wb.state FROM workflow_breakers wb
            WHERE wb.workflow_id = run_start_queue.workflow_id) AS breaker_state,
          (SELECT wb.opened_at FROM workflow_breakers wb
            WHERE wb.workflow_id = run_start_queue.workflow_id) AS breaker_opened_at,
          (SELECT wb.reason FROM workflow_breakers wb
            WHERE wb.workflow_id = run_start_queue.workflow_id) AS breaker_reason

-- name: concurrency_grant_next
-- Under the lock, people waiting and a slot free (the limit was raised by a newer version
-- since they queued): the oldest waiting entry gets it now, as a run's end would have given
-- it (the migration's function). The entry granted, or NULL.
SELECT onceflow_concurrency_grant_next(CAST(:workflow_id AS uuid), :concurrency_key,
                                       CAST(:limit AS integer)) AS granted

-- name: concurrency_pass_slot
-- An entry that started no run (its pairing was refused) holds a slot no run will free: pass
-- it to the next waiting entry now (the migration's function, under the key's lock). The
-- entry granted next, or NULL.
SELECT onceflow_concurrency_pass_slot(CAST(:run_id AS uuid)) AS granted

-- name: concurrency_next_waiting
-- The key's next waiting run (EXPLAIN-checked: run_start_queue_next_waiting).
SELECT q.id FROM run_start_queue q
WHERE q.workflow_id = CAST(:workflow_id AS uuid) AND q.throttle_key = :concurrency_key
  AND q.status = 'queued' AND q.gate = 'concurrency' AND q.granted_at IS NULL
ORDER BY q.id
LIMIT 1
