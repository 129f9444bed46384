-- Debounce per record (shared/admission/debounce.py): bursts of events for one (workflow, key)
-- held in one `debounce_bursts` row until the sweep fires them into one run.
--
-- Who moves a burst: admission's `debounce_close_overdue` (open → closed) and
-- `debounce_join` (open → open, later `fire_at`; or a new open row); the sweep's
-- `debounce_fire` (open/closed → fired). `fire_at <= now` decides between them, and every one
-- of them is a guarded UPDATE on the burst row, so the row lock orders any two racers and the
-- loser's re-checked WHERE says what the winner did.

-- name: debounce_close_overdue
-- An open burst whose fire time has passed but the sweep has not fired yet takes no more
-- events: the event at hand is more than `period` after the burst's last one (or past its
-- max_wait), so it opens the next burst. now() is the admission transaction's start, the same
-- instant `debounce_join` then compares with, so the two statements can't disagree about
-- which side of fire_at the event is on. Zero rows: nothing overdue (the common case), or the
-- sweep fired it first (its UPDATE holds the row; ours re-checks `status = 'open'` and skips).
UPDATE debounce_bursts SET status = 'closed'
WHERE workflow_id = CAST(:workflow_id AS uuid) AND burst_key = :burst_key
  AND status = 'open' AND fire_at <= now()
RETURNING CAST(id AS text) AS id

-- name: debounce_join
-- One event joins its (workflow, key)'s open burst, or opens one: exactly one of `joined` and
-- `opened` writes, and the pairing's membership row is written with it.
-- `held`: the pairing is already in a burst (a redelivery, or a concurrent delivery that
--   committed first): nothing is written, and the caller reports it handled.
-- `joined`: guarded on `status = 'open' AND fire_at > now()`. Against the sweep's fire (same
--   row, same guard inverted) exactly one wins on the row lock: if the fire committed first,
--   our re-checked WHERE finds `fired` and we open a new burst; if we committed first, the
--   fire re-checks `fire_at <= now` on our later fire_at and fires nothing. So the event
--   either joins before the fire or opens the next burst, never lost, never in a fired one.
--   fire_at moves to `period` after this event, never past max_fire_at (first + max_wait).
--   The newest event's decision (version, record, entry step) replaces the burst's: the fire
--   starts the run of the last event.
-- `opened`: only when no open burst took it. Two admissions opening at once collide on the
--   partial unique index debounce_bursts_one_open; the loser's statement fails with a unique
--   violation (a ConflictError), rolls back and decides again, then joins the winner's burst.
-- A membership row that collides (a concurrent delivery of the same event) also fails the
-- statement: the retry finds it `held`.
WITH held AS (
    SELECT CAST(m.burst_id AS text) AS burst_id FROM debounce_burst_events m
    WHERE m.event_id = :event_id AND m.workflow_id = CAST(:workflow_id AS uuid)
), joined AS (
    UPDATE debounce_bursts b
    SET last_event_id = :event_id, last_event_at = now(), event_count = b.event_count + 1,
        -- A batch this event fills is due now (the caller fires it in this transaction; the
        -- sweep's due index would find it if that were ever left undone).
        fire_at = CASE WHEN b.event_count + 1 >= b.max_size THEN now()
                       ELSE least(now() + make_interval(secs => b.period_seconds),
                                  b.max_fire_at) END,
        version_id = CAST(:version_id AS uuid), dedup_mode = :dedup_mode,
        record_key = :record_key, trigger_record = CAST(:trigger_record AS jsonb),
        entry_node = :entry_node, entry_type = :entry_type,
        priority = CAST(:priority AS smallint)
    WHERE b.workflow_id = CAST(:workflow_id AS uuid) AND b.burst_key = :burst_key
      AND b.status = 'open' AND b.fire_at > now()
      AND (b.max_size IS NULL OR b.event_count < b.max_size)
      AND NOT EXISTS (SELECT 1 FROM held)
    RETURNING b.id, b.run_id, b.fire_at, b.event_count, b.max_size
), opened AS (
    INSERT INTO debounce_bursts (id, tenant_id, workflow_id, burst_key, run_id, version_id,
                                 dedup_mode, record_key, trigger_record, entry_node,
                                 entry_type, period_seconds, first_event_id, last_event_id,
                                 first_event_at, last_event_at, fire_at, max_fire_at, max_size,
                                 priority)
    SELECT CAST(:burst_id AS uuid), :tenant_id, CAST(:workflow_id AS uuid), :burst_key,
           CAST(:run_id AS uuid), CAST(:version_id AS uuid), :dedup_mode, :record_key,
           CAST(:trigger_record AS jsonb), :entry_node, :entry_type,
           CAST(:period_seconds AS double precision), :event_id, :event_id, now(), now(),
           now() + make_interval(secs => least(CAST(:period_seconds AS double precision),
                                               CAST(:max_wait_seconds AS double precision))),
           now() + make_interval(secs => CAST(:max_wait_seconds AS double precision)),
           CAST(:max_size AS integer), CAST(:priority AS smallint)
    WHERE NOT EXISTS (SELECT 1 FROM joined) AND NOT EXISTS (SELECT 1 FROM held)
    RETURNING id, run_id, fire_at, event_count, max_size
), burst AS (
    SELECT * FROM joined UNION ALL SELECT * FROM opened
), member AS (
    INSERT INTO debounce_burst_events (event_id, workflow_id, burst_id)
    SELECT :event_id, CAST(:workflow_id AS uuid), burst.id FROM burst
    RETURNING burst_id
)
SELECT CAST(b.id AS text) AS burst_id, CAST(b.run_id AS text) AS run_id, b.fire_at,
       b.event_count, EXISTS (SELECT 1 FROM opened) AS opened, false AS held,
       coalesce(b.event_count >= b.max_size, false) AS full
FROM burst b
UNION ALL
SELECT h.burst_id, CAST(d.run_id AS text), d.fire_at, d.event_count, false, true, false
FROM held h JOIN debounce_bursts d ON d.id = CAST(h.burst_id AS uuid)

-- name: debounce_due
-- The sweep's batch: bursts due now, oldest fire time first, read from the due index
-- (debounce_bursts_due). Read-only: each is fired by its own guarded `debounce_fire`, and one
-- another sweep instance fired first is simply skipped there.
SELECT CAST(id AS text) AS id, CAST(workflow_id AS text) AS workflow_id, record_key,
       dedup_mode
FROM debounce_bursts
WHERE status <> 'fired' AND fire_at <= now()
ORDER BY fire_at
LIMIT CAST(:batch AS integer)

-- name: debounce_fire
-- The decision to fire one burst: open or closed → fired, guarded on its fire time and on the
-- record whose dedup lock the caller took (a join may have moved the burst on to another
-- record's event since the sweep read it). Exactly one racer wins on the row lock: another
-- sweep instance re-checks `status` and finds `fired`; an admission that joined first moved
-- fire_at past now, so this re-check finds the burst no longer due. Zero rows: fired by
-- someone else, not due any more, or its last record changed (read again next pass).
UPDATE debounce_bursts
SET status = 'fired', fired_at = now()
WHERE id = CAST(:burst_id AS uuid) AND status = ANY(ARRAY['open', 'closed'])
  AND fire_at <= now() AND record_key IS NOT DISTINCT FROM CAST(:record_key AS text)
RETURNING CAST(id AS text) AS id, tenant_id, CAST(workflow_id AS text) AS workflow_id,
          burst_key, CAST(run_id AS text) AS run_id, CAST(version_id AS text) AS version_id,
          dedup_mode, record_key, trigger_record, entry_node, entry_type, last_event_id,
          event_count, priority,
          -- The workflow's circuit breaker now: a burst that comes due while the workflow is
          -- paused starts no run (its last event is refused workflow_paused).
          (SELECT wb.state FROM workflow_breakers wb
            WHERE wb.workflow_id = debounce_bursts.workflow_id) AS breaker_state,
          (SELECT wb.opened_at FROM workflow_breakers wb
            WHERE wb.workflow_id = debounce_bursts.workflow_id) AS breaker_opened_at,
          (SELECT wb.reason FROM workflow_breakers wb
            WHERE wb.workflow_id = debounce_bursts.workflow_id) AS breaker_reason

-- name: debounce_settle_members
-- In the fire's transaction, after the last event was decided by admission's own statement:
-- every other event of the burst gets its delivery claim and is refused `superseded` (a
-- batch's: `batched`, with the run id the same way), naming
-- the run that absorbed it (or, when the last event was itself refused, why no run started);
-- and the burst keeps its events, oldest first, for the run's scope (`event.burst`).
-- Guarded on `status = 'fired' AND outcome IS NULL`: the fire that just won is the only
-- writer (the burst is fired and no join can add a member to it); zero rows for the burst
-- means it was already settled and nothing else is written. ON CONFLICT DO NOTHING on the
-- claims: a pairing decided before can't be decided twice.
WITH b AS (
    UPDATE debounce_bursts d
    SET outcome = CAST(:outcome AS text),
        events = (SELECT coalesce(jsonb_agg(jsonb_build_object(
                         'id', e.id, 'occurred_at', e.occurred_at,
                         'changed_fields', e.changed_fields,
                         -- which record each event is about (a batch's events are about many)
                         'record_object_type', e.record_object_type,
                         'record_object_id', e.record_object_id) ORDER BY e.id), '[]'::jsonb)
                    FROM debounce_burst_events m
                    JOIN workflow_trigger_events e ON e.id = m.event_id
                   WHERE m.burst_id = d.id)
    WHERE d.id = CAST(:burst_id AS uuid) AND d.status = 'fired' AND d.outcome IS NULL
    RETURNING d.id, d.tenant_id, d.workflow_id, d.version_id, d.last_event_id, d.event_count,
              d.burst_key, d.max_size
), superseded AS (
    SELECT m.event_id, m.workflow_id, b.tenant_id, b.version_id, e.record_key, b.id AS burst_id,
           b.last_event_id, b.event_count, b.burst_key,
           -- a batch's members are `batched` into its run, a burst's `superseded` by it
           CASE WHEN b.max_size IS NULL THEN 'superseded' ELSE 'batched' END AS reason
    FROM b
    JOIN debounce_burst_events m ON m.burst_id = b.id AND m.event_id <> b.last_event_id
    LEFT JOIN LATERAL (
        SELECT CASE WHEN ev.record_object_id IS NOT NULL
                    THEN coalesce(CAST(ev.connection_id AS text), 'app') || ':'
                         || ev.record_object_type || ':' || ev.record_object_id END AS record_key
        FROM workflow_trigger_events ev WHERE ev.id = m.event_id) e ON true
), claims AS (
    INSERT INTO delivery_claims (event_id, workflow_id, run_id)
    SELECT s.event_id, s.workflow_id, NULL FROM superseded s
    ON CONFLICT (event_id, workflow_id) DO NOTHING
    RETURNING event_id
), refusals AS (
    INSERT INTO admission_refusals (tenant_id, event_id, workflow_id, version_id, record_key,
                                    reason, detail)
    SELECT s.tenant_id, s.event_id, s.workflow_id, s.version_id, s.record_key, s.reason,
           CASE WHEN s.reason = 'batched'
                THEN 'batched with event ' || s.last_event_id || ', the last of batch '
                ELSE 'superseded by event ' || s.last_event_id || ', the last of burst ' END
           || CAST(s.burst_id AS text) || ' (' || s.event_count || ' events for key '
           || s.burst_key || '): '
           || CASE WHEN CAST(:outcome AS text) IN ('admitted', 'handled')
                   THEN CASE WHEN s.reason = 'batched' THEN 'batched into run '
                             ELSE 'absorbed by run ' END || CAST(:run_id AS text)
                   ELSE 'no run started, the last event was refused ' || CAST(:outcome AS text)
                        || ': ' || coalesce(CAST(:outcome_detail AS text), '') END
    FROM superseded s JOIN claims c ON c.event_id = s.event_id
    ON CONFLICT (event_id, workflow_id) DO NOTHING
    RETURNING id
)
SELECT (SELECT count(*) FROM b) AS settled, (SELECT count(*) FROM refusals) AS superseded

-- name: debounce_held_for_events
-- Ops' "why didn't it run?": the pairings of these events still held in a burst that has not
-- fired (a fired burst decided every pairing: its run or refusal explains it). Read-only; one
-- primary-key range per event.
SELECT m.event_id, CAST(m.workflow_id AS text) AS workflow_id, CAST(b.id AS text) AS burst_id,
       CAST(b.run_id AS text) AS run_id, b.fire_at, b.event_count, b.last_event_id
FROM debounce_burst_events m
JOIN debounce_bursts b ON b.id = m.burst_id
WHERE m.event_id = ANY(CAST(:event_ids AS bigint[])) AND b.tenant_id = :tenant_id
  AND b.status <> 'fired'
