-- Polling triggers: sources of active workflows, their claims, and per-row poll state.

-- name: poll_sources_active
SELECT w.id::text AS workflow_id, w.tenant_id, w.name, v.definition -> 'trigger' AS trigger
  FROM workflow_activations a
  JOIN workflows w ON w.id = a.workflow_id
  JOIN workflow_versions v ON v.id = a.version_id
 WHERE jsonb_typeof(v.definition -> 'trigger' -> 'poll') = 'object'
 ORDER BY w.id

-- name: poll_source_claim
-- A row back: this sweep polls the source now; none: it was polled less than
-- `every_seconds` ago (or is being polled).
INSERT INTO poll_sources (workflow_id, last_polled_at)
VALUES (CAST(:workflow_id AS uuid), now())
ON CONFLICT (workflow_id) DO UPDATE SET last_polled_at = now()
WHERE poll_sources.last_polled_at
      < now() - make_interval(secs => CAST(:every_seconds AS double precision))
RETURNING workflow_id

-- name: poll_source_record
UPDATE poll_sources
   SET last_finished_at = now(), last_result = CAST(:result AS jsonb),
       last_error = CAST(:error AS text)
 WHERE workflow_id = CAST(:workflow_id AS uuid)

-- name: poll_records_state
-- The poll state of a set of records (a CRM search's page), with what became of each one's
-- latest occurrence (poll_record_state, migrations/0230). A SQL source reads it in its page
-- query instead, under the page's own snapshot (shared/triggers/sql_source.py).
SELECT k.record_key, s.generation, s.attempts, s.status, s.outcome
  FROM unnest(CAST(:keys AS text[])) AS k (record_key)
  JOIN LATERAL poll_record_state(CAST(:workflow_id AS uuid), k.record_key) AS s ON true

-- name: poll_records_claim
-- Claim the next occurrence of each row: (generation, attempt) only ever moves forward, so
-- of two pollers that read the same state one gets the row back and emits; the other (its
-- upsert waited for the first, then found the pair no longer ahead) gets nothing.
--
-- A new generation (the application cleared the stamp) ends the previous one's enrollment
-- (once_per_record): the record is "handled once" per generation, and without this the
-- generation's event would be refused `duplicate`. The poll claims a new generation only once
-- the previous occurrence was decided (shared/triggers/poll.py `decide`), so the enrollment to
-- end is already there: the run of the previous event's delivery claim, read in `previous`
-- (a claimer that raced this one moved the pair first, and this statement claims nothing).
WITH previous AS (
    SELECT p.record_key, r.id AS run_id, r.record_key AS run_record_key
      FROM poll_records p
      JOIN delivery_claims dc ON dc.event_id = p.event_id AND dc.workflow_id = p.workflow_id
      JOIN workflow_runs r ON r.id = dc.run_id
     WHERE p.workflow_id = CAST(:workflow_id AS uuid)
       AND p.record_key = ANY(CAST(:keys AS text[]))
), claimed AS (
    INSERT INTO poll_records AS p (workflow_id, record_key, generation, attempts, status)
    SELECT CAST(:workflow_id AS uuid), i.record_key, i.generation, i.attempts, 'open'
      FROM unnest(CAST(:keys AS text[]), CAST(:generations AS integer[]),
                  CAST(:attempts AS integer[])) AS i (record_key, generation, attempts)
    ON CONFLICT (workflow_id, record_key) DO UPDATE
       SET generation = EXCLUDED.generation, attempts = EXCLUDED.attempts, status = 'open',
           event_id = NULL, stamped_at = NULL, updated_at = now()
     WHERE (p.generation, p.attempts) < (EXCLUDED.generation, EXCLUDED.attempts)
    RETURNING p.record_key, p.generation, p.attempts
), released AS (
    DELETE FROM workflow_enrollments en
     USING claimed c JOIN previous pr ON pr.record_key = c.record_key
     WHERE c.generation > 1 AND c.attempts = 1
       AND en.workflow_id = CAST(:workflow_id AS uuid)
       AND en.record_key = pr.run_record_key AND en.run_id = pr.run_id
    RETURNING en.run_id
)
SELECT record_key, generation, attempts FROM claimed

-- name: poll_records_set_events
UPDATE poll_records p
   SET event_id = i.event_id
  FROM unnest(CAST(:keys AS text[]), CAST(:event_ids AS bigint[])) AS i (record_key, event_id)
 WHERE p.workflow_id = CAST(:workflow_id AS uuid) AND p.record_key = i.record_key

-- name: poll_records_close
-- The row was stamped (done, given up on, or its run cancelled by a person): this generation
-- is over. Zero rows for a key: another pass closed it first.
UPDATE poll_records
   SET status = CAST(:status AS text), stamped_at = now(), updated_at = now()
 WHERE workflow_id = CAST(:workflow_id AS uuid) AND record_key = ANY(CAST(:keys AS text[]))
   AND status = 'open'

-- name: poll_source_status
-- What ops shows for a poll: the last pass, and where its rows stand.
SELECT s.last_polled_at, s.last_finished_at, s.last_result, s.last_error,
       (SELECT count(*) FROM poll_records p
         WHERE p.workflow_id = CAST(:workflow_id AS uuid) AND p.status = 'open') AS open,
       (SELECT count(*) FROM poll_records p
         WHERE p.workflow_id = CAST(:workflow_id AS uuid) AND p.status = 'stamped') AS stamped,
       (SELECT count(*) FROM poll_records p
         WHERE p.workflow_id = CAST(:workflow_id AS uuid) AND p.status = 'gave_up') AS gave_up,
       (SELECT count(*) FROM poll_records p
         WHERE p.workflow_id = CAST(:workflow_id AS uuid) AND p.status = 'cancelled')
           AS cancelled
  FROM (SELECT 1) AS one
  LEFT JOIN poll_sources s ON s.workflow_id = CAST(:workflow_id AS uuid)
