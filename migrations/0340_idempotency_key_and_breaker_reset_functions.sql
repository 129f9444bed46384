-- Two rules that the one-statement settle (shared/sql/steps.sql `steps_settle` with `fold`)
-- used to re-type from the statements of the transactional path: each is now one SQL function
-- that every statement calls (issue 25 item 6). Python reads the key's format from
-- shared/steps/journal.py `idempotency_key`; tests/test_steps_journal.py holds the two equal.

-- A step's idempotency key: the same for every retry of the step and every replay of its run
-- in the lineage (shared/steps/journal.py). IMMUTABLE and a single SELECT, so the planner
-- inlines it: no call overhead in the statements that insert step rows.
CREATE FUNCTION onceflow_idempotency_key(lineage_root text, step_key text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT 'onceflow:' || lineage_root || ':' || step_key $$;

-- A succeeded run ends its workflow's failure streak; in half_open it closes the breaker. An
-- open breaker stays open (a run admitted before the trip may still succeed): only a person
-- resumes it. The row lock of the UPDATE serializes it with the other outcomes of the
-- workflow's runs (shared/sql/breaker.sql). Returns the state it left, NULL when nothing
-- changed (no breaker row, open, or already closed with no streak).
CREATE FUNCTION onceflow_breaker_record_success(workflow uuid) RETURNS text
    LANGUAGE sql VOLATILE
AS $$
UPDATE workflow_breakers
   SET consecutive_failures = 0,
       state = CASE WHEN state = 'half_open' THEN 'closed' ELSE state END,
       opened_at = CASE WHEN state = 'half_open' THEN NULL ELSE opened_at END,
       updated_at = now()
 WHERE workflow_id = $1 AND state <> 'open'
   AND (consecutive_failures > 0 OR state = 'half_open')
RETURNING state
$$;
