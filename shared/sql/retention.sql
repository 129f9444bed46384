-- Retention (shared/sweep/retention.py): what the sweep deletes once nothing needs it, a bounded
-- batch per statement, each batch found through a partial index (migrations/0300_retention.sql).
-- Deleting is not a state move: no row is moved, it leaves; the statements below say which
-- promise each condition keeps.

-- name: retention_lineages_lock
-- Up to :batch runs of :namespace whose whole lineage (the run, the run it replays, its
-- replays) finished more than :days ago, and nothing still needs: no open budget reservation
-- (the reconcile settles it from the step) and no unexpired echo marker on any step. Whole
-- lineages only: a replay names its original (replay_of), and a lineage with a replay still
-- running or pending keeps every run of it, so the replay's copied steps and provider keys
-- ('onceflow:<lineage_root>:<step>') keep their history. The rule has one home, the SQL
-- function retention_lineage_needed (migrations/0350_retention_lineage_needed_function.sql).
-- The scan walks workflow_runs_finished oldest first and skips the blocked lineages (few: the
-- next pass sees them again).
-- Locks the lineages' roots, skipping any an ops replay holds (ops_replay locks the root
-- first): the delete below runs in the same transaction after this lock, in a fresh snapshot,
-- and checks again, so a replay committed meanwhile is seen and its lineage kept.
SELECT root.id
FROM workflow_runs root
WHERE root.id IN (
    SELECT c.lineage_root
    FROM workflow_runs c
    WHERE c.namespace = CAST(:namespace AS text)
      AND c.finished_at IS NOT NULL
      AND c.finished_at < now() - make_interval(days => CAST(:days AS integer))
      AND NOT retention_lineage_needed(c.lineage_root, CAST(:days AS integer))
    ORDER BY c.finished_at
    LIMIT CAST(:batch AS integer))
ORDER BY root.id
FOR UPDATE SKIP LOCKED

-- name: retention_lineages_delete
-- The locked lineages, checked again (see retention_lineages_lock), deleted with everything
-- that belongs only to their runs: steps (their lease history goes by ON DELETE CASCADE),
-- parks, and the expired echo markers the marker expiry has not reached yet; delivery claims
-- lose their run link and stay with their event.
-- One statement: steps and parks name each other, and foreign keys are checked at its end,
-- when both are gone. Enrollments, the credit ledger, refunds and budget reservations are not
-- deleted: they keep the run's id as history (migrations/0300_retention.sql). The events the
-- runs came from are the events pass's, once no run names them.
WITH runs AS (
    SELECT r.id
    FROM workflow_runs r
    WHERE r.lineage_root = ANY(CAST(:roots AS uuid[]))
      AND r.namespace = CAST(:namespace AS text)
      AND NOT retention_lineage_needed(r.lineage_root, CAST(:days AS integer))
), steps AS (
    SELECT s.id FROM workflow_steps s WHERE s.run_id IN (SELECT id FROM runs)
), gone_markers AS (
    DELETE FROM echo_markers m WHERE m.step_id IN (SELECT id FROM steps) RETURNING m.id
), gone_parks AS (
    DELETE FROM step_parks p WHERE p.run_id IN (SELECT id FROM runs) RETURNING p.id
), unlinked_claims AS (
    -- A claim is its event's "handled" mark, not the run's: it stays until its event goes
    -- (retention_events_delete), without the run link, so a redelivery of an event that
    -- outlived its run is answered as handled and never admitted again.
    UPDATE delivery_claims c SET run_id = NULL WHERE c.run_id IN (SELECT id FROM runs)
    RETURNING c.event_id
), gone_steps AS (
    DELETE FROM workflow_steps s WHERE s.id IN (SELECT id FROM steps) RETURNING s.id
), gone_runs AS (
    DELETE FROM workflow_runs r WHERE r.id IN (SELECT id FROM runs) RETURNING r.id
)
SELECT (SELECT count(*) FROM gone_runs) AS runs,
       (SELECT count(*) FROM gone_steps) AS steps,
       (SELECT count(*) FROM gone_parks) AS parks,
       (SELECT count(*) FROM unlinked_claims) AS claims_unlinked

-- name: retention_events_delete
-- Up to :batch events decided more than :days ago that nothing still names: no run (the runs
-- pass deletes those first), no park, no webhook-trigger key (a key inside its TTL answers a
-- duplicate POST with its event; expired keys are deleted by expire_webhook_trigger_keys), no
-- poll record (the poll's memory of the record), and no cron tick unless a newer tick of the
-- same workflow exists (the newest tick is the cron's cursor: fire_cron_ticks starts from it;
-- older ticks are never fired again and go with their event). Their delivery claims and
-- refusals go with them. Events given up as undelivered, never decided, are kept: few, and
-- each is an explanation someone may still need. SKIP LOCKED: an event a concurrent
-- statement holds is taken next pass; any reference made meanwhile fails the foreign-key
-- check at the end of the statement and rolls the batch back, never leaves a dangling row.
WITH gone AS (
    SELECT e.id
    FROM workflow_trigger_events e
    WHERE e.decided_at IS NOT NULL
      AND e.decided_at < now() - make_interval(days => CAST(:days AS integer))
      AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.event_id = e.id)
      AND NOT EXISTS (SELECT 1 FROM step_parks p WHERE p.early_event_id = e.id)
      AND NOT EXISTS (SELECT 1 FROM step_parks p WHERE p.resumed_event_id = e.id)
      AND NOT EXISTS (SELECT 1 FROM webhook_trigger_keys k WHERE k.event_id = e.id)
      AND NOT EXISTS (SELECT 1 FROM poll_records pr WHERE pr.event_id = e.id)
      -- an event held in a debounce burst not fired yet: the fire reads it (and decides it)
      AND NOT EXISTS (SELECT 1 FROM debounce_burst_events m
                      JOIN debounce_bursts b ON b.id = m.burst_id
                      WHERE m.event_id = e.id AND b.status <> 'fired')
      -- an event waiting in a throttle's run-start queue: its start reads it
      AND NOT EXISTS (SELECT 1 FROM run_start_queue q
                      WHERE q.event_id = e.id AND q.status = 'queued')
      AND NOT EXISTS (SELECT 1 FROM cron_ticks t
                      WHERE t.event_id = e.id
                        AND NOT EXISTS (SELECT 1 FROM cron_ticks n
                                        WHERE n.workflow_id = t.workflow_id
                                          AND n.scheduled_at > t.scheduled_at))
    ORDER BY e.decided_at
    LIMIT CAST(:batch AS integer)
    FOR UPDATE OF e SKIP LOCKED
), gone_ticks AS (
    DELETE FROM cron_ticks t WHERE t.event_id IN (SELECT id FROM gone) RETURNING t.workflow_id
), gone_claims AS (
    DELETE FROM delivery_claims c WHERE c.event_id IN (SELECT id FROM gone) RETURNING c.event_id
), gone_refusals AS (
    DELETE FROM admission_refusals a WHERE a.event_id IN (SELECT id FROM gone) RETURNING a.id
), gone_events AS (
    DELETE FROM workflow_trigger_events e WHERE e.id IN (SELECT id FROM gone) RETURNING e.id
)
SELECT (SELECT count(*) FROM gone_events) AS events,
       (SELECT count(*) FROM gone_claims) AS claims,
       (SELECT count(*) FROM gone_refusals) AS refusals,
       (SELECT count(*) FROM gone_ticks) AS cron_ticks

-- name: retention_inbox_delete
-- Up to :batch inbox rows processed more than :days ago. The events they became keep their own
-- payload and outlive the raw delivery: their inbox_id is cleared in the same statement. A row
-- an unrouted provider event still names (the newest delivery of that event) is kept. The
-- dedup on (connection, body) forgets the row with it: a provider's retries of one delivery
-- end long before (HubSpot: up to 10 with backoff, FACTS.md), so keep the inbox retention
-- well above a day.
WITH gone AS (
    SELECT i.id
    FROM webhook_inbox i
    WHERE i.status = 'processed'
      AND i.finished_at < now() - make_interval(days => CAST(:days AS integer))
      AND NOT EXISTS (SELECT 1 FROM unrouted_provider_events u WHERE u.inbox_id = i.id)
    ORDER BY i.finished_at
    LIMIT CAST(:batch AS integer)
    FOR UPDATE SKIP LOCKED
), unlinked AS (
    UPDATE workflow_trigger_events e SET inbox_id = NULL
    WHERE e.inbox_id IN (SELECT id FROM gone)
    RETURNING e.id
), gone_rows AS (
    DELETE FROM webhook_inbox i WHERE i.id IN (SELECT id FROM gone) RETURNING i.id
)
SELECT (SELECT count(*) FROM gone_rows) AS inbox, (SELECT count(*) FROM unlinked) AS unlinked

-- name: retention_bursts_delete
-- Up to :batch debounce bursts fired more than :days ago whose run is gone (deleted with its
-- lineage, or never started: the last event was refused), with their membership rows (ON
-- DELETE CASCADE). A fired burst is final: nothing writes it again, so the delete races
-- nothing but another retention pass (SKIP LOCKED). Open and closed bursts are never taken.
WITH gone AS (
    SELECT b.id FROM debounce_bursts b
    WHERE b.status = 'fired'
      AND b.fired_at < now() - make_interval(days => CAST(:days AS integer))
      AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = b.run_id)
    ORDER BY b.fired_at
    LIMIT CAST(:batch AS integer)
    FOR UPDATE OF b SKIP LOCKED
), gone_bursts AS (
    DELETE FROM debounce_bursts b WHERE b.id IN (SELECT id FROM gone) RETURNING b.id
)
SELECT count(*) AS bursts FROM gone_bursts

-- name: retention_run_starts_delete
-- Up to :batch run-start queue entries started more than :days ago (the run they started
-- carries everything; the entry was the wait). Queued entries are never taken. Nothing writes
-- a started entry again but its own start's transaction, long committed (SKIP LOCKED anyway).
WITH gone AS (
    SELECT q.id FROM run_start_queue q
    WHERE q.status = 'started'
      AND q.started_at < now() - make_interval(days => CAST(:days AS integer))
    ORDER BY q.started_at
    LIMIT CAST(:batch AS integer)
    FOR UPDATE OF q SKIP LOCKED
), gone_starts AS (
    DELETE FROM run_start_queue q WHERE q.id IN (SELECT id FROM gone) RETURNING q.id
)
SELECT count(*) AS run_starts FROM gone_starts
