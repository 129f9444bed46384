-- Step journal and the step engine's transitions. Every state change is one guarded UPDATE;
-- zero rows is an answer (see the docstring of the Python function that runs it).

-- name: steps_insert_many
-- New step rows for one run; a row that already exists (a redelivered settle, a resumed
-- admission) is left alone. Returns every wanted row that is still pending: the newly inserted
-- ones from the CTE, the pre-existing ones from the statement's snapshot (which does not see
-- the CTE's inserts), so no id appears twice.
WITH wanted AS (
    SELECT w.step_key, w.node_id, w.block_type
    FROM unnest(CAST(:step_keys AS text[]), CAST(:node_ids AS text[]),
                CAST(:block_types AS text[])) AS w (step_key, node_id, block_type)
), inserted AS (
    INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key,
                                dispatched_at, priority)
    SELECT CAST(:run_id AS uuid), w.step_key, w.node_id, w.block_type,
           onceflow_idempotency_key(CAST(:lineage_root AS text), w.step_key),
           CASE WHEN CAST(:stamp_dispatched AS boolean) THEN now() END,
           -- the run's priority, on each step: a limit's line is ordered by the step's index
           -- (shared/gates/limit_queue.py); one lookup by the run's primary key
           (SELECT r.priority FROM workflow_runs r WHERE r.id = CAST(:run_id AS uuid))
    FROM wanted w
    ON CONFLICT (run_id, step_key) DO NOTHING
    RETURNING id
)
SELECT CAST(id AS text) AS id FROM inserted
UNION ALL
SELECT CAST(s.id AS text) AS id
FROM workflow_steps s JOIN wanted w ON w.step_key = s.step_key
WHERE s.run_id = CAST(:run_id AS uuid) AND s.status = 'pending'

-- name: steps_pending_for_run
SELECT CAST(id AS text) AS id FROM workflow_steps
WHERE run_id = CAST(:run_id AS uuid) AND status = 'pending'
ORDER BY created_at, step_key

-- name: steps_mark_dispatched
UPDATE workflow_steps SET dispatched_at = now()
WHERE id = ANY(CAST(:step_ids AS uuid[])) AND status = 'pending'

-- name: steps_claim
-- The claim (invariant 7): only a pending step of a running run in the wanted namespace. A
-- concurrent claim blocks on the row lock, re-checks `status = 'pending'` and gets zero rows.
-- Returns the step and the facts of the trigger event and the record the rule saw (the
-- expression scope, shared/workflows/scope.py) in this one round trip; never the outputs of
-- other steps: those the step reads are loaded by name (steps_scope_outputs) once its node is
-- known. The lease's history row is inserted by the same statement, so it exists exactly when
-- the claim does.
WITH claimed AS (
    UPDATE workflow_steps s
    SET status = 'running',
        attempt = s.attempt + 1,
        lease_id = CAST(:lease_id AS uuid),
        lease_expires_at = now() + make_interval(secs => CAST(:lease_seconds AS double precision)),
        started_at = coalesce(s.started_at, now())
    FROM workflow_runs r
    LEFT JOIN workflow_trigger_events e ON e.id = r.event_id
    WHERE s.id = CAST(:step_id AS uuid)
      AND s.status = 'pending'
      AND r.id = s.run_id
      AND r.status = 'running'
      AND r.namespace = CAST(:namespace AS text)
    RETURNING CAST(s.id AS text) AS id, CAST(s.run_id AS text) AS run_id, s.step_key, s.node_id,
              s.block_type, s.attempt, s.idempotency_key, s.side_effect_started_at, s.output,
              s.input_override, r.tenant_id, CAST(r.workflow_id AS text) AS workflow_id,
              CAST(r.version_id AS text) AS version_id,
              CAST(r.lineage_root AS text) AS lineage_root,
              r.trigger_payload, r.trigger_record, r.record_key, r.event_id, r.namespace,
              -- How the run ended, for its finally steps (`run.final_status`, `run.error`).
              r.final_status, r.error AS run_error,
              CAST(e.connection_id AS text) AS connection_id, e.event_type,
              e.record_object_type, e.record_object_id, e.source_event_id, e.occurred_at,
              e.author_id, e.changed_fields,
              -- A debounced run's burst (`event.burst`): one lookup by the unique run_id, that
              -- of its lineage's root, so a replay reads the burst its original run read.
              (SELECT b.events FROM debounce_bursts b
                WHERE b.run_id = r.lineage_root AND b.max_size IS NULL) AS burst,
              -- A batch's run's events (`event.batch`), the same way.
              (SELECT b.events FROM debounce_bursts b
                WHERE b.run_id = r.lineage_root AND b.max_size IS NOT NULL) AS batch
), lease AS (
    INSERT INTO workflow_step_leases (lease_id, step_id, attempt)
    SELECT CAST(:lease_id AS uuid), CAST(:step_id AS uuid), c.attempt FROM claimed c
)
SELECT * FROM claimed

-- name: steps_scope_outputs
-- What a claimed step's scope reads of its run, and nothing else (issue 23, item 16: every
-- claim carried every earlier output, so a 1,000-item foreach moved O(n²) JSON): `steps`, the
-- output and branch choice of each succeeded step it names (`step_keys`; NULL when it reads
-- the `steps` root by no literal name: every succeeded step), and `loop`, for an iteration of
-- a foreach body (`foreach`, `iteration`), the loop's count and concurrency and this
-- iteration's own item, never the whole list. Read-only; `loop` is NULL when the foreach has
-- not succeeded (the iteration then has no loop to go on with).
SELECT (SELECT coalesce(jsonb_object_agg(p.step_key, jsonb_build_object(
                   'output', p.output, 'branch_choice', p.branch_choice)), '{}'::jsonb)
          FROM workflow_steps p
         WHERE p.run_id = CAST(:run_id AS uuid) AND p.status = 'succeeded'
           AND (CAST(:step_keys AS text[]) IS NULL
                OR p.step_key = ANY(CAST(:step_keys AS text[])))) AS steps,
       (SELECT jsonb_build_object('count', f.output -> 'count',
                                  'concurrency', f.output -> 'concurrency',
                                  'item', f.output -> 'items' -> CAST(:iteration AS integer))
          FROM workflow_steps f
         WHERE f.run_id = CAST(:run_id AS uuid) AND f.step_key = CAST(:foreach AS text)
           AND f.status = 'succeeded') AS loop

-- name: steps_heartbeat
-- Renew a lease. Zero rows: the lease is gone (reclaimed by the sweep, the step settled or
-- claimed again under a new lease) and the holder must not settle.
UPDATE workflow_steps
SET lease_expires_at = now() + make_interval(secs => CAST(:lease_seconds AS double precision))
WHERE id = CAST(:step_id AS uuid) AND status = 'running' AND lease_id = CAST(:lease_id AS uuid)
RETURNING id

-- name: steps_mark_side_effect_started
-- Invariant 10. Zero rows: an earlier attempt already set the marker (the outcome is unknown),
-- or this attempt lost its lease.
UPDATE workflow_steps SET side_effect_started_at = now()
WHERE id = CAST(:step_id AS uuid) AND status = 'running' AND lease_id = CAST(:lease_id AS uuid)
  AND side_effect_started_at IS NULL
RETURNING id

-- name: steps_withdraw_side_effect_mark
-- The port proved the at-most-once request never applied (refused before it left, 429): take
-- the marker back so a retry may call. Zero rows: the lease is gone or there was no marker.
UPDATE workflow_steps SET side_effect_started_at = NULL
WHERE id = CAST(:step_id AS uuid) AND status = 'running' AND lease_id = CAST(:lease_id AS uuid)
  AND side_effect_started_at IS NOT NULL
RETURNING id

-- name: steps_settle
-- The outcome, fenced on the lease: no `run_status` means this attempt lost its lease and
-- someone else owns the step now. Locks the run row first so settles of one run are serialized
-- (and a transaction that goes on after this statement sees committed siblings). Closes this
-- lease's history row in the same statement, only when the settle itself matched: a fenced-out
-- settle touches neither its own (already reclaimed) row nor its successor's.
--
-- With `fold` the statement is the whole settle transaction (the step hot path, run on its
-- own in autocommit: one round trip): the next steps' rows (`step_keys`…, stamped dispatched:
-- the caller publishes them after this returns), the run failed when the step failed, the run
-- succeeded when the step succeeded and nothing new is left to do, and a succeeded run's
-- circuit breaker streak reset (`onceflow_breaker_record_success`, the function
-- breaker.sql's `breaker_record_success` calls too). Those
-- decisions read the run's other steps through the statement's snapshot, taken before the run
-- lock was granted, so they are exact only when no other step of the run is open (pending,
-- running or parked): no other writer could have moved or created one since. Otherwise — and
-- for a wait of a cancelled run, which the caller skips in the same transaction — nothing is
-- written and `folded` is false: the caller settles in a transaction, statement by statement
-- (without `fold`), each later statement with a fresh snapshot under the run lock.
WITH run AS (
    SELECT id, status, namespace, workflow_id
    FROM workflow_runs WHERE id = CAST(:run_id AS uuid) FOR UPDATE
), wanted AS (
    SELECT w.step_key, w.node_id, w.block_type
    FROM unnest(CAST(:step_keys AS text[]), CAST(:node_ids AS text[]),
                CAST(:block_types AS text[])) AS w (step_key, node_id, block_type)
), facts AS (
    SELECT run.status AS run_status, run.namespace, run.workflow_id,
           NOT CAST(:fold AS boolean)
           OR (NOT EXISTS (SELECT 1 FROM workflow_steps o
                            WHERE o.run_id = run.id AND o.id <> CAST(:step_id AS uuid)
                              AND o.status NOT IN ('succeeded', 'skipped', 'failed'))
               AND NOT (run.status IN ('cancelled', 'goal_met')
                        AND CAST(:status AS text) IN ('waiting_for_delay', 'waiting_for_retry',
                                                      'waiting_for_event',
                                                      'waiting_for_approval'))) AS folded,
           -- Every wanted row exists already (finished: nothing else is open): nothing new.
           NOT EXISTS (SELECT 1 FROM wanted w
                        WHERE NOT EXISTS (SELECT 1 FROM workflow_steps e
                                           WHERE e.run_id = run.id
                                             AND e.step_key = w.step_key)) AS nothing_new
    FROM run
), settled AS (
    UPDATE workflow_steps s
    SET status = CAST(:status AS text),
        attempt = CAST(:attempt AS integer),
        output = CAST(:output AS jsonb),
        input = coalesce(CAST(:input AS jsonb), s.input),
        error = CAST(:error AS text),
        error_class = CAST(:error_class AS text),
        outcome_code = CAST(:outcome_code AS text),
        branch_choice = CAST(:branch_choice AS text),
        wake_at = CAST(:wake_at AS timestamptz),
        park_id = CAST(:park_id AS bigint),
        park_kind = CAST(:park_kind AS text),
        lease_id = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN CAST(:status AS text) IN ('succeeded', 'skipped', 'failed')
                           THEN now() END
    FROM facts
    WHERE s.id = CAST(:step_id AS uuid) AND s.run_id = CAST(:run_id AS uuid) AND facts.folded
      AND s.status = 'running' AND s.lease_id = CAST(:lease_id AS uuid)
    RETURNING facts.run_status
), lease_closed AS (
    UPDATE workflow_step_leases l
    SET end_kind = 'settled',
        end_status = CAST(:status AS text),
        outcome_code = CAST(:outcome_code AS text),
        error_class = CAST(:error_class AS text),
        error = CAST(:error AS text),
        ended_at = now()
    FROM settled
    WHERE l.lease_id = CAST(:lease_id AS uuid) AND l.ended_at IS NULL
), ends AS (
    SELECT settled.run_status = 'running' AND CAST(:status AS text) = 'succeeded' AS goes_on,
           settled.run_status = 'running' AND CAST(:status AS text) = 'failed' AS fails,
           settled.run_status = 'running' AND CAST(:status AS text) = 'succeeded'
           AND facts.nothing_new AS finishes
    FROM settled, facts
    WHERE CAST(:fold AS boolean)
), inserted AS (
    INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key,
                                dispatched_at, priority)
    SELECT CAST(:run_id AS uuid), w.step_key, w.node_id, w.block_type,
           onceflow_idempotency_key(CAST(:lineage_root AS text), w.step_key), now(),
           (SELECT r.priority FROM workflow_runs r WHERE r.id = CAST(:run_id AS uuid))
    FROM wanted w, ends
    WHERE ends.goes_on
    ON CONFLICT (run_id, step_key) DO NOTHING
    RETURNING id
), failed_run AS (
    UPDATE workflow_runs r SET status = 'failed', finished_at = now(),
                               error = CAST(:run_error AS text)
    FROM ends
    WHERE r.id = CAST(:run_id AS uuid) AND r.status = 'running' AND ends.fails
    RETURNING r.id
), finished_run AS (
    UPDATE workflow_runs r SET status = 'succeeded', finished_at = now()
    FROM ends
    WHERE r.id = CAST(:run_id AS uuid) AND r.status = 'running' AND ends.finishes
    RETURNING r.id
), breaker_reset AS (
    -- The function's UPDATE runs only when the outer SELECT reads this CTE (a SELECT in WITH
    -- runs as far as its reader asks), hence `breaker_state` below.
    SELECT onceflow_breaker_record_success(facts.workflow_id) AS state
      FROM finished_run, facts
     WHERE facts.namespace = 'live'
)
SELECT facts.folded, settled.run_status,
       coalesce((SELECT array_agg(CAST(id AS text)) FROM inserted),
                CAST(ARRAY[] AS text[])) AS dispatch,
       EXISTS (SELECT 1 FROM failed_run) AS run_failed,
       EXISTS (SELECT 1 FROM finished_run) AS run_finished,
       (SELECT state FROM breaker_reset) AS breaker_state
FROM facts LEFT JOIN settled ON true

-- name: runs_finish_if_done
-- The run succeeded when none of its steps is left to do. Zero rows: something is still
-- pending, running or parked, the run already ended, or it is compensating (it will fail).
UPDATE workflow_runs r SET status = 'succeeded', finished_at = now()
WHERE r.id = CAST(:run_id AS uuid) AND r.status = 'running' AND r.phase = 'main'
  AND NOT EXISTS (SELECT 1 FROM workflow_steps s
                   WHERE s.run_id = r.id AND s.status NOT IN ('succeeded', 'skipped', 'failed'))

-- name: runs_fail
-- A step failed terminally: the run fails and keeps its journal (the dead-letter list).
UPDATE workflow_runs SET status = 'failed', finished_at = now(), error = CAST(:error AS text)
WHERE id = CAST(:run_id AS uuid) AND status = 'running'

-- name: runs_phase
-- The run's phase, read in the settle's transaction after `steps_settle` locked the run row:
-- no other settle, cancel or reclaim of the run can change it before this commits.
SELECT phase FROM workflow_runs WHERE id = CAST(:run_id AS uuid)

-- name: runs_begin_compensating
-- A step failed and some step that declares `compensate:` succeeded before: the run stays
-- `running` (so its compensation steps are claimed, woken and re-dispatched like any step) in
-- the `compensating` phase, the failure recorded as its error now. Runs under the run row's
-- lock (the settle's): zero rows means the run is not running in its main phase (cancelled,
-- already failed or compensating: another branch's failure won), and nothing is compensated
-- twice.
UPDATE workflow_runs SET phase = 'compensating', error = CAST(:error AS text)
WHERE id = CAST(:run_id AS uuid) AND status = 'running' AND phase = 'main'
RETURNING id

-- name: steps_skip_open_of_compensating_run
-- Entering the compensating phase: the run's other main-phase steps that are pending or parked
-- (parallel branches) will never run, like a failed run's: skipped RUN_ENDED, their parks
-- closed. A compensation row (`compensate:…`) is never among them. Runs under the run lock.
WITH skipped AS (
    UPDATE workflow_steps s
    SET status = 'skipped', finished_at = now(), wake_at = NULL, outcome_code = 'RUN_ENDED'
    WHERE s.run_id = CAST(:run_id AS uuid) AND s.step_key NOT LIKE 'compensate:%'
      AND s.status IN ('pending', 'waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                       'waiting_for_approval')
    RETURNING s.park_id
)
UPDATE step_parks p SET resumed_at = now(), resumed_by = 'cancel'
FROM skipped k
WHERE p.id = k.park_id AND p.resumed_at IS NULL

-- name: steps_next_compensation
-- The next step to undo: of the run's succeeded steps whose node declares `compensate:`
-- (`node_ids`), the one that finished last and has no compensation row yet. Read under the
-- run lock, so the settles that created the rows it checks are all visible; one at a time,
-- so compensations run in reverse order of the steps' success, and the unique
-- (run_id, step_key) makes each at most once.
SELECT s.step_key, s.node_id
FROM workflow_steps s
WHERE s.run_id = CAST(:run_id AS uuid) AND s.status = 'succeeded'
  AND s.node_id = ANY(CAST(:node_ids AS text[])) AND s.step_key NOT LIKE 'compensate:%'
  AND NOT EXISTS (SELECT 1 FROM workflow_steps c
                   WHERE c.run_id = s.run_id AND c.step_key = 'compensate:' || s.step_key)
ORDER BY s.finished_at DESC, s.step_key DESC
LIMIT 1

-- name: runs_end_compensated
-- The last compensation settled (succeeded or failed, each recorded on its row): the run ends
-- `failed` with the error recorded when the phase began. Zero rows: it ended already (a
-- cancel stopped the compensations).
UPDATE workflow_runs SET status = 'failed', finished_at = now()
WHERE id = CAST(:run_id AS uuid) AND status = 'running' AND phase = 'compensating'
RETURNING id

-- name: runs_begin_finally
-- The run's end is decided (`final_status`: its last main step succeeded with nothing left to
-- do, a step failed, or its last compensation settled) and its version declares `finally:`
-- (shared/steps/finale.py): it stays `running`, in the `finally` phase, while its finally
-- steps run; the failure's error, when one, recorded now. Runs under the run row's lock (the
-- settle's), guarded on the phase it leaves (`from_phase`) and, for a success, on nothing
-- being left to do: zero rows means another settle or a cancel decided first (each of them
-- takes the same lock and the same guard), so the finally steps begin at most once.
UPDATE workflow_runs r
SET phase = 'finally', final_status = CAST(:final_status AS text),
    error = coalesce(CAST(:error AS text), r.error)
WHERE r.id = CAST(:run_id AS uuid) AND r.status = 'running'
  AND r.phase = CAST(:from_phase AS text)
  AND (NOT CAST(:when_done AS boolean)
       OR NOT EXISTS (SELECT 1 FROM workflow_steps s
                       WHERE s.run_id = r.id
                         AND s.status NOT IN ('succeeded', 'skipped', 'failed')))
RETURNING r.id

-- name: steps_skip_open_of_final_run
-- Entering the finally phase: the run's steps that are not finally steps and are still pending
-- or parked (parallel branches; a main step that settled into a wait after the phase began)
-- will never run, as a failed run's: skipped RUN_ENDED, their parks closed. A finally step
-- (`finally:…`, its own waits included) is never among them. Runs under the run lock.
WITH skipped AS (
    UPDATE workflow_steps s
    SET status = 'skipped', finished_at = now(), wake_at = NULL, outcome_code = 'RUN_ENDED'
    WHERE s.run_id = CAST(:run_id AS uuid) AND s.step_key NOT LIKE 'finally:%'
      AND s.status IN ('pending', 'waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                       'waiting_for_approval')
    RETURNING s.park_id
)
UPDATE step_parks p SET resumed_at = now(), resumed_by = 'cancel'
FROM skipped k
WHERE p.id = k.park_id AND p.resumed_at IS NULL

-- name: runs_end_finally
-- The run's finally steps are done (none pending, running or parked): it ends as its main
-- phase decided (`final_status`), or `failed` when a finally step failed (its error appended
-- to the run's: `:error`, the failing step's, when this settle is that step's). Under the run
-- row's lock (the settle's), guarded on the phase: zero rows means a finally step is still
-- open (it ends the run when it settles) or the run ended already; it ends once.
UPDATE workflow_runs r
SET status = CASE WHEN EXISTS (SELECT 1 FROM workflow_steps f
                                WHERE f.run_id = r.id AND f.step_key LIKE 'finally:%'
                                  AND f.status = 'failed') THEN 'failed'
                  WHEN r.final_status = 'cancelled' THEN 'cancelled'
                  WHEN r.final_status = 'goal_met' THEN 'goal_met'
                  WHEN r.final_status = 'failed' THEN 'failed'
                  ELSE 'succeeded' END,
    finished_at = now(),
    error = CASE WHEN CAST(:error AS text) IS NULL THEN r.error
                 ELSE left(coalesce(r.error || '; then ', '') || CAST(:error AS text), 4000) END
WHERE r.id = CAST(:run_id AS uuid) AND r.status = 'running' AND r.phase = 'finally'
  AND NOT EXISTS (SELECT 1 FROM workflow_steps s
                   WHERE s.run_id = r.id AND s.step_key LIKE 'finally:%'
                     AND s.status NOT IN ('succeeded', 'skipped', 'failed'))
RETURNING r.status

-- name: versions_definition
SELECT definition FROM workflow_versions WHERE id = CAST(:version_id AS uuid)

-- name: steps_reclaim_expired
-- Expired leases, fenced on the lease id read under the row lock: a slow worker that renews or
-- settles first wins, and after this its settle matches nothing (lease_id is cleared). What
-- the step becomes:
-- - its run has ended (cancelled, or failed by another branch): nothing may claim it again, so
--   it ends here — failed OUTCOME_UNKNOWN when its at-most-once side effect may have started
--   (the marker is only ever set for at-most-once blocks), else skipped (CANCELLED in a
--   cancelled run, RUN_ENDED in a failed one) — and the run's end stands;
-- - the side effect may have started: failed OUTCOME_UNKNOWN, unless its block decides an
--   ambiguous retry itself (BlockSpec.decides_ambiguous_retry, `deciding_types`: crm.create
--   asks the CRM by its key) and has attempts left: then back to pending like any other;
-- - it used up its block's attempts: failed LEASE_EXPIRED (OUTCOME_UNKNOWN when marked);
-- - anything else: back to pending, dispatched at once.
-- The run row is locked with the step (skipped when another transaction holds it: a cancel,
-- a settle; the next pass takes it), so the run's status read here is the one that holds
-- when this commits: a cancel can't end the run between this read and the step's move, which
-- would leave it pending under a cancelled run. Runs of failed steps fail in the same
-- statement (those whose version declares `compensate:` or `finally:` are left to the caller,
-- `epilogue_version_id`), and each reclaimed lease's history row is closed as 'reclaimed'.
WITH expired AS (
    SELECT s.id, s.lease_id, r.status AS run_status
    FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
    WHERE s.status = 'running' AND s.lease_expires_at < now() AND r.namespace = 'live'
    ORDER BY s.lease_expires_at
    LIMIT CAST(:batch AS integer)
    FOR UPDATE OF s SKIP LOCKED
    FOR NO KEY UPDATE OF r SKIP LOCKED
), facts AS (
    SELECT e.id, e.lease_id, e.run_status, s.attempt,
           s.side_effect_started_at IS NOT NULL AS marked,
           s.block_type = ANY(CAST(:deciding_types AS text[])) AS decides,
           s.attempt >= coalesce(lim.max_attempts, CAST(:default_max_attempts AS integer))
               AS used_up
    FROM expired e JOIN workflow_steps s ON s.id = e.id
    -- The block's own attempt budget (BlockSpec.max_attempts), the same number its retries use.
    LEFT JOIN unnest(CAST(:block_types AS text[]), CAST(:block_max_attempts AS integer[]))
              AS lim (block_type, max_attempts) ON lim.block_type = s.block_type
), decided AS (
    -- `code` NULL: back to pending. `skip`: the run ended and nothing at-most-once may have
    -- left, so the step ends skipped; any other code fails it.
    SELECT f.id, f.lease_id, f.attempt, f.run_status,
           f.run_status <> 'running' AND NOT f.marked AS skip,
           CASE WHEN f.run_status <> 'running' AND f.marked THEN 'OUTCOME_UNKNOWN'
                WHEN f.run_status = 'cancelled' THEN 'CANCELLED'
                WHEN f.run_status <> 'running' THEN 'RUN_ENDED'
                WHEN f.marked AND (f.used_up OR NOT f.decides) THEN 'OUTCOME_UNKNOWN'
                WHEN f.used_up THEN 'LEASE_EXPIRED'
           END AS code
    FROM facts f
), ends AS (
    SELECT d.id, d.lease_id, d.code, d.skip,
           CASE WHEN d.run_status <> 'running' THEN
                'the lease expired after its run had ended (' || d.run_status || '); '
                || CASE WHEN d.skip THEN 'the step is not run again'
                        ELSE 'an at-most-once side effect may have started and its outcome '
                             'is unknown: check the provider' END
                WHEN d.code = 'OUTCOME_UNKNOWN' THEN 'the lease expired after an at-most-once '
                     'side effect may have started; its outcome is unknown: check the '
                     'provider, then replay'
                WHEN d.code = 'LEASE_EXPIRED' THEN 'the lease expired on attempt '
                     || d.attempt || ' and no attempts are left'
           END AS error
    FROM decided d
), reclaimed AS (
    UPDATE workflow_steps s
    SET status = CASE WHEN e.code IS NULL THEN 'pending' WHEN e.skip THEN 'skipped'
                      ELSE 'failed' END,
        outcome_code = coalesce(e.code, s.outcome_code),
        error_class = CASE WHEN e.code IS NULL OR e.skip THEN s.error_class
                           ELSE 'permanent' END,
        error = coalesce(e.error, s.error),
        finished_at = CASE WHEN e.code IS NULL THEN NULL ELSE now() END,
        dispatched_at = CASE WHEN e.code IS NULL THEN now() ELSE s.dispatched_at END,
        lease_id = NULL,
        lease_expires_at = NULL
    FROM ends e
    WHERE s.id = e.id AND s.lease_id = e.lease_id AND s.status = 'running'
    RETURNING CAST(s.id AS text) AS id, s.run_id, s.status, s.outcome_code, s.step_key,
              s.idempotency_key, e.lease_id, e.code AS failure, e.error
), lease_closed AS (
    UPDATE workflow_step_leases l
    SET end_kind = 'reclaimed',
        end_status = c.status,
        outcome_code = c.failure,
        error_class = CASE WHEN c.status = 'failed' THEN 'permanent' END,
        error = c.error,
        ended_at = now()
    FROM reclaimed c
    WHERE l.lease_id = c.lease_id AND l.ended_at IS NULL
), epilogues AS (
    -- Running runs whose version declares compensations or finally steps: a failed step
    -- there does what a settle's failure does (compensations, then the finally phase), which
    -- the caller runs in this transaction under the run row's lock taken above
    -- (shared/steps/repairs.py, settle.fail_in_phase). The check reads the canonical form:
    -- `finally` is written only when set, `compensate` only on a step that declares one.
    SELECT r.id, CAST(r.version_id AS text) AS version_id,
           CAST(r.lineage_root AS text) AS lineage_root
    FROM workflow_runs r JOIN workflow_versions v ON v.id = r.version_id
    WHERE r.id IN (SELECT run_id FROM reclaimed WHERE status = 'failed')
      AND r.status = 'running'
      AND (v.definition ? 'finally' OR jsonb_path_exists(v.definition, '$.steps[*].compensate'))
), failed_runs AS (
    UPDATE workflow_runs r
    SET status = 'failed', finished_at = now(),
        error = 'step ' || c.step_key || ' failed: ' || c.outcome_code
    FROM reclaimed c
    WHERE r.id = c.run_id AND c.status = 'failed' AND r.status = 'running'
      AND r.id NOT IN (SELECT id FROM epilogues)
    RETURNING r.id
)
SELECT c.id, CAST(c.run_id AS text) AS run_id, c.status, c.outcome_code, c.idempotency_key,
       c.step_key, c.error,
       c.run_id IN (SELECT id FROM failed_runs) AS run_failed,
       e.version_id AS epilogue_version_id, e.lineage_root
FROM reclaimed c LEFT JOIN epilogues e ON e.id = c.run_id AND c.status = 'failed'

-- name: steps_wake_due
-- Parked steps whose wake time has come go back to pending, stamped as dispatched (the caller
-- publishes right after commit; a lost publish is picked up by steps_redispatch_lost). A
-- delay's wait is served by this very move, judged by the database's clock: the row says so
-- (output.delay_served), so an executor whose clock runs behind never parks it again. A wait
-- for an event or a decision whose deadline came is resumed by the deadline: the output says
-- so with what the park row says to do on timeout (the goto target included, so a crash
-- after this lands on the same step), and the park row is closed in the same statement. An
-- event or a decision that resumed the step first leaves it pending, and this guard skips it.
WITH due AS (
    SELECT s.id, s.park_id
    FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
    WHERE s.status IN ('waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                       'waiting_for_approval')
      AND s.wake_at <= now()
      AND r.status = 'running' AND r.namespace = 'live'
    ORDER BY s.wake_at
    LIMIT CAST(:batch AS integer)
    FOR UPDATE OF s SKIP LOCKED
), woken AS (
    UPDATE workflow_steps s
    SET status = 'pending', wake_at = NULL, dispatched_at = now(),
        output = CASE
            WHEN s.status = 'waiting_for_delay'
            THEN coalesce(s.output, '{}'::jsonb) || '{"delay_served": true}'::jsonb
            WHEN s.status IN ('waiting_for_event', 'waiting_for_approval')
            THEN coalesce(s.output, '{}'::jsonb) || jsonb_build_object('resumed',
                 jsonb_build_object('by', 'deadline', 'at', now(), 'kind', p.kind,
                                    'on_timeout', p.on_timeout, 'goto', p.timeout_goto))
                 -- A wait of several events keeps the ones that matched before its deadline.
                 || CASE WHEN p.mode IS NOT NULL
                         THEN jsonb_build_object('events', p.matched) ELSE '{}'::jsonb END
            ELSE s.output END
    FROM due LEFT JOIN step_parks p ON p.id = due.park_id
    WHERE s.id = due.id
      AND s.status IN ('waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                       'waiting_for_approval')
    RETURNING s.id, s.park_id, s.output -> 'resumed' IS NOT NULL AS resumed
), closed AS (
    UPDATE step_parks p SET resumed_at = now(), resumed_by = 'deadline'
    FROM woken w
    WHERE w.resumed AND p.id = w.park_id AND p.resumed_at IS NULL
)
SELECT CAST(id AS text) AS id FROM woken

-- name: steps_redispatch_lost
-- Pending steps whose step-ready message was evidently lost: dispatched (or, never stamped,
-- created) longer ago than the threshold. Bounded, and re-stamped so the next pass leaves them
-- alone for another threshold: a slow executor can't cause a storm of duplicates.
WITH lost AS (
    SELECT s.id
    FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
    WHERE s.status = 'pending' AND r.status = 'running' AND r.namespace = 'live'
      AND (s.dispatched_at < now() - make_interval(secs => CAST(:after_seconds AS double precision))
           OR (s.dispatched_at IS NULL AND s.created_at
               < now() - make_interval(secs => CAST(:after_seconds AS double precision))))
    ORDER BY s.dispatched_at NULLS FIRST
    LIMIT CAST(:batch AS integer)
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE workflow_steps s SET dispatched_at = now()
FROM lost
WHERE s.id = lost.id AND s.status = 'pending'
RETURNING CAST(s.id AS text) AS id

-- name: steps_record_poisoned
-- A step-ready message that can never succeed (not base64 JSON, no step id): recorded, acked.
INSERT INTO poisoned_messages (source, message_id, data, reason)
VALUES ('step-ready', CAST(:message_id AS text), CAST(:data AS text), CAST(:reason AS text))

-- name: runs_cancel_lock
-- The first statement of the cancel's transaction, on its own: the run row's lock. A settle
-- that holds it (and creates the run's next steps) commits before this returns, and the
-- cancel's second statement (`runs_cancel`) takes its snapshot only then, under READ
-- COMMITTED, so it sees those steps. Locked in the same statement that skips the steps, the
-- lock would be granted after that statement's snapshot was taken: the settle's new step
-- unseen, left `pending` in a cancelled run for good. No row: no such live run in scope.
SELECT id FROM workflow_runs
WHERE id = CAST(:run_id AS uuid) AND namespace = 'live'
  AND (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
FOR UPDATE

-- name: runs_cancel
-- Ops cancel a live run: the run ends `cancelled` with who and why, and its pending and parked
-- steps become `skipped` in the same statement. Runs after `runs_cancel_lock` in the same
-- transaction, so its snapshot is newer than every settle of the run (a settle creates steps
-- only under the run row's lock, and the sweep's reclaim locks the run row too, skipping it
-- when locked): no step of the run is created or put back to pending after this read it.
-- A running step keeps its lease: it finishes its attempt and its settle sees the run ended,
-- so it creates no next steps (settle_step). The row returned is the newest one whether or not
-- this statement moved it: a loser (the run already ended, a second cancel) says who won and
-- when; `running_steps` is read under the lock too. No row: no such live run in scope.
-- A run in its compensating phase (shared/steps/saga.py) is not cancelled: a step failed
-- first, the run will end failed, and a cancel would leave its undo half done; nor is one in
-- its finally phase (shared/steps/finale.py): its end is decided and its finally steps are
-- what is left of it. The loser's row says `phase`.
-- A run whose version declares `finally:` is not ended here: the same guarded move keeps it
-- `running` in its finally phase with `final_status` cancelled (who and why recorded as for
-- any cancel), and `first_final` (the first finally step's definition, only then) tells the
-- caller to create that step in this transaction (shared/steps/finale.py `start`).
WITH run AS (
    SELECT wr.id, wr.status, wr.phase, wr.finished_at, wr.cancelled_by, wr.cancel_reason,
           wr.lineage_root, v.definition -> 'finally' -> 0 AS first_final
    FROM workflow_runs wr
    JOIN workflow_versions v ON v.id = wr.version_id
    WHERE wr.id = CAST(:run_id AS uuid) AND wr.namespace = 'live'
      AND (CAST(:tenant_id AS text) IS NULL OR wr.tenant_id = CAST(:tenant_id AS text))
    FOR UPDATE OF wr
), cancelled AS (
    UPDATE workflow_runs r
    SET status = CASE WHEN run.first_final IS NULL THEN 'cancelled' ELSE 'running' END,
        finished_at = CASE WHEN run.first_final IS NULL THEN now() END,
        phase = CASE WHEN run.first_final IS NULL THEN r.phase ELSE 'finally' END,
        final_status = CASE WHEN run.first_final IS NULL THEN r.final_status
                            ELSE 'cancelled' END,
        cancelled_by = CAST(:by AS text),
        cancel_reason = CAST(:reason AS text),
        error = 'cancelled by ' || CAST(:by AS text) || ': ' || CAST(:reason AS text)
    FROM run
    WHERE r.id = run.id AND r.status = 'running' AND run.phase = 'main'
    RETURNING r.id, r.status, r.phase, r.finished_at, r.cancelled_by, r.cancel_reason
), skipped AS (
    UPDATE workflow_steps s
    SET status = 'skipped', finished_at = now(), wake_at = NULL, outcome_code = 'CANCELLED'
    FROM cancelled c
    WHERE s.run_id = c.id
      AND s.status IN ('pending', 'waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                       'waiting_for_approval')
    RETURNING s.step_key, s.park_id
), parks_closed AS (
    UPDATE step_parks p SET resumed_at = now(), resumed_by = 'cancel'
    FROM skipped k
    WHERE p.id = k.park_id AND p.resumed_at IS NULL
)
SELECT CAST(run.id AS text) AS run_id, c.id IS NOT NULL AS moved,
       coalesce(c.status, run.status) AS status,
       coalesce(c.finished_at, run.finished_at) AS finished_at,
       coalesce(c.cancelled_by, run.cancelled_by) AS cancelled_by,
       coalesce(c.cancel_reason, run.cancel_reason) AS cancel_reason,
       coalesce(c.phase, run.phase) AS phase, CAST(run.lineage_root AS text) AS lineage_root,
       CASE WHEN c.phase = 'finally' THEN run.first_final END AS first_final,
       coalesce((SELECT array_agg(step_key ORDER BY step_key) FROM skipped),
                CAST(ARRAY[] AS text[])) AS skipped_steps,
       coalesce((SELECT array_agg(step_key ORDER BY step_key) FROM workflow_steps
                  WHERE run_id = run.id AND status = 'running'),
                CAST(ARRAY[] AS text[])) AS running_steps
FROM run LEFT JOIN cancelled c ON c.id = run.id

-- name: runs_end_goal_met
-- A live run's goal was met by an admitted event about its record (shared/steps/cancel.py
-- end_run_goal_met): the run ends `goal_met` and its pending and parked steps become `skipped`
-- (GOAL_MET), their parks closed by the goal, in one statement. The cancel's shape exactly:
-- it runs after `runs_cancel_lock` in the same transaction, so its snapshot is newer than
-- every settle of the run, and a step in flight keeps its lease, finishes its attempt, and its
-- settle creates nothing after it (the run is no longer running). The row returned is the
-- newest whether or not this moved it: a loser (the run already ended: a cancel, another
-- goal event, its last step) says how; a compensating run is left to finish its undo, as the
-- cancel leaves it (and a run in its finally phase, its finally steps). No row: no such live
-- run. As the cancel: a run whose version declares `finally:` stays `running` in its finally
-- phase (final_status goal_met) and `first_final` asks the caller for its first finally step.
WITH run AS (
    SELECT wr.id, wr.status, wr.phase, wr.finished_at, wr.cancelled_by, wr.cancel_reason,
           wr.lineage_root, v.definition -> 'finally' -> 0 AS first_final
    FROM workflow_runs wr
    JOIN workflow_versions v ON v.id = wr.version_id
    WHERE wr.id = CAST(:run_id AS uuid) AND wr.namespace = 'live'
    FOR UPDATE OF wr
), ended AS (
    UPDATE workflow_runs r
    SET status = CASE WHEN run.first_final IS NULL THEN 'goal_met' ELSE 'running' END,
        finished_at = CASE WHEN run.first_final IS NULL THEN now() END,
        phase = CASE WHEN run.first_final IS NULL THEN r.phase ELSE 'finally' END,
        final_status = CASE WHEN run.first_final IS NULL THEN r.final_status
                            ELSE 'goal_met' END,
        error = NULL
    FROM run
    WHERE r.id = run.id AND r.status = 'running' AND run.phase = 'main'
    RETURNING r.id, r.status, r.phase, r.finished_at
), skipped AS (
    UPDATE workflow_steps s
    SET status = 'skipped', finished_at = now(), wake_at = NULL, outcome_code = 'GOAL_MET'
    FROM ended e
    WHERE s.run_id = e.id
      AND s.status IN ('pending', 'waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                       'waiting_for_approval')
    RETURNING s.step_key, s.park_id
), parks_closed AS (
    UPDATE step_parks p SET resumed_at = now(), resumed_by = 'goal'
    FROM skipped k
    WHERE p.id = k.park_id AND p.resumed_at IS NULL
)
SELECT CAST(run.id AS text) AS run_id, e.id IS NOT NULL AS moved,
       coalesce(e.status, run.status) AS status,
       coalesce(e.finished_at, run.finished_at) AS finished_at,
       run.cancelled_by, run.cancel_reason, coalesce(e.phase, run.phase) AS phase,
       CAST(run.lineage_root AS text) AS lineage_root,
       CASE WHEN e.phase = 'finally' THEN run.first_final END AS first_final,
       coalesce((SELECT array_agg(step_key ORDER BY step_key) FROM skipped),
                CAST(ARRAY[] AS text[])) AS skipped_steps,
       coalesce((SELECT array_agg(step_key ORDER BY step_key) FROM workflow_steps
                  WHERE run_id = run.id AND status = 'running'),
                CAST(ARRAY[] AS text[])) AS running_steps
FROM run LEFT JOIN ended e ON e.id = run.id

-- name: steps_skip_parked_of_ended_run
-- A step that was running when its run was cancelled (or met its goal) settled into a wait (a
-- retry, a delay, an event, a decision): nothing would ever wake it (the sweep wakes steps of
-- running runs only), so it is skipped in the settle's transaction, its park row closed as
-- cancelled (or by the goal). Zero rows: the run is still running, or the step did not park.
WITH skipped AS (
    UPDATE workflow_steps s
    SET status = 'skipped', finished_at = now(), wake_at = NULL,
        outcome_code = CASE r.status WHEN 'goal_met' THEN 'GOAL_MET' ELSE 'CANCELLED' END
    FROM workflow_runs r
    WHERE s.id = CAST(:step_id AS uuid) AND r.id = s.run_id
      AND r.status IN ('cancelled', 'goal_met')
      AND s.status IN ('waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                       'waiting_for_approval')
    RETURNING s.park_id, r.status AS run_status
)
UPDATE step_parks p
SET resumed_at = now(),
    resumed_by = CASE k.run_status WHEN 'goal_met' THEN 'goal' ELSE 'cancel' END
FROM skipped k
WHERE p.id = k.park_id AND p.resumed_at IS NULL

-- name: parks_open
-- The park row of a step that asks to wait, committed before the step parks (its own
-- transaction): the conditions and the deadline exist before anyone could need them. A step
-- whose earlier attempt wrote it (and crashed before parking) gets that row back unchanged:
-- the first park's deadline is the one that holds. Only an OPEN park is given back (one per
-- step, migration 0210): a step that waited before and was started again by an ops retry
-- (its wait timed out, its approval was rejected) gets a new park, with a fresh deadline.
-- A wait of several events, or correlated beyond its record, names them in `awaits` and the
-- keys admission finds it by in `await_keys` (shared/steps/awaits.py); NULL otherwise.
INSERT INTO step_parks (step_id, run_id, tenant_id, kind, deadline, on_timeout, timeout_goto,
                        event_type, record_key, condition, scope, lookback_seconds,
                        approver_role, approver_users, summary, mode, awaits, await_keys,
                        required, reject_quorum, slack_channel, email, remind_at,
                        escalate_at, escalate_role, escalate_users)
VALUES (CAST(:step_id AS uuid), CAST(:run_id AS uuid), CAST(:tenant_id AS text),
        CAST(:kind AS text), CAST(:deadline AS timestamptz), CAST(:on_timeout AS text),
        CAST(:timeout_goto AS text), CAST(:event_type AS text), CAST(:record_key AS text),
        CAST(:condition AS text), CAST(:scope AS jsonb),
        CAST(:lookback_seconds AS double precision), CAST(:approver_role AS text),
        CAST(:approver_users AS text[]), CAST(:summary AS text), CAST(:mode AS text),
        CAST(:awaits AS jsonb), CAST(:await_keys AS text[]), CAST(:required AS integer),
        CAST(:reject_quorum AS integer), CAST(:slack_channel AS text),
        CAST(:email AS boolean), CAST(:remind_at AS timestamptz),
        CAST(:escalate_at AS timestamptz), CAST(:escalate_role AS text),
        CAST(:escalate_users AS text[]))
ON CONFLICT (step_id) WHERE resumed_at IS NULL DO UPDATE SET step_id = EXCLUDED.step_id
RETURNING id, kind, deadline, created_at, resumed_at

-- name: parks_get
-- A park row as it is now: a resume that changed nothing reads who won, and when.
SELECT p.id, CAST(p.step_id AS text) AS step_id, CAST(p.run_id AS text) AS run_id,
       p.tenant_id, p.kind, p.deadline, p.on_timeout, p.timeout_goto, p.event_type,
       p.record_key, p.condition, p.scope, p.lookback_seconds, p.approver_role,
       p.approver_users, p.summary, p.decision, p.decided_by, p.decision_comment,
       p.resumed_at, p.resumed_by, p.resumed_event_id, p.created_at, p.parked_at,
       p.early_event_id, p.deadline <= statement_timestamp() AS expired,
       p.required, p.reject_quorum, p.slack_channel, p.email, p.remind_at, p.reminded_at,
       p.escalate_at, p.escalate_role, p.escalate_users, p.escalated_at,
       s.status AS step_status, s.step_key, r.status AS run_status
FROM step_parks p
JOIN workflow_steps s ON s.id = p.step_id
JOIN workflow_runs r ON r.id = p.run_id
WHERE p.id = CAST(:park_id AS bigint)
  AND (CAST(:tenant_id AS text) IS NULL OR p.tenant_id = CAST(:tenant_id AS text))

-- name: parks_lookback_events
-- Events a wait that just parked may have missed: of its type, on its record, that arrived
-- since the park row was written (or `lookback_seconds` before it), and the event admission
-- noted on the park while the step was not waiting yet (`early_event_id`, parks_note_early_event)
-- first of all. Any event committed after the park row is offered to it by admission, which
-- resumes the parked step or notes the event for this read (the park row's lock orders the
-- two): between them, none is missed. Read through the events' record index; bounded. With
-- each event, the echo markers that could explain its change (the same function admission
-- reads them with), and who the author must be to be onceflow (its connection's provider and
-- user: shared/ingest/echo.py): onceflow's own echo is no answer to a wait.
SELECT e.id, e.tenant_id, e.event_type, e.connection_id, e.source_event_id, e.occurred_at,
       e.author_id, e.changed_fields, e.payload, e.record_object_type, e.record_object_id,
       e.author_source, c.provider AS connection_provider,
       c.provider_user_id AS connection_user_id,
       (SELECT coalesce(jsonb_agg(jsonb_build_array(m.field, encode(m.value_hash, 'hex'))),
                        '[]'::jsonb)
          FROM echo_markers_alive(
                   e.connection_id, e.record_object_type, e.record_object_id,
                   ARRAY(SELECT jsonb_object_keys(e.changed_fields)), e.occurred_at,
                   CAST(:echo_skew_seconds AS double precision)) m
         WHERE e.connection_id IS NOT NULL) AS echo_markers
FROM workflow_trigger_events e
LEFT JOIN connections c ON c.id = e.connection_id
WHERE e.tenant_id = CAST(:tenant_id AS text)
  AND e.record_object_type = CAST(:object_type AS text)
  AND e.record_object_id = CAST(:object_id AS text)
  AND e.event_type = CAST(:event_type AS text)
  AND (e.created_at >= CAST(:since AS timestamptz)
       OR e.id = CAST(:early_event_id AS bigint))
ORDER BY e.id IS NOT DISTINCT FROM CAST(:early_event_id AS bigint) DESC, e.id
LIMIT CAST(:limit AS integer)

-- name: parks_note_early_event
-- An event that matches an open wait whose step is not waiting yet (the park row is
-- committed; the settle that parks the step has not committed) is noted on the park row, for
-- that settle to resume the step with (parks_mark_parked). Guarded on the park row alone, so
-- its lock orders this with the parking: a note waiting for the parking settle's lock
-- re-checks `parked_at` on the committed row and matches nothing (the step is waiting now:
-- the caller resumes it directly); a parking settle waiting for a note's lock reads the note.
-- The first matching event is kept. An expired wait takes no event (its deadline resumes it,
-- as in steps_resume_parked). Zero rows: the step parked meanwhile, the wait was resumed or
-- expired, or an earlier event was noted first.
UPDATE step_parks
SET early_event_id = CAST(:event_id AS bigint)
WHERE id = CAST(:park_id AS bigint) AND kind = 'event'
  AND resumed_at IS NULL AND parked_at IS NULL AND early_event_id IS NULL
  AND deadline > statement_timestamp()
RETURNING id

-- name: parks_mark_parked
-- In the settle's transaction that parks the step on this park row: the park is marked parked
-- (from here on admission resumes the step itself rather than noting events on the park), and
-- the event noted while the step was not waiting yet is returned, read under the row's lock:
-- a note that committed first is seen; a note that comes later waits for this commit and then
-- matches nothing. A park of several events returns what matched so far (`matched`, noted
-- under the same lock by parks_note_match). Zero rows: the park was closed (a cancel).
UPDATE step_parks
SET parked_at = now()
WHERE id = CAST(:park_id AS bigint) AND resumed_at IS NULL
RETURNING early_event_id, matched

-- name: steps_resume_parked
-- The one resume by an event or a decision: the waiting step back to pending (stamped as
-- dispatched: the caller publishes after commit) with what resumed it in its output, and its
-- park row closed, in one statement guarded on the step's status. The step row is locked
-- before the park row, as every other writer of both does (the cancel, the sweep), so no
-- two of them deadlock. The park's deadline binds it, judged by the database's clock when
-- this statement is issued: once it has passed, only the deadline resumes the wait (the
-- sweep's steps_wake_due, whenever it runs), so an event or a decision that comes later
-- never takes the run down the event's or the decision's path. Zero rows: someone else
-- resumed it first (read the park row to say who), the deadline has passed, or the run ended.
WITH resumed AS (
    UPDATE workflow_steps s
    SET status = 'pending', wake_at = NULL, dispatched_at = now(),
        output = coalesce(s.output, '{}'::jsonb) || CAST(:output AS jsonb)
    FROM workflow_runs r, step_parks d
    WHERE s.park_id = CAST(:park_id AS bigint)
      AND s.status IN ('waiting_for_event', 'waiting_for_approval')
      AND r.id = s.run_id AND r.status = 'running'
      AND d.id = s.park_id AND d.deadline > statement_timestamp()
    RETURNING s.id, s.park_id
), closed AS (
    UPDATE step_parks p
    SET resumed_at = now(), resumed_by = CAST(:resumed_by AS text),
        resumed_event_id = CAST(:event_id AS bigint),
        decision = CAST(:decision AS text), decided_by = CAST(:decided_by AS text),
        decision_comment = CAST(:comment AS text)
    FROM resumed
    WHERE p.id = resumed.park_id AND p.resumed_at IS NULL
    RETURNING p.resumed_at
)
SELECT CAST(resumed.id AS text) AS step_id, closed.resumed_at
FROM resumed JOIN closed ON true

-- name: loops_progress
-- How far a foreach's iterations are, read in the settle's transaction (which holds the run
-- row's lock, so concurrent settles of one run's items are serialized and this sees every
-- committed sibling): rows created, settled, succeeded, and the indexes to create next — the
-- lowest ones that have no row yet, as many as `concurrency` leaves room for. Not "from the
-- created count on": deliveries come in any order, so a replay can hold item 2 without items
-- 0 and 1 (issue 23, item 6), and counting would skip them.
WITH body AS (
    SELECT status, CAST(substring(step_key FROM '\[([0-9]+)\]$') AS integer) AS i
    FROM workflow_steps
    WHERE run_id = CAST(:run_id AS uuid) AND node_id = CAST(:body AS text)
), progress AS (
    SELECT count(*) AS created,
           count(*) FILTER (WHERE status IN ('succeeded', 'skipped', 'failed')) AS settled,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded
    FROM body
)
SELECT p.created, p.settled, p.succeeded,
       ARRAY(SELECT g.i
             FROM generate_series(0, CAST(:count AS integer) - 1) AS g (i)
             WHERE NOT EXISTS (SELECT 1 FROM body b WHERE b.i = g.i)
             ORDER BY g.i
             LIMIT greatest(CAST(:concurrency AS integer) - (p.created - p.settled), 0))
           AS next_indexes
FROM progress p

-- name: loops_outputs
-- The iterations' outputs in item order, for the foreach's own output once all succeeded.
SELECT coalesce(jsonb_agg(s.output ORDER BY
           CAST(substring(s.step_key FROM '\[([0-9]+)\]$') AS integer)), '[]'::jsonb) AS outputs
FROM workflow_steps s
WHERE s.run_id = CAST(:run_id AS uuid) AND s.node_id = CAST(:body AS text)
  AND s.status = 'succeeded'

-- name: steps_add_loop_outputs
-- A foreach step succeeded when it started its iterations; when the last one succeeds its
-- output gains their collected outputs (`outputs`), in the same transaction that creates the
-- steps after the loop. Zero rows: the foreach step is not (or no longer) succeeded.
UPDATE workflow_steps
SET output = coalesce(output, '{}'::jsonb) || jsonb_build_object('outputs', CAST(:outputs AS jsonb))
WHERE run_id = CAST(:run_id AS uuid) AND step_key = CAST(:step_key AS text)
  AND status = 'succeeded'

-- name: parks_register_correlations
-- With a park row of the new form (several events, or a correlation: shared/steps/awaits.py),
-- in its transaction: the correlation expressions its awaited events use per event type
-- ('' = the record), so admission knows which keys to compute for an event of that type. A
-- row already there is left alone (the table only grows with distinct expressions).
INSERT INTO wait_correlations (tenant_id, event_type, expression)
SELECT CAST(:tenant_id AS text), w.event_type, w.expression
FROM unnest(CAST(:event_types AS text[]), CAST(:expressions AS text[]))
     AS w (event_type, expression)
ON CONFLICT DO NOTHING

-- name: parks_open_awaits
-- The open waits of the new form an admitted event may answer: those with one of its keys
-- (one per correlation expression its type is awaited with), through the GIN index
-- step_parks_open_awaits — never a scan of the waits, however many are parked. A wait past
-- its deadline is not offered the event (its deadline resumes it). Bounded.
SELECT p.id, p.mode, p.awaits, p.scope, p.matched
FROM step_parks p JOIN workflow_runs r ON r.id = p.run_id
WHERE p.await_keys && CAST(:keys AS text[])
  AND p.kind = 'event' AND p.resumed_at IS NULL AND p.await_keys IS NOT NULL
  AND p.deadline > statement_timestamp()
  AND r.status = 'running' AND r.namespace = 'live'
ORDER BY p.id
LIMIT CAST(:limit AS integer)

-- name: parks_lock_waiting_step
-- Before a match is noted on a park of the new form: its step row's lock, taken first as
-- every writer of both rows does (steps_resume_parked, the cancel, the sweep, the parking
-- settle), so noting and resuming in one transaction never deadlocks with them. Read-only
-- otherwise. No row: the park names no step (it always does).
SELECT id FROM workflow_steps WHERE park_id = CAST(:park_id AS bigint) FOR UPDATE

-- name: parks_note_match
-- One awaited event matched: it joins the park's `matched`, guarded on the park row, whose
-- lock orders concurrent matches (a second one re-reads the row the first committed, so two
-- events of an `all` wait each see the other's match, and of an `any` wait only the first is
-- kept). Taken whether or not the step is waiting yet: the parking settle reads `matched`
-- under the same lock (parks_mark_parked). An expired or closed park takes nothing. Zero
-- rows: the park was resumed or closed, its deadline passed, this name matched already, or
-- (`any`) another event matched first.
UPDATE step_parks p
SET matched = p.matched || jsonb_build_object(CAST(:name AS text), CAST(:event AS jsonb))
WHERE p.id = CAST(:park_id AS bigint) AND p.mode IS NOT NULL AND p.resumed_at IS NULL
  AND p.deadline > statement_timestamp()
  AND p.matched -> CAST(:name AS text) IS NULL
  AND (p.mode = 'all' OR p.matched = '{}'::jsonb)
RETURNING p.matched, p.parked_at

-- name: parks_lookback_by_type
-- A correlated wait that just parked: the events of its types recorded since its park row
-- was written (or its lookback before), through the BRIN index on created_at; the caller
-- evaluates the correlation on each (it is an expression over the event). Any event committed
-- after the park row is offered to it by admission. Bounded. With each event, the echo
-- markers that could explain its change: onceflow's own echo is no answer to a wait.
SELECT e.id, e.tenant_id, e.event_type, e.connection_id, e.source_event_id, e.occurred_at,
       e.author_id, e.changed_fields, e.payload, e.record_object_type, e.record_object_id,
       (SELECT coalesce(jsonb_agg(jsonb_build_array(m.field, encode(m.value_hash, 'hex'))),
                        '[]'::jsonb)
          FROM echo_markers_alive(
                   e.connection_id, e.record_object_type, e.record_object_id,
                   ARRAY(SELECT jsonb_object_keys(e.changed_fields)), e.occurred_at,
                   CAST(:echo_skew_seconds AS double precision)) m
         WHERE e.connection_id IS NOT NULL) AS echo_markers
FROM workflow_trigger_events e
WHERE e.created_at >= CAST(:since AS timestamptz)
  AND e.tenant_id = CAST(:tenant_id AS text)
  AND e.event_type = ANY(CAST(:event_types AS text[]))
ORDER BY e.id
LIMIT CAST(:limit AS integer)

-- name: approvals_vote
-- One approver's vote on an approval, recorded once: the primary key (park, voter) makes a
-- second click by the same person, or a redelivered Slack interaction of one click, insert
-- nothing (zero rows: they had voted; their first vote stands). The caller holds the
-- step row's lock (parks_lock_waiting_step), taken by every voter first, so votes on one
-- approval are counted one after another and this statement sees every vote committed
-- before it. `counted` is false for a vote that comes after the approval closed (a quorum
-- reached, its deadline passed, its run ended): recorded as the late click it is, and never
-- counted towards a resume.
-- A vote that was not counted does not take the voter's place for good: an approval still
-- open while its run was failed (another branch or foreach item failed it) waits again after
-- a retry (ops_retry_run_reopen leaves the parked step and its park as they are), and the
-- voter's click then is counted, replacing the uncounted one. Only an uncounted row is ever
-- replaced, and only by a counted vote (the WHERE): a counted vote stands, and a second late
-- click is zero rows as before. The step row's lock orders it with every other vote.
INSERT INTO approval_votes (park_id, tenant_id, voter, decision, via, comment, counted)
SELECT p.id, p.tenant_id, CAST(:voter AS text), CAST(:decision AS text), CAST(:via AS text),
       CAST(:comment AS text),
       p.resumed_at IS NULL AND p.deadline > statement_timestamp() AND r.status = 'running'
FROM step_parks p
JOIN workflow_runs r ON r.id = p.run_id
WHERE p.id = CAST(:park_id AS bigint) AND p.kind = 'approval'
ON CONFLICT (park_id, voter) DO UPDATE
    SET decision = EXCLUDED.decision, via = EXCLUDED.via, comment = EXCLUDED.comment,
        counted = true, created_at = now()
    WHERE NOT approval_votes.counted AND EXCLUDED.counted
RETURNING counted

-- name: approvals_tally
-- The counted votes of an approval and its quorum, read under the step row's lock (see
-- approvals_vote): whether this vote completed a quorum is decided on every vote before it.
SELECT p.required, p.reject_quorum,
       count(v.voter) FILTER (WHERE v.counted AND v.decision = 'approved') AS approvals,
       count(v.voter) FILTER (WHERE v.counted AND v.decision = 'rejected') AS rejections,
       coalesce(jsonb_agg(jsonb_build_object('voter', v.voter, 'decision', v.decision,
                                             'via', v.via, 'at', v.created_at)
                          ORDER BY v.created_at, v.voter) FILTER (WHERE v.counted),
                '[]'::jsonb) AS votes
FROM step_parks p
LEFT JOIN approval_votes v ON v.park_id = p.id
WHERE p.id = CAST(:park_id AS bigint)
GROUP BY p.id

-- name: approvals_queue_asks
-- The messages that ask an approval's approvers, queued with its park row (same transaction)
-- for the sweep to send (shared/steps/approval_messages.py): a Slack post to its channel, an
-- email with a signed link to each named user and each member of its role with an address
-- (migration 0600).
-- A park written again by a crashed attempt's retry queues nothing twice (the unique key).
INSERT INTO approval_messages (park_id, tenant_id, channel, purpose, recipient, due_at)
SELECT p.id, p.tenant_id, 'slack', 'ask', p.slack_channel, now()
FROM step_parks p
WHERE p.id = CAST(:park_id AS bigint) AND p.kind = 'approval' AND p.slack_channel IS NOT NULL
UNION ALL
SELECT DISTINCT p.id, p.tenant_id, 'email', 'ask', u.name, now()
FROM step_parks p,
     unnest(p.approver_users
            || onceflow_role_members(p.tenant_id, p.approver_role, 'email')) AS u (name)
WHERE p.id = CAST(:park_id AS bigint) AND p.kind = 'approval' AND p.email
ON CONFLICT (park_id, channel, purpose, recipient) DO NOTHING

-- name: approvals_queue_update
-- A counted vote or the decision changed what the approval's posted Slack message should say:
-- its update is due now (the sweep makes it; a vote while an update is in flight sets it due
-- again, and the next update renders the approval as it is then).
UPDATE approval_messages SET update_due_at = now()
WHERE park_id = CAST(:park_id AS bigint) AND channel = 'slack' AND purpose = 'ask'
