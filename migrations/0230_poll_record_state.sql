-- Polling triggers (shared/triggers/poll.py): the one definition of "where a polled row
-- stands", and a row a person cancelled the run of.
--
-- poll_record_state(workflow, key): the row's poll state with what became of its latest
-- occurrence. A single-SELECT STABLE SQL function, so Postgres inlines it into the calling
-- statement: the SQL source's page query joins it LATERAL to the page of pending rows, and
-- the application's rows and their poll state are read under ONE snapshot. (Read in two
-- statements, a pass overlapping another could see a row still unstamped in the first and,
-- in the second, the generation the other pass had just closed by stamping it: "stamp
-- cleared by the application", a second generation nobody opened.)
--
-- outcome:
--   unadmitted   the event is not decided yet (still in the outbox, or admission retrying)
--   undelivered  the event was given up as undelivered (admission never decided it): the
--                occurrence is over without a run, as a refused one is
--   refused      admission refused it (no run)
--   running      its run has not finished
--   succeeded, failed
--   cancelled    a person cancelled its run: the poll never starts the row again by itself
CREATE FUNCTION poll_record_state(p_workflow_id uuid, p_record_key text)
RETURNS TABLE (generation integer, attempts integer, status text, outcome text)
LANGUAGE sql STABLE AS $$
    SELECT p.generation, p.attempts, p.status,
           CASE WHEN dc.event_id IS NULL AND e.undelivered_at IS NOT NULL THEN 'undelivered'
                WHEN dc.event_id IS NULL THEN 'unadmitted'
                WHEN dc.run_id IS NULL THEN 'refused'
                WHEN r.status IN ('succeeded', 'failed', 'cancelled') THEN r.status
                ELSE 'running' END
      FROM poll_records p
      LEFT JOIN workflow_trigger_events e ON e.id = p.event_id
      LEFT JOIN delivery_claims dc ON dc.event_id = p.event_id
                                  AND dc.workflow_id = p.workflow_id
      LEFT JOIN workflow_runs r ON r.id = dc.run_id
     WHERE p.workflow_id = p_workflow_id AND p.record_key = p_record_key
$$;

-- A row whose run a person cancelled is stamped and its generation closed as `cancelled`
-- (on_success and after_attempts would otherwise start it again on the next pass).
ALTER TABLE poll_records DROP CONSTRAINT poll_records_status_check;
ALTER TABLE poll_records ADD CONSTRAINT poll_records_status_check
    CHECK (status IN ('open', 'stamped', 'gave_up', 'cancelled'));
