-- A throttle on starting runs (issue 29, item 6): a trigger's `throttle: {limit, period, key?}`
-- starts at most `limit` runs per fixed window per (workflow, key); the events over it wait
-- here, in order, and are started by the sweep when a later window has room
-- (shared/admission/run_throttle.py). Not refused: each waits for its run.
--
-- `queued` → `started` (the sweep's guarded start, which runs admission's own decision for the
-- event: its run, or its duplicate/already_running refusal). `due_at` is when the next window
-- opens: the sweep's due index.
CREATE TABLE run_start_queue (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants (id),
    workflow_id     uuid NOT NULL REFERENCES workflows (id),
    throttle_key    text NOT NULL,
    event_id        bigint NOT NULL,
    status          text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'started')),
    run_id          uuid NOT NULL UNIQUE,
    version_id      uuid NOT NULL REFERENCES workflow_versions (id),
    dedup_mode      text NOT NULL,
    record_key      text,
    trigger_record  jsonb NOT NULL,
    entry_node      text NOT NULL,
    entry_type      text NOT NULL,
    limit_per_window integer NOT NULL CHECK (limit_per_window > 0),
    window_seconds  integer NOT NULL CHECK (window_seconds > 0),
    due_at          timestamptz NOT NULL,
    queued_at       timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    outcome         text,
    CONSTRAINT run_start_queue_started_at CHECK ((status = 'started') = (started_at IS NOT NULL)),
    -- An (event, workflow) pairing waits at most once: a redelivery finds it.
    UNIQUE (event_id, workflow_id)
);
-- The head of each (workflow, key)'s queue, in order.
CREATE INDEX run_start_queue_head ON run_start_queue (workflow_id, throttle_key, id)
    WHERE status = 'queued';
-- The sweep's due index.
CREATE INDEX run_start_queue_due ON run_start_queue (due_at) WHERE status = 'queued';

ALTER TABLE throttle_windows DROP CONSTRAINT throttle_windows_scope_check;
ALTER TABLE throttle_windows ADD CONSTRAINT throttle_windows_scope_check
    CHECK (scope IN ('connection', 'workflow', 'host', 'run_start'));
-- Retention (shared/sweep/retention.py): started entries, oldest first.
CREATE INDEX run_start_queue_started ON run_start_queue (started_at) WHERE status = 'started';
