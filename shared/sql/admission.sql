-- Admission: one event against every workflow bound to its type, in a fixed number of
-- statements however many bindings there are (see shared/admission/admit.py for the order).

-- name: admission_context
-- Statement 1 of the admission transaction: the event, its tenant and connection, the echo
-- markers that could explain its change, and every bound workflow (a
-- `bindings` JSON array, empty when nothing is bound; no row at all when the event doesn't
-- exist). One row, so the payload crosses the wire once however many workflows are bound.
--
-- It also takes the dedup locks, one pg_advisory_xact_lock per (workflow, record) for every
-- binding whose mode needs one and whose record is the event's own, in workflow_id order so
-- that two admissions for one record can't lock in opposite orders. The dedup state is read
-- by the NEXT statement, whose snapshot is taken after these locks are held: under READ
-- COMMITTED it sees whatever the previous holder committed. (Reading it here would use a
-- snapshot taken before the wait.) `claimed`/`start_run_id` below may be stale in the safe
-- direction only: a claim seen here is final; one not seen is checked again under the lock.
--
-- A version's definition is sent only when the caller hasn't cached it (versions are
-- immutable).
WITH ev AS (
    SELECT e.id, e.tenant_id, CAST(e.connection_id AS text) AS connection_id, e.event_type,
           e.source_event_id, e.record_object_type, e.record_object_id, e.author_id,
           e.author_source, e.changed_fields, e.occurred_at, e.payload, e.payload_truncated,
           CASE WHEN e.record_object_id IS NOT NULL
                THEN coalesce(CAST(e.connection_id AS text), 'app') || ':'
                     || e.record_object_type || ':' || e.record_object_id
           END AS record_key,
           t.credit_balance,
           t.excluded_authors || coalesce(c.excluded_authors, '{}') AS excluded_authors,
           c.status AS connection_status,
           -- Who the event's author must be to be onceflow's echo (shared/ingest/echo.py).
           c.provider AS connection_provider, c.provider_user_id AS connection_user_id,
           (SELECT coalesce(jsonb_agg(jsonb_build_array(m.field, encode(m.value_hash, 'hex'))),
                            '[]'::jsonb)
              FROM echo_markers_alive(
                       e.connection_id, e.record_object_type, e.record_object_id,
                       ARRAY(SELECT jsonb_object_keys(e.changed_fields)), e.occurred_at,
                       CAST(:echo_skew_seconds AS double precision)) m
             WHERE e.connection_id IS NOT NULL AND e.record_object_id IS NOT NULL)
               AS echo_markers,
           e.decided_at
    FROM workflow_trigger_events e
    JOIN tenants t ON t.id = e.tenant_id
    LEFT JOIN connections c ON c.id = e.connection_id
    WHERE e.id = :event_id
), claims AS MATERIALIZED (
    -- This event's claims, read once through the primary key's (event_id, …) prefix. As a
    -- per-binding EXISTS the planner may hash the whole delivery_claims table instead (it
    -- did, every event, in a generic plan made while the table was small), which grows with
    -- every event ever admitted.
    SELECT dc.workflow_id FROM delivery_claims dc WHERE dc.event_id = :event_id
), bound AS (
    SELECT b.workflow_id, b.version_id, b.dedup_mode,
           CASE WHEN b.version_id = ANY(CAST(:cached_versions AS uuid[])) THEN NULL
                ELSE v.definition END AS definition,
           coalesce(v.definition -> 'trigger' ->> 'record', 'event') = 'event' AS record_from_event,
           wb.state AS breaker_state, wb.opened_at AS breaker_opened_at,
           wb.reason AS breaker_reason
    FROM ev
    JOIN trigger_bindings b ON b.tenant_id = ev.tenant_id AND b.event_type = ev.event_type
    JOIN workflow_versions v ON v.id = b.version_id
    -- The circuit breaker (shared/gates/breaker.py): an open one refuses `workflow_paused`.
    LEFT JOIN workflow_breakers wb ON wb.workflow_id = b.workflow_id
    ORDER BY b.workflow_id
), locked AS (
    -- Materialized (it calls a volatile function), so every lock is taken exactly once, in
    -- the order `bound` produced the rows.
    SELECT bound.*,
           CASE WHEN CAST(:take_locks AS boolean) AND bound.record_from_event
                     AND bound.dedup_mode <> 'every_time' AND ev.record_key IS NOT NULL
                THEN CAST(pg_advisory_xact_lock(hashtextextended(
                         CAST(bound.workflow_id AS text) || '|' || ev.record_key, 0)) AS text)
                     IS NOT NULL
                ELSE false
           END AS locked,
           EXISTS (SELECT 1 FROM claims WHERE claims.workflow_id = bound.workflow_id) AS claimed,
           (SELECT CAST(r.id AS text) FROM workflow_runs r
             WHERE r.workflow_id = bound.workflow_id AND r.start_key = :start_key) AS start_run_id
    FROM ev, bound
)
SELECT ev.*,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'workflow_id', l.workflow_id, 'version_id', l.version_id,
                   'dedup_mode', l.dedup_mode, 'definition', l.definition,
                   'record_from_event', l.record_from_event, 'locked', l.locked,
                   'claimed', l.claimed, 'start_run_id', l.start_run_id,
                   'breaker_state', l.breaker_state, 'breaker_opened_at', l.breaker_opened_at,
                   'breaker_reason', l.breaker_reason)
                   ORDER BY l.workflow_id), '[]'::jsonb)
          FROM locked l) AS bindings,
       -- The open waits (wait_for) this event may resume, when this is its first decision:
       -- an index lookup by (tenant, type, record) on step_parks_open_event_waits, so
       -- waiting runs never make admission scan, and no extra round trip when none waits.
       -- A wait's park row is committed before its step parks (shared/steps/parks.py), and
       -- this snapshot is taken after the event was recorded: an event recorded after the
       -- park row finds the wait here. A wait past its deadline is not offered the event
       -- (its deadline resumes it; the resume's own guard is what binds).
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'id', w.id, 'condition', w.condition, 'scope', w.scope) ORDER BY w.id),
                   '[]'::jsonb)
          FROM (SELECT p.id, p.condition, p.scope
                  FROM step_parks p JOIN workflow_runs r ON r.id = p.run_id
                 WHERE ev.decided_at IS NULL
                   AND p.tenant_id = ev.tenant_id AND p.event_type = ev.event_type
                   AND p.record_key = ev.record_key
                   AND p.kind = 'event' AND p.resumed_at IS NULL
                   AND p.deadline > statement_timestamp()
                   AND r.status = 'running' AND r.namespace = 'live'
                 ORDER BY p.id
                 LIMIT CAST(:max_waits AS integer)) w) AS open_waits,
       -- Waits of several events or correlated beyond their record (shared/steps/awaits.py):
       -- the correlation expressions this event's type is awaited with in its tenant, by
       -- primary key; admission computes the event's key for each and looks the waits up by
       -- index in one more statement — none when nothing of the kind waits for this type.
       (SELECT coalesce(jsonb_agg(wc.expression ORDER BY wc.expression), '[]'::jsonb)
          FROM wait_correlations wc
         WHERE ev.decided_at IS NULL
           AND wc.tenant_id = ev.tenant_id AND wc.event_type = ev.event_type)
           AS wait_correlations,
       -- The running live runs about this event's record whose version declares `cancel_on`
       -- or a `goal` (shared/admission/stops.py), on its first decision: an index range on
       -- the running runs of the record (workflow_runs_running_record).
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'run_id', r.id, 'cancel_on', v.definition -> 'cancel_on',
                   'goal', v.definition -> 'goal') ORDER BY r.id), '[]'::jsonb)
          FROM workflow_runs r JOIN workflow_versions v ON v.id = r.version_id
         WHERE ev.decided_at IS NULL AND ev.record_key IS NOT NULL
           AND r.tenant_id = ev.tenant_id AND r.record_key = ev.record_key
           AND r.status = 'running' AND r.namespace = 'live'
           AND (jsonb_typeof(v.definition -> 'cancel_on') = 'array'
                OR jsonb_typeof(v.definition -> 'goal') = 'string'))
           AS stoppable_runs
FROM ev

-- name: admission_lock_records
-- The dedup locks for bindings whose record comes from a rule-like expression rather than the
-- event (so statement 1 could not compute the key), in key order.
SELECT count(pg_advisory_xact_lock(hashtextextended(k.key, 0))) AS locked
FROM (SELECT key FROM unnest(CAST(:lock_keys AS text[])) AS key ORDER BY key) AS k

-- name: admission_admit
-- Statement 2: the decision for every binding at once, under the locks statement 1 took, and
-- every refusal written with its reason and detail (the transaction's last statement: it
-- commits in the same round trip, shared/admission/admit.py).
-- Per binding, in this order of precedence:
--   handled          the pairing already has a delivery claim or a run with this start key
--                    (a redelivery): nothing is written; the caller resumes dispatch of the run
--   <refusal>        a reason decided before the transaction (rule, credits, echo, …)
--   duplicate        once_per_record and the record is already enrolled
--   already_running  not_while_running and a live run for the record is still running
--   admitted         run row (pinned version, payload copied from the event row, the record the
--                    rule saw, lineage root = its own id), enrollment (once_per_record), first
--                    step row
-- :records holds, per binding, the record its trigger named by expression, or NULL for the
-- event's own record, which is sent once as :event_record (shared/workflows/scope.py builds
-- both), so the statement doesn't carry K copies of the same record.
-- Every pairing not 'handled' gets its delivery claim (run_id set when admitted). All writes
-- are sibling CTEs: none sees another's rows, and the foreign keys between them are checked at
-- the end of the statement. A concurrent admission that skipped the lock (or a bug) meets the
-- unique indexes instead — claim PK, (workflow, start_key), enrollment PK, and the partial
-- unique index on active runs per record — and this statement fails with a conflict.
-- The first step row mirrors shared.steps.journal.insert_steps (step_key = node id,
-- idempotency key 'onceflow:<lineage root>:<step key>'), batched for every run at once.
WITH input AS (
    SELECT i.*
    FROM unnest(CAST(:workflow_ids AS uuid[]), CAST(:version_ids AS uuid[]),
                CAST(:dedup_modes AS text[]), CAST(:run_ids AS uuid[]),
                CAST(:record_keys AS text[]), CAST(:refusals AS text[]),
                CAST(:refusal_details AS text[]),
                CAST(:entry_nodes AS text[]), CAST(:entry_types AS text[]),
                CAST(:records AS text[]), CAST(:priorities AS smallint[]))
         AS i (workflow_id, version_id, dedup_mode, run_id, record_key, refusal,
               refusal_detail, entry_node, entry_type, record, priority)
), seen AS (
    SELECT i.*,
           (c.event_id IS NOT NULL) AS claimed,
           CAST(coalesce(c.run_id, r.id) AS text) AS existing_run_id,
           CAST(dd.enrolled_run_id AS text) AS enrolled_run_id, dd.enrolled_at,
           CAST(dd.active_run_id AS text) AS active_run_id, dd.active_since,
           dd.reason AS dedup_reason, dd.detail AS dedup_detail,
           r.id IS NOT NULL AS has_start_run
    FROM input i
    LEFT JOIN delivery_claims c ON c.event_id = :event_id AND c.workflow_id = i.workflow_id
    LEFT JOIN workflow_runs r ON r.workflow_id = i.workflow_id AND r.start_key = :start_key
    -- The dedup rule, its reason and its words: migrations/0460_admission_dedup.sql, the one
    -- definition would-run reads too (inlined here, read under this statement's snapshot).
    LEFT JOIN admission_dedup(CAST(:workflow_ids AS uuid[]), CAST(:dedup_modes AS text[]),
                              CAST(:record_keys AS text[])) dd
           ON dd.workflow_id = i.workflow_id
), outcomes AS (
    SELECT s.*,
           CASE WHEN s.claimed OR s.has_start_run THEN 'handled'
                WHEN s.refusal IS NOT NULL THEN s.refusal
                WHEN s.dedup_reason IS NOT NULL THEN s.dedup_reason
                ELSE 'admitted' END AS outcome
    FROM seen s
), decided AS (
    -- The refusals decided before the transaction come with their detail in
    -- :refusal_details; duplicate and already_running are worded by admission_dedup.
    SELECT o.*,
           CASE WHEN o.outcome = o.dedup_reason THEN o.dedup_detail
                ELSE o.refusal_detail END AS detail
    FROM outcomes o
), ev AS (
    SELECT id, tenant_id, payload, payload_truncated FROM workflow_trigger_events
    WHERE id = :event_id
), runs AS (
    INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key, event_id,
                               record_key, dedup_mode, namespace, trigger_payload,
                               payload_truncated, lineage_root, trigger_record, priority)
    SELECT d.run_id, ev.tenant_id, d.workflow_id, d.version_id, :start_key, ev.id,
           d.record_key, d.dedup_mode, 'live', ev.payload, ev.payload_truncated, d.run_id,
           coalesce(CAST(d.record AS jsonb), CAST(:event_record AS jsonb)), d.priority
    FROM decided d CROSS JOIN ev
    WHERE d.outcome = 'admitted'
    RETURNING id
), enrolled AS (
    INSERT INTO workflow_enrollments (workflow_id, record_key, run_id)
    SELECT d.workflow_id, d.record_key, d.run_id FROM decided d
    WHERE d.outcome = 'admitted' AND d.dedup_mode = 'once_per_record' AND d.record_key IS NOT NULL
    RETURNING run_id
), claims AS (
    INSERT INTO delivery_claims (event_id, workflow_id, run_id)
    SELECT :event_id, d.workflow_id, CASE WHEN d.outcome = 'admitted' THEN d.run_id END
    FROM decided d WHERE d.outcome <> 'handled'
    RETURNING workflow_id
), steps AS (
    INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key,
                                dispatched_at, priority)
    SELECT d.run_id, d.entry_node, d.entry_node, d.entry_type,
           onceflow_idempotency_key(CAST(d.run_id AS text), d.entry_node), now(), d.priority
    FROM decided d WHERE d.outcome = 'admitted'
    RETURNING id, run_id
), decided_stamp AS (
    -- Every bound workflow is decided when this transaction commits (the sweep re-publishes a
    -- published event that never gets here: shared/ingest/outbox.py requeue_undecided_events).
    UPDATE workflow_trigger_events SET decided_at = now()
    WHERE id = :event_id AND decided_at IS NULL
    RETURNING id
), trials_unused AS (
    -- A half-open breaker's trial slot claimed before this statement (breaker_probe_claim, same
    -- transaction, so the row is already locked by it) for a binding this statement did not
    -- admit (duplicate, already_running, handled) is given back.
    UPDATE workflow_breakers b SET probes_admitted = b.probes_admitted - 1
      FROM decided d
     WHERE b.workflow_id = d.workflow_id AND d.outcome <> 'admitted'
       AND b.workflow_id = ANY(CAST(:probe_ids AS uuid[])) AND b.probes_admitted > 0
    RETURNING b.workflow_id
), stale_refusals AS (
    -- A refusal written by an earlier attempt whose transaction then failed (already_running
    -- then; the run has finished since): the pairing now has a run, not a refusal.
    DELETE FROM admission_refusals ar USING decided d
    WHERE ar.event_id = :event_id AND ar.workflow_id = d.workflow_id AND d.outcome = 'admitted'
    RETURNING ar.id
), refusals AS (
    -- Every refusal, in this statement, with its delivery claim: a claimed pairing always
    -- has its explanation and a rolled-back attempt leaves neither (the redelivery, or the
    -- sweep's re-publish, decides again). A row already there can only be a stale one from
    -- an attempt of an older release that wrote refusals on a second connection and then
    -- rolled back: the decision made now replaces it.
    INSERT INTO admission_refusals (tenant_id, event_id, workflow_id, version_id, record_key,
                                    reason, detail)
    SELECT ev.tenant_id, :event_id, d.workflow_id, d.version_id, d.record_key, d.outcome,
           d.detail
    FROM decided d CROSS JOIN ev
    WHERE d.outcome NOT IN ('handled', 'admitted')
    ON CONFLICT (event_id, workflow_id) DO UPDATE
       SET version_id = EXCLUDED.version_id, record_key = EXCLUDED.record_key,
           reason = EXCLUDED.reason, detail = EXCLUDED.detail, created_at = now()
    RETURNING id
)
SELECT CAST(d.workflow_id AS text) AS workflow_id, d.outcome, d.detail,
       CASE WHEN d.outcome = 'admitted' THEN CAST(d.run_id AS text) ELSE d.existing_run_id END
           AS run_id,
       d.enrolled_run_id, d.enrolled_at, d.active_run_id, d.active_since,
       CAST(st.id AS text) AS step_id
FROM decided d LEFT JOIN steps st ON st.run_id = d.run_id

-- name: admission_pending_first_steps
-- Redelivery of an admitted event: the runs' steps still waiting to be claimed, to publish
-- again (their first dispatch may have been lost between commit and publish).
SELECT CAST(id AS text) AS id FROM workflow_steps
WHERE run_id = ANY(CAST(:run_ids AS uuid[])) AND status = 'pending'
ORDER BY created_at, step_key

-- name: admission_mark_decided
-- An event with nothing left to decide (no workflow bound to it): admission ran, so it is
-- decided. Zero rows: already stamped.
UPDATE workflow_trigger_events SET decided_at = now()
WHERE id = :event_id AND decided_at IS NULL

-- name: admission_poisoned_insert
INSERT INTO poisoned_messages (source, message_id, data, reason)
VALUES (:source, :message_id, :data, :reason)

-- name: admission_refusals_for_record
-- Support's question, "why didn't my workflow run for this lead?": one index range scan on
-- (tenant_id, record_key, created_at).
SELECT ar.created_at, ar.reason, ar.detail, ar.event_id, CAST(ar.workflow_id AS text) AS workflow_id,
       w.name AS workflow_name, CAST(ar.version_id AS text) AS version_id, ar.record_key
FROM admission_refusals ar JOIN workflows w ON w.id = ar.workflow_id
WHERE ar.tenant_id = :tenant_id AND ar.record_key = :record_key
ORDER BY ar.created_at DESC, ar.id DESC
LIMIT CAST(:limit AS integer)

-- name: admission_would_run_context
-- "Would this record enroll?" (shared/admission/would_run.py), read-only: what
-- admission_context reads about an event's tenant and connection, and this workflow's
-- bindings, for a record no event names yet. No locks: nothing is decided. No row when the
-- connection or the workflow is unknown, or they belong to different tenants (or not to
-- :tenant_scope when given).
SELECT c.tenant_id, CAST(c.id AS text) AS connection_id, t.credit_balance,
       t.excluded_authors || coalesce(c.excluded_authors, '{}') AS excluded_authors,
       c.status AS connection_status, c.provider AS connection_provider,
       c.provider_user_id AS connection_user_id,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'event_type', b.event_type, 'workflow_id', b.workflow_id,
                   'version_id', b.version_id, 'dedup_mode', b.dedup_mode,
                   'definition', v.definition,
                   'breaker_state', wb.state, 'breaker_opened_at', wb.opened_at,
                   'breaker_reason', wb.reason, 'breaker_trials', wb.probes_admitted)
                   ORDER BY b.event_type), '[]'::jsonb)
          FROM trigger_bindings b
          JOIN workflow_versions v ON v.id = b.version_id
          LEFT JOIN workflow_breakers wb ON wb.workflow_id = b.workflow_id
         WHERE b.tenant_id = c.tenant_id AND b.workflow_id = w.id) AS bindings
FROM connections c
JOIN tenants t ON t.id = c.tenant_id
JOIN workflows w ON w.id = CAST(:workflow_id AS uuid) AND w.tenant_id = c.tenant_id
WHERE c.id = CAST(:connection_id AS uuid)
  AND (CAST(:tenant_scope AS text) IS NULL OR c.tenant_id = CAST(:tenant_scope AS text))

-- name: admission_would_run_history
-- The record's history in onceflow as admission's decision reads it, read-only: the echo
-- markers alive now for the fields a change would carry (admission_context reads them with
-- the same function, echo_markers_alive) and the dedup rule's answer (admission_admit reads
-- admission_dedup too: migrations/0460_admission_dedup.sql).
SELECT (SELECT coalesce(jsonb_agg(jsonb_build_array(m.field, encode(m.value_hash, 'hex'))),
                        '[]'::jsonb)
          FROM echo_markers_alive(
                   CAST(:connection_id AS uuid), :object_type, :object_id,
                   CAST(:fields AS text[]), statement_timestamp(),
                   CAST(:echo_skew_seconds AS double precision)) m) AS echo_markers,
       dd.reason AS dedup_reason, dd.detail AS dedup_detail,
       CAST(dd.blocking_run_id AS text) AS blocking_run_id
FROM admission_dedup(ARRAY[CAST(:workflow_id AS uuid)], ARRAY[CAST(:dedup_mode AS text)],
                     ARRAY[CAST(:record_key AS text)]) dd

-- name: admission_redecide_candidates
-- Re-decide (shared/admission/redecide.py): the refusals of :reasons in the window, each with
-- what admission_context reads about its event (echo markers excepted: an echo is refused
-- `echo_suppressed`, which is never re-decided) and the workflow's binding for the event's
-- type now (NULL columns when the workflow is no longer bound to it). Scoped like every ops
-- read (:tenant_id NULL is an admin). :refusal_ids NULL lists by the filter (refusals whose
-- event already started a run through a re-decision are left out: one run per event and
-- workflow); given, exactly those rows, for an act. No locks: the decision takes them.
SELECT ar.id AS refusal_id, ar.reason AS was_reason, ar.detail AS was_detail,
       ar.created_at AS refused_at, CAST(ar.workflow_id AS text) AS workflow_id,
       e.id, e.tenant_id, CAST(e.connection_id AS text) AS connection_id, e.event_type,
       e.source_event_id, e.record_object_type, e.record_object_id, e.author_id,
       e.author_source, e.changed_fields, e.occurred_at, e.payload,
       CASE WHEN e.record_object_id IS NOT NULL
            THEN coalesce(CAST(e.connection_id AS text), 'app') || ':'
                 || e.record_object_type || ':' || e.record_object_id
       END AS record_key,
       t.credit_balance,
       t.excluded_authors || coalesce(c.excluded_authors, '{}') AS excluded_authors,
       c.status AS connection_status, c.provider AS connection_provider,
       c.provider_user_id AS connection_user_id, '[]'::jsonb AS echo_markers,
       CAST(b.version_id AS text) AS version_id, b.dedup_mode, v.definition,
       wb.state AS breaker_state, wb.opened_at AS breaker_opened_at, wb.reason AS breaker_reason
FROM admission_refusals ar
JOIN workflow_trigger_events e ON e.id = ar.event_id
JOIN tenants t ON t.id = e.tenant_id
LEFT JOIN connections c ON c.id = e.connection_id
LEFT JOIN trigger_bindings b
       ON b.tenant_id = ar.tenant_id AND b.event_type = e.event_type
      AND b.workflow_id = ar.workflow_id
LEFT JOIN workflow_versions v ON v.id = b.version_id
LEFT JOIN workflow_breakers wb ON wb.workflow_id = ar.workflow_id
WHERE (CAST(:tenant_id AS text) IS NULL OR ar.tenant_id = CAST(:tenant_id AS text))
  AND ar.reason = ANY(CAST(:reasons AS text[]))
  AND (CAST(:refusal_ids AS bigint[]) IS NULL OR ar.id = ANY(CAST(:refusal_ids AS bigint[])))
  AND (CAST(:refusal_ids AS bigint[]) IS NOT NULL OR NOT EXISTS (
           SELECT 1 FROM admission_redecisions rd
            WHERE rd.event_id = ar.event_id AND rd.workflow_id = ar.workflow_id
              AND rd.run_id IS NOT NULL))
  AND (CAST(:workflow_id AS uuid) IS NULL OR ar.workflow_id = CAST(:workflow_id AS uuid))
  AND (CAST(:record_key AS text) IS NULL OR ar.record_key = CAST(:record_key AS text))
  AND (CAST(:event_type AS text) IS NULL OR e.event_type = CAST(:event_type AS text))
  AND (CAST(:created_after AS timestamptz) IS NULL
       OR ar.created_at >= CAST(:created_after AS timestamptz))
  AND (CAST(:created_before AS timestamptz) IS NULL
       OR ar.created_at < CAST(:created_before AS timestamptz))
ORDER BY ar.id
LIMIT CAST(:limit AS integer)

-- name: admission_redecide_dedup
-- A preview's read of the dedup rule (migrations/0460_admission_dedup.sql, the one definition
-- admission_admit and admission_redecide read): the reason and words a start would meet now.
SELECT dd.reason, dd.detail, CAST(dd.blocking_run_id AS text) AS blocking_run_id
FROM admission_dedup(ARRAY[CAST(:workflow_id AS uuid)], ARRAY[CAST(:dedup_mode AS text)],
                     ARRAY[CAST(:record_key AS text)]) dd

-- name: admission_redecide
-- The re-decision of one refused pairing under the workflow's current version, one statement,
-- after the caller took the record's dedup lock (admission_lock_records, the key admission's
-- own locks hash) when its mode needs one: this statement's snapshot sees what the lock's
-- previous holder — a live admission of a new event for the record, say — committed.
-- In order of precedence:
--   handled          this (event, workflow, version) was re-decided already, or the event
--                    already started a run of the workflow by a re-decision: nothing is
--                    written; the earlier decision is answered
--   <refusal>        a reason decided before the statement (the rule, credits, the breaker …)
--   duplicate / already_running   admission_dedup, as admission_admit reads it
--   admitted         run row (start key `redecide:<event>:<version>`, pinned to the current
--                    version, payload copied from the event row, the record the rule saw,
--                    lineage root = its own id), enrollment (once_per_record), first step row
-- Every decision but `handled` is written beside the refusal (admission_redecisions). Two
-- re-decisions racing on one pairing: the unique key (event, workflow, version) — and, for an
-- admitted one, the (workflow, start_key) and one-run-per-event indexes — let exactly one
-- commit; the other fails with a conflict and, decided again, finds it (`handled`).
WITH prior AS (
    SELECT rd.outcome, rd.detail, CAST(rd.run_id AS text) AS run_id
    FROM admission_redecisions rd
    WHERE rd.event_id = :event_id AND rd.workflow_id = CAST(:workflow_id AS uuid)
      AND (rd.version_id = CAST(:version_id AS uuid) OR rd.outcome = 'admitted')
    ORDER BY rd.outcome <> 'admitted', rd.id
    LIMIT 1
), dd AS (
    SELECT d.reason, d.detail
    FROM admission_dedup(ARRAY[CAST(:workflow_id AS uuid)], ARRAY[CAST(:dedup_mode AS text)],
                         ARRAY[CAST(:record_key AS text)]) d
), decided AS (
    SELECT CASE WHEN p.outcome IS NOT NULL THEN 'handled'
                WHEN CAST(:refusal AS text) IS NOT NULL THEN CAST(:refusal AS text)
                WHEN dd.reason IS NOT NULL THEN dd.reason
                ELSE 'admitted' END AS outcome,
           CASE WHEN p.outcome IS NOT NULL THEN p.detail
                WHEN CAST(:refusal AS text) IS NOT NULL THEN CAST(:refusal_detail AS text)
                ELSE dd.detail END AS detail,
           p.outcome AS prior_outcome, p.run_id AS prior_run_id
    FROM (SELECT 1) one LEFT JOIN prior p ON true LEFT JOIN dd ON true
), ev AS (
    SELECT id, tenant_id, payload, payload_truncated FROM workflow_trigger_events
    WHERE id = :event_id
), runs AS (
    INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key, event_id,
                               record_key, dedup_mode, namespace, trigger_payload,
                               payload_truncated, lineage_root, trigger_record, priority)
    SELECT CAST(:run_id AS uuid), ev.tenant_id, CAST(:workflow_id AS uuid),
           CAST(:version_id AS uuid), 'redecide:' || ev.id || ':' || CAST(:version_id AS text),
           ev.id, CAST(:record_key AS text), CAST(:dedup_mode AS text), 'live', ev.payload,
           ev.payload_truncated, CAST(:run_id AS uuid), CAST(:record AS jsonb),
           CAST(:priority AS smallint)
    FROM decided d CROSS JOIN ev
    WHERE d.outcome = 'admitted'
    RETURNING id
), enrolled AS (
    INSERT INTO workflow_enrollments (workflow_id, record_key, run_id)
    SELECT CAST(:workflow_id AS uuid), CAST(:record_key AS text), CAST(:run_id AS uuid)
    FROM decided d
    WHERE d.outcome = 'admitted' AND CAST(:dedup_mode AS text) = 'once_per_record'
      AND CAST(:record_key AS text) IS NOT NULL
    RETURNING run_id
), steps AS (
    INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key,
                                dispatched_at, priority)
    SELECT CAST(:run_id AS uuid), CAST(:entry_node AS text), CAST(:entry_node AS text),
           CAST(:entry_type AS text),
           onceflow_idempotency_key(CAST(:run_id AS text), CAST(:entry_node AS text)), now(),
           CAST(:priority AS smallint)
    FROM decided d WHERE d.outcome = 'admitted'
    RETURNING id
), noted AS (
    INSERT INTO admission_redecisions (tenant_id, refusal_id, event_id, workflow_id, version_id,
                                       record_key, outcome, detail, run_id, bulk_id)
    SELECT ev.tenant_id, :refusal_id, ev.id, CAST(:workflow_id AS uuid),
           CAST(:version_id AS uuid), CAST(:record_key AS text), d.outcome, d.detail,
           CASE WHEN d.outcome = 'admitted' THEN CAST(:run_id AS uuid) END,
           CAST(:bulk_id AS uuid)
    FROM decided d CROSS JOIN ev
    WHERE d.outcome <> 'handled'
    RETURNING id
)
SELECT d.outcome, d.detail, d.prior_outcome,
       CASE WHEN d.outcome = 'admitted' THEN CAST(:run_id AS text) ELSE d.prior_run_id END
           AS run_id,
       (SELECT CAST(id AS text) FROM steps) AS step_id
FROM decided d
