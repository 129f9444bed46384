-- Keyed concurrency (issue 29, item 3): a workflow's `concurrency: {key, limit}` lets at most
-- `limit` runs per key be running at once (shared/admission/concurrency.py). The runs over it
-- wait, in admission order, in the run-start queue the throttle already keeps (one home for
-- "a pairing waiting to start": `gate` says which rule lets it through), and start when a
-- slot frees.
--
-- A slot is a `concurrency_slots` row per running run (or per waiting run it was handed to):
-- the count per (workflow, key) is what the limit caps. Admission takes one, under the key's
-- advisory lock, only when nothing waits and fewer than `limit` are taken. The statement that
-- ends a run (whichever: a step's settle, a cancel, a goal, a repair) frees its slot and hands
-- it to the key's oldest waiting entry in that same statement, by the trigger below: the slot
-- is never free while a run waits, never counted twice, and FIFO per key. The handed-over
-- entry is `granted` (granted_at) and due now; its run is started right after by the step
-- function that ended the run, or by the sweep's repair (the due index).
ALTER TABLE run_start_queue ADD COLUMN gate text NOT NULL DEFAULT 'throttle'
    CHECK (gate IN ('throttle', 'concurrency'));
ALTER TABLE run_start_queue ADD COLUMN granted_at timestamptz;
ALTER TABLE run_start_queue ALTER COLUMN window_seconds DROP NOT NULL;
ALTER TABLE run_start_queue ADD CONSTRAINT run_start_queue_gate_window
    CHECK ((gate = 'throttle') = (window_seconds IS NOT NULL));
ALTER TABLE run_start_queue ADD CONSTRAINT run_start_queue_granted
    CHECK (granted_at IS NULL OR gate = 'concurrency');
-- "The next waiting run for this key": the oldest entry not granted yet, by this index.
CREATE INDEX run_start_queue_next_waiting ON run_start_queue (workflow_id, throttle_key, id)
    WHERE status = 'queued' AND gate = 'concurrency' AND granted_at IS NULL;

CREATE TABLE concurrency_slots (
    -- The running run that holds the slot, or the waiting entry's chosen run id it was handed
    -- to (the run is created with that id when the entry starts).
    run_id          uuid PRIMARY KEY,
    workflow_id     uuid NOT NULL REFERENCES workflows (id),
    concurrency_key text NOT NULL,
    taken_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX concurrency_slots_key ON concurrency_slots (workflow_id, concurrency_key);

-- Grant a free slot of (workflow, key) to its oldest waiting entry, under the key's lock held
-- by the caller, when fewer than the limit are taken: `p_limit`, or (NULL) the limit the
-- entry was queued under (a version that lowered it lets slots drain without handing them
-- over). The entry granted (its slot taken, due now), or NULL.
CREATE FUNCTION onceflow_concurrency_grant_next(p_workflow uuid, p_key text, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    nxt bigint;
    head_limit integer;
BEGIN
    SELECT q.id, q.limit_per_window INTO nxt, head_limit FROM run_start_queue q
     WHERE q.workflow_id = p_workflow AND q.throttle_key = p_key
       AND q.status = 'queued' AND q.gate = 'concurrency' AND q.granted_at IS NULL
     ORDER BY q.id LIMIT 1;
    IF nxt IS NULL THEN
        RETURN NULL;
    END IF;
    IF (SELECT count(*) FROM concurrency_slots c
         WHERE c.workflow_id = p_workflow AND c.concurrency_key = p_key)
       >= coalesce(p_limit, head_limit) THEN
        RETURN NULL;
    END IF;
    UPDATE run_start_queue SET granted_at = now(), due_at = now()
     WHERE id = nxt AND status = 'queued' AND granted_at IS NULL;
    INSERT INTO concurrency_slots (run_id, workflow_id, concurrency_key)
    SELECT q.run_id, q.workflow_id, q.throttle_key FROM run_start_queue q WHERE q.id = nxt;
    RETURN nxt;
END
$$;

-- Free `p_run`'s slot and hand it to the key's next waiting entry, under the key's lock (the
-- same advisory lock admission takes: shared/sql/concurrency.sql `concurrency_lock`). The
-- entry granted, or NULL (no slot held, or nobody waits: the slot is simply free).
CREATE FUNCTION onceflow_concurrency_pass_slot(p_run uuid) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    s concurrency_slots%ROWTYPE;
BEGIN
    SELECT * INTO s FROM concurrency_slots WHERE run_id = p_run;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'concurrency|' || CAST(s.workflow_id AS text) || '|' || s.concurrency_key, 0));
    DELETE FROM concurrency_slots WHERE run_id = p_run;
    IF NOT FOUND THEN
        RETURN NULL;  -- passed on by a racer that held the lock first
    END IF;
    RETURN onceflow_concurrency_grant_next(s.workflow_id, s.concurrency_key, NULL);
END
$$;

CREATE FUNCTION onceflow_run_ended_frees_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM onceflow_concurrency_pass_slot(NEW.id);
    RETURN NULL;
END
$$;

-- Every statement that ends a run frees its slot, in that statement.
CREATE TRIGGER workflow_runs_free_concurrency_slot
    AFTER UPDATE OF status ON workflow_runs
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION onceflow_run_ended_frees_slot();
